"""What an index older than storage/ and one damaged record field must not
cost (issue 12, items 2 and 3): no whole record is ever cut or purged
because the index does not know it, and a message whose record has one
damaged field keeps its names through rebuild and purge."""
import errno
import os
import re
import shutil
import sqlite3
import subprocess
import time

import pytest

from conftest import DBOXADM, Mount, index_rows


def adm(*args):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                       text=True, errors="replace", timeout=300)
    return r.returncode, r.stdout + r.stderr


def body(name):
    return (f"From: x@example.org\nSubject: {name}\n\n").encode() + \
        name.encode() * 200 + b"\n"


def deliver(md, name, fsync=True, path=True):
    """A delivery into md's new/ through tmp/.  path=False: the message
    has a second name when it is closed, so its record carries no path
    (L holds one), like a record Dovecot or a dboxfs from before
    2026-12-07 wrote for a message closed without fsync: recovery cannot
    put it back by itself."""
    fd = os.open(md / "tmp" / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, body(name))
    if not path:
        os.link(md / "tmp" / name, md / "tmp" / (name + ".2"))
    if fsync:
        os.fsync(fd)
    os.close(fd)
    if not path:
        os.unlink(md / "tmp" / (name + ".2"))
    os.rename(md / "tmp" / name, md / "new" / name)


def put_back_index(store, copy):
    """An index copied earlier put back over store's (unmounted), its WAL
    and shared memory gone: an index older than storage/."""
    for suffix in ("-wal", "-shm"):
        if (store / ("index.sqlite" + suffix)).exists():
            os.unlink(store / ("index.sqlite" + suffix))
    shutil.copy(copy, store / "index.sqlite")


def all_messages(mnt, read=True):
    """{name: bytes (None unless read)} of every message in new/ and cur/
    of every folder."""
    out = {}
    for dirpath, dirs, files in os.walk(mnt):
        if os.path.basename(dirpath) in ("new", "cur"):
            for f in files:
                p = os.path.join(dirpath, f)
                out[os.path.relpath(p, mnt)] = \
                    open(p, "rb").read() if read else None
    return out


def older_index_and_20_more(m, tmp_path, lose, fsync, path=True):
    """On m's new store: 3 messages, a copy of the index (lose: of the
    unmounted store, or of the main file as a checkpoint left it while
    mounted, without the WAL that held what came after), 20 more (with
    fsync when fsync, records without a path unless path; in INBOX and
    .Sub), the copy put back (unmounted)."""
    md = m.mount().maildir()
    sub = m.maildir(".Sub")
    for i in range(3):
        deliver(md, f"old{i}")
    if lose == "lost_wal":
        subprocess.run(["sqlite3", str(m.store / "index.sqlite"),
                        "PRAGMA wal_checkpoint(FULL);"], check=True,
                       capture_output=True)
        shutil.copy(m.store / "index.sqlite", tmp_path / "old.sqlite")
    else:
        m.unmount()
        shutil.copy(m.store / "index.sqlite", tmp_path / "old.sqlite")
        m.mount()
    for i in range(20):
        deliver(md if i % 2 else sub, f"new{i}", fsync=fsync, path=path)
    m.unmount()
    put_back_index(m.store, tmp_path / "old.sqlite")


@pytest.mark.parametrize("lose", ["restored_backup", "lost_wal"])
def test_index_older_than_storage(tmp_path, lose):
    """3 messages, a copy of the index; 20 more closed without fsync (in
    INBOX and a folder) whose records carry no path; the old index put
    back.  check reports the unknown records, the mount cuts none of
    them, and rebuild brings all 23 back into their folders (B
    metadata), saying how many it recovered.  (Records with their path
    the mount puts back itself:
    test_mail_an_older_index_lost_is_put_back_at_mount.)"""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        older_index_and_20_more(m, tmp_path, lose, fsync=False, path=False)
        sizes = {p.name: p.stat().st_size for p in (m.store / "storage").iterdir()}

        rc, out = adm("check", m.store)
        assert rc != 0 and "unknown to the index" in out, out

        m.mount()  # recovery must cut no whole record
        log = m.log_text()
        m.unmount()
        after = {p.name: p.stat().st_size for p in (m.store / "storage").iterdir()}
        assert after == sizes, (sizes, after, log)
        assert "kept" in log, log
        rc, out = adm("check", m.store)
        assert rc != 0 and "unknown to the index" in out, out

        rc, out = adm("rebuild", m.store)
        assert rc == 0, out
        assert "recovered 20 messages" in out, out
        m.mount()
        got = all_messages(m.mnt)
        names = {os.path.basename(k).split(".")[0] if ".rebuild" not in k
                 else None for k in got}
        bodies = sorted(got.values())
        want = sorted([body(f"old{i}") for i in range(3)] +
                      [body(f"new{i}") for i in range(20)])
        assert bodies == want, sorted(got)
        # each in its folder (B metadata): new0, new2, ... in .Sub
        for k, v in got.items():
            if v.startswith(b"From: x@example.org\nSubject: new"):
                i = int(v.split(b"Subject: new")[1].split(b"\n")[0])
                assert k.startswith(".Sub/") == (i % 2 == 0), k
        assert names
        m.unmount()
        rc, out = adm("check", m.store)
        assert rc == 0, out
    finally:
        m.kill() if m.proc is not None else m.unmount()


@pytest.mark.parametrize("fsync", [True, False], ids=["fsynced", "closed"])
def test_mail_an_older_index_lost_is_put_back_at_mount(tmp_path, fsync):
    """The same with the records as deliveries leave them: closed or
    fsync()ed, each carries its path (metadata L), and the mount puts
    them back under their names - in new/, where the delivery renamed
    them from tmp/ - with no rebuild; the store is whole for check at
    once."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        older_index_and_20_more(m, tmp_path, "restored_backup", fsync=fsync)
        sizes = {p.name: p.stat().st_size for p in (m.store / "storage").iterdir()}
        # check, before that mount, says what it will do: no problem.
        rc, out = adm("check", m.store)
        assert rc == 0 and "the next mount puts them back" in out, out

        m.mount()
        log = m.log_text()
        got = all_messages(m.mnt)
        m.unmount()
        after = {p.name: p.stat().st_size for p in (m.store / "storage").iterdir()}
        assert after == sizes, (sizes, after, log)
        assert "20 messages whose index rows the crash lost put back at " \
            "their paths" in log, log
        want = {f"new/old{i}": body(f"old{i}") for i in range(3)}
        want.update({(f"new/new{i}" if i % 2 else f".Sub/new/new{i}"):
                     body(f"new{i}") for i in range(20)})
        assert got == want, sorted(got)
        rc, out = adm("check", m.store)
        assert rc == 0, out
    finally:
        m.kill() if m.proc is not None else m.unmount()


def restore_index_copied_mid_delivery(m, tmp_path, fsync=False, path=True):
    """On the unmounted store of m: 3 deliveries, then a copy of the index
    taken while a 4th ("late") was being written, which then finished
    (with an fsync when fsync; a record without a path unless path: see
    deliver) and was acknowledged (renamed into new/); the copy put
    back.  Returns the maildir (not mounted)."""
    md = m.mount().maildir()
    for i in range(3):
        deliver(md, f"old{i}")
    fd = os.open(md / "tmp" / "late", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, body("late")[:100])
    # The create's commit is deferred (DBOX_DEFER_MS, 10 ms): the copy
    # below is one that holds the WRITING row, taken after it.
    time.sleep(0.1)
    # The copy, taken now through SQLite's backup API (one snapshot).
    live = sqlite3.connect(f"file:{m.store / 'index.sqlite'}?mode=ro",
                           uri=True)
    old = sqlite3.connect(tmp_path / "old.sqlite")
    live.backup(old)
    live.close()
    assert old.execute("SELECT e.name FROM message m JOIN entry e"
                       " ON e.ino = m.ino WHERE m.state = 1"
                       ).fetchall() == [(b"late",)]
    old.close()
    os.write(fd, body("late")[100:])
    if not path:
        os.link(md / "tmp" / "late", md / "tmp" / "late.2")
    if fsync:
        os.fsync(fd)
    os.close(fd)
    if not path:
        os.unlink(md / "tmp" / "late.2")
    os.rename(md / "tmp" / "late", md / "new" / "late")
    assert (md / "new" / "late").read_bytes() == body("late")
    m.unmount()
    put_back_index(m.store, tmp_path / "old.sqlite")
    return md


@pytest.mark.parametrize("fsync", [True, False], ids=["fsynced", "closed"])
def test_index_copied_mid_delivery_is_finished_in_place(tmp_path, fsync):
    """An index copied while a delivery was in flight, that delivery
    finished (closed, or fsync()ed and closed) and renamed into new/: its
    record carries its path, and the mount finishes the delivery the
    index has as WRITING (by its GUID) with that record, and moves it
    from tmp/ into new/, where it was renamed after its close; no copy in
    lost+found/ is needed."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = restore_index_copied_mid_delivery(m, tmp_path, fsync=fsync)
        m.mount()
        log = m.log_text()
        assert sorted(os.listdir(md / "new")) == ["late", "old0", "old1", "old2"]
        assert os.listdir(md / "tmp") == [], log
        assert (md / "new" / "late").read_bytes() == body("late")
        m.unmount()
        assert not (m.store / "lost+found").exists(), log
        rc, out = adm("check", m.store)
        assert rc == 0, out
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_index_copied_mid_delivery_loses_no_delivery(tmp_path):
    """An index copied while a delivery was in flight (a backup tool
    copying index.sqlite of a mounted store) names that delivery as
    WRITING at its offset.  The delivery then finished: close, rename
    into new/, acknowledged.  With that copy put back, the mount
    finds a whole record where the index has a write in flight, one
    without a path to put it back at: it must not cut it silently (it did: the message was gone for good, and
    check and rebuild found nothing) but keep a copy that dboxadm cat
    shows.  A delivery that really was in flight at a crash (no whole
    record yet) is still dropped without a copy."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = restore_index_copied_mid_delivery(m, tmp_path, path=False)
        m.mount()
        log = m.log_text()
        assert sorted(os.listdir(md / "new")) == ["old0", "old1", "old2"]
        m.unmount()
        copies = list((m.store / "lost+found").iterdir())
        assert len(copies) == 1, (copies, log)
        assert "where the index has a write in flight" in log, log
        r = subprocess.run([str(DBOXADM), "cat", m.store, copies[0], "0"],
                           capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout == body("late"), r
        # At an offset where no record starts: one line naming the copy
        # (it said "m.0 offset 1: corrupt message header" first).
        r = subprocess.run([str(DBOXADM), "cat", m.store, copies[0], "1"],
                           capture_output=True, timeout=60)
        assert r.returncode == 1, r
        assert r.stderr.decode().splitlines() == [
            f"dboxadm: {copies[0]}: offset 1: no whole record there (dboxadm "
            "dump lists the records of an m.N; check says how many whole "
            "records a lost+found copy holds)"], r.stderr
        rc, out = adm("check", m.store)
        assert rc == 0 and "holds 1 whole message records" in out, out

        # A delivery in flight at a crash: dropped, and no copy made.
        shutil.rmtree(m.store / "lost+found")
        m.mount()
        fd = os.open(md / "tmp" / "cut", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, body("cut"))
        m.kill()
        try:
            os.close(fd)
        except OSError:
            pass  # ENOTCONN: the mount is gone
        m.mount()
        log = m.log_text()
        assert os.listdir(md / "tmp") == [], log
        m.unmount()
        assert not (m.store / "lost+found").exists() or \
            list((m.store / "lost+found").iterdir()) == [], log
        assert "unfinished" in log, log
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_a_cut_recovery_could_not_make_is_judged_alike_next_time(tmp_path):
    """Recovery that cannot keep its copy (lost+found/ unusable: a full
    disk, here a plain file in its place) cuts nothing, and the next
    recovery must judge those bytes as this one did: the delivery's
    WRITING row that said where the write in flight starts is gone by
    then, and without a mark of its own the whole record there was taken
    for mail an older index does not know - kept for ever, a problem for
    every check, and a duplicate for rebuild (an attack run found it
    after kills during purge on a full disk)."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = restore_index_copied_mid_delivery(m, tmp_path, path=False)
        (m.store / "lost+found").write_bytes(b"in the way\n")
        (file_id,), = index_rows(m.store, "SELECT DISTINCT file_id FROM message")
        size = (m.store / "storage" / f"m.{file_id}").stat().st_size
        m.mount()
        assert sorted(os.listdir(md / "new")) == ["old0", "old1", "old2"]
        m.unmount()
        assert (m.store / "storage" / f"m.{file_id}").stat().st_size == size
        os.unlink(m.store / "lost+found")

        m.mount()
        log = m.log_text()
        assert "where the index has a write in flight" in log, log
        m.unmount()
        copies = list((m.store / "lost+found").iterdir())
        assert len(copies) == 1, (copies, log)
        r = subprocess.run([str(DBOXADM), "cat", m.store, copies[0], "0"],
                           capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stdout == body("late"), r
        rc, out = adm("check", m.store)
        assert rc == 0 and "unknown to the index" not in out, out
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_a_stale_uncut_mark_cuts_no_mail(tmp_path):
    """An uncut mark that no longer fits its file - the index put back
    from a copy taken while the mark was set, mail delivered since - must
    not make recovery take that mail for a write in flight (an attack run
    saw it cut into lost+found, out of its folders).  That mail's records
    carry no path, or recovery would put them back before it looks at
    the mark.  The mark holds only
    while the file has the size it had; a backup's index carries none."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md, file_id = one_delivery(m)
        (end,), = index_rows(m.store, f"SELECT size FROM mfile WHERE file_id = {file_id}")
        db = sqlite3.connect(m.store / "index.sqlite")
        with db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?), (?, ?)",
                       (f"uncut.m.{file_id}", end, f"uncut_size.m.{file_id}", end))
        db.close()
        r = subprocess.run([str(DBOXADM), "backup", m.store, tmp_path / "bk"],
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r
        assert index_rows(tmp_path / "bk", "SELECT key FROM meta WHERE key LIKE 'uncut%'") == []
        shutil.copy(m.store / "index.sqlite", tmp_path / "old.sqlite")

        m.mount()
        deliver(md, "b", fsync=False, path=False)
        deliver(md, "c", fsync=False, path=False)
        m.unmount()
        put_back_index(m.store, tmp_path / "old.sqlite")
        size = (m.store / "storage" / f"m.{file_id}").stat().st_size
        m.mount()
        log = m.log_text()
        m.unmount()
        assert (m.store / "storage" / f"m.{file_id}").stat().st_size == size, log
        assert "2 whole records after the committed end" in log, log
        assert not (m.store / "lost+found").exists(), log
    finally:
        m.kill() if m.proc is not None else m.unmount()


def guid_span(store, name_like):
    """(m.N path, offset of the GUID value in it) of the message whose
    entry name starts with name_like."""
    (file_id, offset, guid), = [
        row[1:] for row in index_rows(
            store, "SELECT e.name, m.file_id, m.offset, m.guid FROM message m"
            " JOIN entry e ON e.ino = m.ino")
        if bytes(row[0]).startswith(name_like.encode())]
    path = store / "storage" / f"m.{file_id}"
    data = path.read_bytes()
    at = data.index(b"\nG" + guid.encode() + b"\n", offset) + 2
    return path, at


@pytest.mark.parametrize("flip", [b"zq", b"\n\xff", b"\x1b\xfe"])
def test_damaged_guid_is_no_expunge(tmp_path, flip):
    """Flip 2 bytes of one record's GUID: that message reads EIO, the others
    do not; rebuild keeps it under its old name and flags, reporting the
    damaged field; purge then deletes nothing of it; and rebuild
    --restore-all makes no name with raw damaged bytes."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir()
        sub = m.maildir(".Sub")
        for n in ("a", "b", "c"):
            deliver(md, n)
        deliver(sub, "d")
        os.rename(md / "new" / "b", md / "cur" / "b:2,FS")
        os.link(md / "cur" / "b:2,FS", sub / "cur" / "b-copy:2,S")
        os.unlink(md / "new" / "c")  # a real expunge, for contrast
        m.unmount()
        path, at = guid_span(m.store, "b:2,FS")
        data = bytearray(path.read_bytes())
        data[at + 5:at + 7] = flip
        path.write_bytes(bytes(data))

        m.mount()
        with pytest.raises(OSError) as e:
            (md / "cur" / "b:2,FS").read_bytes()
        assert e.value.errno == 5
        assert (md / "new" / "a").read_bytes() == body("a")
        assert (sub / "new" / "d").read_bytes() == body("d")
        m.unmount()
        rc, out = adm("check", m.store)
        assert rc != 0, out

        rc, out = adm("rebuild", m.store)
        assert rc == 0, out
        assert "damaged" in out, out
        assert not any(ord(ch) < 32 and ch != "\n" for ch in out), repr(out)
        rc, out = adm("purge", m.store)
        # A record that does not read whole is not copied: its file stays.
        assert rc == 0 or "not purged" in out, out
        m.mount()
        names = sorted(all_messages(m.mnt, read=False))
        assert "cur/b:2,FS" in names and ".Sub/cur/b-copy:2,S" in names, names
        assert "new/c" not in names
        assert os.stat(md / "cur" / "b:2,FS").st_nlink == 2
        try:
            got = (md / "cur" / "b:2,FS").read_bytes()
            assert got == body("b")
        except OSError as err:  # metadata unreadable: kept, still EIO
            assert err.errno == 5 and flip == b"\n\xff"
        m.unmount()
        # The body is still in storage/ after the purge.
        assert any(body("b") in p.read_bytes()
                   for p in (m.store / "storage").iterdir())

        rc, out = adm("rebuild", m.store, "--restore-all")
        assert rc == 0, out
        m.mount()
        for name in all_messages(m.mnt, read=False):
            assert re.fullmatch(r"[A-Za-z0-9._:,/+-]+", name), repr(name)
        m.unmount()
        # Without any index every record is restored under a name made
        # from its GUID: the damaged one too, if it reads whole.
        for f in m.store.glob("index.sqlite*"):
            f.unlink()
        rc, out = adm("rebuild", m.store)
        assert rc == 0, out
        m.mount()
        names = all_messages(m.mnt, read=False)
        assert len(names) >= 3, names  # a, b (its two names are one), d
        for name in names:
            assert re.fullmatch(r"[A-Za-z0-9._:,/+-]+", name), repr(name)
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_torn_tail_is_cut_with_a_copy(tmp_path):
    """Bytes after the last whole record of an m.N that no writer had in
    flight (half a record) are cut by the mount, but a copy is kept in
    STORE/lost+found/, which check lists; the whole records stay."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir()
        for n in ("a", "b"):
            deliver(md, n)
        m.unmount()
        (file_id, offset), = {r for r in index_rows(
            m.store, "SELECT file_id, offset FROM message")
            if r[1] == min(x[1] for x in index_rows(m.store, "SELECT file_id, offset FROM message"))}
        mfile = m.store / "storage" / f"m.{file_id}"
        data = mfile.read_bytes()
        torn = data[offset:offset + 100]  # half a record
        mfile.write_bytes(data + torn)
        m.mount()
        assert (md / "new" / "a").read_bytes() == body("a")
        assert (md / "new" / "b").read_bytes() == body("b")
        m.unmount()
        assert mfile.read_bytes() == data
        copies = list((m.store / "lost+found").iterdir())
        assert [c.read_bytes() for c in copies] == [torn], copies
        assert copies[0].name == f"m.{file_id}-{len(data)}"
        rc, out = adm("check", m.store)
        assert rc == 0 and f"lost+found/m.{file_id}-{len(data)}" in out, out
    finally:
        m.kill() if m.proc is not None else m.unmount()


def one_delivery(m):
    """Message "a" delivered through a mount of m's store, then unmounted:
    (the maildir, the file id of the m.N holding it)."""
    md = m.mount().maildir()
    deliver(md, "a")
    m.unmount()
    (file_id,), = index_rows(m.store, "SELECT DISTINCT file_id FROM message")
    return md, file_id


def test_a_save_killed_in_the_m_n_it_made_is_cut_without_a_copy(tmp_path):
    """A delivery that made a new m.N, killed before the commit of the
    file's row: the m.N the index does not know holds its header line and
    the record's placeholder header (with some body).  That is a save in
    flight, dropped as its delivery is - no copy in lost+found/ (helper-89
    found a 30-byte m.N-16 copy after such kills); bytes that are no
    placeholder are still copied first."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md, file_id = one_delivery(m)
        header = (m.store / "storage" / f"m.{file_id}").read_bytes().split(b"\n")[0] + b"\n"
        unsealed = b"\x01\x02W" + b" " * 26 + b"\n"
        (m.store / "storage" / f"m.{file_id + 1}").write_bytes(
            header + unsealed + b"From: x@example.org\nSubject: half")
        (m.store / "storage" / f"m.{file_id + 2}").write_bytes(
            header + b"\0" * 30 + b"From: x@example.org\nSubject: torn")
        m.mount()
        log = m.log_text()
        assert sorted(os.listdir(md / "new")) == ["a"], log
        m.unmount()
        copies = os.listdir(m.store / "lost+found")
        assert copies == [f"m.{file_id + 2}-{len(header)}"], (copies, log)
        assert (m.store / "storage" / f"m.{file_id + 1}").read_bytes() == header
        rc, out = adm("check", m.store)
        assert rc == 0, out
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_second_cut_at_the_same_offset_keeps_the_first_copy(tmp_path):
    """Two crashes that leave bytes past the same committed end of one m.N
    (the pool appends there again after the first cut) keep both copies
    in lost+found/: the first may be the only copy of a delivery."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md, file_id = one_delivery(m)
        mfile = m.store / "storage" / f"m.{file_id}"
        data = mfile.read_bytes()
        tails = [b"first torn record " * 10, b"second, other bytes " * 7]
        for tail in tails:
            mfile.write_bytes(data + tail)
            m.mount()
            assert (md / "new" / "a").read_bytes() == body("a")
            m.unmount()
            assert mfile.read_bytes() == data
        copies = sorted((m.store / "lost+found").iterdir())
        assert sorted(c.read_bytes() for c in copies) == sorted(tails), copies
        assert copies[0].name == f"m.{file_id}-{len(data)}"
        rc, out = adm("check", m.store)
        assert rc == 0 and all(f"lost+found/{c.name}" in out for c in copies), out
    finally:
        m.kill() if m.proc is not None else m.unmount()


def record_at(store, name):
    """(m.N path, offset of the record) of the message named name."""
    (file_id, offset), = [
        row[1:] for row in index_rows(
            store, "SELECT e.name, m.file_id, m.offset FROM message m"
            " JOIN entry e ON e.ino = m.ino")
        if bytes(row[0]) == name.encode()]
    return store / "storage" / f"m.{file_id}", offset


# Bytes of the record's message header: its magic (0x01 0x02), its type
# 'N', and digits of its hex body size.
@pytest.mark.parametrize("at,xor", [(0, 0x01), (2, 0x20), (14, 0x01),
                                    (28, 0xff)])
@pytest.mark.parametrize("first", ["rebuild", "purge"])
def test_damaged_message_header_is_no_expunge(tmp_path, at, xor, first):
    """One flipped byte in a record's message header (magic, type or size
    field) with its body and metadata intact: rebuild keeps the message
    under its name at the location the old index gives (it reads EIO),
    and no purge, before or after the rebuild, deletes the body."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir()
        for n in ("a", "b", "c"):
            deliver(md, n)
        m.unmount()
        path, offset = record_at(m.store, "a")
        data = bytearray(path.read_bytes())
        data[offset + at] ^= xor
        path.write_bytes(bytes(data))

        steps = ["rebuild", "purge"] if first == "rebuild" else \
            ["purge", "rebuild", "purge"]
        for step in steps:
            rc, out = adm(step, m.store)
            assert rc == 0 or "not purged" in out, (step, out)
        # The intact body is still in storage/.
        assert any(body("a") in p.read_bytes()
                   for p in (m.store / "storage").iterdir())
        m.mount()
        names = all_messages(m.mnt, read=False)
        assert "new/a" in names, names
        assert (md / "new" / "b").read_bytes() == body("b")
        assert (md / "new" / "c").read_bytes() == body("c")
        with pytest.raises(OSError) as e:
            (md / "new" / "a").read_bytes()
        assert e.value.errno == 5
        m.unmount()
        rc, out = adm("check", m.store)
        assert rc != 0, out
        # check says what to do (helper-80: nothing did, and the damage
        # stopped a schedule's purge for good); the last step of the
        # repair it names, an expunge of the message, makes it clean.
        assert "advice: bytes of mail are missing or damaged" in out, out
        assert "Repairing a store" in out, out
        m.mount()
        os.unlink(md / "new" / "a")
        # The kernel may still hold the inode at the unmount (a name
        # without a file then: deleted at the next mount).
        m.remount()
        m.unmount()
        rc, out = adm("check", m.store)
        assert rc == 0 and "advice:" not in out, out
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_rebuild_without_index_keeps_unparsable_bytes(tmp_path):
    """No index at all and one record's message header damaged: rebuild
    cannot name that message, but a copy of its bytes is kept in
    STORE/lost+found/ before a purge gives the m.N's space back, so the
    intact body is never deleted with no copy left."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir()
        for n in ("a", "b", "c"):
            deliver(md, n)
        deliver(md, "x")
        os.unlink(md / "new" / "x")  # gives purge something to do
        m.unmount()
        path, offset = record_at(m.store, "a")
        data = bytearray(path.read_bytes())
        data[offset + 14] ^= 0x01
        path.write_bytes(bytes(data))
        for f in m.store.glob("index.sqlite*"):
            if not f.name.endswith("-reserve"):
                f.unlink()
        rc, out = adm("rebuild", m.store)
        assert rc == 0, out
        assert "lost+found/" in out, out
        rc, out = adm("purge", m.store)
        assert rc == 0, out
        kept = list((m.store / "lost+found").iterdir())
        assert any(body("a") in p.read_bytes() for p in kept), kept
        m.mount()
        got = all_messages(m.mnt)
        assert sorted(got.values()) == sorted([body("b"), body("c")]) or \
            sorted(got.values()) == sorted([body("b"), body("c"), body("x")])
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_backup_copied_over_a_crashed_store_takes_no_more_changes(tmp_path):
    """A backup put back with `cp -a BACKUP/. STORE/` over a store whose
    daemon was killed: SQLite replays the WAL the crash left onto the
    backup's index.sqlite, pages of another state (helper-52: listings
    failed with EIO, names read other messages' bytes, and deliveries
    were acknowledged into the damaged index, most of them unlisted
    after).  The mount checks such an index in the background and from
    the damage on makes no change to it (EIO, said in the log); rebuild
    then makes the store whole, every name reading its own message.
    Whether SQLite's check sees the damage depends on where the store's
    last checkpoint fell (about one run in six it does not: the test
    failed then); when it does not, no name may read another message's
    bytes, and rebuild makes the store whole all the same."""
    store, mnt, bk = tmp_path / "store", tmp_path / "mnt", tmp_path / "bk"
    m = Mount(store, mnt)
    m.mount()
    try:
        md = mnt / "in"
        for sub in ("cur", "new", "tmp"):
            (md / sub).mkdir(parents=True)
        for i in range(300):
            deliver(md, f"m{i}", fsync=False)
        rc, out = adm("backup", store, bk)
        assert rc == 0, out
        for i in range(300, 600):
            deliver(md, f"m{i}", fsync=False)
        for i in range(1, 300, 2):
            os.unlink(md / "new" / f"m{i}")
        m.kill()
        assert os.path.getsize(store / "index.sqlite-wal") > 0
        subprocess.run(["cp", "-a", f"{bk}/.", str(store)], check=True)
        m.mount()
        for _ in range(600):
            if "is damaged" in m.log_text() or "crash: sound" in m.log_text():
                break
            time.sleep(0.1)
        damaged = "is damaged" in m.log_text()
        assert damaged or "crash: sound" in m.log_text(), m.log_text()[-3000:]
        if damaged:
            with pytest.raises(OSError) as e:
                deliver(md, "after", fsync=False)
            assert e.value.errno == errno.EIO
    finally:
        m.unmount()
    if not damaged:
        # SQLite's check found the mixed index sound (it checks structure,
        # not that rows agree: whether it does depends on where the
        # store's last checkpoint fell).  No name may read another
        # message's bytes; a message whose row the mix broke reads EIO.
        m.mount()
        try:
            for dirpath, dirs, files in os.walk(mnt / "in"):
                for f in files:
                    try:
                        data = open(os.path.join(dirpath, f), "rb").read()
                    except OSError as e:
                        assert e.errno == errno.EIO, e
                        continue
                    assert data == body(f) or f == "after", f
        finally:
            m.unmount()
    rc, out = adm("check", store)
    if damaged:
        assert rc != 0 and "malformed" in out, out
    rc, out = adm("rebuild", store)
    assert rc == 0, out
    rc, out = adm("check", store)
    assert rc == 0, out
    m.mount()
    try:
        got = all_messages(mnt)
        for name, data in got.items():
            assert data == body(data.split(b"Subject: ")[1].split(b"\n")[0].decode()), name
        bodies = set(got.values())
        assert all(body(f"m{i}") in bodies for i in range(0, 300, 2))
        assert body("after") not in bodies
    finally:
        m.unmount()


def test_rebuild_restores_mail_owned_as_its_folder(tmp_path):
    """A store of root's whose folder Dovecot keeps as user mail (a root
    mount with allow_other, docs/dovecot.md): a message rebuild restores
    with a new name whose record has no owner (A: written with the path,
    which a message with two names at its close does not get) belongs to
    the folder's owner,
    mode as the folder less the execute bits (they were root's 0600, and
    Dovecot could not read them: helper-62).  One whose fsync recorded
    its mode, owner and group (metadata A) gets those back."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir(".Shared")
        for sub in ("", "cur", "new", "tmp"):
            os.chown(md / sub, 8, 8)  # mail:mail
            os.chmod(md / sub, 0o750)
        deliver(md, "old")
        m.unmount()
        shutil.copy(m.store / "index.sqlite", tmp_path / "old.sqlite")
        m.mount()
        deliver(md, "new", fsync=False, path=False)
        fd = os.open(md / "tmp" / "own", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, body("own"))
        os.fchown(fd, 1000, 1000)
        os.fchmod(fd, 0o604)
        os.fsync(fd)
        os.close(fd)
        m.unmount()
        put_back_index(m.store, tmp_path / "old.sqlite")
        rc, out = adm("rebuild", m.store)
        assert rc == 0 and "recovered 2 messages" in out, out
        m.mount()
        restored = {p.read_bytes(): p.stat() for p in (md / "cur").iterdir()
                    if ".rebuild" in p.name}
        assert sorted(restored) == sorted([body("new"), body("own")]), \
            list((md / "cur").iterdir())
        got = {b: (st.st_uid, st.st_gid, oct(st.st_mode & 0o7777))
               for b, st in restored.items()}
        assert got[body("new")] == (8, 8, oct(0o640))
        assert got[body("own")] == (1000, 1000, oct(0o604))
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_older_index_and_a_purge_that_moved_a_message(tmp_path):
    """An index copied before a purge moved a message to a new m.N: that
    message's row names a record that is gone, and its purge copy lies
    past the committed end next to fsync()ed mail.  The copy is that
    message, moved (its row is pointed at it), not a copy to leave out:
    taken for one, the next purge deleted it (helper-64)."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir()
        deliver(md, "junk")
        deliver(md, "keep")
        m.unmount()
        shutil.copy(m.store / "index.sqlite", tmp_path / "old.sqlite")
        m.mount()
        os.unlink(md / "new" / "junk")
        rc, out = adm("purge", m.store)
        assert rc == 0, out
        deliver(md, "late")
        m.unmount()
        put_back_index(m.store, tmp_path / "old.sqlite")
        m.mount()
        log = m.log_text()
        assert (md / "new" / "keep").read_bytes() == body("keep"), log
        assert (md / "new" / "late").read_bytes() == body("late"), log
        m.unmount()
        # (junk's row of the old index names the m.N the purge removed:
        # purge says so and leaves it to rebuild.)
        rc, out = adm("purge", m.store)
        assert "m.1: No such file" in out, out
        m.mount()
        assert (md / "new" / "keep").read_bytes() == body("keep")
        assert (md / "new" / "late").read_bytes() == body("late")
        m.unmount()
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_a_missing_mfile_without_messages_is_no_error(tmp_path):
    """An m.N the index knows but the disk lost, which no message names
    (made just before a crash that took it: a pool file, a purge's or a
    copy's), loses nothing: the mount says so once, without the EIO
    error an m.N with messages gets (helper-73: 437 such alarming lines
    in a power-loss run).  The one with a message still gets the error."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir()
        deliver(md, "a")
        m.unmount()
        db = sqlite3.connect(m.store / "index.sqlite")
        db.execute("INSERT INTO mfile (file_id, size) VALUES (9, 16)")
        db.commit()
        db.close()
        m.mount()
        log = m.log_text()
        assert "m.9: not on disk, and no message is stored in it" in log, log
        assert "fail with EIO" not in log, log
        assert (md / "new" / "a").read_bytes() == body("a")
        m.unmount()
        (m.store / "storage" / "m.1").rename(tmp_path / "m.1")
        m.mount()
        assert "m.1: No such file or directory; its messages will fail with EIO" \
            in m.log_text()
        m.unmount()
        (tmp_path / "m.1").rename(m.store / "storage" / "m.1")
    finally:
        m.kill() if m.proc is not None else m.unmount()


def test_check_reports_plain_files_when_files_dir_is_gone(tmp_path):
    """STORE/files/ missing, or a symbolic link (never followed): every
    plain file reads EIO on the mount, and check said 0 problems and
    exited 0 (helper-79 F3).  Each plain file is a problem now."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    try:
        md = m.mount().maildir()
        deliver(md, "a")
        (md / "dovecot-uidlist").write_bytes(b"3 V1 N2\n")
        (md / ".mbsyncstate").write_bytes(b"state\n")
        m.unmount()
        files = m.store / "files"
        files.rename(tmp_path / "files.away")
        rc, out = adm("check", m.store)
        assert rc == 1, out
        assert out.count("its directory is missing") == 2, out
        # Put files/ back first: a rebuild would forget those plain files
        # (helper-81), and the mail advice says nothing of rebuild here.
        assert "advice: plain files" in out and "before anything else" in out
        assert "bytes of mail are missing" not in out, out
        decoy = tmp_path / "decoy"
        decoy.mkdir()
        files.symlink_to(decoy)
        rc, out = adm("check", m.store)
        assert rc == 1 and out.count("its directory is a symbolic link") == 2, out
        files.unlink()
        (tmp_path / "files.away").rename(files)
        rc, out = adm("check", m.store)
        assert rc == 0, out
    finally:
        m.kill() if m.proc is not None else m.unmount()
