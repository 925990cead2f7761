"""notmuch with its Xapian database inside the mount (`.notmuch/xapian/`:
random writes, fcntl locks, files renamed over each other), and the same
work on a native maildir as reference.

Steps: `notmuch new` on the notmuch test corpus, `notmuch insert` (tmp/,
fsync, rename() into new/, then fsync of the new/ directory), tag changes
synced to maildir flags (rename(), new/ -> cur/), a folder renamed away and
back (notmuch detects file renames and keeps the tags), files removed,
`notmuch compact` (a new database, swapped in by directory renames).
After each step the reports of notmuch, its tags (`notmuch dump`), its
file list and the names on disk equal the native run's.
"""
import os
import re
import subprocess
from pathlib import Path

from conftest import need_corpora
from maildir_tools import content_view, copy_corpus, need, strip_pid_time

CONFIG = """[database]
path={root}
[user]
name=Test
primary_email=test@example.org
[new]
tags=unread;inbox;
ignore=
[search]
exclude_tags=
[maildir]
synchronize_flags=true
"""

INSERTS = [
    b"From: Ann <ann@example.org>\nTo: test@example.org\nSubject: insert %d\n"
    b"Message-ID: <insert-%d@example.org>\nDate: Mon, 1 Jan 2024 10:00:0%d +0000\n"
    b"\nInserted by notmuch insert, number %d.\n" % (i, i, i, i)
    for i in range(3)
]


class Notmuch:
    def __init__(self, root, cfg):
        self.root = Path(root)
        self.cfg = Path(cfg)
        self.cfg.write_text(CONFIG.format(root=root))

    def run(self, *args, stdin=None):
        r = subprocess.run(["notmuch", *args], input=stdin, capture_output=True,
                           env={**os.environ, "NOTMUCH_CONFIG": str(self.cfg)},
                           timeout=120)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r.stdout.decode() + r.stderr.decode()

    def new(self):
        """notmuch new; returns {'added': n, 'removed': n, 'renamed': n}."""
        out = self.run("new")
        counts = {"added": 0, "removed": 0, "renamed": 0}
        for key, pat in (("added", r"Added (\d+) new message"),
                         ("removed", r"Removed (\d+) message"),
                         ("renamed", r"Detected (\d+) file rename")):
            m = re.search(pat, out)
            if m:
                counts[key] = int(m.group(1))
        return counts

    def state(self):
        """What notmuch knows: tags per message and every file (relative,
        with generated unique names reduced)."""
        dump = sorted(l for l in self.run("dump", "--include=tags").splitlines()
                      if not l.startswith("#"))
        files = sorted(os.path.join(os.path.relpath(os.path.dirname(f), self.root),
                                    strip_pid_time(os.path.basename(f)))
                       for f in self.run("search", "--output=files",
                                         "--duplicate=1", "*").splitlines())
        count = int(self.run("count", "--output=files", "*"))
        return dump, files, count

    def disk(self):
        return content_view(self.root, unique=strip_pid_time)


def test_notmuch_database_inside_mount(mount, tmp_path):
    need("notmuch")
    src = need_corpora() / "notmuch-default"
    runs = {}
    for where, root in (("mount", mount.mnt / "mail"),
                        ("native", tmp_path / "native" / "mail")):
        root.parent.mkdir(exist_ok=True)
        copy_corpus(src, root)
        nm = Notmuch(root, tmp_path / f"notmuch-{where}")
        steps = []

        # notmuch new: the whole corpus indexed, the database created in
        # the mail root.
        steps.append(("new", nm.new(), nm.state(), nm.disk()))
        assert (root / ".notmuch" / "xapian").is_dir()

        # notmuch insert into a new folder (created by notmuch).
        for i, msg in enumerate(INSERTS):
            nm.run("insert", "--create-folder", "--folder=Inserted",
                   "+inserted", stdin=msg)
        steps.append(("insert", None, nm.state(), nm.disk()))

        # Tags synced to maildir flags: read (S), flagged (F), replied (R).
        nm.run("tag", "-unread", "--", "tag:inserted", "or", "folder:foo")
        nm.run("tag", "+flagged", "--", "folder:bar", "or", "id:insert-1@example.org")
        nm.run("tag", "+replied", "-unread", "--", "folder:foo/baz")
        steps.append(("tags to flags", None, nm.state(), nm.disk()))

        # A folder renamed away and back: renames detected, tags kept.
        os.rename(root / "bar", root / "bar-away")
        steps.append(("away", nm.new(), nm.state(), nm.disk()))
        os.rename(root / "bar-away", root / "bar")
        steps.append(("back", nm.new(), nm.state(), nm.disk()))
        # Out of the mail root and back before notmuch looks: the
        # directory mtimes changed, the rescan finds the same files.
        os.rename(root / "foo", root.parent / "foo-outside")
        os.rename(root.parent / "foo-outside", root / "foo")
        steps.append(("out and back", nm.new(), nm.state(), nm.disk()))

        # A folder removed: its messages leave the database.
        subprocess.run(["rm", "-r", str(root / "foo" / "baz")], check=True)
        steps.append(("removed", nm.new(), nm.state(), nm.disk()))

        # notmuch compact writes a new database beside the old one and
        # swaps the directories with rename().
        nm.run("compact")
        steps.append(("compact", nm.new(), nm.state(), nm.disk()))
        assert sorted(os.listdir(root / ".notmuch")) == ["xapian"]
        runs[where] = steps

    for got, want in zip(runs["mount"], runs["native"]):
        assert got == want, got[0]

    steps = dict((s[0], s[1:]) for s in runs["mount"])
    added = steps["new"][0]["added"]
    assert added == 52 and steps["new"][1][2] == 53  # one duplicate file
    assert steps["insert"][1][2] == 53 + len(INSERTS)
    dump = steps["tags to flags"][1][0]
    assert sum("+flagged" in l for l in dump) >= 3
    assert not [f for f in os.listdir(mount.mnt / "mail" / "Inserted" / "new")]
    assert len(os.listdir(mount.mnt / "mail" / "Inserted" / "cur")) == len(INSERTS)
    renamed = steps["away"][0]["renamed"]
    assert renamed > 0 and steps["back"][0]["renamed"] == renamed
    assert steps["away"][0]["removed"] == steps["away"][0]["added"] == 0
    assert steps["back"][1][0] == dump  # tags kept across the renames
    assert steps["out and back"][0] == {"added": 0, "removed": 0, "renamed": 0}
    assert steps["out and back"][1] == steps["back"][1]
    assert steps["removed"][0]["removed"] > 0

    # The database on the mount survives a remount.
    mount.remount()
    nm = Notmuch(mount.mnt / "mail", tmp_path / "notmuch-mount")
    assert nm.state() == runs["mount"][-1][2]
    assert nm.new() == {"added": 0, "removed": 0, "renamed": 0}
