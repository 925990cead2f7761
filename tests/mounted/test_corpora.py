"""Real mail in, real mail out: the shared corpora copied through the mount.

`cp -a` of each corpus into a Maildir++ folder of the mount, then a remount,
then `diff -r` against the original must be empty and every file mtime
(nanoseconds) must match.
"""
import os
import subprocess

import pytest

from conftest import CORPORA, need_corpora


def tree(root):
    """{relative path: (bytes, mtime_ns)} of the regular files under root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            st = os.stat(p)
            with open(p, "rb") as fp:
                out[os.path.relpath(p, root)] = (fp.read(), st.st_mtime_ns)
    return out


def corpora():
    root = need_corpora()
    return sorted(p for p in root.iterdir() if p.is_dir())


@pytest.mark.parametrize("corpus", [c.name for c in corpora()] if CORPORA.is_dir()
                         else ["none"])
def test_cp_a_in_and_diff_after_remount(mount, corpus):
    src = need_corpora() / corpus
    dest = mount.mnt / f".{corpus}"
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    mount.remount()
    r = subprocess.run(["diff", "-r", str(src), str(dest)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    want, got = tree(src), tree(dest)
    assert want.keys() == got.keys()
    for name, (data, mtime) in want.items():
        assert got[name][0] == data, name
        assert got[name][1] == mtime, name


def test_cp_a_out(mount, tmp_path):
    src = need_corpora() / "notmuch-lkml"
    subprocess.run(["cp", "-a", str(src), str(mount.mnt / ".lkml")], check=True)
    mount.remount()
    out = tmp_path / "out"
    subprocess.run(["cp", "-a", str(mount.mnt / ".lkml"), str(out)], check=True)
    assert tree(out) == tree(src)
