"""dboxadm backup: online, consistent, incremental snapshots of a store.

- taken while a client delivers, renames (flags, folders), expunges and
  rewrites a plain file, the backup mounts and shows exactly the tree of
  one instant between the start and the end of the backup; a message
  still being written is not in it; `dboxadm check` finds it clean;
- a purge between the index snapshot and the copy of the m.N it removes
  does not break the backup (the backup holds descriptors), nor does a
  purge between opening the files and the snapshot (a new m.N it removes
  makes the backup take another snapshot);
- a backup killed with SIGKILL mid-way leaves DEST.partial, which neither
  dboxfs nor check takes for a store, and the same command completes it,
  keeping the files already copied;
- --link-dest: unchanged sealed m.N share inodes with the previous
  backup; one whose received date was rewritten in place does not;
- offline, and the refusals.
"""
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import DBOXADM, DBOXFS, index_rows, is_mounted, unmount
from sysenv import sample_maildir

ROTATE = "rotate_size=32768"


def adm(*args, check_rc=None, env=None):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                       timeout=300, env=env)
    if check_rc is not None:
        assert r.returncode == check_rc, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return r


def backup(store, dest, *extra, env=None):
    r = adm("backup", store, dest, "--json", *extra, check_rc=0, env=env)
    return json.loads(r.stdout)


def check_clean(store):
    r = adm("check", store, "--json")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
    assert json.loads(r.stdout)["problems"] == []


def tree(root):
    """{relative path: bytes} of every file, {relative path: None} of every
    directory, under root."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        d = Path(dirpath)
        for n in dirs:
            out[str((d / n).relative_to(root))] = None
        for n in files:
            out[str((d / n).relative_to(root))] = (d / n).read_bytes()
    return out


def letter(i):
    return (f"From: a@example.org\nSubject: letter {i}\nMessage-ID: <{i}@t>\n\n"
            + f"line {i} of the body\n" * (20 + i % 200)).encode()


def filled(make_mount, tmp_path, messages=60, options=()):
    store = tmp_path / "store"
    src = sample_maildir(tmp_path / "Maildir", messages=messages)
    m = make_mount(store=store, options=["-o", ROTATE, *options])
    subprocess.run(["cp", "-a", f"{src}/.", str(m.mnt)], check=True, timeout=120)
    (m.mnt / "dovecot-uidlist").write_bytes(b"3 V1 N1\n")
    m.maildir(".Archive")
    return store, m


class Load:
    """One client thread changing the mount, step by step; after each step
    `states` gets (start, end, tree of the mount) - the model, kept
    without reading the mount back."""

    def __init__(self, mnt, seed=5):
        self.mnt = mnt
        self.rng = random.Random(seed)
        self.model = {k: v for k, v in tree(mnt).items()}
        self.states = [(0.0, time.monotonic(), dict(self.model))]
        self.stop = threading.Event()
        self.error = None
        self.n = 0
        self.thread = threading.Thread(target=self.run)

    def messages(self):
        return [k for k, v in self.model.items() if v is not None and
                Path(k).parent.name in ("cur", "new")]

    def step(self, fn):
        t0 = time.monotonic()
        fn()
        self.states.append((t0, time.monotonic(), dict(self.model)))

    def deliver(self):
        self.n += 1
        name = f"{1700000000 + self.n}.M{self.n}P1.load"
        data = letter(self.n)
        tmp, new = f"tmp/{name}", f"new/{name}"

        def write():
            with open(self.mnt / tmp, "wb") as f:
                f.write(data)
            self.model[tmp] = data

        def rename():
            os.rename(self.mnt / tmp, self.mnt / new)
            self.model[new] = self.model.pop(tmp)
        self.step(write)
        self.step(rename)

    def rename(self):
        msgs = self.messages()
        if not msgs:
            return
        old = self.rng.choice(msgs)
        base = Path(old).name.split(":2,")[0]
        folder = self.rng.choice(["", ".Archive/"]) if self.rng.random() < 0.3 \
            else str(Path(old).parent.parent) + "/"
        folder = "" if folder == "./" else folder
        flags = self.rng.choice(["S", "RS", "FS", ""])
        new = f"{folder}cur/{base}:2,{flags}"
        if new == old or new in self.model:
            return

        def mv():
            os.rename(self.mnt / old, self.mnt / new)
            self.model[new] = self.model.pop(old)
        self.step(mv)

    def expunge(self):
        msgs = self.messages()
        if not msgs:
            return
        victim = self.rng.choice(msgs)

        def rm():
            os.unlink(self.mnt / victim)
            del self.model[victim]
        self.step(rm)

    def uidlist(self):
        self.n += 1
        data = f"3 V1 N{self.n}\n".encode() * (1 + self.n % 50)

        def write():
            with open(self.mnt / "dovecot-uidlist.lock", "wb") as f:
                f.write(data)
            self.model["dovecot-uidlist.lock"] = data

        def rename():
            os.rename(self.mnt / "dovecot-uidlist.lock", self.mnt / "dovecot-uidlist")
            self.model["dovecot-uidlist"] = self.model.pop("dovecot-uidlist.lock")
        self.step(write)
        self.step(rename)

    def run(self):
        try:
            while not self.stop.is_set():
                r = self.rng.random()
                if r < 0.4:
                    self.deliver()
                elif r < 0.7:
                    self.rename()
                elif r < 0.9:
                    self.expunge()
                else:
                    self.uidlist()
        except Exception as e:  # reported by the test
            self.error = e

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=120)

    def instants(self, t0, t1):
        """The model trees the store may have had at one instant between
        t0 and t1: from the state of the last step done before t0 up to
        the state after each step begun before t1.  A flag rename (new/ to
        cur/) is committed up to DBOX_DEFER_MS after it returned
        (docs/durability.md, "Deferred commits"): another process's
        snapshot may miss one that returned just before t0, so the states
        of steps done within DEFER_SLACK before t0 are candidates too (a
        backup taken right after such a rename under a loaded CI run had
        its old name)."""
        first = max((i for i, (s, e, _) in enumerate(self.states)
                     if e < t0 - DEFER_SLACK), default=0)
        last = max(i for i, (s, e, _) in enumerate(self.states) if s < t1)
        return [st for _, _, st in self.states[first:last + 1]]


# Seconds: DBOX_DEFER_MS (10 ms) and the time the mount's thread may wait
# for the store lock and the CPU on a loaded machine.
DEFER_SLACK = 0.5


def without_tmp(t):
    return {k: v for k, v in t.items() if Path(k).parent.name != "tmp"}


def matching_instant(got, candidates):
    """The index of the candidate tree `got` is, or None.  A message the
    model has in tmp/ may be missing (closed, but its record not finished
    yet when the snapshot was taken); one it has not yet may be there
    empty: created, and finished empty by a flush before the client's
    write - the close-on-exec of its descriptor in a child this process
    forks to run dboxadm (a FUSE FLUSH of a message finishes its record),
    an instant ext4 has too (a file created, not written yet).  Anything
    else must be equal."""
    for i, want in enumerate(candidates):
        if without_tmp(got) == without_tmp(want) and all(
                (k in want and got[k] == want[k]) or
                (got[k] == b"" and k.endswith(".load"))
                for k in got if Path(k).parent.name == "tmp"):
            return i
    return None


def closest_difference(got, candidates):
    """For a failure message: the names that differ (in presence or in
    bytes) between got and the candidate closest to it, and its index."""
    best = None
    for i, want in enumerate(candidates):
        diff = sorted(k for k in set(got) | set(want)
                      if k not in got or k not in want or got[k] != want[k])
        if best is None or len(diff) < len(best[1]):
            best = (i, diff, [(k, k in got, k in want) for k in diff])
    return best


def test_backup_under_load_is_one_instant(make_mount, tmp_path):
    # The mount purges a sealed m.N as soon as a message in it is
    # expunged: purges run during the backups.
    store, m = filled(make_mount, tmp_path, options=["-o", "purge_threshold=0"])
    load = Load(m.mnt)
    # A delivery still being written during the whole backup: not in it.
    # Written by a process of its own: the close of any descriptor of it
    # finishes the message, also the close-on-exec in a child forked here.
    half = subprocess.Popen(
        ["python3", "-c", "import sys; f = open(sys.argv[1], 'wb'); "
         "f.write(b'Subject: half\\n\\n' + b'x' * 50000); f.flush(); "
         "print('ready', flush=True); sys.stdin.read()",
         str(m.mnt / "tmp" / "half.written")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert half.stdout.readline() == b"ready\n"
    results = []
    with load:
        time.sleep(1.0)
        for i in range(3):
            t0 = time.monotonic()
            prev = ["--link-dest", tmp_path / f"bk{i - 1}"] if i > 0 else []
            results.append((t0, backup(store, tmp_path / f"bk{i}", *prev),
                            time.monotonic()))
            time.sleep(0.3)
    half.stdin.close()
    half.wait()
    assert load.error is None, load.error
    assert load.n > 20
    m.unmount()

    for i, (t0, summary, t1) in enumerate(results):
        dest = tmp_path / f"bk{i}"
        assert not (tmp_path / f"bk{i}.partial").exists()
        assert summary["messages"] > 0 and summary["files_copied"] > 0
        check_clean(dest)
        r = make_mount(store=dest, mnt=tmp_path / f"mnt-bk{i}")
        got = tree(r.mnt)
        r.unmount()
        assert "tmp/half.written" not in got
        candidates = load.instants(t0, t1)
        assert matching_instant(got, candidates) is not None, \
            (i, closest_difference(got, candidates))


HOOKS = ("parent", "opened", "indexed", "snapshot", "copied")


def hooked(tmp_path, *stops):
    """A hook directory (tools/dboxadm/backup.c) where the backup stops at
    the points in stops and passes the others."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    for point in HOOKS:
        if point not in stops:
            (hooks / f"{point}.go").touch()
    return hooks, dict(os.environ, DBOXADM_BACKUP_HOOK=str(hooks))


def start_backup(store, dest, env):
    return subprocess.Popen([str(DBOXADM), "backup", str(store), str(dest), "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for(path, proc):
    for _ in range(3000):
        if path.exists():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


def finish(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)


def messages(mnt):
    return sorted(p for p in mnt.rglob("*") if p.is_file() and p.parent.name == "cur")


def test_purge_after_the_snapshot_does_not_break_the_backup(make_mount, tmp_path):
    store, m = filled(make_mount, tmp_path, messages=80)
    for p in messages(m.mnt)[::2]:
        p.unlink()
    expected = tree(m.mnt)
    hooks, env = hooked(tmp_path, "snapshot")
    before = {p.name for p in (store / "storage").iterdir()}
    proc = start_backup(store, tmp_path / "bk", env)
    wait_for(hooks / "snapshot.reached", proc)
    # The snapshot refers to m.N files that this purge deletes.
    adm("purge", store, check_rc=0)
    purged = before - {p.name for p in (store / "storage").iterdir()}
    assert len(purged) >= 3
    (hooks / "snapshot.go").touch()
    summary = finish(proc)
    assert summary["snapshots"] == 1 and summary["source_errors"] == 0
    assert tree(m.mnt) == expected
    m.unmount()
    dest = tmp_path / "bk"
    assert purged <= {p.name for p in (dest / "storage").iterdir()}
    check_clean(dest)
    r = make_mount(store=dest, mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected


def test_file_created_and_purged_before_it_is_opened(make_mount, tmp_path):
    store, m = filled(make_mount, tmp_path, messages=40)
    hooks, env = hooked(tmp_path, "opened", "indexed")
    proc = start_backup(store, tmp_path / "bk", env)
    wait_for(hooks / "opened.reached", proc)
    # After the backup opened the store's files: new m.N files...
    known = {p.name for p in (store / "storage").iterdir()}
    for i in range(12):
        (m.mnt / "cur" / f"big.{i}:2,S").write_bytes(letter(1000 + i) * 20)
    created = {p.name for p in (store / "storage").iterdir()} - known
    assert len(created) >= 3
    for p in sorted((m.mnt / "cur").glob("big.*"))[::2]:
        p.unlink()
    (hooks / "opened.go").touch()
    # ...the index copy refers to them; a purge deletes them before the
    # backup opens them: it must take another snapshot.
    wait_for(hooks / "indexed.reached", proc)
    adm("purge", store, check_rc=0)
    assert created - {p.name for p in (store / "storage").iterdir()}
    expected = tree(m.mnt)
    (hooks / "indexed.go").touch()
    summary = finish(proc)
    assert summary["snapshots"] == 2
    m.unmount()
    check_clean(tmp_path / "bk")
    r = make_mount(store=tmp_path / "bk", mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected


def test_killed_backup_is_incomplete_and_a_rerun_completes_it(make_mount, tmp_path):
    store, m = filled(make_mount, tmp_path, messages=80)
    expected = tree(m.mnt)
    m.unmount()
    nfiles = len(list((store / "storage").iterdir()))
    assert nfiles >= 5
    hooks, env = hooked(tmp_path, "copied")
    dest = tmp_path / "bk"
    partial = tmp_path / "bk.partial"
    proc = subprocess.Popen([str(DBOXADM), "backup", str(store), str(dest)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(hooks / "copied.reached", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    assert not dest.exists() and partial.is_dir()
    assert len(list((partial / "storage").iterdir())) == 1
    # Not a store for the mount nor for check.
    mnt = tmp_path / "mnt-partial"
    mnt.mkdir()
    try:
        r = subprocess.run([str(DBOXFS), str(partial), str(mnt)], capture_output=True,
                           timeout=60)
        assert r.returncode != 0 and not is_mounted(mnt)
    finally:
        unmount(mnt)
    assert adm("check", partial).returncode != 0
    # Something else in the way is refused, not overwritten.
    other = tmp_path / "other.partial"
    other.mkdir()
    (other / "precious").write_text("x")
    adm("backup", store, tmp_path / "other", check_rc=2)
    assert (other / "precious").read_text() == "x"

    summary = backup(store, dest)
    assert summary["files_kept"] == 1
    assert summary["files_copied"] == summary["mfiles"] + summary["plain_files"] - 1
    assert not partial.exists()
    check_clean(dest)
    r = make_mount(store=dest, mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected


def test_a_rerun_keeps_no_file_the_store_dropped_since(make_mount, tmp_path):
    """A backup killed after its first m.N; then the mail is expunged and
    purged, so that m.N leaves the store, and new mail arrives; then the
    same command again.  The finished backup holds the new snapshot's
    files only and passes check.  The first run's m.N stayed in it: check
    failed for an m.N its index did not know, and rebuild brought the
    expunged mail back (helper-77)."""
    store, m = filled(make_mount, tmp_path, messages=80)
    hooks, env = hooked(tmp_path, "copied")
    dest, partial = tmp_path / "bk", tmp_path / "bk.partial"
    proc = subprocess.Popen([str(DBOXADM), "backup", str(store), str(dest)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(hooks / "copied.reached", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = {p.name for p in (partial / "storage").iterdir()}
    assert len(first) == 1

    for p in list(m.mnt.rglob("*")):
        if p.is_file() and p.parent.name in ("cur", "new"):
            p.unlink()
    (m.mnt / "cur" / "after.1:2,S").write_bytes(letter(5000))
    adm("purge", store, check_rc=0)
    assert not first & {p.name for p in (store / "storage").iterdir()}
    expected = tree(m.mnt)
    summary = backup(store, dest)
    m.unmount()
    assert summary["source_errors"] == 0
    assert not partial.exists()
    assert {p.name for p in (dest / "storage").iterdir()} == \
        {f"m.{fid}" for (fid,) in index_rows(dest, "SELECT file_id FROM mfile")}
    check_clean(dest)
    r = make_mount(store=dest, mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected


def test_link_dest_of_another_stores_backup_is_said(make_mount, tmp_path):
    """--link-dest of another store's backup (a daily job's path mixed up
    between two users) linked nothing without a word (helper-85): said,
    naming PREV, and everything copied as before.  Its own store's PREV
    gives no such warning."""
    store, m = filled(make_mount, tmp_path, messages=40)
    m.unmount()
    other = tmp_path / "other"
    src = sample_maildir(tmp_path / "Maildir2", messages=40)
    adm("import", other, src, check_rc=0)
    time.sleep(2.1)  # older than the backup's link age
    backup(store, tmp_path / "bk1")
    backup(other, tmp_path / "obk1")
    r = adm("backup", store, tmp_path / "bk2", "--json", "--link-dest",
            tmp_path / "obk1", check_rc=0)
    assert f"{tmp_path / 'obk1'}: none of its m.N is a copy of this store's".encode() \
        in r.stderr, r.stderr
    assert json.loads(r.stdout)["files_linked"] == 0
    check_clean(tmp_path / "bk2")
    r = adm("backup", store, tmp_path / "bk3", "--json", "--link-dest",
            tmp_path / "bk1", check_rc=0)
    assert b"none of its m.N" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["files_linked"] > 0


def test_link_dest_shares_unchanged_mfiles(make_mount, tmp_path):
    store, m = filled(make_mount, tmp_path, messages=80)
    time.sleep(2.1)  # older than the backup's link age
    b1 = backup(store, tmp_path / "bk1")
    t1 = tree(m.mnt)
    assert b1["files_linked"] == 0

    # 1 new message, 1 flag change, and a received date rewritten in
    # place in one sealed m.N (its bytes change, not its size).
    msgs = messages(m.mnt)
    file_of = dict((n.decode(), f) for n, f in index_rows(
        store, "SELECT e.name, m.file_id FROM entry e JOIN message m ON m.ino = e.ino"))
    top = max(file_of.values())
    touched = next(p for p in msgs[5:] if file_of[p.name] < top - 1)
    touched_file = f"m.{file_of[touched.name]}"
    (m.mnt / "new" / "fresh.1").write_bytes(letter(7))
    os.rename(msgs[3], msgs[3].with_name(msgs[3].name.split(":2,")[0] + ":2,FS"))
    os.utime(touched, (1_500_000_000, 1_500_000_000))
    time.sleep(2.1)
    b2 = backup(store, tmp_path / "bk2", "--link-dest", tmp_path / "bk1")
    t2 = tree(m.mnt)
    m.unmount()

    s1, s2 = tmp_path / "bk1" / "storage", tmp_path / "bk2" / "storage"
    shared = {p.name for p in s2.iterdir()
              if (s1 / p.name).exists() and (s1 / p.name).stat().st_ino == p.stat().st_ino}
    last = max((p.name for p in s2.iterdir()), key=lambda n: int(n[2:]))
    assert touched_file not in shared
    assert last not in shared
    assert len(shared) >= len(list(s2.iterdir())) - 3
    for n in shared:
        assert (s2 / n).stat().st_nlink == 2
    # The second backup cost the disk only what it did not share.
    # (Plain files are always copied: a mount writes them in place.)
    f2 = tmp_path / "bk2" / "files"
    assert b2["files_linked"] == len(shared)
    assert all(p.stat().st_nlink == 1 for p in f2.iterdir())
    assert b2["bytes_copied"] == sum(
        p.stat().st_size for d in (s2, f2) for p in d.iterdir() if p.stat().st_nlink == 1)

    for name, want in (("bk1", t1), ("bk2", t2)):
        check_clean(tmp_path / name)
    r = make_mount(store=tmp_path / "bk2", mnt=tmp_path / "mnt-bk2")
    assert tree(r.mnt) == t2
    # Restored by mounting it: new mail goes to a file of its own (the
    # last m.N, never shared, or a new one), not into one bk1 shares.
    for i in range(6):
        (r.mnt / "new" / f"after-restore.{i}").write_bytes(letter(500 + i))
    r.unmount()
    # The first backup still shows its own instant.
    check_clean(tmp_path / "bk1")
    r = make_mount(store=tmp_path / "bk1", mnt=tmp_path / "mnt-bk1")
    assert tree(r.mnt) == t1


def test_link_dest_copies_an_mfile_a_mount_of_prev_changed(make_mount, tmp_path):
    """PREV mounted read-write and a message's date set there: its
    received date is rewritten in place in PREV's m.N, at the same size,
    so PREV's manifest still matches the source.  The next backup with
    --link-dest must copy that m.N, not link PREV's changed one (it did:
    the new backup held a date the source never had; helper-77)."""
    store, m = filled(make_mount, tmp_path, messages=80)
    m.unmount()
    time.sleep(2.1)  # older than the backup's link age
    bk1, bk2 = tmp_path / "bk1", tmp_path / "bk2"
    backup(store, bk1)
    file_of = dict((n.decode(), f) for n, f in index_rows(
        bk1, "SELECT e.name, m.file_id FROM entry e JOIN message m ON m.ino = e.ino"))
    top = max(file_of.values())
    r = make_mount(store=bk1, mnt=tmp_path / "mnt-bk1")
    touched = next(p for p in messages(r.mnt) if file_of[p.name] < top - 1)
    os.utime(touched, (1_000_000_000, 1_000_000_000))
    r.unmount()
    changed = f"m.{file_of[touched.name]}"
    b2 = backup(store, bk2, "--link-dest", bk1)
    assert b2["files_linked"] > 0
    assert (bk2 / "storage" / changed).stat().st_ino != \
        (bk1 / "storage" / changed).stat().st_ino
    for p in (bk2 / "storage").iterdir():
        assert p.read_bytes() == (store / "storage" / p.name).read_bytes(), p.name
    check_clean(bk2)


def test_backup_offline_and_refusals(make_mount, tmp_path):
    store, m = filled(make_mount, tmp_path, messages=30)
    expected = tree(m.mnt)
    m.unmount()
    backup(store, tmp_path / "bk")
    check_clean(tmp_path / "bk")
    # The store was not touched: it mounts as before.
    r = make_mount(store=store, mnt=tmp_path / "mnt2")
    assert tree(r.mnt) == expected
    r.unmount()
    # DEST exists; no store; bad option.
    assert b"exists" in adm("backup", store, tmp_path / "bk", check_rc=2).stderr
    adm("backup", tmp_path / "nostore", tmp_path / "bk9", check_rc=2)
    adm("backup", store, check_rc=2)
    adm("backup", store, tmp_path / "bk8", "--bogus", check_rc=2)
    # PREV is no backup: refused.  PREV missing (a daily job's first run,
    # or the day after a skipped one): a warning, and everything copied.
    r = adm("backup", store, tmp_path / "bk7", "--link-dest", store, check_rc=2)
    assert b"not a finished dboxadm backup" in r.stderr, r.stderr
    assert not (tmp_path / "bk7").exists()
    # An interrupted backup (DEST.partial) named as PREV, as a daily
    # job's `ls -d DIR/mail.20*` picks it: named as such, not by the
    # first file it lacks ("storage: No such file or directory").
    (tmp_path / "bk6.partial").mkdir()
    r = adm("backup", store, tmp_path / "bk7", "--link-dest",
            tmp_path / "bk6.partial", check_rc=2)
    assert b"bk6.partial: not a finished dboxadm backup" in r.stderr, r.stderr
    assert not (tmp_path / "bk7").exists()
    r = adm("backup", store, tmp_path / "bk7", "--json", "--link-dest",
            tmp_path / "nobackup", check_rc=0)
    assert b"nobackup: no such backup; copying everything" in r.stderr, r.stderr
    b7 = json.loads(r.stdout)
    assert b7["files_linked"] == 0 and b7["files_copied"] > 0
    check_clean(tmp_path / "bk7")
    r = make_mount(store=tmp_path / "bk7", mnt=tmp_path / "mnt7")
    assert tree(r.mnt) == expected
    r.unmount()
    # A symlink planted in storage/ is not followed.
    secret = tmp_path / "secret"
    secret.write_text("root only")
    (store / "storage" / "m.999").symlink_to(secret)
    backup(store, tmp_path / "bk6")
    assert not (tmp_path / "bk6" / "storage" / "m.999").exists()


def test_backup_inside_the_store_is_refused(make_mount, tmp_path):
    """DEST inside the store or its alternate storage is refused and
    nothing is made there: a backup into STORE/storage/m.999 became a
    directory among the m.N, which check then reported for good
    (helper-77)."""
    alt = tmp_path / "alt"
    alt.mkdir()
    store, m = filled(make_mount, tmp_path, messages=10,
                      options=["-o", f"alt={alt}"])
    m.unmount()
    for dest in (store / "storage" / "m.999", store / "bk",
                 alt / "storage" / "m.999", alt / "bk"):
        r = adm("backup", store, dest)
        assert r.returncode == 2 and b"inside the store" in r.stderr, r
        assert not dest.exists() and not Path(f"{dest}.partial").exists()
    check_clean(store)


def test_damaged_store_is_backed_up_as_it_is(make_mount, tmp_path):
    """An m.N the index refers to is missing (not gone meanwhile: missing
    in a second snapshot too), another one is cut short: the backup
    finishes, says so (exit 1), and check finds the same damage in the
    backup as in the store."""
    store, m = filled(make_mount, tmp_path, messages=60)
    m.unmount()
    files = sorted((store / "storage").iterdir(), key=lambda p: int(p.name[2:]))
    assert len(files) >= 4
    files[1].unlink()
    with open(files[2], "r+b") as f:
        f.truncate(files[2].stat().st_size // 2)
    r = adm("backup", store, tmp_path / "bk", "--json", check_rc=1)
    summary = json.loads(r.stdout)
    assert summary["source_errors"] == 2 and summary["snapshots"] == 2
    assert files[1].name.encode() in r.stderr and files[2].name.encode() in r.stderr
    assert not (tmp_path / "bk" / "storage" / files[1].name).exists()
    assert (tmp_path / "bk" / "storage" / files[2].name).stat().st_size == \
        files[2].stat().st_size

    def problems(path):
        r = adm("check", path, "--json")
        assert r.returncode == 1
        return len(json.loads(r.stdout)["problems"])
    assert problems(tmp_path / "bk") == problems(store)


def test_an_index_short_of_its_records_is_said_and_they_are_copied(make_mount, tmp_path):
    """An index whose committed end of an m.N is short of the records it
    names there (a damaged index, or one its owner wrote so: 100 bytes,
    -1): the backup copied nothing or a prefix of those m.N and exited 0
    (helper-83).  Now it copies every record the index names, says so
    (exit 1), and check finds the same damage in the backup as in the
    store."""
    store, m = filled(make_mount, tmp_path, messages=60)
    m.unmount()
    db = sqlite3.connect(store / "index.sqlite")
    with db:
        ids = [r[0] for r in db.execute("SELECT file_id FROM mfile ORDER BY file_id")]
        assert len(ids) >= 3
        db.execute("UPDATE mfile SET size = 100 WHERE file_id = ?", (ids[0],))
        db.execute("UPDATE mfile SET size = -1 WHERE file_id = ?", (ids[1],))
    db.close()
    r = adm("backup", store, tmp_path / "bk", "--json", check_rc=1)
    assert json.loads(r.stdout)["source_errors"] == 2, r.stdout
    assert r.stderr.count(b"short of the records") == 2, r.stderr
    for i in ids[:2]:
        src = (store / "storage" / f"m.{i}").read_bytes()
        got = (tmp_path / "bk" / "storage" / f"m.{i}").read_bytes()
        assert len(got) > 100 and src.startswith(got), (i, len(got), len(src))

    def problems(path):
        r = adm("check", path, "--json")
        assert r.returncode == 1
        return sorted(json.loads(r.stdout)["problems"])
    assert problems(tmp_path / "bk") == problems(store)


def test_one_backup_at_a_time_into_dest(make_mount, tmp_path):
    store, m = filled(make_mount, tmp_path, messages=20)
    hooks, env = hooked(tmp_path, "snapshot")
    proc = start_backup(store, tmp_path / "bk", env)
    wait_for(hooks / "snapshot.reached", proc)
    r = adm("backup", store, tmp_path / "bk", check_rc=2)
    assert b"another dboxadm backup" in r.stderr
    (hooks / "snapshot.go").touch()
    finish(proc)
    check_clean(tmp_path / "bk")


def test_backup_of_a_crashed_store(make_mount, tmp_path):
    """The mount died (SIGKILL) while a message was being written: the
    backup of the store as it was left holds every committed message and
    not the unfinished one, and is clean without a mount's recovery; the
    store itself is left for its own next mount to recover."""
    store, m = filled(make_mount, tmp_path, messages=40)
    expected = tree(m.mnt)
    half = subprocess.Popen(
        ["python3", "-c", "import sys; f = open(sys.argv[1], 'wb'); "
         "f.write(b'Subject: half\\n\\n' + b'y' * 70000); f.flush(); "
         "print('ready', flush=True); sys.stdin.read()",
         str(m.mnt / "tmp" / "half.written")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert half.stdout.readline() == b"ready\n"
    m.kill()
    half.stdin.close()
    half.wait()
    pending = index_rows(store, "SELECT count(*) FROM message WHERE state = 1")[0][0]
    assert pending == 1
    wal = (store / "index.sqlite-wal").stat().st_size \
        if (store / "index.sqlite-wal").exists() else None

    backup(store, tmp_path / "bk")
    check_clean(tmp_path / "bk")
    # The store is as the crash left it.
    assert index_rows(store, "SELECT count(*) FROM message WHERE state = 1")[0][0] == 1
    if wal is not None:
        assert (store / "index.sqlite-wal").stat().st_size == wal
    r = make_mount(store=tmp_path / "bk", mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected
    r.unmount()
    r = make_mount(store=store, mnt=tmp_path / "mnt-again")
    assert tree(r.mnt) == expected


def test_mfile_name_reused_after_opening_retakes_the_snapshot(make_mount, tmp_path):
    """storage/m.N comes to name another file after the backup opened it
    (a reopened store hands out the id of a purged last m.N again): the
    backup cannot know which one its snapshot means, and takes another."""
    store, m = filled(make_mount, tmp_path, messages=40)
    expected = tree(m.mnt)
    m.unmount()
    hooks, env = hooked(tmp_path, "opened")
    proc = start_backup(store, tmp_path / "bk", env)
    wait_for(hooks / "opened.reached", proc)
    victim = sorted((store / "storage").iterdir(), key=lambda p: int(p.name[2:]))[0]
    # Same bytes, another inode: the copy must come from a file opened anew.
    shutil.copyfile(victim, victim.with_name("replacement"))
    os.rename(victim.with_name("replacement"), victim)
    (hooks / "opened.go").touch()
    summary = finish(proc)
    assert summary["snapshots"] == 2
    check_clean(tmp_path / "bk")
    r = make_mount(store=tmp_path / "bk", mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected


OLD_NS = 1_500_000_000_000_000_000   # 2017: older than any --older-than


def test_backup_of_a_store_with_alt_mfiles(make_mount, tmp_path):
    """After `dboxadm altmove` some m.N live in ALT/storage/: the backup,
    taken while the store is mounted, copies them into DEST/storage/ and
    DEST records no alternate storage - it mounts, reads every message
    and passes check even with ALT gone (old code: the ALT m.N were
    missing from the backup, exit 1)."""
    store, m = filled(make_mount, tmp_path, messages=60)
    cur = m.mnt / "cur"
    names = sorted(cur.iterdir())
    assert len(names) >= 10
    for i, p in enumerate(names):
        if i % 2 == 0:
            os.utime(p, ns=(OLD_NS + i * 10**9,) * 2)
    m.unmount()
    alt = tmp_path / "alt"
    alt.mkdir()
    adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)
    in_alt = index_rows(store, "SELECT count(*) FROM mfile WHERE alt = 1")[0][0]
    assert in_alt > 0 and any((alt / "storage").iterdir())
    m = make_mount(store=store, mnt=tmp_path / "mnt2", options=["-o", ROTATE])
    expected = tree(m.mnt)

    summary = backup(store, tmp_path / "bk")
    assert summary["source_errors"] == 0
    assert summary["mfiles"] == len(list((tmp_path / "bk" / "storage").iterdir()))
    m.unmount()
    bk = tmp_path / "bk"
    assert index_rows(bk, "SELECT count(*) FROM mfile WHERE alt <> 0")[0][0] == 0
    assert index_rows(bk, "SELECT count(*) FROM setting WHERE key = 'alt_path'")[0][0] == 0
    # Self-contained: the ALT of the source is not needed.
    alt.rename(tmp_path / "alt-away")
    check_clean(bk)
    r = make_mount(store=bk, mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected


def test_backup_after_a_crash_with_inflight_marks(make_mount, tmp_path):
    """The mount died while a committed message was being rewritten (its
    copy-on-write copy announced by inflight.m.N, bytes past the committed
    end) and a recovery had kept whole records past another committed end
    (kept.m.N): the backup holds the committed state, carries neither mark
    (nothing is in flight in it, and the kept records are not in it), and
    mounts clean with the committed bytes of every message."""
    store, m = filled(make_mount, tmp_path, messages=40)
    expected = tree(m.mnt)
    victim = sorted((m.mnt / "cur").iterdir())[3]
    rewrite = subprocess.Popen(
        ["python3", "-c", "import sys; f = open(sys.argv[1], 'r+b'); "
         "f.seek(0, 2); f.write(b'z' * 70000); f.flush(); "
         "print('ready', flush=True); sys.stdin.read()", str(victim)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert rewrite.stdout.readline() == b"ready\n"
    m.kill()
    rewrite.stdin.close()
    rewrite.wait()
    marks = index_rows(store, "SELECT key, value FROM meta WHERE key LIKE 'inflight.m.%'"
                              " AND value >= 0")
    assert marks, "the rewrite left no in-flight mark"
    # A kept mark as a recovery of an index older than storage/ leaves it:
    # whole records past the committed end of the first m.N.
    first, size = index_rows(store, "SELECT file_id, size FROM mfile ORDER BY file_id")[0]
    db = __import__("sqlite3").connect(store / "index.sqlite")
    with db:
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"kept.m.{first}", size + 4096))
    db.close()

    backup(store, tmp_path / "bk")
    bk = tmp_path / "bk"
    assert index_rows(bk, "SELECT key FROM meta WHERE key LIKE 'inflight.%'"
                          " OR key LIKE 'kept.%'") == []
    for fid, committed in index_rows(bk, "SELECT file_id, size FROM mfile"):
        assert (bk / "storage" / f"m.{fid}").stat().st_size == committed
    check_clean(bk)
    r = make_mount(store=bk, mnt=tmp_path / "mnt-bk")
    assert tree(r.mnt) == expected
    # The backup takes new mail into its last m.N, and stays clean.
    (r.mnt / "new" / "after.restore").write_bytes(letter(900))
    r.unmount()
    check_clean(bk)
    assert not (bk / "lost+found").exists()


def test_backup_with_few_descriptors(make_mount, tmp_path):
    """The backup holds one descriptor per m.N at once: a soft open-files
    limit below that is raised to the hard one; a hard limit below it
    fails clearly (exit 1, DEST.partial left, the limit named), and the
    same command with a higher limit completes it."""
    store, m = filled(make_mount, tmp_path, messages=120)
    m.unmount()
    nfiles = len(list((store / "storage").iterdir()))
    assert nfiles >= 12, nfiles
    low = nfiles // 2 + 8     # stdio, index, directories: below nfiles + those
    import resource

    def limit(soft, hard):
        return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    r = subprocess.run([str(DBOXADM), "backup", str(store), str(tmp_path / "bk")],
                       capture_output=True, timeout=300, preexec_fn=limit(low, low))
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert b"open files limit" in r.stderr, r.stderr
    assert not (tmp_path / "bk").exists() and (tmp_path / "bk.partial").exists()
    r = subprocess.run([str(DBOXADM), "backup", str(store), str(tmp_path / "bk"), "--json"],
                       capture_output=True, timeout=300, preexec_fn=limit(low, 4096))
    assert r.returncode == 0, r.stderr
    check_clean(tmp_path / "bk")
