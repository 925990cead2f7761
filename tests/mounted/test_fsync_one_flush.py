"""One flush per fsync of a new message: its m.N is synced, not the
index's WAL; the record carries the message's path (metadata L), and
crash recovery puts it back there when the power loss takes the index
commits that were not synced yet (engine/store-restore.c,
docs/durability.md).

A power loss is made here by cutting the WAL back to its size at the last
sync after the daemon is killed: what a lost page cache leaves of it.
ext4 has no counterpart to compare with (its journal is not ours to cut);
what each case expects is what ext4 promises after fsync(): the synced
file is there with its bytes, under the name it had when it was synced.
"""
import os
import time

import subprocess

import pytest

from conftest import DBOXADM, index_rows
from test_fsync_group import FdatasyncTrace, deliver_fsync


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_fsync(path, data, rename_to=None):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if rename_to is not None:
        os.rename(path, rename_to)


class PowerLoss:
    """The WAL's size at a sync point, and the cut back to it."""

    def __init__(self, m):
        self.m = m
        self.wal = m.store / "index.sqlite-wal"

    def synced_point(self):
        # An fsyncdir syncs the WAL with every commit so far.
        fsync_dir(self.m.maildir())
        self.size = self.wal.stat().st_size
        return self

    def strike(self):
        """Kill the daemon, drop what the WAL got since the sync point
        (and the WAL-index, which a reboot loses too), mount again."""
        self.m.kill()
        assert self.wal.stat().st_size > self.size, "nothing to lose"
        os.truncate(self.wal, self.size)
        shm = self.m.store / "index.sqlite-shm"
        if shm.exists():
            shm.unlink()
        self.m.mount()


def read(path):
    with open(path, "rb") as f:
        return f.read()


def test_fsync_of_a_new_message_syncs_its_mfile_only(mount):
    """strace: the fsync() of a delivery makes one fdatasync, of its
    m.N; the WAL follows within the timed sync, no client asking."""
    md = mount.maildir()
    deliver_fsync(md, "warm", b"Subject: warm\n\nmakes m.1\n")
    # Traced from before the open: strace's start forks this process,
    # and the child's close of an open message is a FLUSH (a finish).
    trace = FdatasyncTrace(mount).start()
    try:
        fd = os.open(os.path.join(md, "tmp", "one"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, b"Subject: one\n\none flush\n")
            time.sleep(1.5)  # the create's timed sync is over
            before = len(trace.synced())
            os.fsync(fd)
            at_fsync = trace.synced()[before:]
            trace.wait_for("wal", after="m.1")
        finally:
            os.close(fd)
    finally:
        trace.stop()
    assert at_fsync == ["m.1"], at_fsync


def test_fsync_of_a_rewritten_message_syncs_the_index_too(mount):
    """A message written again is a copy of a committed one: until its
    commit is on disk the old version is the message, so its fsync()
    syncs the WAL before it returns (a copy is never put back by
    recovery: its GUID is the old version's)."""
    md = mount.maildir()
    path = os.path.join(md, "cur", "1.host:2,S")
    with open(path, "wb") as f:
        f.write(b"Subject: v1\n\nfirst\n")
    fsync_dir(os.path.join(md, "cur"))
    time.sleep(1.5)
    trace = FdatasyncTrace(mount).start()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, b"Subject: v2\n\nsecond\n")
            before = len(trace.synced())
            os.fsync(fd)
            at_fsync = trace.synced()[before:]
        finally:
            os.close(fd)
    finally:
        trace.stop()
    assert "wal" in at_fsync, at_fsync
    assert read(path) == b"Subject: v2\n\nsecond\n"


def test_fsynced_mail_survives_the_loss_of_the_index_commits(make_mount):
    """Power loss right after the fsyncs: the index commits since the
    last sync are gone, the records fsync() synced are not.  Each message
    comes back under the name it had at its fsync - one synced in tmp/ in
    new/, where its delivery was taking it (README: on ext4 it would be
    left in tmp/, where no reader looks); a rename after the fsync was
    lost with the commits, as ext4 may lose a rename no fsyncdir made
    durable.  One closed without fsync before them in the same m.N comes
    back too, at the path its close sealed (in cur/ as rebuild names it
    before 2026-12-07, when only an fsync sealed a path)."""
    m = make_mount()
    md = m.maildir(".in")
    loss = PowerLoss(m)
    deliver_fsync(md, "warm", b"Subject: warm\n\nsynced before\n")
    loss.synced_point()

    closed = b"Subject: closed\n\nno fsync\n" + b"c" * 3000 + b"\n"
    with open(os.path.join(md, "tmp", "closed"), "wb") as f:
        f.write(closed)
    os.rename(os.path.join(md, "tmp", "closed"),
              os.path.join(md, "new", "closed"))
    stays = b"Subject: stays\n\nfsynced in tmp/\n"
    write_fsync(os.path.join(md, "tmp", "stays"), stays)
    moved = b"Subject: moved\n\nfsynced, then renamed\n" + b"m" * 9000 + b"\n"
    write_fsync(os.path.join(md, "tmp", "moved"), moved,
                rename_to=os.path.join(md, "new", "moved"))
    flagged = b"Subject: flagged\n\nfsynced in cur/\n"
    write_fsync(os.path.join(md, "cur", "f.host:2,S"), flagged)
    loss.strike()

    assert read(os.path.join(md, "new", "warm")) == \
        b"Subject: warm\n\nsynced before\n"
    assert os.listdir(os.path.join(md, "tmp")) == []
    assert sorted(os.listdir(os.path.join(md, "new"))) == \
        ["closed", "moved", "stays", "warm"]
    assert read(os.path.join(md, "new", "stays")) == stays
    assert read(os.path.join(md, "new", "moved")) == moved
    assert read(os.path.join(md, "new", "closed")) == closed
    assert os.listdir(os.path.join(md, "cur")) == ["f.host:2,S"]
    assert read(os.path.join(md, "cur", "f.host:2,S")) == flagged
    st = os.stat(os.path.join(md, "new", "stays"))
    assert st.st_size == len(stays)
    assert st.st_uid == os.stat(os.path.join(md, "new")).st_uid
    log = m.log_text()
    assert "whose index rows the crash lost put back" in log, log
    m.unmount()
    check = subprocess.run([str(DBOXADM), "check", str(m.store)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_fsynced_mail_of_an_unfinished_delivery_is_finished(make_mount):
    """The create reached the disk (an fsyncdir), the commit of the fsync
    did not: the message the index has, still an unfinished delivery
    (which recovery would otherwise drop), is finished in place with the
    synced bytes - in cur/ (Dovecot and mbsync write flagged mail there
    directly) under its name; from tmp/ it moves to new/, where its
    delivery was taking it (the rename after the fsync was lost too, or
    never came: docs/limits.md)."""
    m = make_mount()
    md = m.maildir()
    loss = PowerLoss(m)
    paths = [os.path.join(md, "cur", "late.host:2,S"),
             os.path.join(md, "tmp", "late2")]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
           for p in paths]
    try:
        for fd in fds:
            os.write(fd, b"Subject: late\n\n")
        fsync_dir(os.path.join(md, "cur"))
        loss.synced_point()  # the names, and their unfinished rows
        bodies = [b"Subject: late %d\n\n" % i + b"l" * 20000 + b"\n"
                  for i in range(2)]
        for fd, body in zip(fds, bodies):
            os.pwrite(fd, body, 0)
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)
    loss.strike()
    assert os.listdir(os.path.join(md, "cur")) == ["late.host:2,S"]
    assert read(paths[0]) == bodies[0]
    assert os.listdir(os.path.join(md, "tmp")) == []
    assert os.listdir(os.path.join(md, "new")) == ["late2"]
    assert read(os.path.join(md, "new", "late2")) == bodies[1]
    rows = index_rows(m.store, "SELECT count(*) FROM message WHERE state != 0")
    assert rows == [(0,)], rows


def test_fsynced_mail_of_a_lost_folder_goes_to_inbox(make_mount):
    """The folder itself was made after the last sync: its path is gone,
    and so is its name; the message comes back in INBOX's cur/ rather
    than nowhere."""
    m = make_mount()
    loss = PowerLoss(m)
    m.maildir()
    loss.synced_point()
    md = m.maildir(".fresh")
    data = b"Subject: fresh\n\nin a folder made a moment ago\n"
    write_fsync(os.path.join(md, "tmp", "x"), data)
    loss.strike()
    assert not os.path.exists(md)
    inbox_cur = os.path.join(m.maildir(), "cur")
    names = os.listdir(inbox_cur)
    assert len(names) == 1, names
    assert read(os.path.join(inbox_cur, names[0])) == data


def test_fsynced_mail_keeps_its_name_when_its_folders_tmp_was_lost(make_mount):
    """The folder and its cur/ and new/ were synced, its tmp/ was made
    after the sync: the message fsynced in tmp/ comes back under its own
    name in the folder's new/ (not in cur/ under a rebuild name); one in
    a lost new/ comes back in cur/.  helper-66's finding."""
    m = make_mount()
    loss = PowerLoss(m)
    md = m.maildir(".half")
    for sub in ("tmp", "new"):
        os.rmdir(os.path.join(md, sub))
    os.mkdir(os.path.join(md, "new"))
    other = m.maildir(".other")
    os.rmdir(os.path.join(other, "new"))
    loss.synced_point()
    os.mkdir(os.path.join(md, "tmp"))
    os.mkdir(os.path.join(other, "new"))
    data = b"Subject: half\n\nfsynced in a tmp/ made a moment ago\n"
    write_fsync(os.path.join(md, "tmp", "1.half.host"), data)
    data2 = b"Subject: other\n\nfsynced in a new/ made a moment ago\n"
    write_fsync(os.path.join(other, "new", "2.other.host"), data2)
    loss.strike()
    assert not os.path.exists(os.path.join(md, "tmp"))
    assert os.listdir(os.path.join(md, "cur")) == []
    assert os.listdir(os.path.join(md, "new")) == ["1.half.host"]
    assert read(os.path.join(md, "new", "1.half.host")) == data
    assert not os.path.exists(os.path.join(other, "new"))
    assert os.listdir(os.path.join(other, "cur")) == ["2.other.host"]
    assert read(os.path.join(other, "cur", "2.other.host")) == data2


def test_copies_past_the_committed_end_are_not_put_back(make_mount):
    """A record whose GUID a message of the index has is a copy (here:
    the same m.N bytes appended again, as a purge's copy would be), not
    lost mail: it is not put back as a second message."""
    m = make_mount()
    md = m.maildir()
    loss = PowerLoss(m)
    data = b"Subject: once\n\nonly once\n"
    write_fsync(os.path.join(md, "tmp", "once"), data)
    loss.synced_point()
    m.kill()
    mfile = m.store / "storage" / "m.1"
    blob = mfile.read_bytes()
    start = blob.index(b"\x01\x02N")
    with open(mfile, "ab") as f:
        f.write(blob[start:])
    shm = m.store / "index.sqlite-shm"
    if shm.exists():
        shm.unlink()
    m.mount()
    assert os.listdir(os.path.join(md, "tmp")) == ["once"]
    assert os.listdir(os.path.join(md, "cur")) == []
    assert os.listdir(os.path.join(md, "new")) == []
    assert read(os.path.join(md, "tmp", "once")) == data


def test_a_path_that_leads_outside_a_folder_is_not_followed(make_mount):
    """The L line is bytes of the store like any other (a user's store
    mounted by root: hostile input).  A path with "..", one that names no
    cur/, new/ or tmp/ (a message at the top), or one with an empty
    component is not followed: the message goes to its folder's cur/
    under rebuild's name, and nothing is made anywhere else."""
    m = make_mount()
    md = m.maildir()
    loss = PowerLoss(m).synced_point()
    names = ["aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"]
    for n in names:
        write_fsync(os.path.join(md, "tmp", n), b"Subject: %s\n\nx\n" % n.encode())
    m.kill()
    mfile = m.store / "storage" / "m.1"
    blob = mfile.read_bytes()
    for n, evil in zip(names, [b"../aaaaaaaaaaa", b"bbbbbbbbbbbbbb",
                               b"tmp//ccccccccc"]):
        old = b"Ltmp/" + n.encode() + b"\n"
        assert len(evil) == len(old) - 2 and blob.count(old) == 1
        blob = blob.replace(old, b"L" + evil + b"\n")
    mfile.write_bytes(blob)
    os.truncate(loss.wal, loss.size)
    shm = m.store / "index.sqlite-shm"
    if shm.exists():
        shm.unlink()
    m.mount()
    top = sorted(os.listdir(m.mnt))
    assert top == ["cur", "new", "tmp"], top
    assert os.listdir(os.path.join(md, "new")) == []
    assert os.listdir(os.path.join(md, "tmp")) == []
    cur = sorted(os.listdir(os.path.join(md, "cur")))
    assert len(cur) == 3 and all(n.endswith(".rebuild:2,") for n in cur), cur
    assert sorted(read(os.path.join(md, "cur", n)) for n in cur) == \
        sorted(b"Subject: %s\n\nx\n" % n.encode() for n in names)


def test_a_copys_mark_does_not_hide_a_later_fsynced_message(mount):
    """A message written again (a copy, marked in flight in the index)
    whose mark reached the disk while its clearing did not: recovery
    stops at an in-flight mark and would send a message fsync()ed after
    the copy in the same m.N to lost+found/ (helper-64).  So that fsync
    syncs the WAL up to the clearing (strace); the next one, with no
    mark changed since, syncs the m.N only."""
    md = mount.maildir()
    a = os.path.join(md, "cur", "a.host:2,S")
    write_fsync(a, b"Subject: a\n\nv1\n")
    trace = FdatasyncTrace(mount).start()
    syncs = []
    try:
        time.sleep(1.5)  # the timed sync of what came before is over
        fd = os.open(a, os.O_WRONLY)
        try:
            os.pwrite(fd, b"Subject: A", 0)  # the copy: its mark
        finally:
            os.close(fd)                     # cleared, not synced
        for n in ("m", "n"):
            fd = os.open(os.path.join(md, "tmp", n),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, b"Subject: m\n\nafter the copy\n")
                before = len(trace.synced())
                os.fsync(fd)
                syncs.append(trace.synced()[before:])
            finally:
                os.close(fd)
    finally:
        trace.stop()
    assert syncs[0][-1:] == ["wal"], syncs
    assert syncs[1] == ["m.1"], syncs


def test_a_delivery_renamed_after_its_fsync_comes_back_in_new(make_mount):
    """Its create reached the disk (the timed sync), then fsync, then the
    rename into new/; the loss takes the fsync's commit and the rename.
    The delivery the index still has in tmp/ is finished and moved into
    new/, not left in tmp/ (helper-64)."""
    m = make_mount()
    md = m.maildir()
    loss = PowerLoss(m)
    p = os.path.join(md, "tmp", "x")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"Subject: x\n\n")
        loss.synced_point()
        os.write(fd, b"body\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(p, os.path.join(md, "new", "x"))
    loss.strike()
    assert os.listdir(os.path.join(md, "tmp")) == []
    assert os.listdir(os.path.join(md, "new")) == ["x"]
    assert read(os.path.join(md, "new", "x")) == b"Subject: x\n\nbody\n"


def test_no_cur_anywhere_still_takes_the_records(make_mount):
    """A record without a path before one with a path goes to its
    folder's cur/; with neither that folder's nor INBOX's cur/ there, one
    is made (as the mount makes INBOX's), instead of every record of the
    m.N staying out (helper-64)."""
    m = make_mount()
    md = m.maildir()
    a = m.maildir(".A")
    os.rmdir(os.path.join(a, "cur"))
    os.rmdir(os.path.join(md, "cur"))
    loss = PowerLoss(m)
    write_fsync(os.path.join(md, "tmp", "warm"), b"w\n")
    loss.synced_point()
    closed = b"Subject: closed\n\nno fsync\n"
    # Two names at its close: its record carries no path (L holds one).
    with open(os.path.join(a, "new", "closed"), "wb") as f:
        f.write(closed)
        os.link(os.path.join(a, "new", "closed"),
                os.path.join(a, "new", "closed.2"))
    data = b"Subject: synced\n\nfsynced\n"
    write_fsync(os.path.join(md, "tmp", "x"), data,
                rename_to=os.path.join(md, "new", "x"))
    loss.strike()
    assert read(os.path.join(md, "new", "x")) == data
    cur = os.listdir(os.path.join(md, "cur"))
    assert len(cur) == 1 and read(os.path.join(md, "cur", cur[0])) == closed


def test_mail_closed_without_fsync_is_put_back_after_a_power_loss(make_mount):
    """Deliveries closed without fsync, and a power loss between the
    timed sync of their m.N and that of the WAL: the records are on
    disk, their rows are not.  Each record carries the path its close
    sealed it under (as an fsync's does), so the next mount puts every
    message back there - new/ for a tmp/ one, its bytes, its mode - and
    check finds nothing.  Before, only records before one an fsync
    sealed were put back; these stayed past the committed end as mail an
    older index lost: gone from the mount, check exited 1 until rebuild
    (helper-74, helper-76)."""
    m = make_mount()
    md = m.maildir()
    sub = m.maildir(".Lists")
    loss = PowerLoss(m)
    write_fsync(os.path.join(md, "tmp", "warm"), b"w\n",
                rename_to=os.path.join(md, "cur", "warm"))
    loss.synced_point()
    sent = {}
    for i, (folder, how) in enumerate([(md, "rename"), (md, "rename"),
                                       (sub, "rename"), (md, "link"),
                                       (md, "direct")]):
        name = f"17000000{i}.P{i}.host"
        data = b"Subject: %d\n\n" % i + b"closed, never fsynced\n" * (i + 1)
        where = "new" if how == "direct" else "tmp"
        path = os.path.join(folder, where, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        if how == "rename":
            os.rename(path, os.path.join(folder, "new", name))
        elif how == "link":
            os.link(path, os.path.join(folder, "new", name))
            os.unlink(path)
        sent[os.path.join(folder, "new", name)] = data
    loss.strike()
    for folder in (md, sub):
        assert os.listdir(os.path.join(folder, "tmp")) == [], m.log_text()
    got = {os.path.join(folder, "new", n): read(os.path.join(folder, "new", n))
           for folder in (md, sub) for n in os.listdir(os.path.join(folder, "new"))}
    assert got == sent, m.log_text()
    for path in sent:
        assert os.stat(path).st_mode & 0o777 == 0o640
    m.unmount()
    check = subprocess.run([str(DBOXADM), "check", str(m.store)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_message_written_again_after_its_fsync_keeps_both_versions(make_mount):
    """write, fsync, write more, close, rename, and every commit lost,
    the copy's in-flight mark too.  No power loss leaves that any more:
    the mark is on disk before the copy's first byte is written, so even
    the kernel's own writeback cannot put the copy there without it
    (test_power_loss_copy.py has the losses that do happen).  This keeps
    recovery's answer for such a store all the same (one copied while it
    was written, say).  The fsynced version comes
    back under the path its fsync recorded; the version the close made
    (a copy with a GUID of its own, sealed without a path) is kept past
    the committed end, as any record an index does not know, and rebuild
    brings it back in cur/: nothing acknowledged is lost, and the message
    is there twice (docs/durability.md; helper-63)."""
    m = make_mount()
    md = m.maildir()
    loss = PowerLoss(m).synced_point()
    p = os.path.join(md, "tmp", "a")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"Subject: a\n\nfirst part\n")
        os.fsync(fd)
        os.write(fd, b"second part\n")
    finally:
        os.close(fd)
    os.rename(p, os.path.join(md, "new", "a"))
    loss.strike()
    assert os.listdir(os.path.join(md, "new")) == ["a"]
    assert read(os.path.join(md, "new", "a")) == b"Subject: a\n\nfirst part\n"
    m.unmount()
    rebuild = subprocess.run([str(DBOXADM), "rebuild", str(m.store)],
                             capture_output=True, text=True)
    assert rebuild.returncode == 0, rebuild.stdout + rebuild.stderr
    m.mount()
    cur = os.listdir(os.path.join(md, "cur"))
    assert len(cur) == 1, cur
    assert read(os.path.join(md, "cur", cur[0])) == \
        b"Subject: a\n\nfirst part\nsecond part\n"
    assert read(os.path.join(md, "new", "a")) == b"Subject: a\n\nfirst part\n"


def test_fsynced_mail_comes_back_with_its_owner_and_mode(make_mount):
    """The record an fsync seals carries the message's mode, owner and
    group (metadata A), and recovery gives them back, as ext4 keeps the
    inode the fsync synced: before, a 0600 message came back with its
    directory's owner and 0600 plus the directory's group and other
    read/write bits (0666 in a 1777 cur/; helper-67 #F2)."""
    m = make_mount()
    md = m.maildir()
    shared = m.maildir(".Shared")
    os.chmod(os.path.join(md, "cur"), 0o755)
    os.chmod(os.path.join(shared, "cur"), 0o1777)
    os.chown(os.path.join(shared, "cur"), 65534, 65534)
    loss = PowerLoss(m)
    loss.synced_point()
    private = os.path.join(md, "cur", "private:2,S")
    theirs = os.path.join(shared, "cur", "theirs:2,S")
    write_fsync(private, b"Subject: private\n\nsecret\n")
    fd = os.open(theirs, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"Subject: theirs\n\nsecret too\n")
        os.fchown(fd, 1000, 1001)
        os.fchmod(fd, 0o640)
        os.fsync(fd)
    finally:
        os.close(fd)
    loss.strike()
    got = {p: os.stat(p) for p in (private, theirs)}
    assert (oct(got[private].st_mode), got[private].st_uid,
            got[private].st_gid) == (oct(0o100600), 0, 0)
    assert (oct(got[theirs].st_mode), got[theirs].st_uid,
            got[theirs].st_gid) == (oct(0o100640), 1000, 1001)
    assert read(theirs) == b"Subject: theirs\n\nsecret too\n"


def test_a_path_too_long_to_restore_is_synced_by_the_index(make_mount):
    """A message whose path below the root is longer than recovery
    follows (DBOX_FSYNC_PATH_MAX, 4,096 bytes) gets no L: its fsync
    syncs the index too (strace sees the WAL synced), and it is there
    after a power loss that takes what followed, at its path.  Before,
    the fsync wrote an L recovery refused and synced only the m.N: the
    message was missing until a rebuild (helper-67 #F1)."""
    m = make_mount()
    m.maildir()
    loss = PowerLoss(m)
    fd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # The kernel's PATH_MAX is 4096 too: walk down by descriptors.
        for _ in range(21):
            os.mkdir("d" * 200, dir_fd=fd)
            down = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY,
                           dir_fd=fd)
            os.close(fd)
            fd = down
        os.mkdir("cur", dir_fd=fd)
        cur = os.open("cur", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        trace = FdatasyncTrace(m).start()
        try:
            mfd = os.open("deep:2,S", os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                          0o600, dir_fd=cur)
            os.write(mfd, b"Subject: deep\n\nfsynced\n")
            os.fsync(mfd)
            synced = trace.synced()
            os.close(mfd)
        finally:
            trace.stop()
            os.close(cur)
    finally:
        os.close(fd)
    assert "wal" in synced, synced
    loss.size = loss.wal.stat().st_size  # what that sync made durable
    os.mkdir(os.path.join(m.mnt, ".after"))
    loss.strike()
    fd = os.open(m.mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(21):
            down = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY,
                           dir_fd=fd)
            os.close(fd)
            fd = down
        mfd = os.open("cur/deep:2,S", os.O_RDONLY, dir_fd=fd)
        try:
            assert os.read(mfd, 100) == b"Subject: deep\n\nfsynced\n"
        finally:
            os.close(mfd)
    finally:
        os.close(fd)


def tail_record(body, path=None, mailbox=b"INBOX"):
    """A dbox v2 record as an fsync seals one (docs/dbox-format.md
    sections 3 and 5), with a new GUID and, when given, L."""
    header = b"\x01\x02N " + b" " * 8 + b" " + b"%016X" % len(body) + b"\n"
    meta = b"R60000000\nV%x\nG%s\nB%s\n" % (
        len(body) + body.count(b"\n"), os.urandom(16).hex().encode(), mailbox)
    if path is not None:
        meta += b"L" + path + b"\n"
    return header + body + b"\n\x01\x03\n" + meta + b"\n"


def append_past_the_end(m, blob):
    """Records appended to m.1 of an unmounted store, past the end its
    index committed: what a power loss leaves of fsynced mail."""
    with open(m.store / "storage" / "m.1", "ab") as f:
        f.write(blob)


def test_records_past_the_cap_come_back_at_the_next_mount(make_mount):
    """Recovery puts back at most 65,536 records of an m.N per mount
    (RESTORE_MAX_RECORDS); with more records before the first fsynced
    one, the first mount puts back those it holds and the next mount
    the rest.  Before, it saw no path within the cap, put back nothing,
    and no mount ever did (helper-67 #F5)."""
    m = make_mount()
    write_fsync(os.path.join(m.maildir(), "tmp", "first"), b"first\n")
    m.unmount()
    count = 65600
    append_past_the_end(m, b"".join(tail_record(b"n%d\n" % i)
                                    for i in range(count)) +
                        tail_record(b"Subject: synced\n\nlast\n",
                                    path=b"new/synced"))
    m.mount()
    assert len(os.listdir(os.path.join(m.maildir(), "cur"))) == 65536
    m.remount()
    md = m.maildir()
    assert len(os.listdir(os.path.join(md, "cur"))) == count
    assert read(os.path.join(md, "new", "synced")) == \
        b"Subject: synced\n\nlast\n"


def test_a_bad_folder_name_does_not_stop_the_records_after_it(make_mount):
    """A record whose B names no folder a directory could be (a 300-byte
    component) goes to INBOX's cur/, and the fsynced record after it to
    its path.  Before, the lookup's ENAMETOOLONG failed the whole
    recovery of that m.N, at every mount (helper-67 #F3)."""
    m = make_mount()
    write_fsync(os.path.join(m.maildir(), "tmp", "first"), b"first\n")
    m.unmount()
    append_past_the_end(m, tail_record(b"odd\n", mailbox=b"x" * 300) +
                        tail_record(b"Subject: synced\n\nafter it\n",
                                    path=b"new/synced"))
    m.mount()
    md = m.maildir()
    assert read(os.path.join(md, "new", "synced")) == \
        b"Subject: synced\n\nafter it\n"
    cur = os.listdir(os.path.join(md, "cur"))
    assert len(cur) == 1 and read(os.path.join(md, "cur", cur[0])) == b"odd\n"


def test_a_plain_file_deleted_just_before_a_power_loss_reads_back(make_mount):
    """A plain file's backing file (files/<ino>) goes only once the
    commit that deleted the file is on disk: a power loss that takes the
    commit brings the name back with its bytes, as ext4 shows the old
    file or no name.  Before, the file went at once, and the name came
    back reading as EIO to stat, read, unlink and rename: Dovecot's
    dovecot-uidlist.lock made its INBOX unusable (helper-68 #1).  Both
    ways a plain file goes: unlink, and a rename over it."""
    m = make_mount()
    md = m.maildir()
    files = {"dovecot-uidlist.lock": b"3 V1 N2\n", "dovecot-uidlist": b"old\n",
             "new-uidlist": b"new\n"}
    for name, data in files.items():
        with open(os.path.join(md, name), "wb") as f:
            f.write(data)
    loss = PowerLoss(m).synced_point()
    start = time.monotonic()
    os.unlink(os.path.join(md, "dovecot-uidlist.lock"))
    os.rename(os.path.join(md, "new-uidlist"),
              os.path.join(md, "dovecot-uidlist"))
    m.kill()
    if time.monotonic() - start > 0.8:
        pytest.skip("too slow: the timed WAL sync may have run")
    os.truncate(loss.wal, loss.size)
    shm = m.store / "index.sqlite-shm"
    if shm.exists():
        shm.unlink()
    m.mount()
    for name, data in files.items():
        assert read(os.path.join(md, name)) == data, name
    os.unlink(os.path.join(md, "dovecot-uidlist.lock"))
    m.remount()
    assert not os.path.exists(os.path.join(md, "dovecot-uidlist.lock"))
    m.unmount()
    rc = subprocess.run([str(DBOXADM), "check", str(m.store)],
                        capture_output=True, text=True)
    assert rc.returncode == 0, rc.stdout + rc.stderr


def test_deleted_plain_files_go_with_the_next_wal_sync(make_mount):
    """Without a power loss the deleted files' backing files go within
    the timed sync (a second), and a daemon that dies first leaves them
    for recovery, which removes them by the keys the deleting commits
    left; the store checks clean."""
    m = make_mount()
    md = m.maildir()
    for i in range(5):
        with open(os.path.join(md, f"f{i}"), "wb") as f:
            f.write(b"x" * 1000)
    backing = m.store / "files"
    assert len(os.listdir(backing)) == 5
    for i in range(3):
        os.unlink(os.path.join(md, f"f{i}"))
    deadline = time.monotonic() + 5
    while len(os.listdir(backing)) != 2:
        assert time.monotonic() < deadline, os.listdir(backing)
        time.sleep(0.1)
    start = time.monotonic()
    for i in range(3, 5):
        os.unlink(os.path.join(md, f"f{i}"))
    m.kill()  # before its round: the commits are in the WAL, the files not gone
    if time.monotonic() - start > 0.8:
        pytest.skip("too slow: the timed WAL sync may have run")
    assert len(os.listdir(backing)) == 2
    m.mount()
    assert os.listdir(backing) == []
    m.unmount()
    rc = subprocess.run([str(DBOXADM), "check", str(m.store)],
                        capture_output=True, text=True)
    assert rc.returncode == 0, rc.stdout + rc.stderr


def test_a_plain_file_created_and_fsynced_keeps_its_name(make_mount):
    """fsync() of a plain file made a moment ago (a Dovecot index, a
    client's state file) syncs the index up to its create, as ext4's
    fsync of a new file makes its name durable: after a power loss that
    takes what followed, the file is there with its bytes.  A plain file
    whose name is on disk already costs no WAL sync (strace).  Before,
    only its backing file was synced and the name could vanish."""
    m = make_mount()
    md = m.maildir()
    loss = PowerLoss(m)
    old = os.path.join(md, "dovecot.index.log")
    with open(old, "wb") as f:
        f.write(b"log\n")
    loss.synced_point()
    trace = FdatasyncTrace(m).start()
    try:
        fd = os.open(old, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"more\n")
        os.fsync(fd)
        os.close(fd)
        appended = trace.synced()
        fd = os.open(os.path.join(md, "new-state"),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"state\n")
        os.fsync(fd)
        made = trace.synced()[len(appended):]
        os.close(fd)
    finally:
        trace.stop()
    assert "wal" not in appended, appended
    assert "wal" in made, made
    loss.size = loss.wal.stat().st_size  # what that sync made durable
    os.mkdir(os.path.join(md, ".after"))
    loss.strike()
    assert read(os.path.join(md, "new-state")) == b"state\n"
    assert read(old) == b"log\nmore\n"


def test_a_message_linked_before_its_fsync_keeps_both_names(make_mount):
    """A message with a second name (link(), Dovecot's COPY of a maildir
    message) when it is fsynced: L holds one name, so that fsync syncs
    the index as well (strace), and both names survive a power loss
    that takes what followed, as on ext4.  Before, only the first came
    back, with one link (helper-67 #F6)."""
    m = make_mount()
    md = m.maildir()
    other = m.maildir(".Other")
    loss = PowerLoss(m)
    first = os.path.join(md, "cur", "a:2,S")
    second = os.path.join(other, "cur", "b:2,S")
    data = b"Subject: linked\n\ntwo names\n"
    trace = FdatasyncTrace(m).start()
    try:
        fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, data)
        os.link(first, second)
        os.fsync(fd)
        synced = trace.synced()
        os.close(fd)
    finally:
        trace.stop()
    assert "wal" in synced, synced
    loss.size = loss.wal.stat().st_size  # what that sync made durable
    os.mkdir(os.path.join(md, ".after"))
    loss.strike()
    assert read(first) == data and read(second) == data
    assert os.stat(first).st_nlink == 2
