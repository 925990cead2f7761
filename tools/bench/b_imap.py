"""Dovecot APPEND over IMAP on 127.0.0.1: one Dovecot with
mail_location=maildir: on the mount, one on a native directory, each
driven by a persistent-connection imaplib client that APPENDs corpus
messages to INBOX for a fixed time.  Dovecot keeps its defaults
(fsync_mode optimized: it fsyncs each saved mail; its index files sit in
the maildir, so on the mount they are dboxfs plain files)."""
import imaplib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from benchlib import Row, log, sides

CONF = """\
base_dir = {base}/run
state_dir = {base}/state
log_path = {base}/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain
protocols = imap
listen = 127.0.0.1
first_valid_uid = 1
first_valid_gid = 1
mail_location = maildir:{maildir}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
}}
passdb {{
  driver = static
  args = nopassword=y
}}
userdb {{
  driver = static
  args = uid=mail gid=mail home={home}
}}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dovecot:
    """A private Dovecot (config, sockets, log in base) serving maildir."""

    def __init__(self, base, maildir):
        self.base, self.maildir = Path(base), Path(maildir)
        self.port = free_port()
        self.proc = None

    def __enter__(self):
        if self.base.exists():
            shutil.rmtree(self.base)
        for d in ("run", "state", "home"):
            (self.base / d).mkdir(parents=True)
        shutil.chown(self.base / "home", "mail", "mail")
        subs = [str(self.maildir / sub) for sub in ("cur", "new", "tmp")]
        try:
            for sub in subs:
                os.makedirs(sub, exist_ok=True)
            subprocess.run(["chown", "-R", "mail:mail", str(self.maildir)], check=True)
        except PermissionError:
            # A mount of mail's own: only mail gets in.
            subprocess.run(["runuser", "-u", "mail", "--", "mkdir", "-p", *subs], check=True)
        self.conf = self.base / "dovecot.conf"
        self.conf.write_text(CONF.format(base=self.base, maildir=self.maildir,
                                         port=self.port, home=self.base / "home"))
        self.proc = subprocess.Popen(["dovecot", "-F", "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"dovecot did not start: {self.log()}")

    def log(self):
        p = self.base / "dovecot.log"
        return p.read_text()[-2000:] if p.exists() else ""

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def append_rate(port, msgs, seconds):
    """APPENDs per second to INBOX over one connection for `seconds`."""
    imap = imaplib.IMAP4("127.0.0.1", port)
    imap.login("bench", "x")
    n = 0
    t0 = time.monotonic()
    end = t0 + seconds
    while time.monotonic() < end:
        typ, data = imap.append("INBOX", None, None, msgs[n % len(msgs)])
        if typ != "OK":
            raise RuntimeError(f"APPEND failed: {data}")
        n += 1
    elapsed = time.monotonic() - t0
    typ, data = imap.select("INBOX")
    count = int(data[0])
    imap.logout()
    return n / elapsed, n, count


def run(ctx):
    if shutil.which("dovecot") is None:
        from benchlib import skipped
        return [skipped("Dovecot APPEND over the mount", "dovecot not installed")]
    seconds = ctx.n("imap_seconds")
    row = Row("Dovecot APPEND over the mount", "rate", "msg/s", (">=", 1.0, False),
              f"{seconds} s per run, one connection; the store mounted by user mail "
              "for itself", floor_target=(">=", 0.9))
    os.chmod(ctx.floor_mnt, 0o755)
    for r in range(ctx.repeats):
        def side(root, label):
            maildir = Path(root) / f"imap-{r}"
            with Dovecot(Path(ctx.tmp) / f"dovecot-{label}", maildir) as dc:
                rate, n, count = append_rate(dc.port, ctx.messages, seconds)
            if count != n:
                raise RuntimeError(f"{label}: appended {n}, INBOX has {count}")
            return rate
        def floor_side():  # afresh: a descriptor per inode it has seen
            ctx.work_floor.unmount()
            ctx.work_floor.mount()
            os.chmod(ctx.floor_mnt, 0o755)
            return side(ctx.floor_mnt, "floor")
        dbx, nat, flo = sides(r, [lambda: side(ctx.imap_mnt, "dboxfs"),
                                  lambda: side(ctx.native_root, "native"),
                                  lambda: floor_side()])
        row.add(dbx, nat, flo)
        log(f"{row.name}: dboxfs {dbx:.0f}/s native {nat:.0f}/s floor {flo:.0f}/s")
    return [row]
