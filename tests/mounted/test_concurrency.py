"""Concurrency as on a desktop: separate processes working on one folder.

- One process lists cur/ over and over (os.listdir, and `ls -f` as a
  program would) while another renames the messages in it (flag changes,
  as a MUA syncing): every listing shows each message exactly once.  ext4
  does not promise this (a name renamed during readdir may be seen twice or
  not at all), dboxfs does: the listing order is kept across renames.
- Three processes race to rename the same message: two flag changes and a
  move to another folder.  Exactly one wins, the others get ENOENT, and
  the message is there once, with its bytes.  The same race on a native
  maildir gives the same outcome counts.
"""
import ctypes
import errno
import multiprocessing
import os
import platform
import random
import struct
import subprocess
import time
from collections import Counter

import pytest

from conftest import DBOXADM, need_corpora
from maildir_tools import copy_corpus, read_bytes, split_name

CTX = multiprocessing.get_context("fork")
LIBC = ctypes.CDLL(None, use_errno=True)
SYS_GETDENTS64 = 217  # x86_64


def renamer(cur, stop, count):
    """Flip flags of random messages in cur/ until stop is set."""
    rng = random.Random(os.getpid())
    names = {split_name(n)[0]: n for n in os.listdir(cur)}
    bases = sorted(names)
    while not stop.is_set():
        base = rng.choice(bases)
        old = names[base]
        flags = split_name(old)[1]
        new = f"{base}:2,{'' if 'S' in flags else 'FS'}"
        os.rename(os.path.join(cur, old), os.path.join(cur, new))
        names[base] = new
        with count.get_lock():
            count.value += 1


def test_listing_while_another_process_renames(make_mount, tmp_path):
    # The lkml corpus and 3000 more messages, more than one readdir reply
    # holds, so a listing spans many READDIR requests with renames between
    # them.  Imported with dboxadm (faster than delivering through FUSE).
    src = need_corpora() / "notmuch-lkml"
    tree = tmp_path / "tree"
    tree.mkdir()
    folder = copy_corpus(src, tree / ".lkml")
    for i in range(3000):
        (folder / "cur" / f"17000{i:05d}.gen.host:2,").write_bytes(
            b"Subject: %d\n\nx\n" % i)
    subprocess.run([str(DBOXADM), "import", str(tmp_path / "store"), str(tree)],
                   check=True, capture_output=True, timeout=300)
    mount = make_mount(store=tmp_path / "store")
    cur = mount.mnt / ".lkml" / "cur"
    bases = {split_name(n)[0] for n in os.listdir(cur)}
    assert len(bases) == 3000 + len(os.listdir(src / "cur"))

    stop, count = CTX.Event(), CTX.Value("l", 0)
    proc = CTX.Process(target=renamer, args=(str(cur), stop, count))
    proc.start()
    listings, overlapped = 0, 0
    deadline = time.monotonic() + 30
    try:
        while listings < 10 or (overlapped < 8 and time.monotonic() < deadline):
            before = count.value
            if listings % 2:
                r = subprocess.run(["ls", "-f", str(cur)], capture_output=True,
                                   text=True, check=True)
                names = [n for n in r.stdout.split("\n") if n not in ("", ".", "..")]
            else:
                names = os.listdir(cur)
            listings += 1
            overlapped += count.value - before >= 20
            seen = Counter(split_name(n)[0] for n in names)
            assert len(names) == len(bases), (listings, len(names))
            assert set(seen) == bases
            assert max(seen.values()) == 1
    finally:
        stop.set()
        proc.join(30)
    assert proc.exitcode == 0
    # The renames really ran during the listings.
    assert overlapped >= 8, (overlapped, listings, count.value)


def racer(args):
    """Rename each message (by index) to target(i) once the barrier opens;
    returns the errno per message (0 = won)."""
    root, kind, n, barrier = args
    out = []
    for i in range(n):
        src = os.path.join(root, "cur", f"{i}.race.host:2,")
        if kind == "archive":
            dst = os.path.join(root, ".Archive", "cur", f"{i}.race.host:2,S")
        else:
            dst = os.path.join(root, "cur", f"{i}.race.host:2,{kind}")
        barrier.wait()
        try:
            os.rename(src, dst)
            out.append(0)
        except OSError as e:
            out.append(e.errno)
    return out


def race(root, n=200):
    for d in (root, root / ".Archive"):
        for sub in ("cur", "new", "tmp"):
            (d / sub).mkdir(parents=True, exist_ok=True)
    data = {i: b"Subject: race %d\n\n" % i + os.urandom(300) for i in range(n)}
    for i in range(n):
        (root / "cur" / f"{i}.race.host:2,").write_bytes(data[i])
    kinds = ["S", "F", "archive"]
    barrier = CTX.Barrier(len(kinds))
    procs, results = [], CTX.Queue()

    def run(kind):
        results.put((kind, racer((str(root), kind, n, barrier))))

    for kind in kinds:
        p = CTX.Process(target=run, args=(kind,))
        p.start()
        procs.append(p)
    got = dict(results.get(timeout=120) for _ in kinds)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    winners = Counter()
    for i in range(n):
        outcome = sorted(got[k][i] for k in kinds)
        assert outcome == [0, errno.ENOENT, errno.ENOENT], (i, outcome)
        winner = [k for k in kinds if got[k][i] == 0][0]
        winners[winner] += 1
        left = [p for p in list((root / "cur").iterdir()) +
                list((root / ".Archive" / "cur").iterdir())
                if p.name.startswith(f"{i}.race.")]
        assert len(left) == 1, (i, left)
        want = "S" if winner == "archive" else winner
        assert split_name(left[0].name)[1] == want
        assert (left[0].parent.parent == root / ".Archive") == (winner == "archive")
        assert read_bytes(left[0]) == data[i]
    return sum(winners.values())


def test_processes_racing_to_rename_one_message(mount, tmp_path):
    assert race(mount.mnt / "race") == 200
    assert race(tmp_path / "native") == 200
    mount.remount()
    assert len(os.listdir(mount.mnt / "race" / "cur")) + \
        len(os.listdir(mount.mnt / "race" / ".Archive" / "cur")) == 200


def getdents(fd, size):
    """The names one getdents64(2) of at most size bytes returns (os.listdir
    reads a directory whole; these steps need it a piece at a time)."""
    buf = ctypes.create_string_buffer(size)
    n = LIBC.syscall(SYS_GETDENTS64, fd, buf, size)
    if n < 0:
        raise OSError(ctypes.get_errno(), "getdents64")
    names, off, raw = [], 0, buf.raw[:n]
    while off < n:
        reclen = struct.unpack_from("H", raw, off + 16)[0]
        names.append(raw[off + 19:off + reclen].split(b"\0", 1)[0].decode())
        off += reclen
    return names


def listing_across_rename(md):
    """A slow listing L of new/ is under way when X, in what L has read,
    is renamed to cur/; only then does M open new/ and list it, a piece
    first and the rest after L ended.  Returns (M's names, X)."""
    for i in range(600):
        (md / "tmp" / f"m{i:04d}").write_bytes(b"x")
        os.rename(md / "tmp" / f"m{i:04d}", md / "new" / f"m{i:04d}")
    os.listdir(md / "new")
    (md / "tmp" / "z").write_bytes(b"z")
    os.rename(md / "tmp" / "z", md / "new" / "z")
    fd_l = os.open(md / "new", os.O_RDONLY | os.O_DIRECTORY)
    fd_m = -1
    try:
        x = [n for n in getdents(fd_l, 4096) if n.startswith("m")][-1]
        os.rename(md / "new" / x, md / "cur" / (x + ":2,S"))
        fd_m = os.open(md / "new", os.O_RDONLY | os.O_DIRECTORY)
        got = getdents(fd_m, 256)
        while getdents(fd_l, 4096):
            pass
        while more := getdents(fd_m, 4096):
            got += more
        return got, x
    finally:
        os.close(fd_l)
        if fd_m >= 0:
            os.close(fd_m)


def test_listing_opened_after_a_rename_does_not_show_its_old_name(mount, tmp_path):
    """A directory opened after rename() returned lists the new state, on
    ext4 and on the mount.  The kernel's listing cache (cache_readdir)
    broke this: a listing that started while another process was filling
    the cache went on from that cache, filled partly before the rename,
    and listed the old name (helper-70; test_crash's flag actor saw a
    name it had renamed in CI)."""
    if platform.machine() != "x86_64":
        pytest.skip("getdents64's syscall number is x86_64's")
    native = tmp_path / "native"
    for sub in ("cur", "new", "tmp"):
        (native / sub).mkdir(parents=True)
    results = {}
    for where, md in (("native", native), ("dboxfs", mount.maildir())):
        got, x = listing_across_rename(md)
        results[where] = (x in got, len(got) - len(set(got)),
                          sorted(set(got) - {".", ".."}) == sorted(os.listdir(md / "new")))
    assert results["dboxfs"] == results["native"] == (False, 0, True), results
