"""One file shared by several processes, as Dovecot's imap processes share
dovecot.index.log and dovecot.index (issue 11): under an fcntl write lock
each process fstat()s, mmap()s and touches the last byte, pread()s the
whole file and appends a line at the size it saw (shared_append.py).

On ext4 every pread returns fstat's size, the mapping never faults
(SIGBUS) and the file ends with every line of every process, whole.  The
same steps run in the same test on the mount and on a plain directory of
the test's temporary directory, and must give the same outcome: a plain
file at the root, Dovecot's log name inside a Maildir++ folder, a message
in cur/ (written in place, copy-on-write), and a dot-file in tmp/.
"""
import pytest

import shared_append

WRITEBACK = ["-o", "writeback_cache"]

# (where, how the file is made): every kind of regular file the mount has.
FILES = [
    ("plain", "shared.log"),
    ("folder", ".Work/dovecot.index.log"),
    ("message", "cur/1700000000.M1P1.host:2,S"),
    ("dotfile", "tmp/.dovecot.lock-state"),
]
MODES = ["keep", "reopen", "split"]


def make_file(root, rel):
    path = root / rel
    if rel.startswith(".Work/"):
        for sub in ("cur", "new", "tmp"):
            (root / ".Work" / sub).mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize("options", [[], WRITEBACK], ids=["default", "writeback"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where,rel", FILES, ids=[f[0] for f in FILES])
def test_locked_mmap_pread_append(make_mount, tmp_path, where, rel, mode, options):
    mount = make_mount(options=options)
    native = tmp_path / "native"
    for sub in ("cur", "new", "tmp"):
        (native / sub).mkdir(parents=True)
    rounds = 500 if mode == "keep" else 200
    got = shared_append.run(make_file(mount.mnt, rel), rounds=rounds, mode=mode)
    want = shared_append.run(make_file(native, rel), rounds=rounds, mode=mode)
    assert want == {"signals": [], "short": [], "exit": [],
                    "size": 2 * rounds * shared_append.LINE,
                    "lines": {"A": rounds, "B": rounds}, "torn": 0}
    assert got == want
    # Read back through a fresh descriptor and after a remount: the
    # bytes the processes wrote are what is stored.
    data = (mount.mnt / rel).read_bytes()
    mount.remount()
    assert (mount.mnt / rel).read_bytes() == data
    assert len(data) == want["size"]


@pytest.mark.parametrize("where,rel", FILES, ids=[f[0] for f in FILES])
def test_lockless_reader_with_writeback_cache(make_mount, tmp_path, where, rel):
    """A reader that takes no lock while another process appends, as
    Dovecot reads dovecot.index.log: with -o writeback_cache its fstat
    never promises more than pread gives and its mapping never faults
    (SIGBUS), as on ext4.  Without the option the kernel's FUSE client
    hands fstat the daemon's size before it has taken in the write
    (dboxfs.1, NOTES): most runs of this test then fail."""
    mount = make_mount(options=WRITEBACK)
    native = tmp_path / "native"
    for sub in ("cur", "new", "tmp"):
        (native / sub).mkdir(parents=True)
    got = shared_append.run_lockless(make_file(mount.mnt, rel))
    want = shared_append.run_lockless(make_file(native, rel))
    assert want == {"signals": [], "short": [], "size": 2000 * 1000}
    assert got == want
