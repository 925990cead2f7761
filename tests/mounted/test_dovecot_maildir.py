"""Dovecot with `mail_location = maildir:` on the mount, and the same work on
a native maildir as reference, in one Dovecot instance with two users.

Dovecot keeps its own files inside each maildir folder (dovecot-uidlist,
dovecot.index*, dovecot-keywords: mmap()ed, fcntl-locked, rewritten by
rename()).  Mail arrives by dovecot-lda (tmp/, fsync, utime, rename());
doveadm then changes flags and keywords, COPYs (Dovecot copies with
link()), expunges, and creates, renames and deletes folders.  After each
step `doveadm fetch` of every message (mailbox, uid, flags, body) and the
mailbox status on the mount equal those of the native user, and so do the
message names and bytes on disk.  Four dovecot-lda processes delivering
into one mailbox at once get unique UIDs on the mount as natively.

Dovecot refuses to run mail processes as root: the mail user is Debian's
`mail`, the mount uses `-o allow_other`, and everything lives in a
world-traversable temporary directory (pytest's own is 0700).
"""
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import is_mounted, need_corpora
from maildir_tools import content_view, need, strip_pid_time

LDA = "/usr/lib/dovecot/dovecot-lda"

CONFIG = """base_dir = {base}/run
state_dir = {base}/state
log_path = {base}/dovecot.log
instance_name = dboxfs-test-{pid}
protocols =
ssl = no
first_valid_uid = 1
default_internal_user = mail
default_internal_group = mail
default_login_user = mail
mail_location = maildir:{base}/%u/Maildir
lda_mailbox_autocreate = yes
namespace inbox {{
  inbox = yes
  separator = /
}}
userdb {{
  driver = static
  args = uid=mail gid=mail home={base}/home/%u
}}
passdb {{
  driver = static
  args = nopassword=y
}}
"""

USERS = ("mount", "native")


class Dovecot:
    def __init__(self, base):
        self.base = Path(base)
        self.conf = self.base / "dovecot.conf"

    def doveadm(self, user, *args):
        """doveadm COMMAND -u user ARGS; COMMAND is one word or two
        ("flags add", "mailbox create")."""
        n = 2 if args[0] in ("flags", "mailbox") else 1
        r = subprocess.run(["doveadm", "-c", str(self.conf), *args[:n], "-u", user,
                            *args[n:]], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (args, r.stdout, r.stderr, self.log())
        return r.stdout

    def deliver(self, user, data, mailbox=None):
        cmd = [LDA, "-c", str(self.conf), "-d", user]
        if mailbox:
            cmd += ["-m", mailbox]
        r = subprocess.run(cmd, input=data, capture_output=True, timeout=60)
        assert r.returncode == 0, (r.stdout, r.stderr, self.log())

    def log(self):
        try:
            return (self.base / "dovecot.log").read_text()[-3000:]
        except OSError:
            return ""


@pytest.fixture
def dovecot_base():
    """A world-traversable temporary directory, removed after the mount
    in it is gone (this fixture is torn down after make_mount)."""
    base = Path(tempfile.mkdtemp(prefix="dboxfs-test-dovecot-"))
    os.chmod(base, 0o755)
    yield base
    if not is_mounted(base / "mount"):
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def dovecot(dovecot_base, make_mount):
    need("dovecot", "doveadm", LDA)
    mail = pwd.getpwnam("mail")
    base = dovecot_base
    dv = Dovecot(base)
    dv.mount = None
    started = False
    try:
        for d in ("run", "state", "home", "home/mount", "home/native", "native"):
            (base / d).mkdir()
        for d in ("home/mount", "home/native", "native"):
            os.chown(base / d, mail.pw_uid, mail.pw_gid)
        m = dv.mount = make_mount(store=base / "store", mnt=base / "mount",
                                  options=["-o", "allow_other"])
        os.chown(m.mnt, mail.pw_uid, mail.pw_gid)
        os.chmod(m.mnt, 0o755)
        dv.conf.write_text(CONFIG.format(base=base, pid=os.getpid()))
        subprocess.run(["dovecot", "-c", str(dv.conf)], check=True, timeout=30)
        started = True
        yield dv
    finally:
        if started:
            subprocess.run(["doveadm", "-c", str(dv.conf), "stop"],
                           capture_output=True, timeout=30)
            pidfile = base / "run" / "master.pid"
            for _ in range(100):
                if not pidfile.exists():
                    break
                time.sleep(0.05)
        # make_mount unmounts next, then dovecot_base removes the files.


def fetch(dv, user):
    """Every message of every mailbox as doveadm fetch prints it."""
    return dv.doveadm(user, "fetch", "mailbox uid flags size.virtual text", "all")


def status(dv, user):
    return dv.doveadm(user, "mailbox", "status",
                      "messages recent unseen uidnext", "*")


def state(dv, user):
    root = dv.base / user / "Maildir"
    return (fetch(dv, user), status(dv, user),
            sorted(dv.doveadm(user, "mailbox", "list").split()),
            content_view(root, unique=strip_pid_time))


def corpus_messages(n):
    src = need_corpora() / "notmuch-lkml" / "cur"
    names = sorted(os.listdir(src))[:n]
    return [(src / name).read_bytes() for name in names]


def test_dovecot_on_the_mount(dovecot, tmp_path):
    dv = dovecot
    msgs = corpus_messages(24)
    steps = {user: [] for user in USERS}

    def step(what, *doveadm_args):
        for user in USERS:
            for args in doveadm_args:
                dv.doveadm(user, *args)
            steps[user].append((what, state(dv, user)))
        assert steps["mount"][-1] == steps["native"][-1], what

    # dovecot-lda: 16 into INBOX, 8 into Lists (created by the LDA).
    for user in USERS:
        for i, data in enumerate(msgs):
            dv.deliver(user, data, None if i < 16 else "Lists")
    step("deliver")
    assert "uid: 16" in steps["mount"][-1][1][0]
    assert fetch(dv, "mount").count("mailbox: Lists") == 8

    step("flags",
         ("flags", "add", "\\Seen", "mailbox", "INBOX", "uid", "1:10"),
         ("flags", "add", "\\Flagged $Important", "mailbox", "INBOX", "uid", "2,4,6"),
         ("flags", "remove", "\\Seen", "mailbox", "INBOX", "uid", "3"),
         ("flags", "replace", "\\Answered \\Seen", "mailbox", "Lists", "uid", "1:3"))
    assert "$Important" in steps["mount"][-1][1][0]

    step("copy",
         ("mailbox", "create", "Archive"),
         ("copy", "Archive", "mailbox", "INBOX", "uid", "1:6"))
    # COPY made hard links: the INBOX and Archive names share an inode.
    for user in USERS:
        md = dv.base / user / "Maildir"

        def files(folder):
            return {n.split(":2,")[0]: os.stat(folder / sub / n)
                    for sub in ("cur", "new") for n in os.listdir(folder / sub)}

        inbox, archive = files(md), files(md / ".Archive")
        assert len(archive) == 6
        for n, st in archive.items():
            twin = inbox[n]
            assert (st.st_ino, st.st_nlink) == (twin.st_ino, 2), user

    step("expunge",
         ("expunge", "mailbox", "INBOX", "uid", "2:4"),
         ("expunge", "mailbox", "Lists", "uid", "8"))
    assert steps["mount"][-1][1][0].count("mailbox: INBOX") == 13

    step("folders",
         ("mailbox", "create", "Work", "Work/Sub"),
         ("copy", "Work/Sub", "mailbox", "Lists", "uid", "1:4"),
         ("move", "Work", "mailbox", "INBOX", "uid", "12:14"),
         ("mailbox", "rename", "Work", "Projects"),
         ("mailbox", "create", "Trash"),
         ("mailbox", "delete", "Trash"))
    boxes = steps["mount"][-1][1][2]
    assert boxes == sorted(["INBOX", "Lists", "Archive", "Projects", "Projects/Sub"])
    assert (dv.base / "mount" / "Maildir" / ".Projects.Sub" / "cur").is_dir()
    assert not (dv.base / "mount" / "Maildir" / ".Work").exists()

    step("delete folder with mail",
         ("mailbox", "delete", "-r", "Projects"))

    # Parallel deliveries into one mailbox: dovecot-lda processes take the
    # dovecot-uidlist.lock dotlock (O_EXCL create, rename over) in turn.
    def parallel_lda(user):
        def one(k):
            for i, data in enumerate(msgs[k::4]):
                dv.deliver(user, data, "Parallel")
        threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # One record per message, separated by form feeds; the UIDs
        # depend on who got the lock first, so they are compared as a set.
        out = dv.doveadm(user, "fetch", "uid text", "mailbox", "Parallel", "all")
        records = [r.lstrip("\n") for r in out.split("\f")]
        uids = sorted(r.split("\n", 1)[0] for r in records if r)
        texts = sorted(r.split("\n", 1)[1] for r in records if r)
        return uids, texts

    got, want = parallel_lda("mount"), parallel_lda("native")
    assert got == want
    assert got[0] == sorted(f"uid: {i}" for i in range(1, len(msgs) + 1))

    # Dovecot's index and uidlist on the mount survive a remount.
    before = state(dv, "mount")
    dv.mount.remount()
    os.chmod(dv.mount.mnt, 0o755)
    assert state(dv, "mount") == before
