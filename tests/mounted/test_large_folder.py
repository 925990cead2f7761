"""A large folder: 100,000 messages in one cur/.

The folder is written as a native maildir and put into a store with
`dboxadm import` (much faster than 100,000 deliveries through FUSE), then
listed through the mount: `ls -f`, os.scandir (names, d_ino, d_type) and
libc opendir/readdir/telldir/seekdir through ctypes.  Every name must be
listed exactly once, equal to the native listing's set, and seekdir() to a
position telldir() returned must continue with the same entry as the first
pass did.
"""
import ctypes
import ctypes.util
import os
import random
import stat
import subprocess

import pytest

from conftest import DBOXADM

N = 100_000


class Dirent(ctypes.Structure):
    # struct dirent of glibc on 64-bit Linux (= struct dirent64).
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.opendir.restype = ctypes.c_void_p
libc.opendir.argtypes = [ctypes.c_char_p]
libc.readdir.restype = ctypes.POINTER(Dirent)
libc.readdir.argtypes = [ctypes.c_void_p]
libc.telldir.restype = ctypes.c_long
libc.telldir.argtypes = [ctypes.c_void_p]
libc.seekdir.restype = None
libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
libc.rewinddir.restype = None
libc.rewinddir.argtypes = [ctypes.c_void_p]
libc.closedir.argtypes = [ctypes.c_void_p]


class Dir:
    """A libc DIR* stream."""

    def __init__(self, path):
        self.d = libc.opendir(os.fsencode(path))
        if not self.d:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), path)

    def read(self):
        """(name, d_ino) of the next entry, or None at the end."""
        ctypes.set_errno(0)
        ent = libc.readdir(self.d)
        if not ent:
            assert ctypes.get_errno() == 0, os.strerror(ctypes.get_errno())
            return None
        return ent.contents.d_name, ent.contents.d_ino

    def tell(self):
        return libc.telldir(self.d)

    def seek(self, pos):
        libc.seekdir(self.d, pos)

    def close(self):
        libc.closedir(self.d)


def make_folder(root):
    """A maildir with N small messages in cur/; returns the names."""
    for sub in ("cur", "new", "tmp"):
        os.makedirs(root / sub)
    names = []
    for i in range(N):
        name = f"{1700000000 + i}.M{i}P{i % 97}.host:2,{'S' if i % 3 else 'FS'}"
        with open(root / "cur" / name, "wb") as fp:
            fp.write(b"Subject: %d\n\nmessage %d\n" % (i, i))
        names.append(name)
    return names


def ls_f(path):
    r = subprocess.run(["ls", "-f", str(path)], capture_output=True, check=True)
    return r.stdout.decode("utf-8", "surrogateescape").split("\n")[:-1]


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    base = tmp_path_factory.mktemp("big")
    names = make_folder(base / "maildir")
    subprocess.run([str(DBOXADM), "import", str(base / "store"),
                    str(base / "maildir")], check=True, capture_output=True,
                   timeout=600)
    return base, names


def test_large_folder_listed_once(big, make_mount):
    base, names = big
    m = make_mount(store=base / "store", mnt=base / "mnt")
    cur, native = m.mnt / "cur", base / "maildir" / "cur"
    want = sorted(names)

    # ls -f: unsorted, everything, once.
    got = ls_f(cur)
    assert len(got) == N + 2
    assert sorted(n for n in got if n not in (".", "..")) == want
    assert sorted(ls_f(native)) == sorted(got)

    # os.scandir: names once, d_ino = st_ino, d_type regular file.
    entries = list(os.scandir(cur))
    assert sorted(e.name for e in entries) == want
    inos = {e.inode() for e in entries}
    assert len(inos) == N
    rng = random.Random(5)
    for e in rng.sample(entries, 200):
        assert e.is_file(follow_symlinks=False)
        st = os.lstat(e.path)
        assert e.inode() == st.st_ino and stat.S_ISREG(st.st_mode)

    # readdir with telldir before every entry; then seekdir back to sampled
    # positions: the same entry comes next, and the rest of the stream from
    # there is the rest of the first pass.
    d = Dir(cur)
    try:
        first, pos = [], []
        while True:
            p = d.tell()
            ent = d.read()
            if ent is None:
                break
            pos.append(p)
            first.append(ent)
        assert len(first) == N + 2
        assert sorted(os.fsdecode(n) for n, _ in first
                      if n not in (b".", b"..")) == want
        for k in sorted(rng.sample(range(len(first)), 300)) + [0, len(first) - 1]:
            d.seek(pos[k])
            assert d.read() == first[k], k
        # Continue reading from the middle after a seekdir.
        mid = len(first) // 2
        d.seek(pos[mid])
        rest = []
        while (ent := d.read()) is not None:
            rest.append(ent)
        assert rest == first[mid:]
        # Seeking to the end gives end of stream; rewinddir starts over.
        d.seek(d.tell())
        assert d.read() is None
        libc.rewinddir(d.d)
        assert d.read() == first[0]
    finally:
        d.close()

    # A second mount of the same store lists the same (stable order).
    m.remount()
    d = Dir(cur)
    try:
        again = []
        while (ent := d.read()) is not None:
            again.append(ent)
    finally:
        d.close()
    assert again == first
