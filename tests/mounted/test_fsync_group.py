"""fsync of messages by concurrent writers (group commit of the index,
m.N data synced outside the store lock, or with -o fsync=syncfs one
syncfs for both): every delivery whose fsync and rename returned is
there, byte-exact and exactly once, after the daemon is killed with
SIGKILL and the store mounted again.  Also fsync of a message written
again after its fsync, fsync of a committed message through a read-only
descriptor, fsyncdir, and the flushes each fsync costs in each mode
(strace of the daemon)."""
import os
import shutil
import subprocess
import threading
from collections import Counter

import pytest

from conftest import DBOXFS, is_mounted, tmpfs
from maildir_tools import parse_strace, strace_prefix

SYNCFS = ("-o", "fsync=syncfs")


def deliver_fsync(md, name, data):
    tmp = os.path.join(md, "tmp", name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, os.path.join(md, "new", name))


@pytest.mark.parametrize("options", [(), SYNCFS], ids=["fdatasync", "syncfs"])
def test_concurrent_fsync_deliveries_survive_sigkill(make_mount, options):
    m = make_mount(options=options)
    md = m.maildir(".in")
    writers, per = 4, 40
    sent = {}
    errors = []

    def writer(w):
        try:
            for i in range(per):
                name = f"w{w}.m{i}"
                data = os.urandom(200 + 97 * i) + f"\n{name}\n".encode()
                deliver_fsync(md, name, data)
                sent[name] = data
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    fd = os.open(os.path.join(md, "new"), os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)  # fsyncdir
    os.close(fd)

    m.kill()
    assert not is_mounted(m.mnt)
    m.mount()
    names = sorted(os.listdir(os.path.join(md, "new")))
    assert names == sorted(sent)
    for name, data in sent.items():
        with open(os.path.join(md, "new", name), "rb") as f:
            assert f.read() == data
    assert os.listdir(os.path.join(md, "tmp")) == []


def test_fsync_write_fsync_again(mount):
    md = mount.maildir()
    path = os.path.join(md, "tmp", "again")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"first part\n")
    os.fsync(fd)
    os.write(fd, b"second part\n")
    os.fsync(fd)
    os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"first part\nsecond part\n"
    assert os.stat(path).st_size == len(b"first part\nsecond part\n")
    mount.remount()
    with open(path, "rb") as f:
        assert f.read() == b"first part\nsecond part\n"


def test_fsync_committed_message_read_only(mount):
    md = mount.maildir()
    path = os.path.join(md, "cur", "ro:2,S")
    with open(path, "wb") as f:
        f.write(b"committed\n")
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    assert os.read(fd, 100) == b"committed\n"
    os.close(fd)


def traced_deliveries(make_mount, tmp_path, options, n, store=None):
    """n fsync'ed deliveries on a mount whose daemon runs under strace;
    the flushes it made from mount to unmount (syncfs, fdatasync, fsync
    calls), and the mount (unmounted)."""
    log = tmp_path / "daemon.strace"
    m = make_mount(store=store, options=options,
                   prefix=strace_prefix(log, ["syncfs", "fdatasync", "fsync"]))
    md = m.maildir(".in")
    for i in range(n):
        deliver_fsync(md, f"m{i}", b"Subject: %d\n\nbody\n" % i)
    m.unmount()
    return Counter(call for call, _, ret, _ in parse_strace(log) if ret == 0), m


needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


@needs_strace
def test_fsync_flushes_per_mode(make_mount, tmp_path):
    """The default puts an fsync'ed message on disk with two flushes (its
    m.N, then the WAL); -o fsync=syncfs with one syncfs and no fdatasync
    (the few left are the mount's and unmount's own)."""
    n = 40
    calls, m = traced_deliveries(make_mount, tmp_path, (), n)
    assert calls["syncfs"] == 0
    assert calls["fdatasync"] >= 2 * n
    calls, m = traced_deliveries(make_mount, tmp_path, SYNCFS, n,
                                 store=tmp_path / "store2")
    assert calls["syncfs"] == n
    assert calls["fdatasync"] + calls["fsync"] < n // 2
    m.prefix = []
    m.mount()
    assert sorted(os.listdir(m.mnt / ".in" / "new")) == sorted(f"m{i}" for i in range(n))


@needs_strace
def test_syncfs_with_storage_on_another_filesystem(make_mount, tmp_path):
    """storage/ on a filesystem of its own: the syncfs covers the m.N, and
    the WAL, elsewhere, gets its fdatasync too - still every fsync'ed
    message survives the daemon's death."""
    store = tmp_path / "store"
    make_mount(store=store).unmount()  # a new store, storage/ moved below
    (store / "storage").rename(store / "storage.ext4")
    gen = tmpfs(store / "storage", "16m")
    next(gen)
    try:
        subprocess.run(["cp", "-a", f"{store}/storage.ext4/.", str(store / "storage")],
                       check=True)
        shutil.rmtree(store / "storage.ext4")
        calls, m = traced_deliveries(make_mount, tmp_path, SYNCFS, 20, store=store)
        assert calls["syncfs"] == 20
        assert calls["fdatasync"] >= 20
        m.prefix = []
        m.mount()
        md = m.mnt / ".in"
        deliver_fsync(md, "last", b"last\n")
        m.kill()
        m.mount()
        assert sorted(os.listdir(md / "new")) == sorted(["last"] + [f"m{i}" for i in range(20)])
        assert (md / "new" / "last").read_bytes() == b"last\n"
        m.unmount()
    finally:
        next(gen, None)


def test_fsync_option_is_checked(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run([str(DBOXFS), str(tmp_path / "store"), str(mnt), "-f",
                        "-o", "fsync=sometimes"], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode != 0
    assert "-o fsync=sometimes: want syncfs or fdatasync" in r.stderr
    assert not (tmp_path / "store").exists()
