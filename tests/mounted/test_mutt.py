"""Debian's classic mutt on the mount: the NeoMutt steps (mutt_steps.py) with
mutt, each compared with the same run on a native maildir.

mutt commits new messages like NeoMutt (tmp/, fsync, link() + unlink(),
rename() only when link() fails with EXDEV/EPERM/ENOSYS-like errors) and
changes flags with rename(), moving unread messages back to new/.
"""
import mutt_steps
from maildir_tools import copy_corpus, need
from conftest import need_corpora
from mutt_steps import check_steps, message_ids

PROG = "mutt"


def test_mutt_reads_every_message(mount, tmp_path):
    need(PROG)
    src = need_corpora() / "notmuch-lkml"
    folder = copy_corpus(src, mount.mnt / ".lkml")
    native = copy_corpus(src, tmp_path / "native")
    rc = mutt_steps.write_rc(tmp_path / "muttrc", tmp_path)
    mutt_steps.copy_all(PROG, rc, folder, tmp_path / "out-mount")
    mutt_steps.copy_all(PROG, rc, native, tmp_path / "out-native")
    got = message_ids(tmp_path / "out-mount")
    assert len(got) == len(list((src / "cur").iterdir()))
    assert got == message_ids(tmp_path / "out-native")
    assert mutt_steps.created_view(tmp_path / "out-mount") == \
        mutt_steps.created_view(tmp_path / "out-native")


def test_mutt_flags_delete_save(mount, tmp_path):
    need(PROG)
    check_steps(PROG, mount, tmp_path)
