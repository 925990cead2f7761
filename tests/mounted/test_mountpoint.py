"""Mount points that cannot work are refused before anything changes.

A store inside its own mount point would hang every access; a dead mount
(daemon killed) left on the mount point would be stacked over; an unknown
-o option must not leave a new empty store behind.
"""
import fcntl
import os
import signal
import subprocess
import time

import pytest

from conftest import DBOXADM, DBOXFS, is_mounted, unmount


def wait_store_free(store, seconds=30):
    """Until no process holds the store's lock."""
    fd = os.open(store / "lock", os.O_RDWR)
    try:
        for _ in range(int(seconds / 0.05)):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.05)
    finally:
        os.close(fd)


def run_dboxfs(*args):
    return subprocess.run([str(DBOXFS), *map(str, args)], capture_output=True,
                          text=True, timeout=30)


def mount_source(mnt):
    """The source field of the mount on mnt in /proc/mounts, unescaped."""
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == os.path.realpath(mnt):
                return fields[0].replace("\\040", " ")
    raise AssertionError(f"{mnt} not mounted")


def test_mounts_name_their_store(tmp_path, monkeypatch):
    """/proc/mounts, df and findmnt show the store a mount serves (its
    absolute path, commas and spaces kept), not 'dboxfs' for every mount
    (helper-85); -o fsname= given wins.  A new store named with '.' or
    '..' was shown so (helper-87): its real path."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    try:
        for store, opts, want in (("a, b", [], str(tmp_path / "a, b")),
                                  ("./sub/../new", [], str(tmp_path / "new")),
                                  (tmp_path / "c", ["-o", "fsname=mine"], "mine")):
            r = run_dboxfs(store, mnt, *opts)
            assert r.returncode == 0, r.stderr
            assert mount_source(mnt) == want
            unmount(mnt)
    finally:
        unmount(mnt)


def test_store_inside_mount_point_is_refused(tmp_path):
    mnt = tmp_path / "mnt"
    (mnt / "inner").mkdir(parents=True)
    for store in (mnt / "inner", mnt, mnt / "new-store"):
        r = run_dboxfs(store, mnt)
        assert r.returncode != 0
        assert "inside the mount point" in r.stderr
        assert not is_mounted(mnt)
    assert os.listdir(mnt) == ["inner"]  # nothing created
    assert os.listdir(mnt / "inner") == []


def test_unknown_option_creates_no_store(tmp_path):
    (tmp_path / "mnt").mkdir()
    r = run_dboxfs("-o", "no_such_option=1", tmp_path / "store", tmp_path / "mnt")
    assert r.returncode != 0
    assert not (tmp_path / "store").exists()
    assert not is_mounted(tmp_path / "mnt")


BAD_NUMBERS = [
    ("rotate_size=0", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=-1", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=12abc", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=4294967296", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=18446744073709551617", "want a whole number of bytes from 1 to 4294967295"),
    ("entry_timeout=-1", "want seconds from 0 to 31536000"),
    ("entry_timeout=nan", "want seconds from 0 to 31536000"),
    ("entry_timeout=1e99", "want seconds from 0 to 31536000"),
    ("attr_timeout=abc", "want seconds from 0 to 31536000"),
    ("attr_timeout=31536000.5", "want seconds from 0 to 31536000"),
    ("purge_threshold=101", "want a whole percentage from 0 to 100"),
    ("purge_threshold=-1", "want a whole percentage from 0 to 100"),
    ("purge_threshold=4294967296", "want a whole percentage from 0 to 100"),
    ("purge_threshold=", "want a whole percentage from 0 to 100"),
]


@pytest.mark.parametrize("opt,want", BAD_NUMBERS, ids=[o for o, _ in BAD_NUMBERS])
def test_numeric_option_out_of_range_is_refused(tmp_path, opt, want):
    """One line naming the option and its range, exit 1, and neither a new
    store nor a change to an existing one."""
    (tmp_path / "mnt").mkdir()
    try:
        r = run_dboxfs(tmp_path / "store", tmp_path / "mnt", "-o", "ro," + opt)
        assert not is_mounted(tmp_path / "mnt")
    finally:
        unmount(tmp_path / "mnt")
    assert r.returncode == 1
    assert r.stderr == f"dboxfs: -o {opt}: {want}\n"
    assert not (tmp_path / "store").exists()


def test_numeric_options_at_their_limits_mount(make_mount):
    """The ends of every range are accepted, and the bad one of two
    occurrences is found."""
    m = make_mount(options=["-o", "rotate_size=1,entry_timeout=0,attr_timeout=0.5,"
                                  "purge_threshold=100"])
    (m.mnt / "cur" / "1.x:2,S").write_bytes(b"Subject: a\n\na\n")
    (m.mnt / "cur" / "2.x:2,S").write_bytes(b"Subject: b\n\nb\n")
    m.unmount()
    assert sorted(p.name for p in (m.store / "storage").glob("m.*")) == ["m.1", "m.2"]
    m2 = make_mount(store=m.store, options=["-o", "rotate_size=4294967295,"
                                            "entry_timeout=31536000,purge_threshold=0"])
    assert (m2.mnt / "cur" / "2.x:2,S").read_bytes() == b"Subject: b\n\nb\n"
    m2.unmount()
    before = sorted(os.listdir(m.store))
    try:
        r = run_dboxfs(m.store, m.mnt, "-o", "purge_threshold=5", "-o", "purge_threshold=500")
    finally:
        unmount(m.mnt)
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["dboxfs: -o purge_threshold=500: "
                                     "want a whole percentage from 0 to 100"]
    assert sorted(os.listdir(m.store)) == before
    assert not is_mounted(m.mnt)


def daemon_pid(store):
    """The pid of the dboxfs daemon serving store."""
    return int(subprocess.run(["pgrep", "-f", f"dboxfs {store} "],
                              capture_output=True, text=True).stdout.split()[0])


def assert_refused_over_dead_mount(store, mnt):
    """dboxfs refuses to mount over the dead mount on mnt, saying how to
    take it away, and does not stack a second mount there."""
    r = run_dboxfs(store, mnt)
    assert r.returncode != 0
    assert "fusermount3 -u" in r.stderr
    with open("/proc/mounts") as f:
        assert sum(line.split()[1] == str(mnt) for line in f) == 1


def test_dead_mount_is_not_stacked_over(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    try:
        assert run_dboxfs(store, mnt).returncode == 0  # a daemon in the background
        pid = daemon_pid(store)
        # The crash: the daemon dies, its mount stays (no fusermount3 -u).
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            try:
                os.stat(mnt)
            except OSError:
                break
            time.sleep(0.05)
        assert_refused_over_dead_mount(store, mnt)
    finally:
        while is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], stderr=subprocess.DEVNULL)


def test_dead_mount_with_cached_root_is_not_stacked_over(tmp_path):
    """A daemon killed while a client was using the mount: the kernel
    still has the root's attributes cached, so stat() of the dead mount
    succeeds; dboxfs must still see that it is dead."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    try:
        assert run_dboxfs(store, mnt).returncode == 0
        pid = daemon_pid(store)
        os.listdir(mnt / "cur")
        os.stat(mnt)                      # the root's attributes, cached
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not os.path.exists(f"/proc/{pid}/fd"):
                break
            time.sleep(0.05)
        os.stat(mnt)                      # still answered from the cache
        assert_refused_over_dead_mount(store, mnt)
    finally:
        while is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], stderr=subprocess.DEVNULL)


def test_live_mount_is_not_stacked_over(tmp_path):
    """dboxfs run twice on one mount point: the second is refused before
    its store is made, and the first mount stays the only one there."""
    mnt, other = tmp_path / "mnt", tmp_path / "other"
    mnt.mkdir()
    try:
        assert run_dboxfs(tmp_path / "store", mnt).returncode == 0
        r = run_dboxfs(other, mnt)
        assert r.returncode != 0
        assert f"{mnt} is a FUSE mount already; unmount it first " \
            f"('fusermount3 -u {mnt}')" in r.stderr, r.stderr
        assert not other.exists()
        with open("/proc/mounts") as f:
            assert sum(line.split()[1] == str(mnt) for line in f) == 1
        assert (mnt / "cur").is_dir()
    finally:
        while is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)], stderr=subprocess.DEVNULL)


def test_mount_and_dboxadm_right_after_unmount(tmp_path):
    """fusermount3 -u returns before the daemon has closed the store;
    a mount or dboxadm started at once waits for it (the lock file says
    "closing") instead of failing with 'store is in use'."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    src = tmp_path / "src"
    for sub in ("cur", "new", "tmp"):
        (src / sub).mkdir(parents=True)
    (src / "cur" / "1.M1P1.host:2,S").write_bytes(b"Subject: x\n\nbody\n")
    try:
        for cycle in range(4):
            r = run_dboxfs(store, mnt)
            assert r.returncode == 0, r.stderr
            for i in range(200):   # a WAL to checkpoint at the unmount
                tmp = mnt / "tmp" / f"{cycle}.{i}"
                tmp.write_bytes(os.urandom(2000))
                os.rename(tmp, mnt / "new" / f"{cycle}.{i}")
            subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
        r = subprocess.run([str(DBOXADM), "import", str(store), str(src)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        r = run_dboxfs(store, mnt)
        assert r.returncode == 0, r.stderr
        assert len(os.listdir(mnt / "new")) == 4 * 200
        assert (mnt / "cur" / "1.M1P1.host:2,S").read_bytes() == b"Subject: x\n\nbody\n"
    finally:
        while is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)], stderr=subprocess.DEVNULL)
            time.sleep(0.1)
        # the last daemon lets go of the store before tmp_path goes
        wait_store_free(store)


def test_mount_point_that_is_not_empty_is_refused(tmp_path):
    """A delivery into the bare mount point (the dead mount taken away by
    -o auto_unmount, or the store not mounted yet at boot) put mail where
    the next mount hid it: dboxfs mounted over the directory without a
    word (helper-80).  A mount point that is not empty is now refused,
    naming what is there, and nothing is made; -o nonempty mounts over it
    all the same.  A new store is said to be one (a mistyped STORE is)."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    (mnt / "new").mkdir(parents=True)
    mail = mnt / "new" / "1796631736.4836_0.vm"
    mail.write_bytes(b"Subject: hidden?\n\nx\n")
    r = run_dboxfs(store, mnt)
    assert r.returncode != 0
    assert "is not empty (it holds 'new')" in r.stderr, r.stderr
    assert "-o nonempty" in r.stderr
    assert not is_mounted(mnt)
    assert not store.exists(), "a refused mount made a store"
    assert mail.read_bytes() == b"Subject: hidden?\n\nx\n"
    # A name that could act on the terminal is escaped.
    mail.rename(mnt / "new" / "x")
    (mnt / "new").rename(mnt / "a\x1b[2Jb")
    r = run_dboxfs(store, mnt)
    assert r.returncode != 0 and "a\\x1b[2Jb" in r.stderr, r.stderr
    (mnt / "a\x1b[2Jb").rename(mnt / "new")
    r = run_dboxfs(store, mnt, "-o", "nonempty")
    try:
        assert r.returncode == 0, r.stderr
        assert "; a new, empty store)" in r.stderr, r.stderr
        assert is_mounted(mnt)
        assert os.listdir(mnt / "new") == []   # hidden under the mount
    finally:
        unmount(mnt)
    wait_store_free(store)
    assert (mnt / "new" / "x").exists()
    os.unlink(mnt / "new" / "x")
    os.rmdir(mnt / "new")
    r = run_dboxfs(store, mnt)                   # empty now; not a new store
    try:
        assert r.returncode == 0, r.stderr
        assert "mounted " + str(store) in r.stderr, r.stderr
        assert "new, empty" not in r.stderr
    finally:
        unmount(mnt)
