"""Permission rules on a mount only its owner can reach, checked by the
daemon itself (fs/fs-perm.c), against a plain directory.

A mount without allow_other or allow_root runs without
default_permissions: the kernel lets no one but the mounting user in, and
the daemon applies every rule the kernel would (docs/design.md,
"Permission checks").  Here dboxfs-alice mounts a store of her own and
every case runs as her (her uid, her primary group, dboxfs-team as a
supplementary group), on files that are hers, bob's (dboxfs-team) and
carol's (a group alice is not in), compared with the same steps on a
plain directory as in test_permissions.py.  Each case's tree is built as
root before alice's mount (root cannot reach it), on a root mount of the
same store.

The cases are test_permissions.py's cases whose every step is alice's,
plus OWNER_CASES below: the group and other classes, the sticky bit,
owners, times, links, access() and chdir() as alice.  Without the
daemon's checks (fs_perm_* returning 0) most of them fail.
"""
import errno
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import conftest
import test_permissions as tp
from conftest import Mount, is_mounted
from kinds_env import ALICE, BOB, CAROL, TEAM, team_users
from sysenv import mount_options, need_root, system_settings
from test_permissions import (M, N, ROOT, Case, Entry, chgrp_to, chmod_then, create,
                              folder, listdir, look, msg, read, run_as, truncate,
                              utime_explicit, utime_now, write)


def access(p, mode):
    return os.access(p, mode)


def chdir(p):
    os.chdir(p)


def link_to(p, q):
    os.link(p, q)


def set_xattr(p):
    os.setxattr(p, "user.test", b"1")


def get_xattr(p):
    try:
        os.getxattr(p, "user.test")
    except OSError as e:
        if e.errno != errno.ENODATA:  # read permission is what counts
            raise


def carols(name=".F", **kw):
    """A folder of carol's, in her own group (alice is in neither)."""
    return folder(name, owner=CAROL, group=CAROL, **kw)


C = ".F/cur/c"

OWNER_CASES = [
    # Classes: alice is in dboxfs-team only as a supplementary group.
    Case("read bob's 640 through the supplementary group",
         folder() + msg(M, 0o640, owner=BOB), ALICE, (read, M), "ok"),
    Case("read bob's 600", folder() + msg(M, 0o600, owner=BOB), ALICE, (read, M), "EACCES"),
    Case("read carol's 640, other class", carols() + msg(M, 0o640, owner=CAROL, group=CAROL),
         ALICE, (read, M), "EACCES"),
    Case("read carol's 604, other class", carols() + msg(M, 0o604, owner=CAROL, group=CAROL),
         ALICE, (read, M), "ok"),
    Case("write bob's 660", folder() + msg(M, 0o660, owner=BOB), ALICE, (write, M), "ok"),
    Case("write bob's 640", folder() + msg(M, 0o640, owner=BOB), ALICE, (write, M), "EACCES"),
    Case("truncate bob's 644", folder() + msg(M, owner=BOB), ALICE, (truncate, M), "EACCES"),
    Case("read own 060 (owner class wins)", folder() + msg(M, 0o060), ALICE, (read, M),
         "EACCES"),
    # Directories of others.
    Case("create in bob's tmp/ 775 (group)", folder(owner=BOB, tmp=0o775), ALICE,
         (create, tp.T), "ok"),
    Case("create in carol's tmp/ 755", carols(), ALICE, (create, tp.T), "EACCES"),
    Case("stat in carol's folder 700, cold", carols(mode=0o700) +
         msg(M, owner=CAROL, group=CAROL), ALICE, (look, M), "EACCES", cold=True),
    Case("stat in carol's folder 711, cold", carols(mode=0o711) +
         msg(M, owner=CAROL, group=CAROL), ALICE, (look, M), "ok", cold=True),
    Case("list carol's folder 711", carols(mode=0o711), ALICE, (listdir, ".F"), "EACCES"),
    Case("list own cur/ 300", folder(cur=0o300), ALICE, (listdir, ".F/cur"), "EACCES"),
    Case("stat in own cur/ 600, cold", folder(cur=0o600) + msg(M), ALICE, (look, M),
         "EACCES", cold=True),
    # Warm walks: alice's own chmod takes her search permission away
    # after she walked the path (the daemon has the kernel drop the
    # names it cached below the directory).
    Case("stat through own cur/ chmod 600 after the walk, warm", folder() + msg(M), ALICE,
         (look, M), "EACCES", warm=[(ALICE, (look, M)), (ALICE, (os.chmod, ".F/cur", 0o600))]),
    Case("read through own folder chmod 0 after the walk, warm", folder() + msg(M), ALICE,
         (read, M), "EACCES", warm=[(ALICE, (read, M)), (ALICE, (os.chmod, ".F", 0))]),
    Case("create through own folder chmod 600 after the walk, warm", folder(), ALICE,
         (create, tp.T), "EACCES",
         warm=[(ALICE, (look, ".F/tmp")), (ALICE, (os.chmod, ".F", 0o600))]),
    Case("stat through own cur/ chmod 644 after the walk, warm", folder() + msg(M), ALICE,
         (look, M), "EACCES", warm=[(ALICE, (look, M)), (ALICE, (os.chmod, ".F/cur", 0o644))]),
    # A listing of a directory she may read but not search gives the
    # kernel no names to walk through (helper-91 F2: after one ls, cat,
    # write, ln and mv through it all worked).
    Case("read in own cur/ 600 after listing it", folder(cur=0o600) + msg(M), ALICE,
         (read, M), "EACCES", warm=[(ALICE, (listdir, ".F/cur"))]),
    Case("rename in own cur/ 600 after listing it", folder(cur=0o600) + msg(M), ALICE,
         (os.rename, M, M + "T"), "EACCES", warm=[(ALICE, (listdir, ".F/cur"))]),
    # The sticky bit in carol's directory.
    Case("sticky: unlink bob's message", carols(cur=0o1777) + msg(M, owner=BOB), ALICE,
         (os.unlink, M), "EPERM"),
    Case("sticky: rename bob's message", carols(cur=0o1777) + msg(M, owner=BOB), ALICE,
         (os.rename, M, M + "T"), "EPERM"),
    Case("sticky: replace bob's message by rename",
         carols(cur=0o1777) + msg(M, owner=BOB) + msg(C), ALICE, (os.rename, C, M), "EPERM"),
    Case("sticky: move own message over nothing",
         carols(cur=0o1777) + msg(C), ALICE, (os.rename, C, M), "ok"),
    Case("sticky: unlink own message", carols(cur=0o1777) + msg(M), ALICE,
         (os.unlink, M), "ok"),
    Case("sticky, own directory: unlink bob's message", folder(cur=0o1777) +
         msg(M, owner=BOB), ALICE, (os.unlink, M), "ok"),
    # Owners and groups.
    Case("chmod bob's message", folder() + msg(M, 0o666, owner=BOB), ALICE,
         (chmod_then, M, 0o600), "EPERM"),
    Case("chown own message to self", folder() + msg(M), ALICE, (tp.chown_to, M, ALICE), "ok"),
    Case("chgrp bob's message to team", folder() + msg(M, owner=BOB, group=BOB), ALICE,
         (chgrp_to, M, TEAM), "EPERM"),
    Case("chgrp own message to carol's group", folder() + msg(M), ALICE,
         (chgrp_to, M, CAROL), "EPERM"),
    Case("chmod g+s of own message in carol's group",
         folder() + msg(M, group=CAROL), ALICE, (chmod_then, M, 0o2644), oct(0o100644)),
    Case("chmod g+s of own message in team (supplementary)",
         folder() + msg(M, group=TEAM), ALICE, (chmod_then, M, 0o2644), oct(0o102644)),
    # Times.
    Case("utime explicit on bob's 666", folder() + msg(M, 0o666, owner=BOB), ALICE,
         (utime_explicit, M), "EPERM"),
    Case("utime now on bob's 666", folder() + msg(M, 0o666, owner=BOB), ALICE,
         (utime_now, M), "ok"),
    Case("utime now on carol's 644", carols() + msg(M, owner=CAROL, group=CAROL), ALICE,
         (utime_now, M), "EACCES"),
    # Links (fs.protected_hardlinks = 1, Debian's default).
    Case("link bob's 600 message", folder() + msg(M, 0o600, owner=BOB), ALICE,
         (link_to, M, C), "EPERM"),
    Case("link bob's 660 message", folder() + msg(M, 0o660, owner=BOB), ALICE,
         (link_to, M, C), "ok"),
    Case("link own message into a 555 cur/", folder(cur=0o555) + msg(N), ALICE,
         (link_to, N, M), "EACCES"),
    Case("rename a link onto its twin in a 555 cur/ (does nothing)", folder() + msg(M),
         ALICE, (os.rename, C, M), "ok",
         warm=[(ALICE, (link_to, M, C)), (ALICE, (os.chmod, ".F/cur", 0o555))]),
    # Moving a directory to another parent needs w on it.
    Case("move bob's folder to another folder",
         folder() + [Entry("d", ".F/.sub", BOB, TEAM, 0o755)] + folder(".G"), ALICE,
         (os.rename, ".F/.sub", ".G/.sub"), "EACCES"),
    Case("rename bob's folder in place",
         folder() + [Entry("d", ".F/.sub", BOB, TEAM, 0o755)], ALICE,
         (os.rename, ".F/.sub", ".F/.sup"), "ok"),
    Case("move bob's 775 folder to another folder",
         folder() + [Entry("d", ".F/.sub", BOB, TEAM, 0o775)] + folder(".G"), ALICE,
         (os.rename, ".F/.sub", ".G/.sub"), "ok"),
    # user.* extended attributes (the mount has -o user_xattr).
    Case("set an xattr of bob's 664 message", folder() + msg(M, 0o664, owner=BOB), ALICE,
         (set_xattr, M), "ok"),
    Case("set an xattr of bob's 644 message", folder() + msg(M, owner=BOB), ALICE,
         (set_xattr, M), "EACCES"),
    Case("set an xattr of bob's sticky 1777 directory", folder() +
         [Entry("d", ".F/.S", BOB, BOB, 0o1777)], ALICE, (set_xattr, ".F/.S"), "EPERM"),
    Case("get an xattr of carol's 600 message", carols() +
         msg(M, 0o600, owner=CAROL, group=CAROL), ALICE, (get_xattr, M), "EACCES"),
    # access() and chdir() (the kernel asks the daemon: ACCESS).
    Case("access W_OK of own 444", folder() + msg(M, 0o444), ALICE, (access, M, os.W_OK),
         False),
    Case("access R_OK of bob's 640", folder() + msg(M, 0o640, owner=BOB), ALICE,
         (access, M, os.R_OK), True),
    Case("access R_OK of carol's 640", carols() + msg(M, 0o640, owner=CAROL, group=CAROL),
         ALICE, (access, M, os.R_OK), False),
    Case("access X_OK of own 644", folder() + msg(M), ALICE, (access, M, os.X_OK), False),
    Case("access X_OK of own cur/ 600", folder(cur=0o600), ALICE,
         (access, ".F/cur", os.X_OK), False),
    Case("chdir into own cur/ 600", folder(cur=0o600), ALICE, (chdir, ".F/cur"), "EACCES"),
    Case("chdir into carol's 711 folder", carols(mode=0o711), ALICE, (chdir, ".F"), "ok"),
]


def alice_only(case):
    return case.user == ALICE and all(user == ALICE for user, _ in case.warm)


CASES = [c for c in tp.CASES if alice_only(c)] + OWNER_CASES


@pytest.fixture(scope="module")
def places():
    """(reference, alice's mount): the plain directory and the store with
    every case's tree built by root, the store then given to alice and
    mounted by her without options.  Unmounted and removed afterwards."""
    need_root()
    base, ref = tp.plain_beside("dboxfs-test-perm-owner-")
    store, mnt = base / "store", base / "mnt"
    built = Mount(store, base / "build", ["-o", "user_xattr"])
    conftest._all_mounts.append(built)
    m = Mount(store, mnt, ["-o", "user_xattr"], user=ALICE)
    conftest._all_mounts.append(m)
    try:
        built.mount()
        os.chmod(built.mnt, 0o755)
        for n, case in enumerate(CASES):
            for root in (ref, built.mnt):
                (root / f"c{n}").mkdir()
                tp.build(root / f"c{n}", case.layout)
        built.unmount()
        subprocess.run(["chown", "-R", f"{ALICE}:{ALICE}", str(store)], check=True)
        shutil.chown(mnt, ALICE, ALICE)
        with system_settings() as settings:
            settings.users_may_mount()
            m.mount()
        yield ref, m
    finally:
        m.unmount()
        built.unmount()
        if not is_mounted(mnt) and not is_mounted(built.mnt):
            shutil.rmtree(base, ignore_errors=True)


def test_the_mount_is_alices_without_default_permissions(places):
    _, m = places
    fstype, opts = mount_options("/proc/mounts", m.mnt)
    uid = pwd.getpwnam(ALICE).pw_uid
    assert fstype == "fuse.dboxfs" and f"user_id={uid}" in opts, opts
    assert "default_permissions" not in opts and "allow_other" not in opts, opts


def play(case, root, n, mount=None):
    """The case's steps in root/cN (built by the fixture); ([warm steps'
    results], result)."""
    d = root / f"c{n}"
    if case.cold and mount is not None:
        with system_settings() as settings:
            settings.users_may_mount()
            mount.remount()
    warmed = [run_as(user, d, op) for user, op in case.warm]
    return warmed, run_as(case.user, d, case.op)


@pytest.mark.parametrize("n", range(len(CASES)), ids=[c.id for c in CASES])
def test_owner_permission_rule(places, n):
    case = CASES[n]
    ref, m = places
    tp.same_as_reference(case, lambda: play(case, ref, n),
                         lambda: play(case, m.mnt, n, mount=m))


def test_others_and_root_stay_out(places):
    """The kernel keeps everyone but alice out, root included: what makes
    the daemon's checks enough."""
    _, m = places
    for user in (ROOT, BOB, CAROL):
        assert run_as(user, m.mnt, (look, ".")) == "EACCES", user


def test_case_ids_are_unique():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


STRESS = r"""
import os, sys, threading, time
root = sys.argv[1]
dirs = []
for i in range(4):
    d = f"{root}/.S{i}"
    for s in ("cur", "new", "tmp"):
        os.makedirs(f"{d}/{s}", exist_ok=True)
    for j in range(20):
        open(f"{d}/cur/m{j}", "w").close()
    dirs.append(d)
end = time.monotonic() + float(sys.argv[2])

def chmods(d):
    while time.monotonic() < end:
        for mode in (0o000, 0o600, 0o300, 0o755):
            os.chmod(f"{d}/cur", mode)

def reads(d):
    while time.monotonic() < end:
        try:
            for name in os.listdir(f"{d}/cur"):
                os.stat(f"{d}/cur/{name}")
        except OSError:
            pass

threads = [threading.Thread(target=f, args=(d,)) for d in dirs
           for f in (chmods, chmods, reads, reads)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for d in dirs:
    os.chmod(f"{d}/cur", 0o755)
print("done", flush=True)
"""


def test_chmods_against_listings_do_not_stop_the_mount(tmp_path):
    """Chmods that take search permission away make the daemon have the
    kernel drop cached names, which needs the directory's lock; listings
    and lookups in the same directories hold that lock while they wait
    for a request thread.  With one request thread, 8 threads of chmods
    and 8 of listings and stats for 5 s must end, and the mount serve on
    (the notifications once came from the request threads, and the mount
    stopped within seconds)."""
    need_root()
    team_users()
    base = Path(tempfile.mkdtemp(prefix="dboxfs-test-perm-stress-"))
    os.chmod(base, 0o755)
    shutil.chown(base, ALICE, ALICE)
    m = Mount(base / "store", base / "mnt", ["-o", "max_threads=1"], user=ALICE)
    shutil.chown(m.mnt, ALICE, ALICE)
    conftest._all_mounts.append(m)
    pw = pwd.getpwnam(ALICE)
    try:
        with system_settings() as settings:
            settings.users_may_mount()
            m.mount()
        r = subprocess.run([sys.executable, "-c", STRESS, str(m.mnt), "5"],
                           capture_output=True, text=True, timeout=120,
                           user=pw.pw_uid, group=pw.pw_gid,
                           extra_groups=os.getgrouplist(ALICE, pw.pw_gid))
        assert r.returncode == 0 and r.stdout == "done\n", r.stderr[-2000:]
        assert run_as(ALICE, m.mnt, (listdir, ".S0/cur")) != "EACCES"
    finally:
        m.unmount()
        if not is_mounted(m.mnt):
            shutil.rmtree(base, ignore_errors=True)
