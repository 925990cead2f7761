"""dboxadm import-dovecot: a Dovecot mdbox store adopted in place.

Truth is what Dovecot says: the fixtures' expected-fetch.txt (doveadm fetch
taken when they were made) and, for stores made here with doveadm, doveadm
fetch itself.  After the import the mount must show every message Dovecot
lists - in the Maildir++ folder of its mailbox, with its flags and keywords
in the name, its received date as mtime, its size, its bytes (as
`doveadm fetch text` reads them) - copies as one inode with st_nlink =
refcount, and nothing Dovecot expunged.  The m.N files are hard links of
Dovecot's (no byte copied).  A Dovecot reading the mount as maildir sees
the same UIDs, flags and keywords.
"""
import base64
import fcntl
import os
import pwd
import re
import shutil
import sqlite3
import subprocess
import termios
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from conftest import DBOXADM, SHARED, need_corpora
from dovecot_mdbox import (Mdbox, dovecot_tmp, flags_of_name, need_dovecot,  # noqa: F401
                           read_keywords)

FIXTURES = SHARED / "fixtures" / "dovecot-mdbox"
# Every fixture's codec is read by dboxfs: all bodies are compared.
READABLE = {"plain", "zlib-gz", "zlib-bz2", "zlib-zstd", "zlib-lz4"}


def adm(*args, check_rc=None):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True, timeout=300)
    if check_rc is not None:
        assert r.returncode == check_rc, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return r


def mutf7(name):
    """Maildir++ encoding of one UTF-8 mailbox name component: modified
    UTF-7 (RFC 3501 5.1.3) with '.' encoded as well."""
    out, run = [], []

    def flush():
        if run:
            b = base64.b64encode("".join(run).encode("utf-16-be")).rstrip(b"=")
            out.append("&" + b.decode().replace("/", ",") + "-")
            run.clear()

    for ch in name:
        if ch == "&":
            flush()
            out.append("&-")
        elif 0x20 <= ord(ch) <= 0x7E and ch != ".":
            flush()
            out.append(ch)
        else:
            run.append(ch)
    flush()
    return "".join(out)


def folder_dir(mailbox):
    return "" if mailbox == "INBOX" else "." + ".".join(mutf7(c) for c in mailbox.split("/"))


def parse_expected(path):
    rows = []
    # doveadm's pager format: a form feed line between messages.
    for block in re.split(r"\n\f?\n", path.read_text().strip()):
        kv = dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "")
                  for line in block.splitlines())
        rows.append({"mailbox": kv["mailbox"], "uid": int(kv["uid"]), "guid": kv["guid"],
                     "flags": kv["flags"].split(),
                     "received": int(kv["date.received.unixtime"]),
                     "size": int(kv["size.physical"]), "vsize": int(kv["size.virtual"])})
    return rows


def find_name(folder, uid):
    """(subdir, name) of the adopted message with this UID in folder."""
    hits = [(sub, n) for sub in ("new", "cur") for n in os.listdir(folder / sub)
            if re.search(rf"\.V\d+U{uid}\.dovecot-import,", n)]
    assert len(hits) == 1, (folder, uid, hits)
    return hits[0]


def index_guids(store):
    db = sqlite3.connect(f"file:{store / 'index.sqlite'}?mode=ro", uri=True)
    try:
        return {g for (g,) in db.execute("SELECT guid FROM message")}
    finally:
        db.close()


def storage_guids(store, mfile):
    r = adm("dump", store, mfile, check_rc=0)
    return {line.split("\t")[2] for line in r.stdout.decode().splitlines()[1:]}


def check_adopted(mnt, truth, text_of, codec_ok=True):
    """The mount shows exactly the messages of truth (doveadm fetch rows).
    Returns the number of bodies not compared (codec not readable)."""
    by_guid = Counter(t["guid"] for t in truth)
    ino_of_guid = {}
    skipped = 0
    for t in truth:
        folder = mnt / folder_dir(t["mailbox"])
        sub, name = find_name(folder, t["uid"])
        imap_flags = set(t["flags"]) - {"\\Recent"}
        # Untouched new mail stays in new/ (no info); the rest is in cur/.
        assert sub == ("new" if set(t["flags"]) == {"\\Recent"} else "cur"), (t, name)
        assert flags_of_name(name, read_keywords(folder)) == imap_flags, (t, name)
        assert f",S={t['size']},W={t['vsize']}" in name
        st = os.stat(folder / sub / name)
        assert st.st_size == t["size"], (t, st.st_size)
        assert st.st_mtime_ns == t["received"] * 10**9, t
        assert st.st_nlink == by_guid[t["guid"]], (t, st.st_nlink)
        assert ino_of_guid.setdefault(t["guid"], st.st_ino) == st.st_ino, t
        try:
            data = (folder / sub / name).read_bytes()
        except OSError as e:
            if codec_ok:
                raise
            assert e.errno == 5, e  # EIO: codec not readable here yet
            skipped += 1
            continue
        assert data == text_of(t), t
    # Nothing else: every name in cur/ and new/ is one of truth's.
    names = Counter()
    for d, dirs, files in os.walk(mnt):
        if os.path.basename(d) in ("cur", "new"):
            names[os.path.relpath(os.path.dirname(d), mnt)] += len(files)
    want = Counter(folder_dir(t["mailbox"]) or "." for t in truth)
    assert names == want
    return skipped


def fixture_names():
    if not FIXTURES.is_dir():
        return ["(no fixtures)"]
    return sorted(p.name for p in FIXTURES.iterdir() if (p / "mdbox").is_dir())


@pytest.mark.parametrize("fixture", fixture_names())
def test_adopt_fixture(fixture, dovecot_tmp, make_mount):
    """A store Dovecot wrote (fixtures), against its doveadm fetch truth."""
    tmp_path = dovecot_tmp
    if not (FIXTURES / fixture / "mdbox").is_dir():
        pytest.skip("../shared/fixtures/dovecot-mdbox not present")
    root, store = tmp_path / "mdbox", tmp_path / "store"
    copy_fixture(fixture, root)
    dv = Mdbox(root, tmp_path / "dovecot")
    truth = parse_expected(FIXTURES / fixture / "expected-fetch.txt")
    texts = {(t["mailbox"], t["uid"]): dv.text(t["mailbox"], t["uid"]) for t in truth}
    dovecot_guids = storage_guids_in_root(root)

    r = adm("import-dovecot", store, root, check_rc=0)
    assert b"adopted 8 messages" in r.stdout, r.stdout
    # Hard links, not copies: the same inode as Dovecot's m.1.
    ours, theirs = os.stat(store / "storage" / "m.1"), os.stat(root / "storage" / "m.1")
    assert (ours.st_ino, ours.st_dev) == (theirs.st_ino, theirs.st_dev)
    assert ours.st_nlink == 2
    # The expunged (refcount 0) message is in m.1 but not adopted.
    expunged = dovecot_guids - {t["guid"] for t in truth}
    assert len(expunged) == 1
    assert not expunged & index_guids(store)
    assert storage_guids(store, "m.1") == dovecot_guids

    m = make_mount(store=store, mnt=tmp_path / "mnt")
    skipped = check_adopted(m.mnt, truth, lambda t: texts[(t["mailbox"], t["uid"])],
                            codec_ok=fixture in READABLE)
    assert read_keywords(m.mnt) == {0: "$Label1", 1: "Work"}
    assert (m.mnt / ".Lists" / "maildirfolder").exists()
    if skipped:
        pytest.xfail(f"{skipped} {fixture} bodies: codec not readable on this branch")


def dbox_records(path):
    """Metadata (key letter -> value) of every record of an m.N file, read
    by the dbox v2 layout (docs/dbox-format.md sections 2-6)."""
    data = path.read_bytes()
    pos = data.index(b"\n") + 1
    out = []
    while pos < len(data):
        hdr = data[pos:pos + 30]
        assert hdr[:2] == b"\x01\x02" and hdr[29:30] == b"\n", (path, pos)
        pos += 30 + int(hdr[13:29], 16)
        assert data[pos:pos + 4] == b"\n\x01\x03\n", (path, pos)
        pos += 4
        md = {}
        while data[pos:pos + 1] != b"\n":
            end = data.index(b"\n", pos)
            md[chr(data[pos])] = data[pos + 1:end].decode()
            pos = end + 1
        pos += 1
        out.append(md)
    return out


def storage_guids_in_root(root):
    return {md["G"] for p in (root / "storage").glob("m.*") for md in dbox_records(p)}


def copy_fixture(fixture, root):
    shutil.copytree(FIXTURES / fixture / "mdbox", root)
    for d, dirs, files in os.walk(root):
        os.chmod(d, 0o700)
        for f in files:
            os.chmod(os.path.join(d, f), 0o600)


def plain_fixture(tmp_path):
    """The 'plain' Dovecot fixture copied to tmp_path/mdbox and given to
    Dovecot's mail user (skips without ../shared): (root, tmp_path/store)."""
    if not (FIXTURES / "plain" / "mdbox").is_dir():
        pytest.skip("../shared/fixtures/dovecot-mdbox not present")
    root = tmp_path / "mdbox"
    copy_fixture("plain", root)
    Mdbox(root, tmp_path / "dovecot")
    return root, tmp_path / "store"


def every_plain_message_has_a_name(store, tmp_path, make_mount):
    """Mounted, store shows each message of the 'plain' fixture under a
    name of its own."""
    truth = parse_expected(FIXTURES / "plain" / "expected-fetch.txt")
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    names = Counter()
    for t in truth:
        names[find_name(m.mnt / folder_dir(t["mailbox"]), t["uid"])] += 1
    assert len(names) == len(truth)


def test_adopt_live_dovecot(dovecot_tmp, make_mount):
    """A store made here by doveadm: several folders (non-ASCII names, one
    outside the BMP, one holding '.', one '&'), every flag, keywords, copies to two and
    three mailboxes, expunges of a single and of a copied message; then
    Dovecot reading the mount as maildir sees the same UIDs and flags."""
    tmp_path = dovecot_tmp
    corpus = need_corpora() / "notmuch-lkml" / "cur"
    mails = sorted(corpus.iterdir())[:12]
    assert len(mails) == 12
    root, store = tmp_path / "mdbox", tmp_path / "store"
    dv = Mdbox(root, tmp_path / "dovecot")
    odd, dotted, astral = "Ärger & Co", "Ärger.2024", "Lists/Post 📬"
    for mb in ("Lists", "Lists/Kernel", odd, dotted, astral):
        dv.doveadm("mailbox", "create", mb)
    for i, p in enumerate(mails):
        mb = ["INBOX"] * 6 + ["Lists"] * 3 + [astral] + [odd, dotted]
        dv.save(mb[i], p.read_bytes())
    fl = lambda op, flags, mb, uids: dv.doveadm("flags", op, flags, "mailbox", mb, "uid", uids)
    fl("add", "\\Seen", "INBOX", "1")
    fl("add", "\\Answered \\Seen", "INBOX", "2")
    fl("add", "\\Flagged \\Draft", "INBOX", "3")
    fl("add", "\\Deleted \\Seen", "INBOX", "4")
    fl("add", "$Label1 Work $Forwarded", "INBOX", "5")
    fl("add", "Work", "Lists", "1")
    dv.doveadm("copy", "Lists", "mailbox", "INBOX", "uid", "6")
    dv.doveadm("copy", odd, "mailbox", "INBOX", "uid", "6")
    dv.doveadm("copy", "Lists/Kernel", "mailbox", "Lists", "uid", "2")
    dv.doveadm("copy", "Lists/Kernel", "mailbox", "INBOX", "uid", "3")
    fl("add", "\\Seen", "Lists", "4")          # the copy of INBOX 6 only
    dv.doveadm("expunge", "mailbox", "INBOX", "uid", "2")   # refcount 1 -> 0
    dv.doveadm("expunge", "mailbox", "Lists", "uid", "2")   # refcount 2 -> 1
    truth = dv.messages()
    assert len(truth) == 14
    counts = Counter(t["guid"] for t in truth)
    assert sorted(counts.values()) == [1] * 9 + [2, 3]
    texts = {(t["mailbox"], t["uid"]): dv.text(t["mailbox"], t["uid"]) for t in truth}

    adm("import-dovecot", store, root, check_rc=0)
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", "allow_other"])
    check_adopted(m.mnt, truth, lambda t: texts[(t["mailbox"], t["uid"])])
    # Keyword letters are per folder.
    assert set(read_keywords(m.mnt).values()) == {"$Label1", "Work", "$Forwarded"}
    assert read_keywords(m.mnt / ".Lists") == {0: "Work"}
    assert folder_dir(odd) == ".&AMQ-rger &- Co"
    assert folder_dir(astral) == ".Lists.Post &2D3c7A-"   # a surrogate pair
    assert folder_dir(dotted) == ".&AMQ-rger&AC4-2024"
    assert (m.mnt / folder_dir(odd)).is_dir() and (m.mnt / folder_dir(dotted)).is_dir()

    # Dovecot on the mount, as maildir: same UIDs, flags and keywords.
    for d, dirs, files in os.walk(m.mnt):
        for n in [d, *(os.path.join(d, f) for f in files)]:
            os.lchown(n, dv.uid, dv.gid)
    md = Mdbox(tmp_path / "unused", tmp_path / "dovecot-maildir",
               location=f"maildir:{m.mnt}:INDEX=MEMORY")
    seen = {(r["mailbox"], int(r["uid"])): set(r["flags"].split()) - {"\\Recent"}
            for r in md.tab("fetch", "uid flags mailbox", "mailbox", "*", "all")}
    # Dovecot's maildir++ has no spelling for a '.' inside a name (it
    # refuses to create one), so it cannot open the dotted folder.
    want = {(t["mailbox"], t["uid"]): set(t["flags"]) - {"\\Recent"}
            for t in truth if t["mailbox"] != dotted}
    assert seen == want


def test_adopt_messages_with_guids_longer_than_64(dovecot_tmp, make_mount):
    """Mail Dovecot took from a maildir keeps the maildir base name as its
    GUID, often past 64 characters; a record keeps 64 of them, and such
    messages were 'not found' and left out (helper-55)."""
    tmp_path = dovecot_tmp
    root, store = tmp_path / "mdbox", tmp_path / "store"
    dv = Mdbox(root, tmp_path / "dovecot")
    src = tmp_path / "maildir"
    for sub in ("cur", "new", "tmp"):
        (src / sub).mkdir(parents=True)
    long_name = ("1733212345.M912345P12345Q12R0123456789abcdef."
                 "mx-frontend-01.mail.example.com")
    assert len(long_name) > 64
    body = b"From: a@example.org\nSubject: long guid\n\nbody\n"
    (src / "cur" / f"{long_name}:2,S").write_bytes(body)
    (src / "cur" / "1733212346.short:2,").write_bytes(body.replace(b"long", b"short"))
    for d, dirs, files in os.walk(src):
        for n in [d, *(os.path.join(d, f) for f in files)]:
            os.lchown(n, dv.uid, dv.gid)
    dv.doveadm("import", f"maildir:{src}", "", "all")
    truth = dv.messages()
    assert sorted(len(t["guid"]) > 64 for t in truth) == [False, True], truth
    adm("import-dovecot", store, root, check_rc=0)
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    got = sorted(p.read_bytes() for sub in ("cur", "new")
                 for p in (m.mnt / sub).iterdir())
    assert got == sorted([body, body.replace(b"long", b"short")])


def test_adopt_then_purge(dovecot_tmp, make_mount):
    """The bytes of Dovecot's expunged message are dead bytes of the
    adopted m.N; a purge moves the live ones out and drops the store's
    link (the Dovecot root keeps its own), and all still read the same."""
    tmp_path = dovecot_tmp
    if not (FIXTURES / "plain" / "mdbox").is_dir():
        pytest.skip("../shared/fixtures/dovecot-mdbox not present")
    root, store = tmp_path / "mdbox", tmp_path / "store"
    copy_fixture("plain", root)
    dv = Mdbox(root, tmp_path / "dovecot")
    truth = parse_expected(FIXTURES / "plain" / "expected-fetch.txt")
    texts = {(t["mailbox"], t["uid"]): dv.text(t["mailbox"], t["uid"]) for t in truth}
    adm("import-dovecot", store, root, check_rc=0)
    before = stats(store)
    assert before["dead_bytes"] > 0
    adm("purge", store, check_rc=0)
    after = stats(store)
    assert after["dead_bytes"] == 0
    assert after["live_bytes"] == before["live_bytes"]
    assert not (store / "storage" / "m.1").exists()
    assert os.stat(root / "storage" / "m.1").st_nlink == 1
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    check_adopted(m.mnt, truth, lambda t: texts[(t["mailbox"], t["uid"])])


def test_adopting_another_users_files_is_said(dovecot_tmp):
    """The adopted m.N are hard links: the Dovecot root's owner keeps a
    name of each, and when that is not the store's owner (root adopting
    the mail user's root into a store of root's) they can rewrite what
    the store serves (helper-79 F2: a forged message on root's mount).
    Each such file is warned about; a store of the Dovecot root's owner
    (its directory made theirs first, so dboxadm works as them) gets
    no warning."""
    tmp_path = dovecot_tmp
    if not (FIXTURES / "plain" / "mdbox").is_dir():
        pytest.skip("../shared/fixtures/dovecot-mdbox not present")
    for owned_by_mail in (False, True):
        root = tmp_path / f"mdbox{int(owned_by_mail)}"
        store = tmp_path / f"store{int(owned_by_mail)}"
        copy_fixture("plain", root)
        Mdbox(root, tmp_path / f"dovecot{int(owned_by_mail)}")
        mail = pwd.getpwnam("mail")
        if owned_by_mail:
            store.mkdir(mode=0o700)
            os.chown(store, mail.pw_uid, mail.pw_gid)
        r = adm("import-dovecot", store, root, check_rc=0)
        files = sorted((root / "storage").glob("m.*"))
        assert files and all(f.stat().st_uid == mail.pw_uid for f in files)
        said = r.stderr.decode().count(f"belongs to uid {mail.pw_uid}, not to "
                                       "the store's owner")
        assert said == (0 if owned_by_mail else len(files)), r.stderr


def stats(store):
    import json
    return json.loads(adm("stats", store, "--json", check_rc=0).stdout)


def test_adopt_refusals(tmp_path):
    need_dovecot()
    r = adm("import-dovecot", tmp_path / "s", tmp_path / "nope", check_rc=2)
    assert b"nope" in r.stderr
    (tmp_path / "notmdbox").mkdir()
    r = adm("import-dovecot", tmp_path / "s", tmp_path / "notmdbox", check_rc=2)
    assert b"storage" in r.stderr
    assert adm("import-dovecot", "--help", check_rc=0).stdout.startswith(
        b"usage: dboxadm import-dovecot")


def root_owned_copy(fixture, root):
    """A fixture copied as root leaves, owned by root (uid 0)."""
    shutil.copytree(FIXTURES / fixture / "mdbox", root)
    for d, dirs, files in os.walk(root):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


def test_adopt_refuses_root_owned_root(tmp_path):
    """doveadm runs as the owner of the root and Dovecot never opens mail
    as root: a root owned by uid 0 is refused up front, saying why and what
    to do, and no store is made (nor is doveadm run at all)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a root-owned Dovecot root")
    if not (FIXTURES / "plain" / "mdbox").is_dir():
        pytest.skip("../shared/fixtures/dovecot-mdbox not present")
    root, store = tmp_path / "mdbox", tmp_path / "store"
    root_owned_copy("plain", root)
    assert os.stat(root).st_uid == 0
    r = adm("import-dovecot", store, root, check_rc=2)
    err = r.stderr.decode()
    assert "owned by root" in err, err
    assert f"chown -R mail:mail {root}" in err, err
    assert "retrying" not in err and "doveadm(" not in err, err
    assert not store.exists()
    # Nothing of the root changed either.
    assert sorted(os.listdir(root / "storage")) == sorted(
        os.listdir(FIXTURES / "plain" / "mdbox" / "storage"))


def doveadm_wrapper(path, *options):
    """A doveadm that is the real one with -o setting overrides."""
    path.write_text("#!/bin/sh\nexec doveadm %s \"$@\"\n" % " ".join(
        f"-o '{o}'" for o in options))
    path.chmod(0o755)
    return path


def one_message_mdbox(tmp_path):
    """A Dovecot mdbox at tmp_path/mdbox with one message in INBOX, owned
    by Dovecot's mail user: (its root, tmp_path/store, the Mdbox)."""
    root = tmp_path / "mdbox"
    dv = Mdbox(root, tmp_path / "dovecot")
    dv.save("INBOX", b"From: a@example.org\nSubject: one\n\nbody\n")
    dv.chown()
    return root, tmp_path / "store", dv


def test_doveadm_config_stays_roots(dovecot_tmp, make_mount):
    """Root's import-dovecot runs doveadm as root with a config of its own,
    and doveadm then works as the owner of the mdbox root.  The config and
    its directory must stay root's: the owner could otherwise put a config
    of their own there (mail_uid of another user) for root's doveadm (an
    attack run did: doveadm made a directory in another user's 0700
    home).  A wrapper around the real doveadm records what it was given."""
    tmp_path = dovecot_tmp
    root, store, dv = one_message_mdbox(tmp_path)
    seen = tmp_path / "seen"
    doveadm = tmp_path / "doveadm"
    doveadm.write_text(
        "#!/bin/sh\n"
        "conf=; prev=\n"
        "for a in \"$@\"; do [ \"$prev\" = -c ] && conf=$a; prev=$a; done\n"
        f"stat -c '%u %a %n' \"$conf\" \"$(dirname \"$conf\")\" \"$HOME\" >> {seen}\n"
        "exec doveadm \"$@\"\n")
    doveadm.chmod(0o755)
    r = adm("import-dovecot", f"--doveadm={doveadm}", store, root, check_rc=0)
    assert b"adopted 1 messages" in r.stdout, r.stdout
    lines = seen.read_text().split("\n")
    conf, confdir, home = (l.split(" ", 2) for l in lines[:3])
    assert conf[0] == "0" and confdir[0] == "0", lines
    assert int(confdir[1], 8) & 0o022 == 0, lines
    assert home[0] == str(dv.uid), lines
    # Nothing of the run is left behind.
    assert not os.path.exists(confdir[2])


def test_doveadm_gets_nothing_of_roots_session(dovecot_tmp):
    """doveadm runs as the owner of the mdbox root, who may attach to it
    (ptrace, pidfd_getfd): it must hold nothing of root's - no controlling
    terminal (the owner could read root's keys or push input into root's
    shell with TIOCSTI: helper-83 ran a command as root so), stdin from
    /dev/null, no descriptor root's dboxadm inherited.  Root runs the
    import from a terminal of its own here, with a descriptor of a file
    only root may read open; a wrapper around the real doveadm records
    what it holds."""
    tmp_path = dovecot_tmp
    root, store, dv = one_message_mdbox(tmp_path)
    seen = tmp_path / "seen"
    secret = tmp_path / "roots-secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    doveadm = tmp_path / "doveadm"
    doveadm.write_text(
        "#!/bin/sh\n"
        f"{{ cut -d' ' -f6,7 /proc/$$/stat; ls -l /proc/$$/fd/; }} >> {seen} 2>&1\n"
        "exec doveadm \"$@\"\n")
    doveadm.chmod(0o755)
    master, slave = os.openpty()
    held = os.open(secret, os.O_RDONLY)

    def own_terminal():
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    try:
        r = subprocess.run([str(DBOXADM), "import-dovecot", f"--doveadm={doveadm}",
                            str(store), str(root)],
                           stdin=slave, capture_output=True, pass_fds=(held,),
                           preexec_fn=own_terminal, timeout=300)
    finally:
        os.close(held)
        os.close(slave)
        os.close(master)
    assert r.returncode == 0, r.stdout + r.stderr
    text = seen.read_text()
    runs = text.count("total")
    assert runs >= 1, text
    # /proc/PID/stat fields 6 and 7: session, tty_nr (0: no terminal).
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and all(f.isdigit() for f in fields):
            assert fields[1] == "0", text
    assert "/dev/pts" not in text and "/dev/tty" not in text, text
    assert str(secret) not in text, text
    assert " 0 -> /dev/null" in text, text


def test_adopt_retries_without_zlib_only_when_it_is_missing(dovecot_tmp, make_mount):
    """A Dovecot whose plugin directory has no zlib plugin: doveadm says so,
    and the import goes on without it (a plain store adopts in full)."""
    tmp_path = dovecot_tmp
    root, store = plain_fixture(tmp_path)    # owned by user mail
    empty = tmp_path / "no-plugins"
    empty.mkdir()
    doveadm = doveadm_wrapper(tmp_path / "doveadm", f"mail_plugin_dir={empty}")
    r = adm("import-dovecot", f"--doveadm={doveadm}", store, root, check_rc=0)
    err = r.stderr.decode()
    assert "Plugin 'zlib' not found" in err, err
    assert "retrying without Dovecot's zlib plugin" in err, err
    assert b"adopted 8 messages" in r.stdout, r.stdout
    every_plain_message_has_a_name(store, tmp_path, make_mount)


def test_adopt_killed_midway_then_again_leaves_a_clean_store(dovecot_tmp, make_mount):
    """import-dovecot SIGKILLed after it made the folders' plain files
    (maildirfolder, dovecot-uidlist) and before its commit: the next run
    takes what the killed one had not committed out of the way
    (lost+found/) and adopts everything; check is clean (it reported the
    orphaned files/<ino> until a rebuild: helper-55)."""
    import signal
    import time
    tmp_path = dovecot_tmp
    root, store = plain_fixture(tmp_path)
    stall = tmp_path / "doveadm-stalls"
    stall.write_text("#!/bin/sh\ncase \"$*\" in *fetch*) touch %s/fetching;"
                     " sleep 60;; esac\nexec doveadm \"$@\"\n" % tmp_path)
    stall.chmod(0o755)
    p = subprocess.Popen([str(DBOXADM), "import-dovecot", f"--doveadm={stall}",
                          str(store), str(root)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (tmp_path / "fetching").exists():
        assert p.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    subprocess.run(["pkill", "-f", str(stall)])
    assert list((store / "files").iterdir()), "no plain file made before the kill"

    r = adm("import-dovecot", store, root, check_rc=0)
    assert b"adopted 8 messages" in r.stdout, r.stdout
    r = adm("check", store, check_rc=0)
    assert b"problem:" not in r.stdout, r.stdout
    copies = list((store / "lost+found").glob("files-*"))
    assert copies, "the killed run's plain files were not kept"
    assert r.stdout.count(b"look at it before you delete it") == len(copies), r.stdout
    every_plain_message_has_a_name(store, tmp_path, make_mount)


def test_adopting_the_same_root_again_is_refused_and_changes_nothing(dovecot_tmp):
    """A second import-dovecot of a root the store adopted already linked
    every m.N again and failed every message as existing, exit 1
    (helper-55): it is refused, naming the file, and the store stays as
    it was; a refusal that changed nothing exits 2, as a refused store
    does (dboxadm(8), EXIT STATUS)."""
    tmp_path = dovecot_tmp
    root, store = plain_fixture(tmp_path)
    adm("import-dovecot", store, root, check_rc=0)
    before = sorted(os.listdir(store / "storage"))
    rows = index_guids(store)
    r = adm("import-dovecot", store, root)
    assert r.returncode == 2, r
    assert f"{root}/storage/m.1 is {store}/storage/m.".encode() in r.stderr, r.stderr
    assert b"already" in r.stderr and b"exists already" not in r.stderr, r.stderr
    assert sorted(os.listdir(store / "storage")) == before
    assert index_guids(store) == rows
    adm("check", store, check_rc=0)


def test_adopt_reports_other_doveadm_errors_and_removes_its_store(dovecot_tmp):
    """Any other doveadm failure is doveadm's own: reported as it is, not
    retried as if zlib were missing, and the store this run created is gone
    again (an existing empty directory given as STORE is kept, empty)."""
    tmp_path = dovecot_tmp
    root, _ = plain_fixture(tmp_path)
    doveadm = doveadm_wrapper(tmp_path / "doveadm", "mail_plugins=nosuch")
    store = tmp_path / "store"
    r = adm("import-dovecot", f"--doveadm={doveadm}", store, root, check_rc=1)
    err = r.stderr.decode()
    assert "Plugin 'nosuch' not found" in err, err
    assert "retrying" not in err, err
    assert not store.exists()
    store.mkdir()
    adm("import-dovecot", f"--doveadm={doveadm}", store, root, check_rc=1)
    assert store.is_dir() and os.listdir(store) == []
    # A store with content of its own is not removed (this root, adopted
    # already, is refused before doveadm runs: exit 2).
    adm("import-dovecot", store, root, check_rc=0)
    before = sorted(os.listdir(store / "storage"))
    adm("import-dovecot", f"--doveadm={doveadm}", store, root, check_rc=2)
    assert sorted(os.listdir(store / "storage")) == before
    assert (store / "index.sqlite").exists()


def test_doveadm_errors_reach_the_terminal_escaped(dovecot_tmp):
    """What doveadm writes to stderr names mailboxes the mdbox's owner
    named: a name with terminal escapes reached root's terminal as it
    was.  It is passed on escaped, line by line, as dboxadm's own
    messages are."""
    tmp_path = dovecot_tmp
    root, store, dv = one_message_mdbox(tmp_path)
    doveadm = tmp_path / "doveadm"
    doveadm.write_text("#!/bin/sh\n"
                       "printf 'Error: mailbox \\033]0;PWNED\\007\\033[31mred\\n' >&2\n"
                       "exec doveadm \"$@\"\n")
    doveadm.chmod(0o755)
    # An error line with mailboxes listed is only warned about (Dovecot
    # logs the damage it repairs itself as errors).
    r = adm("import-dovecot", f"--doveadm={doveadm}", store, root, check_rc=0)
    assert b"warning: doveadm mailbox reported 1 error" in r.stderr, r.stderr
    assert b"adopted 1 messages" in r.stdout, r.stdout
    assert b"\x1b" not in r.stderr and b"\x07" not in r.stderr, r.stderr
    assert b"Error: mailbox \\x1b]0;PWNED\\x07\\x1b[31mred\n" in r.stderr, r.stderr


def test_doveadm_errors_with_exit_0_fail_the_import(dovecot_tmp):
    """doveadm that cannot lock an mdbox's index (its files read-only to
    their owner, as a copy of a backup may be) logs "Error: Index is
    read-only" and exits 0 with no mailbox listed: the import said
    "adopted 0 messages" with exit 0 and left an empty store.  Now an
    error doveadm logs fails the run, and the store it made is removed;
    once writable, the same mdbox imports."""
    tmp_path = dovecot_tmp
    root, store, dv = one_message_mdbox(tmp_path)
    subprocess.run(["chmod", "-R", "a-w", str(root)], check=True)
    r = adm("import-dovecot", store, root, check_rc=1)
    assert b"Index is read-only" in r.stderr, r.stderr
    assert b"reported 1 error" in r.stderr or b"reported 2 errors" in r.stderr, r.stderr
    assert b"adopted" not in r.stdout, r.stdout
    assert not store.exists()
    subprocess.run(["chmod", "-R", "u+w", str(root)], check=True)
    r = adm("import-dovecot", store, root, check_rc=0)
    assert b"adopted 1 messages" in r.stdout, r.stdout


def test_a_failed_import_leaves_nothing_in_the_way(dovecot_tmp):
    """doveadm failing half way (here its fetch) after the run had made
    plain files in the new store: the store was "removed" but files/ kept
    them, and the next run refused the directory as not empty
    (helper-53).  Now nothing is left, and the next run imports."""
    tmp_path = dovecot_tmp
    root, store, dv = one_message_mdbox(tmp_path)
    doveadm = tmp_path / "doveadm"
    doveadm.write_text("#!/bin/sh\n"
                       "for a in \"$@\"; do [ \"$a\" = fetch ] && "
                       "{ echo 'Error: fetch broke' >&2; exit 1; }; done\n"
                       "exec doveadm \"$@\"\n")
    doveadm.chmod(0o755)
    r = adm("import-dovecot", f"--doveadm={doveadm}", store, root, check_rc=1)
    assert b"removed the store this run had created" in r.stderr, r.stderr
    assert not store.exists(), sorted(p.name for p in store.rglob("*"))
    r = adm("import-dovecot", store, root, check_rc=0)
    assert b"adopted 1 messages" in r.stdout, r.stdout
