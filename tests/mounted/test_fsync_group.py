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



class FdatasyncTrace:
    """strace -f -y of the daemon's fdatasync() calls (or those of
    `calls`), from start() to stop() into self.log: the files it synced,
    in order."""

    def __init__(self, mount, calls="fdatasync", name="strace.log"):
        self.pid = mount.proc.pid
        self.log = mount.mnt.parent / name
        self.calls = calls
        self.tracer = None

    def start(self):
        self.tracer = subprocess.Popen(
            ["strace", "-f", "-qq", "-y", "-s", "0", "-e",
             "trace=" + self.calls, "-o", str(self.log),
             "-p", str(self.pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not self.traced():
            assert time.monotonic() < deadline, "strace did not attach"
            time.sleep(0.05)
        return self

    def traced(self):
        with open(f"/proc/{self.pid}/status") as f:
            return any(line.startswith("TracerPid:") and line.split()[1] != "0"
                       for line in f)

    def stop(self):
        if self.tracer is not None:
            self.tracer.terminate()
            self.tracer.wait()
            self.tracer = None

    def synced(self):
        """Names synced so far: "wal" for the index's WAL, "m.N" for a
        message file."""
        names = []
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                if "fdatasync(" not in line or ">" not in line:
                    continue
                path = line.split("<", 1)[1].split(">", 1)[0]
                if path.endswith("index.sqlite-wal"):
                    names.append("wal")
                elif "/storage/m." in path:
                    names.append(os.path.basename(path))
        return names

    def wait_for(self, what, after=None, timeout=10):
        """Wait for a sync of what (after the first sync of after)."""
        deadline = time.monotonic() + timeout
        while True:
            synced = self.synced()
            if after is not None:
                synced = synced[synced.index(after) + 1:] \
                    if after in synced else []
            if what in synced:
                return
            assert time.monotonic() < deadline, \
                f"no fdatasync of {what}: {self.synced()}"
            time.sleep(0.1)


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
    trace = FdatasyncTrace(mount).start()
    try:
        os.rename(tmp, os.path.join(md, "new", "second"))
        trace.wait_for("wal")
        synced = trace.synced()
        time.sleep(2.5)
        assert trace.synced() == synced, "syncs while idle"
    finally:
        trace.stop()
    mount.remount()
    assert sorted(os.listdir(os.path.join(md, "new"))) == ["first", "second"]


def test_closed_message_reaches_the_disk_before_its_row(mount):
    """A message closed without fsync() (rsync, a client with fsync off):
    the timed sync that puts its index row on disk first syncs the m.N
    that holds its bytes, so a power loss never leaves a row whose
    message reads as EIO.  Both within seconds, no client asking."""
    md = mount.maildir()
    trace = FdatasyncTrace(mount).start()
    try:
        with open(os.path.join(md, "tmp", "unsynced"), "wb") as f:
            f.write(b"Subject: never fsynced\n\n" + b"x" * 5000 + b"\n")
        os.rename(os.path.join(md, "tmp", "unsynced"),
                  os.path.join(md, "new", "unsynced"))
        # (Making m.1 syncs the WAL too: the m.N must come first in the
        # timed sync, and the WAL after it.)
        trace.wait_for("m.1")
        trace.wait_for("wal", after="m.1")
    finally:
        trace.stop()


def test_fsync_syncs_bytes_of_messages_others_closed(mount):
    """An fsync() that syncs the WAL - here of a message written again,
    a copy, which recovery never puts back by itself
    (test_fsync_one_flush.py) - syncs it with every commit so far, among
    them the row of a message another writer closed without fsync a
    moment before: that message's m.N is synced first (engine/store-
    sync.c), so no row reaches the disk ahead of its bytes."""
    md = mount.maildir()
    deliver_fsync(md, "b", b"Subject: b\n\nfirst version\n")
    a = os.open(os.path.join(md, "tmp", "a"), os.O_WRONLY | os.O_CREAT, 0o600)
    b = os.open(os.path.join(md, "new", "b"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(a, b"Subject: a\n\nclosed, never fsynced\n")
        os.write(b, b"appended, fsynced\n")
        trace = FdatasyncTrace(mount).start()
        try:
            os.close(a)
            a = None
            os.fsync(b)
            synced = trace.synced()
        finally:
            trace.stop()
    finally:
        for fd in (a, b):
            if fd is not None:
                os.close(fd)
    # a went to m.1 (b's first version is there, its append took m.2
    # while a held m.1).
    assert "m.2" in synced and "wal" in synced, synced
    assert "m.1" in synced[:synced.index("wal")], synced


def test_an_fsynced_delivery_syncs_its_mfile_once(mount):
    """An fsync'ed message is off the timed sync's list: its m.N is
    synced by the fsync and not again by the round before the WAL sync
    (that cost an openat, an fdatasync and a close per delivery)."""
    md = mount.maildir()
    deliver_fsync(md, "warm", b"Subject: warm\n\nmakes m.1\n")
    time.sleep(1.5)  # its own timed round is over
    trace = FdatasyncTrace(mount).start()
    try:
        for i in range(3):
            deliver_fsync(md, f"m{i}", b"Subject: %d\n\nbody\n" % i)
        time.sleep(1.5)  # and the timed round after them
        synced = trace.synced()
    finally:
        trace.stop()
    assert synced.count("m.1") == 3, synced



def test_checkpoints_sync_the_wal_by_the_stores_round(mount):
    """SQLite's own syncs of the WAL (a checkpoint's, before it copies
    frames into index.sqlite; the header's when the WAL starts over) go
    through the store's sync round like every other WAL sync (reserve.h,
    dbox_reserve_wal_sync_by), which syncs the m.N files of messages
    closed without fsync() first.  Before, a checkpoint synced the WAL
    alone: a power loss right after it left rows whose messages read as
    EIO.  Messages are closed without fsync until a checkpoint writes
    into index.sqlite; strace -y shows every WAL sync made by the
    round's descriptor (index/wal-sync.c), none by the one SQLite writes
    the WAL with.  (That the round syncs the m.N first is
    test_closed_message_reaches_the_disk_before_its_row's.)"""
    md = mount.maildir()
    trace = FdatasyncTrace(mount, "fdatasync,fsync,pwrite64",
                           "ckpt.strace").start()
    log = trace.log
    try:
        body = b"Subject: no fsync\n\n" + b"x" * 300 + b"\n"
        checkpointed = False
        for i in range(8000):
            tmp = os.path.join(md, "tmp", f"n{i}")
            with open(tmp, "wb") as f:
                f.write(body)
            os.rename(tmp, os.path.join(md, "new", f"n{i}"))
            # A checkpoint writes pages into index.sqlite itself.
            if i % 200 == 199 and b"index.sqlite>" in log.read_bytes():
                checkpointed = True
                break
        time.sleep(1.5)  # and the timed sync after the last commit
    finally:
        trace.stop()
    assert checkpointed, "no checkpoint in 8000 deliveries"
    calls = []  # (thread, call, fd, file)
    for line in log.read_text().splitlines():
        tid, call = line.split(None, 1)
        name = call.split("(", 1)[0]
        if name.startswith("<...") or "<" not in call:
            continue
        fd, rest = call.split("(", 1)[1].split("<", 1)
        calls.append((tid, name, fd, os.path.basename(rest.split(">")[0])))
    sqlite_fds = {fd for _, name, fd, f in calls
                  if name == "pwrite64" and f == "index.sqlite-wal"}
    wal_syncs = [c for c in calls
                 if c[1] != "pwrite64" and c[3] == "index.sqlite-wal"]
    assert wal_syncs, "no WAL sync seen"
    by_sqlite = [c for c in wal_syncs if c[2] in sqlite_fds]
    assert not by_sqlite, f"WAL synced by SQLite's own descriptor: " \
        f"{by_sqlite[:3]}"


def test_a_plain_file_renamed_over_another_is_synced_before_the_rename(mount):
    """A plain file written without fsync and renamed over another name
    (Dovecot's dovecot.index, a client's state file): the round whose WAL
    sync makes the rename durable syncs its backing file first, as ext4
    flushes a file renamed over another before the rename's commit
    (auto_da_alloc).  Before, the rename reached the disk within a second
    and the bytes with the kernel's writeback, up to 30 s later: after a
    power loss between the two the file was empty (helper-69).  A plain
    rename to a new name is not flushed, as on ext4."""
    md = mount.maildir()
    old = os.path.join(md, "dovecot.index")
    with open(old, "wb") as f:
        f.write(b"old index\n")
        f.flush()
        os.fsync(f.fileno())
    tmp = old + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"new index\n" * 100)
    ino = os.stat(tmp).st_ino
    time.sleep(1.5)  # the writes' own timed round is over
    trace = FdatasyncTrace(mount, "fdatasync,fsync",
                           "renameover.strace").start()
    log = trace.log
    try:
        os.rename(tmp, old)
        deadline = time.monotonic() + 10
        while "index.sqlite-wal>" not in log.read_text():
            assert time.monotonic() < deadline, "no WAL sync"
            time.sleep(0.1)
    finally:
        trace.stop()
    synced = [line.split("<", 1)[1].split(">", 1)[0]
              for line in log.read_text().splitlines() if "<" in line]
    first_wal = next(i for i, p in enumerate(synced)
                     if p.endswith("index.sqlite-wal"))
    assert any(p.endswith(f"/files/{ino}") for p in synced[:first_wal]), synced
    with open(old, "rb") as f:
        assert f.read() == b"new index\n" * 100
