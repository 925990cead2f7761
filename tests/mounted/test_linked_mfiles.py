"""m.N files that are not only this store's: a file with other names (hard
links: `dboxadm backup --link-dest`, a Dovecot store adopted in place by
import-dovecot, `cp -al`) or a file of another store met through a
mistaken ALT path.  Crash recovery and purge must never cut, truncate or
append to them: each case below destroyed the other store's mail before
2026-12-02 (found by an attack run: the purged-file rule truncated any
unknown m.N whose number a purge of this index had forgotten)."""
import json
import os
import shutil
import subprocess
import time

import pytest

from conftest import DBOXADM, index_rows


def adm(*args, check_rc=None):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                       text=True, errors="replace", timeout=300)
    if check_rc is not None:
        assert r.returncode == check_rc, (r.returncode, r.stdout[-2000:],
                                          r.stderr[-3000:])
    return r


def check_clean(store):
    r = adm("check", store, "--json")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
    assert json.loads(r.stdout)["problems"] == []


def fill(mnt, prefix, n, size, mtime=None):
    for d in ("cur", "new", "tmp"):
        (mnt / d).mkdir(exist_ok=True)
    for i in range(n):
        tmp = mnt / "tmp" / f"{prefix}{i}"
        tmp.write_bytes(f"Subject: {prefix}{i}\n\n".encode() + os.urandom(size))
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        os.rename(tmp, mnt / "new" / tmp.name)


def files(storage):
    """{m.N: (inode, bytes)} of a storage/ directory."""
    return {p.name: (p.stat().st_ino, p.read_bytes()) for p in storage.iterdir()}


def purged_marks(store):
    return {int(k[len("purged.m."):]): v for k, v in index_rows(
        store, "SELECT key, value FROM meta WHERE key LIKE 'purged.m.%'")}


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace needed")
def test_crashed_purge_of_a_link_dest_backup_spares_the_other(make_mount, tmp_path):
    """A purge of backup bk2, whose sealed m.N are hard links into bk1,
    cut by a crash after its switch and before it unlinked the old file.
    Recovery removes bk2's name of that file; bk1 keeps every byte."""
    store = tmp_path / "store"
    m = make_mount(store=store, options=["-o", "rotate_size=40000"])
    fill(m.mnt, "m", 30, 9000)
    m.unmount()
    bk1, bk2 = tmp_path / "bk1", tmp_path / "bk2"
    time.sleep(2.1)  # older than the backup's link age
    adm("backup", store, bk1, check_rc=0)
    adm("backup", store, bk2, "--link-dest", bk1, check_rc=0)
    shared = {p.name for p in (bk2 / "storage").iterdir() if p.stat().st_nlink == 2}
    assert len(shared) >= 3, shared
    before = files(bk1 / "storage")

    m2 = make_mount(store=bk2, mnt=tmp_path / "mnt2",
                    options=["-o", "purge_threshold=0"])
    for name in ("m1", "m2", "m3"):
        os.unlink(m2.mnt / "new" / name)
    m2.unmount()
    # The purge killed at its first unlinkat(), the old file's after the
    # switch (strace's fault injection): the purged file's name stays.
    subprocess.run(["strace", "-f", "-o", "/dev/null", "-e", "trace=unlinkat",
                    "-e", "inject=unlinkat:signal=SIGKILL:when=1",
                    str(DBOXADM), "purge", str(bk2)], timeout=120)
    marks = {n: ino for n, ino in purged_marks(bk2).items() if ino > 1}
    gone = {f"m.{n}" for n in marks} & shared
    assert gone, (marks, shared)
    assert all((bk2 / "storage" / n).exists() for n in gone)

    m2 = make_mount(store=bk2, mnt=tmp_path / "mnt2")
    log = m2.log_text()
    m2.unmount()
    assert "purged by this index" in log, log
    assert files(bk1 / "storage") == before
    for name in gone:
        assert not (bk2 / "storage" / name).exists()
    check_clean(bk1)
    check_clean(bk2)


def test_store_given_another_stores_alt_cuts_nothing(make_mount, tmp_path):
    """Store B mounted with the ALT of store A by mistake (one owner for
    both): A's ALT m.N carry numbers B's purges forgot.  B keeps them as
    records it does not know; neither B's recovery nor B's purge cuts or
    removes them, and A stays whole."""
    alt_a = tmp_path / "altA"
    alt_a.mkdir()
    a = make_mount(store=tmp_path / "A", mnt=tmp_path / "mA",
                   options=["-o", f"alt={alt_a},rotate_size=65536"])
    fill(a.mnt, "a", 12, 30000, mtime=1_577_836_800)  # 2020
    a.unmount()
    adm("altmove", tmp_path / "A", "--older-than=365", check_rc=0)
    a_files = files(alt_a / "storage")

    b = make_mount(store=tmp_path / "B", mnt=tmp_path / "mB",
                   options=["-o", "rotate_size=65536"])
    fill(b.mnt, "b", 30, 30000)
    for i in range(10, 20):
        os.unlink(b.mnt / "new" / f"b{i}")
    b.unmount()
    adm("purge", tmp_path / "B", check_rc=0)
    overlap = {f"m.{n}" for n in purged_marks(tmp_path / "B")} & set(a_files)
    assert overlap, (purged_marks(tmp_path / "B"), sorted(a_files))

    b = make_mount(store=tmp_path / "B", mnt=tmp_path / "mB",
                   options=["-o", f"alt={alt_a}"])
    b.unmount()
    adm("purge", tmp_path / "B")
    assert files(alt_a / "storage") == a_files
    check_clean(tmp_path / "A")


def linked_copy(make_mount, tmp_path):
    """Store S with 5 messages in one m.N with room left, and store T, a
    copy of it made with cp -al (every m.N a hard link of S's, as
    import-dovecot adopts Dovecot's files; its own index).  Returns S's
    {m.N: (inode, bytes)}."""
    m = make_mount(store=tmp_path / "S", mnt=tmp_path / "mS")
    fill(m.mnt, "s", 5, 2000)
    m.unmount()
    subprocess.run(["cp", "-al", str(tmp_path / "S"), str(tmp_path / "T")],
                   check=True)
    for side in ("index.sqlite", "index.sqlite-reserve", "lock"):
        if (tmp_path / "T" / side).exists():
            (tmp_path / "T" / side).unlink()
            shutil.copy(tmp_path / "S" / side, tmp_path / "T" / side)
    before = files(tmp_path / "S" / "storage")
    assert all((tmp_path / "T" / "storage" / n).stat().st_nlink == 2 for n in before)
    return before


def test_linked_last_mfile_takes_no_new_mail(make_mount, tmp_path):
    """New mail of a store whose last m.N (with room left) is linked into
    another store goes to a new file, never into the shared one."""
    before = linked_copy(make_mount, tmp_path)
    t = make_mount(store=tmp_path / "T", mnt=tmp_path / "mT")
    fill(t.mnt, "t", 5, 2000)
    t.unmount()
    assert files(tmp_path / "S" / "storage") == before
    check_clean(tmp_path / "S")
    check_clean(tmp_path / "T")


def test_date_of_a_linked_message_rewrites_no_shared_mfile(make_mount, tmp_path):
    """Setting a message's date (its R metadata) where its m.N is linked
    into another store makes a copy of the message; the other store's
    file keeps its bytes, and the date stays set across a remount."""
    before = linked_copy(make_mount, tmp_path)
    t = make_mount(store=tmp_path / "T", mnt=tmp_path / "mT")
    msg = t.mnt / "new" / "s2"
    data = msg.read_bytes()
    os.utime(msg, (1_500_000_000, 1_500_000_000))
    t.unmount()
    assert files(tmp_path / "S" / "storage") == before
    t = make_mount(store=tmp_path / "T", mnt=tmp_path / "mT")
    assert msg.stat().st_mtime == 1_500_000_000
    assert msg.read_bytes() == data
    t.unmount()
    check_clean(tmp_path / "S")
    check_clean(tmp_path / "T")
