"""NeoMutt on the mount, with the same work on a native maildir as reference.

NeoMutt needs a terminal: it runs under script(1) and gets its work as
`push` keys (mutt_steps.py).  It opens a corpus folder, reads every message,
sets and clears flags, marks read messages unread (which moves them from
cur/ back to new/), deletes and syncs, and saves messages into a new folder
(NeoMutt commits a new message with link() then unlink()).  After each step
the names, flags and bytes on the mount equal those of the native run.
A second test keeps NeoMutt's header cache (Tokyo Cabinet: mmap, fcntl
locks, random writes) in a file inside the mount.
"""
import os
import re

import mutt_steps
from conftest import need_corpora
from maildir_tools import copy_corpus, need
from mutt_steps import check_steps, message_ids

PROG = "neomutt"


def test_neomutt_reads_every_message(mount, tmp_path):
    need(PROG)
    src = need_corpora() / "notmuch-lkml"
    folder = copy_corpus(src, mount.mnt / ".lkml")
    native = copy_corpus(src, tmp_path / "native")
    count = len(os.listdir(src / "cur"))
    assert count > 100

    rc = mutt_steps.write_rc(tmp_path / "muttrc", tmp_path)
    mutt_steps.copy_all(PROG, rc, folder, tmp_path / "out-mount")
    mutt_steps.copy_all(PROG, rc, native, tmp_path / "out-native")

    got = message_ids(tmp_path / "out-mount")
    assert len(got) == count
    assert got == message_ids(tmp_path / "out-native")
    # Copies of the same messages: the same bytes (names hold the time).
    assert mutt_steps.created_view(tmp_path / "out-mount") == \
        mutt_steps.created_view(tmp_path / "out-native")


def test_neomutt_flags_delete_save(mount, tmp_path):
    need(PROG)
    check_steps(PROG, mount, tmp_path)


def opened_messages(prog, rc, mailbox, tmp_path):
    """Open mailbox and quit under strace; the message files prog opened."""
    log = tmp_path / "strace.log"
    mutt_steps.run_in_terminal(
        f"strace -f -qq -e trace=open,openat -o {log} "
        f"{prog} -n -F {rc} -f {mailbox} -e 'push \"<quit>\"'")
    opened = set()
    for line in log.read_text().splitlines():
        m = re.search(r'open(?:at)?\(.*?"([^"]+)"', line)
        if m and "= -1" not in line and re.search(r"/(cur|new)/[^/]+$", m.group(1)):
            opened.add(os.path.basename(m.group(1)))
    return opened


def test_neomutt_header_cache_inside_mount(mount, tmp_path):
    need(PROG, "strace")
    src = need_corpora() / "notmuch-lkml"
    count = len(os.listdir(src / "cur"))
    results = {}
    (tmp_path / "native").mkdir()
    for where, root in (("mount", mount.mnt), ("native", tmp_path / "native")):
        folder = copy_corpus(src, root / ".lkml")
        hcache = root / "hcache"
        hcache.mkdir()
        rc = mutt_steps.write_rc(tmp_path / f"muttrc-{where}", root,
                                 hcache=f"{hcache}/")
        # First open: every message parsed and stored in the cache.
        first = opened_messages(PROG, rc, folder, tmp_path)
        files = os.listdir(hcache)
        assert len(files) == 1
        with open(hcache / files[0], "rb") as fp:
            assert fp.read(14) == b"ToKyO CaBiNeT\n"
        # Second open: headers come from the cache file on the mount.
        second = opened_messages(PROG, rc, folder, tmp_path)
        # A flag change stored through the cache, then a third open.
        mutt_steps.run(PROG, rc, folder,
                       "<tag-pattern>~s cifs<enter><tag-prefix><set-flag>!"
                       "<sync-mailbox>")
        third = opened_messages(PROG, rc, folder, tmp_path)
        mutt_steps.copy_all(PROG, rc, folder, tmp_path / f"out-{where}")
        results[where] = (len(first), len(second), len(third),
                          sorted(os.listdir(folder / "cur")),
                          mutt_steps.created_view(tmp_path / f"out-{where}"))
    m, n = results["mount"], results["native"]
    assert m[0] == count and m[1] == 0 and m[2] == 0
    assert m == n
