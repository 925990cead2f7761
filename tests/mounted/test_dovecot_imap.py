"""Dovecot imap (dovecot-imapd) serving `maildir:` on the mount to several
IMAP sessions at once on one mailbox, with Dovecot's default settings
(mmap_disable = no: every imap process mmap()s dovecot.index.log and
dovecot.index, fcntl-locks them and appends to the log), and the same load
on a native maildir in the same test as the reference (issue 11).

Each session is a real imap process (`doveadm exec imap`, preauthenticated,
IMAP on its stdin/stdout, as imap-login hands a client over), driven by
Python's imaplib.  Sessions APPEND, STORE flags, EXPUNGE, FETCH (bodies
byte-exact), LIST, STATUS and reSELECT in a seeded random order; a session
stores and expunges only messages it appended itself, so the final
mailbox is known in advance: every appended, non-expunged message with
the flags its session left on it.

The mount runs with -o writeback_cache, which dboxfs(1) advises for
Dovecot: its index readers take no lock, and without it a reader's fstat
can, for a moment, return a size the kernel has not taken in yet, so a
mapping of that size may fault (SIGBUS) past its last page (dboxfs(1),
NOTES; the kernel hands the caller the size of a GETATTR reply it
discards as older than a write in flight).  These tests ran without it
too until 2026-12-02, when repeated runs measured that race: ten
sessions on a mount without writeback_cache lost an imap process to
SIGBUS, or Dovecot found its index corrupted, in 2 of 28 runs under
AddressSanitizer (on the code of 2026-12-01 as well), never with it.

Right outcome, as on ext4: no Error/Fatal/Panic line in Dovecot's log (no
"Corrupted transaction log file", no index rebuilt), no imap process
killed (SIGBUS from a mapping cut short), every FETCH of a live message
byte-exact, and the final mailbox exactly as expected - on both.
"""
import imaplib
import os
import pwd
import random
import re
import subprocess
import threading

import pytest

import conftest
import test_dovecot_maildir as dovecot_maildir
from conftest import DBOXADM, Mount
from maildir_tools import need
from sysenv import mount_options, system_settings

# The fixtures that start Dovecot over a mount and a native maildir
# (users "mount" and "native") come from test_dovecot_maildir.
dovecot_base = dovecot_maildir.dovecot_base
dovecot = dovecot_maildir.dovecot

IMAP = "/usr/lib/dovecot/imap"
WRITEBACK = ["-o", "writeback_cache"]  # as dboxfs(1) advises for Dovecot
SESSIONS = 10
OPS = 150
LOG_PROBLEM = re.compile(r": (Error|Fatal|Panic|Warning): |Corrupted|rebuil",
                         re.IGNORECASE)


class Session(imaplib.IMAP4_stream):
    """One preauthenticated imap process; its stderr goes to errfile."""

    def __init__(self, command, errfile):
        self.errfile = errfile
        super().__init__(command)

    def open(self, host=None, port=None, timeout=None):
        self.host = self.port = self.sock = self.file = None
        self.process = subprocess.Popen(
            self.command, bufsize=imaplib.DEFAULT_BUFFER_SIZE, shell=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errfile,
            close_fds=True)
        self.writefile = self.process.stdin
        self.readfile = self.process.stdout


def flags_of(header):
    m = re.search(rb"FLAGS \(([^)]*)\)", header)
    return frozenset(f for f in m.group(1).decode().split() if f != "\\Recent")


def fetch_bodies(s, uids):
    """{uid: (body, flags)} of UID FETCH uids (FLAGS BODY.PEEK[])."""
    typ, data = s.uid("FETCH", uids, "(FLAGS BODY.PEEK[])")
    assert typ == "OK", data
    got = {}
    for item in data:
        if isinstance(item, tuple) and b"BODY[]" in item[0]:
            uid = int(re.search(rb"UID (\d+)", item[0]).group(1))
            got[uid] = (item[1], flags_of(item[0]))
    return got


def client(dv, user, k, errfile, problems):
    """Session k: OPS operations; returns {message-id: (body, flags)} of
    the messages it appended and did not expunge."""
    rnd = random.Random(k)
    s = Session(f"doveadm -c {dv.conf} exec imap -u {user}", errfile)
    live = {}  # uid -> [message-id, body, flags]
    try:
        typ, data = s.select("INBOX")
        assert typ == "OK", data
        for n in range(OPS):
            op = rnd.choice(["append"] * 4 + ["store"] * 3 + ["expunge"] * 2 +
                            ["fetch"] * 3 + ["fetchall", "list", "status",
                                             "reselect", "noop"])
            if op in ("store", "expunge", "fetch") and not live:
                op = "append"
            if op == "append":
                mid = f"<{k}.{n}@dboxfs.test>"
                text = "".join(f"line {i} of message {k}.{n} {'x' * rnd.randint(0, 70)}\r\n"
                               for i in range(rnd.randint(1, 120)))
                body = (f"From: s{k}@example.org\r\nTo: team@example.org\r\n"
                        f"Message-ID: {mid}\r\nSubject: session {k} message {n}\r\n"
                        f"\r\n{text}").encode()
                typ, data = s.append("INBOX", None, None, body)
                assert typ == "OK", data
                uid = int(re.search(rb"APPENDUID \d+ (\d+)", data[0]).group(1))
                live[uid] = [mid, body, frozenset()]
            elif op == "store":
                uid = rnd.choice(sorted(live))
                flag = rnd.choice(["\\Seen", "\\Flagged", "\\Answered", "$Work"])
                add = rnd.random() < 0.6
                typ, data = s.uid("STORE", str(uid), "+FLAGS" if add else "-FLAGS",
                                  f"({flag})")
                assert typ == "OK", data
                flags = live[uid][2]
                live[uid][2] = flags | {flag} if add else flags - {flag}
            elif op == "expunge":
                uid = rnd.choice(sorted(live))
                del live[uid]
                typ, data = s.uid("STORE", str(uid), "+FLAGS.SILENT", "(\\Deleted)")
                assert typ == "OK", data
                typ, data = s.uid("EXPUNGE", str(uid))
                assert typ == "OK", data
            elif op == "fetch":
                uid = rnd.choice(sorted(live))
                got = fetch_bodies(s, str(uid))
                assert got == {uid: (live[uid][1], live[uid][2])}, (k, n, uid)
            elif op == "fetchall":
                typ, data = s.uid("FETCH", "1:*", "(FLAGS RFC822.SIZE INTERNALDATE)")
                assert typ == "OK", data
            elif op == "list":
                typ, data = s.list()
                assert typ == "OK", data
            elif op == "status":
                typ, data = s.status("INBOX", "(MESSAGES UIDNEXT UNSEEN)")
                assert typ == "OK", data
            elif op == "reselect":
                assert s.unselect()[0] == "OK"
                assert s.select("INBOX")[0] == "OK"
            else:
                assert s.noop()[0] == "OK"
        s.logout()
    except Exception as e:  # reported with the session and step
        problems.append((user, k, repr(e)[:500]))
        s.shutdown()  # EOF on its stdin: the imap process ends
    finally:
        rc = s.process.wait(timeout=60)
        if rc != 0:
            problems.append((user, k, f"imap process exited with {rc}"))
    return {mid: (body, flags) for mid, body, flags in live.values()}


def run_load(dv, user, tmp_path):
    """SESSIONS sessions at once; returns (expected, problems)."""
    problems, results = [], [None] * SESSIONS
    errfile = open(tmp_path / f"imap-{user}.stderr", "wb")

    def one(k):
        results[k] = client(dv, user, k, errfile, problems)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(SESSIONS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errfile.close()
    expected = {}
    for r in results:
        expected.update(r or {})
    return expected, problems


def final_mailbox(dv, user, tmp_path):
    """{message-id: (body, flags)} of every message in INBOX, fetched by a
    new session."""
    with open(tmp_path / f"imap-{user}-final.stderr", "wb") as errfile:
        s = Session(f"doveadm -c {dv.conf} exec imap -u {user}", errfile)
        assert s.select("INBOX")[0] == "OK"
        got = fetch_bodies(s, "1:*")
        s.logout()
        s.process.wait(timeout=60)
    return {re.search(rb"Message-ID: (<[^>]+>)", body).group(1).decode(): (body, flags)
            for body, flags in got.values()}


def imap_stderr(tmp_path, user):
    """What run_load's imap processes logged (to their stderr) beyond
    Info lines."""
    path = tmp_path / f"imap-{user}.stderr"
    return [line for line in path.read_text(errors="replace").splitlines()
            if line and (": Info: " not in line or LOG_PROBLEM.search(line))]


def log_problems(dv):
    path = dv.base / "dovecot.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    return [line for line in text.splitlines() if LOG_PROBLEM.search(line)]


def test_imap_sessions_share_one_mailbox(dovecot, tmp_path):
    need(IMAP)
    dv = dovecot
    dv.mount.options += WRITEBACK
    dv.mount.remount()
    os.chmod(dv.mount.mnt, 0o755)
    outcome = {}
    for user in ("mount", "native"):
        expected, problems = run_load(dv, user, tmp_path)
        final = final_mailbox(dv, user, tmp_path)
        outcome[user] = {
            "problems": problems,
            "stderr": imap_stderr(tmp_path, user),
            "missing or different": sorted(m for m in expected
                                           if final.get(m) != expected[m]),
            "unexpected": sorted(set(final) - set(expected)),
            "count": len(final),
        }
    outcome["log"] = log_problems(dv)
    assert outcome["native"]["count"] > SESSIONS  # the load did something
    assert outcome["log"] == [], outcome["log"][:20]
    for user in ("native", "mount"):
        # The imap processes' own log (their stderr) says what went wrong.
        assert outcome[user]["problems"] == [], \
            (user, outcome[user]["problems"], outcome[user]["stderr"][:20])
        assert outcome[user]["stderr"] == [], (user, outcome[user]["stderr"][:20])
        assert outcome[user]["missing or different"] == [], user
        assert outcome[user]["unexpected"] == [], user
    assert outcome["mount"]["count"] == outcome["native"]["count"]
    # The mailbox on the mount is what Dovecot wrote, also after a remount.
    before = final_mailbox(dv, "mount", tmp_path)
    dv.mount.remount()
    os.chmod(dv.mount.mnt, 0o755)
    assert final_mailbox(dv, "mount", tmp_path) == before
    assert log_problems(dv) == []


def test_imap_sessions_during_purge_and_altmove(dovecot, tmp_path):
    """The same IMAP load on the mount while the store is purged and
    altmoved online again and again (small m.N files, so both find work):
    Dovecot logs no problem, every FETCH is byte-exact, the final mailbox
    is exactly what the sessions left, also after a remount, and check
    finds the store clean."""
    need(IMAP)
    dv = dovecot
    alt = dv.base / "alt"
    alt.mkdir()
    dv.mount.options += WRITEBACK + ["-o", f"rotate_size=65536,alt={alt}"]
    dv.mount.remount()
    os.chmod(dv.mount.mnt, 0o755)
    stop = threading.Event()
    admin = []

    def churn():
        n = 0
        while not stop.is_set():
            verb = ["purge"] if n % 2 == 0 else ["altmove", "--older-than", "0"]
            r = subprocess.run([str(DBOXADM), *verb, str(dv.mount.store)],
                               capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                admin.append((verb, r.returncode, r.stderr[-500:]))
            n += 1
        admin.append(("runs", n))

    t = threading.Thread(target=churn)
    t.start()
    try:
        expected, problems = run_load(dv, "mount", tmp_path)
    finally:
        stop.set()
        t.join()
    final = final_mailbox(dv, "mount", tmp_path)
    assert [a for a in admin if a[0] != "runs"] == [], \
        (admin, dv.mount.log_text()[-3000:])
    assert problems == [], problems
    assert log_problems(dv) == [], log_problems(dv)[:20]
    assert sorted(m for m in expected if final.get(m) != expected[m]) == []
    assert sorted(set(final) - set(expected)) == []
    dv.mount.remount()
    os.chmod(dv.mount.mnt, 0o755)
    assert final_mailbox(dv, "mount", tmp_path) == final
    assert log_problems(dv) == []
    dv.mount.unmount()
    r = subprocess.run([str(DBOXADM), "check", str(dv.mount.store)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_imap_sessions_on_the_mail_users_own_mount(dovecot, tmp_path):
    """The store mounted by Dovecot's mail user itself (`mail`), without
    allow_other and with writeback_cache, as docs/dovecot.md advises:
    Dovecot's processes, which run as that user, get in.  The same load
    as above: no problem in Dovecot's log, every FETCH byte-exact, the
    final mailbox exactly what the sessions left, also after a remount;
    root cannot look in."""
    need(IMAP)
    dv = dovecot
    dv.mount.unmount()
    mail = pwd.getpwnam("mail")
    subprocess.run(["chown", "-R", f"{mail.pw_uid}:{mail.pw_gid}", str(dv.mount.store)],
                   check=True)
    os.chown(dv.mount.mnt, mail.pw_uid, mail.pw_gid)  # fusermount3 wants it writable
    own = Mount(dv.mount.store, dv.mount.mnt, WRITEBACK, user="mail")
    conftest._all_mounts.append(own)
    try:
        with system_settings() as settings:
            settings.users_may_mount()
            own.mount()
        opts = mount_options("/proc/mounts", own.mnt)[1]
        assert "allow_other" not in opts, opts
        with pytest.raises(PermissionError):
            os.listdir(own.mnt)
        expected, problems = run_load(dv, "mount", tmp_path)
        final = final_mailbox(dv, "mount", tmp_path)
        assert problems == [], (problems, imap_stderr(tmp_path, "mount")[:20])
        assert log_problems(dv) == [], log_problems(dv)[:20]
        assert imap_stderr(tmp_path, "mount") == []
        assert len(expected) > SESSIONS  # the load did something
        assert sorted(m for m in expected if final.get(m) != expected[m]) == []
        assert sorted(set(final) - set(expected)) == []
        with system_settings() as settings:
            settings.users_may_mount()
            own.remount()
        assert final_mailbox(dv, "mount", tmp_path) == final
        assert log_problems(dv) == []
    finally:
        own.unmount()
    r = subprocess.run([str(DBOXADM), "check", str(dv.mount.store)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
