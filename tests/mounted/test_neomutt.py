"""NeoMutt opens a corpus folder on the mount and sees every message.

NeoMutt needs a terminal: it runs under script(1).  It tags every message
and copies them to a native maildir, which proves it opened and read each
one; the same run on the native original must give the same messages.
"""
import email
import os
import shutil
import subprocess

import pytest

from conftest import need_corpora

MUTTRC = """set mbox_type=Maildir
set confirmcreate=no
set confirmappend=no
set header_cache=""
set wait_key=no
set sort=date
"""


def neomutt_copy_all(folder, out, tmp_path):
    rc = tmp_path / "muttrc"
    rc.write_text(MUTTRC)
    cmd = (f"neomutt -n -F {rc} -f {folder} -e 'push \""
           f"<tag-pattern>~A<enter><tag-prefix><copy-message>{out}<enter><quit>\"'")
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], env={**os.environ, "TERM": "xterm"},
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:]
    return r.stdout


def message_ids(maildir):
    ids = []
    for sub in ("cur", "new"):
        for name in os.listdir(os.path.join(maildir, sub)):
            with open(os.path.join(maildir, sub, name), "rb") as fp:
                ids.append(email.message_from_binary_file(fp)["Message-ID"])
    return sorted(ids)


@pytest.mark.skipif(shutil.which("neomutt") is None, reason="neomutt not installed")
def test_neomutt_reads_every_message(mount, tmp_path):
    src = need_corpora() / "notmuch-lkml"
    folder = mount.mnt / ".lkml"
    subprocess.run(["cp", "-a", str(src), str(folder)], check=True)
    for sub in ("new", "tmp"):
        (folder / sub).mkdir(exist_ok=True)
    count = len(os.listdir(src / "cur"))
    assert count > 100

    neomutt_copy_all(folder, tmp_path / "out-mount", tmp_path)
    native = tmp_path / "native"
    shutil.copytree(src, native)
    for sub in ("new", "tmp"):
        (native / sub).mkdir(exist_ok=True)
    neomutt_copy_all(native, tmp_path / "out-native", tmp_path)

    got = message_ids(tmp_path / "out-mount")
    assert len(got) == count
    assert got == message_ids(tmp_path / "out-native")
