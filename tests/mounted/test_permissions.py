"""Permission rules on the mount, as real users, against a plain directory.

Every case below builds the same small tree as root in two places - a
plain directory (the reference: ext4 or tmpfs, whatever holds the test's
temporary directory) and the mount (-o allow_other, as a mail system
mounts it) - and then runs one operation as a real user in a child
process (setgroups with the user's supplementary groups, setresgid,
setresuid, umask 022).  The result (the errno name, "ok", or what the
operation returns) must be the same in both places, and the reference's
result must be the one the table expects, so a case cannot pass by
failing the same way twice.

The mount leaves these checks to the kernel (default_permissions).  A
dboxfs without default_permissions fails most of these cases (the number
is in docs/design.md, section "Permission checks"): that is what the
test is for.  Two rules need more than one step:

- cold path walks run right after a remount, so the kernel has cached no
  name below the mount root and asks the daemon (LOOKUP) for each one;
- warm path walks run after the owner walked the same path, so every
  name is cached and the daemon sees no LOOKUP at all: only a check made
  by the kernel can refuse them.

Users (tests/mounted/kinds_env.py): alice owns the mail; bob is in
group dboxfs-team through a supplementary group (his primary group is his
own), carol is not in it.

Extending: add a Case to CASES.  A layout is a list of folder()/msg()
entries; an operation is (function, arguments...), where a string that
starts with "." is a path below the case's directory.
"""
import ast
import errno
import grp
import os
import pwd
import shutil
import tempfile
from collections import namedtuple
from pathlib import Path

import pytest

import conftest
from conftest import Mount, is_mounted
from kinds_env import ALICE, BOB, CAROL, TEAM, team_users
from sysenv import mount_options

ROOT = "root"

# --- the tree a case starts from ------------------------------------------------

Entry = namedtuple("Entry", "kind path owner group mode")


def folder(name=".F", owner=ALICE, group=TEAM, mode=0o755,
           cur=0o755, new=0o755, tmp=0o755):
    """A Maildir++ folder: name/ with cur/, new/ and tmp/."""
    return [Entry("d", name, owner, group, mode),
            Entry("d", f"{name}/cur", owner, group, cur),
            Entry("d", f"{name}/new", owner, group, new),
            Entry("d", f"{name}/tmp", owner, group, tmp)]


def msg(path, mode=0o644, owner=ALICE, group=TEAM):
    """A message file (a regular file in cur/, new/ or tmp/)."""
    return [Entry("f", path, owner, group, mode)]


def build(d, layout):
    """Create layout below d as root: everything first, then owners, then
    modes (chown clears setgid, so the mode comes last)."""
    for e in layout:
        p = d / e.path
        if e.kind == "d":
            p.mkdir()
        else:
            p.write_bytes(b"From: a@example.org\n\nmail\n")
    for e in reversed(layout):
        p = d / e.path
        os.chown(p, pwd.getpwnam(e.owner).pw_uid, grp.getgrnam(e.group).gr_gid)
        os.chmod(p, e.mode)


# --- operations (each returns None for "ok", or a plain value) -------------------

def read(p):
    with open(p, "rb") as f:
        f.read()


def write(p):
    os.close(os.open(p, os.O_WRONLY))


def create(p):
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))


def look(p):
    os.stat(p)


def listdir(p):
    os.listdir(p)


def group_and_mode(p):
    st = os.stat(p)
    return grp.getgrgid(st.st_gid).gr_name, oct(st.st_mode)


def created_with(p):
    """Create a file; its group and mode."""
    create(p)
    return group_and_mode(p)


def made_dir_with(p):
    """mkdir 0777; its group and mode."""
    os.mkdir(p, 0o777)
    return group_and_mode(p)


def chmod_then(p, mode):
    os.chmod(p, mode)
    return oct(os.stat(p).st_mode)


def chown_to(p, user):
    os.chown(p, pwd.getpwnam(user).pw_uid, -1)


def chgrp_to(p, group):
    os.chown(p, -1, grp.getgrnam(group).gr_gid)
    return grp.getgrgid(os.stat(p).st_gid).gr_name


def utime_now(p):
    os.utime(p, None)


def utime_explicit(p):
    os.utime(p, (1_000_000_000, 1_000_000_000))


def truncate(p):
    os.truncate(p, 0)


# --- running as a user -------------------------------------------------------------

def outcome(fn, *args):
    try:
        value = fn(*args)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    return "ok" if value is None else value


def run_as(user, d, op):
    """op = (fn, args...) run as user in a child process, with the
    user's groups; strings starting with "." are paths below d."""
    fn, *args = op
    args = [d / a if isinstance(a, str) and a.startswith(".") else a for a in args]
    if user == ROOT:
        return outcome(fn, *args)
    pw = pwd.getpwnam(user)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setgroups(os.getgrouplist(user, pw.pw_gid))
            os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
            os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
            os.umask(0o022)
            result = outcome(fn, *args)
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            result = ("child failed", repr(e))
        try:
            os.write(w, repr(result).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return ast.literal_eval(text)


# --- the cases -----------------------------------------------------------------------

Case = namedtuple("Case", "id layout user op expect warm cold", defaults=((), False))

M = ".F/cur/1.M1P1.host:2,S"           # a message in cur/
N = ".F/new/2.M2P2.host"               # a message in new/
T = ".F/tmp/3.M3P3.host"               # a file being delivered
WALK = folder(mode=0o700) + msg(M)     # alice's folder, closed to others

CASES = [
    # Reading and writing a message: owner, group (supplementary), other.
    Case("read, owner, 600", folder() + msg(M, 0o600), ALICE, (read, M), "ok"),
    Case("read, group member, 600", folder() + msg(M, 0o600), BOB, (read, M), "EACCES"),
    Case("read, group member, 640", folder() + msg(M, 0o640), BOB, (read, M), "ok"),
    Case("read, not in group, 640", folder() + msg(M, 0o640), CAROL, (read, M), "EACCES"),
    Case("read, other, 644", folder() + msg(M, 0o644), CAROL, (read, M), "ok"),
    Case("read, owner in group, 040 (owner class wins)", folder() + msg(M, 0o040), ALICE,
         (read, M), "EACCES"),
    Case("write, group member, 640", folder() + msg(M, 0o640), BOB, (write, M), "EACCES"),
    Case("write, group member, 660", folder() + msg(M, 0o660), BOB, (write, M), "ok"),
    Case("truncate, not a writer, 644", folder() + msg(M), BOB, (truncate, M), "EACCES"),
    # A directory without w: nothing is created, removed or renamed in it.
    Case("create in tmp/ 555, owner", folder(tmp=0o555), ALICE, (create, T), "EACCES"),
    Case("create in tmp/ 755, other", folder(), CAROL, (create, T), "EACCES"),
    Case("create in tmp/ 770, group member", folder(tmp=0o770), BOB, (create, T), "ok"),
    Case("create in tmp/ 770, not in group", folder(tmp=0o770), CAROL, (create, T), "EACCES"),
    Case("mkdir in folder 555, owner", folder(mode=0o555), ALICE, (os.mkdir, ".F/.sub"),
         "EACCES"),
    Case("unlink in cur/ 555, owner", folder(cur=0o555) + msg(M), ALICE, (os.unlink, M),
         "EACCES"),
    Case("flag rename in cur/ 555, owner", folder(cur=0o555) + msg(M), ALICE,
         (os.rename, M, M + "T"), "EACCES"),
    # A directory without x: no name in it can be used, even with w.
    Case("create in tmp/ 600, owner", folder(tmp=0o600), ALICE, (create, T), "EACCES"),
    Case("flag rename in cur/ 600, owner", folder(cur=0o600) + msg(M), ALICE,
         (os.rename, M, M + "T"), "EACCES"),
    Case("unlink in cur/ 600, owner", folder(cur=0o600) + msg(M), ALICE, (os.unlink, M),
         "EACCES"),
    # Path walks through a folder without x for the caller.
    Case("stat through folder 700, cold", WALK, BOB, (look, M), "EACCES", cold=True),
    Case("stat through folder 700, warm", WALK, BOB, (look, M), "EACCES",
         warm=[(ALICE, (look, M))]),
    Case("read through folder 700, cold", WALK, CAROL, (read, M), "EACCES", cold=True),
    Case("read through folder 700, warm", WALK, CAROL, (read, M), "EACCES",
         warm=[(ALICE, (read, M))]),
    Case("create through folder 700, warm", WALK, BOB, (create, T), "EACCES",
         warm=[(ALICE, (look, ".F/tmp"))]),
    Case("stat through folder chmod 700 after the walk, warm", folder() + msg(M), BOB,
         (look, M), "EACCES", warm=[(BOB, (look, M)), (ALICE, (os.chmod, ".F", 0o700))]),
    Case("stat through cur/ 600, owner, warm", folder(cur=0o600) + msg(M), ALICE,
         (look, M), "EACCES", warm=[(ROOT, (look, M))]),
    Case("stat in folder 711 (search only)", folder(mode=0o711) + msg(M), BOB,
         (look, M), "ok", cold=True),
    Case("list folder 711 (search only)", folder(mode=0o711), BOB, (listdir, ".F"),
         "EACCES"),
    # Sticky directory (1777): only the file's or the directory's owner
    # removes or renames a name in it.
    Case("sticky cur/: unlink another's message", folder(cur=0o1777) + msg(M), BOB,
         (os.unlink, M), "EPERM"),
    Case("sticky cur/: rename another's message", folder(cur=0o1777) + msg(M), BOB,
         (os.rename, M, M + "T"), "EPERM"),
    Case("sticky cur/: replace another's message by rename",
         folder(cur=0o1777) + msg(M) + msg(".F/cur/b", owner=BOB), BOB,
         (os.rename, ".F/cur/b", M), "EPERM"),
    Case("sticky cur/: owner unlinks own message", folder(cur=0o1777) + msg(M), ALICE,
         (os.unlink, M), "ok"),
    Case("sticky cur/: directory owner unlinks another's message",
         folder(owner=CAROL, group=CAROL, cur=0o1777) + msg(M), CAROL, (os.unlink, M), "ok"),
    # Setgid directory: new inodes take its group, directories keep the bit;
    # chmod g+s by someone outside the file's group drops the bit.
    Case("setgid cur/: new message takes the group", folder(cur=0o2777), CAROL,
         (created_with, ".F/cur/c"), (TEAM, oct(0o100644))),
    Case("setgid folder: new directory keeps setgid", folder(mode=0o2777), CAROL,
         (made_dir_with, ".F/.sub"), (TEAM, oct(0o42755))),
    Case("chmod g+s, owner not in the file's group", folder() + msg(M, owner=CAROL),
         CAROL, (chmod_then, M, 0o2644), oct(0o100644)),
    Case("chmod g+s, owner in the file's group", folder() + msg(M, owner=BOB),
         BOB, (chmod_then, M, 0o2644), oct(0o102644)),
    # Owners: only the owner chmods, only root gives a file away, the owner
    # changes the group only to one of their own groups.
    Case("chmod, not the owner", folder() + msg(M), BOB, (chmod_then, M, 0o666), "EPERM"),
    Case("chown, not the owner", folder() + msg(M), BOB, (chown_to, M, BOB), "EPERM"),
    Case("chown to another user, owner", folder() + msg(M), ALICE, (chown_to, M, BOB),
         "EPERM"),
    Case("chgrp to own group, owner", folder() + msg(M, group=ALICE), ALICE,
         (chgrp_to, M, TEAM), TEAM),
    Case("chgrp to a group not theirs, owner", folder() + msg(M), ALICE,
         (chgrp_to, M, CAROL), "EPERM"),
    # Times: explicit times need the owner, "now" needs write access.
    Case("utime explicit, writer not owner", folder() + msg(M, 0o666), BOB,
         (utime_explicit, M), "EPERM"),
    Case("utime now, writer not owner", folder() + msg(M, 0o666), BOB, (utime_now, M), "ok"),
    Case("utime now, not a writer", folder() + msg(M, 0o644), CAROL, (utime_now, M),
         "EACCES"),
    Case("utime explicit, owner of a 444 file", folder() + msg(M, 0o444), ALICE,
         (utime_explicit, M), "ok"),
    # rename across directories needs w and x on both.
    Case("move new/ -> cur/, both 755", folder() + msg(N), ALICE,
         (os.rename, N, M), "ok"),
    Case("move new/ -> cur/ 555", folder(cur=0o555) + msg(N), ALICE,
         (os.rename, N, M), "EACCES"),
    Case("move new/ 555 -> cur/", folder(new=0o555) + msg(N), ALICE,
         (os.rename, N, M), "EACCES"),
    Case("move new/ -> cur/ 600", folder(cur=0o600) + msg(N), ALICE,
         (os.rename, N, M), "EACCES"),
    Case("move new/ 600 -> cur/", folder(new=0o600) + msg(N), ALICE,
         (os.rename, N, M), "EACCES"),
    Case("move to another's folder", folder() + folder(".G", owner=BOB) + msg(N), BOB,
         (os.rename, N, ".G/cur/x"), "EACCES"),
    Case("move from another's folder", folder() + folder(".G", owner=BOB) + msg(N), ALICE,
         (os.rename, N, ".G/cur/x"), "EACCES"),
]


# --- the two places ------------------------------------------------------------------

def plain_beside(prefix):
    """(base, reference): a new world-traversable directory under /tmp
    and in it the plain directory "plain", both 0755 root; the test users
    exist."""
    team_users()
    base = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(base, 0o755)
    ref = base / "plain"
    ref.mkdir()
    os.chmod(ref, 0o755)
    return base, ref


@pytest.fixture(scope="module")
def places():
    """(reference, mount): a plain directory and a dboxfs mount (-o
    allow_other) side by side in a world-traversable directory, both 0755
    root.  Unmounted and removed afterwards."""
    base, ref = plain_beside("dboxfs-test-perm-")
    m = Mount(base / "store", base / "mnt", ["-o", "allow_other"])
    conftest._all_mounts.append(m)
    try:
        m.mount()
        os.chmod(m.mnt, 0o755)
        yield ref, m
    finally:
        m.unmount()
        if not is_mounted(m.mnt):
            shutil.rmtree(base, ignore_errors=True)


def test_the_mount_is_what_is_tested(places):
    _, m = places
    fstype, opts = mount_options("/proc/mounts", m.mnt)
    assert fstype == "fuse.dboxfs" and "allow_other" in opts, opts


def play(case, root, n, mount=None):
    """The case's steps below root/cN; ([warm steps' results], result)."""
    d = root / f"c{n}"
    d.mkdir()
    build(d, case.layout)
    if case.cold and mount is not None:
        mount.remount()  # nothing below the root is cached now
    warmed = [run_as(user, d, op) for user, op in case.warm]
    return warmed, run_as(case.user, d, case.op)


def same_as_reference(case, reference, mounted):
    """reference() and mounted() play case in the plain directory and on
    the mount: the reference must give the table's answer (so a case
    cannot pass by failing the same way twice), the mount the
    reference's."""
    want = reference()
    assert want == (["ok"] * len(case.warm), case.expect), \
        f"the reference itself gave {want}: the table is wrong for this machine"
    got = mounted()
    assert got == want, f"mount: {got}, reference: {want}"


@pytest.mark.parametrize("n", range(len(CASES)), ids=[c.id for c in CASES])
def test_permission_rule(places, n):
    case = CASES[n]
    ref, m = places
    same_as_reference(case, lambda: play(case, ref, n), lambda: play(case, m.mnt, n, mount=m))


def test_users_of_a_mount_without_allow_other_are_refused(make_mount, tmp_path):
    """Without allow_other only the mounting user (root here) gets in,
    whatever the modes say."""
    team_users()
    base = Path(tempfile.mkdtemp(prefix="dboxfs-test-perm-"))
    os.chmod(base, 0o755)
    try:
        m = make_mount(store=base / "store", mnt=base / "mnt")
        os.chmod(m.mnt, 0o777)
        (m.mnt / "open").write_bytes(b"x")
        os.chmod(m.mnt / "open", 0o666)
        assert run_as(ROOT, base, (read, "./mnt/open")) == "ok"
        for user in (ALICE, BOB):
            assert run_as(user, base, (look, "./mnt/open")) == "EACCES"
            assert run_as(user, base, (create, "./mnt/new")) == "EACCES"
        m.unmount()
    finally:
        if not is_mounted(base / "mnt"):
            shutil.rmtree(base, ignore_errors=True)


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
