"""Index rows and files a store's owner wrote to trap root's dboxadm: a
directory tree with a cycle, an empty name, sizes near 2^63, an m.N of a
terabyte of hole.  Each verb must finish and say what is wrong.  Before 2026-12-02 an attack run made `stats` spin
forever on a directory that is its own parent, `export` make 80,000
nested directories (the ASan build: a stack overflow), and check and
export do undefined arithmetic and a strndup(NULL) (UBSan, `make
check-asan`)."""
import os
import signal
import sqlite3
import subprocess
import time

import pytest

from conftest import DBOXADM, Mount, adm_finishing

LIMIT = 60


def adm(*args):
    return adm_finishing(*args, limit=LIMIT)


@pytest.fixture
def store(tmp_path):
    """An unmounted store: INBOX with 2 messages, folder .Sent with 1."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    m.mount()
    for folder, names in ((m.maildir(), ("a", "b")), (m.maildir(".Sent"), ("c",))):
        for n in names:
            (folder / "tmp" / n).write_bytes(b"Subject: %s\n\nbody\n" % n.encode())
            (folder / "tmp" / n).rename(folder / "new" / n)
    m.unmount()
    return m.store


def edit(store, sql, *args):
    db = sqlite3.connect(store / "index.sqlite")
    with db:
        db.execute(sql, args)
    db.close()


def sent_ino(store):
    db = sqlite3.connect(store / "index.sqlite")
    (ino,), = db.execute("SELECT ino FROM entry WHERE name = CAST('.Sent' AS BLOB)")
    db.close()
    return ino


def test_directory_inside_itself(store, tmp_path):
    ino = sent_ino(store)
    edit(store, "UPDATE entry SET parent = ? WHERE ino = ?", ino, ino)
    r = adm("stats", store)
    assert r.returncode != 0, r
    r = adm("check", store)
    assert r.returncode == 1 and "cannot be reached from the root" in r.stdout, r
    # A second name of .Sent inside .Sent: a loop export must not follow.
    edit(store, "UPDATE entry SET parent = 1 WHERE ino = ?", ino)
    edit(store, "INSERT INTO entry (parent, name, ino) VALUES (?, CAST('loop' AS BLOB), ?)",
         ino, ino)
    r = adm("export", store, tmp_path / "out")
    assert r.returncode == 1 and "cycle" in r.stderr, r
    assert (tmp_path / "out" / ".Sent" / "new" / "c").read_bytes() == b"Subject: c\n\nbody\n"
    assert not (tmp_path / "out" / ".Sent" / "loop" / "loop").exists()


def test_empty_name_and_huge_sizes(store, tmp_path):
    edit(store, "UPDATE entry SET name = CAST('' AS BLOB) WHERE name = CAST('a' AS BLOB)")
    edit(store, "UPDATE message SET body_size = ?, record_size = ? WHERE rowid = "
         "(SELECT min(rowid) FROM message)", 2**63 - 1, 2**63 - 2)
    r = adm("check", store)
    assert r.returncode == 1, r
    r = adm("export", store, tmp_path / "out")
    assert r.returncode == 1, r
    assert (tmp_path / "out" / ".Sent" / "new" / "c").exists()


def test_terabyte_hole(store, tmp_path):
    """An m.N made a terabyte long with a hole (a few blocks on disk) and
    an index that says so: check, backup and rebuild finish, and the
    backup keeps the hole a hole (it wrote it out as zeros, 3.5 GB in 20
    seconds, before 2026-12-02)."""
    db = sqlite3.connect(store / "index.sqlite")
    (file_id,), = db.execute("SELECT DISTINCT file_id FROM message")
    db.close()
    mfile = store / "storage" / f"m.{file_id}"
    os.truncate(mfile, 2**40)
    edit(store, "UPDATE mfile SET size = ? WHERE file_id = ?", 2**40, file_id)
    adm("check", store)
    r = adm("backup", store, tmp_path / "bk")
    assert r.returncode in (0, 1), r
    copy = tmp_path / "bk" / "storage" / f"m.{file_id}"
    assert copy.stat().st_size == 2**40
    assert copy.stat().st_blocks * 512 < 16 * 2**20
    r = adm("rebuild", store)
    assert r.returncode == 0, r
    assert all(p.stat().st_blocks * 512 < 16 * 2**20
               for p in (store / "lost+found").iterdir())


def test_import_of_a_source_deeper_than_a_store_holds(tmp_path):
    """A source 2,100 directories deep: the part below the 2,048 levels a
    store holds fails as one item (it stopped the whole import with
    "the index's tree has a cycle", left the rolled-back batch's records
    past the m.N's end for check to call unknown mail, and counted them
    as imported); the folders after it are imported and check is clean."""
    src, exp = tmp_path / "src", tmp_path / "exp"
    try:
        deep_import(tmp_path, src, exp)
    finally:
        # rm(1) walks without recursion: Python's shutil.rmtree (pytest's
        # cleanup of old temporary directories) fails on 2,000 levels.
        subprocess.run(["rm", "-rf", str(src), str(exp)], check=True)


def deep_import(tmp_path, src, exp):
    (src / "cur").mkdir(parents=True)
    (src / "cur" / "1.top:2,S").write_bytes(b"Subject: top\n\nbody\n")
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(2100):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            for sub in ("cur", "new", "tmp"):
                os.mkdir(sub, dir_fd=fd)
    finally:
        os.close(fd)
    (src / "zz" / "cur").mkdir(parents=True)
    (src / "zz" / "cur" / "2.after:2,S").write_bytes(b"Subject: after\n\nbody\n")
    store = tmp_path / "store"
    r = adm_finishing("import", store, src, limit=300)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "more directories above it than a store holds" in r.stderr, r.stderr[-2000:]
    # The directories at that depth: d and the cur/, new/, tmp/ beside it.
    assert "dboxadm: 4 items failed" in r.stderr, r.stderr[-2000:]
    assert "2 messages" in r.stdout, r.stdout
    r = adm_finishing("check", store)
    assert r.returncode == 0 and "2 messages" in r.stdout and "0 problems" in r.stdout, r.stdout
    assert adm_finishing("export", store, exp).returncode == 0
    assert (exp / "zz" / "cur" / "2.after:2,S").read_bytes() == b"Subject: after\n\nbody\n"


def test_sigint_stops_the_copy_of_a_huge_source_file(tmp_path):
    """SIGINT stops an import in the middle of one endless file (a
    user's 1 TiB sparse message): it was heard only between items, so
    root's import went on writing until the disk was full."""
    src = tmp_path / "src"
    for sub in ("cur", "new", "tmp"):
        (src / sub).mkdir(parents=True)
    with open(src / "cur" / "1.huge:2,S", "wb") as f:
        f.truncate(1 << 40)
    store = tmp_path / "store"
    p = subprocess.Popen([str(DBOXADM), "import", str(store), str(src)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode != 0 and "interrupted" in err, (out, err)
    r = adm_finishing("check", store)
    assert r.returncode == 0 and "0 messages" in r.stdout, r.stdout
    assert sum(f.stat().st_size for f in (store / "storage").iterdir()) < 1 << 30
