"""One damaged row of the index loses nothing else (helper-61: a user
controls every byte of their store, and root runs dboxadm and mounts on
it).  Each case imports a small maildir, damages one row with SQLite, and
checks that the mount and dboxadm still serve every other message with
its bytes, say what is wrong, and neither crash nor cut."""
import os
import sqlite3
import subprocess

import pytest

from conftest import DBOXADM, Mount


def adm(*args):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                       text=True, errors="replace", timeout=300)
    return r.returncode, r.stdout + r.stderr


def messages(n=6):
    return {f"m{i}:2,S": (f"From: a@example.org\nSubject: {i}\n\n").encode() +
            b"%d" % i * 300 + b"\n" for i in range(1, n + 1)}


def make_store(tmp_path, n=6):
    src = tmp_path / "md"
    for sub in ("cur", "new", "tmp"):
        (src / sub).mkdir(parents=True)
    mail = messages(n)
    for name, data in mail.items():
        (src / "cur" / name).write_bytes(data)
    store = tmp_path / "store"
    rc, out = adm("import", store, src)
    assert rc == 0, out
    return store, mail


def damage(store, sql, *args):
    db = sqlite3.connect(store / "index.sqlite")
    with db:
        n = db.execute(sql, args).rowcount
    db.close()
    assert n >= 1, sql


def ino_of(name):
    return f"(SELECT ino FROM entry WHERE CAST(name AS TEXT) = '{name}')"


def served(mnt):
    cur = mnt / "cur"
    return {name: (cur / name).read_bytes() for name in os.listdir(cur)}


def test_a_name_no_directory_can_hold_hides_nothing_else(tmp_path):
    """A name with '/' made the kernel fail the whole listing (EIO): every
    other message of the folder was invisible."""
    store, mail = make_store(tmp_path)
    damage(store, "UPDATE entry SET name = CAST('a/b' AS BLOB) WHERE "
           "CAST(name AS TEXT) = 'm1:2,S'")
    m = Mount(store, tmp_path / "mnt").mount()
    try:
        del mail["m1:2,S"]
        assert served(m.mnt) == mail
        assert "names no directory can hold" in m.log_text()
    finally:
        m.unmount()
    rc, out = adm("check", store)
    assert rc != 0 and "not a valid file name" in out, out


def test_a_named_message_with_link_count_zero_is_kept(tmp_path):
    """A link count of 0 on a message that still has its name: the mount's
    recovery took it for a file unlinked while open and deleted it (the
    next purge then its bytes)."""
    store, mail = make_store(tmp_path)
    damage(store, f"UPDATE inode SET nlink = 0 WHERE ino = {ino_of('m1:2,S')}")
    m = Mount(store, tmp_path / "mnt").mount()
    try:
        assert served(m.mnt) == mail
        assert (m.mnt / "cur" / "m1:2,S").stat().st_nlink == 1
    finally:
        m.unmount()
    rc, out = adm("purge", store)
    assert rc == 0, out
    rc, out = adm("check", store)
    assert rc == 0, out
    m = Mount(store, tmp_path / "mnt").mount()
    try:
        assert served(m.mnt) == mail
    finally:
        m.unmount()


def test_a_lowered_committed_end_cuts_no_committed_record(tmp_path):
    """The committed end of m.1 lowered into the middle of a record: the
    mount's recovery cut every record after it (the messages the index
    still named) out of m.1 into lost+found/."""
    store, mail = make_store(tmp_path)
    size = os.path.getsize(store / "storage" / "m.1")
    damage(store, "UPDATE mfile SET size = size / 2 WHERE file_id = 1")
    m = Mount(store, tmp_path / "mnt").mount()
    try:
        assert served(m.mnt) == mail
        assert "a damaged row" in m.log_text()
    finally:
        m.unmount()
    assert os.path.getsize(store / "storage" / "m.1") == size
    assert not (store / "lost+found").exists() or \
        os.listdir(store / "lost+found") == []
    rc, out = adm("check", store)
    assert rc == 0, out


def test_an_empty_symlink_target_is_an_error_not_a_crash(tmp_path):
    """SQLite gives NULL for an empty blob: strndup(NULL) in the daemon
    (root's, for a user's store) and in export."""
    store, mail = make_store(tmp_path)
    m = Mount(store, tmp_path / "mnt").mount()
    try:
        os.symlink("cur", m.mnt / "link")
    finally:
        m.unmount()
    damage(store, "UPDATE symlink SET target = CAST('' AS BLOB)")
    m = Mount(store, tmp_path / "mnt").mount()
    try:
        with pytest.raises(OSError) as e:
            os.readlink(m.mnt / "link")
        assert e.value.errno == 5  # EIO
        assert served(m.mnt) == mail
    finally:
        m.unmount()
    rc, out = adm("export", store, tmp_path / "out")
    assert "empty target" in out, out
    for name, data in mail.items():
        assert (tmp_path / "out" / "cur" / name).read_bytes() == data


def test_check_names_a_problem_under_a_broken_folder_chain(tmp_path):
    """check's path of a message whose folder has no name freed the
    previous component twice (glibc aborted root's check)."""
    store, mail = make_store(tmp_path)
    damage(store, "UPDATE message SET body_size = body_size + 7 WHERE "
           f"ino = {ino_of('m1:2,S')}")
    damage(store, "DELETE FROM entry WHERE CAST(name AS TEXT) = 'cur'")
    rc, out = adm("check", store)
    assert rc == 1, out
    assert "problem" in out and "Aborted" not in out and rc != -6, out


def test_stats_of_a_store_without_mfiles(tmp_path):
    store = tmp_path / "store"
    m = Mount(store, tmp_path / "mnt").mount()
    m.unmount()
    rc, out = adm("stats", store)
    assert rc == 0, out


@pytest.mark.parametrize("damage_sql", [
    # the two folders' entries point at each other: cut off the root
    "UPDATE entry SET parent = CASE CAST(name AS TEXT)"
    " WHEN '.Sent' THEN (SELECT ino FROM entry WHERE CAST(name AS TEXT) = '.Trash')"
    " ELSE (SELECT ino FROM entry WHERE CAST(name AS TEXT) = '.Sent') END"
    " WHERE CAST(name AS TEXT) IN ('.Sent', '.Trash')",
    # a name no directory can hold
    "UPDATE entry SET name = CAST('a/b' AS BLOB) WHERE CAST(name AS TEXT) = 'm1:2,S'",
], ids=["folder-cycle", "slash-in-name"])
def test_rebuild_restores_messages_whose_names_it_cannot_place(tmp_path, damage_sql):
    """rebuild counted the messages of an unplaceable name as expunged
    ('left for purge'), and the next purge deleted them; they are live
    messages of the old index and come back, with new names, in the cur/
    of their folder."""
    src = tmp_path / "md"
    mail = {}
    for folder in ("", ".Sent", ".Trash"):
        for sub in ("cur", "new", "tmp"):
            (src / folder / sub).mkdir(parents=True, exist_ok=True)
        for i in range(1, 4):
            data = f"From: a@example.org\nSubject: {folder} {i}\n\nbody {i}\n".encode()
            (src / folder / "cur" / f"m{i}:2,S").write_bytes(data)
            mail.setdefault(folder, set()).add(data)
    store = tmp_path / "store"
    rc, out = adm("import", store, src)
    assert rc == 0, out
    damage(store, damage_sql)
    rc, out = adm("rebuild", store)
    assert rc == 0, out
    assert "0 expunged records" in out, out
    rc, out = adm("purge", store)
    assert rc == 0, out
    rc, out = adm("export", store, tmp_path / "out")
    assert rc == 0, out
    for folder, bodies in mail.items():
        got = set()
        for sub in ("cur", "new"):
            d = tmp_path / "out" / folder / sub
            got |= {p.read_bytes() for p in d.iterdir()} if d.exists() else set()
        assert got == bodies, folder


def test_a_planted_last_mfile_number_does_not_wrap(tmp_path):
    """storage/m.4294967295 planted: the next m.N number wrapped to 0 and
    then to 1 (m.0 was made, then every new m.N failed with EEXIST and
    check called m.0's message unreadable).  Now a new m.N fails with
    ENOSPC, said in the log, and nothing else changes."""
    store, mail = make_store(tmp_path)
    (store / "storage" / "m.4294967295").write_bytes(b"xxxxxxxxx")
    m = Mount(store, tmp_path / "mnt", options=["-o", "rotate_size=1"]).mount()
    try:
        with pytest.raises(OSError) as e:
            (m.mnt / "cur" / "new:2,").write_bytes(b"Subject: new\n\nx\n")
        assert e.value.errno == 28  # ENOSPC
        assert "no m.N number is left" in m.log_text()
        served_now = served(m.mnt)
        served_now.pop("new:2,", None)  # its create went through, empty
        assert served_now == mail
    finally:
        m.unmount()
    assert sorted(os.listdir(store / "storage")) == ["m.1", "m.4294967295"]


def test_empty_names_and_a_planted_fifo_are_errors_not_crashes(tmp_path):
    """SQLite's NULL for an empty blob reached memcpy/strndup/bsearch
    (UBSan aborts in the daemon and dboxadm); a FIFO planted as a plain
    file's backing file was logged as 'Success' after a read of an
    unset mode."""
    store, mail = make_store(tmp_path)
    m = Mount(store, tmp_path / "mnt", options=["-o", "user_xattr"]).mount()
    try:
        (m.mnt / "notes").write_bytes(b"plain\n")
        os.setxattr(m.mnt / "cur", "user.a", b"1")
    finally:
        m.unmount()
    damage(store, "UPDATE xattr SET name = CAST('' AS BLOB)")
    damage(store, "UPDATE entry SET name = CAST('' AS BLOB) WHERE "
           "CAST(name AS TEXT) = 'm2:2,S'")
    backing = next(p for p in (store / "files").iterdir())
    os.unlink(backing)
    os.mkfifo(backing)
    m = Mount(store, tmp_path / "mnt", options=["-o", "user_xattr"]).mount()
    try:
        assert os.listxattr(m.mnt / "cur") == []
        with pytest.raises(OSError) as e:
            os.stat(m.mnt / "notes")
        assert e.value.errno == 5
        assert "not a regular file (a FIFO)" in m.log_text()
        del mail["m2:2,S"]
        assert served(m.mnt) == mail
    finally:
        m.unmount()
    for verb in ("check", "stats"):
        rc, out = adm(verb, store)
        assert rc in (0, 1) and "runtime error" not in out, out


@pytest.mark.parametrize("damage_sql", [
    # the row names an m.N the index does not know
    f"UPDATE message SET file_id = 77 WHERE ino = {ino_of('m2:2,S')}",
    # the row names another message's record (its own looks expunged)
    f"UPDATE message SET offset = (SELECT offset FROM message WHERE ino ="
    f" {ino_of('m1:2,S')}) WHERE ino = {ino_of('m2:2,S')}",
], ids=["unknown-mfile", "other-record"])
@pytest.mark.parametrize("mounted", [False, True], ids=["offline", "mounted"])
def test_purge_destroys_no_record_a_damaged_row_hides(tmp_path, damage_sql, mounted):
    """A row a damaged index moved elsewhere leaves its message's real
    record named by no row, so purge took it for garbage and removed m.1
    with the only copy of that message (helper-75; rebuild could no longer
    bring it back).  With a message expunged, so that m.1 has dead bytes
    to purge: purge now fails, says why, and keeps every record; a
    rebuild brings all the other messages back."""
    store, mail = make_store(tmp_path)
    m = Mount(store, tmp_path / "mnt")
    try:
        os.unlink(m.mount().mnt / "cur" / "m6:2,S")
        del mail["m6:2,S"]
        m.unmount()
        damage(store, damage_sql)
        if mounted:
            m.mount()
        rc, out = adm("purge", store)
    finally:
        m.unmount()
    assert rc != 0, out
    why = out + (m.log_text() if mounted else "")
    assert "the index is damaged" in why or "GUID differs from the index" in why, why
    os.unlink(store / "index.sqlite")
    for sidecar in ("index.sqlite-wal", "index.sqlite-shm"):
        (store / sidecar).unlink(missing_ok=True)
    rc, out = adm("rebuild", store)
    assert rc == 0, out
    rc, out = adm("export", store, tmp_path / "out")
    assert rc == 0, out
    got = {p.read_bytes() for sub in ("cur", "new")
           for p in (tmp_path / "out" / sub).iterdir()}
    assert set(mail.values()) <= got


def test_export_skips_one_damaged_row_and_goes_on(tmp_path):
    """One message row damaged - its kind says symbolic link, with no link
    row - stopped the whole export at that name ("index error; stopping
    the export": 1 of 20 messages written, helper-79 F4).  That item is
    now skipped and named, every other one is exported, and the exit
    status says something failed."""
    store, mail = make_store(tmp_path, n=20)
    victim = "m7:2,S"
    damage(store, f"UPDATE inode SET kind = 4 WHERE ino = {ino_of(victim)}")
    rc, out = adm("export", store, tmp_path / "out")
    assert rc == 1, out
    assert f"cur/{victim}" in out and "not exported" in out, out
    got = {p.name: p.read_bytes() for p in (tmp_path / "out" / "cur").iterdir()}
    assert got == {n: b for n, b in mail.items() if n != victim}


def test_export_says_what_a_detached_subtree_left_out(tmp_path):
    """A damaged parent takes a directory out of the tree (here cur/,
    made its own parent): export could not reach its messages and left
    them out with exit status 0 (helper-79 F4).  It now says how many
    names it did not reach and exits 1; a healthy store says nothing."""
    store, mail = make_store(tmp_path, n=6)
    rc, out = adm("export", store, tmp_path / "ok")
    assert rc == 0 and "not reached" not in out, out
    damage(store, "UPDATE entry SET parent = ino WHERE CAST(name AS TEXT) = 'cur'")
    rc, out = adm("export", store, tmp_path / "out")
    assert rc == 1, out
    assert "7 names of the index were not reached" in out, out
