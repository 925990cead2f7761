"""A real Dovecot (Debian's dovecot-core) on an mdbox root, for tests.

doveadm runs in direct mode: no Dovecot server, no sockets, nothing left
running; a dovecot.conf in a temp dir points mail_location at the root,
with '/' as the namespace separator and the owner of the root (user mail)
as mail_uid, so doveadm drops to it.  The zlib plugin is loaded, so
compressed mail reads as Dovecot wrote it.
"""
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

DOVEADM = shutil.which("doveadm") or "/usr/bin/doveadm"


def need_dovecot():
    if not Path(DOVEADM).exists():
        pytest.skip("Dovecot (doveadm) is not installed")


@pytest.fixture
def dovecot_tmp():
    """A temp dir user mail can reach (pytest's tmp_path is under a 0700
    directory): Dovecot drops to mail_uid before touching the root.
    Removed in teardown."""
    need_dovecot()
    d = Path(tempfile.mkdtemp(prefix="dboxfs-dovecot-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Mdbox:
    """Dovecot on the mdbox root `root` (created, owned by user mail)."""

    def __init__(self, root, confdir, location=None, extra=""):
        need_dovecot()
        self.root = Path(root)
        self.confdir = Path(confdir)
        self.confdir.mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        mail = pwd.getpwnam("mail")
        self.uid, self.gid = mail.pw_uid, mail.pw_gid
        self.conf = self.confdir / "dovecot.conf"
        self.conf.write_text(
            f"mail_location = {location or 'mdbox:' + str(self.root)}\n"
            f"base_dir = {self.confdir}\n"
            f"state_dir = {self.confdir}\n"
            "log_path = /dev/stderr\n"
            "protocols =\n"
            "ssl = no\n"
            f"mail_uid = {self.uid}\nmail_gid = {self.gid}\n"
            f"first_valid_uid = {self.uid}\nfirst_valid_gid = {self.gid}\n"
            "mail_plugins = zlib\n"
            "namespace inbox {\n  inbox = yes\n  separator = /\n}\n" + extra)
        os.chmod(self.confdir, 0o755)
        self.chown()

    def chown(self):
        for d, dirs, files in os.walk(self.root):
            for n in [d, *(os.path.join(d, f) for f in files)]:
                os.lchown(n, self.uid, self.gid)

    def doveadm(self, *args, check=True, input=None):
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "USER": "test",
               "HOME": str(self.confdir)}
        r = subprocess.run([DOVEADM, "-c", str(self.conf), *map(str, args)],
                           capture_output=True, env=env, input=input, timeout=120)
        if check:
            assert r.returncode == 0, (args, r.stdout[-2000:], r.stderr[-2000:])
        return r

    def tab(self, *args):
        """Rows of `doveadm -f tab ARGS` as dicts (the last column may hold
        tabs)."""
        out = self.doveadm("-f", "tab", *args).stdout.decode()
        lines = out.split("\n")
        head = lines[0].split("\t")
        return [dict(zip(head, line.split("\t", len(head) - 1)))
                for line in lines[1:] if line]

    def save(self, mailbox, data):
        self.doveadm("save", "-m", mailbox, input=data)

    def messages(self):
        """Every message Dovecot has: dicts of mailbox, uid, guid, flags,
        received, size, vsize."""
        rows = self.tab("fetch", "uid guid flags date.received.unixtime "
                        "size.physical size.virtual mailbox", "mailbox", "*", "all")
        return [{"mailbox": r["mailbox"], "uid": int(r["uid"]), "guid": r["guid"],
                 "flags": r["flags"].split(), "received": int(r["date.received.unixtime"]),
                 "size": int(r["size.physical"]), "vsize": int(r["size.virtual"])}
                for r in rows]

    def text(self, mailbox, uid):
        """The message as Dovecot reads it (`doveadm fetch text`)."""
        out = self.doveadm("fetch", "text", "mailbox", mailbox, "uid", str(uid)).stdout
        assert out.startswith(b"text:\n"), out[:40]
        return out[len(b"text:\n"):]


def maildir_folder(mailbox):
    """The Maildir++ dir (relative to the mount) of an ASCII mailbox name
    without '.' or '&' (the tests encode the others by hand)."""
    return "" if mailbox == "INBOX" else "." + mailbox.replace("/", ".")


SYSTEM_LETTERS = {"\\Draft": "D", "\\Flagged": "F", "\\Answered": "R",
                  "\\Seen": "S", "\\Deleted": "T"}


def read_keywords(folder):
    """index -> name from a folder's dovecot-keywords ({} when absent)."""
    p = Path(folder) / "dovecot-keywords"
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        idx, name = line.split(" ", 1)
        out[int(idx)] = name
    return out


def flags_of_name(name, keywords):
    """IMAP flags (system flags and keywords) a maildir name carries."""
    if ":2," not in name:
        return set()
    info = name.rsplit(":2,", 1)[1]
    back = {v: k for k, v in SYSTEM_LETTERS.items()}
    flags = set()
    for c in info:
        if c in back:
            flags.add(back[c])
        elif "a" <= c <= "z":
            flags.add(keywords[ord(c) - ord("a")])
        else:
            raise AssertionError(f"unexpected info letter {c!r} in {name}")
    return flags
