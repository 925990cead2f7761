"""A POSIX conformance pass: the same operations on the mount and on a plain
ext4 directory in the same run, compared result by result.

Every scenario below is a function of (r, d): it works in directory d and
records each step with r(label, fn, *args), which keeps the step's result
(its return value, or the errno name it failed with) and a snapshot of the
scenario's tree after it (names, type, permission bits, link count,
owner, size, which names share an inode).  Each scenario runs in two
places on each side: a plain directory, and cur/ of a Maildir++ folder
(where a regular file is a message).  Steps marked with r.as_user run as
an unprivileged user (`nobody`), so the kernel's permission checks on the
mount (default_permissions) are compared too.

The mount must give ext4's result for every step, except the deliberate
differences listed in KNOWN with their reason (the README lists them).  A
KNOWN entry that no longer differs fails the test too, so the list stays
true.

Extending: write a function decorated with @scenario, using r(...) for
every step; it runs in both places on both sides.  Symlinks, special
files, setgid directories and timestamps other than mtime have their own
tests (test_symlinks, test_special_files, test_setgid, test_timestamps).
"""
import ctypes
import errno
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from conftest import is_mounted

SCENARIOS = []

# (scenario, place, step label): (mount's result, ext4's result, reason).
# A result is what Recorder keeps: (value or errno name, snapshot).  Only
# the value is matched here; a snapshot difference is never "known".
KNOWN = {}


def scenario(fn):
    SCENARIOS.append(fn)
    return fn


def snapshot(top):
    """The tree under top as comparable tuples, in name order."""
    rows, first = [], {}
    for dirpath, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, top)
            twin = first.setdefault(st.st_ino, rel)
            rows.append((rel, stat.S_IFMT(st.st_mode), oct(stat.S_IMODE(st.st_mode)),
                         st.st_nlink, st.st_uid, st.st_gid,
                         None if stat.S_ISDIR(st.st_mode) else st.st_size,
                         twin if twin != rel else None))
    return rows


def outcome(fn, *args, **kw):
    try:
        value = fn(*args, **kw)
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
    return "ok" if value is None else value


class Recorder:
    def __init__(self, top):
        self.top = top
        self.steps = []

    def __call__(self, label, fn, *args, **kw):
        """Do one step; keep its result and the tree after it."""
        self.steps.append((label, outcome(fn, *args, **kw), snapshot(self.top)))

    def as_user(self, label, fn, *args, **kw):
        """Do one step as the unprivileged user, in a child process."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(NOBODY.pw_gid)
                os.setuid(NOBODY.pw_uid)
                os.write(w, repr(outcome(fn, *args, **kw)).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            result = f.read()
        os.waitpid(pid, 0)
        self.steps.append((label + " (as nobody)", result, snapshot(self.top)))


NOBODY = pwd.getpwnam("nobody")


# --- helpers used by the scenarios ---------------------------------------------

def create(path, data=b"", mode=0o644, flags=os.O_CREAT | os.O_EXCL | os.O_WRONLY):
    fd = os.open(path, flags, mode)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def opened(path, flags, mode=0o644):
    """Open and close: the result is "ok" or the errno."""
    os.close(os.open(path, flags, mode))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def mode_of(path):
    return oct(stat.S_IMODE(os.lstat(path).st_mode))


_libc = ctypes.CDLL(None, use_errno=True)
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def renameat2(old, new, flags):
    if _libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), flags) < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


# --- scenarios -------------------------------------------------------------------

@scenario
def open_flags(r, d):
    a, s = d / "a", d / "s"
    r("create excl 0640", create, a, b"hello", 0o640)
    r("create excl again", create, a, b"x")
    r("O_CREAT existing", opened, a, os.O_CREAT | os.O_WRONLY)
    r("read back", read, a)
    r("open missing", opened, d / "missing", os.O_RDONLY)
    r("O_CREAT in missing dir", opened, d / "nodir" / "x", os.O_CREAT | os.O_WRONLY)
    r("file as dir", opened, a / "x", os.O_RDONLY)
    r("O_DIRECTORY on file", opened, a, os.O_RDONLY | os.O_DIRECTORY)
    r("mkdir", os.mkdir, s)
    r("dir O_WRONLY", opened, s, os.O_WRONLY)
    r("dir O_RDWR", opened, s, os.O_RDWR)
    r("dir O_CREAT", opened, s, os.O_CREAT | os.O_WRONLY)
    r("dir O_CREAT|O_EXCL", opened, s, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    r("dir O_RDONLY|O_DIRECTORY", opened, s, os.O_RDONLY | os.O_DIRECTORY)
    r("O_TRUNC", opened, a, os.O_WRONLY | os.O_TRUNC)
    r("size after O_TRUNC", lambda: os.stat(a).st_size)

    def append():
        fd = os.open(a, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, b"12345")
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, b"67")
        finally:
            os.close(fd)
        return read(a)
    r("O_APPEND writes at the end", append)
    r("O_RDONLY|O_TRUNC", opened, a, os.O_RDONLY | os.O_TRUNC)
    r("size after O_RDONLY|O_TRUNC", lambda: os.stat(a).st_size)

    def bad_fd(flags, op):
        fd = os.open(a, flags)
        try:
            return op(fd)
        finally:
            os.close(fd)
    r("write to O_RDONLY fd", bad_fd, os.O_RDONLY, lambda fd: os.write(fd, b"x"))
    r("read from O_WRONLY fd", bad_fd, os.O_WRONLY, lambda fd: os.read(fd, 1))
    r("create 0666 under umask 022", create, d / "b", b"", 0o666)
    r("name of 255 bytes", create, d / ("n" * 255))
    r("name of 256 bytes", create, d / ("n" * 256))
    r("O_EXCL without O_CREAT on existing", opened, a, os.O_EXCL | os.O_RDONLY)


@scenario
def links(r, d):
    a, s = d / "a", d / "s"
    r("create", create, a, b"linked")
    r("link", os.link, a, d / "b")
    r("link to existing name", os.link, a, d / "b")
    r("link missing", os.link, d / "missing", d / "c")
    r("mkdir", os.mkdir, s)
    r("link a dir", os.link, s, d / "s2")
    r("link into missing dir", os.link, a, d / "nodir" / "x")
    r("link into subdir", os.link, a, s / "c")
    r("unlink first name", os.unlink, a)
    r("read other name", read, d / "b")
    r("link back", os.link, d / "b", a)
    r("link count", lambda: os.stat(a).st_nlink)

    def through_fd():
        fd = os.open(d / "b", os.O_RDWR)
        try:
            os.pwrite(fd, b"LINK", 0)
        finally:
            os.close(fd)
        return read(a), read(s / "c")
    r("write one name, read the others", through_fd)


@scenario
def renames(r, d):
    s, t = d / "s", d / "t"
    r("create a", create, d / "a", b"a")
    r("create c", create, d / "c", b"c")
    r("rename to new name", os.rename, d / "a", d / "b")
    r("rename over file", os.rename, d / "b", d / "c")
    r("read replaced", read, d / "c")
    r("mkdir s", os.mkdir, s)
    r("mkdir t", os.mkdir, t)
    r("file over dir", os.rename, d / "c", s)
    r("dir over file", os.rename, s, d / "c")
    r("dir over empty dir", os.rename, s, t)
    r("create t/f", create, t / "f")
    r("mkdir u", os.mkdir, d / "u")
    r("dir over non-empty dir", os.rename, d / "u", t)
    r("dir into itself", os.rename, t, t / "sub")
    r("rename to itself", os.rename, d / "c", d / "c")
    r("link c h", os.link, d / "c", d / "h")
    r("rename onto own hard link", os.rename, d / "c", d / "h")
    r("rename missing", os.rename, d / "missing", d / "x")
    r("file with trailing slash", os.rename, str(d / "c") + "/", d / "x")
    r("into subdir", os.rename, d / "c", t / "c")
    r("back out", os.rename, t / "c", d / "c")
    r("create e", create, d / "e", b"e")
    r("NOREPLACE onto existing", renameat2, d / "e", d / "c", RENAME_NOREPLACE)
    r("NOREPLACE to new name", renameat2, d / "e", d / "f", RENAME_NOREPLACE)
    r("EXCHANGE two files", renameat2, d / "f", d / "c", RENAME_EXCHANGE)
    r("contents after EXCHANGE", lambda: (read(d / "c"), read(d / "f")))
    r("EXCHANGE with missing", renameat2, d / "f", d / "missing", RENAME_EXCHANGE)


@scenario
def unlinks(r, d):
    a = d / "a"
    r("create", create, a, b"gone but open")
    r("unlink missing", os.unlink, d / "missing")
    r("mkdir", os.mkdir, d / "s")
    r("unlink a dir", os.unlink, d / "s")

    def open_unlinked():
        fd = os.open(a, os.O_RDWR)
        try:
            os.unlink(a)
            st = os.fstat(fd)
            data = os.pread(fd, 100, 0)
            os.pwrite(fd, b"!", len(data))
            return st.st_nlink, data, os.pread(fd, 100, 0), os.path.exists(a)
        finally:
            os.close(fd)
    r("unlink while open", open_unlinked)
    r("recreate the name", create, a, b"new")
    r("read new", read, a)


@scenario
def directories(r, d):
    s = d / "s"
    r("mkdir 0750", os.mkdir, s, 0o750)
    r("mkdir again", os.mkdir, s)
    r("mkdir in missing", os.mkdir, d / "nodir" / "x")
    r("create file", create, d / "a")
    r("mkdir under a file", os.mkdir, d / "a" / "x")
    r("mkdir nested", os.mkdir, s / "n")
    r("mkdir 0777 under umask 022", os.mkdir, s / "m", 0o777)
    r("create in nested", create, s / "n" / "f")
    r("rmdir non-empty", os.rmdir, s)
    r("rmdir a file", os.rmdir, d / "a")
    r("rmdir dot", os.rmdir, str(s / "n") + "/.")
    r("rmdir missing", os.rmdir, d / "missing")
    r("listing", lambda: sorted(os.listdir(s)))
    r("unlink nested file", os.unlink, s / "n" / "f")
    r("rmdir nested", os.rmdir, s / "n")
    r("rmdir m", os.rmdir, s / "m")
    r("rmdir s", os.rmdir, s)


@scenario
def chmod_chown(r, d):
    a, s = d / "a", d / "s"
    r("create", create, a, b"x", 0o644)
    r("mkdir", os.mkdir, s)
    r("chmod 0600", os.chmod, a, 0o600)
    r("chmod 04755", os.chmod, a, 0o4755)
    r("chmod dir 0700", os.chmod, s, 0o700)
    r("chmod dir 01777", os.chmod, s, 0o1777)
    r("chown 1234:5678", os.chown, a, 1234, 5678)
    r("mode after chown", mode_of, a)
    r("chown -1:-1", os.chown, a, -1, -1)
    r("chown uid only", os.chown, a, 4321, -1)
    r("chown gid only", os.chown, a, -1, 8765)
    r("chown dir", os.chown, s, 1234, 5678)
    r("chmod missing", os.chmod, d / "missing", 0o600)
    r("chown missing", os.chown, d / "missing", 0, 0)

    def via_fd():
        fd = os.open(a, os.O_RDONLY)
        try:
            os.fchmod(fd, 0o640)
            os.fchown(fd, 0, 0)
        finally:
            os.close(fd)
    r("fchmod, fchown", via_fd)


@scenario
def truncates(r, d):
    a = d / "a"
    r("create", create, a, b"0123456789")
    r("truncate to 4", os.truncate, a, 4)
    r("read", read, a)
    r("truncate to 20", os.truncate, a, 20)
    r("read grown", read, a)
    r("truncate to -1", os.truncate, a, -1)
    r("mkdir", os.mkdir, d / "s")
    r("truncate a dir", os.truncate, d / "s", 0)
    r("truncate missing", os.truncate, d / "missing", 0)

    def ftrunc(flags, size):
        fd = os.open(a, flags)
        try:
            os.ftruncate(fd, size)
        finally:
            os.close(fd)
    r("ftruncate O_RDONLY fd", ftrunc, os.O_RDONLY, 0)
    r("ftruncate O_RDWR to 2", ftrunc, os.O_RDWR, 2)
    r("read after ftruncate", read, a)
    r("ftruncate to 0", ftrunc, os.O_WRONLY, 0)


@scenario
def utimes(r, d):
    a = d / "a"
    r("create", create, a, b"x")
    r("utime", os.utime, a, ns=(1_400_000_000_987_654_321, 1_500_000_000_123_456_789))
    r("mtime", lambda: os.stat(a).st_mtime_ns)
    r("utime missing", os.utime, d / "missing", ns=(0, 0))
    r("utime dir", os.utime, d, ns=(1_400_000_000_000_000_000, 1_300_000_000_000_000_000))
    r("dir mtime", lambda: os.stat(d).st_mtime_ns)


@scenario
def permissions(r, d):
    a, s = d / "a", d / "s"
    r("create 0644", create, a, b"root's", 0o644)
    r("mkdir 0755", os.mkdir, s, 0o755)
    r.as_user("read root's file", read, a)
    r.as_user("open root's file for writing", opened, a, os.O_WRONLY)
    r.as_user("chmod root's file", os.chmod, a, 0o666)
    r.as_user("chown root's file", os.chown, a, NOBODY.pw_uid, -1)
    r.as_user("utime root's file explicitly", os.utime, a, (1, 1))
    r.as_user("utime root's file to now", os.utime, a, None)
    r.as_user("truncate root's file", os.truncate, a, 0)
    r.as_user("create in root's dir", create, s / "x")
    r.as_user("mkdir in root's dir", os.mkdir, s / "y")
    r.as_user("unlink in root's dir", os.unlink, a)
    r.as_user("rename in root's dir", os.rename, a, d / "b")
    r.as_user("link in root's dir", os.link, a, d / "b")
    r("chmod dir 01777", os.chmod, s, 0o1777)
    r.as_user("create in sticky dir", create, s / "n", b"nobody's", 0o644)
    r.as_user("chmod own file", os.chmod, s / "n", 0o600)
    r.as_user("chown own file to root", os.chown, s / "n", 0, -1)
    r.as_user("chown own file to own group", os.chown, s / "n", -1, NOBODY.pw_gid)
    r.as_user("utime own file explicitly", os.utime, s / "n", (2, 2))
    r("create root's file in sticky dir", create, s / "r", b"root's", 0o666)
    r.as_user("unlink root's file in sticky dir", os.unlink, s / "r")
    r.as_user("rename root's file in sticky dir", os.rename, s / "r", s / "q")
    r.as_user("write root's 0666 file", lambda: create(s / "r", b"w", flags=os.O_WRONLY))
    r.as_user("rename own file in sticky dir", os.rename, s / "n", s / "m")
    r.as_user("unlink own file in sticky dir", os.unlink, s / "m")
    r("chmod 0000", os.chmod, a, 0)
    r("root reads a 0000 file", read, a)


@scenario
def two_handles(r, d):
    a = d / "a"
    fds = {}

    def step(fn):
        return lambda: fn(fds)
    r("create and write", step(lambda f: f.update(w=os.open(a, os.O_CREAT | os.O_WRONLY, 0o644))
                               or os.write(f["w"], b"abc")))
    r("open a reader", step(lambda f: f.update(r=os.open(a, os.O_RDONLY))))
    r("reader reads", step(lambda f: os.pread(f["r"], 100, 0)))
    r("writer appends", step(lambda f: os.write(f["w"], b"def")))
    r("reader reads again", step(lambda f: (os.pread(f["r"], 100, 0), os.fstat(f["r"]).st_size)))
    r("writer overwrites", step(lambda f: os.pwrite(f["w"], b"XY", 1)))
    r("writer closes", step(lambda f: os.close(f.pop("w"))))
    r("reader reads after close", step(lambda f: os.pread(f["r"], 100, 0)))
    r("a third handle truncates", os.truncate, a, 2)
    r("reader sees the truncate", step(lambda f: (os.pread(f["r"], 100, 0), os.fstat(f["r"]).st_size)))
    r("reader closes", step(lambda f: os.close(f.pop("r"))))


@scenario
def maildir_moves(r, d):
    """Delivery and flag changes as maildir programs do them; in the plain
    place under directories not named tmp/new/cur (so, plain files)."""
    if d.name == "cur":
        tmp, new, cur = d.parent / "tmp", d.parent / "new", d
    else:
        tmp, new, cur = d / "t", d / "n", d / "c"
        for x in (tmp, new, cur):
            x.mkdir()
    body = b"From: a@example.org\r\nSubject: moves\r\n\r\n" + b"x" * 3000

    def deliver():
        fd = os.open(tmp / "1.M1P1.host", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
    r("write in tmp", deliver)
    r("rename to new", os.rename, tmp / "1.M1P1.host", new / "1.M1P1.host")
    r("rename to cur with flags", os.rename, new / "1.M1P1.host", cur / "1.M1P1.host:2,S")
    r("read", read, cur / "1.M1P1.host:2,S")
    r("flag change", os.rename, cur / "1.M1P1.host:2,S", cur / "1.M1P1.host:2,RS")
    r("link as a copy", os.link, cur / "1.M1P1.host:2,RS", cur / "2.M2P2.host:2,")
    r("dot-file in cur", create, cur / ".2.tmp123", body[:100])
    r("dot-file renamed to a name", os.rename, cur / ".2.tmp123", cur / "3.M3P3.host:2,")
    r("read it", read, cur / "3.M3P3.host:2,")
    r("message renamed to a dot-file", os.rename, cur / "3.M3P3.host:2,", cur / ".3.old")
    r("read the dot-file", read, cur / ".3.old")
    r("replace a message by rename", os.rename, cur / ".3.old", cur / "2.M2P2.host:2,")
    r("read the replaced name", read, cur / "2.M2P2.host:2,")
    r("expunge", os.unlink, cur / "1.M1P1.host:2,RS")


@scenario
def folders(r, d):
    """Mail folders (directories holding cur/new/tmp) made, filled,
    renamed with their messages, linked across and removed."""
    base = d.parent if d.name == "cur" else d

    def folder(name):
        for sub in ("cur", "new", "tmp"):
            os.makedirs(base / name / sub)
    r("make folder A", folder, ".A")
    r("make folder C", folder, ".C")
    r("message in A", create, base / ".A" / "cur" / "1.M1.h:2,S", b"one" * 500)
    r("message in A/new", create, base / ".A" / "new" / "2.M2.h", b"two" * 500)
    r("rename folder A to B", os.rename, base / ".A", base / ".B")
    r("read after folder rename", read, base / ".B" / "cur" / "1.M1.h:2,S")
    r("link across folders", os.link, base / ".B" / "cur" / "1.M1.h:2,S",
      base / ".C" / "cur" / "1.M1.h:2,S")
    r("move across folders", os.rename, base / ".B" / "new" / "2.M2.h",
      base / ".C" / "cur" / "2.M2.h:2,")
    r("rename folder over non-empty folder", os.rename, base / ".B", base / ".C")
    r("rmdir non-empty cur", os.rmdir, base / ".B" / "cur")
    r("nested folder", folder, ".C/.D")
    r("rename folder into its own child", os.rename, base / ".C", base / ".C" / ".D" / ".E")
    r("expunge in B", os.unlink, base / ".B" / "cur" / "1.M1.h:2,S")
    r("read the link in C", read, base / ".C" / "cur" / "1.M1.h:2,S")
    for sub in ("cur", "new", "tmp"):
        r(f"rmdir B/{sub}", os.rmdir, base / ".B" / sub)
    r("rmdir B", os.rmdir, base / ".B")


# --- the run -------------------------------------------------------------------

PLACES = ("plain", "cur")


def run_all(root):
    """Every scenario in both places under root (the mount or the ext4
    directory); {(scenario, place): [(label, result, snapshot)...]}."""
    out = {}
    for sc in SCENARIOS:
        for place in PLACES:
            if place == "plain":
                top = root / "plain" / sc.__name__
                top.mkdir(parents=True)
                d = top
            else:
                top = root / ("." + sc.__name__)
                for sub in ("cur", "new", "tmp"):
                    (top / sub).mkdir(parents=True)
                d = top / "cur"
            r = Recorder(top)
            sc(r, d)
            out[(sc.__name__, place)] = r.steps
    return out


@pytest.fixture
def traversable_base():
    """A temporary directory the unprivileged user may traverse; asked
    for before make_mount, so it is removed after the mount in it is gone."""
    base = Path(tempfile.mkdtemp(prefix="dboxfs-test-posix-"))
    os.chmod(base, 0o755)
    yield base
    if not is_mounted(base / "mnt"):
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("options", [[], ["-o", "writeback_cache"]],
                         ids=["default", "writeback"])
def test_posix_conformance(traversable_base, make_mount, options):
    base = traversable_base
    m = make_mount(store=base / "store", mnt=base / "mnt",
                   options=["-o", "allow_other", *options])
    native = base / "native"
    for root in (m.mnt, native):
        for sub in ("cur", "new", "tmp"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        for p in (root, root / "cur", root / "new", root / "tmp"):
            os.chmod(p, 0o755)
    old_umask = os.umask(0o022)
    try:
        got, want = run_all(m.mnt), run_all(native)
    finally:
        os.umask(old_umask)

    differences, stale = [], dict(KNOWN)
    for key, steps in want.items():
        for (label, value, snap), (glabel, gvalue, gsnap) in zip(steps, got[key]):
            assert label == glabel
            known = KNOWN.get((*key, label))
            if known is not None and (gvalue, value) == known[:2]:
                stale.pop((*key, label), None)
                gvalue = value
            if (gvalue, gsnap) != (value, snap):
                differences.append({"where": key, "step": label,
                                    "mount": gvalue, "ext4": value,
                                    "tree": [(g, w) for g, w in zip(gsnap, snap) if g != w]
                                    or (gsnap, snap)})
                break  # later steps of the scenario follow from this one
    assert differences == [], "\n".join(map(repr, differences))
    assert stale == {}, f"KNOWN entries that no longer differ: {sorted(stale)}"


RENAME_WHITEOUT = 4


def test_rename_whiteout_is_refused(traversable_base, make_mount):
    """renameat2(RENAME_WHITEOUT) (overlayfs' upper layers: it leaves a
    0:0 character device behind) is a deliberate difference
    (docs/limits.md): EINVAL, and nothing moves; ext4 (or the local
    filesystem here) does it."""
    m = make_mount(store=traversable_base / "store", mnt=traversable_base / "mnt")
    native = traversable_base / "native"
    native.mkdir()
    for root in (m.mnt, native):
        (root / "a").write_bytes(b"a\n")
    with pytest.raises(OSError) as e:
        renameat2(m.mnt / "a", m.mnt / "b", RENAME_WHITEOUT)
    assert e.value.errno == errno.EINVAL
    assert not (m.mnt / "b").exists() and read(m.mnt / "a") == b"a\n"
    try:
        renameat2(native / "a", native / "b", RENAME_WHITEOUT)
    except OSError as e:
        pytest.skip(f"the local filesystem has no whiteouts: {e}")
    assert stat.S_ISCHR(os.lstat(native / "a").st_mode)
    assert read(native / "b") == b"a\n"
