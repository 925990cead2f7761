"""dboxadm: import, export, stats and dump against real mounts.

Each corpus in ../shared/corpora is arranged as a Maildir++ tree (the corpus
as it is, plus a .Lists folder, a nested Archive/2019 folder, plain files
and dot-files), imported with `dboxadm import`, then compared with the
source on the mount and after `dboxadm export`: names, bytes, modes and
mtimes (files and directories, with nanoseconds).  stats and dump are
checked against the index and the tree.
"""
import collections
import os
import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import (CORPORA, DBOXADM, DBOXFS, SHARED, index_rows, is_mounted,
                      need_corpora, unmount)

MAILDIR_SUBS = ("cur", "new", "tmp")


def adm(*args, check_rc=None):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                       timeout=300)
    if check_rc is not None:
        assert r.returncode == check_rc, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return r


def corpus_names():
    names = sorted(p.name for p in CORPORA.glob("notmuch-*")) if CORPORA.is_dir() else []
    return names or ["(no corpora)"]


def is_message(path):
    return path.parent.name in MAILDIR_SUBS and not path.name.startswith(".")


def mailbox_of(src, folder):
    """Dovecot mailbox name of a folder dir, as dbox_index_mailbox_name has it."""
    rel = os.path.relpath(folder, src)
    if rel == ".":
        return "INBOX"
    if "/" not in rel and rel.startswith("."):
        return rel[1:].replace(".", "/")
    return rel


def tree_files(root):
    """Every regular file under root (lstat), as Paths."""
    out = []
    for d, dirs, files in os.walk(root):
        for n in files:
            p = Path(d) / n
            if stat.S_ISREG(os.lstat(p).st_mode):
                out.append(p)
    return sorted(out)


def expected_messages(src):
    return [p for p in tree_files(src) if is_message(p)]


def expected_folders(src):
    """Mailbox -> messages, every maildir (a dir with cur/) listed, 0 too."""
    c = collections.Counter({mailbox_of(src, d): 0 for d, dirs, files in os.walk(src)
                             if "cur" in dirs and os.path.isdir(os.path.join(d, "cur"))})
    for p in expected_messages(src):
        c[mailbox_of(src, p.parent.parent)] += 1
    return dict(c)


def build_tree(corpus, src):
    """The corpus as it is, plus Maildir++ and nested folders and plain files."""
    shutil.copytree(corpus, src, symlinks=True)
    for d, dirs, files in os.walk(src):
        os.chmod(d, 0o755)
    for sub in MAILDIR_SUBS:
        (src / sub).mkdir(exist_ok=True)
    mails = tree_files(corpus)
    assert mails, corpus
    lists = src / ".Lists"
    for sub in MAILDIR_SUBS:
        (lists / sub).mkdir(parents=True)
    for i, p in enumerate(mails):
        name = str(p.relative_to(corpus)).replace("/", "_")
        shutil.copy2(p, lists / ("new" if i % 3 == 0 else "cur") / name)
    (lists / "maildirfolder").write_bytes(b"")
    (lists / "dovecot-uidlist").write_bytes(b"3 V1700000000 N%d\n" % len(mails))
    arch = src / "Archive" / "2019"
    for sub in MAILDIR_SUBS:
        (arch / sub).mkdir(parents=True)
    odd = ["1700000000.M1P2.host,S=1234,W=1300:2,RS", "1700000001.M3P4.host:2,FS",
           "weird name=with;chars", "x" * 200]
    for name, p in zip(odd, mails * 4):
        shutil.copy2(p, arch / "cur" / name)
    (arch / "maildirfolder").write_bytes(b"")
    (src / "dovecot-uidlist").write_bytes(b"3 V1700000000 N1\n")
    (src / ".mbsyncstate").write_bytes(b"FarUidValidity 1\nNearUidValidity 2\n")
    (src / "cur" / ".dotfile-in-cur").write_bytes(b"client state, not a message\n")
    (src / ".notmuch" / "xapian").mkdir(parents=True)
    (src / ".notmuch" / "xapian" / "flintlock").write_bytes(b"")
    # Modes and odd nanosecond mtimes survive.
    first = lists / "cur" / sorted(os.listdir(lists / "cur"))[0]
    os.chmod(first, 0o640)
    os.utime(first, ns=(1_000_000_001, 1_234_567_890_123_456_789))
    os.utime(src / "dovecot-uidlist", ns=(5, 1_111_111_111_000_000_007))
    # Directory mtimes last, deepest first, each one distinct.
    dirs = sorted((Path(d) for d, _, _ in os.walk(src)), key=lambda p: -len(p.parts))
    for i, d in enumerate(dirs):
        t = 1_600_000_000_000_000_000 + i * 1_000_003
        os.utime(d, ns=(t, t))


def assert_same_tree(a, b, exclude=()):
    """Same names and bytes (diff -r), and same type, mode bits, size and
    mtime (ns) for every file and directory, the root included."""
    args = ["diff", "-r"]
    for x in exclude:
        args += ["-x", x]
    r = subprocess.run([*args, str(a), str(b)], capture_output=True)
    assert r.returncode == 0, r.stdout.decode(errors="replace")[-3000:]
    checked = 0
    for d, dirs, files in os.walk(a):
        rel = os.path.relpath(d, a)
        for n in [".", *dirs, *files]:
            if n in exclude:
                continue
            sa = os.lstat(os.path.join(a, rel, n))
            sb = os.lstat(os.path.join(b, rel, n))
            assert stat.S_IFMT(sa.st_mode) == stat.S_IFMT(sb.st_mode), (rel, n)
            assert stat.S_IMODE(sa.st_mode) == stat.S_IMODE(sb.st_mode), (rel, n)
            assert sa.st_mtime_ns == sb.st_mtime_ns, (rel, n, sa.st_mtime_ns, sb.st_mtime_ns)
            if stat.S_ISREG(sa.st_mode):
                assert sa.st_size == sb.st_size, (rel, n)
            checked += 1
    assert checked > 0


def mfiles(store):
    return sorted((store / "storage").glob("m.*"), key=lambda p: int(p.name[2:]))


def dump_records(store, mfile):
    r = adm("dump", store, mfile, check_rc=0)
    lines = r.stdout.decode().splitlines()
    assert lines[0].split("\t") == ["offset", "body_size", "guid", "received",
                                    "folder", "plain_size"]
    recs = [line.split("\t") for line in lines[1:]]
    assert all(len(f) == 6 for f in recs), recs
    return recs


def stats_json(store):
    import json
    r = adm("stats", store, "--json", check_rc=0)
    return json.loads(r.stdout)


# --- the command line ---------------------------------------------------------

def test_usage_and_exit_codes(tmp_path):
    r = adm("--help", check_rc=0)
    for verb in ("import", "export", "stats", "dump"):
        assert verb.encode() in r.stdout
    assert adm("--version", check_rc=0).stdout.startswith(b"dboxadm ")
    for verb in ("import", "export", "stats", "dump"):
        r = adm(verb, "--help", check_rc=0)
        assert r.stdout.startswith(b"usage: dboxadm " + verb.encode())
    assert adm(check_rc=2).stderr
    assert adm("frobnicate", check_rc=2).stderr.startswith(b"dboxadm: ")
    assert adm("import", tmp_path / "s", check_rc=2).stderr.startswith(b"dboxadm: ")
    assert adm("stats", tmp_path, "--bogus", check_rc=2).stderr.startswith(b"dboxadm: ")
    # A missing MAILDIR is a usage error, and no store is created for it.
    r = adm("import", tmp_path / "s", tmp_path / "nonexistent", check_rc=2)
    assert b"nonexistent" in r.stderr
    assert not (tmp_path / "s").exists()
    # Not a store.
    assert adm("stats", tmp_path, check_rc=2).stderr.startswith(b"dboxadm: ")
    assert adm("export", tmp_path, tmp_path / "out", check_rc=2).stderr
    assert not (tmp_path / "out").exists()


# --- import, mount, export, stats, dump: every corpus ------------------------

@pytest.mark.parametrize("corpus", corpus_names())
def test_import_export_corpus(corpus, tmp_path, make_mount):
    corpora = need_corpora()
    assert (corpora / corpus).is_dir(), f"no corpus {corpus} in {corpora}"
    src, store, out = tmp_path / "src", tmp_path / "store", tmp_path / "out"
    build_tree(corpora / corpus, src)
    messages = expected_messages(src)
    folders = expected_folders(src)

    r = adm("import", store, src)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b"", r.stderr  # no progress when piped, no warnings

    m = make_mount(store=store, mnt=tmp_path / "mnt")
    assert_same_tree(src, m.mnt)
    # Plain files stay plain files; messages are in m.N.
    assert (m.mnt / "dovecot-uidlist").read_bytes() == (src / "dovecot-uidlist").read_bytes()

    # stats and dump work while the store is mounted.
    st = stats_json(store)
    assert st["messages"] == len(messages)
    assert st["message_names"] == len(messages)
    assert st["folders"] == folders
    assert st["mfiles"] == len(mfiles(store))
    assert st["mfile_bytes"] == sum(p.stat().st_size for p in mfiles(store))
    assert st["dead_bytes"] == 0
    assert st["live_bytes"] + st["header_bytes"] == st["mfile_bytes"]
    assert st["plaintext_bytes"] == sum(p.stat().st_size for p in messages)
    assert st["plain_files"] == len(tree_files(src)) - len(messages)

    records = [rec for f in mfiles(store) for rec in dump_records(store, f.name)]
    assert len(records) == len(messages)
    assert dict(collections.Counter(rec[4] for rec in records)) == \
        {f: n for f, n in folders.items() if n > 0}
    assert sorted(int(rec[1]) for rec in records) == sorted(p.stat().st_size for p in messages)

    # Export while mounted, and again after unmounting: the same tree.
    r = adm("export", store, out)
    assert r.returncode == 0, r.stderr
    assert_same_tree(src, out)
    m.unmount()
    # (The index is read directly only when no daemon has it open.)
    guids = {g for (g,) in index_rows(store, "SELECT guid FROM message")}
    assert len(guids) == len(messages)
    assert {rec[2] for rec in records} == guids
    shutil.rmtree(out)
    out.mkdir()  # an existing empty directory is fine
    r = adm("export", store, out)
    assert r.returncode == 0, r.stderr
    assert_same_tree(src, out)


def test_import_lkml_into_maildirpp_and_hard_links(tmp_path, make_mount):
    """A Maildir++ tree whose INBOX holds the lkml corpus, with hard links
    (procmail multi-folder delivery, Dovecot COPY) between folders."""
    corpora = need_corpora()
    src, store, out = tmp_path / "src", tmp_path / "store", tmp_path / "out"
    shutil.copytree(corpora / "notmuch-lkml" / "cur", src / "cur")
    os.chmod(src / "cur", 0o755)
    for sub in ("new", "tmp", ".Sent/cur", ".Sent/new", ".Sent/tmp"):
        (src / sub).mkdir(parents=True, exist_ok=True)
    (src / ".Sent" / "maildirfolder").write_bytes(b"")
    names = sorted(os.listdir(src / "cur"))
    os.link(src / "cur" / names[0], src / ".Sent" / "cur" / (names[0] + "S"))
    os.link(src / "cur" / names[1], src / "new" / "linked-in-new")
    (src / "state").write_bytes(b"plain\n")
    os.link(src / "state", src / ".Sent" / "state-link")

    adm("import", store, src, check_rc=0)
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    assert_same_tree(src, m.mnt)
    for a, b in [(m.mnt / "cur" / names[0], m.mnt / ".Sent" / "cur" / (names[0] + "S")),
                 (m.mnt / "cur" / names[1], m.mnt / "new" / "linked-in-new"),
                 (m.mnt / "state", m.mnt / ".Sent" / "state-link")]:
        sa, sb = os.stat(a), os.stat(b)
        assert sa.st_ino == sb.st_ino and sa.st_nlink == sb.st_nlink == 2, (a, b)
        assert a.read_bytes() == b.read_bytes()
    st = stats_json(store)
    assert st["messages"] == len(names)
    assert st["message_names"] == len(names) + 2
    assert st["folders"] == {"INBOX": len(names) + 1, "Sent": 1}
    records = [rec for f in mfiles(store) for rec in dump_records(store, f.name)]
    assert len(records) == len(names)  # one record per message, not per name
    m.unmount()

    adm("export", store, out, check_rc=0)
    assert_same_tree(src, out)
    sa, sb = os.stat(out / "cur" / names[0]), os.stat(out / ".Sent" / "cur" / (names[0] + "S"))
    assert sa.st_ino == sb.st_ino and sa.st_nlink == 2
    sa, sb = os.stat(out / "state"), os.stat(out / ".Sent" / "state-link")
    assert sa.st_ino == sb.st_ino and sa.st_nlink == 2


# --- refusals and per-item failures ------------------------------------------

def small_maildir(path, n=3):
    for sub in MAILDIR_SUBS:
        (path / sub).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (path / "cur" / f"{i}.x.host:2,S").write_bytes(b"Subject: %d\n\nbody %d\n" % (i, i))
    return path


def test_import_refuses_mounted_store(tmp_path, mount):
    src = small_maildir(tmp_path / "src")
    before = sorted(os.listdir(mount.mnt))
    r = adm("import", mount.store, src, check_rc=2)
    assert b"in use" in r.stderr and r.stderr.startswith(b"dboxadm: ")
    assert sorted(os.listdir(mount.mnt)) == before
    assert os.listdir(mount.mnt / "cur") == []


def test_a_store_path_too_long_for_sqlite_is_refused_clearly(tmp_path):
    """SQLite opens no index whose path leaves less than 8 bytes of its
    512 for the "-journal" name.  A store that deep failed as "the index
    is unreadable" with rebuild advice, after a new store's directories
    were made, and rebuild then set the whole index aside (helper-87).
    Each verb now refuses it first, saying why, and changes nothing; the
    store moved back to a short path works as it was."""
    src = small_maildir(tmp_path / "src")
    deep = tmp_path
    while len(str(deep)) < 420:
        deep = deep / ("d" * 60)
    deep.mkdir(parents=True)
    store = deep / ("s" * (510 - len("/index.sqlite") - len(str(deep)) - 1))
    assert len(str(store / "index.sqlite")) == 510
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        r = subprocess.run([str(DBOXFS), str(store), str(mnt)],
                           capture_output=True, timeout=60)
    finally:
        if is_mounted(mnt):
            unmount(mnt)
    assert r.returncode != 0
    assert b"too long for SQLite" in r.stderr, r.stderr
    assert os.listdir(deep) == []
    r = adm("import", store, src, check_rc=2)
    assert b"too long for SQLite" in r.stderr and os.listdir(deep) == []
    short = tmp_path / "short"
    adm("import", short, src, check_rc=0)
    files = sorted(os.listdir(short))
    os.rename(short, store)
    for verb in ("check", "rebuild", "stats", "purge", "export"):
        args = (verb, store, tmp_path / "out") if verb == "export" else (verb, store)
        r = adm(*args, check_rc=2)
        assert b"too long for SQLite" in r.stderr, (verb, r.stderr)
        assert b"rebuild" not in r.stderr, (verb, r.stderr)
        assert sorted(os.listdir(store)) == files, verb
    os.rename(store, short)
    r = adm("check", short, check_rc=0)


def test_import_refuses_non_store_dir(tmp_path):
    src = small_maildir(tmp_path / "src")
    notstore = tmp_path / "notstore"
    notstore.mkdir()
    (notstore / "precious").write_bytes(b"keep me")
    r = adm("import", notstore, src, check_rc=2)
    assert b"not a dbox store" in r.stderr
    # No rebuild advice without a storage/ to rebuild from (helper-90).
    assert b"rebuild" not in r.stderr, r.stderr
    assert os.listdir(notstore) == ["precious"]
    (notstore / "storage").mkdir()
    r = adm("import", notstore, src, check_rc=2)
    assert b"if it was a store, run 'dboxadm rebuild" in r.stderr, r.stderr
    assert sorted(os.listdir(notstore)) == ["precious", "storage"]


def test_reimport_skips_present_and_keeps_store(tmp_path, make_mount):
    """Importing the same tree again (a resumed import) counts what is
    already there with the same bytes in one summary line, exit 0; the
    store is unchanged, and what is new is imported."""
    src = small_maildir(tmp_path / "src")
    (src / "dovecot-uidlist").write_bytes(b"3 V1 N4\n")
    os.link(src / "cur" / "0.x.host:2,S", src / "new" / "0.x.host")
    store = tmp_path / "store"
    r = adm("import", store, src, check_rc=0)
    # The summary, also when not on a terminal (a cron job's mail).
    assert r.stdout == f"{store}: 3 messages, 1 plain files, 3 directories, " \
        "1 hard links imported\n".encode(), r.stdout
    before = stats_json(store)
    (src / "cur" / "3.x.host:2,S").write_bytes(b"Subject: new\n\nnew\n")
    r = adm("import", store, src, check_rc=0)
    assert r.stdout == f"{store}: 1 messages, 0 plain files, 0 directories, " \
        "0 hard links imported\n".encode(), r.stdout
    assert b"File exists" not in r.stderr
    assert r.stderr == b"dboxadm: 5 items already present in the store with the same bytes, skipped\n"
    after = stats_json(store)
    assert after["messages"] == before["messages"] + 1 == 4
    assert after["message_names"] == before["message_names"] + 1 == 5
    assert after["mfile_bytes"] - before["mfile_bytes"] > len(b"Subject: new\n\nnew\n")
    # No half-made inodes: every inode but the root has a name.
    assert index_rows(store, "SELECT count(*) FROM inode WHERE ino != 1"
                             " AND ino NOT IN (SELECT ino FROM entry)") == [(0,)]
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    # Names and bytes; (cur/ got a new message: its mtime is the store's.)
    assert subprocess.run(["diff", "-r", src, m.mnt]).returncode == 0
    assert os.stat(m.mnt / "cur" / "0.x.host:2,S").st_ino == os.stat(m.mnt / "new" / "0.x.host").st_ino


def test_reimport_after_flag_changes_on_the_mount(tmp_path, make_mount):
    """The same maildir imported again after clients used the mount: a
    message whose flags changed there (renamed to another :2,flags) or
    that was moved from new/ to cur/ is found by its unique name and not
    imported again (it was: the folder then held the same unique name
    twice, which maildir readers such as Python's mailbox show once, and
    the store two copies: a first-use trial, helper-58).  Another message
    that only shares a prefix of the unique name is imported."""
    src = tmp_path / "src"
    for sub in ("cur", "new", "tmp"):
        (src / sub).mkdir(parents=True)
    (src / "cur" / "1001.M1P1.host:2,S").write_bytes(b"Subject: a\n\na\n")
    (src / "new" / "1002.M2P1.host").write_bytes(b"Subject: b\n\nb\n")
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    os.rename(m.mnt / "cur" / "1001.M1P1.host:2,S", m.mnt / "cur" / "1001.M1P1.host:2,RS")
    os.rename(m.mnt / "new" / "1002.M2P1.host", m.mnt / "cur" / "1002.M2P1.host:2,")
    m.unmount()
    (src / "cur" / "1001.M1P1.host.2:2,S").write_bytes(b"Subject: c\n\nc\n")
    r = adm("import", store, src, check_rc=0)
    assert r.stdout == f"{store}: 1 messages, 0 plain files, 0 directories, " \
        "0 hard links imported\n".encode(), r.stdout
    assert b"2 items already present" in r.stderr, r.stderr
    assert b"2 of them are messages the store has under their unique name " \
        b"with other flags" in r.stderr, r.stderr
    m.mount()
    assert sorted(os.listdir(m.mnt / "cur")) == [
        "1001.M1P1.host.2:2,S", "1001.M1P1.host:2,RS", "1002.M2P1.host:2,"]
    assert os.listdir(m.mnt / "new") == []
    m.unmount()
    assert stats_json(store)["messages"] == 3


def killed_import(tmp_path):
    """A maildir (6,000 messages and a plain file) and a store its import
    was SIGKILLed into mid-way (skips when the import never was)."""
    import signal
    import time
    from sysenv import sample_maildir
    src = sample_maildir(tmp_path / "src", messages=6000)
    (src / "notes.txt").write_bytes(b"a plain file\n" * 1000)
    store = tmp_path / "store"
    for delay in (0.3, 0.15, 0.05):
        shutil.rmtree(store, ignore_errors=True)
        p = subprocess.Popen([str(DBOXADM), "import", str(store), str(src)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        if p.wait() == -signal.SIGKILL and (store / "index.sqlite").exists() and \
                sum(f.stat().st_size for f in (store / "storage").glob("m.*")) > 10**6 and \
                index_rows(store, "SELECT value FROM meta WHERE key = 'import.running'") == [(1,)]:
            return src, store
    pytest.skip("the import never got killed mid-way here")


def test_import_killed_then_resumed_leaves_a_clean_store(tmp_path, make_mount):
    """An import SIGKILLed mid-way left its uncommitted records as 'whole
    records the index does not know' (an index older than storage/): check
    reported them for ever, purge could not reclaim them, and rebuild
    restored them as duplicates (helper-55).  Now the next open copies them
    to lost+found/ and cuts them; the resumed import finishes, check is
    clean and the store holds the source once."""
    src, store = killed_import(tmp_path)
    r = adm("import", store, src, check_rc=0)
    assert b"an import was killed" in r.stderr, r.stderr
    r = adm("check", store, check_rc=0)
    assert b"problem:" not in r.stdout and b": 0 problems" in r.stdout, r.stdout
    # A plain file's copy is named as one, never as 'cut off an m.N,
    # delete it once check finds no problem' (helper-56).
    for copy in (store / "lost+found").glob("files-*"):
        assert f"lost+found/{copy.name}: ".encode() in r.stdout
        assert b"look at it before you delete it" in r.stdout, r.stdout
    assert index_rows(store, "SELECT value FROM meta WHERE key = 'import.running'") == [(0,)]
    s = stats_json(store)
    n = sum(1 for p in src.rglob("*") if p.is_file() and p.parent.name in ("cur", "new"))
    assert s["messages"] == n, s
    assert s["pending_bytes"] == 0 and s["missing_mfiles"] == 0, s
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    assert subprocess.run(["diff", "-r", src, m.mnt]).returncode == 0


def test_an_interrupted_import_fails_no_item_and_finishes_when_run_again(tmp_path):
    """SIGINT (Ctrl-C) or SIGTERM in the middle of an import: it stops
    after a commit, says how many messages it committed and to run it
    again, and reports no failed item (the message it was copying said
    'Interrupted system call' and counted as '1 items failed':
    helper-85).  Run again, it finishes; check is clean."""
    import signal
    import time
    from sysenv import sample_maildir
    src = sample_maildir(tmp_path / "src", messages=6000)
    store = tmp_path / "store"
    n = sum(1 for p in src.rglob("*") if p.is_file() and p.parent.name in ("cur", "new"))
    for sig in (signal.SIGINT, signal.SIGTERM):
        for delay in (0.3, 0.15, 0.05):
            shutil.rmtree(store, ignore_errors=True)
            p = subprocess.Popen([str(DBOXADM), "import", str(store), str(src)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            time.sleep(delay)
            p.send_signal(sig)
            out, err = p.communicate(timeout=120)
            if b"interrupted: " in err:
                break
        else:
            pytest.skip("the import was never interrupted mid-way here")
        assert p.returncode == 1, err
        assert b"run the same import again to finish it" in err, err
        assert b"failed" not in err and b"Interrupted system call" not in err, err
        committed = int(err.split(b"interrupted: ")[1].split()[0])
        assert 0 < committed < n and stats_json(store)["messages"] == committed
        adm("import", store, src, check_rc=0)
        adm("check", store, check_rc=0)
        assert stats_json(store)["messages"] == n


def test_check_and_rebuild_after_a_killed_import_do_not_double_its_mail(tmp_path, make_mount):
    """After a killed import, check called its uncommitted records 'not in
    the index (is the index older than storage/?)' and advised a rebuild;
    the rebuild restored them under .rebuild names and the import run
    again added them once more: 3,548 messages from 3,000 (helper-85).
    Now check judges them as the next open does (notes, exit 0) and says
    to run the import again; a rebuild leaves them for purge; the import
    run again after it makes the source exactly once."""
    src, store = killed_import(tmp_path)
    r = adm("check", store, check_rc=0)
    out = r.stdout.decode()
    assert "problem:" not in out and ": 0 problems" in out, out
    assert "note: an import was killed before it finished" in out, out
    assert "advice: run the killed 'dboxadm import'" in out, out
    assert "dboxadm rebuild" not in out and "advice: 'dboxadm rebuild" not in out, out
    r = adm("rebuild", store, check_rc=0)
    assert b"an import killed before it finished were not restored" in r.stdout or \
        b"says an import was killed" in r.stdout, r.stdout
    assert b"restored with new names" in r.stdout
    adm("import", store, src, check_rc=0)
    r = adm("check", store, check_rc=0)
    assert b": 0 problems" in r.stdout, r.stdout
    n = sum(1 for p in src.rglob("*") if p.is_file() and p.parent.name in ("cur", "new"))
    assert stats_json(store)["messages"] == n
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    assert not [p for p in m.mnt.rglob("*.rebuild:2,*")]
    assert subprocess.run(["diff", "-r", src, m.mnt]).returncode == 0


def test_reimport_different_bytes_fails_that_name(tmp_path):
    """A name already in the store with other bytes - same size, other
    size, or a plain file - is an error naming it (exit 1), not imported;
    the store's copy stays."""
    src = small_maildir(tmp_path / "src")
    (src / "dovecot-uidlist").write_bytes(b"3 V1 N4\n")
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    old0 = (src / "cur" / "0.x.host:2,S").read_bytes()
    (src / "cur" / "0.x.host:2,S").write_bytes(old0.replace(b"body", b"BODY"))
    (src / "cur" / "1.x.host:2,S").write_bytes(b"longer than before\n")
    (src / "dovecot-uidlist").write_bytes(b"3 V1 N5\n")
    r = adm("import", store, src, check_rc=1)
    lines = r.stderr.decode().splitlines()
    differ = sorted(l for l in lines if "different content" in l)
    assert differ == [f"dboxadm: {src}/{n}: exists in the store with different content; not imported"
                      for n in ("cur/0.x.host:2,S", "cur/1.x.host:2,S", "dovecot-uidlist")], lines
    assert "dboxadm: 1 items already present in the store with the same bytes, skipped" in lines
    assert "dboxadm: 3 items failed" in lines
    out = tmp_path / "out"
    adm("export", store, out, check_rc=0)
    assert (out / "cur" / "0.x.host:2,S").read_bytes() == old0
    assert (out / "dovecot-uidlist").read_bytes() == b"3 V1 N4\n"


def test_import_refuses_tree_without_maildir(tmp_path):
    """A directory with no cur/ new/ tmp/ anywhere is not imported: exit 2
    and a clear error, and the store is not even created."""
    src = tmp_path / "notes"
    (src / "sub" / "deeper").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"a\n")
    (src / "sub" / "deeper" / "b.txt").write_bytes(b"b\n")
    os.symlink(tmp_path / "elsewhere", src / "cur")      # not followed
    (tmp_path / "elsewhere").mkdir()
    store = tmp_path / "store"
    r = adm("import", store, src, check_rc=2)
    assert r.stderr == (f"dboxadm: {src}: not a maildir: no cur/, new/ or tmp/ "
                        "directory in it or below; nothing imported\n").encode()
    assert not store.exists()
    # A Maildir++ folder alone (cur/ only deeper down) is a maildir.
    (src / "sub" / "deeper" / "cur").mkdir()
    adm("import", store, src, check_rc=0)


def test_import_keeps_symlinks_and_fifos(tmp_path, make_mount):
    src = small_maildir(tmp_path / "src")
    os.symlink("0.x.host:2,S", src / "cur" / "a-symlink")
    os.mkfifo(src / "a-fifo")
    store = tmp_path / "store"
    r = adm("import", store, src, check_rc=0)
    assert b"skipped" not in r.stderr
    # Counted as what they are, not as plain files (helper-54).
    assert r.stdout == f"{store}: 3 messages, 0 plain files, 2 symbolic links and " \
        "special files, 3 directories, 0 hard links imported\n".encode(), r.stdout
    r = adm("export", store, tmp_path / "out", check_rc=0)
    assert b", 0 plain files, 2 symbolic links and special files, " in r.stdout, r.stdout
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    assert sorted(os.listdir(m.mnt / "cur")) == ["0.x.host:2,S", "1.x.host:2,S", "2.x.host:2,S",
                                                 "a-symlink"]
    assert os.readlink(m.mnt / "cur" / "a-symlink") == "0.x.host:2,S"
    assert stat.S_ISFIFO(os.lstat(m.mnt / "a-fifo").st_mode)
    # Run again: present, not imported twice, not failed.
    m.unmount()
    r = adm("import", store, src, check_rc=0)
    assert b"already present" in r.stderr and b"skipped" not in r.stderr.replace(b"same bytes, skipped", b"")
    # check knows the new kinds, and a symlink that lost its target.
    adm("check", store, check_rc=0)
    with sqlite3.connect(store / "index.sqlite") as db:
        db.execute("DELETE FROM symlink")
    r = adm("check", store)
    assert r.returncode != 0 and b"has no target" in r.stdout + r.stderr, r


def test_stats_dead_bytes_after_expunge(tmp_path, make_mount):
    src = small_maildir(tmp_path / "src", n=10)
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    sizes = dict(index_rows(store, "SELECT e.name, m.record_size FROM entry e"
                                   " JOIN message m ON m.ino = e.ino"))
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    gone = ["1.x.host:2,S", "4.x.host:2,S", "7.x.host:2,S"]
    for name in gone:
        os.unlink(m.mnt / "cur" / name)
    (m.mnt / "new" / "new.x.host").write_bytes(b"Subject: new\n\nnew\n")
    st = stats_json(store)  # while mounted
    assert st["messages"] == 10 - 3 + 1
    assert st["folders"] == {"INBOX": 8}
    m.unmount()
    st = stats_json(store)
    assert st["dead_bytes"] == sum(sizes[n.encode()] for n in gone)
    assert st["live_bytes"] + st["dead_bytes"] + st["header_bytes"] == st["mfile_bytes"]
    text = adm("stats", store, check_rc=0).stdout.decode()
    assert "dead bytes" in text and str(st["dead_bytes"]) in text


def folder_tree(src, dirs):
    """One message in the cur/ of each Maildir++ folder directory name."""
    for i, d in enumerate(["", *dirs]):
        for sub in MAILDIR_SUBS:
            (src / d / sub).mkdir(parents=True, exist_ok=True)
        (src / d / "cur" / f"{i}.x.host:2,S").write_bytes(b"Subject: %d\n\n" % i)
    return src


def test_stats_folder_names_in_utf8(tmp_path):
    """Folder names on disk are Maildir++ modified UTF-7; stats shows them
    in UTF-8 (text and --json), with the stored form beside them."""
    src = folder_tree(tmp_path / "src", [".&AMQ-rger", ".Caf&AOk-.2024", ".&ZeVnLIqe-",
                                         ".a&-b", ".Plain"])
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    st = stats_json(store)
    assert st["folders"] == {"INBOX": 1, "Ärger": 1, "Café/2024": 1, "日本語": 1,
                             "a&b": 1, "Plain": 1}
    assert st["folders_raw"] == {"INBOX": "INBOX", "Ärger": "&AMQ-rger",
                                 "Café/2024": "Caf&AOk-/2024", "日本語": "&ZeVnLIqe-",
                                 "a&b": "a&-b", "Plain": "Plain"}
    text = adm("stats", store, check_rc=0).stdout.decode()
    per_folder = text.split("messages per folder\n", 1)[1].splitlines()
    assert "           1  Ärger  (stored as &AMQ-rger)" in per_folder
    assert "           1  日本語  (stored as &ZeVnLIqe-)" in per_folder
    assert "           1  Plain" in per_folder


def test_stats_folder_names_that_are_not_mutf7(tmp_path):
    """A folder made with a UTF-8 name (not modified UTF-7) is shown as it
    is; when it would show like another folder, both show as stored, so
    the JSON keys stay distinct."""
    src = folder_tree(tmp_path / "src", [".Ärger", ".&AMQ-rger", ".Müll", ".&ZeVnLIqe-"])
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    import json

    def no_repeated_keys(pairs):
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), keys
        return dict(pairs)

    r = adm("stats", store, "--json", check_rc=0)
    st = json.loads(r.stdout, object_pairs_hook=no_repeated_keys)
    assert st["folders"] == {"INBOX": 1, "Ärger": 1, "&AMQ-rger": 1, "Müll": 1, "日本語": 1}
    assert st["folders_raw"]["&AMQ-rger"] == "&AMQ-rger"
    assert st["folders_raw"]["Müll"] == "Müll"


def test_reading_a_mounted_store_disturbs_nothing(tmp_path, make_mount):
    """stats, dump and export on a mounted store are guests: commits the
    mount makes afterwards stay visible to later readers and survive."""
    src = small_maildir(tmp_path / "src")
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    for i in range(3):
        assert stats_json(store)["messages"] == 3 + i
        dump_records(store, "m.1")
        adm("export", store, tmp_path / f"out{i}", check_rc=0)
        assert len(os.listdir(tmp_path / f"out{i}" / "new")) == i
        (m.mnt / "new" / f"later{i}").write_bytes(b"Subject: later\n\n%d\n" % i)
    assert stats_json(store)["messages"] == 6
    assert (store / "index.sqlite-wal").exists()  # not checkpointed away by a guest
    m.unmount()
    m.mount()
    assert sorted(os.listdir(m.mnt / "new")) == ["later0", "later1", "later2"]


@pytest.mark.parametrize("options", [[], ["-o", "rotate_size=64"]],
                         ids=["last-file", "new-file"])
def test_dump_stops_at_the_committed_end_while_writing(tmp_path, make_mount, options):
    src = small_maildir(tmp_path / "src")
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    before = mfiles(store)
    assert [p.name for p in before] == ["m.1"]
    m1_size = before[0].stat().st_size
    imported = dump_records(store, "m.1")
    assert len(imported) == 3
    # m.1 is below the default rotate size, so the mount appends to it;
    # with rotate_size=64 it is full and the mount starts m.2.
    assert 64 <= m1_size < 10 * 1024 * 1024
    adopted = not options
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=options)
    # The writer is another process: any close of a copy of its descriptor
    # (as fork + exec of dboxadm from this process would do) is a FUSE
    # flush, which finishes the message.  sync_file_range() hands its bytes
    # to the daemon without a close or fsync: with -o writeback_cache the
    # kernel holds them until writeback (ext4 too holds them in its page
    # cache until writeback); without, the write has sent them already.
    writer = subprocess.Popen(
        ["/usr/bin/python3", "-c",
         "import ctypes, os, sys\n"
         "f = open(sys.argv[1], 'wb')\n"
         "f.write(b'Subject: partial\\n\\n' + b'x' * 100000)\n"
         "f.flush()\n"
         "libc = ctypes.CDLL(None, use_errno=True)\n"
         "libc.sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)\n"
         "# SYNC_FILE_RANGE_WAIT_BEFORE | _WRITE | _WAIT_AFTER\n"
         "assert libc.sync_file_range(f.fileno(), 0, 0, 7) == 0, ctypes.get_errno()\n"
         "print('ready', flush=True)\n"
         "sys.stdin.read()\n"
         "f.close()\n",
         str(m.mnt / "tmp" / "being-written")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert writer.stdout.readline() == b"ready\n"
        names = [p.name for p in mfiles(store)]
        if adopted:
            assert names == ["m.1"]
            target = "m.1"
            assert (store / "storage" / "m.1").stat().st_size > m1_size + 100000
        else:
            assert names == ["m.1", "m.2"]
            target = "m.2"
            assert (store / "storage" / "m.1").stat().st_size == m1_size
        r = adm("dump", store, target, check_rc=0)
        # Only the committed records: the 3 imported ones in m.1, none in
        # the new m.2; the message being written is not taken for a
        # corrupt record.
        assert len(r.stdout.decode().splitlines()[1:]) == (3 if adopted else 0)
        assert b"after the committed end" in r.stderr
        assert b"corrupt" not in r.stderr
        # The committed records of m.1 dump as they were.
        assert dump_records(store, "1") == imported
    finally:
        writer.communicate(timeout=30)
    assert writer.returncode == 0
    recs = dump_records(store, target)
    assert len(recs) == (4 if adopted else 1)
    assert recs[-1][1] == str(100000 + 18) and recs[-1][4] == "INBOX"
    if adopted:
        # Appended right after the imported records, which are unchanged.
        assert recs[:3] == imported
        assert int(recs[-1][0]) == m1_size
        assert [p.name for p in mfiles(store)] == ["m.1"]


def test_dump_reports_corrupt_record(tmp_path):
    src = small_maildir(tmp_path / "src")
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    recs = dump_records(store, "m.1")
    assert len(recs) == 3
    bad = tmp_path / "m.1"
    data = bytearray((store / "storage" / "m.1").read_bytes())
    off = int(recs[1][0])
    data[off] = ord("X")
    bad.write_bytes(bytes(data))
    r = adm("dump", store, bad, check_rc=1)
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 2 and lines[1].split("\t")[:3] == recs[0][:3]
    assert f"offset {off}".encode() in r.stderr
    assert adm("dump", store, "m.99", check_rc=2).stderr.startswith(b"dboxadm: ")


def test_dump_dovecot_compressed_file():
    if not SHARED.is_dir():
        pytest.skip("../shared not present")
    f = SHARED / "fixtures" / "dovecot-mdbox" / "zlib-gz" / "mdbox" / "storage" / "m.1"
    assert f.is_file()
    r = adm("dump", "/nonexistent-store", f, check_rc=0)
    recs = [line.split("\t") for line in r.stdout.decode().splitlines()[1:]]
    assert recs and all(rec[5] != "-" and int(rec[5]) > int(rec[1]) for rec in recs)
    assert all(len(rec[2]) == 32 and rec[3].endswith("Z") for rec in recs)


def test_export_reports_unreadable_message_and_goes_on(tmp_path):
    src = small_maildir(tmp_path / "src", n=5)
    store, out = tmp_path / "store", tmp_path / "out"
    adm("import", store, src, check_rc=0)
    [(name, file_id, offset)] = index_rows(
        store, "SELECT e.name, m.file_id, m.offset FROM entry e JOIN message m"
               " ON m.ino = e.ino WHERE e.name = CAST('2.x.host:2,S' AS BLOB)")
    mf = store / "storage" / f"m.{file_id}"
    data = bytearray(mf.read_bytes())
    data[offset] = ord("X")
    mf.write_bytes(bytes(data))
    r = adm("export", store, out, check_rc=1)
    assert b"2.x.host:2,S" in r.stderr
    assert not (out / "cur" / "2.x.host:2,S").exists()
    assert sorted(os.listdir(out / "cur")) == [f"{i}.x.host:2,S" for i in (0, 1, 3, 4)]
    for i in (0, 1, 3, 4):
        n = f"{i}.x.host:2,S"
        assert (out / "cur" / n).read_bytes() == (src / "cur" / n).read_bytes()
    # An export never writes into a directory that has something in it.
    r = adm("export", store, out, check_rc=2)
    assert b"not empty" in r.stderr


def test_stats_lists_empty_folders(tmp_path, make_mount):
    """Every folder is listed, with 0 when it holds no message - INBOX
    too - in text and --json; a folder emptied on the mount as well."""
    src = tmp_path / "src"
    for d in ("", ".Empty", ".Lists"):
        for sub in MAILDIR_SUBS:
            (src / d / sub).mkdir(parents=True, exist_ok=True)
    for i in range(2):
        (src / ".Lists" / "cur" / f"{i}.x.host:2,S").write_bytes(b"Subject: %d\n\n" % i)
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    st = stats_json(store)
    assert st["folders"] == {"INBOX": 0, "Empty": 0, "Lists": 2}
    per_folder = adm("stats", store, check_rc=0).stdout.decode().split(
        "messages per folder\n", 1)[1].splitlines()
    assert "           0  INBOX" in per_folder
    assert "           0  Empty" in per_folder
    assert "           2  Lists" in per_folder
    m = make_mount(store=store, mnt=tmp_path / "mnt")
    for n in os.listdir(m.mnt / ".Lists" / "cur"):
        os.unlink(m.mnt / ".Lists" / "cur" / n)
    (m.mnt / "new" / "1.y.host").write_bytes(b"Subject: new\n\nnew\n")
    m.unmount()
    assert stats_json(store)["folders"] == {"INBOX": 1, "Empty": 0, "Lists": 0}


def test_check_prints_utf8_names_as_they_are(tmp_path):
    """check names a UTF-8 folder as it is (as ls and the log do); only
    control bytes and bytes that are no UTF-8 are written as \\xNN."""
    src = tmp_path / "Maildir"
    for folder in (src, src / ".Café", src / ".Plain"):
        for sub in MAILDIR_SUBS:
            (folder / sub).mkdir(parents=True)
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    with sqlite3.connect(store / "index.sqlite") as db:
        # Each folder's inode gone: check names the entries pointing at it.
        for name in (".Café".encode(), b".Plain"):
            db.execute("DELETE FROM inode WHERE ino = "
                       "(SELECT ino FROM entry WHERE parent = 1 AND name = ?)",
                       (name,))
        db.execute("UPDATE entry SET name = ? WHERE parent = 1 AND name = ?",
                   (b".Pl\x1b[2J\xffain", b".Plain"))
    db.close()
    r = adm("check", store, check_rc=1)
    out = r.stdout.decode("utf-8", "strict")
    assert "entry '.Café' in directory 1 names inode" in out, out
    assert "entry '.Pl\\x1b[2J\\xffain' in directory 1 names inode" in out, out


@pytest.mark.parametrize("verb,args", [
    ("stats", ["S"]), ("check", ["S"]), ("purge", ["S"]), ("rebuild", ["S"]),
    ("export", ["S", "D"]), ("dump", ["S", "m.1"]), ("cat", ["S", "m.1", "0"]),
    ("altmove", ["S", "--folder=INBOX"]), ("backup", ["S", "D"]),
    ("import", ["S", "M"]), ("import-dovecot", ["S", "M"])])
def test_an_argument_too_many_is_named(tmp_path, verb, args):
    """One positional argument too many: the usage error names it (not
    'need STORE'); one too few still says what is needed."""
    store = tmp_path / "store"
    args = [str(store) if a == "S" else a for a in args]
    r = adm(verb, *args, "extra", check_rc=2)
    assert f"{verb}: unexpected argument 'extra'".encode() in r.stderr, r.stderr
    assert b"need" not in r.stderr, r.stderr
    r = adm(verb, check_rc=2)
    assert f"{verb}: need STORE".encode() in r.stderr, r.stderr
    assert not store.exists()


@pytest.mark.parametrize("verb", ["stats", "export", "backup"])
def test_corrupt_index_points_at_rebuild(tmp_path, verb):
    """A store whose index.sqlite is not a database: the reading verbs say
    what to do, as check and dboxfs do."""
    src = tmp_path / "Maildir"
    for sub in MAILDIR_SUBS:
        (src / sub).mkdir(parents=True)
    store = tmp_path / "store"
    adm("import", store, src, check_rc=0)
    for p in store.glob("index.sqlite*"):
        p.unlink()
    (store / "index.sqlite").write_bytes(b"not a database\n" * 512)
    args = {"stats": [], "export": [tmp_path / "out"],
            "backup": [tmp_path / "out"]}[verb]
    r = adm(verb, store, *args)
    assert r.returncode != 0, r.stdout
    assert f"run 'dboxadm rebuild {store}'".encode() in r.stderr, r.stderr


def test_store_reached_through_a_symlink(tmp_path, make_mount):
    """STORE is an admin's path, symbolic links on the way followed, as
    the mount does: check, stats, rebuild and backup through a link to
    the store work (SQLite's NOFOLLOW refused the whole path: check
    called a healthy index unreadable and told to rebuild, and rebuild
    moved it aside and failed).  The index file itself stays refused as
    a link."""
    real, link = tmp_path / "real" / "store", tmp_path / "link"
    real.mkdir(parents=True)
    link.symlink_to(real)
    m = make_mount(store=link, mnt=tmp_path / "mnt")
    (m.mnt / "cur" / "1.a:2,S").write_bytes(b"Subject: a\n\nbody\n")
    m.unmount()
    r = adm("check", link, check_rc=0)
    assert b"1 messages" in r.stdout and b"0 problems" in r.stdout, r.stdout
    assert b"messages            1" in adm("stats", link, check_rc=0).stdout
    adm("rebuild", link, check_rc=0)
    assert b"0 problems" in adm("check", link, check_rc=0).stdout
    adm("backup", link, tmp_path / "bk", check_rc=0)
    assert b"1 messages" in adm("check", tmp_path / "bk", check_rc=0).stdout
    m.mount()
    assert (m.mnt / "cur" / "1.a:2,S").read_bytes() == b"Subject: a\n\nbody\n"
    m.unmount()

    (real / "index.sqlite").rename(real / "elsewhere.sqlite")
    (real / "index.sqlite").symlink_to(real / "elsewhere.sqlite")
    assert adm("check", link).returncode != 0
