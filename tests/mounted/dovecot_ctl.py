"""Run the real Dovecot 2.3 (Debian's dovecot-core) on a private mdbox store.

A `Dovecot` owns a temporary directory holding its own dovecot.conf, run
and state directories, log and the mdbox root (mail_location = mdbox:DIR),
served to one static user (root's name, the `mail` uid/gid) with no
listeners (`protocols =`).  Tests use it through doveadm:

    with dovecot_instance(zlib_save="gz") as dc:
        dc.save("INBOX", b"From: ...")
        dc.fetch("mailbox guid text", "mailbox", "*", "all")

It is always stopped (`doveadm stop`, then a kill of the master pid) and
its directory removed when the with-block ends, also on failure.
"""
import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"
DOVEADM = shutil.which("doveadm") or "/usr/bin/doveadm"
USER = "root"  # the doveadm -u user; static userdb maps it to uid mail

CONF = """\
protocols =
ssl = no
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
mail_location = mdbox:{mdbox}
mail_uid = mail
mail_gid = mail
first_valid_uid = 1
{plugins}
namespace inbox {{
  inbox = yes
  separator = /
}}
userdb {{
  driver = static
  args = uid=mail gid=mail home={root}/home
}}
passdb {{
  driver = static
  args = nopassword=y
}}
"""


def need_dovecot():
    if not (os.access(DOVECOT, os.X_OK) and os.access(DOVEADM, os.X_OK)):
        pytest.skip("Dovecot (dovecot-core) is not installed")


class Dovecot:
    def __init__(self, zlib_save=None, zlib=True):
        need_dovecot()
        # Not under pytest's tmp_path: that is 0700 root, and Dovecot
        # reaches the store as the mail user.
        self.root = Path(tempfile.mkdtemp(prefix="dboxfs-dovecot-"))
        os.chmod(self.root, 0o755)
        self.mdbox = self.root / "mdbox"
        self.conf = self.root / "dovecot.conf"
        plugins = ""
        if zlib or zlib_save:
            plugins = "mail_plugins = zlib\n"
            if zlib_save:
                plugins += "plugin {\n  zlib_save = %s\n}\n" % zlib_save
        self.conf.write_text(CONF.format(root=self.root, mdbox=self.mdbox,
                                         plugins=plugins))
        for d in ("mdbox", "home"):
            (self.root / d).mkdir()
        self.started = False

    def chown_store(self):
        """Give the mdbox to the mail user (after copying files in)."""
        pw = pwd.getpwnam("mail")
        for dirpath, dirs, files in os.walk(self.root / "mdbox"):
            os.chown(dirpath, pw.pw_uid, pw.pw_gid)
            for n in files:
                os.chown(os.path.join(dirpath, n), pw.pw_uid, pw.pw_gid)
        os.chown(self.root / "home", pw.pw_uid, pw.pw_gid)

    def start(self):
        self.chown_store()
        subprocess.run([DOVECOT, "-c", str(self.conf)], check=True, timeout=30)
        self.started = True
        return self

    def doveadm(self, *args, input=None, fmt=None):
        cmd = [DOVEADM, "-c", str(self.conf)]
        if fmt:
            cmd += ["-f", fmt]
        r = subprocess.run(cmd + list(args), input=input, capture_output=True,
                           timeout=120)
        assert r.returncode == 0, (args, r.returncode, r.stderr.decode(errors="replace"),
                                   self.log())
        return r.stdout

    def save(self, mailbox, data):
        """doveadm save into mailbox, created when missing."""
        if mailbox not in getattr(self, "_mailboxes", set()):
            r = subprocess.run([DOVEADM, "-c", str(self.conf), "mailbox", "create",
                                "-u", USER, mailbox], capture_output=True, timeout=60)
            assert r.returncode == 0 or b"already exists" in r.stderr, r.stderr
            self._mailboxes = getattr(self, "_mailboxes", set()) | {mailbox}
        self.doveadm("save", "-u", USER, "-m", mailbox, input=data)

    def force_resync(self):
        # A resync of a mailbox that does not exist does nothing: create
        # INBOX, then resync every mailbox (rebuilding storage/ restores
        # each message into the mailbox its B metadata names).
        self.doveadm("mailbox", "create", "-u", USER, "INBOX")
        self.doveadm("force-resync", "-u", USER, "*")

    def fetch(self, fields, *query):
        """doveadm fetch in the pager format, as a list of {field: bytes}.
        `text` (raw message bytes) must be the last field if asked.  The
        pager separates messages with a form feed only when there are two
        fields or more."""
        assert len(fields.split()) >= 2, fields
        out = self.doveadm("fetch", "-u", USER, fields, *query, fmt="pager")
        names = fields.split()
        result = []
        if not out:
            return result
        for chunk in out.split(b"\x0c\n"):
            msg = {}
            rest = chunk
            for name in names:
                key = name.encode() + b":"
                assert rest.startswith(key), (name, rest[:200])
                rest = rest[len(key):]
                if name == "text":
                    assert rest.startswith(b"\n")
                    msg[name] = rest[1:]
                    rest = b""
                    break
                line, _, rest = rest.partition(b"\n")
                msg[name] = line.strip()
            result.append(msg)
        return result

    def log(self):
        try:
            return (self.root / "dovecot.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self):
        if self.started:
            subprocess.run([DOVEADM, "-c", str(self.conf), "stop"],
                           capture_output=True, timeout=30)
            pidfile = self.root / "run" / "master.pid"
            for _ in range(100):
                if not pidfile.exists():
                    break
                time.sleep(0.05)
            else:
                try:
                    os.kill(int(pidfile.read_text()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
            self.started = False

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def dovecot_instance(**kwargs):
    dc = Dovecot(**kwargs)
    try:
        yield dc.start()
    finally:
        dc.cleanup()
