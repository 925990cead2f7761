"""FIFOs planted in a store (its owner controls every byte and every node
of it): where the mount or a dboxadm verb expects a regular file it must
fail that item, never wait forever in open() or read() for a writer that
never comes.  Before 2026-12-02 an attack run hung root's mount (a FIFO
as lost+found/m.N-OFFSET), dump, cat, check, export, purge and rebuild
(a FIFO as storage/m.N, files/N or index.sqlite)."""
import os
import stat
import subprocess

import pytest

from conftest import DBOXFS, Mount, adm_finishing, index_rows, is_mounted, unmount

LIMIT = 30  # seconds: any of these takes well under one


def adm(*args):
    return adm_finishing(*args, limit=LIMIT)


def made_store(tmp_path):
    """A store with 3 messages and one plain file, unmounted; returns
    (store, the m.N of the messages, the plain file's files/ name)."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    md = m.mount().maildir()
    for i in range(3):
        (md / "tmp" / f"m{i}").write_bytes(b"Subject: x\n\nbody %d\n" % i)
        os.rename(md / "tmp" / f"m{i}", md / "new" / f"m{i}")
    (m.mnt / "plain.txt").write_bytes(b"a plain file\n")
    m.unmount()
    (file_id,), = set(index_rows(m.store, "SELECT file_id FROM message"))
    (ino,), = index_rows(m.store, "SELECT ino FROM inode WHERE kind = 3") or [(None,)]
    return m, f"m.{file_id}", ino


def plant(path):
    os.unlink(path)
    os.mkfifo(path, 0o600)


def test_mfile_fifo(tmp_path):
    m, mfile, _ = made_store(tmp_path)
    plant(m.store / "storage" / mfile)
    for verb in (["dump", m.store, mfile], ["cat", m.store, mfile, "0"],
                 ["check", m.store], ["export", m.store, tmp_path / "out"],
                 ["purge", m.store], ["stats", m.store]):
        r = adm(*verb)
        assert r.returncode != 0 or verb[0] in ("purge", "stats"), (verb, r)
    r = adm("rebuild", m.store)
    m.mount()
    try:
        with pytest.raises(OSError):
            (m.mnt / "new" / "m0").read_bytes()
    finally:
        m.unmount()


def test_files_fifo(tmp_path):
    m, _, ino = made_store(tmp_path)
    if ino is None:
        pytest.skip("no plain-file inode kind 4 in this index")
    plant(m.store / "files" / str(ino))
    r = adm("export", m.store, tmp_path / "out")
    assert r.returncode == 1 and "plain.txt" in r.stderr, r
    m.mount()
    try:
        with pytest.raises(OSError):
            (m.mnt / "plain.txt").read_bytes()
    finally:
        m.unmount()


def test_index_fifo(tmp_path):
    """An index that is a FIFO: check, stats and the mount refuse it;
    rebuild makes a new index from storage/ (keeping the FIFO aside)."""
    m, _, _ = made_store(tmp_path)
    plant(m.store / "index.sqlite")
    for verb in (["check", m.store], ["stats", m.store]):
        r = adm(*verb)
        assert r.returncode != 0, (verb, r)
    p = subprocess.run([str(DBOXFS), str(m.store), str(m.mnt), "-f"],
                       capture_output=True, text=True, timeout=LIMIT)
    assert p.returncode != 0 and not is_mounted(m.mnt), p
    assert "not a regular file" in p.stderr, p
    r = adm("rebuild", m.store)
    assert r.returncode == 0, r
    m.mount()
    try:
        # The names went with the index: the messages come back in cur/.
        got = sorted(p.read_bytes() for p in (m.mnt / "cur").iterdir())
        assert got == [b"Subject: x\n\nbody %d\n" % i for i in range(3)]
    finally:
        m.unmount()


def test_lost_found_fifo(tmp_path):
    """Bytes past an m.N's committed end, and a FIFO where recovery keeps
    its copy of them: the mount comes up, the copy goes to the next free
    name (the FIFO is no copy, and is left alone) before the cut, and
    purge finishes."""
    m, mfile, _ = made_store(tmp_path)
    path = m.store / "storage" / mfile
    end = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\0" * 100)
    (m.store / "lost+found").mkdir()
    os.mkfifo(m.store / "lost+found" / f"{mfile}-{end}")
    try:
        m.mount()
        assert (m.mnt / "new" / "m0").read_bytes() == b"Subject: x\n\nbody 0\n"
        m.unmount()
    finally:
        if m.proc is not None:
            m.kill()
        unmount(m.mnt)
    assert path.stat().st_size == end
    lost = m.store / "lost+found"
    assert stat.S_ISFIFO((lost / f"{mfile}-{end}").lstat().st_mode)
    assert (lost / f"{mfile}-{end}.1").read_bytes() == b"\0" * 100
    adm("purge", m.store)
