"""fsync of messages by concurrent writers (group commit of the index,
m.N data synced outside the store lock): every delivery whose fsync and
rename returned is there, byte-exact and exactly once, after the daemon
is killed with SIGKILL and the store mounted again.  Also fsync of a
message written again after its fsync, fsync of a committed message
through a read-only descriptor, and fsyncdir."""
import os
import subprocess
import threading
import time

from conftest import is_mounted


def deliver_fsync(md, name, data):
    tmp = os.path.join(md, "tmp", name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, os.path.join(md, "new", name))


def test_concurrent_fsync_deliveries_survive_sigkill(make_mount):
    m = make_mount()
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


def test_rename_reaches_the_disk_without_fsyncdir(mount):
    """A rename after the message's fsync (Postfix, procmail and most
    delivery agents sync no directory) is on disk within the WAL's timed
    sync (index/checkpoint.h: 1 s), as ext4's journal commit (5 s) makes
    it there: strace sees the daemon fdatasync() the WAL after the rename
    with no client asking, and nothing while the store is idle."""
    md = mount.maildir()
    deliver_fsync(md, "first", b"Subject: first\n\nsynced by its fsync\n")
    tmp = os.path.join(md, "tmp", "second")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"Subject: second\n\nrenamed after its fsync\n")
    os.fsync(fd)
    os.close(fd)
    time.sleep(1.5)  # the fsyncs' own timed sync is done
    log = mount.mnt.parent / "strace.log"
    tracer = subprocess.Popen(
        ["strace", "-f", "-qq", "-y", "-e", "trace=fdatasync", "-o", str(log),
         "-p", str(mount.proc.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not traced(mount.proc.pid):
            assert time.monotonic() < deadline, "strace did not attach"
            time.sleep(0.05)
        os.rename(tmp, os.path.join(md, "new", "second"))
        deadline = time.monotonic() + 10
        while wal_syncs(log) == 0:
            assert time.monotonic() < deadline, \
                "the rename's commit was not synced: " + log.read_text()
            time.sleep(0.1)
        synced = wal_syncs(log)
        time.sleep(2.5)
        assert wal_syncs(log) == synced, "syncs while idle: " + log.read_text()
    finally:
        tracer.terminate()
        tracer.wait()
    mount.remount()
    assert sorted(os.listdir(os.path.join(md, "new"))) == ["first", "second"]


def traced(pid):
    with open(f"/proc/{pid}/status") as f:
        return any(line.startswith("TracerPid:") and line.split()[1] != "0"
                   for line in f)


def wal_syncs(log):
    """fdatasync() calls on the index's WAL in an strace -y log."""
    if not log.exists():
        return 0
    return sum("fdatasync(" in line and "index.sqlite-wal>" in line
               for line in log.read_text().splitlines())
