"""Root running dboxadm on a store that belongs to someone else.

A user owns their store, index included, and can write anything into it.
When root runs dboxadm on it (a backup export, a purge from cron, a
rebuild after a crash), nothing the user planted may act with root's
rights, and nothing root does may leave the store unusable to its owner:

- export never makes set-user-ID/set-group-ID files and never gives a
  file the owner the index claims (unless --same-owner, root's stores);
- purge never follows a symbolic link planted as STORE/lock, and sends
  its SIGUSR1 only to a process proven to be the dboxfs of that store;
- every verb run by root on a user's store runs as that user, so the
  files it makes are the user's and their own mount reads everything.
"""
import os
import shutil
import signal
import tempfile
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import DBOXADM, DBOXFS, Mount, is_mounted, unmount
from sysenv import (as_user, need_root, sample_maildir, store_released,
                    system_settings, unprivileged_user, user_scratch)


@pytest.fixture
def user():
    need_root()
    return unprivileged_user()


@pytest.fixture
def scratch(user):
    d = user_scratch(user[0], "dboxfs-priv-")
    try:
        yield d
    finally:
        unmount(d / "mnt")
        shutil.rmtree(d, ignore_errors=True)


def adm(*args, user=None):
    if user is not None:
        return as_user(user, [DBOXADM, *args])
    return subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def chown_tree(path, uid, gid):
    os.chown(path, uid, gid)
    for p in Path(path).rglob("*"):
        os.chown(p, uid, gid, follow_symlinks=False)


def owners(path):
    """{path: uid} of everything below path."""
    return {str(p): p.lstat().st_uid for p in Path(path).rglob("*")}


def user_store(scratch, user, messages=20):
    """A store of the test user's, imported by the user from a sample
    maildir; returns (store, maildir)."""
    name, uid, gid = user
    src = sample_maildir(scratch / "Maildir", owner=name, messages=messages)
    store = scratch / "store"
    r = adm("import", store, src, user=name)
    assert r.returncode == 0, r.stderr
    return store, src


# --- 4. export ---------------------------------------------------------

def plant_setuid_root_tool(store, user):
    """What a hostile user can do to their own index: claim that a plain
    file of theirs (a copy of id(1)) is a set-user-ID program of root's."""
    name, uid, gid = user
    db = sqlite3.connect(store / "index.sqlite")
    with db:
        n = db.execute(
            "UPDATE inode SET uid = 0, gid = 0, mode = ? WHERE ino IN "
            "(SELECT ino FROM entry WHERE parent = 1 AND name = ?)",
            (stat.S_IFREG | 0o6755, b"tool")).rowcount
    db.close()
    assert n == 1
    chown_tree(store, uid, gid)


def store_with_setuid_root_tool(scratch, user, messages):
    """The user's store of a sample maildir and a copy of id(1) named
    tool, which the user's index then calls set-user-ID root's: (store,
    maildir)."""
    name, uid, gid = user
    src = sample_maildir(scratch / "Maildir", owner=name, messages=messages)
    shutil.copy("/usr/bin/id", src / "tool")
    os.chown(src / "tool", uid, gid)
    store = scratch / "store"
    r = adm("import", store, src, user=name)
    assert r.returncode == 0, r.stderr
    plant_setuid_root_tool(store, user)
    return store, src


def test_root_export_of_a_user_store_makes_no_setuid_root_file(scratch, user):
    name, uid, gid = user
    store, src = store_with_setuid_root_tool(scratch, user, 5)

    out = scratch / "export"
    r = adm("export", store, out)
    assert r.returncode == 0, r.stderr
    # The proof that matters: run by the user, the program is not root
    # (old code: it printed 0).
    r = as_user(name, [out / "tool", "-u"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(uid)
    st = (out / "tool").stat()
    assert st.st_mode & (stat.S_ISUID | stat.S_ISGID) == 0, oct(st.st_mode)
    assert st.st_uid == uid and st.st_gid == gid, (st.st_uid, st.st_gid)
    # Nothing in the export is root's.
    assert set(owners(out).values()) == {uid}
    # The messages came out whole.
    r = subprocess.run(["diff", "-r", src, out], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:]


def test_root_export_writes_nowhere_a_user_chose(scratch, user, tmp_path):
    """Root exporting root's store: a DIR that a user's symbolic link
    names, an empty directory the user made (in a sticky /tmp-like
    directory), or any path through the user's directory, put root's
    mail tree where the user wanted, readable by them, and export even
    chmodded the user's directory (helper-79 F1).  Each is refused now,
    and nothing is written; a DIR only root controls works."""
    name, uid, gid = user
    src = sample_maildir(tmp_path / "Maildir", messages=3)
    store = tmp_path / "root-store"
    assert adm("import", store, src).returncode == 0
    decoy = tmp_path / "decoy"
    decoy.mkdir(mode=0o755)
    as_user(name, ["ln", "-s", decoy, scratch / "link"], check=True)
    sticky = Path(tempfile.mkdtemp(prefix="dboxfs-sticky-"))
    os.chmod(sticky, 0o1777)
    as_user(name, ["mkdir", "-m", "0777", sticky / "made"], check=True)
    for out in (scratch / "link", sticky / "made", scratch / "new-dir",
                scratch / "link" / "below"):
        r = adm("export", store, out)
        assert r.returncode == 2, (out, r.stdout, r.stderr)
        assert "uid %d" % uid in r.stderr, r.stderr
        assert os.listdir(decoy) == [] and os.listdir(sticky / "made") == []
        assert not (scratch / "new-dir").exists()
    assert stat.S_IMODE(os.stat(sticky / "made").st_mode) == 0o777
    shutil.rmtree(sticky)
    r = adm("export", store, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["diff", "-r", src, tmp_path / "out"], capture_output=True)
    assert r.returncode == 0, r.stdout[-2000:]


@pytest.mark.parametrize("how", ["mount.fuse3", "-o suid,dev"])
def test_root_mount_of_a_user_store_is_nosuid_nodev(scratch, user, how):
    """Root mounting a user's store serves modes, owners and device
    numbers the user wrote in the index: the mount is nosuid,nodev
    whatever the options say.  mount.fuse3 (fstab, mount -t fuse.dboxfs)
    adds dev,suid for root, and the user's set-user-ID-root row made a
    root shell for every local user (helper-61)."""
    name, uid, gid = user
    store, _ = store_with_setuid_root_tool(scratch, user, 3)
    mnt = scratch / "rootmnt"
    mnt.mkdir()
    if how == "mount.fuse3":
        r = subprocess.run(["mount.fuse3", f"{DBOXFS}#{store}", str(mnt),
                            "-o", "allow_other"], capture_output=True, text=True,
                           timeout=60)
    else:
        r = subprocess.run([str(DBOXFS), str(store), str(mnt), "-o",
                            "suid,dev,allow_other"], capture_output=True,
                           text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert is_mounted(mnt)
        with open("/proc/self/mounts") as f:
            opts = next(line.split()[3].split(",") for line in f
                        if line.split()[1] == str(mnt))
        assert "nosuid" in opts and "nodev" in opts, opts
        # The proof that matters: run by the user, the program is not root.
        r = as_user(name, [mnt / "tool", "-u"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(uid)
    finally:
        unmount(mnt)


def test_root_copy_of_a_mounted_user_store_makes_no_setuid_file_or_device(scratch, user):
    """Root mounting a user's store, then copying the tree as a backup
    would (cp -a): the copy must hold nothing the user could not have made
    on ext4.  The mount (nosuid, nodev) once served the user's index
    claims as they were, and cp -a made them real: a setuid-root copy of
    id(1) that printed euid 0 for the user, and a block device of root's
    disk, mode 0666 (helper-83).  Served now: setuid only on the user's
    own files, a device node as root's without permission bits."""
    name, uid, gid = user
    store, src = store_with_setuid_root_tool(scratch, user, 3)
    db = sqlite3.connect(store / "index.sqlite")
    with db:
        ino = db.execute("INSERT INTO inode (kind, mode, uid, gid, nlink, size,"
                         " mtime, ctime, rdev) VALUES (5, ?, ?, ?, 1, 0, 0, 0, ?)",
                         (stat.S_IFBLK | 0o666, uid, gid, os.makedev(8, 1))).lastrowid
        db.execute("INSERT INTO entry (parent, name, ino) VALUES (1, ?, ?)",
                   (b"disk", ino))
    db.close()
    chown_tree(store, uid, gid)
    mnt = scratch / "rootmnt"
    mnt.mkdir()
    copy = scratch / "copy"
    copy.mkdir()
    r = subprocess.run([str(DBOXFS), str(store), str(mnt), "-o", "allow_other"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        st = (mnt / "tool").stat()
        assert st.st_mode & (stat.S_ISUID | stat.S_ISGID) == 0, oct(st.st_mode)
        st = (mnt / "disk").lstat()
        assert stat.S_ISBLK(st.st_mode) and st.st_mode & 0o7777 == 0, oct(st.st_mode)
        assert (st.st_uid, st.st_gid) == (0, 0)
        r = subprocess.run(["cp", "-a", str(mnt / "tool"), str(mnt / "disk"), str(copy)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    finally:
        unmount(mnt)
    # The proof that matters: the copy runs as the user, not as root ...
    r = as_user(name, [copy / "tool", "-u"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(uid)
    # ... and the user cannot open the copied device.
    r = as_user(name, ["head", "-c", "1", copy / "disk"])
    assert r.returncode != 0 and "Permission denied" in r.stderr, r.stderr


# As the user: watch DIR (inotify) and rename a symbolic link to TARGET
# over every FIFO that appears there, at once, for SECONDS.
SWAPPER_C = r"""
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	char buf[65536], tmp[PATH_MAX], dst[PATH_MAX];
	int fd = inotify_init(), n = 0;

	if (argc != 5 || fd < 0 || inotify_add_watch(fd, argv[1], IN_CREATE) < 0)
		return 2;
	alarm(atoi(argv[4]));
	for (;;) {
		ssize_t len = read(fd, buf, sizeof(buf));

		if (len <= 0)
			return 0;
		for (char *p = buf; p < buf + len;) {
			struct inotify_event *ev = (void *)p;

			if (ev->len > 0 && strncmp(ev->name, "fifo", 4) == 0) {
				snprintf(tmp, sizeof(tmp), "%s/s%d", argv[3], n++);
				snprintf(dst, sizeof(dst), "%s/%s", argv[1], ev->name);
				if (symlink(argv[2], tmp) == 0)
					rename(tmp, dst);
			}
			p += sizeof(*ev) + ev->len;
		}
	}
}
"""


def test_root_export_sets_no_mode_through_a_swapped_name(scratch, user, tmp_path):
    """Root exports a store of root's into a directory a user may write
    (the user's home, say).  Each FIFO export made there was swapped by
    the user, at once, for a symbolic link to a file of root's: fchmodat
    by name made root's 0600 file 0777 (export now sets nothing by name).
    Since helper-79 F1 such a directory is refused before anything is
    written in it: the user's swapper, running all along, finds nothing
    to swap, and root's file is as it was."""
    name = user[0]
    swapper = scratch / "swapper"
    (tmp_path / "swapper.c").write_text(SWAPPER_C)
    subprocess.run(["cc", "-O2", "-o", str(swapper), str(tmp_path / "swapper.c")],
                   check=True)
    md = tmp_path / "md"
    for sub in ("cur", "new", "tmp"):
        (md / sub).mkdir(parents=True)
    for i in range(50):
        os.mkfifo(md / f"fifo{i}", 0o777)
        os.chmod(md / f"fifo{i}", 0o777)
    store = tmp_path / "store"
    assert adm("import", store, md).returncode == 0
    canary = tmp_path / "canary"
    canary.write_bytes(b"root's secret\n")
    canary.chmod(0o600)
    exp, links = scratch / "exp", scratch / "links"
    for d in (exp, links):
        assert as_user(name, ["mkdir", "-m", "755", d]).returncode == 0
    # Its own process group: runuser forks, and the swapper must go too.
    racer = subprocess.Popen(["runuser", "-u", name, "--", str(swapper), str(exp),
                              str(canary), str(links), "120"],
                             start_new_session=True)
    try:
        time.sleep(0.5)
        assert racer.poll() is None
        r = adm("export", store, exp)
    finally:
        os.killpg(racer.pid, signal.SIGKILL)
        racer.wait()
    assert r.returncode == 2 and f"uid {user[1]}" in r.stderr, r.stderr
    assert os.listdir(exp) == []
    st = canary.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o600, 0, 0)
    assert canary.read_bytes() == b"root's secret\n"


def test_same_owner_is_refused_on_a_user_store(scratch, user):
    store, _ = user_store(scratch, user, messages=3)
    out = scratch / "export"
    r = adm("export", store, out, "--same-owner")
    assert r.returncode == 2
    assert "--same-owner" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not out.exists()


def test_same_owner_on_a_root_store_sets_owners_but_no_setid_bits(tmp_path, user):
    name, uid, gid = user
    src = sample_maildir(tmp_path / "Maildir", messages=3)
    (src / "tool").write_bytes(b"#!/bin/sh\nid -u\n")
    store = tmp_path / "store"
    assert adm("import", store, src).returncode == 0
    db = sqlite3.connect(store / "index.sqlite")
    with db:
        db.execute("UPDATE inode SET uid = ?, gid = ?, mode = ? WHERE ino IN "
                   "(SELECT ino FROM entry WHERE parent = 1 AND name = ?)",
                   (uid, gid, stat.S_IFREG | 0o6755, b"tool"))
    db.close()
    # Without --same-owner: root's files (whoever runs export owns them).
    r = adm("export", store, tmp_path / "plain")
    assert r.returncode == 0, r.stderr
    st = (tmp_path / "plain" / "tool").stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    # With it: the recorded owner, still without set-id bits.
    r = adm("export", store, tmp_path / "same", "--same-owner")
    assert r.returncode == 0, r.stderr
    st = (tmp_path / "same" / "tool").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (uid, gid, 0o755)


# --- 5. purge and the lock ---------------------------------------------

SLEEPER = r"""
import fcntl, os, sys, time
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX)
f.truncate(0)
f.write("%d\n" % os.getpid())
f.flush()
print("ready", flush=True)
time.sleep(600)
"""


def start_sleeper(pidfile):
    """A root 'daemon' holding flock() on its pid file, with SIGUSR1 at its
    default action (which ends it)."""
    p = subprocess.Popen([sys.executable, "-c", SLEEPER, str(pidfile)],
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.parametrize("owner", ["user", "root"])
def test_purge_does_not_follow_a_symlinked_lock(scratch, user, owner, tmp_path):
    name, uid, gid = user
    if owner == "user":
        store, _ = user_store(scratch, user, messages=3)
    else:
        # root's own store, on a path only root controls: no switch to
        # another user; the lock alone must be refused.
        store = tmp_path / "store"
        src = sample_maildir(tmp_path / "Maildir", messages=3)
        assert adm("import", store, src).returncode == 0
    rundir = Path(scratch.parent / (scratch.name + "-run"))
    rundir.mkdir()
    try:
        daemon = start_sleeper(rundir / "daemon.pid")
        try:
            (store / "lock").unlink()
            (store / "lock").symlink_to(rundir / "daemon.pid")
            r = adm("purge", store, "--timeout=2")
            time.sleep(0.2)
            assert daemon.poll() is None, "purge signalled the daemon"
            assert r.returncode == 2, r.stdout + r.stderr
            assert "lock" in r.stderr and "symbolic link" in r.stderr, r.stderr
        finally:
            daemon.kill()
            daemon.wait()
    finally:
        shutil.rmtree(rundir)


def test_purge_signals_only_a_dboxfs_of_the_store(tmp_path):
    """A process that holds STORE/lock (flock(1), a backup script) and
    whose pid is in it is no mount: it must not get SIGUSR1."""
    src = sample_maildir(tmp_path / "Maildir", messages=3)
    store = tmp_path / "store"
    assert adm("import", store, src).returncode == 0
    holder = start_sleeper(store / "lock")
    try:
        r = adm("purge", store, "--timeout=2")
        time.sleep(0.2)
        assert holder.poll() is None, "purge signalled a process that is no mount"
        assert r.returncode == 2, r.stdout + r.stderr
        assert "not a dboxfs mount of this store" in r.stderr, r.stderr
    finally:
        holder.kill()
        holder.wait()


def test_purge_still_reaches_the_mount(tmp_path):
    m = Mount(tmp_path / "store", tmp_path / "mnt").mount()
    try:
        md = m.mnt
        for i in range(6):
            (md / "tmp" / f"m{i}").write_bytes(b"Subject: %d\n\n" % i + b"x" * 5000)
            os.rename(md / "tmp" / f"m{i}", md / "cur" / f"m{i}:2,")
        for i in range(3):
            os.unlink(md / "cur" / f"m{i}:2,")
        r = adm("purge", m.store, "--timeout=60")
        assert r.returncode == 0, r.stderr
        assert "purged by the mount" in r.stdout
    finally:
        m.unmount()


# --- 6. root's offline verbs on a user's store ---------------------------

def user_reads_everything(store, expected, user, scratch):
    """The user's own mount of store shows exactly the tree expected."""
    name, uid, gid = user
    mnt = scratch / "mnt"
    if not mnt.exists():
        as_user(name, ["mkdir", mnt], check=True)
    with system_settings() as settings:
        settings.users_may_mount()
        r = as_user(name, [DBOXFS, store, mnt])
        assert r.returncode == 0, r.stderr
        try:
            r = as_user(name, ["diff", "-r", expected, mnt])
            assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        finally:
            r = as_user(name, ["fusermount3", "-u", mnt])
            unmount(mnt)
        assert store_released(store)


def test_root_purge_and_rebuild_leave_the_store_the_users(scratch, user):
    name, uid, gid = user
    # The store the user imported; some mail expunged (by root's mount
    # here, then given back: as if the user had done it).
    store, src = user_store(scratch, user, messages=40)
    expected = scratch / "expected"
    shutil.copytree(src, expected, symlinks=True)
    m = Mount(store, scratch / "rootmnt").mount()
    try:
        gone = sorted((m.mnt / "cur").iterdir())[::2]
        assert gone
        for p in gone:
            os.unlink(p)
            os.unlink(expected / "cur" / p.name)
    finally:
        m.unmount()
    chown_tree(store, uid, gid)
    chown_tree(expected, uid, gid)

    r = adm("purge", store)
    assert r.returncode == 0, r.stderr
    assert "files removed       0 " not in r.stdout, r.stdout
    r = adm("rebuild", store)
    assert r.returncode == 0, r.stderr
    for verb in (["check", store], ["stats", store]):
        r = adm(*verb)
        assert r.returncode == 0, r.stderr
    # Old code: root-owned m.N and index, and the user's mount read EIO.
    user_reads_everything(store, expected, user, scratch)
    root_owned = {p: u for p, u in owners(store).items() if u != uid}
    assert root_owned == {}


def test_root_mount_of_a_user_store_leaves_every_file_the_users(scratch, user):
    """Root mounting a user's store works on it as its owner, as dboxadm
    does: the m.N, files/<ino> and folders it makes are the user's (they
    were root's 0600, and the user's own check and export then failed
    with Permission denied: helper-54)."""
    name, uid, gid = user
    store, src = user_store(scratch, user, messages=10)
    expected = scratch / "expected"
    shutil.copytree(src, expected, symlinks=True)
    letter = b"From: root@example.org\nSubject: from root\n\nhello\n"
    m = Mount(store, scratch / "rootmnt", options=["-o", "rotate_size=4096"]).mount()
    try:
        for top in (m.mnt, expected):
            (top / ".Root" / "cur").mkdir(parents=True)
            for sub in ("new", "tmp"):
                (top / ".Root" / sub).mkdir()
            for i in range(4):  # past rotate_size: new m.N
                (top / "tmp" / f"r{i}").write_bytes(letter * 40)
                os.rename(top / "tmp" / f"r{i}", top / ".Root" / "cur" / f"r{i}:2,S")
            (top / "notes.txt").write_bytes(b"a plain file\n")
            os.unlink(next(iter(sorted((top / "cur").iterdir()))))
    finally:
        m.unmount()
    assert len(list((store / "storage").iterdir())) > 1
    assert {p: u for p, u in owners(store).items() if u != uid} == {}
    for verb in (["check", store], ["purge", store], ["stats", store]):
        r = adm(*verb, user=name)
        assert r.returncode == 0, r.stdout + r.stderr
    chown_tree(expected, uid, gid)
    user_reads_everything(store, expected, user, scratch)


def test_online_purge_of_a_user_store_root_mounted_says_why_not(scratch, user):
    """A user's store root mounted: its daemon runs as root, and root's
    dboxadm acts as the store's owner, who may not signal it.  The
    refusal said "permission denied: run as the mount's owner", which
    root is (helper-87): it now says the mount runs as another user and
    what to do; nothing is signalled, the mount serves on."""
    name, uid, gid = user
    store, src = user_store(scratch, user, messages=5)
    m = Mount(store, scratch / "rootmnt").mount()
    try:
        before = sorted(str(p) for p in m.mnt.rglob("*"))
        for who in (None, name):
            r = adm("purge", store, user=who)
            assert r.returncode == 2, r.stdout + r.stderr
            assert "runs as another user" in r.stderr, r.stderr
            assert "unmount it" in r.stderr and "run as the mount's owner" \
                not in r.stderr, r.stderr
        assert sorted(str(p) for p in m.mnt.rglob("*")) == before
    finally:
        m.unmount()


def test_root_mount_decides_the_owner_as_dboxadm_does(scratch, user, tmp_path):
    """Whose store root's mount works on is decided as for dboxadm: a new
    store in a user's directory is made as that user; root's own store
    reached through a user's link is opened as that user (so it is not
    opened at all); one user's store through another user's link is
    refused."""
    name, uid, gid = user
    new = scratch / "new-store"
    m = Mount(new, scratch / "rootmnt").mount()
    try:
        # Its tree is the user's too: the root and INBOX's cur/new/tmp
        # (they were root's 0700, and the user's own mount showed them
        # nothing: helper-56).
        for d in (m.mnt, m.mnt / "cur", m.mnt / "new", m.mnt / "tmp"):
            assert (os.stat(d).st_uid, os.stat(d).st_gid) == (uid, gid), d
        (m.mnt / "cur" / "1.root:2,S").write_bytes(b"Subject: x\n\nx\n")
    finally:
        m.unmount()
    assert new.stat().st_uid == uid
    assert {p: u for p, u in owners(new).items() if u != uid} == {}

    # The user's link to a directory of root's as the mount point: root
    # mounted there (the user's store over /etc, for root's processes:
    # helper-59).  Refused, and so is a directory of a third user's.
    rootdir = tmp_path / "rootdir"
    rootdir.mkdir(mode=0o755)
    (rootdir / "passwd").write_text("root's\n")
    os.symlink(rootdir, scratch / "etc-link")
    os.chown(scratch / "etc-link", uid, gid, follow_symlinks=False)
    (scratch / "other").mkdir()
    os.chown(scratch / "other", uid + 1, gid)
    for mnt in (scratch / "etc-link", scratch / "other"):
        r = subprocess.run([str(DBOXFS), str(new), str(mnt), "-f"],
                           capture_output=True, text=True, timeout=60)
        try:
            assert r.returncode != 0 and not is_mounted(rootdir) and \
                not is_mounted(mnt), (mnt, r.stderr)
            assert "root mounts the store of uid" in r.stderr, r.stderr
        finally:
            unmount(rootdir)
            unmount(mnt)
    assert (rootdir / "passwd").read_text() == "root's\n"

    secret = tmp_path / "secret-store"   # root's, below a root-only dir
    Mount(secret, tmp_path / "m0").mount().unmount()
    link = scratch / "link"
    os.symlink(secret, link)
    os.chown(link, uid, gid, follow_symlinks=False)
    (scratch / "m1").mkdir()
    r = subprocess.run([str(DBOXFS), str(link), str(scratch / "m1"), "-f"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and not is_mounted(scratch / "m1")
    assert "Permission denied" in r.stderr, r.stderr

    from kinds_env import CAROL, team_users
    team_users()
    theirs = user_scratch(CAROL, "dboxfs-priv-other-")
    try:
        src = sample_maildir(theirs / "Maildir", owner=CAROL, messages=2)
        r = adm("import", theirs / "store", src, user=CAROL)
        assert r.returncode == 0, r.stderr
        link2 = scratch / "link2"
        os.symlink(theirs / "store", link2)
        os.chown(link2, uid, gid, follow_symlinks=False)
        r = subprocess.run([str(DBOXFS), str(link2), str(scratch / "m1"), "-f"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and not is_mounted(scratch / "m1")
        assert "reached through a symbolic link or directory of uid" in r.stderr, r.stderr
        # The user's link in the middle of the path, to the other user's
        # directory: refused too, for the mount and for dboxadm (it was
        # taken for the store owner's own way, and root's import wrote
        # the user's mail into the other user's store: helper-59).
        link3 = scratch / "theirs"
        os.symlink(theirs, link3)
        os.chown(link3, uid, gid, follow_symlinks=False)
        for way in (link3 / "store", f"{link3}/store/.", f"{link3}/./store",
                    link3 / "newstore"):
            r = subprocess.run([str(DBOXFS), str(way), str(scratch / "m1"), "-f"],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode != 0 and not is_mounted(scratch / "m1")
            assert f"reached through a symbolic link or directory of uid {uid}" \
                in r.stderr, (way, r.stderr)
            r = adm("import", way, src)
            assert r.returncode == 2 and "reached through" in r.stderr, (way, r)
        assert not (theirs / "newstore").exists()
        assert sum(1 for _ in (theirs / "store" / "storage").iterdir()) == 1
    finally:
        unmount(scratch / "m1")
        shutil.rmtree(theirs, ignore_errors=True)


def test_root_import_into_a_users_directory_makes_the_users_store(scratch, user):
    name, uid, gid = user
    src = sample_maildir(scratch / "Maildir", owner=name, messages=10)
    store = scratch / "store"
    r = adm("import", store, src)
    assert r.returncode == 0, r.stderr
    assert store.stat().st_uid == uid
    assert set(owners(store).values()) == {uid}
    user_reads_everything(store, src, user, scratch)


@pytest.mark.parametrize("verb", ["dump", "export", "stats"])
def test_root_cannot_reach_what_the_user_cannot_read(scratch, user, tmp_path,
                                                     verb):
    """A user's link to root's store (root-only, under /tmp/pytest-of-root):
    run on it by root, dboxadm reads as the link's owner and gets nothing."""
    name, uid, gid = user
    secret_src = sample_maildir(tmp_path / "Secret", messages=3)
    secret = tmp_path / "secret-store"
    assert adm("import", secret, secret_src).returncode == 0
    store = scratch / "store"
    os.symlink(secret, store)
    os.chown(store, uid, gid, follow_symlinks=False)
    args = {"dump": ["m.1"], "export": [scratch / "out"], "stats": []}[verb]
    r = adm(verb, store, *args)
    assert r.returncode != 0, r.stdout
    assert "Permission denied" in r.stderr, r.stderr
    assert not (scratch / "out").exists()


@pytest.mark.parametrize("verb", ["stats", "export", "backup", "check"])
def test_a_store_another_user_may_not_enter_says_permission_denied(
        scratch, user, verb):
    """The test user's store, mode 0700: another user running a reading
    verb on it is told "Permission denied", not that it is no dbox store
    (the index's lookup failed with EACCES, not ENOENT)."""
    from kinds_env import CAROL, team_users
    team_users()
    store, _ = user_store(scratch, user, messages=3)
    store.chmod(0o700)
    out = scratch / "out"
    args = {"stats": [], "export": [out], "backup": [out],
            "check": []}[verb]
    r = adm(verb, store, *args, user=CAROL)
    assert r.returncode != 0, r.stdout
    assert "Permission denied" in r.stderr, r.stderr
    assert "not a dbox store" not in r.stderr, r.stderr
    assert not out.exists()


def tree_state(d):
    """Bytes and mtimes of every file below d (and d itself if a file)."""
    d = Path(d)
    paths = [d] if d.is_file() else sorted(p for p in d.rglob("*") if p.is_file())
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


@pytest.mark.parametrize("what", ["storage", "files", "index.sqlite"])
def test_offline_verbs_follow_no_link_inside_the_store(tmp_path, what):
    """Root's own store with a symbolic link planted in it: purge, rebuild
    and import refuse it and write nothing where the link points."""
    m = Mount(tmp_path / "store", tmp_path / "mnt").mount()
    try:
        for i in range(6):
            (m.mnt / "tmp" / f"m{i}").write_bytes(b"Subject: %d\n\n" % i + b"y" * 3000)
            os.rename(m.mnt / "tmp" / f"m{i}", m.mnt / "cur" / f"m{i}:2,")
        (m.mnt / "notes").write_bytes(b"plain\n")
        for i in range(3):
            os.unlink(m.mnt / "cur" / f"m{i}:2,")
    finally:
        m.unmount()
    store = m.store
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rename(store / what, elsewhere / what)
    (store / what).symlink_to(elsewhere / what)
    before = tree_state(elsewhere)
    src = sample_maildir(tmp_path / "Maildir", messages=2)
    for verb in (["purge", store], ["import", store, src], ["rebuild", store]):
        r = adm(*verb)
        assert tree_state(elsewhere) == before, verb
        # A linked index is set aside by rebuild, which then makes a new
        # one; anything else is refused.
        if verb[0] != "rebuild" or what != "index.sqlite":
            assert r.returncode != 0, (verb, r.stdout, r.stderr)


def test_a_link_to_another_users_store_is_refused(scratch, user, tmp_path):
    """The test user's link to a store of nobody's: root must act neither
    as nobody on the test user's say-so nor as root."""
    name, uid, gid = user
    nobody = 65534
    src = sample_maildir(tmp_path / "Maildir", messages=3)
    # In a directory of root's only root writes to (a new store of root's
    # straight in /tmp is refused: another user could take its name).
    top = Path("/tmp") / (scratch.name + "-nobody")
    top.mkdir(mode=0o755)
    other = top / "store"
    try:
        assert adm("import", other, src).returncode == 0
        chown_tree(other, nobody, nobody)
        link = scratch / "store"
        os.symlink(other, link)
        os.chown(link, uid, gid, follow_symlinks=False)
        for verb in (["stats", link], ["purge", link], ["export", link, scratch / "out"]):
            r = adm(*verb)
            assert r.returncode == 2, (verb, r.stdout, r.stderr)
            assert "reached through" in r.stderr and len(r.stderr.splitlines()) == 1
        assert not (scratch / "out").exists()
        # Its own path works, as nobody.
        r = adm("stats", other)
        assert r.returncode == 0, r.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_root_backup_of_a_user_store_runs_as_the_user(scratch, user, tmp_path):
    """dboxadm backup run by root on a user's store drops to the user
    first: the backup is the user's (every file), a symbolic link the
    user planted in storage/ is not followed (root could read its target,
    the user cannot), the user's own check and mount find the backup
    whole; a DEST only root may write is refused, naming why (old code:
    a backup owned by root, made with root's rights)."""
    name, uid, gid = user
    store, src = user_store(scratch, user, messages=20)
    secret = tmp_path / "secret"          # root-only directory
    secret.write_text("root only\n")
    os.symlink(secret, store / "storage" / "m.999")
    os.lchown(store / "storage" / "m.999", uid, gid)

    r = adm("backup", store, tmp_path / "bk-root")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "owner" in r.stderr and f"uid {uid}" in r.stderr, r.stderr
    assert not (tmp_path / "bk-root").exists()
    assert not (tmp_path / "bk-root.partial").exists()

    bk = scratch / "bk"
    r = adm("backup", store, bk)
    assert r.returncode == 0, r.stderr
    assert set(owners(bk).values()) == {uid}
    assert bk.stat().st_uid == uid
    assert not (bk / "storage" / "m.999").exists()
    r = adm("check", bk, user=name)
    assert r.returncode == 0, r.stdout + r.stderr
    user_reads_everything(bk, src, user, scratch)


@pytest.mark.parametrize("verb", ["export", "import"])
def test_permission_denied_outside_the_store_says_whose_uid(scratch, user,
                                                            tmp_path, verb):
    """root runs dboxadm on a user's store: it switches to the user, so a
    root-only DIR (export) or MAILDIR (import) is denied - and the message
    says why."""
    name, uid, gid = user
    store = scratch / "store"
    src = sample_maildir(scratch / "Maildir", owner=name, messages=3)
    assert adm("import", store, src).returncode == 0
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o700)
    if verb == "export":
        r = adm("export", store, root_only / "out")
    else:
        sample_maildir(root_only / "Maildir", messages=3)
        r = adm("import", store, root_only / "Maildir")
    assert r.returncode != 0, r.stdout
    assert "Permission denied" in r.stderr, r.stderr
    assert f"(dboxadm runs as uid {uid}, who owns the store)" in r.stderr, \
        r.stderr
    if verb == "import":
        # A store not made yet is its directory's owner's: said so.
        r = adm("import", scratch / "new-store", root_only / "Maildir")
        assert r.returncode != 0 and f"(dboxadm runs as uid {uid}, who owns " \
            "the directory the new store is made in)" in r.stderr, r.stderr


def test_backup_resumes_no_partial_another_user_made(user, tmp_path):
    """Root backs up its own store into a shared sticky directory (a
    backup spool) where a user made DEST.partial first, writable by all:
    resuming it would let that user swap what root writes (an attack run
    replaced storage/m.1 of root's finished backup).  Refused; and a FIFO
    as the manifest's temporary file in root's own partial makes no
    backup wait forever."""
    store = tmp_path / "store"
    m = Mount(store, tmp_path / "mnt")
    m.mount().maildir()
    (m.mnt / "new" / "a").write_bytes(b"Subject: a\n\nbody\n")
    m.unmount()
    spool = Path(tempfile.mkdtemp(prefix="dboxfs-spool-", dir="/tmp"))
    try:
        spool.chmod(0o1777)
        r = as_user(user[0], ["mkdir", "-m", "777", spool / "today.partial"])
        assert r.returncode == 0, r
        r = adm("backup", store, spool / "today")
        assert r.returncode == 2 and "not used" in r.stderr, r
        assert not (spool / "today").exists()
        assert os.listdir(spool / "today.partial") == []

        mine = spool / "mine.partial"
        mine.mkdir(mode=0o700)
        (mine / "backup-manifest").write_bytes(b"dboxfs-backup 1\n")
        os.mkfifo(mine / "backup-manifest.new")
        r = subprocess.run([str(DBOXADM), "backup", str(store), str(spool / "mine")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r
        assert (spool / "mine" / "index.sqlite").is_file()
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def test_root_backup_refuses_a_directory_a_user_controls(scratch, user, tmp_path):
    """Root's backup made DEST.partial, then opened, recovered and renamed
    it again by path: a user owning DEST's directory swapped DEST.partial
    for a link to another store between two steps, and root's backup
    rewrote that store's index (every m.N of its ALT forgotten), or turned
    a finished backup the user renamed to DEST.partial into this one,
    pruning its mail (helper-91 F1).  A directory a user owns or others
    may write in (not sticky), or reached through a user's link, is
    refused before anything is made in it; root's own directories and a
    sticky spool work as before."""
    name, uid, gid = user
    store = tmp_path / "store"
    src = sample_maildir(tmp_path / "Maildir", messages=3)
    assert adm("import", store, src).returncode == 0
    users_dir = scratch / "spool"
    assert as_user(name, ["mkdir", "-m", "755", users_dir]).returncode == 0
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    root_dir = tmp_path / "root-only"
    root_dir.mkdir(mode=0o700)
    link = scratch / "to-root-only"
    assert as_user(name, ["ln", "-s", root_dir, link]).returncode == 0
    for dest, says in ((users_dir / "b1", f"belongs to uid {uid}"),
                       (open_dir / "b1", "others may write in it (mode 777)"),
                       (link / "b1", f"symbolic link of uid {uid}")):
        r = adm("backup", store, dest)
        assert r.returncode == 2, (dest, r.stdout, r.stderr)
        assert says in r.stderr, r.stderr
        assert sorted(os.listdir(dest.parent)) == [], dest
    r = adm("backup", store, root_dir / "b1")
    assert r.returncode == 0, r.stderr
    assert adm("check", root_dir / "b1").returncode == 0


def test_root_backup_through_a_users_vanishing_link_is_refused(user, tmp_path):
    """A user's link in a sticky spool took root's backup into a root-only
    directory: the directory was opened through the link, and the link
    was gone when the way to it was looked at, a step a lax walk skips
    (helper-93: 21 of 400 runs wrote there).  The walk is strict now: a
    step that went away refuses the backup.  The backup's test hook
    stops it right after the open, while the user takes the link away."""
    name = user[0]
    store = tmp_path / "store"
    src = sample_maildir(tmp_path / "Maildir", messages=2)
    assert adm("import", store, src).returncode == 0
    base = Path(tempfile.mkdtemp(prefix="dboxfs-vanish-", dir="/tmp"))
    base.chmod(0o755)   # the user reaches the spool
    spool = base / "spool"
    spool.mkdir()
    spool.chmod(0o1777)
    target = base / "root-only"
    target.mkdir(mode=0o755)
    assert as_user(name, ["ln", "-s", target, spool / "r"]).returncode == 0
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for point in ("opened", "indexed", "snapshot", "copied"):
        (hooks / f"{point}.go").touch()
    p = subprocess.Popen([str(DBOXADM), "backup", str(store), str(spool / "r" / "x")],
                         env=dict(os.environ, DBOXADM_BACKUP_HOOK=str(hooks)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(3000):
            if (hooks / "parent.reached").exists() or p.poll() is not None:
                break
            time.sleep(0.01)
        assert as_user(name, ["rm", spool / "r"]).returncode == 0
        (hooks / "parent.go").touch()
        out, err = p.communicate(timeout=120)
        left = os.listdir(target)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(base, ignore_errors=True)
    assert p.returncode == 2, (out, err)
    # Refused at the open (protected_symlinks) or at the walk.
    assert "went away" in err or "Permission denied" in err, err
    assert left == []


# --- 6. sources a user can point root's import at ----------------------

def test_root_import_refuses_a_source_reached_through_a_users_link(scratch, user,
                                                                    tmp_path):
    """A user's symbolic link to a maildir of root's (or to another
    user's mdbox) must not make root's import read it: the import read
    root's mail into a store the user was to get."""
    name = user[0]
    private = tmp_path / "private"
    for sub in ("cur", "new", "tmp"):
        (private / "Maildir" / sub).mkdir(parents=True)
    (private / "Maildir" / "cur" / "1.secret:2,S").write_bytes(b"root's mail\n")
    private.chmod(0o700)
    link = scratch / "Maildir"
    assert as_user(name, ["ln", "-s", private / "Maildir", link]).returncode == 0
    for verb, what in (("import", "MAILDIR"), ("import-dovecot", "DOVECOT_MDBOX_ROOT")):
        store = tmp_path / f"store-{verb}"
        r = adm(verb, store, link)
        assert r.returncode == 2, r
        assert f"{what} {link}: owned by uid 0 but reached through a symbolic " \
            f"link or directory of uid {user[1]}" in r.stderr, r.stderr
        assert not store.exists()
    # By its own path, root's maildir imports as before.
    assert adm("import", tmp_path / "store", private / "Maildir").returncode == 0


def test_import_dovecot_path_cannot_write_doveadms_config(scratch, user, tmp_path):
    """The mdbox root's real path goes into the dovecot.conf of the run:
    a user's directory named with newlines added settings of the user's
    choosing (a mail_uid of another user: doveadm read that user's mail,
    and root linked it into the store).  Refused before anything runs;
    so is a storage/ that is a symbolic link (to another user's files)."""
    name = user[0]
    evil = scratch / "x\nprotocol doveadm {\nmail_uid = 0\n}\n#"
    assert as_user(name, ["mkdir", "-p", evil / "storage"]).returncode == 0
    store = tmp_path / "store"
    r = adm("import-dovecot", store, evil)
    assert r.returncode == 2, r
    assert "holds a character doveadm's configuration cannot carry" in r.stderr, r
    assert not store.exists()

    root = scratch / "mdbox"
    assert as_user(name, ["mkdir", root]).returncode == 0
    assert as_user(name, ["ln", "-s", tmp_path, root / "storage"]).returncode == 0
    r = adm("import-dovecot", store, root)
    assert r.returncode == 2 and "storage: Not a directory" \
        in r.stderr, r
    assert not store.exists()


# As the user: once root's export reaches y/, move the export directory
# away and put in its place one whose x/a is a symbolic link to TARGET.
SWAP_EXPORT_PY = r"""
import os, sys, time
exp, target = sys.argv[1], sys.argv[2]
deadline = time.time() + 60
while not os.path.exists(os.path.join(exp, "y")) and time.time() < deadline:
    time.sleep(0.0005)
os.rename(exp, exp + ".moved")
os.makedirs(os.path.join(exp, "x"))
os.symlink(target, os.path.join(exp, "x", "a"))
"""


def test_root_export_links_no_file_through_a_users_switch(scratch, user, tmp_path):
    """Root exports a store of root's with a hard-linked file into a
    directory of a user's.  While export copied y/, the user switched
    the export directory for one whose x/a is a link to a root-only
    directory: export made the second name by linkat() of the first
    one's path, and so gave root's file a name in the user's tree (it
    links from the first name's own directory now).  Since helper-79 F1
    the user's directory is refused before anything is written: root's
    file gets no other name."""
    name = user[0]
    src = tmp_path / "src"
    for sub in ("cur", "x/a", "y", "zz"):
        (src / sub).mkdir(parents=True)
    (src / "x" / "a" / "f").write_bytes(b"exported\n")
    for i in range(5000):
        (src / "y" / f"f{i}").write_bytes(b"%d\n" % i)
    os.link(src / "x" / "a" / "f", src / "zz" / "f2")
    store = tmp_path / "store"
    assert adm("import", store, src).returncode == 0
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "f").write_bytes(b"root's secret\n")
    (private / "f").chmod(0o600)
    secret = (private / "f").stat()

    exp = scratch / "exp"
    assert as_user(name, ["mkdir", exp]).returncode == 0
    swap = scratch / "swap.py"
    swap.write_text(SWAP_EXPORT_PY)
    swap.chmod(0o644)
    racer = subprocess.Popen(["runuser", "-u", name, "--", sys.executable,
                              str(swap), str(exp), str(private)])
    try:
        r = adm("export", store, exp)
    finally:
        racer.kill()
        racer.wait(timeout=90)
    # Since helper-79 F1: refused before anything is written there.
    assert r.returncode == 2 and f"uid {user[1]}" in r.stderr, r.stderr
    assert secret.st_nlink == (private / "f").stat().st_nlink == 1
    for d, _dirs, files in os.walk(scratch):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            assert (st.st_dev, st.st_ino) != (secret.st_dev, secret.st_ino), (d, f)


def test_an_unreadable_source_directory_is_not_made_empty(scratch, user):
    """A directory of the source the importing user cannot open fails as
    one item and is not made in the store (it was, empty)."""
    name = user[0]
    src = scratch / "Maildir"
    for sub in ("cur", "new", "tmp", ".Locked/cur", ".Open/cur"):
        assert as_user(name, ["mkdir", "-p", src / sub]).returncode == 0
    assert as_user(name, ["chmod", "000", src / ".Locked"]).returncode == 0
    store = scratch / "store"
    r = adm("import", store, src, user=name)
    assert r.returncode == 1 and ".Locked: Permission denied" in r.stderr, r
    exp = scratch / "exp"
    assert adm("export", store, exp, user=name).returncode == 0
    assert sorted(os.listdir(exp)) == [".Open", "cur", "new", "tmp"]


@pytest.mark.parametrize("writeback", [False, True], ids=["default", "writeback_cache"])
def test_truncating_open_by_another_user_drops_setid_bits_as_ext4(scratch, user,
                                                                   tmp_path, writeback):
    """Another user truncating root's set-user-ID or set-group-ID file
    with open(O_TRUNC), in a sticky world-writable folder of root's
    allow_other mount: ext4 drops set-user-ID, and set-group-ID when group
    execute is set or the writer is not in the file's group; dboxfs kept
    them all (helper-79 F5: the kernel leaves it to the daemon when O_TRUNC
    comes with the OPEN).  The same steps on a plain directory and on the
    mount, messages and plain files, give the same modes."""
    name = user[0]
    opts = "allow_other,writeback_cache" if writeback else "allow_other"
    m = Mount(tmp_path / "store", scratch / "mnt", options=["-o", opts]).mount()
    modes = {}
    try:
        for where, root in (("ext4", scratch / "ext4"), ("dboxfs", m.mnt)):
            d = root / "cur"
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(root, 0o755)
            os.chmod(d, 0o1777)
            names = []
            for mode in (0o6777, 0o6767, 0o2777, 0o2767, 0o4766):
                for n in (f"1.m{mode:o}:2,S", f".plain{mode:o}"):
                    (d / n).write_bytes(b"Subject: x\n\nset-id\n")
                    os.chmod(d / n, mode)
                    names.append(n)
            for n in names:
                r = as_user(name, [sys.executable, "-c",
                                   "import os, sys; os.close(os.open(sys.argv[1], "
                                   "os.O_WRONLY | os.O_TRUNC))", d / n])
                assert r.returncode == 0, (where, n, r.stderr)
            modes[where] = {n: oct(stat.S_IMODE(os.stat(d / n).st_mode))
                            for n in names}
    finally:
        m.unmount()
    assert modes["dboxfs"] == modes["ext4"]
    assert modes["ext4"]["1.m6777:2,S"] == "0o777"   # the reference did drop them
