"""Mounting the standard ways, with the installed programs.

- `mount -t fuse.dboxfs STORE MNT -o defaults,_netdev` goes through
  mount.fuse3, which finds dboxfs by its default PATH (/usr/local/bin
  among it); `umount MNT` ends the daemon.  The same from an fstab line
  with `mount --fstab FILE MNT` (the real /etc/fstab is never touched),
  and with `setuid=USER`, which runs the daemon as that user (a user's
  mail mounted at boot).  These run in a private mount namespace where the
  DESTDIR install is bind-mounted on /usr/local/bin.
- An ordinary user mounts with dboxfs (fusermount3 underneath), delivers
  and reads mail, unmounts with `fusermount3 -u` and with `umount`; root
  cannot look in (no allow_other).
- allow_other: refused for a user without `user_allow_other` in
  /etc/fuse.conf, and with it other users get in, the kernel still
  checking modes (default_permissions).

Non-root mounts need /dev/fuse open to users (Debian's 0666; containers
often have 0600): the tests that need it set it, and /etc/fuse.conf, under
a lock and restore both in teardown (sysenv.system_settings).
"""
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import DBOXADM, DBOXFS, is_mounted, unmount
from sysenv import (MountNamespace, as_user, install, mount_options, need_root,
                    sample_maildir, store_released, system_settings,
                    unprivileged_user, user_scratch)

pytestmark = pytest.mark.skipif(shutil.which("mount.fuse3") is None,
                                reason="fuse3 (mount.fuse3) not installed")

LETTER = (b"From: Alice <alice@example.org>\nTo: bob@example.org\n"
          b"Subject: delivered through the mount\n\nHello Bob.\n")


@pytest.fixture(scope="module")
def bindir(tmp_path_factory):
    need_root()
    d = tmp_path_factory.mktemp("destdir")
    r = install(d)
    assert r.returncode == 0, r.stderr
    return d / "usr/local/bin"


@pytest.fixture
def user():
    need_root()
    return unprivileged_user()


@pytest.fixture
def scratch(user):
    """A /tmp directory the test user owns; mounts in it are undone and it
    is removed in teardown."""
    d = user_scratch(user[0], "dboxfs-mounting-")
    try:
        yield d
    finally:
        unmount(d / "mnt")
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def namespace(bindir, scratch):
    ns = MountNamespace(scratch, bindir=bindir)
    try:
        yield ns
    finally:
        ns.close()


def deliver(mnt, name):
    """A shell command delivering stdin as a maildir does: written in tmp/,
    renamed into new/."""
    return ["sh", "-c", f'cat > "{mnt}/tmp/{name}" && mv "{mnt}/tmp/{name}" "{mnt}/new/{name}"']


def test_mount_type_fuse_dboxfs_and_umount(namespace, scratch, user):
    # The user's maildir in the user's directory: root's import refuses a
    # root-owned one reached through a user's directory.
    src = sample_maildir(scratch / "Maildir", owner=user[0])
    store, mnt = scratch / "store", scratch / "mnt"
    mnt.mkdir()
    r = subprocess.run([str(DBOXADM), "import", str(store), str(src)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr

    r = namespace.run(["mount", "-t", "fuse.dboxfs", store, mnt, "-o", "defaults,_netdev"])
    assert r.returncode == 0, r.stderr
    fstype, opts = mount_options(namespace.mounts_file, mnt)
    # root's alone: the daemon checks permissions (docs/design.md)
    assert fstype == "fuse.dboxfs" and "default_permissions" not in opts, opts
    assert not is_mounted(mnt)  # only inside the namespace
    r = namespace.run(["diff", "-r", src, mnt])
    assert r.returncode == 0, r.stdout[-2000:]

    r = namespace.run(["umount", mnt])
    assert r.returncode == 0, r.stderr
    assert mount_options(namespace.mounts_file, mnt) is None
    assert store_released(store), "the daemon did not exit after umount"


def test_fstab_line_mount_by_mountpoint(namespace, scratch):
    store, mnt = scratch / "store", scratch / "mnt"
    mnt.mkdir()
    fstab = scratch / "fstab"
    # nosuid,nodev as the documented lines have them: mount.fuse3 mounts
    # dev,suid otherwise (dboxfs run directly mounts nosuid,nodev).
    fstab.write_text(f"# dboxfs test\n{store}  {mnt}  fuse.dboxfs  "
                     "defaults,nosuid,nodev,_netdev  0 0\n")

    r = namespace.run(["mount", "--fstab", fstab, mnt])
    assert r.returncode == 0, r.stderr
    fstype, opts = mount_options(namespace.mounts_file, mnt)
    assert fstype == "fuse.dboxfs"
    assert {"nosuid", "nodev"} <= set(opts), opts
    # A new store is an empty INBOX; deliver to it, then read it back after
    # a second mount from the same line.
    r = namespace.run(["ls", mnt])
    assert r.stdout.split() == ["cur", "new", "tmp"]
    namespace.run(deliver(mnt, "m1"), input=LETTER.decode(), check=True)
    r = namespace.run(["umount", mnt])
    assert r.returncode == 0, r.stderr
    assert store_released(store)

    r = namespace.run(["mount", "--fstab", fstab, mnt])
    assert r.returncode == 0, r.stderr
    assert namespace.run(["cat", mnt / "new/m1"]).stdout == LETTER.decode()
    assert namespace.run(["umount", mnt]).returncode == 0
    assert store_released(store)


def test_fstab_setuid_runs_the_daemon_as_the_user(namespace, scratch, user):
    name, uid, gid = user
    src = sample_maildir(scratch / "Maildir", owner=name, messages=20)
    store, mnt = scratch / "store", scratch / "mnt"
    mnt.mkdir()
    shutil.chown(mnt, name, name)
    r = as_user(name, [DBOXADM, "import", store, src])
    assert r.returncode == 0, r.stderr
    fstab = scratch / "fstab"
    fstab.write_text(f"{store}  {mnt}  fuse.dboxfs  setuid={name},_netdev  0 0\n")

    with system_settings() as settings:
        settings.users_may_mount()
        r = namespace.run(["mount", "--fstab", fstab, mnt])
        try:
            assert r.returncode == 0, r.stderr
            fstype, opts = mount_options(namespace.mounts_file, mnt)
            assert f"user_id={uid}" in opts, opts
            # The user's mount: the user reads it, root is kept out.
            r = namespace.run(["diff", "-r", src, mnt], user=name)
            assert r.returncode == 0, r.stdout[-2000:]
            r = namespace.run(["ls", mnt])
            assert r.returncode != 0 and "Permission denied" in r.stderr
            r = namespace.run(deliver(mnt, "m1"), user=name, input=LETTER.decode())
            assert r.returncode == 0, r.stderr
            r = namespace.run(["stat", "-c", "%u", mnt / "new/m1"], user=name)
            assert r.stdout.strip() == str(uid), r.stderr
        finally:
            r = namespace.run(["umount", mnt])
        assert r.returncode == 0, r.stderr
        assert store_released(store)
    # Store files stay the user's.
    assert {(p.stat().st_uid) for p in store.rglob("*")} == {uid}


def test_ordinary_user_mounts_uses_and_unmounts(scratch, user):
    name, uid, gid = user
    src = sample_maildir(scratch / "Maildir", owner=name, messages=20)
    store, mnt = scratch / "store", scratch / "mnt"
    r = as_user(name, ["mkdir", mnt])
    assert r.returncode == 0, r.stderr
    r = as_user(name, [DBOXADM, "import", store, src])
    assert r.returncode == 0, r.stderr

    with system_settings() as settings:
        settings.users_may_mount()
        r = as_user(name, [DBOXFS, store, mnt])
        assert r.returncode == 0, r.stderr
        try:
            assert is_mounted(mnt)
            r = as_user(name, ["diff", "-r", src, mnt])
            assert r.returncode == 0, r.stdout[-2000:]
            as_user(name, deliver(mnt, "m1"), input=LETTER.decode(), check=True)
            r = as_user(name, ["stat", "-c", "%u %s", mnt / "new/m1"])
            assert r.stdout.split() == [str(uid), str(len(LETTER))]
            with pytest.raises(PermissionError):
                os.listdir(mnt)  # root too: the mount is the user's alone
            r = as_user(name, ["fusermount3", "-u", mnt])
            assert r.returncode == 0, r.stderr
            assert not is_mounted(mnt)
            assert store_released(store)

            # Again, ended with umount(8) as the user this time.
            r = as_user(name, [DBOXFS, store, mnt])
            assert r.returncode == 0, r.stderr
            r = as_user(name, ["cat", mnt / "new/m1"], text=False)
            assert r.stdout == LETTER
            r = as_user(name, ["umount", mnt])
            assert r.returncode == 0, r.stderr
            assert not is_mounted(mnt)
            assert store_released(store)
        finally:
            unmount(mnt)


def test_allow_other_needs_user_allow_other(scratch, user):
    name, uid, gid = user
    src = sample_maildir(scratch / "Maildir", owner=name, messages=10)
    # The user's mail is private: messages 0600, folders 0700 below a
    # world-readable root.
    for p in src.rglob("*"):
        p.chmod(0o700 if p.is_dir() else 0o600)
    src.chmod(0o755)
    store, mnt = scratch / "store", scratch / "mnt"
    as_user(name, ["mkdir", mnt], check=True)
    r = as_user(name, [DBOXADM, "import", store, src])
    assert r.returncode == 0, r.stderr
    message = Path("cur") / next((src / "cur").iterdir()).name

    with system_settings() as settings:
        settings.users_may_mount()
        settings.user_allow_other(False)
        r = as_user(name, [DBOXFS, "-o", "allow_other", store, mnt])
        try:
            assert r.returncode != 0
            assert "user_allow_other" in r.stderr, r.stderr
            assert not is_mounted(mnt)
            assert store_released(store)

            settings.user_allow_other(True)
            r = as_user(name, [DBOXFS, "-o", "allow_other", store, mnt])
            assert r.returncode == 0, r.stderr
            assert "allow_other" in mount_options("/proc/mounts", mnt)[1]
            # root gets in, and reads what the user stored.
            assert sorted(os.listdir(mnt)) == sorted(os.listdir(src))
            assert (mnt / message).read_bytes() == (src / message).read_bytes()
            # Another ordinary user gets in too, but the modes still hold.
            r = as_user("nobody", ["ls", mnt])
            assert r.returncode == 0 and "cur" in r.stdout.split(), r.stderr
            r = as_user("nobody", ["ls", mnt / "cur"])
            assert r.returncode != 0 and "Permission denied" in r.stderr
        finally:
            unmount(mnt)
    assert store_released(store)


@pytest.mark.parametrize("options", [["-o", "writeback_cache"], []],
                         ids=["writeback_cache", "default"])
def test_root_stop_unmounts_nothing_a_user_put_at_its_path(tmp_path, scratch,
                                                           user, options):
    """Root's mount at a path through a user's directory: the user swaps
    the directory for a link to another mount.  At SIGTERM root unmounted
    that path and took the other mount away (a tmpfs in the attack run:
    helper-56).  Now the stop checks that the path still holds this very
    mount and leaves anything else alone."""
    name = user[0]
    store = tmp_path / "store"
    as_user(name, ["mkdir", "-p", scratch / "mp" / "mnt"], check=True)
    victim = tmp_path / "victim"
    (victim / "mnt").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                    victim / "mnt"], check=True)
    daemon = subprocess.Popen([str(DBOXFS), str(store), str(scratch / "mp" / "mnt"),
                               "-f", *options], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    moved = scratch / "mp2" / "mnt"
    try:
        deadline = time.monotonic() + 30
        while not is_mounted(scratch / "mp" / "mnt"):
            assert daemon.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        as_user(name, ["mv", scratch / "mp", scratch / "mp2"], check=True)
        as_user(name, ["ln", "-s", victim, scratch / "mp"], check=True)
        daemon.send_signal(signal.SIGTERM)
        time.sleep(1)
        assert is_mounted(victim / "mnt"), "the user's choice was unmounted"
        # Still served where it went, until unmounted there.
        assert daemon.poll() is None
        unmount(moved)
        assert daemon.wait(timeout=60) == 0
        assert is_mounted(victim / "mnt")
        said = daemon.stderr.read()
        assert "cannot detach it" in said, said
        assert "another mount is there now" in said, said
    finally:
        daemon.kill()
        unmount(moved)
        subprocess.run(["umount", "-l", str(victim / "mnt")])


def test_the_mount_line_names_both_paths_absolute(tmp_path):
    """'mounted STORE on MNT' gives both paths absolute (the store was shown
    as typed, relative, beside libfuse's absolute mount point)."""
    (tmp_path / "mnt").mkdir()
    r = subprocess.run([str(DBOXFS), "store", "mnt"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert f"mounted {tmp_path}/store on {tmp_path}/mnt " in r.stderr, r.stderr
    finally:
        unmount(tmp_path / "mnt")


def test_a_failed_first_mount_leaves_no_store_behind(scratch, user):
    """A mount refused after its new store was made (here allow_other
    without user_allow_other) takes that store back: the path does not
    exist again, an empty directory is empty again; a store that was there
    before keeps everything."""
    name = user[0]
    mnt, new, empty = scratch / "mnt", scratch / "new-store", scratch / "empty"
    for d in (mnt, empty):
        as_user(name, ["mkdir", d], check=True)
    src = sample_maildir(scratch / "Maildir", owner=name, messages=3)
    old = scratch / "old-store"
    as_user(name, [DBOXADM, "import", old, src], check=True)
    before = sorted(p.name for p in old.iterdir())

    with system_settings() as settings:
        settings.users_may_mount()
        settings.user_allow_other(False)
        said = {}
        try:
            for store in (new, empty, old):
                r = as_user(name, [DBOXFS, "-o", "allow_other", store, mnt])
                assert r.returncode != 0 and "user_allow_other" in r.stderr, r.stderr
                assert not is_mounted(mnt)
                said[store] = "removed the new store" in r.stderr
        finally:
            unmount(mnt)
    assert said == {new: True, empty: True, old: False}, said
    assert not new.exists()
    assert list(empty.iterdir()) == []
    assert sorted(p.name for p in old.iterdir()) == before
    r = as_user(name, [DBOXADM, "check", old])
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("options", [("-o", "writeback_cache"), ()],
                         ids=["writeback_cache", "default"])
def test_sigterm_keeps_what_write_returned(make_mount, options):
    """Stopping the daemon with SIGTERM (systemd's stop) keeps every byte
    whose write(2) returned, as a local filesystem does when a program is
    stopped.  With -o writeback_cache the kernel holds such bytes in its
    page cache; libfuse's handler ended the session at once and they were
    lost: Dovecot's index log, still open, came back 40 bytes long instead
    of 30,040, and acknowledged IMAP flag changes and expunges were undone
    (an attack run).  The daemon exits 0: the stop is an orderly one."""
    m = make_mount(options=options)
    log = m.mnt / "dovecot.index.log"
    with open(log, "wb") as f:
        f.write(b"H" * 40)
    fds = [os.open(log, os.O_WRONLY | os.O_APPEND)]
    chunk = 1 << 20
    big = {m.mnt / f"big{k}": [b"%08d" % (k * 100 + i) * (chunk // 8) for i in range(8)]
           for k in range(3)}
    msg = m.mnt / "tmp" / "1.M1P1.host"
    msg_bytes = b"Subject: open at the stop\n\n" + b"body\n" * 2000
    try:
        assert os.write(fds[0], b"L" * 30000) == 30000
        (m.mnt / "dovecot.index.tmp").write_bytes(b"I" * 1000)
        os.rename(m.mnt / "dovecot.index.tmp", m.mnt / "dovecot.index")
        # Megabytes still in the kernel's cache when the signal comes
        # (30 KB alone came through now and then: the stop first synced
        # the mount, which does not wait for FUSE's WRITEs).
        for path, chunks in big.items():
            fds.append(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            for c in chunks:
                assert os.write(fds[-1], c) == chunk
        # A message still open for writing: kept as written, as a plain
        # file is (its record was dropped at the next mount as a write
        # in flight, and its save leaked: LeakSanitizer, an attack run).
        fds.append(os.open(msg, os.O_WRONLY | os.O_CREAT, 0o600))
        assert os.write(fds[-1], msg_bytes) == len(msg_bytes)
        proc = m.proc
        proc.send_signal(signal.SIGTERM)
        # The mount is detached at once, but the files open on it go on
        # taking writes, and the daemon serves them until the last is
        # closed: bytes written after the signal are kept too (an attack
        # run lost megabytes written during the stop), and without
        # writeback_cache, a client in the middle of a read or delivery
        # no longer gets ENOTCONN (helper-80).
        deadline = time.monotonic() + 30
        while is_mounted(m.mnt):
            assert time.monotonic() < deadline, "never detached"
            time.sleep(0.05)
        more = b"M" * 5000
        for _ in range(20):
            assert os.write(fds[0], more) == len(more)
            time.sleep(0.05)
        assert proc.poll() is None, "stopped with files open"
        for fd in fds:
            os.close(fd)
        fds = []
        assert proc.wait(timeout=60) == 0
        m.proc = None
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
    unmount(m.mnt)
    m.mount()
    assert log.read_bytes() == b"H" * 40 + b"L" * 30000 + b"M" * 100000
    assert (m.mnt / "dovecot.index").read_bytes() == b"I" * 1000
    for path, chunks in big.items():
        assert path.read_bytes() == b"".join(chunks), path
    assert msg.read_bytes() == msg_bytes
    assert "SIGTERM" in m.log.read_text() or "Terminated" in m.log.read_text()
