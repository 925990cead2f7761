"""Python's mailbox.Maildir on the mount, and the same calls on a native
maildir as reference.

mailbox.Maildir.add() writes tmp/<time>.M<usec>P<pid>Q<n>.<host>, then
link()s it into new/ (rename() only on PermissionError) and removes the
tmp/ name; flag changes are rename()s (new/ -> cur/), __setitem__ replaces
a message by a new file renamed over the old name's place, remove()
unlinks; folders are Maildir++ `.name` directories with `maildirfolder`.
"""
import json
import mailbox
import os
import subprocess

from conftest import DBOXADM, need_corpora
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


def test_mailbox_add_stores_each_message_once(mount):
    """mailbox.Maildir.add() opens its tmp/ file twice (_create_carefully:
    os.open with O_EXCL, then open() by name) and closes the first
    descriptor before it writes through the second.  That close only
    acknowledges the empty message (fs/fs-write.c, message_flush), so the
    writes go on in its record: one record per message, nothing dead.
    When it finished the record, each add left an empty dead record (for
    purge to give back) and cost a copy (1,720 dead bytes for these 20)."""
    mb = mailbox.Maildir(str(mount.mnt / "py"), factory=None, create=True)
    msgs = [b"Subject: %d\n\n" % i + b"body line\n" * (i + 1) for i in range(20)]
    keys = [mb.add(data) for data in msgs]
    assert sorted(mb.get_bytes(k) for k in keys) == sorted(msgs)
    mb.close()
    mount.unmount()
    r = subprocess.run([str(DBOXADM), "stats", str(mount.store), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["dead_bytes"] == 0, stats
    mount.mount()


def test_shell_redirects_store_each_version_once(mount):
    """A shell's `> file` opens the file, moves the descriptor to 1 and
    closes the one it opened (a FLUSH) before the command writes.  That
    close only acknowledges the empty message; when it finished it, each
    redirect left an empty dead record before the real one (8 records
    here).  Three new messages and one written over: four records, one of
    them dead (the first version of b)."""
    md = mount.maildir()
    for name in ("a", "b", "c"):
        subprocess.run(["sh", "-c", f'printf "Subject: {name}\\n\\nbody\\n" > "{md}/cur/{name}"'],
                       check=True)
    subprocess.run(["sh", "-c", f'echo "Subject: again" > "{md}/cur/b"'], check=True)
    assert (md / "cur" / "b").read_bytes() == b"Subject: again\n"
    assert (md / "cur" / "a").read_bytes() == b"Subject: a\n\nbody\n"
    mount.unmount()
    r = subprocess.run([str(DBOXADM), "dump", str(mount.store), "m.1"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    records = r.stdout.splitlines()[1:]
    assert len(records) == 4, r.stdout
    mount.mount()
