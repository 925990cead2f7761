"""Bad input loses nothing else and says what went wrong.

Damaged m.N files, a missing or damaged index, a full disk, hostile
names, stores that must be refused, planted symlinks: each test breaks
one thing on purpose and checks what a client and `dboxadm check` see,
what `dboxadm rebuild` gives back, and that nothing else was touched.
"""
import contextlib
import errno
import json
import os
import random
import sqlite3
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import (DBOXADM, DBOXFS, Mount, index_rows, is_mounted, preload_shim,
                      tmpfs, unmount)

RNG = random.Random(61)


def adm(*args):
    return subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                          timeout=300)


def check_json(store):
    r = adm("check", store, "--json")
    assert r.returncode in (0, 1), r.stderr
    out = json.loads(r.stdout)
    assert (r.returncode == 1) == (out["problems"] != []), out
    return out


def assert_clean(store):
    r = adm("check", store)
    assert r.returncode == 0, (r.stdout + r.stderr).decode(errors="replace")[-4000:]


def write_file(path, data, fsync=False):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def deliver(md, name, data, to="cur"):
    write_file(md / "tmp" / name, data)
    os.rename(md / "tmp" / name, md / to / name)
    return md / to / name


def read_errno(path):
    try:
        with open(path, "rb") as f:
            f.read()
    except OSError as e:
        return e.errno
    return 0


def message(i, size):
    return b"Subject: %d\n\n" % i + RNG.randbytes(size)


def snapshot(d):
    """Every file and directory under d: type, mode, size, mtime, bytes.
    Of STORE/lock only the mode: its text is advice for the holder of the
    moment, and whoever takes the lock empties a stale one."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if os.path.relpath(p, d) == "lock":
                out["lock"] = (st.st_mode,)
                continue
            data = open(p, "rb").read() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(p, d)] = (st.st_mode, st.st_size, st.st_mtime_ns, data)
    return out


def message_locations(store):
    """{name: (file_id, offset, body_size, record_size)} of cur/ messages."""
    rows = index_rows(store, "SELECT e.name, m.file_id, m.offset, m.body_size,"
                             " m.record_size FROM entry e JOIN message m ON m.ino = e.ino")
    return {bytes(n).decode(): tuple(r) for n, *r in rows}


def tree(mnt, skip=()):
    """{relative path: bytes} of every regular file under a mount (the
    relative paths in skip are left out)."""
    out = {}
    for d, dirs, files in os.walk(mnt):
        for n in files:
            p = Path(d) / n
            rel = str(p.relative_to(mnt))
            if rel not in skip:
                out[rel] = p.read_bytes()
    return out


# --- damaged m.N files ----------------------------------------------------------

def test_damaged_mfiles_are_eio_and_reported(make_mount):
    """Truncated, bad magic, wrong size field, garbage metadata, a missing
    file: EIO and a log line for exactly the messages hit, everything else
    readable; check reports each one; rebuild keeps the rest by name."""
    m = make_mount(options=["-o", "rotate_size=4096"])
    md = m.maildir(".Lists")
    msgs = {}
    for i in range(30):
        name = f"{i}.host:2,{'S' if i % 2 else 'FS'}"
        msgs[name] = message(i, 900 + 70 * i)
        deliver(md, name, msgs[name])
    m.unmount()
    loc = message_locations(m.store)
    by_file = {}
    for name, (fid, off, body, rec) in loc.items():
        by_file.setdefault(fid, []).append((off, name))
    files = sorted(f for f, v in by_file.items() if len(v) >= 2)
    assert len(files) >= 5, by_file
    sd = m.store / "storage"
    hit = {}

    def first(fid):
        return min(by_file[fid])[1]

    # Truncated: the file ends inside its last message's body.
    f = files[0]
    last = max(by_file[f])[1]
    os.truncate(sd / f"m.{f}", loc[last][1] + 30 + loc[last][2] // 2)
    hit[last] = f"m.{f} offset {loc[last][1]}"
    # Bad magic in one message header.
    f = files[1]
    with open(sd / f"m.{f}", "r+b") as fh:
        fh.seek(loc[first(f)][1])
        fh.write(b"\x00\x00")
    hit[first(f)] = f"m.{f} offset {loc[first(f)][1]}"
    # A damaged field is no expunge: rebuild keeps each message whose
    # record is still whole in length where the index had it (message
    # header or metadata damaged) under its name, reading EIO.
    kept = [first(f)]
    # Wrong size field: one more byte than the body has.
    f = files[2]
    name = first(f)
    with open(sd / f"m.{f}", "r+b") as fh:
        fh.seek(loc[name][1] + 13)
        fh.write(b"%016X" % (loc[name][2] + 1))
    hit[name] = f"m.{f} offset {loc[name][1]}"
    kept.append(name)
    # Garbage in the metadata block (after its magic).
    f = files[3]
    name = first(f)
    with open(sd / f"m.{f}", "r+b") as fh:
        fh.seek(loc[name][1] + 30 + loc[name][2] + 4)
        fh.write(b"\x00garbage\xff")
    hit[name] = f"m.{f} offset {loc[name][1]}"
    # One damaged field is no expunge: rebuild keeps this one under its
    # name (header and size are as the index had them).
    damaged_field = name
    kept.append(name)
    # A missing file.
    f = files[4]
    os.unlink(sd / f"m.{f}")
    for off, name in by_file[f]:
        hit[name] = f"m.{f}"

    m.mount()
    assert sorted(os.listdir(md / "cur")) == sorted(msgs)
    for name, data in msgs.items():
        p = md / "cur" / name
        assert os.stat(p).st_size == len(data)
        if name in hit:
            assert read_errno(p) == errno.EIO, name
        else:
            assert p.read_bytes() == data, name
    log = m.log_text()
    for name, where in hit.items():
        assert where in log, (name, where, log[-3000:])
    # Still takes new mail.
    assert deliver(md, "new.host", b"fresh\n", "new").read_bytes() == b"fresh\n"

    # check, mounted and not: each message hit, by name.
    for _ in range(2):
        out = check_json(m.store)
        text = "\n".join(out["problems"])
        for name in hit:
            assert f"/.Lists/cur/{name} " in text, (name, text)
        for name in set(msgs) - set(hit):
            assert f"/{name} " not in text, (name, text)
        m.unmount()
    r = adm("check", m.store)
    assert r.returncode == 1 and r.stdout.count(b"problem: message ") >= len(hit)

    # rebuild: every message whose record is whole keeps its name, and so
    # does the one whose record has only its metadata damaged (still EIO).
    r = adm("rebuild", m.store)
    assert r.returncode == 0, r.stderr
    assert b"damaged metadata block" in r.stderr, r.stderr
    m.mount()
    for name in kept:
        assert read_errno(md / "cur" / name) == errno.EIO, name
    got = {k: v for k, v in tree(m.mnt, skip=[f".Lists/cur/{n}" for n in kept]).items()}
    for name, data in msgs.items():
        if name not in hit:
            assert got[f".Lists/cur/{name}"] == data, name
    assert got[".Lists/new/new.host"] == b"fresh\n"
    # Only the messages whose bytes are gone (cut off, file missing).
    assert not any(f".Lists/cur/{name}" in got for name in hit)
    assert sorted(os.listdir(md / "cur")) == sorted(
        n for n in msgs if n not in hit or n in kept)
    m.unmount()
    out = check_json(m.store)
    # Only those records: as messages, and as bytes of their m.N.
    assert out["problems"] and all(
        any(n in p for n in kept) or "no whole record" in p
        for p in out["problems"]), out
    for name in kept:
        assert sum(name in p for p in out["problems"]) == 1, (name, out)
    # And no purge takes their bytes.
    r = adm("purge", m.store)
    for name in kept:
        fid, off, body, rec = loc[name]
        assert (sd / f"m.{fid}").stat().st_size >= off + rec, name


# --- the index ------------------------------------------------------------------

def rich_store(m):
    """Messages in INBOX, a Maildir++ folder and a nested folder, flags in
    names, a hard link, plain files, an empty folder.  Returns
    {path: bytes} of messages (the folder's path ends at the first "cur/"
    or "new/"), and {path: bytes} of plain files."""
    msgs, plain = {}, {}
    inbox, sent, deep = m.maildir(), m.maildir(".Sent"), m.maildir("Archive", "2019")
    m.maildir(".Empty")
    for i in range(40):
        md, where = [(inbox, ""), (sent, ".Sent/"), (deep, "Archive/2019/")][i % 3]
        name = f"17000000{i:02d}.M{i}P1.host,S={1000 + i}:2,{'RS' if i % 2 else ''}"
        data = message(i, 1000 + 37 * i)
        sub = "new" if i % 5 == 0 else "cur"
        if sub == "new":
            name = name.split(":")[0]
        deliver(md, name, data, sub)
        os.utime(md / sub / name, ns=(1_600_000_000_000_000_000 + i, 1_600_000_000_000_000_000 + i * 1_000_000_007))
        msgs[f"{where}{sub}/{name}"] = data
    os.link(inbox / "cur" / os.listdir(inbox / "cur")[0], sent / "cur" / "copy:2,S")
    msgs[".Sent/cur/copy:2,S"] = (inbox / "cur" / os.listdir(inbox / "cur")[0]).read_bytes()
    for path, data in {".Sent/maildirfolder": b"", "dovecot-uidlist": b"3 V1 N41\n",
                       ".mbsyncstate": b"state\n"}.items():
        (m.mnt / path).write_bytes(data)
        plain[path] = data
    return msgs, plain


def stat_tree(mnt):
    """{path: (inode, mode, links, size, mtime)} of everything under mnt."""
    out = {}
    for d, dirs, files in os.walk(mnt):
        for n in dirs + files:
            p = Path(d) / n
            st = os.lstat(p)
            out[str(p.relative_to(mnt))] = (st.st_ino, st.st_mode, st.st_nlink,
                                            st.st_size if stat.S_ISREG(st.st_mode) else 0,
                                            st.st_mtime_ns)
    return out


def test_rebuild_of_a_whole_index_changes_nothing(make_mount):
    """A rebuild of a healthy store gives back the same tree: names,
    inode numbers, hard links, modes, mtimes, plain files; expunged
    messages stay expunged unless --restore-all."""
    m = make_mount()
    msgs, plain = rich_store(m)
    gone = deliver(m.maildir(".Sent"), "expunged:2,T", b"deleted mail\n")
    os.unlink(gone)
    before, files_before = stat_tree(m.mnt), tree(m.mnt)
    m.unmount()
    r = adm("rebuild", m.store)
    assert r.returncode == 0, r.stderr
    assert b"1 expunged records left for purge" in r.stdout, r.stdout
    kept = sorted(p.name for p in m.store.glob("index.sqlite.broken-*"))
    assert len(kept) == 1, kept
    assert_clean(m.store)
    m.mount()
    assert stat_tree(m.mnt) == before
    assert tree(m.mnt) == files_before
    m.unmount()
    r = adm("rebuild", m.store, "--restore-all")
    assert r.returncode == 0, r.stderr
    m.mount()
    back = [n for n in os.listdir(m.mnt / ".Sent" / "cur") if n.endswith(".rebuild:2,")]
    assert len(back) == 1 and (m.mnt / ".Sent" / "cur" / back[0]).read_bytes() == b"deleted mail\n"
    assert len(list(m.store.glob("index.sqlite.broken-*"))) >= 2
    m.unmount()

    # Without index.sqlite the newest kept one is read again, and
    # rebuild says which and that it may be older than the mail.
    newest = max(p.name for p in m.store.glob("index.sqlite.broken-*")
                 if not p.name.endswith(("-wal", "-shm")))
    (m.store / "index.sqlite").unlink()
    r = adm("rebuild", m.store)
    assert r.returncode == 0, r.stderr
    assert (b"no index.sqlite: names are read from the newest index an "
            b"earlier rebuild kept, %s/%s" % (bytes(m.store), newest.encode())
            in r.stderr), r.stderr
    m.mount()
    assert stat_tree(m.mnt) == before   # the --restore-all came after it


def make_old_page_size(store):
    """STORE's index rewritten with 4096-byte pages, as indexes were made
    before 2026-12-02 (the store unmounted)."""
    db = sqlite3.connect(store / "index.sqlite", isolation_level=None)
    db.executescript("PRAGMA journal_mode=DELETE; PRAGMA page_size=4096;"
                     " VACUUM; PRAGMA journal_mode=WAL;")
    db.close()


def page_size(store):
    db = sqlite3.connect(f"file:{store / 'index.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()


def test_index_with_old_page_size_is_rewritten_at_mount(make_mount):
    """An index made before 2026-12-02 (4096-byte pages) is rewritten
    with 1024-byte pages by the first mount, once, saying so; the tree
    (names, inode numbers, links, modes, times, plain files) is as it
    was, the index stays in WAL mode, and check finds nothing."""
    m = make_mount()
    rich_store(m)
    before, files_before = stat_tree(m.mnt), tree(m.mnt)
    m.unmount()
    assert page_size(m.store) == 1024
    make_old_page_size(m.store)
    assert page_size(m.store) == 4096
    m.mount()
    assert "rewriting its 4096-byte pages as 1024-byte ones" in m.log_text()
    assert stat_tree(m.mnt) == before
    assert tree(m.mnt) == files_before
    deliver(m.maildir(), "after:2,S", b"after the rewrite\n")
    m.unmount()
    assert page_size(m.store) == 1024
    assert not (m.store / "index.sqlite-journal").exists()
    assert_clean(m.store)
    m.mount()
    assert "rewriting" not in m.log_text()
    assert (m.mnt / "cur" / "after:2,S").read_bytes() == b"after the rewrite\n"
    m.unmount()


def refused(store, tmp_path, needle):
    """dboxfs refuses store: non-zero exit, no mount, a message with needle."""
    mnt = tmp_path / "refused-mnt"
    mnt.mkdir(exist_ok=True)
    try:
        r = subprocess.run([str(DBOXFS), str(store), str(mnt)], capture_output=True,
                           timeout=30)
        assert r.returncode != 0
        assert not is_mounted(mnt)
    finally:
        unmount(mnt)
    assert needle in r.stderr, r.stderr
    return r.stderr


def test_index_rewrite_never_follows_a_planted_journal(make_mount, tmp_path):
    """The first mount of an index with 4096-byte pages rewrites it through
    a rollback journal, index.sqlite-journal.  One planted there by the
    store's owner as a symlink to a file of root's: the mount refuses the
    index and the file is untouched; with the symlink gone the rewrite
    happens."""
    m = make_mount()
    deliver(m.maildir(), "a:2,S", b"message a\n")
    m.unmount()
    make_old_page_size(m.store)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root's file\n")
    os.symlink(secret, m.store / "index.sqlite-journal")
    refused(m.store, tmp_path, b"index.sqlite-journal is not a regular file")
    assert secret.read_bytes() == b"root's file\n"
    assert page_size(m.store) == 4096
    (m.store / "index.sqlite-journal").unlink()
    m.mount()
    assert (m.mnt / "cur" / "a:2,S").read_bytes() == b"message a\n"
    m.unmount()
    assert page_size(m.store) == 1024
    assert secret.read_bytes() == b"root's file\n"


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated"])
def test_broken_index_is_refused_and_rebuilt(make_mount, tmp_path, damage):
    """Without a readable index the mount refuses, naming `dboxadm
    rebuild`; rebuild brings back every message (new names in the cur/ of
    its folder, received date as mtime) and the store mounts again."""
    m = make_mount()
    msgs, plain = rich_store(m)
    m.unmount()
    ix = m.store / "index.sqlite"
    if damage == "missing":
        ix.unlink()
    elif damage == "garbage":
        with open(ix, "r+b") as f:
            f.write(RNG.randbytes(4096))
    else:
        os.truncate(ix, 1000)
    before = snapshot(m.store)
    refused(m.store, tmp_path, b"dboxadm rebuild")
    assert snapshot(m.store) == before  # nothing changed
    out = check_json(m.store)
    assert any("dboxadm rebuild" in p for p in out["problems"]), out

    r = adm("rebuild", m.store)
    assert r.returncode == 0, r.stderr
    assert b"%d restored with new names" % len(set(msgs.values())) in r.stdout, r.stdout
    if damage != "missing":  # the old index is kept, as it was
        kept = [p for p in m.store.glob("index.sqlite.broken-*")
                if not p.name.endswith(("-wal", "-shm"))]
        assert [p.read_bytes() for p in kept] == [before["index.sqlite"][3]]
    assert_clean(m.store)
    m.mount()
    got = tree(m.mnt)
    # Every message is back once, in the cur/ of the folder it was saved to.
    # Without the old tree, a folder is the Maildir++ one of its mailbox
    # name (B): INBOX -> the root, Sent -> .Sent, Archive/2019 ->
    # .Archive.2019.
    maildirpp = {"": "cur", ".Sent": ".Sent/cur", "Archive/2019": ".Archive.2019/cur"}
    want = {}
    for path, data in msgs.items():
        if path == ".Sent/cur/copy:2,S":
            continue  # a hard link: one message, saved to INBOX
        folder = os.path.dirname(os.path.dirname(path))
        want.setdefault(maildirpp[folder], []).append(data)
    for folder, datas in want.items():
        names = [n for n in os.listdir(m.mnt / folder) if n.endswith(".rebuild:2,")]
        assert sorted(got[f"{folder}/{n}"] for n in names) == sorted(datas), folder
        for n in names:  # mtime = received date (R), in seconds
            assert os.stat(m.mnt / folder / n).st_mtime_ns % 1_000_000_000 == 0
    assert os.path.isfile(m.mnt / ".Sent" / "maildirfolder")
    # Plain files whose names were lost are kept in lost+found/.
    lost = {p: got[p] for p in got if p.startswith("lost+found/")}
    assert sorted(lost.values()) == sorted(plain.values())
    # Life goes on.
    deliver(m.maildir(), "after.host", b"after\n", "new")
    m.unmount()
    assert_clean(m.store)


def entry_leaf_pages(store):
    db = sqlite3.connect(f"file:{store / 'index.sqlite'}?mode=ro", uri=True)
    try:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        pages = [p for (p,) in db.execute(
            "SELECT pageno FROM dbstat WHERE name = 'entry' AND pagetype = 'leaf'"
            " ORDER BY pageno")]
        return size, pages
    finally:
        db.close()


def test_rebuild_keeps_names_a_damaged_index_still_has(make_mount, tmp_path):
    """Part of the index is damaged (one page of names): rebuild keeps the
    names (and so the flags) of every message the index can still name,
    gives the others new names, and loses none."""
    m = make_mount()
    md = m.maildir()
    msgs = {}
    for i in range(600):
        name = f"{1700000000 + i}.M{i:06d}P99.a-rather-long-host-name.example.org,S=9:2,{'FS'[i % 2]}"
        msgs[name] = message(i, 200 + i % 300)
        deliver(md, name, msgs[name])
    m.unmount()
    db = sqlite3.connect(m.store / "index.sqlite")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    size, pages = entry_leaf_pages(m.store)
    assert len(pages) >= 10, pages
    victim = pages[len(pages) // 2]
    with open(m.store / "index.sqlite", "r+b") as f:
        f.seek((victim - 1) * size)
        f.write(RNG.randbytes(size))
    r = adm("rebuild", m.store)
    assert r.returncode == 0, r.stderr
    assert b"damaged" in r.stdout, r.stdout
    m.mount()
    names = os.listdir(md / "cur")
    kept = [n for n in names if n in msgs]
    new = [n for n in names if n.endswith(".rebuild:2,")]
    assert len(names) == len(msgs) and len(kept) + len(new) == len(msgs)
    assert len(msgs) * 0.7 <= len(kept) < len(msgs), (len(kept), len(new))
    for n in kept:
        assert (md / "cur" / n).read_bytes() == msgs[n]
    assert sorted((md / "cur" / n).read_bytes() for n in new) == \
        sorted(msgs[n] for n in set(msgs) - set(kept))
    m.unmount()
    assert_clean(m.store)


def test_rebuild_of_an_index_with_an_endless_view_ends(make_mount):
    """The store's owner replaced a table of the index by a view (one
    meant never to end): the rebuild made for a hostile index (what check
    and the mount advise) read the old index through it, found no inode
    rows, and left every message as an expunged record for the next purge
    to delete ("3 expunged records left for purge", an empty tree).  It
    now reads no view (index_guard): the old index is unreadable, the
    messages come back from storage/, none is lost."""
    m = make_mount()
    md = m.maildir()
    msgs = {f"{i}.host:2,S": message(i, 300) for i in range(20)}
    for name, data in msgs.items():
        deliver(md, name, data)
    m.unmount()
    db = sqlite3.connect(m.store / "index.sqlite")
    db.executescript("ALTER TABLE inode RENAME TO inode_old;"
                     "CREATE VIEW inode AS WITH RECURSIVE r(n) AS"
                     " (SELECT 1 UNION ALL SELECT n + 1 FROM r)"
                     " SELECT * FROM inode_old, r WHERE n < 0;")
    db.close()
    r = subprocess.run([DBOXADM, "rebuild", str(m.store)], capture_output=True,
                       timeout=60)
    assert r.returncode in (0, 1), r.stderr
    m.mount()
    got = sorted((md / "cur" / n).read_bytes() for n in os.listdir(md / "cur"))
    assert got == sorted(msgs.values())
    m.unmount()
    assert_clean(m.store)


def test_newer_format_is_refused(make_mount, tmp_path):
    m = make_mount()
    deliver(m.maildir(), "a.host", b"a\n")
    m.unmount()
    db = sqlite3.connect(m.store / "index.sqlite")
    db.execute("UPDATE meta SET value = 99 WHERE key = 'format'")
    db.commit()
    db.close()
    before = snapshot(m.store)
    refused(m.store, tmp_path, b"newer")
    assert adm("check", m.store).returncode == 2
    r = adm("rebuild", m.store)
    assert r.returncode == 2 and b"newer" in r.stderr, r.stderr
    assert snapshot(m.store) == before


def test_refusals_change_nothing(make_mount, tmp_path):
    """A store in use, a directory that is no store: refused, untouched."""
    m = make_mount()
    deliver(m.maildir(), "a.host", b"a\n")
    refused(m.store, tmp_path, b"in use")
    r = adm("rebuild", m.store)
    assert r.returncode == 2 and b"in use" in r.stderr
    assert (m.mnt / "cur" / "a.host").read_bytes() == b"a\n"
    notstore = tmp_path / "Maildir"
    (notstore / "cur").mkdir(parents=True)
    (notstore / "cur" / "1.host:2,S").write_bytes(b"real mail\n")
    before = snapshot(notstore)
    # No storage/: nothing to rebuild from, so no rebuild advice.
    err = refused(notstore, tmp_path, b"not a dbox store")
    assert b"rebuild" not in err, err
    assert adm("check", notstore).returncode == 2
    assert adm("rebuild", notstore).returncode == 2
    assert snapshot(notstore) == before


# --- a full disk ------------------------------------------------------------------

@pytest.fixture
def small_fs(tmp_path):
    """A 6 MiB tmpfs, unmounted in teardown (after any dboxfs on it)."""
    yield from tmpfs(tmp_path / "small", "6m")


@pytest.fixture
def mid_fs(tmp_path):
    """A 32 MiB tmpfs: room for a WAL at its checkpoint bounds (4 and
    8 MiB) besides a store, unmounted in teardown."""
    yield from tmpfs(tmp_path / "mid", "32m")


def test_disk_full(small_fs, make_mount, tmp_path):
    """Deliveries get ENOSPC, nothing delivered is lost or damaged, and
    the mount takes mail again once there is room."""
    ballast = small_fs / "ballast"
    ballast.write_bytes(b"\0" * (1 << 20))
    m = make_mount(store=small_fs / "store", mnt=tmp_path / "mnt")
    md = m.maildir()
    delivered, failures = {}, []
    for i in range(400):
        name = f"{i}.full.host"
        data = message(i, 48_000 + i)
        try:
            write_file(md / "tmp" / name, data, fsync=True)
            os.rename(md / "tmp" / name, md / "new" / name)
            delivered[name] = data
        except OSError as e:
            failures.append(e.errno)
            try:
                os.unlink(md / "tmp" / name)
            except FileNotFoundError:
                pass
            if len(failures) >= 5:
                break
    assert failures, "the disk never filled"
    assert set(failures) == {errno.ENOSPC}, failures
    assert len(delivered) >= 20
    assert os.listdir(md / "tmp") == []
    assert tree(md / "new") == delivered

    ballast.unlink()  # room again
    for i in range(5):
        deliver(md, f"after{i}.host", b"after %d\n" % i, "new")
        delivered[f"after{i}.host"] = b"after %d\n" % i
    assert tree(md / "new") == delivered
    m.unmount()
    m.mount()
    assert tree(md / "new") == delivered
    m.unmount()
    assert check_json(m.store)["problems"] == []


# --- names ------------------------------------------------------------------------

def outcome(func, *args):
    try:
        func(*args)
        return 0
    except OSError as e:
        return errno.errorcode[e.errno]


def hostile_ops(root):
    """Name tricks against a maildir at root; the errno of each step."""
    md = root
    for sub in ("cur", "new", "tmp"):
        os.makedirs(md / sub, exist_ok=True)
    (md / "cur" / "x").write_bytes(b"x\n")
    os.mkdir(md / "dir")
    long = "L" * 256
    ok255 = "M" * 255
    steps = [
        ("create empty", lambda: os.open(md / "cur" / "", os.O_CREAT | os.O_WRONLY, 0o600)),
        ("create 256", lambda: os.open(md / "cur" / long, os.O_CREAT | os.O_WRONLY, 0o600)),
        ("create 255", lambda: os.close(os.open(md / "cur" / ok255, os.O_CREAT | os.O_WRONLY, 0o600))),
        ("stat 256", lambda: os.stat(md / "cur" / long)),
        ("mkdir 256", lambda: os.mkdir(md / long)),
        ("mkdir .", lambda: os.mkdir(md / "cur" / ".")),
        ("mkdir ..", lambda: os.mkdir(md / "cur" / "..")),
        ("rename to 256", lambda: os.rename(md / "cur" / "x", md / "cur" / long)),
        ("link to 256", lambda: os.link(md / "cur" / "x", md / "cur" / long)),
        ("rename to .", lambda: os.rename(md / "cur" / "x", md / "cur" / ".")),
        ("rename to ..", lambda: os.rename(md / "cur" / "x", md / "cur" / "..")),
        ("rename .", lambda: os.rename(md / "cur" / ".", md / "cur" / "y")),
        ("link to ..", lambda: os.link(md / "cur" / "x", md / "cur" / "..")),
        ("rename to x/", lambda: os.rename(md / "cur" / "x", str(md / "cur" / "y") + "/")),
        ("rename via missing/..", lambda: os.rename(md / "cur" / "x", md / "cur" / "nope" / ".." / "y")),
        ("rename via dir/..", lambda: os.rename(md / "cur" / "x", md / "dir" / ".." / "cur" / "x2")),
        ("rename dir into itself", lambda: os.rename(md / "dir", md / "dir" / "sub")),
        ("rename file over dir", lambda: os.rename(md / "cur" / "x2", md / "dir")),
        ("unlink dir", lambda: os.unlink(md / "dir")),
        ("rmdir file", lambda: os.rmdir(md / "cur" / "x2")),
        ("rmdir non-empty", lambda: os.rmdir(md / "cur")),
        ("create odd bytes", lambda: (md / "cur" / "a\nb\\c:2,S\x01").write_bytes(b"odd\n")),
        ("create non-utf8", lambda: open(os.fsencode(md / "cur") + b"/\xff\xfe.host", "wb").close()),
        ("create dot-dot-slash", lambda: (md / "cur" / "..%2f..%2fescape").write_bytes(b"e\n")),
        ("rename dir to ..", lambda: os.rename(md / "dir", md / "..")),
    ]
    return [(what, outcome(step)) for what, step in steps]


def plant_hot_journal(store, super_journal):
    """A rollback journal beside STORE/index.sqlite that SQLite takes for
    a hot one, naming super_journal as its super-journal, with no page to
    restore.  The layout is SQLite's file format document, "The Rollback
    Journal": a header (magic, record count, nonce, database size in
    pages, sector size, page size) padded to a sector, and at the end the
    super-journal record: the lock-byte page's number, the name, its
    length, the sum of its bytes and the magic again."""
    magic = bytes.fromhex("d9d505f920a163d7")
    head = (store / "index.sqlite").read_bytes()[:100]
    page = int.from_bytes(head[16:18], "big") or 65536
    pages = int.from_bytes(head[28:32], "big")
    sector = 512
    journal = (magic + struct.pack(">IIIII", 0, 0x2a2a2a2a, pages, sector, page)
               ).ljust(sector, b"\0")
    name = str(super_journal).encode()
    journal += (struct.pack(">I", 0x40000000 // page + 1) + name
                + struct.pack(">II", len(name), sum(name)) + magic)
    (store / "index.sqlite-journal").write_bytes(journal)


def test_planted_journal_deletes_nothing(make_mount, tmp_path):
    """The store's owner plants a rollback journal that names a file of
    root's as its super-journal: SQLite, rolling the journal back, would
    delete that file.  Neither the mount, dboxadm check, stats, nor
    rebuild (which salvages the old index) deletes it; the mount refuses
    the index, saying why, and once the journal is gone all is well."""
    m = make_mount()
    deliver(m.maildir(), "a:2,S", b"message a\n")
    m.unmount()
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    plant_hot_journal(m.store, victim)
    err = refused(m.store, tmp_path, b"super-journal")
    assert victim.read_bytes() == b"root's file\n", err
    for verb in ("check", "stats"):
        adm(verb, m.store)
        assert victim.read_bytes() == b"root's file\n", verb
    r = adm("rebuild", m.store)
    assert victim.read_bytes() == b"root's file\n", r.stdout + r.stderr
    (m.store / "index.sqlite-journal").unlink(missing_ok=True)
    m.mount()
    assert (m.mnt / "cur" / "a:2,S").read_bytes() == b"message a\n"
    m.unmount()
    assert victim.read_bytes() == b"root's file\n"


def test_index_rewrite_cut_by_a_crash(make_mount):
    """A rewrite of the index's pages killed half way leaves
    index.sqlite partly overwritten and its rollback journal hot (here a
    process killed inside a transaction too big for its cache, in the
    same journal mode).  The next mount rolls it back, rewrites the
    index, and the tree is as it was."""
    m = make_mount()
    md = m.maildir(".Lists")
    for i in range(300):
        deliver(md, f"{i}.crash.host:2,S", b"Subject: %d\n\nbody\n" % i)
    before = stat_tree(m.mnt), tree(m.mnt)
    m.unmount()
    index = m.store / "index.sqlite"
    make_old_page_size(m.store)
    killed = subprocess.run([sys.executable, "-c", (
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA journal_mode=DELETE')\n"
        "db.execute('PRAGMA cache_size=2')\n"
        "db.execute('BEGIN')\n"
        "db.execute(\"UPDATE entry SET name = name || 'x'\")\n"
        "os.kill(os.getpid(), 9)\n"), str(index)])
    assert killed.returncode == -9
    assert (m.store / "index.sqlite-journal").stat().st_size > 0
    m.mount()
    assert (stat_tree(m.mnt), tree(m.mnt)) == before
    m.unmount()
    assert not (m.store / "index.sqlite-journal").exists()
    assert page_size(m.store) == 1024
    assert_clean(m.store)


def test_index_rewrite_on_a_full_disk(mid_fs, make_mount, tmp_path):
    """The first mount of an index with 4096-byte pages on a disk with no
    room for the rewrite's journal: the mount goes on with the old pages,
    says so, and loses nothing; once there is room the next mount
    rewrites it."""
    m = make_mount(store=mid_fs / "store", mnt=tmp_path / "mnt")
    md = m.maildir()
    want = {}
    for i in range(400):
        name = f"{i}.page.host:2,S"
        want[name] = b"Subject: %d\n\nbody\n" % i
        deliver(md, name, want[name])
    m.unmount()
    make_old_page_size(m.store)
    assert page_size(m.store) == 4096
    index_bytes = (m.store / "index.sqlite").stat().st_size
    ballast = mid_fs / "ballast"
    free = os.statvfs(mid_fs).f_bavail * os.statvfs(mid_fs).f_frsize
    assert free > index_bytes // 4 + (64 << 10), (free, index_bytes)
    ballast.write_bytes(b"\0" * (free - index_bytes // 4))
    m.mount()
    assert "not rewritten with 1024-byte pages" in m.log_text(), m.log_text()
    assert "index reserve" not in m.log_text()
    assert tree(md / "cur") == want
    m.unmount()
    assert page_size(m.store) == 4096
    assert not (m.store / "index.sqlite-journal").exists()
    ballast.unlink()
    m.mount()
    assert "rewriting its 4096-byte pages" in m.log_text()
    assert "not rewritten" not in m.log_text()
    assert tree(md / "cur") == want
    m.unmount()
    assert page_size(m.store) == 1024
    assert_clean(m.store)


def test_hostile_names(mount, tmp_path):
    """Every name trick fails (or works) with the errno a local
    filesystem gives; nothing is written outside STORE."""
    native = tmp_path / "native"
    native.mkdir()
    outside_before = set(os.listdir(tmp_path))
    ours = hostile_ops(mount.mnt / ".Hostile")
    want = hostile_ops(native / ".Hostile")
    assert ours == want
    assert dict(ours)["create 256"] == "ENAMETOOLONG"
    assert dict(ours)["rename dir into itself"] == "EINVAL"
    assert sorted(os.listdir(mount.mnt / ".Hostile" / "cur")) == \
        sorted(os.listdir(native / ".Hostile" / "cur"))
    assert set(os.listdir(tmp_path)) == outside_before
    files = os.listdir(mount.store / "files")
    assert all(n.isdigit() for n in files), files
    assert all(n.startswith("m.") and n[2:].isdigit()
               for n in os.listdir(mount.store / "storage"))
    mount.unmount()
    assert check_json(mount.store)["problems"] == []
    out = tmp_path / "export"
    r = adm("export", mount.store, out)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out / ".Hostile" / "cur")) == \
        sorted(os.listdir(native / ".Hostile" / "cur"))


def test_export_ignores_hostile_names_in_the_index(mount, tmp_path):
    """A damaged (or forged) index with '../' names cannot make export
    write outside its target directory."""
    deliver(mount.maildir(), "good.host", b"good\n")
    mount.unmount()
    db = sqlite3.connect(mount.store / "index.sqlite")
    db.execute("UPDATE entry SET name = CAST('../../escaped' AS BLOB)"
               " WHERE name = CAST('good.host' AS BLOB)")
    db.commit()
    db.close()
    out = tmp_path / "deep" / "out"
    out.parent.mkdir()
    r = adm("export", mount.store, out)
    assert r.returncode == 1 and b"not a valid file name" in r.stderr, r.stderr
    assert not (tmp_path / "escaped").exists() and not (out.parent / "escaped").exists()
    out = check_json(mount.store)
    assert any("not a valid file name" in p for p in out["problems"]), out


# --- security -----------------------------------------------------------------------

def mount_options(mnt):
    with open("/proc/mounts") as f:
        for line in f:
            fields = line.split()
            if fields[1] == os.path.realpath(mnt):
                return set(fields[3].split(","))
    raise AssertionError(f"{mnt} not mounted")


def test_mount_options(make_mount, tmp_path):
    """A mount only its owner reaches checks permissions in the daemon
    (no default_permissions); one others reach (allow_other, allow_root)
    or that asks for it leaves them to the kernel."""
    m = make_mount()
    opts = mount_options(m.mnt)
    assert "default_permissions" not in opts and "allow_other" not in opts, opts
    m.unmount()
    for n, extra in enumerate(("allow_other", "allow_root", "default_permissions",
                               "writeback_cache")):
        m = make_mount(mnt=tmp_path / f"mnt{n + 2}", options=["-o", extra])
        opts = mount_options(m.mnt)
        # allow_root is libfuse's own (allow_other in the kernel).
        assert "default_permissions" in opts, (extra, opts)
        assert ("allow_other" in opts) == (extra.startswith("allow_")), (extra, opts)
        m.unmount()


def test_store_modes(mount):
    """Store files are 0600 and directories 0700, whatever the umask of
    the clients and the modes they ask for."""
    old = os.umask(0)
    try:
        md = mount.maildir(".Public")
        deliver(md, "m.host", b"m\n")
        (mount.mnt / ".Public" / "maildirfolder").write_bytes(b"")
        os.chmod(mount.mnt / ".Public" / "maildirfolder", 0o666)
        fd = os.open(mount.mnt / "dovecot-uidlist", os.O_CREAT | os.O_WRONLY, 0o666)
        os.write(fd, b"3 V1 N1\n")
        os.close(fd)
    finally:
        os.umask(old)
    mount.unmount()
    mount.mount()  # and the index files of a reopened store
    seen = 0
    for d, dirs, files in os.walk(mount.store):
        for n in dirs:
            assert stat.S_IMODE(os.lstat(Path(d) / n).st_mode) == 0o700, (d, n)
        for n in files:
            try:
                st = os.lstat(Path(d) / n)
            except FileNotFoundError:
                continue  # index.sqlite-wal/-shm, gone with a closing connection
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600, (d, n)
            seen += 1
    assert seen >= 5
    assert stat.S_IMODE(os.stat(mount.store).st_mode) == 0o700


def test_symlinks_in_store_are_not_followed(make_mount, tmp_path):
    """A symlink planted in files/ or storage/ never makes the daemon read,
    write or truncate a file outside STORE."""
    m = make_mount()
    (m.mnt / "notes").write_bytes(b"my notes\n")
    ino = os.stat(m.mnt / "notes").st_ino
    deliver(m.maildir(), "a.host", b"message a\n")
    m.unmount()
    secret = tmp_path / "secret"
    secret.write_bytes(b"outside the store\n")
    # files/<ino> -> secret
    (m.store / "files" / str(ino)).unlink()
    os.symlink(secret, m.store / "files" / str(ino))
    # storage/m.1 -> a copy outside, with a tail recovery would cut.
    copy = tmp_path / "m1-copy"
    copy.write_bytes((m.store / "storage" / "m.1").read_bytes() + b"tail" * 100)
    (m.store / "storage" / "m.1").unlink()
    os.symlink(copy, m.store / "storage" / "m.1")
    copy_before = copy.read_bytes()

    m.mount()
    assert read_errno(m.mnt / "notes") == errno.EIO
    assert outcome(lambda: os.stat(m.mnt / "notes")) == "EIO"
    assert read_errno(m.mnt / "cur" / "a.host") == errno.EIO
    for op in (lambda: (m.mnt / "notes").write_bytes(b"overwrite\n"),
               lambda: os.truncate(m.mnt / "notes", 0),
               lambda: os.utime(m.mnt / "notes", (1, 1))):
        assert outcome(op) in ("EIO", "ENOENT"), op
    assert secret.read_bytes() == b"outside the store\n"
    assert copy.read_bytes() == copy_before
    assert f"files/{ino}" in m.log_text()
    m.unmount()
    text = "\n".join(check_json(m.store)["problems"])
    assert "symbolic link" in text and f"files/{ino}" in text and "m.1" in text, text


# --- check while mounted --------------------------------------------------------------

def test_check_while_delivering(mount):
    """check on a busy mount reads one snapshot: no false alarm."""
    md = mount.maildir()
    stop = threading.Event()
    count = [0]

    def deliverer():
        i = 0
        while not stop.is_set():
            write_file(md / "tmp" / f"{i}.busy", message(i, 3000), fsync=i % 3 == 0)
            os.rename(md / "tmp" / f"{i}.busy", md / "new" / f"{i}.busy")
            i += 1
            count[0] = i

    t = threading.Thread(target=deliverer)
    t.start()
    try:
        runs = []
        deadline = time.monotonic() + 20
        # At least 5 checks, and go on until deliveries really overlapped.
        while (len(runs) < 5 or count[0] <= 20) and time.monotonic() < deadline:
            runs.append(check_json(mount.store))
    finally:
        stop.set()
        t.join()
    assert len(runs) >= 5 and count[0] > 20
    for out in runs:
        assert out["mounted"] is True and out["problems"] == [], out
    assert runs[-1]["messages"] > runs[0]["messages"] or count[0] > 0


HOLD_STAT = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The first fstatat() in, or fdopendir() of, a directory whose path ends
   in HOLD_SUFFIX: HOLD_DIR/ready is made, then the call waits (up to
   30 s) for HOLD_DIR/go. */
static int held;

static void hold(int dirfd)
{
	const char *dir = getenv("HOLD_DIR"), *suffix = getenv("HOLD_SUFFIX");
	char link[64], path[4096], flag[4200];
	ssize_t n;
	size_t len;

	if (dir == NULL || suffix == NULL || held)
		return;
	len = strlen(suffix);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
	if ((n = readlink(link, path, sizeof(path) - 1)) < (ssize_t)len)
		return;
	path[n] = '\0';
	if (strcmp(path + n - len, suffix) != 0)
		return;
	held = 1;
	snprintf(flag, sizeof(flag), "%s/ready", dir);
	close(open(flag, O_CREAT | O_WRONLY, 0600));
	snprintf(flag, sizeof(flag), "%s/go", dir);
	for (int i = 0; i < 3000 && access(flag, F_OK) != 0; i++)
		usleep(10000);
}

int fstatat(int dirfd, const char *name, struct stat *sb, int flags)
{
	static int (*real)(int, const char *, struct stat *, int);

	if (real == NULL)
		real = (int (*)(int, const char *, struct stat *, int))
			dlsym(RTLD_NEXT, "fstatat");
	hold(dirfd);
	return real(dirfd, name, sb, flags);
}

DIR *fdopendir(int fd)
{
	static DIR *(*real)(int);

	if (real == NULL)
		real = (DIR *(*)(int))dlsym(RTLD_NEXT, "fdopendir");
	hold(fd);
	return real(fd);
}

int fstatat64(int dirfd, const char *name, struct stat64 *sb, int flags)
{
	static int (*real)(int, const char *, struct stat64 *, int);

	if (real == NULL)
		real = (int (*)(int, const char *, struct stat64 *, int))
			dlsym(RTLD_NEXT, "fstatat64");
	hold(dirfd);
	return real(dirfd, name, sb, flags);
}
"""


@contextlib.contextmanager
def held(tmp_path, monkeypatch, suffix, *args):
    """Run dboxadm with args under the HOLD_STAT shim, held at its first
    look into a directory ending in suffix; the body runs while it is
    held (without the shim in its own processes), and the dict it gets
    holds the command's rc, out and err once it has gone on and ended."""
    hold = tmp_path / "hold"
    hold.mkdir()
    shim = preload_shim(tmp_path, monkeypatch, "holdstat", HOLD_STAT)
    monkeypatch.delenv("LD_PRELOAD")
    proc = subprocess.Popen([str(DBOXADM), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, LD_PRELOAD=str(shim),
                                     HOLD_DIR=str(hold), HOLD_SUFFIX=suffix))
    result = {}
    try:
        deadline = time.monotonic() + 30
        while not (hold / "ready").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, f"never held at {suffix}"
            time.sleep(0.02)
        yield result
    finally:
        (hold / "go").touch()
        result["out"], result["err"] = proc.communicate(timeout=120)
        result["rc"] = proc.returncode


def test_check_while_a_dot_file_is_replaced(mount, tmp_path, monkeypatch):
    """check reads the index in one snapshot; a plain file the mount deletes
    after it (Dovecot renames dovecot-uidlist.lock over dovecot-uidlist)
    loses its backing file once that rename is on disk.  check then found
    files/<ino> missing and reported a problem (helper-75: 4 of 10 online
    checks under Dovecot load).  The check is held, by a shim, at its
    first look into files/ until the rename is durable and the backing
    file gone: no problem, since the file is no longer in the index."""
    md = mount.maildir()
    (md / ".uidlist").write_bytes(b"3 V1 N4\n")
    backing = mount.store / "files" / str(os.stat(md / ".uidlist").st_ino)
    assert backing.exists()
    with held(tmp_path, monkeypatch, "/files",
              "check", mount.store, "--json") as check:
        (md / ".uidlist.lock").write_bytes(b"3 V1 N5\n")
        os.rename(md / ".uidlist.lock", md / ".uidlist")
        fd = os.open(md, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        deadline = time.monotonic() + 10
        while backing.exists():
            assert time.monotonic() < deadline, "the backing file stayed"
            time.sleep(0.02)
    report = json.loads(check["out"])
    assert report["mounted"] is True
    assert report["problems"] == [], report


def test_stats_while_the_mount_purges(make_mount, tmp_path, monkeypatch):
    """stats reads the index in one snapshot and then lists storage/; a
    purge by the mount in between removes m.N files the snapshot still
    knows, and stats exited 1, "m.N the index knows are not on disk"
    (helper-76: 8 times in 520 runs beside automatic purges).  stats is
    held by a shim before it lists storage/ while the purge runs: exit 0."""
    m = make_mount(options=["-o", "rotate_size=16384"])
    cur = m.maildir() / "cur"
    for i in range(30):
        (cur / f"{i}.host:2,S").write_bytes(message(i, 3000))
    for i in range(26):
        os.unlink(cur / f"{i}.host:2,S")
    before = set(os.listdir(m.store / "storage"))
    with held(tmp_path, monkeypatch, "/storage", "stats", m.store) as stats:
        r = adm("purge", m.store)
        assert r.returncode == 0, r
        assert before - set(os.listdir(m.store / "storage")), "nothing removed"
    assert stats["rc"] == 0, (stats["out"] + stats["err"]).decode(errors="replace")


# --- the commands ---------------------------------------------------------------------

def test_check_and_rebuild_command_line(mount, tmp_path):
    r = adm("--help")
    assert b"check" in r.stdout and b"rebuild" in r.stdout
    for verb in ("check", "rebuild"):
        r = adm(verb, "--help")
        assert r.returncode == 0 and r.stdout.startswith(b"usage: dboxadm " + verb.encode())
        assert adm(verb).returncode == 2
        assert adm(verb, mount.store, "--bogus").returncode == 2
        assert adm(verb, tmp_path / "nonexistent").returncode == 2
    deliver(mount.maildir(), "a.host", b"a\n")
    r = adm("check", mount.store)
    assert r.returncode == 0 and r.stderr == b"", r  # no progress when piped
    assert b"0 problems" in r.stdout and b"mounted" in r.stdout


def test_progress_on_a_terminal(mount):
    """check and rebuild draw a progress line when stderr is a terminal
    (run under script(1), which gives them one)."""
    md = mount.maildir()
    for i in range(50):
        deliver(md, f"{i}.host", message(i, 2000))
    mount.unmount()
    for verb, word in (("check", b"checked"), ("rebuild", b"scanned")):
        r = subprocess.run(["script", "-qec", f"{DBOXADM} {verb} {mount.store}",
                            "/dev/null"], capture_output=True, timeout=120)
        assert r.returncode == 0, r.stdout
        assert word + b" 50 messages" in r.stdout, r.stdout
    r = adm("check", mount.store)
    assert b"checked" not in r.stderr


def test_rebuild_cut_short_is_run_again(make_mount):
    """A rebuild that died before its new index was in place leaves no
    index.sqlite (the mount refuses) and maybe a partial
    index.sqlite.rebuilding; running rebuild again reads the kept old
    index and keeps every name."""
    m = make_mount()
    msgs, plain = rich_store(m)
    before = tree(m.mnt)
    m.unmount()
    assert adm("rebuild", m.store).returncode == 0
    # As if that rebuild had died just before its rename:
    (m.store / "index.sqlite").unlink()
    (m.store / "index.sqlite.rebuilding").write_bytes(b"half a database")
    r = adm("rebuild", m.store)
    assert r.returncode == 0, r.stderr
    assert not (m.store / "index.sqlite.rebuilding").exists()
    assert b"0 restored with new names" in r.stdout, r.stdout
    assert_clean(m.store)
    m.mount()
    assert tree(m.mnt) == before


def test_check_notes_an_empty_unknown_mfile(make_mount):
    """A crash right after a new m.N was created (before its header was
    written and its creation committed) leaves an empty file: a note, not
    a problem; the store mounts and takes mail."""
    m = make_mount()
    deliver(m.maildir(), "a.host", b"a\n")
    m.unmount()
    (m.store / "storage" / "m.9").write_bytes(b"")
    out = check_json(m.store)
    assert out["problems"] == [] and any("m.9" in n for n in out["notes"]), out
    m.mount()
    assert (m.mnt / "cur" / "a.host").read_bytes() == b"a\n"
    deliver(m.maildir(), "b.host", b"b\n")


def test_check_notes_a_cut_first_record_of_an_unknown_mfile(make_mount):
    """A crash while the first record of a new m.N was being written
    (its creation not yet committed) leaves the file header line and a
    part of a record: a note, not a problem; the next mount cuts it and
    the store takes mail.  (The crash harness met this case.)"""
    m = make_mount()
    deliver(m.maildir(), "a.host", b"a\n")
    m.unmount()
    m1 = (m.store / "storage" / "m.1").read_bytes()
    header_line = m1[:m1.index(b"\n") + 1]
    # The header line and the first 30 bytes of the record in m.1.
    (m.store / "storage" / "m.9").write_bytes(m1[:len(header_line) + 30])
    out = check_json(m.store)
    assert out["problems"] == [], out
    assert any("m.9" in n and "unfinished record" in n for n in out["notes"]), out
    m.mount()
    assert (m.mnt / "cur" / "a.host").read_bytes() == b"a\n"
    deliver(m.maildir(), "b.host", b"b\n")
    assert (m.mnt / "cur" / "b.host").read_bytes() == b"b\n"
    m.unmount()
    assert len((m.store / "storage" / "m.9").read_bytes()) == len(header_line)
