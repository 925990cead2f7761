"""The manual backup recipe (dboxadm(8) NOTES; `dboxadm backup` is the
consistent copy, tested in test_snapshot.py), run as written, on a
mounted store with no purge in between:

    sqlite3 STORE/index.sqlite ".backup BACKUP/index.sqlite"
    rsync -a --delete STORE/storage STORE/files BACKUP/

- taken while mail arrives, a restored copy mounts and holds every message
  committed before the index copy, byte-exact, and none that came after;
- a second run sends only the m.N files that are new or grew (sealed ones
  are skipped), the point of the "incremental" claim.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from sysenv import sample_maildir

pytestmark = pytest.mark.skipif(
    shutil.which("sqlite3") is None or shutil.which("rsync") is None,
    reason="sqlite3 and rsync needed")


def backup(store, dest):
    """The recipe's commands; returns the m.N names rsync sent."""
    dest.mkdir(mode=0o700, exist_ok=True)
    subprocess.run(["sqlite3", str(store / "index.sqlite"),
                    f".backup {dest / 'index.sqlite'}"], check=True, timeout=60)
    r = subprocess.run(["rsync", "-a", "--delete", "--out-format=%n",
                        str(store / "storage"), str(store / "files"), f"{dest}/"],
                       check=True, capture_output=True, text=True, timeout=120)
    return {Path(l).name for l in r.stdout.split() if Path(l).name.startswith("m.")}


def deliver(mnt, name, text):
    tmp = mnt / "tmp" / name
    with open(tmp, "wb") as f:
        f.write(text.encode())
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, mnt / "new" / name)


def letter(i):
    return f"From: a@example.org\nSubject: letter {i}\n\n" + f"line {i}\n" * 400


def tree(root):
    """{relative path: bytes} of every message under root."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*")
            if p.is_file() and p.parent.name in ("cur", "new", "tmp")}


def filled_mount(make_mount, store, src):
    """A mount of a new store with small m.N files (64 KiB), src copied in."""
    m = make_mount(store=store, options=["-o", "rotate_size=65536"])
    subprocess.run(["cp", "-a", f"{src}/.", str(m.mnt)], check=True, timeout=120)
    return m


def test_backup_while_mounted_restores_what_was_committed(make_mount, tmp_path):
    src = sample_maildir(tmp_path / "Maildir", messages=60)
    store = tmp_path / "store"
    m = filled_mount(make_mount, store, src)
    for i in range(5):
        deliver(m.mnt, f"before.{i}", letter(i))
    expected = tree(m.mnt)

    bk = tmp_path / "backup"
    # The index copy first; then mail arrives before rsync runs.
    bk.mkdir(mode=0o700)
    subprocess.run(["sqlite3", str(store / "index.sqlite"),
                    f".backup {bk / 'index.sqlite'}"], check=True, timeout=60)
    for i in range(3):
        deliver(m.mnt, f"during.{i}", letter(100 + i))
    subprocess.run(["rsync", "-a", "--delete", str(store / "storage"),
                    str(store / "files"), f"{bk}/"], check=True, timeout=120)
    # Later changes on the live store do not reach the backup.
    os.unlink(m.mnt / "new" / "before.0")
    m.unmount()

    restored = tmp_path / "restored"
    subprocess.run(["rsync", "-a", f"{bk}/", f"{restored}/"], check=True, timeout=120)
    r = make_mount(store=restored, mnt=tmp_path / "mnt-restored")
    got = tree(r.mnt)
    # The deliveries after the index copy are in the copy's storage/,
    # fsync()ed with their paths: the mount puts them back
    # (docs/durability.md, "Mail whose row a power loss took"); all else is as it was
    # when the index was copied.
    for i in range(3):
        expected[f"new/during.{i}"] = letter(100 + i).encode()
    assert got.keys() == expected.keys()
    assert got == expected


def test_second_backup_sends_only_new_and_grown_mfiles(make_mount, tmp_path):
    src = sample_maildir(tmp_path / "Maildir", messages=80)
    store = tmp_path / "store"
    m = filled_mount(make_mount, store, src)
    bk = tmp_path / "backup"
    first = backup(store, bk)
    mfiles = {p.name for p in (store / "storage").iterdir()}
    assert first == mfiles and len(mfiles) >= 5

    sizes = {p.name: p.stat().st_size for p in (store / "storage").iterdir()}
    deliver(m.mnt, "new.1", letter(1))
    after = {p.name for p in (store / "storage").iterdir()}
    changed = {p.name for p in (store / "storage").iterdir()
               if sizes.get(p.name) != p.stat().st_size}
    second = backup(store, bk)
    # Only the m.N that took the new message (whichever file of the pool
    # had room, grown, or a new one).
    assert len(changed) == 1 and second == changed
    assert {p.name for p in (bk / "storage").iterdir()} == after
