"""rsync -a and cp -a of mail trees into the mount and back out, each
compared with the same copy made natively.

rsync writes every file as a temporary `.name.XXXXXX` in the target
directory and rename()s it to its name: in cur/ and new/ the temporary is a
plain dot-file and becomes a message at the rename (dboxadm stats counts
them as messages, not plain files).  Trees must be equal: names, bytes,
mtimes (nanoseconds) and permission bits; a second rsync transfers
nothing; a flag rename in the source plus `rsync -a --delete` follows it,
an edited message is replaced, hard links survive `rsync -aH` and `cp -a`.
"""
import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import DBOXADM, need_corpora
from maildir_tools import message_paths, need, run_traced, tree

GEN_CORPUS = Path(__file__).resolve().parents[2] / "tools" / "gen-corpus"


def modes(root):
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            out[os.path.relpath(p, root)] = stat.S_IMODE(os.lstat(p).st_mode)
    return out


def rsync(src, dest, *extra, log=None):
    """rsync -a src/ dest/; returns the itemized changes (and the traced
    creates/renames when log is given)."""
    cmd = ["rsync", "-a", "--itemize-changes", *extra, f"{src}/", f"{dest}/"]
    if log is None:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        calls = None
    else:
        r, calls = run_traced(cmd, log, ["openat", "rename", "renameat",
                                         "renameat2"],
                              capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [l for l in r.stdout.splitlines() if l], calls


def sources(tmp_path):
    """A generated Maildir++ tree and the notmuch corpus (nested folders,
    files outside cur/new), made writable."""
    gen = tmp_path / "src-gen"
    subprocess.run([str(GEN_CORPUS), str(gen), "--messages", "300", "--seed", "3"],
                   check=True)
    nm = tmp_path / "src-notmuch"
    subprocess.run(["cp", "-a", str(need_corpora() / "notmuch-default"), str(nm)],
                   check=True)
    subprocess.run(["chmod", "-R", "u+w", str(nm)], check=True)
    return [gen, nm]


def stats(store):
    r = subprocess.run([str(DBOXADM), "stats", str(store), "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_rsync_in_and_out(mount, tmp_path):
    need("rsync", "strace")
    srcs = sources(tmp_path)
    n_messages = n_files = 0
    for i, src in enumerate(srcs):
        dest, ref = mount.mnt / f"r{i}", tmp_path / f"native-r{i}"
        items, calls = rsync(src, dest, log=tmp_path / "strace.log")
        rsync(src, ref)
        assert tree(dest) == tree(src) == tree(ref)
        assert modes(dest) == modes(src) == modes(ref)
        # rsync wrote temporaries .name.XXXXXX and renamed them.
        msgs = {os.path.basename(p) for p in message_paths(src)}
        temps = []
        for call, args, ret, _ in calls:
            names = re.findall(r'"([^"]*)"', args)
            if call.startswith("rename") and ret == 0 and len(names) == 2:
                old, new = (os.path.basename(n) for n in names)
                if new in msgs and old.startswith("." + new + "."):
                    temps.append(new)
        assert sorted(temps) == sorted(msgs)
        n_messages += len(message_paths(src))
        n_files += len(tree(src)) - len(message_paths(src))
        # Nothing to do the second time.
        assert rsync(src, dest)[0] == []

    # Every message is a message in the store (the temporaries were
    # converted), the rest are plain files.
    st = stats(mount.store)
    assert st["messages"] == st["message_names"] == n_messages
    assert st["plain_files"] == n_files

    # A flag change (rename) in the source, then rsync --delete.
    gen = srcs[0]
    cur = gen / "cur"
    renamed = [n for n in sorted(os.listdir(cur)) if not n.endswith(":2,FS")][:10]
    for n in renamed:
        os.rename(cur / n, cur / (n.split(":2,")[0] + ":2,FS"))
    items, _ = rsync(gen, mount.mnt / "r0", "--delete")
    assert sum(l.startswith("*deleting") for l in items) == len(renamed)
    assert tree(mount.mnt / "r0") == tree(gen)

    # A message whose bytes changed under the same name: rsync's delta
    # transfer reads the old message and renames a new temporary over it.
    edited = cur / sorted(os.listdir(cur))[0]
    edited.write_bytes(edited.read_bytes() + b"\nedited\n")
    items, _ = rsync(gen, mount.mnt / "r0")
    assert len([l for l in items if l.startswith(">f")]) == 1
    assert tree(mount.mnt / "r0") == tree(gen)

    # Hard links (a Dovecot COPY, a procmail multi-folder delivery) stay
    # hard links with rsync -aH, in and out.
    os.link(edited, gen / ".Archive" / "cur" / edited.name)
    rsync(gen, mount.mnt / "r0", "-H")
    a = os.stat(mount.mnt / "r0" / "cur" / edited.name)
    b = os.stat(mount.mnt / "r0" / ".Archive" / "cur" / edited.name)
    assert a.st_ino == b.st_ino and a.st_nlink == 2

    # Back out of the mount, after a remount.
    mount.remount()
    for i, src in enumerate(srcs):
        out = tmp_path / f"out-r{i}"
        rsync(mount.mnt / f"r{i}", out, "-H")
        assert tree(out) == tree(src)
        assert modes(out) == modes(src)
    out = tmp_path / "out-r0"
    assert os.stat(out / "cur" / edited.name).st_ino == \
        os.stat(out / ".Archive" / "cur" / edited.name).st_ino


def test_cp_a_in_and_out(mount, tmp_path):
    srcs = sources(tmp_path)
    # A hard link between folders: cp -a keeps it (link() on the mount).
    first = sorted(os.listdir(srcs[0] / "cur"))[0]
    os.link(srcs[0] / "cur" / first, srcs[0] / ".Sent" / "cur" / first)
    for i, src in enumerate(srcs):
        dest, ref = mount.mnt / f"c{i}", tmp_path / f"native-c{i}"
        subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
        subprocess.run(["cp", "-a", str(src), str(ref)], check=True)
        assert tree(dest) == tree(src) == tree(ref)
        assert modes(dest) == modes(src) == modes(ref)
    mount.remount()
    for i, src in enumerate(srcs):
        out = tmp_path / f"out-c{i}"
        subprocess.run(["cp", "-a", str(mount.mnt / f"c{i}"), str(out)], check=True)
        assert tree(out) == tree(src)
        assert modes(out) == modes(src)
        if i == 0:
            for root in (mount.mnt / "c0", out):
                a = os.stat(root / "cur" / first)
                b = os.stat(root / ".Sent" / "cur" / first)
                assert a.st_ino == b.st_ino and a.st_nlink == 2
        # Directory mtimes are kept too (cp -a sets them last).
        for d in ("cur", "new"):
            if (src / d).is_dir():
                assert os.stat(out / d).st_mtime_ns == os.stat(src / d).st_mtime_ns


def test_symlinks_are_copied_as_on_ext4(mount, tmp_path):
    """rsync -a and cp -a of a tree holding a symlink copy it as a symlink
    (the target byte for byte, never followed) and everything else, on
    the mount as into a plain directory."""
    need("rsync")
    src = tmp_path / "src"
    subprocess.run(["cp", "-a", str(need_corpora() / "notmuch-lkml"), str(src)],
                   check=True)
    subprocess.run(["chmod", "-R", "u+w", str(src)], check=True)
    os.symlink("cur", src / "link-to-cur")
    want = tree(src)
    for base in (tmp_path / "plain", mount.mnt):
        base.mkdir(exist_ok=True)
        r = subprocess.run(["rsync", "-a", f"{src}/", str(base / "r")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        r = subprocess.run(["cp", "-a", str(src), str(base / "c")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        for dest in (base / "r", base / "c"):
            assert tree(dest) == want
            assert os.readlink(dest / "link-to-cur") == "cur"
            # rsync and cp keep a symlink's mtime to the second on ext4
            assert (int(os.lstat(dest / "link-to-cur").st_mtime) ==
                    int(os.lstat(src / "link-to-cur").st_mtime))
