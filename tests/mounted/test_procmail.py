"""procmail delivering into Maildir++ folders on the mount, and the same
deliveries into a native maildir as reference.

procmail writes each message into tmp/, fsyncs it and link()s it into
new/ (rename() only when link() fails); a recipe naming several folders
stores one copy and hard-links it into the others.  The syscalls are traced
to show link() is what ran (and succeeded) on the mount.
"""
import os

from conftest import need_corpora
from maildir_tools import (content_view, corpus_messages, need, run_traced,
                           strip_pid_time)

RC = """MAILDIR={root}
DEFAULT={root}/
LOGFILE={log}
:0
* ^Subject:.*notmuch
.Lists/ .Copy/
:0
* ^Subject:.*cifs
.Lists/
"""


def deliver_all(root, msgs, tmp_path, tag):
    rc = tmp_path / f"procmailrc-{tag}"
    root.mkdir()
    rc.write_text(RC.format(root=root, log=tmp_path / f"procmail-{tag}.log"))
    calls = []
    for i, data in enumerate(msgs):
        r, c = run_traced(["procmail", "-m", str(rc)], tmp_path / "strace.log",
                          ["link", "linkat", "rename", "renameat", "renameat2"],
                          input=data, capture_output=True, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr)
        calls += c
    return calls


def subject_has(data, word):
    """word in the first line of the Subject (procmail's ^Subject:.*word)."""
    head = data.split(b"\n\n", 1)[0]
    return any(l.startswith(b"Subject:") and word in l for l in head.split(b"\n"))


def pick_messages(n_other=20):
    """The lkml messages the recipes select, and n_other that go to INBOX."""
    msgs = corpus_messages(need_corpora() / "notmuch-lkml", 1000)
    chosen = [m for m in msgs if subject_has(m, b"notmuch")]
    chosen += [m for m in msgs if subject_has(m, b"cifs")][:20]
    chosen += [m for m in msgs if not subject_has(m, b"notmuch") and
               not subject_has(m, b"cifs")][:n_other]
    return chosen


def test_procmail_delivers_with_link(make_mount, tmp_path):
    need("procmail", "strace")
    # procmail is setgid mail: FUSE lets it in only with allow_other.
    mount = make_mount(options=["-o", "allow_other"])
    msgs = pick_messages()
    n_copy = sum(subject_has(m, b"notmuch") for m in msgs)
    n_lists = sum(subject_has(m, b"cifs") and not subject_has(m, b"notmuch")
                  for m in msgs)
    assert n_copy and n_lists

    native = tmp_path / "native"
    native.mkdir()
    links = {}
    for tag, root in (("mount", mount.mnt / "pm"), ("native", native / "pm")):
        calls = deliver_all(root, msgs, tmp_path, tag)
        # One link() per delivery into new/ plus one per extra folder; no
        # failure and no rename() fallback.
        assert [c for c in calls if c[2] != 0] == []
        assert [c for c in calls if c[0].startswith("rename")] == []
        links[tag] = sum(c[0] in ("link", "linkat") for c in calls)
        assert links[tag] == len(msgs) + n_copy

    view = content_view(mount.mnt / "pm", unique=strip_pid_time)
    assert view == content_view(native / "pm", unique=strip_pid_time)
    per_folder = {}
    for (folder, sub, _, _, _), count in view.items():
        assert sub == "new"
        per_folder[folder] = per_folder.get(folder, 0) + count
    assert per_folder == {"": len(msgs) - n_copy - n_lists,
                          ".Lists": n_copy + n_lists, ".Copy": n_copy}
    # The .Copy messages are hard links of .Lists ones: same inode.
    pm = mount.mnt / "pm"
    lists = {os.stat(pm / ".Lists" / "new" / n).st_ino
             for n in os.listdir(pm / ".Lists" / "new")}
    for n in os.listdir(pm / ".Copy" / "new"):
        st = os.stat(pm / ".Copy" / "new" / n)
        assert st.st_ino in lists and st.st_nlink == 2
    for folder in ("", ".Lists", ".Copy"):
        assert os.listdir(pm / folder / "tmp") == []
    # And all of it after a remount.
    mount.remount()
    assert content_view(pm, unique=strip_pid_time) == view
