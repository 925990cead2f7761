"""Courier maildrop delivering into Maildir++ folders on the mount (made by
maildirmake), and the same deliveries into a native maildir as reference.

maildrop creates tmp/<time>.M<usec>P<pid>_<n>.<host>,S=<size>, fstat()s it
to put the device and inode into the final name, and link()s it into new/
(rename() only on EXDEV), then unlinks the tmp/ name.  The syscalls are
traced to show link() is what ran on the mount.  maildrop is setgid mail,
so the mount needs allow_other.
"""
import os
import re
import subprocess

from conftest import need_corpora
from maildir_tools import (content_view, corpus_messages, need, run_traced,
                           strip_pid_time)

FILTER = """MD="{root}"
if (/^Subject:.*notmuch/)
{{
  cc "$MD/.Copy/"
  to "$MD/.Lists/"
}}
if (/^Subject:.*cifs/)
{{
  to "$MD/.Lists/"
}}
to "$MD/"
"""


def unique(base):
    """Drop time, pid and the V<dev>I<ino> part (different filesystems)."""
    return re.sub(r"V[0-9A-F]+I[0-9A-F]+", "", strip_pid_time(base))


def test_maildrop_delivers_with_link(make_mount, tmp_path):
    need("maildrop", "maildirmake", "strace")
    mount = make_mount(options=["-o", "allow_other"])
    msgs = corpus_messages(need_corpora() / "notmuch-lkml", 50)
    native = tmp_path / "native"
    native.mkdir()
    names = {}
    for tag, root in (("mount", mount.mnt / "md"), ("native", native / "md")):
        subprocess.run(["maildirmake", str(root)], check=True)
        for folder in ("Lists", "Copy"):
            subprocess.run(["maildirmake", "-f", folder, str(root)], check=True)
        assert (root / ".Lists" / "maildirfolder").exists()
        rc = tmp_path / f"mailfilter-{tag}"
        rc.write_text(FILTER.format(root=root))
        rc.chmod(0o600)
        calls = []
        for data in msgs:
            r, c = run_traced(["maildrop", str(rc)], tmp_path / "strace.log",
                              ["link", "linkat", "rename", "renameat",
                               "renameat2", "unlink", "unlinkat"],
                              input=data, capture_output=True, timeout=60)
            assert r.returncode == 0, (r.stdout, r.stderr)
            calls += c
        assert [c for c in calls if c[2] != 0] == []
        assert [c for c in calls if c[0].startswith("rename")] == []
        links = [c for c in calls if c[0] in ("link", "linkat")]
        unlinks = [c for c in calls if c[0].startswith("unlink")]
        assert len(links) == len(unlinks) >= len(msgs)
        names[tag] = links

    view = content_view(mount.mnt / "md", unique=unique)
    assert view == content_view(native / "md", unique=unique)
    per_folder = {}
    for (folder, sub, _, _, _), count in view.items():
        assert sub == "new"
        per_folder[folder] = per_folder.get(folder, 0) + count
    assert sum(per_folder.values()) == len(msgs) + per_folder[".Copy"]
    assert per_folder[".Copy"] > 0 and per_folder[".Lists"] > per_folder[".Copy"]
    # ,S= is the exact size and I<inode> in the name is the message's inode.
    md = mount.mnt / "md"
    for folder in ("", ".Lists", ".Copy"):
        for n in os.listdir(md / folder / "new"):
            st = os.stat(md / folder / "new" / n)
            assert int(re.search(r",S=(\d+)", n).group(1)) == st.st_size
            assert int(re.search(r"I([0-9A-F]+)_", n).group(1), 16) == st.st_ino
        assert os.listdir(md / folder / "tmp") == []
    mount.remount()
    assert content_view(md, unique=unique) == view
