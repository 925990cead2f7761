"""Filesystem semantics maildir clients rely on, checked on a real mount.

One section per promise of docs/design.md sections 2 and 5 (and the client
behaviour in docs/clients.md).  Every test checks outcomes a
client would see (bytes, st_ino, counts, errno), so each fails when the
behaviour breaks.
"""
import errno
import fcntl
import mmap
import os
import random
import stat
import subprocess
import sys
import threading
import time
from collections import Counter

import pytest

from conftest import DBOXFS, is_mounted, unmount

RNG = random.Random(20240611)


def rand_bytes(n):
    return RNG.randbytes(n)


def write_file(path, data, flags=os.O_WRONLY | os.O_CREAT | os.O_EXCL,
               fsync=False, mode=0o600):
    fd = os.open(path, flags, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def deliver(md, name, data, to="new"):
    """tmp/ then rename() into new/ or cur/, as mbsync and Dovecot do."""
    write_file(md / "tmp" / name, data)
    os.rename(md / "tmp" / name, md / to / name)
    return md / to / name


def oserror(func, *args):
    """The errno func(*args) fails with (the test fails if it succeeds)."""
    with pytest.raises(OSError) as info:
        func(*args)
    return info.value.errno


def files_in(store):
    """Backing files of plain files: STORE/files/*."""
    return sorted(os.listdir(store / "files"))


def files_bytes(store):
    return sum(os.path.getsize(store / "files" / n) for n in files_in(store))


def wait_for(cond, timeout=3.0):
    """Poll cond() until true; the kernel forgets inodes asynchronously."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def storage_files(store):
    d = store / "storage"
    return {n: (d / n).read_bytes() for n in os.listdir(d) if n.startswith("m.")}


# --- 1. link() ----------------------------------------------------------------

def test_link_then_unlink_shares_inode(mount):
    md = mount.maildir()
    data = b"Subject: link\n\n" + rand_bytes(3000)
    write_file(md / "tmp" / "1.P1.host", data, fsync=True)
    os.link(md / "tmp" / "1.P1.host", md / "new" / "1.P1.host")
    a, b = os.stat(md / "tmp" / "1.P1.host"), os.stat(md / "new" / "1.P1.host")
    assert a.st_ino == b.st_ino
    assert a.st_nlink == b.st_nlink == 2
    os.unlink(md / "tmp" / "1.P1.host")
    st = os.stat(md / "new" / "1.P1.host")
    assert st.st_ino == a.st_ino and st.st_nlink == 1
    assert read_file(md / "new" / "1.P1.host") == data
    assert os.listdir(md / "tmp") == []
    mount.remount()
    st2 = os.stat(md / "new" / "1.P1.host")
    assert (st2.st_ino, st2.st_nlink) == (st.st_ino, 1)
    assert read_file(md / "new" / "1.P1.host") == data


def test_link_errors(mount):
    md = mount.maildir()
    write_file(md / "tmp" / "a", b"a\n")
    write_file(md / "new" / "b", b"b\n")
    assert oserror(os.link, md / "tmp" / "a", md / "new" / "b") == errno.EEXIST
    assert read_file(md / "new" / "b") == b"b\n"
    assert os.stat(md / "tmp" / "a").st_nlink == 1
    assert oserror(os.link, md / "cur", md / "cur2") == errno.EPERM
    assert not os.path.exists(md / "cur2")


def test_link_while_writer_open(mount):
    md = mount.maildir()
    a, b = rand_bytes(5000), rand_bytes(5000)
    fd = os.open(md / "tmp" / "m", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, a)
        os.link(md / "tmp" / "m", md / "new" / "m")
        assert os.stat(md / "new" / "m").st_nlink == 2
        os.write(fd, b)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(md / "tmp" / "m")
    assert read_file(md / "new" / "m") == a + b
    mount.remount()
    assert read_file(md / "new" / "m") == a + b


def test_inode_numbers_never_reused(mount):
    md = mount.maildir()
    seen = set()
    for round in range(2):
        for i in range(20):
            p = deliver(md, f"{round}.{i}", b"x", "cur")
            ino = os.stat(p).st_ino
            assert ino not in seen
            seen.add(ino)
            os.unlink(p)
        mount.remount()


def test_link_across_folders_postfix_style(mount):
    """Delivery by link() into several folders (procmail) and COPY."""
    inbox, sent = mount.maildir(), mount.maildir(".Sent")
    data = rand_bytes(10000)
    write_file(inbox / "tmp" / "m", data)
    ino = os.stat(inbox / "tmp" / "m").st_ino
    os.link(inbox / "tmp" / "m", inbox / "new" / "m")
    os.link(inbox / "tmp" / "m", sent / "cur" / "m:2,S")
    os.unlink(inbox / "tmp" / "m")
    for p in (inbox / "new" / "m", sent / "cur" / "m:2,S"):
        st = os.stat(p)
        assert (st.st_ino, st.st_nlink, st.st_size) == (ino, 2, len(data))
        assert read_file(p) == data
    os.unlink(inbox / "new" / "m")
    assert os.stat(sent / "cur" / "m:2,S").st_nlink == 1
    assert read_file(sent / "cur" / "m:2,S") == data


# --- 2. names -----------------------------------------------------------------

ODD_NAMES = [
    b"1.M1P1.host:2,",
    b"a:b,c=d!e;f:2,FS",
    b"x;y=z!w,,::2,RS",
    "Grüße-日本語-✉.host:2,S".encode(),
    b"with space and 'quote' \"dq\" \\ back:2,",
    b"\xc3\xa9t\xc3\xa9-only-utf8",
    b"tab\there\nnewline\x01:2,T",
    b"latin1-\xe9-and-invalid-\xff\xfe:2,",
]


def test_names_keep_every_byte(mount):
    md = mount.maildir()
    cur = bytes(md / "cur")
    contents = {}
    for i, name in enumerate(ODD_NAMES):
        data = b"msg %d\n" % i
        write_file(cur + b"/" + name, data)
        contents[name] = data
    long_name = b"1.host" + "é".encode() * 122 + b":2,S"  # 254 bytes
    long_name += b"x" * (255 - len(long_name))
    assert len(long_name) == 255
    write_file(cur + b"/" + long_name, b"long\n")
    contents[long_name] = b"long\n"
    for _ in range(2):
        assert sorted(os.listdir(cur)) == sorted(contents)
        assert sorted(e.name for e in os.scandir(cur)) == sorted(contents)
        for e in os.scandir(cur):  # d_ino and d_type (NeoMutt, notmuch)
            assert e.inode() == os.stat(e.path).st_ino
            assert e.is_file(follow_symlinks=False)
        for name, data in contents.items():
            assert read_file(cur + b"/" + name) == data
        mount.remount()


def test_new_names_and_size_fields_left_as_written(mount):
    md = mount.maildir()
    data = b"Subject: s\n\nbody\n"
    # No ":2," in new/ (Postfix, qmail); wrong S=/W= must not be "fixed".
    deliver(md, "1.V1I2M3.host", data, "new")
    deliver(md, "2.M1P1.host,S=999,W=1001", data, "new")
    deliver(md, "3.M1P1.host,S=17,W=20:2,S", data, "cur")
    deliver(md, "4.M1P1.host,S=1,W=2:2,", data, "cur")
    for _ in range(2):
        assert sorted(os.listdir(md / "new")) == ["1.V1I2M3.host",
                                                  "2.M1P1.host,S=999,W=1001"]
        assert sorted(os.listdir(md / "cur")) == ["3.M1P1.host,S=17,W=20:2,S",
                                                  "4.M1P1.host,S=1,W=2:2,"]
        assert os.stat(md / "new" / "2.M1P1.host,S=999,W=1001").st_size == len(data)
        mount.remount()


def test_name_too_long(mount):
    md = mount.maildir()
    name = "n" * 256
    assert oserror(write_file, md / "cur" / name, b"x") == errno.ENAMETOOLONG
    assert oserror(os.mkdir, mount.mnt / ("." + "d" * 255)) == errno.ENAMETOOLONG
    write_file(md / "tmp" / "ok", b"x")
    assert oserror(os.rename, md / "tmp" / "ok", md / "cur" / name) == errno.ENAMETOOLONG
    assert oserror(os.link, md / "tmp" / "ok", md / "cur" / name) == errno.ENAMETOOLONG
    assert oserror(os.stat, md / "cur" / name) == errno.ENAMETOOLONG
    assert os.listdir(md / "cur") == []
    assert os.listdir(md / "tmp") == ["ok"]


# --- 3. sizes and message mtimes ----------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 65537, 1 << 20, 5 << 20])
def test_size_is_exact(mount, size):
    md = mount.maildir()
    data = rand_bytes(size)
    p = deliver(md, "m", data, "cur")
    assert os.stat(p).st_size == size
    with open(p, "rb") as f:
        assert os.fstat(f.fileno()).st_size == size
        assert f.read() == data
    mount.remount()
    assert os.stat(p).st_size == size
    assert read_file(p) == data
    assert os.stat(p).st_blocks * 512 >= size


def test_message_mtime(mount):
    md, other = mount.maildir(), mount.maildir(".Other")
    before = time.time()
    write_file(md / "tmp" / "a", b"a\n", fsync=True)
    a_mtime = os.stat(md / "tmp" / "a").st_mtime_ns
    assert before - 1 <= a_mtime / 1e9 <= time.time() + 1
    os.rename(md / "tmp" / "a", md / "cur" / "a:2,")
    assert os.stat(md / "cur" / "a:2,").st_mtime_ns == a_mtime

    # mbsync/Dovecot: utime() to INTERNALDATE after close, then rename.
    internal = 1234567890_123456789
    write_file(md / "tmp" / "b", b"b\n", fsync=True)
    os.utime(md / "tmp" / "b", ns=(internal, internal))
    assert os.stat(md / "tmp" / "b").st_mtime_ns == internal
    os.rename(md / "tmp" / "b", md / "cur" / "b:2,")
    p = md / "cur" / "b:2,"
    ino = os.stat(p).st_ino
    for op in ("flag", "flag2", "link", "move"):
        if op == "flag":
            os.rename(p, md / "cur" / "b:2,S")
            p = md / "cur" / "b:2,S"
        elif op == "flag2":
            os.rename(p, md / "new" / "b:2,FS")
            p = md / "new" / "b:2,FS"
        elif op == "link":
            os.link(p, md / "cur" / "b-link:2,S")
        else:
            os.rename(p, other / "cur" / "b:2,FS")
            p = other / "cur" / "b:2,FS"
        st = os.stat(p)
        assert (st.st_mtime_ns, st.st_ino) == (internal, ino), op
    mount.remount()
    assert os.stat(p).st_mtime_ns == internal
    assert os.stat(md / "cur" / "b-link:2,S").st_mtime_ns == internal
    assert os.stat(md / "cur" / "a:2,").st_mtime_ns == a_mtime
    for entry in os.scandir(md / "cur"):
        assert entry.stat().st_mtime > 1e9, entry.name


def test_message_mtime_survives_remount_exactly(mount):
    md = mount.maildir()
    write_file(md / "tmp" / "a", b"a\n")
    st = os.stat(md / "tmp" / "a")
    mount.remount()
    assert os.stat(md / "tmp" / "a").st_mtime_ns == st.st_mtime_ns
    assert abs(st.st_mtime - time.time()) < 5


# --- 4. directory mtimes --------------------------------------------------------

def test_dir_mtime_strictly_increases(mount):
    md = mount.maildir()
    cur, new, tmp = md / "cur", md / "new", md / "tmp"

    def mt(d):
        return os.stat(d).st_mtime_ns

    last = {d: mt(d) for d in (cur, new)}

    def changed(*dirs):
        for d in (cur, new):
            now = mt(d)
            if d in dirs:
                assert now > last[d], (d, now, last[d])
            else:
                assert now == last[d], (d, now, last[d])
            last[d] = now

    for i in range(20):  # back to back: several inside one millisecond
        write_file(tmp / f"m{i}", b"x")
        changed()
        os.rename(tmp / f"m{i}", new / f"m{i}")
        changed(new)
        os.rename(new / f"m{i}", cur / f"m{i}:2,")
        changed(new, cur)
        os.rename(cur / f"m{i}:2,", cur / f"m{i}:2,S")
        changed(cur)
        os.link(cur / f"m{i}:2,S", new / f"l{i}")
        changed(new)
        os.unlink(new / f"l{i}")
        changed(new)
        write_file(cur / f"d{i}", b"y")
        changed(cur)
        os.mknod(new / f"k{i}", stat.S_IFREG | 0o600)
        changed(new)
        os.unlink(cur / f"d{i}")
        changed(cur)
    # ... and they survive a remount unchanged.
    mount.remount()
    assert (mt(cur), mt(new)) == (last[cur], last[new])


def test_dir_mtime_is_not_now_when_unchanged(mount):
    md = mount.maildir()
    deliver(md, "m", b"x", "new")
    a = os.stat(md / "new").st_mtime_ns, os.stat(md / "cur").st_mtime_ns
    time.sleep(1.1)
    b = os.stat(md / "new").st_mtime_ns, os.stat(md / "cur").st_mtime_ns
    assert a == b
    assert b[0] < time.time_ns() - 10**9  # mbsync would not spin
    with open(md / "new" / "m", "rb") as f:  # reading is no change either
        f.read()
    os.listdir(md / "new")
    assert os.stat(md / "new").st_mtime_ns == a[0]


# --- 5. unlink while open --------------------------------------------------------

def test_unlinked_open_message_stays_readable(mount):
    md = mount.maildir()
    data = rand_bytes(300_000)
    p = deliver(md, "m:2,S", data, "cur")
    ino = os.stat(p).st_ino
    fd = os.open(p, os.O_RDONLY)
    try:
        assert os.read(fd, 10) == data[:10]
        os.unlink(p)
        assert os.listdir(md / "cur") == []
        st = os.fstat(fd)
        assert (st.st_ino, st.st_size, st.st_nlink) == (ino, len(data), 0)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # ask the daemon
        assert os.pread(fd, len(data) + 10, 0) == data
        assert os.pread(fd, 100, 200_000) == data[200_000:200_100]
    finally:
        os.close(fd)
    assert os.listdir(md / "cur") == []
    assert not os.path.exists(p)
    mount.remount()
    assert os.listdir(md / "cur") == []
    assert not os.path.exists(p)


def test_unlink_message_being_written(mount):
    md = mount.maildir()
    a, b = rand_bytes(10000), rand_bytes(10000)
    fd = os.open(md / "tmp" / "m", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, a)
        os.unlink(md / "tmp" / "m")
        os.write(fd, b)
        assert os.fstat(fd).st_size == len(a + b)
        assert os.pread(fd, 30000, 0) == a + b
    finally:
        os.close(fd)
    assert os.listdir(md / "tmp") == []
    deliver(md, "after", b"after\n")
    mount.remount()
    assert os.listdir(md / "tmp") == [] and os.listdir(md / "new") == ["after"]
    assert read_file(md / "new" / "after") == b"after\n"


def test_unlinked_open_plain_file_stays_readable(mount):
    data = rand_bytes(50_000)
    p = mount.mnt / ".mbsyncstate"
    write_file(p, data)
    nfiles = len(files_in(mount.store))
    fd = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        assert os.pread(fd, len(data), 0) == data
        os.pwrite(fd, b"ZZ", 10)
        assert os.pread(fd, 12, 0) == data[:10] + b"ZZ"
    finally:
        os.close(fd)
    assert wait_for(lambda: len(files_in(mount.store)) == nfiles - 1)
    mount.remount()
    assert not os.path.exists(p)


# --- 6. racing renames -------------------------------------------------------------

def test_racing_flag_renames(mount):
    md = mount.maildir()
    cur = md / "cur"
    rounds = 200
    barrier = threading.Barrier(2)
    results = [[None] * rounds, [None] * rounds]

    def racer(k, flag):
        for r in range(rounds):
            barrier.wait()
            try:
                os.rename(cur / f"a{r}:2,", cur / f"a{r}:2,{flag}")
                results[k][r] = 0
            except OSError as e:
                results[k][r] = e.errno
            barrier.wait()

    datas = [b"msg %d\n" % r + rand_bytes(200) for r in range(rounds)]
    for r in range(rounds):
        write_file(cur / f"a{r}:2,", datas[r])
    threads = [threading.Thread(target=racer, args=(0, "S")),
               threading.Thread(target=racer, args=(1, "F"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = os.listdir(cur)
    assert len(names) == rounds
    for r in range(rounds):
        outcome = sorted((results[0][r], results[1][r]))
        assert outcome == [0, errno.ENOENT], (r, outcome)
        winner = "S" if results[0][r] == 0 else "F"
        left = [n for n in names if n.startswith(f"a{r}:")]
        assert left == [f"a{r}:2,{winner}"]
        assert read_file(cur / left[0]) == datas[r]


# --- 7. backend failures are EIO ----------------------------------------------------

def spread_messages(m, count=24):
    """Messages of 1-3 KiB in cur/, with rotate_size=4096: ~2 per m.N."""
    md = m.maildir()
    msgs = {}
    for i in range(count):
        data = b"Subject: %d\n\n" % i + rand_bytes(1000 + 80 * i)
        msgs[f"{i}.host:2,S"] = data
        deliver(md, f"{i}.host:2,S", data, "cur")
    return md, msgs


def locate(store, msgs):
    """{name: (m.N, body offset)} by searching the (unique) bytes."""
    where = {}
    for fname, content in storage_files(store).items():
        for name, data in msgs.items():
            off = content.find(data)
            if off >= 0:
                where[name] = (fname, off)
    assert sorted(where) == sorted(msgs)
    return where


def test_missing_or_corrupt_mfile_is_eio(make_mount):
    m = make_mount(options=["-o", "rotate_size=4096"])
    md, msgs = spread_messages(m)
    m.unmount()
    where = locate(m.store, msgs)
    by_file = Counter(f for f, _ in where.values())
    assert len(by_file) >= 6, by_file  # the messages are spread out
    files = sorted(by_file, key=lambda f: int(f[2:]))
    gone, cut, hurt = files[0], files[2], files[4]
    os.unlink(m.store / "storage" / gone)
    # cut: the file ends inside the body of its last message.
    last_in_cut = max((off, n) for n, (f, off) in where.items() if f == cut)[1]
    off = where[last_in_cut][1]
    os.truncate(m.store / "storage" / cut, off + len(msgs[last_in_cut]) // 2)
    # hurt: one message's 30-byte dbox header is overwritten.
    victim = min((off, n) for n, (f, off) in where.items() if f == hurt)[1]
    with open(m.store / "storage" / hurt, "r+b") as f:
        f.seek(where[victim][1] - 30)
        f.write(b"XX")
    bad = {n for n, (f, _) in where.items() if f == gone}
    bad |= {last_in_cut, victim}
    m.mount()

    assert sorted(os.listdir(md / "cur")) == sorted(msgs)
    assert sorted(e.name for e in os.scandir(md / "cur")) == sorted(msgs)
    for name, data in msgs.items():
        p = md / "cur" / name
        assert os.stat(p).st_size == len(data)
        if name in bad:
            assert oserror(read_file, p) == errno.EIO, name
        else:
            assert read_file(p) == data, name
    assert len(bad) >= 4 and len(msgs) - len(bad) >= 16
    # New mail still goes in and reads back.
    assert read_file(deliver(md, "new.host", b"fresh\n", "new")) == b"fresh\n"


# --- 8. rename ------------------------------------------------------------------------

def test_rename_across_folders_replaces_target(mount):
    a, b = mount.maildir(".A"), mount.maildir(".B")
    src_data, old_data = rand_bytes(5000), rand_bytes(7000)
    deliver(a, "m:2,S", src_data, "cur")
    deliver(b, "m:2,S", old_data, "cur")
    os.utime(a / "cur" / "m:2,S", ns=(1_500_000_000_000000001,) * 2)
    src = os.stat(a / "cur" / "m:2,S")
    old = os.stat(b / "cur" / "m:2,S")
    assert src.st_ino != old.st_ino
    fd = os.open(b / "cur" / "m:2,S", os.O_RDONLY)
    try:
        os.rename(a / "cur" / "m:2,S", b / "cur" / "m:2,S")
        st = os.stat(b / "cur" / "m:2,S")
        assert (st.st_ino, st.st_size, st.st_mtime_ns, st.st_nlink) == \
            (src.st_ino, len(src_data), 1_500_000_000_000000001, 1)
        assert read_file(b / "cur" / "m:2,S") == src_data
        assert os.listdir(a / "cur") == [] and os.listdir(b / "cur") == ["m:2,S"]
        assert os.fstat(fd).st_nlink == 0  # the old target lost its last name
        assert os.pread(fd, len(old_data), 0) == old_data
    finally:
        os.close(fd)
    mount.remount()
    st = os.stat(b / "cur" / "m:2,S")
    assert (st.st_ino, st.st_mtime_ns) == (src.st_ino, 1_500_000_000_000000001)
    assert read_file(b / "cur" / "m:2,S") == src_data
    assert os.listdir(a / "cur") == []


def test_rename_replaces_hard_link_target(mount):
    md = mount.maildir()
    deliver(md, "x", b"x", "cur")
    os.link(md / "cur" / "x", md / "cur" / "y")
    deliver(md, "z", b"zz", "cur")
    os.rename(md / "cur" / "z", md / "cur" / "x")
    assert os.stat(md / "cur" / "y").st_nlink == 1
    assert read_file(md / "cur" / "y") == b"x"
    assert read_file(md / "cur" / "x") == b"zz"
    # rename of one name of an inode over another of the same: no-op.
    os.link(md / "cur" / "x", md / "cur" / "w")
    os.rename(md / "cur" / "w", md / "cur" / "x")
    assert sorted(os.listdir(md / "cur")) == ["w", "x", "y"]


def test_rename_folders(mount):
    a = mount.maildir(".A")
    mount.maildir(".A.Sub")
    write_file(a / "maildirfolder", b"")
    data = rand_bytes(2000)
    p = deliver(a, "m:2,S", data, "cur")
    st = os.stat(p)
    root_nlink = os.stat(mount.mnt).st_nlink
    inbox = ["cur", "new", "tmp"]
    os.rename(mount.mnt / ".A", mount.mnt / ".C")
    assert sorted(os.listdir(mount.mnt)) == [".A.Sub", ".C"] + inbox
    assert sorted(os.listdir(mount.mnt / ".C")) == ["cur", "maildirfolder", "new", "tmp"]
    q = mount.mnt / ".C" / "cur" / "m:2,S"
    assert (os.stat(q).st_ino, os.stat(q).st_mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert read_file(q) == data
    assert os.stat(mount.mnt).st_nlink == root_nlink
    # Into its own subdirectory: EINVAL.
    assert oserror(os.rename, mount.mnt / ".C", mount.mnt / ".C" / "cur" / "x") == errno.EINVAL
    # Over a non-empty directory: ENOTEMPTY; over an empty one: replaced.
    assert oserror(os.rename, mount.mnt / ".A.Sub", mount.mnt / ".C") in (errno.ENOTEMPTY, errno.EEXIST)
    os.mkdir(mount.mnt / ".Empty")
    os.rename(mount.mnt / ".C", mount.mnt / ".Empty")
    assert sorted(os.listdir(mount.mnt)) == [".A.Sub", ".Empty"] + inbox
    assert read_file(mount.mnt / ".Empty" / "cur" / "m:2,S") == data
    # Nested ("verbatim") move: a folder below another.
    os.rename(mount.mnt / ".A.Sub", mount.mnt / ".Empty" / "Sub")
    assert sorted(os.listdir(mount.mnt / ".Empty" / "Sub")) == ["cur", "new", "tmp"]
    assert os.stat(mount.mnt).st_nlink == root_nlink - 1
    assert os.stat(mount.mnt / ".Empty").st_nlink == 2 + 4
    # rmdir of non-empty directories.
    assert oserror(os.rmdir, mount.mnt / ".Empty") == errno.ENOTEMPTY
    assert oserror(os.rmdir, mount.mnt / ".Empty" / "cur") == errno.ENOTEMPTY
    # A directory over a file and a file over a directory.
    assert oserror(os.rename, mount.mnt / ".Empty" / "Sub",
                   mount.mnt / ".Empty" / "cur" / "m:2,S") == errno.ENOTDIR
    assert oserror(os.rename, mount.mnt / ".Empty" / "cur" / "m:2,S",
                   mount.mnt / ".Empty" / "Sub") == errno.EISDIR
    mount.remount()
    assert sorted(os.listdir(mount.mnt)) == [".Empty"] + inbox
    assert read_file(mount.mnt / ".Empty" / "cur" / "m:2,S") == data
    assert os.stat(mount.mnt / ".Empty" / "cur" / "m:2,S").st_ino == st.st_ino


def renameat2(old, new, flags):
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD = -100
    if libc.renameat2(AT_FDCWD, bytes(old), AT_FDCWD, bytes(new), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def test_renameat2_noreplace_and_exchange(mount):
    a, b = mount.maildir(".A"), mount.maildir(".B")
    da, db = rand_bytes(3000), rand_bytes(4000)
    pa, pb = deliver(a, "x:2,S", da, "cur"), deliver(b, "y:2,", db, "new")
    ia, ib = os.stat(pa).st_ino, os.stat(pb).st_ino
    assert oserror(renameat2, pa, pb, 1) == errno.EEXIST  # RENAME_NOREPLACE
    assert read_file(pb) == db
    renameat2(pa, pb, 2)  # RENAME_EXCHANGE
    assert (os.stat(pa).st_ino, os.stat(pb).st_ino) == (ib, ia)
    assert (read_file(pa), read_file(pb)) == (db, da)
    renameat2(pa, a / "cur" / "z:2,S", 1)
    assert os.listdir(a / "cur") == ["z:2,S"]
    mount.remount()
    assert read_file(a / "cur" / "z:2,S") == db and read_file(pb) == da


# --- 9. plain files ------------------------------------------------------------------------

def check_plain_file_ops(path, tmpdir_for_new):
    """Random writes, truncate, rename-over, append; returns final bytes."""
    model = bytearray(rand_bytes(20000))
    write_file(path, bytes(model), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    fd = os.open(path, os.O_RDWR)
    try:
        for _ in range(50):
            off = RNG.randrange(0, 30000)
            chunk = rand_bytes(RNG.randrange(1, 3000))
            os.pwrite(fd, chunk, off)
            if off > len(model):
                model.extend(b"\0" * (off - len(model)))
            model[off:off + len(chunk)] = chunk
        assert os.pread(fd, 100000, 0) == bytes(model)
        os.ftruncate(fd, 12345)
        del model[12345:]
        assert os.fstat(fd).st_size == 12345
    finally:
        os.close(fd)
    os.truncate(path, 15000)  # grow: zeros
    model.extend(b"\0" * (15000 - len(model)))
    assert os.stat(path).st_size == 15000
    assert read_file(path) == bytes(model)
    # mtime follows writes (Dovecot and mbsync compare it) and utime.
    os.utime(path, ns=(1_000_000_000_000000007,) * 2)
    assert os.stat(path).st_mtime_ns == 1_000_000_000_000000007
    with open(path, "r+b") as f:
        f.write(b"w")
    model[0:1] = b"w"
    assert abs(os.stat(path).st_mtime - time.time()) < 5
    os.truncate(path, 100)
    del model[100:]
    assert read_file(path) == bytes(model)
    # rename-over: write .new, rename over the state (mbsync, Dovecot).
    new = tmpdir_for_new / (path.name + ".new")
    newdata = rand_bytes(4321)
    write_file(new, newdata)
    new_ino = os.stat(new).st_ino
    os.rename(new, path)
    assert os.stat(path).st_ino == new_ino
    assert read_file(path) == newdata
    # append mode
    with open(path, "ab") as f:
        f.write(b"appended-1\n")
    with open(path, "ab") as f:
        f.write(b"appended-2\n")
    final = newdata + b"appended-1\nappended-2\n"
    assert read_file(path) == final
    return final


def test_plain_files(mount):
    md = mount.maildir()
    a = mount.maildir(".A")
    os.makedirs(mount.mnt / ".notmuch" / "xapian")
    paths = [mount.mnt / ".mbsyncstate", a / "dovecot-uidlist",
             mount.mnt / ".notmuch" / "xapian" / "x", md / "cur" / ".hidden",
             mount.mnt / "subscriptions"]
    expect = {}
    for p in paths:
        expect[p] = check_plain_file_ops(p, p.parent)
    # Plain files are ordinary files in STORE/files, one each; nothing
    # reached storage/ (no message was written).
    assert wait_for(lambda: len(files_in(mount.store)) == len(paths))
    assert os.listdir(md / "cur") == [".hidden"]
    mount.remount()
    for p, data in expect.items():
        assert read_file(p) == data, p
    assert len(files_in(mount.store)) == len(paths)


def test_plain_file_mmap(mount):
    a = mount.maildir(".A")
    p = a / "dovecot.index"
    data = bytearray(rand_bytes(3 * 4096 + 100))
    write_file(p, bytes(data))
    with open(p, "r+b") as f:
        with mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED,
                       mmap.PROT_READ | mmap.PROT_WRITE) as mm:
            assert mm[:] == bytes(data)
            for off in (0, 4095, 5000, 12300):
                mm[off:off + 4] = b"MMAP"
                data[off:off + 4] = b"MMAP"
            mm.flush()
    assert read_file(p) == bytes(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert os.pread(fd, len(data), 0) == bytes(data)
    finally:
        os.close(fd)
    mount.remount()
    assert read_file(p) == bytes(data)


LOCK_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    if sys.argv[2] == "lockf":
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    else:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(1)
sys.exit(0)
"""


def lock_probe(path, kind):
    return subprocess.run([sys.executable, "-c", LOCK_PROBE, str(path), kind],
                          timeout=30).returncode


def test_plain_file_locks(mount):
    mount.maildir()
    p = mount.mnt / ".mbsyncstate.lock"
    write_file(p, b"")
    fd = os.open(p, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        assert lock_probe(p, "lockf") == 1
        fcntl.lockf(fd, fcntl.LOCK_UN)
        assert lock_probe(p, "lockf") == 0
        fcntl.flock(fd, fcntl.LOCK_EX)
        fd2 = os.open(p, os.O_RDWR)
        try:
            assert oserror(fcntl.flock, fd2, fcntl.LOCK_EX | fcntl.LOCK_NB) \
                in (errno.EWOULDBLOCK, errno.EAGAIN)
            assert lock_probe(p, "flock") == 1
            fcntl.flock(fd, fcntl.LOCK_UN)
            fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd2, fcntl.LOCK_UN)
        finally:
            os.close(fd2)
        assert lock_probe(p, "flock") == 0
    finally:
        os.close(fd)


# --- 10. rsync temporaries become messages --------------------------------------------

def test_rsync_temporary_becomes_message(mount):
    md = mount.maildir()
    base = len(files_in(mount.store))
    msgs = {}
    for i in range(5):
        data = rand_bytes(20000 + i)
        tmpname = md / "cur" / f".{i}.host:2,S.Xa{i}b9Z"
        write_file(tmpname, data)
        os.utime(tmpname, ns=(1_600_000_000_000000000 + i,) * 2)  # rsync -t
        msgs[f"{i}.host:2,S"] = data
    assert wait_for(lambda: len(files_in(mount.store)) == base + 5)
    assert files_bytes(mount.store) >= sum(map(len, msgs.values()))
    inos = {}
    for i, name in enumerate(msgs):
        tmpname = md / "cur" / f".{i}.host:2,S.Xa{i}b9Z"
        inos[name] = os.stat(tmpname).st_ino
        os.rename(tmpname, md / "cur" / name)  # right after close
    assert sorted(os.listdir(md / "cur")) == sorted(msgs)
    for i, (name, data) in enumerate(msgs.items()):
        st = os.stat(md / "cur" / name)
        assert (st.st_ino, st.st_size, st.st_mtime_ns) == \
            (inos[name], len(data), 1_600_000_000_000000000 + i)
        assert read_file(md / "cur" / name) == data
    # The bytes moved into storage/m.N: no backing files left.
    assert wait_for(lambda: len(files_in(mount.store)) == base), files_in(mount.store)
    assert files_bytes(mount.store) == 0
    # rsync updating an existing message: the temporary replaces it.
    name0 = next(iter(msgs))
    old_ino = inos[name0]
    msgs[name0] = rand_bytes(9000)
    write_file(md / "cur" / ".upd.XXXXXX", msgs[name0])
    new_ino = os.stat(md / "cur" / ".upd.XXXXXX").st_ino
    os.rename(md / "cur" / ".upd.XXXXXX", md / "cur" / name0)
    assert os.stat(md / "cur" / name0).st_ino == new_ino != old_ino
    assert read_file(md / "cur" / name0) == msgs[name0]
    assert wait_for(lambda: len(files_in(mount.store)) == base), files_in(mount.store)
    mount.remount()
    stored = b"".join(storage_files(mount.store).values())
    for name, data in msgs.items():
        assert read_file(md / "cur" / name) == data
        assert data in stored
    assert len(files_in(mount.store)) == base


def test_open_dot_file_renamed_to_message_converts_at_close(mount):
    md = mount.maildir()
    base = len(files_in(mount.store))
    a, b = rand_bytes(7000), rand_bytes(3000)
    fd = os.open(md / "cur" / ".x.host.Q1w2e3", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, a)
        os.rename(md / "cur" / ".x.host.Q1w2e3", md / "cur" / "x.host:2,S")
        os.write(fd, b)
    finally:
        os.close(fd)
    p = md / "cur" / "x.host:2,S"
    assert read_file(p) == a + b
    assert os.stat(p).st_size == len(a + b)
    assert wait_for(lambda: len(files_in(mount.store)) == base), files_in(mount.store)
    mount.remount()
    assert read_file(p) == a + b
    assert a + b in b"".join(storage_files(mount.store).values())


# --- 11. writing to a committed message -------------------------------------------

def test_write_to_committed_message(mount):
    md, other = mount.maildir(), mount.maildir(".Other")
    data = bytearray(rand_bytes(100_000))
    p = deliver(md, "m:2,S", bytes(data), "cur")
    os.link(p, other / "cur" / "m:2,S")
    os.utime(p, ns=(1_400_000_000_000000000,) * 2)
    ino = os.stat(p).st_ino
    # Another reader keeps the old handle open across the change.
    with open(other / "cur" / "m:2,S", "rb") as reader:
        assert reader.read(10) == bytes(data[:10])
        fd = os.open(p, os.O_RDWR)
        try:
            os.pwrite(fd, b"HELLO", 50_000)
        finally:
            os.close(fd)
    data[50_000:50_005] = b"HELLO"
    for q in (p, other / "cur" / "m:2,S"):
        st = os.stat(q)
        assert (st.st_ino, st.st_size, st.st_nlink) == (ino, len(data), 2)
        assert read_file(q) == bytes(data)
    write_file(p, b"replaced\n", os.O_WRONLY | os.O_TRUNC)
    for q in (p, other / "cur" / "m:2,S"):
        assert os.stat(q).st_ino == ino
        assert os.stat(q).st_size == 9
        assert read_file(q) == b"replaced\n"
    mount.remount()
    for q in (p, other / "cur" / "m:2,S"):
        st = os.stat(q)
        assert (st.st_ino, st.st_size, st.st_nlink) == (ino, 9, 2)
        assert read_file(q) == b"replaced\n"
    # Truncate by path too (shrink, then grow with zeros), and append.
    os.truncate(p, 3)
    assert read_file(other / "cur" / "m:2,S") == b"rep"
    os.truncate(p, 10)
    assert read_file(other / "cur" / "m:2,S") == b"rep" + b"\0" * 7
    with open(p, "ab") as f:
        f.write(b"tail")
    expect = b"rep" + b"\0" * 7 + b"tail"
    assert os.stat(other / "cur" / "m:2,S").st_size == len(expect)
    mount.remount()
    assert read_file(p) == expect
    assert os.stat(p).st_ino == ino


def test_mmap_write_to_message(mount):
    md = mount.maildir()
    data = bytearray(rand_bytes(20000))
    p = deliver(md, "m:2,S", bytes(data), "cur")
    ino = os.stat(p).st_ino
    fd = os.open(p, os.O_RDWR)
    mm = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)  # the mapping outlives the descriptor
    try:
        mm[100:104] = b"MMAP"
        mm[19996:20000] = b"TAIL"
    finally:
        mm.close()
    data[100:104], data[19996:20000] = b"MMAP", b"TAIL"
    assert read_file(p) == bytes(data)
    mount.remount()
    assert read_file(p) == bytes(data)
    assert os.stat(p).st_ino == ino


def test_open_readers_see_writes_to_message(mount):
    """A handle opened before a write reads the new bytes (POSIX), also
    once the page cache is gone: it must not keep reading the old copy."""
    md = mount.maildir()
    data = bytearray(rand_bytes(200_000))
    p = deliver(md, "m:2,S", bytes(data), "cur")
    old = os.open(p, os.O_RDONLY)
    try:
        assert os.pread(old, 10, 0) == bytes(data[:10])
        fd = os.open(p, os.O_RDWR)
        try:
            os.pwrite(fd, b"HELLO", 150_000)
            data[150_000:150_005] = b"HELLO"
            os.posix_fadvise(old, 0, 0, os.POSIX_FADV_DONTNEED)
            # while the writer is still open ...
            assert os.pread(old, 5, 150_000) == b"HELLO"
        finally:
            os.close(fd)
        # ... and after it closed.
        os.posix_fadvise(old, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.pread(old, len(data), 0) == bytes(data)
        write_file(p, b"short\n", os.O_WRONLY | os.O_TRUNC)
        os.posix_fadvise(old, 0, 0, os.POSIX_FADV_DONTNEED)
        assert os.fstat(old).st_size == 6
        assert os.pread(old, 100, 0) == b"short\n"
    finally:
        os.close(old)


# --- 12. concurrency and big directories ------------------------------------------

@pytest.mark.parametrize("options", [[], ["-o", "rotate_size=4096"]],
                         ids=["default", "small-rotate"])
def test_concurrent_writers(make_mount, options):
    mount = make_mount(options=options)
    md = mount.maildir()
    nthreads, per = 4, 100
    errors = []

    def writer(t):
        try:
            for i in range(per):
                name = f"{i}.T{t}.host"
                data = b"From: %d/%d\n\n" % (t, i) + rand_bytes(100 + (t * per + i) % 3000)
                write_file(md / "tmp" / name, data, fsync=True)
                os.rename(md / "tmp" / name, md / "new" / name)
                expected[name] = data
                if i % 25 == 0:  # notmuch insert: fsync(new/)
                    dfd = os.open(md / "new", os.O_RDONLY | os.O_DIRECTORY)
                    os.fsync(dfd)
                    os.close(dfd)
        except Exception as e:  # reported below
            errors.append(e)

    expected = {}
    threads = [threading.Thread(target=writer, args=(t,)) for t in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for _ in range(2):
        names = os.listdir(md / "new")
        assert len(names) == nthreads * per
        assert sorted(names) == sorted(expected)
        assert os.listdir(md / "tmp") == []
        for name, data in expected.items():
            assert read_file(md / "new" / name) == data
        mount.remount()


def test_big_directory_listing_during_renames(mount):
    md = mount.maildir()
    cur = md / "cur"
    n = 5000
    for i in range(n):
        os.mknod(cur / f"{i}.host:2,", stat.S_IFREG | 0o600)
    bases = {f"{i}.host" for i in range(n)}
    for names in (os.listdir(cur), [e.name for e in os.scandir(cur)]):
        assert len(names) == n and {x.split(":")[0] for x in names} == bases

    stop = threading.Event()
    renamed = [0]

    def renamer():
        flags = {i: "" for i in range(n)}
        rng = random.Random(1)
        while not stop.is_set():
            i = rng.randrange(n)
            new = "S" if flags[i] == "" else ""
            os.rename(cur / f"{i}.host:2,{flags[i]}", cur / f"{i}.host:2,{new}")
            flags[i] = new
            renamed[0] += 1

    t = threading.Thread(target=renamer)
    t.start()
    listings, overlapped = [], 0
    deadline = time.monotonic() + 20
    try:
        while len(listings) < 6 or (overlapped < 6 and time.monotonic() < deadline):
            before = renamed[0]
            if len(listings) % 2:
                listings.append([e.name for e in os.scandir(cur)])
            else:
                listings.append(os.listdir(cur))
            overlapped += renamed[0] - before >= 5
    finally:
        stop.set()
        t.join()
    # The renames really ran during the listings.
    assert overlapped >= 6, (overlapped, len(listings), renamed[0])
    for names in listings:
        counts = Counter(x.split(":")[0] for x in names)
        assert len(names) == n
        assert set(counts) == bases
        assert max(counts.values()) == 1


# --- 13. statfs, mknod, mkdir, empty store ---------------------------------------------

def test_statfs_matches_backing_fs(mount):
    ours, backing = os.statvfs(mount.mnt), os.statvfs(mount.store)
    assert ours.f_blocks > 0 and ours.f_bavail > 0
    assert ours.f_blocks * ours.f_frsize == backing.f_blocks * backing.f_frsize
    assert abs(ours.f_bavail * ours.f_frsize - backing.f_bavail * backing.f_frsize) \
        < max(0.02 * backing.f_blocks * backing.f_frsize, 64 << 20)
    assert ours.f_namemax == 255


def test_mknod_makes_empty_message(mount):
    md = mount.maildir()
    base = files_in(mount.store)
    os.mknod(md / "new" / "1.host", stat.S_IFREG | 0o640)
    st = os.stat(md / "new" / "1.host")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 0 and st.st_mtime > 0
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert read_file(md / "new" / "1.host") == b""
    assert os.listdir(md / "new") == ["1.host"]
    assert files_in(mount.store) == base  # a message, not a plain file
    # A fifo in new/ is a fifo (as on ext4), not a message nor a plain file.
    os.mknod(md / "new" / "fifo", stat.S_IFIFO | 0o600)
    assert stat.S_ISFIFO(os.lstat(md / "new" / "fifo").st_mode)
    assert files_in(mount.store) == base
    os.unlink(md / "new" / "fifo")
    assert oserror(os.mknod, md / "new" / "1.host", stat.S_IFREG | 0o600) == errno.EEXIST
    os.mknod(mount.mnt / "dovecot-uidlist.lock", stat.S_IFREG | 0o600)  # plain
    assert read_file(mount.mnt / "dovecot-uidlist.lock") == b""
    assert wait_for(lambda: len(files_in(mount.store)) == len(base) + 1)
    mount.remount()
    assert os.listdir(md / "new") == ["1.host"]
    assert read_file(md / "new" / "1.host") == b""
    assert os.path.isfile(mount.mnt / "dovecot-uidlist.lock")


def test_mkdir_rmdir_folders(mount):
    root = mount.mnt
    nlink = os.stat(root).st_nlink
    mount.maildir(".Work")
    mount.maildir(".Work.Sub")
    mount.maildir("nested", "deep")
    assert os.stat(root).st_nlink == nlink + 3
    assert os.stat(root / ".Work").st_nlink == 2 + 3
    assert sorted(os.listdir(root / "nested")) == ["deep"]
    assert oserror(os.mkdir, root / ".Work") == errno.EEXIST
    for sub in ("cur", "new", "tmp"):
        os.rmdir(root / ".Work.Sub" / sub)
    os.rmdir(root / ".Work.Sub")
    assert os.stat(root).st_nlink == nlink + 2
    assert oserror(os.rmdir, root / ".Work.Sub") == errno.ENOENT
    assert oserror(os.rmdir, root / "nested") == errno.ENOTEMPTY
    write_file(root / ".Work" / "maildirfolder", b"")
    assert oserror(os.rmdir, root / ".Work" / "maildirfolder") == errno.ENOTDIR
    mount.remount()
    assert ".Work.Sub" not in os.listdir(root)
    assert {".Work", "nested"} <= set(os.listdir(root))
    assert os.stat(root).st_nlink == nlink + 2


def test_empty_store_is_empty_inbox(make_mount, tmp_path):
    """docs/design.md section 1: the root is INBOX (cur/ new/ tmp/)."""
    m = make_mount(store=tmp_path / "fresh", mnt=tmp_path / "fmnt")
    names = sorted(os.listdir(m.mnt))
    assert names == ["cur", "new", "tmp"]
    for sub in names:
        assert os.path.isdir(m.mnt / sub) and os.listdir(m.mnt / sub) == []
    assert os.stat(m.mnt).st_nlink == 5


# --- 14. refusing stores -----------------------------------------------------------------

def test_refuse_store_already_mounted(mount, tmp_path):
    deliver(mount.maildir(), "m", b"m\n")
    other = tmp_path / "mnt2"
    other.mkdir()
    try:
        r = subprocess.run([str(DBOXFS), str(mount.store), str(other)],
                           capture_output=True, timeout=30)
        assert r.returncode != 0
        assert not is_mounted(other)
        assert r.stderr.strip() != b""  # says why
    finally:
        unmount(other)
    assert read_file(mount.mnt / "new" / "m") == b"m\n"


def snapshot(d):
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, d)] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                          open(p, "rb").read() if os.path.isfile(p) else None)
    return out


def test_refuse_non_store_directory(tmp_path):
    notstore = tmp_path / "Maildir"
    (notstore / "cur").mkdir(parents=True)
    (notstore / "cur" / "1.host:2,S").write_bytes(b"real mail\n")
    (notstore / "dovecot-uidlist").write_bytes(b"3 V1 N2\n")
    before = snapshot(notstore)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = subprocess.run([str(DBOXFS), str(notstore), str(mnt)],
                           capture_output=True, timeout=30)
        assert r.returncode != 0
        assert not is_mounted(mnt)
    finally:
        unmount(mnt)
    assert snapshot(notstore) == before
    assert os.listdir(mnt) == []
