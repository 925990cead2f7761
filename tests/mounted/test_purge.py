"""dboxadm purge and the mount's own purge, on real mounts.

Messages from the lkml corpus are written through the mount into several
small m.N files (rotate_size), some are expunged, and the purge must give
back exactly their bytes (stats byte counts and the file sizes on disk
agree), while every surviving message keeps its name, inode number, size,
mtime and bytes - also through a descriptor opened before the purge, and
for a message unlinked while open.  Dovecot's force-resync on a copy of
storage/ still finds every live message afterwards.
"""
import json
import os
import signal
import shutil
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import DBOXADM, index_rows, need_corpora
from dovecot_mdbox import Mdbox, dovecot_tmp  # noqa: F401

ROTATE = "rotate_size=32768"


def adm(*args, check_rc=None):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True, timeout=300)
    if check_rc is not None:
        assert r.returncode == check_rc, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return r


def stats(store):
    return json.loads(adm("stats", store, "--json", "--files", check_rc=0).stdout)


def file_of(store):
    """name -> (m.N file id, record size) of every message in cur/."""
    rows = index_rows(store, "SELECT e.name, m.file_id, m.record_size FROM entry e"
                             " JOIN message m ON m.ino = e.ino")
    return {n.decode(): (f, s) for n, f, s in rows}


def disk_bytes(store):
    return sum(p.stat().st_size for p in (store / "storage").glob("m.*"))


def fill(m, count=60, folder=""):
    """Write count corpus messages into folder/cur with distinct mtimes;
    returns name -> bytes."""
    mails = sorted((need_corpora() / "notmuch-lkml" / "cur").iterdir())[:count]
    assert len(mails) == count
    cur = m.maildir(folder) / "cur" if folder else m.mnt / "cur"
    out = {}
    for i, p in enumerate(mails):
        name = f"{1600000000 + i}.P{i}Q1.test:2,S"
        data = p.read_bytes()
        (cur / name).write_bytes(data)
        os.utime(cur / name, ns=(1_600_000_000_000_000_000 + i * 10**9 + 7,) * 2)
        out[name] = data
    return out


def snapshot(cur, names):
    """name -> (inode, size, mtime_ns, nlink)."""
    out = {}
    for n in names:
        st = os.stat(cur / n)
        out[n] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_nlink)
    return out


def drop_cache(fd):
    """Make the next read of fd go to dboxfs, not the page cache."""
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def check_bytes_kept(st_before, st_after):
    """Purge moved bytes, nothing else: live bytes and messages equal, no
    dead byte left, and the files on disk shrank by exactly the dead bytes
    and the headers of files removed (less those of files created)."""
    assert st_after["dead_bytes"] == 0
    assert st_after["pending_bytes"] == 0
    assert st_after["live_bytes"] == st_before["live_bytes"]
    assert st_after["messages"] == st_before["messages"]
    assert st_after["message_names"] == st_before["message_names"]
    assert st_after["mfile_bytes"] == st_after["live_bytes"] + st_after["header_bytes"]
    assert (st_before["mfile_bytes"] - st_after["mfile_bytes"]
            == st_before["dead_bytes"] + st_before["header_bytes"] - st_after["header_bytes"])
    assert all(f["dead_bytes"] == 0 for f in st_after["files"])


def test_purge_offline(tmp_path, make_mount):
    store = tmp_path / "store"
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", ROTATE + ",purge_threshold=0"])
    data = fill(m)
    cur = m.mnt / "cur"
    lists = m.maildir(".Lists") / "cur"
    names = sorted(data)
    os.link(cur / names[1], lists / names[1])      # one message, two names
    where = file_of(store)
    gone = names[::3]
    for n in gone:
        os.unlink(cur / n)
    kept = [n for n in names if n not in gone]
    before_attrs = snapshot(cur, kept)
    m.unmount()

    before = stats(store)
    assert before["dead_bytes"] == sum(where[n][1] for n in gone)
    assert before["mfile_bytes"] == disk_bytes(store)
    nfiles = len(before["files"])
    assert nfiles >= 6
    r = adm("purge", store, check_rc=0)
    assert b"files removed" in r.stdout
    after = stats(store)
    check_bytes_kept(before, after)
    assert after["mfile_bytes"] == disk_bytes(store)
    assert after["purge_runs"] == 1
    assert after["purge_bytes_freed"] > 0
    # Every file that held an expunged message is gone.
    emptied = {f"m.{where[n][0]}" for n in gone}
    assert not emptied & {f["file"] for f in after["files"]}
    assert all(not (store / "storage" / f).exists() for f in emptied)

    m.mount()
    assert snapshot(cur, kept) == before_attrs
    assert sorted(os.listdir(cur)) == kept
    for n in kept:
        assert (cur / n).read_bytes() == data[n]
    assert os.stat(lists / names[1]).st_ino == before_attrs[names[1]][0]
    assert (lists / names[1]).read_bytes() == data[names[1]]
    # Nothing more to do.
    m.unmount()
    r = adm("purge", store, check_rc=0)
    assert stats(store)["mfile_bytes"] == after["mfile_bytes"]


def test_mfile_numbers_are_not_handed_out_again(tmp_path, make_mount):
    """A purge that gives back every m.N (all mail expunged) left no
    trace of their numbers: the next mount started again at m.1
    (helper-87), against the rule that an m.N number is never used
    twice (backups, lost+found copies and purged.m.N marks name files
    by it).  The index remembers the highest one a purge forgot."""
    m = make_mount(options=["-o", "rotate_size=4096"])
    for i in range(12):
        (m.mnt / "cur" / f"{i}.x:2,S").write_bytes(b"Subject: %d\n\n%s\n" % (i, b"x" * 3000))
    highest = max(int(p.name[2:]) for p in (m.store / "storage").glob("m.*"))
    assert highest >= 3
    for p in list((m.mnt / "cur").iterdir()):
        os.unlink(p)
    m.unmount()
    adm("purge", m.store, check_rc=0)
    assert list((m.store / "storage").glob("m.*")) == []
    m.mount()
    (m.mnt / "cur" / "new.x:2,S").write_bytes(b"Subject: new\n\nnew\n")
    m.unmount()
    numbers = [int(p.name[2:]) for p in (m.store / "storage").glob("m.*")]
    assert numbers and min(numbers) > highest, (numbers, highest)
    adm("check", m.store, check_rc=0)


def test_purge_online_with_open_files(tmp_path, make_mount):
    """dboxadm purge against the mount: descriptors opened before (one of
    them on a message unlinked since) and readers running during the
    purge read the right bytes throughout."""
    store = tmp_path / "store"
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", ROTATE + ",purge_threshold=0"])
    data = fill(m)
    cur = m.mnt / "cur"
    names = sorted(data)
    where = file_of(store)
    in_m1 = [n for n in names if where[n][0] == 1]
    assert len(in_m1) >= 3
    held_name, unlinked_name = in_m1[1], in_m1[2]
    # Opened before the purge, not read yet (nothing in the page cache).
    held = os.open(cur / held_name, os.O_RDONLY)
    ghost = os.open(cur / unlinked_name, os.O_RDONLY)
    os.unlink(cur / unlinked_name)
    gone = [n for n in names[::2] if n not in (held_name, unlinked_name)]
    for n in gone:
        os.unlink(cur / n)
    kept = [n for n in names if n not in gone and n != unlinked_name]
    before_attrs = snapshot(cur, kept)
    before = stats(store)
    assert before["dead_bytes"] > 0

    errors, rounds, stop = [], [0], threading.Event()

    def reader():
        while not stop.is_set():
            for n in kept[:10]:
                if (cur / n).read_bytes() != data[n]:
                    errors.append(n)
            for fd, n in ((held, held_name), (ghost, unlinked_name)):
                drop_cache(fd)
                if os.pread(fd, len(data[n]) + 10, 0) != data[n]:
                    errors.append(n)
            rounds[0] += 1

    t = threading.Thread(target=reader)
    t.start()
    try:
        time.sleep(0.2)
        r = adm("purge", store, check_rc=0)
        time.sleep(0.2)
    finally:
        stop.set()
        t.join()
    assert b"purged by the mount" in r.stdout
    assert errors == []
    assert rounds[0] > 2
    # m.1 is gone from storage/ while the descriptors still read it.
    assert not (store / "storage" / "m.1").exists()
    # The space came back: all dead bytes but those of the message still
    # open (stats counts a message without a name as dead; purge moved it).
    ghost_size = where[unlinked_name][1]
    mid = stats(store)
    assert mid["dead_bytes"] == ghost_size
    assert mid["mfile_bytes"] == disk_bytes(store)
    assert (before["mfile_bytes"] - mid["mfile_bytes"]
            == before["dead_bytes"] - ghost_size + before["header_bytes"] - mid["header_bytes"])
    for fd, n in ((held, held_name), (ghost, unlinked_name)):
        drop_cache(fd)
        assert os.pread(fd, len(data[n]) + 10, 0) == data[n]
        assert os.fstat(fd).st_size == len(data[n])
    os.close(held)
    os.close(ghost)

    after = stats(store)
    # (live bytes count messages with a name: the unlinked one was not
    # counted before either; its record moved, and goes when closed.)
    assert after["live_bytes"] == before["live_bytes"]
    assert after["purge_runs"] == 1
    assert snapshot(cur, kept) == before_attrs
    for n in kept:
        assert (cur / n).read_bytes() == data[n]
    # After a remount, too (the switch is durable, recovery cuts nothing).
    m.remount()
    assert snapshot(cur, kept) == before_attrs
    for n in kept:
        assert (cur / n).read_bytes() == data[n]
    m.unmount()
    # The message unlinked while open was moved too; closed, its copy is
    # the only dead record, and the next purge takes it.
    st = stats(store)
    assert st["dead_bytes"] == where[unlinked_name][1]
    adm("purge", store, check_rc=0)
    st = stats(store)
    assert st["dead_bytes"] == 0
    assert st["mfile_bytes"] == disk_bytes(store)


def test_purge_automatic_threshold(tmp_path, make_mount):
    """-o purge_threshold=40: a sealed m.N that loses more than 40% of its
    bytes is purged by the mount by itself; one that loses less, and the
    m.N still taking mail, are not."""
    store = tmp_path / "store"
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", ROTATE + ",purge_threshold=40"])
    data = fill(m)
    cur = m.mnt / "cur"
    where = file_of(store)
    by_file = {}
    for n, (f, size) in sorted(where.items()):
        by_file.setdefault(f, []).append(n)
    last = max(by_file)
    heavy, light = 2, 3
    assert heavy < last and light < last and len(by_file[heavy]) >= 3
    gone = by_file[heavy][:-1] + by_file[light][:1] + by_file[last]
    for n in gone:
        os.unlink(cur / n)
    kept = [n for n in sorted(data) if n not in gone]
    before_attrs = snapshot(cur, kept)

    deadline = time.time() + 20
    while (store / "storage" / f"m.{heavy}").exists() and time.time() < deadline:
        time.sleep(0.2)
    assert not (store / "storage" / f"m.{heavy}").exists()
    st = stats(store)
    files = {f["file"]: f for f in st["files"]}
    assert f"m.{heavy}" not in files
    assert files[f"m.{light}"]["dead_bytes"] == where[by_file[light][0]][1]
    assert files[f"m.{last}"]["dead_bytes"] > 0        # still taking mail
    assert st["purge_runs"] >= 1
    assert snapshot(cur, kept) == before_attrs
    for n in kept:
        assert (cur / n).read_bytes() == data[n]


def test_dovecot_resync_after_purge(dovecot_tmp, make_mount):
    """Purge keeps storage/ a Dovecot mdbox: force-resync on a copy finds
    every live message, in the folder its B metadata names, byte-equal,
    and none of the expunged ones."""
    store = dovecot_tmp / "store"
    m = make_mount(store=store, mnt=dovecot_tmp / "mnt",
                   options=["-o", ROTATE + ",purge_threshold=0"])
    data = fill(m, count=30)
    lists = fill(m, count=10, folder=".Lists")
    names = sorted(data)
    for n in names[::3]:
        os.unlink(m.mnt / "cur" / n)
        del data[n]
    for n in sorted(lists)[::2]:
        os.unlink(m.mnt / ".Lists" / "cur" / n)
        del lists[n]
    adm("purge", store, check_rc=0)
    assert stats(store)["dead_bytes"] == 0
    m.unmount()

    live = dict(index_rows(store, "SELECT m.guid, e.name FROM message m"
                                  " JOIN entry e ON e.ino = m.ino"))
    root = dovecot_tmp / "mdbox"
    (root / "storage").mkdir(parents=True)
    for p in (store / "storage").glob("m.*"):
        shutil.copy(p, root / "storage" / p.name)
    dv = Mdbox(root, dovecot_tmp / "dovecot")
    # An empty root has no INBOX to resync: create it (that already
    # notices storage/ and rebuilds), then resync everything.
    dv.doveadm("mailbox", "create", "INBOX", check=False)
    dv.doveadm("force-resync", "*")
    found = dv.messages()
    assert sorted(t["guid"] for t in found) == sorted(live)
    for t in found:
        name = live[t["guid"]].decode()
        want = data.get(name) if t["mailbox"] == "INBOX" else lists.get(name)
        assert t["mailbox"] in ("INBOX", "Lists")
        assert want is not None, (t, name)
        assert dv.text(t["mailbox"], t["uid"]) == want
    assert len(found) == len(data) + len(lists)


def test_purge_refusals(tmp_path):
    assert adm("purge", tmp_path / "nostore", check_rc=2).stderr.startswith(b"dboxadm: ")
    assert adm("purge", tmp_path, "--timeout=x", check_rc=2).stderr
    assert adm("purge", "--help", check_rc=0).stdout.startswith(b"usage: dboxadm purge")


def purge_report(stdout):
    """The 'name  value' lines dboxadm purge prints -> {name: first number}."""
    out = {}
    for line in stdout.decode().splitlines():
        key, _, rest = line.partition("  ")
        if rest.strip():
            out[key.strip()] = int(rest.split()[0])
    return out


def expunged_every_third(tmp_path, make_mount):
    """A mount without automatic purge holding 40 messages in small m.N
    files, every third one expunged.  Returns (store, mount, {name:
    bytes}, sorted names, {name: (file, record size)}, expunged names)."""
    store = tmp_path / "store"
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", ROTATE + ",purge_threshold=0"])
    data = fill(m, count=40)
    names = sorted(data)
    where = file_of(store)
    gone = names[::3]
    for n in gone:
        os.unlink(m.mnt / "cur" / n)
    return store, m, data, names, where, gone


def test_purge_online_reports_bytes_given_back(tmp_path, make_mount):
    """The mount's purge prints what an offline one prints, and the
    numbers are the real ones: bytes freed = sizes of the m.N removed,
    moved = the live records that were in them, given back = the
    difference."""
    store, m, data, names, where, gone = expunged_every_third(tmp_path, make_mount)
    before = {f["file"]: f["bytes"] for f in stats(store)["files"]}
    r = adm("purge", store, check_rc=0)
    after = {f["file"] for f in stats(store)["files"]}
    removed = set(before) - after
    assert removed
    moved = sum(size for n, (f, size) in where.items()
                if n not in gone and f"m.{f}" in removed)
    rep = purge_report(r.stdout)
    assert b"purged by the mount" in r.stdout
    assert rep["files removed"] == len(removed)
    assert rep["records moved"] == sum(1 for n, (f, _) in where.items()
                                       if n not in gone and f"m.{f}" in removed)
    assert int(r.stdout.split(b"files removed")[1].split(b"(")[1].split()[0]) \
        == sum(before[f] for f in removed)
    assert int(r.stdout.split(b"records moved")[1].split(b"(")[1].split()[0]) == moved
    assert rep["bytes given back"] == sum(before[f] for f in removed) - moved
    for n in names:
        if n not in gone:
            assert (m.mnt / "cur" / n).read_bytes() == data[n]


def test_purge_online_failure_exits_1(tmp_path, make_mount):
    """A purge the mount could not finish (an m.N with a broken file
    header) makes dboxadm purge say so and exit 1; the other files are
    still purged and the broken one is kept."""
    store, m, data, names, where, gone = expunged_every_third(tmp_path, make_mount)
    dirty = sorted({where[n][0] for n in gone})
    assert len(dirty) >= 3
    broken = store / "storage" / f"m.{dirty[0]}"
    with open(broken, "r+b") as f:
        f.write(b"X")       # the version line of the file header
    r = adm("purge", store, check_rc=1)
    assert b"purged by the mount" in r.stdout
    assert b"the mount's purge failed" in r.stderr, r.stderr
    assert b"1 files could not be purged" in r.stderr, r.stderr
    assert purge_report(r.stdout)["files removed"] == len(dirty) - 1
    assert broken.exists()
    assert all(not (store / "storage" / f"m.{i}").exists() for i in dirty[1:])
    for n in names:
        if n not in gone and where[n][0] != dirty[0]:
            assert (m.mnt / "cur" / n).read_bytes() == data[n]


def stats_purge_lines(store):
    """The purge lines of `dboxadm stats` (text), as purge_report reads them."""
    text = adm("stats", store, check_rc=0).stdout.decode()
    lines = [ln for ln in text.splitlines()
             if ln.split("  ")[0] in ("purge runs", "files removed", "records moved",
                                      "bytes given back")]
    return "\n".join(lines) + "\n"


def test_stats_reports_purges_as_purge_does(tmp_path, make_mount):
    """`dboxadm stats` sums what the purges printed, with purge's words:
    files removed (bytes freed), records moved (bytes), bytes given back
    = freed - moved; --json has the same numbers (and the old keys)."""
    store, m, data, names, where, gone = expunged_every_third(tmp_path, make_mount)
    m.unmount()
    r = adm("purge", store, check_rc=0)
    first = r.stdout.decode()
    rep = purge_report(r.stdout)
    assert rep["files removed"] > 0 and rep["records moved"] > 0
    # Success says nothing on stderr (cron mails what a job prints: the
    # summary goes to stdout, which such a job sends to /dev/null).
    assert r.stderr == b"", r.stderr
    lines = stats_purge_lines(store)
    assert lines.startswith("purge runs          1\n"), lines
    # The very lines purge printed.
    for key in ("files removed", "records moved", "bytes given back"):
        want = next(ln for ln in first.splitlines() if ln.startswith(key))
        assert want + "\n" in lines, (want, lines)
    st = stats(store)
    freed = int(first.split("files removed")[1].split("(")[1].split()[0])
    moved = int(first.split("records moved")[1].split("(")[1].split()[0])
    assert st["purge_runs"] == 1
    assert st["purge_files_removed"] == rep["files removed"]
    assert st["purge_bytes_freed"] == freed
    assert st["purge_records_moved"] == rep["records moved"]
    assert st["purge_bytes_moved"] == moved
    assert st["purge_bytes_given_back"] == rep["bytes given back"] == freed - moved

    # A second run is added to the totals.
    m.mount()
    for n in names[1::3]:
        os.unlink(m.mnt / "cur" / n)
    m.unmount()
    rep2 = purge_report(adm("purge", store, check_rc=0).stdout)
    st2 = stats(store)
    assert st2["purge_runs"] == 2
    assert st2["purge_records_moved"] == rep["records moved"] + rep2["records moved"]
    assert st2["purge_bytes_given_back"] == \
        rep["bytes given back"] + rep2["bytes given back"]


def test_stats_purge_totals_of_an_older_index(tmp_path, make_mount):
    """An index purged by a dboxfs that did not count moved bytes: stats
    says they are unknown (JSON null) rather than a wrong difference, and
    later purges do not make up a partial total."""
    store, m, data, names, where, gone = expunged_every_third(tmp_path, make_mount)
    m.unmount()
    adm("purge", store, check_rc=0)
    db = sqlite3.connect(str(store / "index.sqlite"))
    with db:
        db.execute("DELETE FROM meta WHERE key IN ('purge_bytes_moved',"
                   " 'purge_records_moved')")
    db.close()
    st = stats(store)
    assert st["purge_runs"] == 1 and st["purge_bytes_freed"] > 0
    assert st["purge_bytes_moved"] is None and st["purge_bytes_given_back"] is None
    assert "bytes given back    not known" in stats_purge_lines(store)
    adm("purge", store, check_rc=0)
    st = stats(store)
    assert st["purge_runs"] == 2 and st["purge_bytes_given_back"] is None


def deliver_closed(md, name, data):
    """Deliver as an MTA does: create in tmp/, write, close, rename into
    new/ (the close's RELEASE reaches the daemon when the kernel sends it,
    maybe after the next CREATE)."""
    (md / "tmp" / name).write_bytes(data)
    os.rename(md / "tmp" / name, md / "new" / name)


def test_deliveries_one_after_another_share_one_mfile(tmp_path, make_mount):
    """200 deliveries, each closed before the next begins, all go to one
    m.N, also while the RELEASE of the one before has not come yet.  The
    m.N stayed taken until that RELEASE, which the kernel sends after
    close() returns: now and then the next delivery's CREATE came first
    and a second m.N was started (a test that took the store to have one
    m.N failed in CI).  Here a dup of each descriptor, closed after the
    next delivery, holds its RELEASE back every time."""
    m = make_mount(store=tmp_path / "store", mnt=tmp_path / "mnt")
    held = None
    for i in range(200):
        name = f"{i}.M{i}.test"
        fd = os.open(m.mnt / "tmp" / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"Subject: %d\n\nbody\n" % i)
        later = os.dup(fd)
        os.close(fd)  # FLUSH: the message is complete; no RELEASE yet
        os.rename(m.mnt / "tmp" / name, m.mnt / "new" / name)
        if held is not None:
            os.close(held)
        held = later
    os.close(held)
    files = index_rows(m.store, "SELECT DISTINCT file_id FROM message")
    assert len(index_rows(m.store, "SELECT ino FROM message")) == 200
    assert files == [(1,)]
    assert [p.name for p in (m.store / "storage").glob("m.*")] == ["m.1"]


def test_purge_moves_a_message_still_open_after_its_fsync(tmp_path, make_mount):
    """A message written, fsync'ed and still open for writing: its m.N
    takes the next delivery at once (the finished save gave the m.N's tail
    back) and a purge may move the message meanwhile.  Another fsync and
    the close afterwards must leave the index naming the moved copy: a
    second finish of the old save would write the old place back, into
    an m.N the purge removed."""
    store = tmp_path / "store"
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", "purge_threshold=0"])
    md = m.mnt
    dead = [b"Subject: dead %d\n\n%s\n" % (i, b"x" * 4000) for i in range(3)]
    for i, data in enumerate(dead):
        deliver_closed(md, f"dead{i}", data)
    held = b"Subject: held\n\nwritten, fsync'ed, still open\n"
    fd = os.open(md / "tmp" / "held", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, held)
        os.fsync(fd)
        os.rename(md / "tmp" / "held", md / "cur" / "held:2,S")
        deliver_closed(md, "next", b"Subject: next\n\nbody\n")
        where = file_of(store)
        assert where["held:2,S"][0] == where["next"][0] == where["dead0"][0]
        for i in range(3):
            os.unlink(md / "new" / f"dead{i}")
        r = adm("purge", store, check_rc=0)
        assert b"purged by the mount" in r.stdout, r
        moved = file_of(store)
        assert moved["held:2,S"][0] != where["held:2,S"][0], (where, moved)
        assert not (store / "storage" / f"m.{where['held:2,S'][0]}").exists()
        os.fsync(fd)
    finally:
        os.close(fd)
    assert file_of(store) == moved
    assert (md / "cur" / "held:2,S").read_bytes() == held
    m.remount()
    assert (md / "cur" / "held:2,S").read_bytes() == held
    assert (md / "new" / "next").read_bytes() == b"Subject: next\n\nbody\n"
    m.unmount()
    r = adm("check", store)
    assert r.returncode == 0, r


def test_purge_removes_an_mfile_only_after_its_switch_is_on_disk(make_mount, tmp_path):
    """The commit that points the moved messages at their copies is made
    durable (an fdatasync of the WAL) before the old m.N is unlinked: a
    power loss between the two would leave rows naming a file that is
    gone.  It was not: the durable commit relied on a PRAGMA that SQLite
    applies when it prepares the statement, and it was prepared once
    (helper-63).  strace sees the order.  The automatic purge is off: it
    runs some 2 s after the unlinks, and when its switch's sync fell
    before the trace's start and its unlink after, the order looked
    wrong (a CI run)."""
    m = make_mount(options=["-o", "rotate_size=65536,purge_threshold=0"])
    md = m.maildir()
    for i in range(4):
        with open(md / "cur" / f"m{i}:2,S", "wb") as f:
            f.write(b"Subject: %d\n\n" % i + bytes([97 + i]) * 20000)
    for i in (0, 1):
        os.unlink(md / "cur" / f"m{i}:2,S")
    log = tmp_path / "purge.strace"
    tracer = subprocess.Popen(
        ["strace", "-f", "-qq", "-y", "-e", "trace=fdatasync,unlink,unlinkat",
         "-o", str(log), "-p", str(m.proc.pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(2.0)  # attached, and the unlinks' timed sync is over
        start = len(log.read_text().splitlines())
        adm("purge", m.store, check_rc=0)
    finally:
        tracer.terminate()
        tracer.wait()
    lines = log.read_text().splitlines()[start:]
    gone = [i for i, line in enumerate(lines)
            if "unlink" in line and "m.1" in line and "= 0" in line]
    assert gone, lines
    assert any("index.sqlite-wal>" in line for line in lines[:gone[0]]), lines
    assert not (m.store / "storage" / "m.1").exists()
    for i in (2, 3):
        assert (md / "cur" / f"m{i}:2,S").read_bytes() == \
            b"Subject: %d\n\n" % i + bytes([97 + i]) * 20000


def test_an_online_export_leaves_out_what_was_deleted_meanwhile(make_mount, tmp_path):
    """Messages expunged while an export of the mounted store runs, and
    purged before the export reached them, made it fail (exit 1, "Input/
    output error" for each: helper-87, 381 of 381 in a busy minute).  A
    live tree changes while it is read: each is left out with a warning
    ("deleted since the export began"), the export exits 0, and every
    message it wrote has the bytes it was stored with."""
    m = make_mount(options=["-o", "rotate_size=65536,purge_threshold=0"])
    big = m.maildir(".A")
    for i in range(3000):
        (big / "cur" / f"a{i}:2,S").write_bytes(b"Subject: a %d\n\n%s\n" % (i, b"y" * 6000))
    z = m.maildir(".Z")
    sent = {}
    for i in range(600):
        sent[f"z{i}:2,"] = b"Subject: z %d\n\n%s\n" % (i, b"z" * 1500)
        (z / "cur" / f"z{i}:2,").write_bytes(sent[f"z{i}:2,"])
    out = tmp_path / "out"
    export = subprocess.Popen([str(DBOXADM), "export", str(m.store), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # Held while still in .A (its snapshot taken), until the purge is done.
    deadline = time.monotonic() + 60
    while not (out / ".A" / "cur").exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    export.send_signal(signal.SIGSTOP)
    try:
        assert not (out / ".Z").exists()
        for i in range(0, 600, 2):
            os.unlink(z / "cur" / f"z{i}:2,")
        adm("purge", m.store, check_rc=0)
    finally:
        export.send_signal(signal.SIGCONT)
    stdout, stderr = export.communicate(timeout=300)
    assert export.returncode == 0, stderr.decode()[-3000:]
    got = {p.name: p.read_bytes() for p in (out / ".Z" / "cur").iterdir()}
    left_out = set(sent) - set(got)
    assert {f"z{i}:2," for i in range(1, 600, 2)} <= set(got)
    assert all(sent[n] == b for n, b in got.items())
    assert left_out, "the purge gave back no deleted message's bytes"
    assert f"{len(left_out)} messages and files deleted since the " \
        "export began were left out".encode() in stderr, stderr.decode()[-3000:]
    assert b"Input/output error" not in stderr, stderr.decode()[-3000:]


def test_an_online_export_follows_records_a_purge_moved(make_mount, tmp_path):
    """dboxadm export reads one snapshot of the index; a purge by the
    mount meanwhile moves records to new m.N and removes the old files,
    and export said 'storage/m.N: No such file or directory' and left
    those messages out (helper-86: 2 of 5 rounds).  It now finds where
    they went in the index as it is now: the export is whole.  The
    folder the purge works on (.Z) comes after a big one (.A) in the
    walk, so the purge runs while export is still in .A."""
    m = make_mount(options=["-o", "rotate_size=65536,purge_threshold=0"])
    big = m.maildir(".A")
    for i in range(3000):
        (big / "cur" / f"a{i}:2,S").write_bytes(b"Subject: a %d\n\n%s\n" % (i, b"y" * 6000))
    z = m.maildir(".Z")
    for i in range(600):
        (z / "cur" / f"z{i}:2,").write_bytes(b"Subject: z %d\n\n%s\n" % (i, b"z" * 1500))
    for i in range(0, 600, 2):
        os.unlink(z / "cur" / f"z{i}:2,")
    before = {p.name for p in (m.store / "storage").glob("m.*")}
    out = tmp_path / "out"
    export = subprocess.Popen([str(DBOXADM), "export", str(m.store), str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.2)
    adm("purge", m.store, check_rc=0)
    stdout, stderr = export.communicate(timeout=300)
    purged = before - {p.name for p in (m.store / "storage").glob("m.*")}
    assert purged, "the purge removed no m.N"
    assert export.returncode == 0, stderr.decode()
    r = subprocess.run(["diff", "-r", str(m.mnt), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[:2000]


@pytest.mark.parametrize("case", ["copies", "changed"])
def test_a_purge_killed_before_its_switch_leaves_no_lost_found_copy(make_mount, case):
    """A purge copies live records behind an in-flight mark at the end of
    a pool m.N, then commits the switch that points the messages at them.
    A kill in between left whole copies there; recovery kept them in
    lost+found/ with a warning that they might be a save the crash cut
    short or mail of a restored index, and check said the same of them
    (helper-92: 977 records over 150 killed online purges, each one a
    live message).  They are copies of messages the index has at their
    old place: check says so, and the next mount cuts them without a
    copy.  A record there whose body differs from its GUID's message (a
    rewrite's new bytes) is still kept first.  The state is made by hand:
    the kill's window is a few microseconds."""
    m = make_mount(options=["-o", "rotate_size=65536,purge_threshold=0"])
    md = m.maildir()
    mails = {}
    for i in range(5):
        name = f"m{i}:2,S"
        mails[name] = b"Subject: %d\n\n" % i + bytes([97 + i]) * 20000
        (md / "cur" / name).write_bytes(mails[name])
    m.unmount()
    rows = index_rows(m.store, "SELECT file_id, offset, record_size FROM message"
                               " WHERE state = 0 ORDER BY file_id, offset")
    last = max(f for f, _, _ in rows)
    pool = m.store / "storage" / f"m.{last}"
    committed = pool.stat().st_size
    tail = b""
    for f, off, size in rows:
        if f != last:
            with open(m.store / "storage" / f"m.{f}", "rb") as src:
                src.seek(off)
                tail += src.read(size)
    assert tail, rows
    if case == "changed":
        tail = tail[:100] + bytes([tail[100] ^ 1]) + tail[101:]
    tail += tail[:50]  # the next copy, torn by the kill
    with open(pool, "ab") as f:
        f.write(tail)
    db = sqlite3.connect(str(m.store / "index.sqlite"))
    try:
        db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                   (f"inflight.m.{last}", committed))
        db.commit()
    finally:
        db.close()

    r = adm("check", m.store, check_rc=0)
    out = r.stdout.decode()
    if case == "copies":
        assert "an unfinished purge or rewrite" in out, out
        assert "copies of messages the index has at their old place" in out, out
    else:
        assert "keeping a copy in lost+found/" in out, out
    m.mount()
    log = m.log_text()
    lost = sorted(p.name for p in (m.store / "lost+found").glob("*")) \
        if (m.store / "lost+found").exists() else []
    if case == "copies":
        assert "are copies of messages the index has at their old place" in log, log
        assert "where the index has a write in flight" not in log, log
        assert lost == [], lost
    else:
        assert "where the index has a write in flight" in log, log
        assert lost == [f"m.{last}-{committed}"], lost
    assert pool.stat().st_size == committed
    for name, data in mails.items():
        assert (md / "cur" / name).read_bytes() == data, name
    m.unmount()
    r = adm("check", m.store, check_rc=0)
    if case == "copies":
        # What an older recovery kept: check tells it needs nothing.
        (m.store / "lost+found").mkdir(exist_ok=True)
        (m.store / "lost+found" / f"m.{last}-{committed}").write_bytes(tail)
        r = adm("check", m.store, check_rc=0)
        assert "are all copies of messages the index has" in r.stdout.decode(), r.stdout
    else:
        assert "are all copies" not in r.stdout.decode(), r.stdout
