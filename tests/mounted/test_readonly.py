"""A healthy store on read-only media.

A store on a read-only filesystem (here a read-only bind mount, as a
snapshot, a backup disk mounted ro, or a CD would be) is a healthy store:
the read-only verbs of dboxadm work on it, and `dboxfs -o ro` mounts it,
where every change fails with EROFS exactly as on a read-only ext4
maildir.
"""
import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import DBOXADM, DBOXFS, Mount, is_mounted, unmount
from sysenv import (as_user, need_root, sample_maildir, unprivileged_user,
                    user_scratch)


def adm(*args):
    return subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                          text=True, timeout=300)


class RoBind:
    """A read-only bind mount of src on dst, taken away on close."""

    def __init__(self, src, dst):
        need_root()
        dst.mkdir()
        subprocess.run(["mount", "--bind", "-o", "ro", str(src), str(dst)],
                       check=True, capture_output=True)
        self.dst = dst

    def close(self):
        subprocess.run(["umount", str(self.dst)], capture_output=True)


@pytest.fixture
def ro_store(tmp_path):
    """(read-only view of a store, its source maildir)."""
    src = sample_maildir(tmp_path / "Maildir", messages=20)
    (src / ".mbsyncstate").write_bytes(b"state\n")
    r = adm("import", tmp_path / "store", src)
    assert r.returncode == 0, r.stderr
    b = RoBind(tmp_path / "store", tmp_path / "ro")
    try:
        yield b.dst, src
    finally:
        unmount(tmp_path / "mnt")
        b.close()


def test_read_only_verbs_work_on_read_only_media(ro_store, tmp_path):
    ro, src = ro_store
    before = sorted(os.listdir(ro))
    r = adm("check", ro)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 problems" in r.stdout and "unreadable" not in r.stdout + r.stderr
    r = adm("stats", ro)
    assert r.returncode == 0, r.stderr
    assert "messages            20 " in r.stdout, r.stdout
    r = adm("export", ro, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["diff", "-r", src, tmp_path / "out"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout[-2000:]
    r = adm("dump", ro, "m.1")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[1].split("\t")
    r = subprocess.run([str(DBOXADM), "cat", str(ro), "m.1", first[0]],
                       capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    assert r.stdout in {p.read_bytes() for p in src.rglob("*") if p.is_file()}
    r = adm("backup", ro, tmp_path / "bk")
    assert r.returncode == 0, r.stderr
    r = adm("check", tmp_path / "bk")
    assert r.returncode == 0 and "0 problems" in r.stdout, r.stdout + r.stderr
    assert sorted(os.listdir(ro)) == before


def write_steps(root):
    """The same changes tried on a maildir tree: (step, errno) each."""
    cur = root / "cur"
    name = sorted(os.listdir(cur))[0]
    steps = [
        ("create", lambda: open(root / "tmp" / "new", "wb").close()),
        ("append", lambda: open(cur / name, "ab").close()),
        ("mkdir", lambda: os.mkdir(root / ".New")),
        ("rename", lambda: os.rename(cur / name, cur / (name + "T"))),
        ("unlink", lambda: os.unlink(cur / name)),
        ("plain-file write", lambda: open(root / ".mbsyncstate", "r+b").close()),
        ("utime", lambda: os.utime(cur / name, (0, 0))),
        ("chmod", lambda: os.chmod(cur / name, 0o644)),
    ]
    out = []
    for what, step in steps:
        try:
            step()
            out.append((what, 0))
        except OSError as e:
            out.append((what, e.errno))
    return out


def test_ro_mount_of_read_only_media_is_a_read_only_maildir(ro_store, tmp_path):
    ro, src = ro_store
    ref = RoBind(src, tmp_path / "ref")  # the reference: ext4, read-only
    try:
        m = Mount(ro, tmp_path / "mnt", options=["-o", "ro"]).mount()
        try:
            r = subprocess.run(["diff", "-r", src, m.mnt], capture_output=True,
                               text=True)
            assert r.returncode == 0, r.stdout[-2000:]
            got, want = write_steps(m.mnt), write_steps(ref.dst)
            assert got == want
            assert {e for _, e in got} == {errno.EROFS}
            r = subprocess.run(["diff", "-r", src, m.mnt], capture_output=True,
                               text=True)
            assert r.returncode == 0, r.stdout[-2000:]
        finally:
            m.unmount()
        assert "read-only" in m.log_text()
    finally:
        ref.close()


def test_read_only_view_of_a_mounted_store(tmp_path):
    """While the store is mounted (its WAL live), a read-only view of it
    is read with the WAL: export sees the message just delivered."""
    m = Mount(tmp_path / "store", tmp_path / "mnt").mount()
    b = None
    try:
        (m.mnt / "tmp" / "a").write_bytes(b"Subject: a\n\nfresh\n")
        os.rename(m.mnt / "tmp" / "a", m.mnt / "new" / "a")
        b = RoBind(m.store, tmp_path / "ro")
        r = adm("export", b.dst, tmp_path / "out")
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "out" / "new" / "a").read_bytes() == b"Subject: a\n\nfresh\n"
    finally:
        if b is not None:
            b.close()
        m.unmount()


def test_ro_mount_attempts_no_write(tmp_path):
    """-o ro of a writable store: reading and listing everything (atime
    due: relatime) writes nothing, so the log has no failed write, and
    makes nothing in the store either: SQLite's mode=ro made
    index.sqlite-wal and -shm, which stayed (helper-80: in a backup
    mounted -o ro)."""
    src = sample_maildir(tmp_path / "Maildir", messages=5)
    (src / ".mbsyncstate").write_bytes(b"state\n")
    r = adm("import", tmp_path / "store", src)
    assert r.returncode == 0, r.stderr
    store = tmp_path / "store"
    files = {p.name: p.read_bytes() for p in sorted(store.rglob("*"))
             if p.is_file() and p.name != "lock"}
    assert "index.sqlite-wal" not in files
    m = Mount(tmp_path / "store", tmp_path / "mnt", options=["-o", "ro"]).mount()
    try:
        for p in sorted(m.mnt.rglob("*")):
            if p.is_dir():
                os.listdir(p)
            else:
                p.read_bytes()
    finally:
        m.unmount()
    log = m.log_text()
    assert "readonly database" not in log and "not stored" not in log, log
    assert {p.name: p.read_bytes() for p in sorted(store.rglob("*"))
            if p.is_file() and p.name != "lock"} == files


def run_rw_mount(store, mnt, user=None):
    """dboxfs STORE MNT without -o ro, as user; (returncode, stderr).  A
    mount it makes (it must not) is taken away again."""
    args = [str(DBOXFS), str(store), str(mnt), "-f"]
    if user is not None:
        args = ["runuser", "-u", user, "--", *args]
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        unmount(mnt)
        _, err = p.communicate(timeout=60)
    return p.returncode, err


def test_rw_mount_of_read_only_media_says_mount_it_ro(ro_store, tmp_path):
    ro, _ = ro_store
    (tmp_path / "mnt").mkdir()
    rc, err = run_rw_mount(ro, tmp_path / "mnt")
    assert rc != 0 and not is_mounted(tmp_path / "mnt")
    assert f"the store is read-only ({ro}): mount it with -o ro" in err, err
    assert "rebuild" not in err, err


def test_rw_mount_of_unwritable_store_says_mount_it_ro(tmp_path):
    """chmod a-w STORE (its owner may not write it; root may): read-only,
    never 'unreadable, run rebuild'."""
    user, _, _ = unprivileged_user()
    d = user_scratch(user, "dboxfs-ro-")
    try:
        src = sample_maildir(d / "Maildir", owner=user, messages=5)
        r = as_user(user, [DBOXADM, "import", d / "store", src])
        assert r.returncode == 0, r.stderr
        for p in (d / "store").glob("index.sqlite-*"):
            if p.name != "index.sqlite-reserve":
                p.unlink()
        (d / "store").chmod(0o500)
        mnt = d / "mnt"
        mnt.mkdir()
        shutil.chown(mnt, user, user)
        rc, err = run_rw_mount(d / "store", mnt, user)
        assert rc != 0 and not is_mounted(mnt)
        assert f"the store is read-only ({d / 'store'}): mount it with -o ro" \
            in err, err
        assert "rebuild" not in err and "unreadable" not in err, err
    finally:
        unmount(d / "mnt")
        shutil.rmtree(d)


@pytest.mark.parametrize("verb", [["purge"], ["altmove", "--older-than=1"]])
def test_purge_on_a_ro_mount_says_it_is_read_only(tmp_path, verb):
    """purge/altmove while a -o ro mount holds the store (after a
    read-write mount left 'closing' in STORE/lock): refused at once with
    the reason, not a wait and three wrong guesses."""
    m = Mount(tmp_path / "store", tmp_path / "mnt").mount()
    (m.mnt / "new" / "a").write_bytes(b"Subject: a\n\na\n")
    m.unmount()
    ro = Mount(tmp_path / "store", tmp_path / "mnt", options=["-o", "ro"]).mount()
    try:
        r = subprocess.run([str(DBOXADM), verb[0], str(ro.store), *verb[1:],
                            "--alt=" + str(tmp_path)] if verb[0] == "altmove"
                           else [str(DBOXADM), verb[0], str(ro.store)],
                           capture_output=True, text=True, timeout=50)
        pid = ro.proc.pid
    finally:
        ro.unmount()
    assert r.returncode != 0
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert f"{ro.store} is mounted read-only (pid {pid}, a dboxfs mount on " \
        f"{ro.mnt}): {verb[0]} needs a read-write mount of it or the " \
        "store unmounted" in lines[0], r.stderr


def test_holder_named_after_going_to_the_background(tmp_path):
    """A mount without -f forks into the background after taking the
    store's lock: the refusal names the daemon (the pid in STORE/lock),
    not the parent that took the lock and exited (/proc/locks)."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run([str(DBOXFS), str(store), str(mnt)], check=True,
                   capture_output=True, timeout=60)
    try:
        daemon = int((store / "lock").read_text().split("\n")[0])
        assert os.path.exists(f"/proc/{daemon}")
        r = subprocess.run([str(DBOXADM), "rebuild", str(store)],
                           capture_output=True, text=True, timeout=60)
    finally:
        unmount(mnt)
    assert r.returncode != 0
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert f"(pid {daemon}, a dboxfs mount on {mnt})" in r.stderr, r.stderr


def test_holder_of_a_mount_made_with_relative_paths(tmp_path):
    """Two stores mounted from different working directories, each as
    `dboxfs store mnt`: the refusal for the first store names its own
    mount point, not the one mounted after it.  The daemon's command line says only "mnt", and the
    name was matched against the end of every dboxfs mount point, so the
    first one's was given (a new user's trial: an admin following it
    would unmount another user's mail)."""
    mounts = []
    try:
        for side in ("one", "two"):
            (tmp_path / side / "mnt").mkdir(parents=True)
            subprocess.run([str(DBOXFS), "store", "mnt"], cwd=tmp_path / side,
                           check=True, capture_output=True, timeout=60)
            mounts.append(tmp_path / side / "mnt")
        r = subprocess.run([str(DBOXADM), "rebuild", "store"], cwd=tmp_path / "one",
                           capture_output=True, text=True, timeout=60)
    finally:
        for mnt in mounts:
            unmount(mnt)
    assert r.returncode != 0
    assert f"a dboxfs mount on {tmp_path / 'one' / 'mnt'})" in r.stderr, r.stderr


def test_a_background_read_only_mount_is_named_without_empty_parentheses(tmp_path):
    """A -o ro mount gone to the background leaves no holder text: the
    refusal of a read-write mount and of dboxadm says 'mounted read-only'
    and what to do, with no '()' (helper-54)."""
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    Mount(store, mnt).mount().unmount()
    subprocess.run([str(DBOXFS), str(store), str(mnt), "-o", "ro"], check=True,
                   capture_output=True, timeout=60)
    try:
        (tmp_path / "mnt2").mkdir()
        rc, err = run_rw_mount(store, tmp_path / "mnt2")
        r = subprocess.run([str(DBOXADM), "purge", str(store)],
                           capture_output=True, text=True, timeout=60)
    finally:
        unmount(mnt)
    assert rc != 0 and r.returncode != 0
    assert f"{store} is mounted read-only" in err, err
    assert f"{store} is mounted read-only" in r.stderr, r.stderr
    assert "()" not in err + r.stderr, err + r.stderr
    assert "until that mount is unmounted" in err, err


def test_second_mount_names_the_holder(tmp_path):
    """A store in use: the message names the pid and the mount point of
    the mount holding it; a read-only one is called read-only."""
    for opts, words in (([], "store is in use by another process (pid"),
                        (["-o", "ro"], "is mounted read-only (pid")):
        m = Mount(tmp_path / "store", tmp_path / "mnt", options=opts).mount()
        try:
            (tmp_path / "mnt2").mkdir(exist_ok=True)
            rc, err = run_rw_mount(tmp_path / "store", tmp_path / "mnt2")
            pid = m.proc.pid
        finally:
            m.unmount()
        assert rc != 0, err
        assert words in err, err
        assert f"pid {pid}, a dboxfs mount on {m.mnt})" in err, err
        if not opts:
            assert f"{m.mnt}); unmount it or wait for it" in err, err


def test_ro_mount_of_a_fresh_backup_holds_its_lock(tmp_path):
    """A backup has no STORE/lock, and a read-only mount of it took no
    lock: a read-write mount of the same backup started beside it, and
    an offline purge deleted an m.N the read-only mount was serving
    (helper-90).  The read-only mount now makes the lock file and holds
    it shared, so both are refused while it is mounted."""
    src = sample_maildir(tmp_path / "Maildir", messages=6)
    store, bk = tmp_path / "store", tmp_path / "bk"
    assert adm("import", store, src).returncode == 0
    r = adm("backup", store, bk)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (bk / "lock").exists()
    m = Mount(bk, tmp_path / "mnt", options=["-o", "ro"]).mount()
    try:
        (tmp_path / "mnt2").mkdir()
        rc, err = run_rw_mount(bk, tmp_path / "mnt2")
        assert rc != 0 and not is_mounted(tmp_path / "mnt2"), err
        assert "is mounted read-only (pid" in err, err
        r = adm("purge", bk)
        assert r.returncode != 0, r.stdout + r.stderr
        assert "mounted read-only" in r.stderr, r.stderr
        for p in src.rglob("*"):
            if p.is_file():
                got = (m.mnt / p.relative_to(src)).read_bytes()
                assert got == p.read_bytes(), p
    finally:
        m.unmount()
    assert (bk / "lock").read_bytes() == b""
    assert adm("check", bk).returncode == 0


def test_ro_mount_of_a_backup_that_takes_no_lock_file_still_mounts(tmp_path):
    """The lock file a read-only mount makes for a fresh backup: when the
    directory takes no file for any reason (here immutable, as chattr +i
    makes it; also a full disk or quota), the mount goes on without a
    lock as before, instead of failing (helper-93: 'cannot open the lock
    of the store: Operation not permitted')."""
    src = sample_maildir(tmp_path / "Maildir", messages=3)
    store, bk = tmp_path / "store", tmp_path / "bk"
    assert adm("import", store, src).returncode == 0
    assert adm("backup", store, bk).returncode == 0
    if subprocess.run(["chattr", "+i", str(bk)], capture_output=True).returncode != 0:
        pytest.skip("no chattr +i on this filesystem")
    try:
        m = Mount(bk, tmp_path / "mnt", options=["-o", "ro"]).mount()
        try:
            for p in src.rglob("*"):
                if p.is_file():
                    assert (m.mnt / p.relative_to(src)).read_bytes() == p.read_bytes()
        finally:
            m.unmount()
        assert not (bk / "lock").exists()
    finally:
        subprocess.run(["chattr", "-i", str(bk)], capture_output=True)
