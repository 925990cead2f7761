"""isync/mbsync with two Maildir stores, one of them on the mount.

Three channels do the same work in the same test: native -> mount (the
mount is the near side and keeps `SyncState *` state files inside its
folders), mount -> native (the mount is the far side), and native ->
native, the reference.  Steps: a full sync of a generated Maildir++ tree,
a second sync (a no-op: no byte, name or mtime changes), flag changes on
either side, expunge (T flag and a deleted file), new mail on both sides.
After each step every side equals the reference side: the same messages
per folder with the same `,U=` UID, flags and bytes, and the same
`.uidvalidity` maximum UID.

mbsync sleeps while a maildir's directory mtime equals the current second
(so it cannot miss a change made in that second); each run has a timeout
and may sleep at most once per directory scan, so a filesystem reporting
"now" as directory mtime fails here instead of hanging.
"""
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

from maildir_tools import (digest, folder_of, messages, need, read_bytes,
                           split_name, tree)

GEN_CORPUS = Path(__file__).resolve().parents[2] / "tools" / "gen-corpus"
FOLDERS = ["", ".Sent", ".Lists.debian"]  # INBOX is the store's root

CONFIG = """MaildirStore {name}-far
Inbox {far}
SubFolders Maildir++
{extra}
MaildirStore {name}-near
Inbox {near}
SubFolders Maildir++
{extra}
Channel {name}
Far :{name}-far:
Near :{name}-near:
Patterns *
Create Both
Expunge Both
SyncState *
Sync All
"""


class Pair:
    """One channel: a far and a near Maildir++ store and its config."""

    def __init__(self, name, far, near, cfgdir, extra=""):
        self.name, self.far, self.near = name, Path(far), Path(near)
        self.config = Path(cfgdir) / f"mbsyncrc-{name}"
        self.config.write_text(CONFIG.format(name=name, far=far, near=near,
                                             extra=extra))
        self.sleeps = []

    def sync(self):
        """One mbsync run; returns its notices."""
        r = subprocess.run(["mbsync", "-c", str(self.config), self.name],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (self.name, r.stdout, r.stderr)
        out = r.stdout + r.stderr
        self.sleeps.append(out.count("sleeping due to recent directory"))
        return out

    def side(self, which):
        return self.far if which == "far" else self.near


UID = re.compile(r",U=(\d+)")
# mbsync puts a random X-TUID header into each message it stores: left out
# of the comparison.
TUID = re.compile(rb"^X-TUID: \S+\n", re.M)


def uid_of(base):
    m = UID.search(base)
    return int(m.group(1)) if m else None


def view(root):
    """Counter of (folder, cur|new, UID, flags, sha256) of the messages."""
    out = Counter()
    for rel, data in messages(root).items():
        folder, sub = folder_of(rel)
        base, flags = split_name(os.path.basename(rel))
        data = TUID.sub(b"", data, count=1)
        out[(folder, sub, uid_of(base), flags, digest(data))] += 1
    return out


def maxuids(root):
    """{folder: max UID line of .uidvalidity}."""
    out = {}
    for f in FOLDERS:
        p = root / f / ".uidvalidity" if f else root / ".uidvalidity"
        lines = p.read_text().split()
        assert len(lines) == 2 and lines[0].isdigit(), (p, lines)
        out[f] = int(lines[1])
    return out


def by_uid(root, folder):
    """{UID: path} of the messages of one folder."""
    out = {}
    for sub in ("cur", "new"):
        d = root / folder / sub
        for n in os.listdir(d):
            out[uid_of(split_name(n)[0])] = d / n
    return out


def set_flags(path, add="", remove=""):
    """A flag change as a MUA makes it: rename() within cur/."""
    base, flags = split_name(path.name)
    new = "".join(sorted((set(flags) | set(add)) - set(remove)))
    target = path.parent.parent / "cur" / f"{base}:2,{new}"
    os.rename(path, target)
    return target


def deliver(root, folder, name, data):
    tmp = root / folder / "tmp" / name
    tmp.write_bytes(data)
    os.rename(tmp, root / folder / "new" / name)


def settle():
    """Wait for the next second: the steps' own changes then never make
    mbsync sleep, so its sleeps count only what the filesystem causes."""
    time.sleep(1.0 - time.time() % 1.0 + 0.01)


def state_files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob(".mbsyncstate"))


def test_mbsync_both_directions(mount, tmp_path):
    need("mbsync")
    src = tmp_path / "corpus"
    subprocess.run([str(GEN_CORPUS), str(src), "--messages", "150", "--seed",
                    "7", "--folders", "INBOX,Sent,Lists.debian"], check=True)
    n_msgs = len(messages(src))
    pairs = []
    for name, far, near in (
            ("tomount", tmp_path / "a-far", mount.mnt / "near"),
            ("frommount", mount.mnt / "far", tmp_path / "b-near"),
            ("reference", tmp_path / "r-far", tmp_path / "r-near")):
        subprocess.run(["cp", "-a", str(src), str(far)], check=True)
        pairs.append(Pair(name, far, near, tmp_path))
    ref = pairs[-1]

    def sync_all(wait=True):
        if wait:
            settle()
        for p in pairs:
            p.sync()

    def check(step):
        for p in pairs:
            for which in ("far", "near"):
                got, want = view(p.side(which)), view(ref.side(which))
                assert got == want, (step, p.name, which,
                                     sorted(got - want)[:5], sorted(want - got)[:5])
            assert maxuids(p.far) == maxuids(ref.far), (step, p.name)
            assert maxuids(p.near) == maxuids(ref.near), (step, p.name)
            # No temporaries left in tmp/.
            for which in ("far", "near"):
                for f in FOLDERS:
                    assert os.listdir(p.side(which) / f / "tmp") == [], (step, f)

    # 1. Full sync: every message on both sides, every name with ,U=.
    sync_all()
    check("full sync")
    for p in pairs:
        assert state_files(p.near) == sorted(
            [".mbsyncstate", ".Sent/.mbsyncstate", ".Lists.debian/.mbsyncstate"])
        for which in ("far", "near"):
            v = view(p.side(which))
            assert sum(v.values()) == n_msgs
            assert all(uid is not None for (_, _, uid, _, _) in v)
    # The near side got the far side's messages (mbsync leaves far-side
    # new/ mail in new/ but stores it in cur/ or new/ by its own rules).
    near = view(pairs[0].near)
    assert Counter((f, fl, d) for (f, _, _, fl, d) in near) == \
        Counter((f, fl, d) for (f, _, _, fl, d) in view(pairs[0].far))

    # 2. A second sync changes nothing: names, bytes, mtimes, state files,
    # and the mtimes of cur/ new/ tmp/ (the folders' own mtimes change: the
    # lock file .mbsyncstate.lock is created and removed by every run).
    before = [(tree(p.far), tree(p.near)) for p in pairs]
    dirs = [{d: os.stat(d).st_mtime_ns for d in list(p.far.rglob("*")) +
             list(p.near.rglob("*")) if d.name in ("cur", "new", "tmp")}
            for p in pairs]
    sync_all()
    for p, b, d in zip(pairs, before, dirs):
        assert (tree(p.far), tree(p.near)) == b, p.name
        assert {x: os.stat(x).st_mtime_ns for x in d} == d, p.name

    # 3. Flags changed on the far side, 4. on the near side.
    for which, add, remove in (("far", "F", "S"), ("near", "R", "F")):
        for p in pairs:
            for folder in FOLDERS:
                for uid, path in sorted(by_uid(p.side(which), folder).items()):
                    if uid % 5 == 0:
                        set_flags(path, add=add)
                    elif uid % 7 == 0:
                        set_flags(path, remove=remove)
        sync_all()
        check(f"flags on {which}")
    other = view(pairs[0].near)
    assert sum(c for (f, s, u, fl, d), c in other.items() if "F" in fl and u % 5 == 0) > 10

    # 5. Expunge: T flag on either side, and a file deleted on the far side.
    for p in pairs:
        for folder in FOLDERS:
            far, near = by_uid(p.far, folder), by_uid(p.near, folder)
            for uid in sorted(far):
                if uid % 6 == 1:
                    set_flags(far[uid], add="T")
                elif uid % 6 == 2:
                    set_flags(near[uid], add="T")
                elif uid % 6 == 3:
                    os.unlink(far[uid])
    sync_all()
    check("expunge")
    for p in pairs:
        for folder in FOLDERS:
            far, near = by_uid(p.far, folder), by_uid(p.near, folder)
            assert sorted(far) == sorted(near)
            assert not [u for u in far if u % 6 in (1, 2, 3)], (p.name, folder)

    # 6. New mail on both sides, synced at once: mbsync sees new/ and cur/
    # modified in the current second and sleeps until it is over.
    for p in pairs:
        for i, folder in enumerate(FOLDERS):
            deliver(p.far, folder, f"1800000000.new{i}.far",
                    b"Subject: far %d\n\nnew on the far side\n" % i)
            deliver(p.near, folder, f"1800000000.new{i}.near",
                    b"Subject: near %d\n\nnew on the near side\n" % i)
        p.sync()
    check("new mail")
    for p in pairs:
        for which in ("far", "near"):
            bodies = b"".join(messages(p.side(which)).values())
            assert bodies.count(b"new on the far side") == len(FOLDERS)
            assert bodies.count(b"new on the near side") == len(FOLDERS)

    # 7. And again nothing to do.
    before = [(tree(p.far), tree(p.near)) for p in pairs]
    sync_all()
    assert [(tree(p.far), tree(p.near)) for p in pairs] == before

    # Promptness: at most one sleep per scanned directory (cur/ and new/
    # of each folder on two sides) per run; a filesystem whose directory
    # mtime is always "now" makes mbsync sleep forever (timeout above).
    for p in pairs:
        assert max(p.sleeps) <= 2 * 2 * len(FOLDERS), (p.name, p.sleeps)
    print("mbsync sleeps per run:", {p.name: p.sleeps for p in pairs})
    # The mount's state and .uidvalidity files are plain files in the
    # folders; their contents are read back identically after a remount.
    state = {f: read_bytes(f) for f in pairs[0].near.rglob(".mbsyncstate")}
    mount.remount()
    assert {f: read_bytes(f) for f in pairs[0].near.rglob(".mbsyncstate")} == state


def test_mbsync_altmap_uid_database_inside_mount(mount, tmp_path):
    """`AltMap yes`: UIDs kept in a Berkeley DB file (.isyncuidmap.db: mmap,
    fcntl locks, random writes) in each folder instead of in the names."""
    need("mbsync")
    src = tmp_path / "corpus"
    subprocess.run([str(GEN_CORPUS), str(src), "--messages", "60", "--seed",
                    "8", "--folders", "INBOX,Sent"], check=True)
    pairs = []
    for name, near in (("alt", mount.mnt / "near"), ("altref", tmp_path / "r-near")):
        far = tmp_path / f"{name}-far"
        subprocess.run(["cp", "-a", str(src), str(far)], check=True)
        pairs.append(Pair(name, far, near, tmp_path, extra="AltMap yes\n"))
    for p in pairs:
        p.sync()
        for folder in ("", ".Sent"):
            for uid, path in sorted(by_uid(p.near, folder).items()):
                assert uid is None  # UIDs are not in the names
            # The same messages on both sides: chosen by content, not by
            # name (mbsync's names hold the second of the run, so their
            # order differs when a run crosses a second elsewhere).
            cur = p.near / folder / "cur"
            names = sorted(os.listdir(cur), key=lambda n: digest(
                TUID.sub(b"", read_bytes(cur / n), count=1)))
            for n in names[::4]:
                set_flags(p.near / folder / "cur" / n, add="F")
        settle()
        p.sync()
    for which in ("far", "near"):
        assert view(pairs[0].side(which)) == view(pairs[1].side(which))
    flagged = [k for k in view(pairs[0].far) if "F" in k[3]]
    assert len(flagged) >= 15
    for folder in ("", ".Sent"):
        assert (mount.mnt / "near" / folder / ".isyncuidmap.db").stat().st_size > 0
    before = tree(pairs[0].near)
    settle()
    pairs[0].sync()
    assert tree(pairs[0].near) == before
