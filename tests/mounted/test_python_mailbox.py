"""Python's mailbox.Maildir on the mount, and the same calls on a native
maildir as reference.

mailbox.Maildir.add() writes tmp/<time>.M<usec>P<pid>Q<n>.<host>, then
link()s it into new/ (rename() only on PermissionError) and removes the
tmp/ name; flag changes are rename()s (new/ -> cur/), __setitem__ replaces
a message by a new file renamed over the old name's place, remove()
unlinks; folders are Maildir++ `.name` directories with `maildirfolder`.
"""
import mailbox
import os

from conftest import need_corpora
from maildir_tools import content_view, corpus_messages, strip_pid_time


def exercise(root, msgs):
    """A run of mailbox calls; returns what the API reported."""
    mb = mailbox.Maildir(str(root), factory=None, create=True)
    report = {}
    keys = [mb.add(data) for data in msgs]
    report["added"] = len(mb)
    # Read every message back through the API.
    report["bytes"] = sorted(mb.get_bytes(k) for k in keys)
    # Flags: read + flagged on every third, replied on every fifth.
    for i, k in enumerate(keys):
        if i % 3 == 0 or i % 5 == 0:
            msg = mb[k]
            msg.set_subdir("cur")
            msg.add_flag("S" + ("F" if i % 3 == 0 else "") + ("R" if i % 5 == 0 else ""))
            mb[k] = msg
    report["flags"] = sorted((keys.index(k), mb.get_message(k).get_flags(),
                              mb.get_message(k).get_subdir()) for k in keys)
    # Remove some.
    for k in keys[::7]:
        mb.remove(k)
    report["after remove"] = len(mb)
    # Folders: create, fill, list, remove.
    lists = mb.add_folder("Lists")
    sub = mb.add_folder("Lists.sub")
    for data in msgs[:5]:
        lists.add(data)
    sub.add(msgs[5])
    report["folders"] = sorted(mb.list_folders())
    report["lists"] = len(mb.get_folder("Lists"))
    old = mb.add_folder("Old")
    old.add(msgs[6])
    try:
        mb.remove_folder("Old")
        report["remove non-empty"] = "removed"
    except mailbox.NotEmptyError:
        report["remove non-empty"] = "NotEmptyError"
    old.discard(next(iter(old.keys())))
    mb.remove_folder("Old")
    report["folders after"] = sorted(mb.list_folders())
    mb.close()
    return report


def test_python_mailbox_maildir(mount, tmp_path):
    msgs = corpus_messages(need_corpora() / "notmuch-lkml", 40)
    got = exercise(mount.mnt / "py", msgs)
    (tmp_path / "native").mkdir()
    want = exercise(tmp_path / "native" / "py", msgs)
    assert got == want
    assert got["added"] == 40 and got["after remove"] == 40 - 6
    assert got["bytes"] == sorted(msgs)
    assert got["folders"] == ["Lists", "Lists.sub"]
    assert got["remove non-empty"] == "NotEmptyError"
    assert got["folders after"] == ["Lists", "Lists.sub"]
    view = content_view(mount.mnt / "py", unique=strip_pid_time)
    assert view == content_view(tmp_path / "native" / "py", unique=strip_pid_time)
    assert (mount.mnt / "py" / ".Lists" / "maildirfolder").exists()
    for folder in ("", ".Lists", ".Lists.sub"):
        assert os.listdir(mount.mnt / "py" / folder / "tmp") == []
