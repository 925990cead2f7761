"""Timestamps and space as ext4 keeps them (issue 11): every test runs the
same steps on a plain ext4 directory (the test's tmp_path, which must be
on ext4) and on the mount, and compares.

- utime() over the whole range: ext4's -2^31 .. 15032385535 s round-trips
  to the nanosecond, times outside it are clamped as ext4 clamps them;
  negative times keep their fractions; the received date R of the dbox
  record follows the mtime, whatever its width.
- a directory's mtime/ctime after a change is the current time, also when
  it lay in the future (notmuch then finds the new message).
- every write (overwrite in place, append, ftruncate, O_TRUNC) sets mtime
  and ctime to now, so a second `rsync -ai` lists the file.
- atime: utime keeps atime apart from mtime (also across a remount);
  reads move it by relatime, as Linux mounts ext4 by default; -o noatime.
- st_blocks counts the bytes a message's record takes in its m.N, so du
  of a compressed store matches du of its storage/.
- dboxadm export/import keep atime and mtime as cp -a does.
"""
import datetime
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import DBOXADM, index_rows
from maildir_tools import need

G = 10**9
DAY = 24 * 3600 * G


def on_ext4(path):
    out = subprocess.run(["stat", "-f", "-c", "%T", str(path)],
                         capture_output=True, text=True).stdout.strip()
    return out in ("ext2/ext3", "ext4")


@pytest.fixture
def ext4(tmp_path):
    """A maildir on ext4 (the reference), next to the mount's store."""
    root = tmp_path / "ext4"
    if not on_ext4(tmp_path):
        pytest.skip(f"{tmp_path} is not on ext4")
    for sub in ("cur", "new", "tmp"):
        (root / sub).mkdir(parents=True)
    return root


def write(path, data, mode="wb"):
    with open(path, mode) as f:
        f.write(data)


def times(path):
    st = os.stat(path)
    return st.st_atime_ns, st.st_mtime_ns


def now_window():
    """(lo, hi) for 'the current time': a margin of a second on each side
    (ext4 takes the time from a coarse clock, a tick behind)."""
    return time.time_ns() - G, time.time_ns() + G


def is_now(t, lo, hi):
    return lo <= t <= hi + 2 * G


def setup_tree(root):
    """A committed message in cur/, a plain file, a subdirectory."""
    write(root / "tmp" / "m", b"Subject: t\n\n" + b"hello world\n" * 40)
    os.rename(root / "tmp" / "m", root / "cur" / "m:2,S")
    write(root / "dovecot-uidlist", b"3 V1 N2\n1 m\n")
    (root / "sub").mkdir()
    return [root / "cur" / "m:2,S", root / "dovecot-uidlist", root / "sub"]


# --- the whole range ------------------------------------------------------

RANGE_CASES = [
    (1 * G, 2 * G),                                  # distinct atime/mtime
    (253402300799 * G, 253402300799 * G),            # 9999-12-31
    (10413792000 * G + 7, 10413792000 * G + 9),      # 2300, with ns
    (-58979923200 * G, -58979923200 * G),            # year 101
    (-1, -1),                                        # -1 ns
    (-G - G // 2, -G - G // 2),                      # -1.5 s
    (15032385535 * G - 1, 15032385535 * G - 3),      # ext4's last ns
    (15032385535 * G + 5, 15032385536 * G),          # past it: clamped
    (-2147483648 * G + 5, -2147483647 * G + 5),      # ext4's first second
    (-2147483649 * G, -2147483648 * G - 1),          # before it: clamped
    (2**63 - 1, 9223372036 * G + 854775808),         # int64 ns end, past
]


def received_of(store, mnt_path):
    """The R date of the message's record, as `dboxadm dump` prints it."""
    ino = os.stat(mnt_path).st_ino
    (file_id, offset), = index_rows(
        store, f"SELECT file_id, offset FROM message WHERE ino = {ino}")
    out = subprocess.run([str(DBOXADM), "dump", str(store), f"m.{file_id}"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines()[1:]:
        fields = line.split("\t")
        if fields[0] == str(offset):
            return fields[3]
    raise AssertionError(f"no record at {offset} in m.{file_id}")


def iso(ns):
    sec = ns // G  # floor, as time_t holds it
    t = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=sec)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_utime_with_a_writer_open_redates_the_record_at_once(mount):
    """A utime() to a date of another R width (1970) while a writer still
    holds the message open (as when it comes right after a close() whose
    RELEASE has not reached the daemon yet): the index names a record
    with the new R when utime() returns, not only at the writer's close
    (a sanitizer run saw the old R: test_utime_whole_range_like_ext4).
    The writer's later write makes a copy of its own; the bytes are
    right after the close."""
    md = mount.maildir()
    path = md / "cur" / "m1:2,S"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"Subject: r\n\nfirst\n")
        os.fsync(fd)  # committed: the R path makes a copy
        os.utime(path, ns=(G, 2 * G))
        assert received_of(mount.store, path) == "1970-01-01T00:00:02Z"
        os.write(fd, b"more\n")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"Subject: r\n\nfirst\nmore\n"
    mount.remount()
    assert path.read_bytes() == b"Subject: r\n\nfirst\nmore\n"


def test_utime_whole_range_like_ext4(mount, ext4):
    ref = setup_tree(ext4)
    got = setup_tree(mount.mnt)
    want = []
    for atime, mtime in RANGE_CASES:
        for r, g in zip(ref, got):
            os.utime(r, ns=(atime, mtime))
            os.utime(g, ns=(atime, mtime))
            assert times(g) == times(r), (g.name, atime, mtime)
        # The record's received date follows the mtime (a new record when
        # its R has another width: no silent ERANGE).
        assert received_of(mount.store, got[0]) == iso(times(ref[0])[1]), \
            (atime, mtime)
        want.append([times(r) for r in ref])
    # Kept exactly across a remount (the last case, and each on its own
    # message).
    mount.remount()
    assert [times(g) for g in got] == want[-1]
    for i, (atime, mtime) in enumerate(RANGE_CASES):
        write(mount.mnt / "cur" / f"r{i}:2,", b"x\n")
        os.utime(mount.mnt / "cur" / f"r{i}:2,", ns=(atime, mtime))
    mount.remount()
    for i in range(len(RANGE_CASES)):
        assert times(mount.mnt / "cur" / f"r{i}:2,") == want[i][0], i
    # The message's bytes are untouched by any of it.
    assert got[0].read_bytes() == ref[0].read_bytes()


# --- directories: now, also after a future mtime --------------------------

NOTMUCH_CONFIG = """[database]
path={root}
[new]
tags=unread;inbox;
ignore=
"""


def notmuch(root, cfg, *args):
    r = subprocess.run(["notmuch", *args], capture_output=True, timeout=120,
                       env={**os.environ, "NOTMUCH_CONFIG": str(cfg)})
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout.decode().strip()


def deliver(root, name):
    write(root / "tmp" / name,
          b"From: a@example.org\nSubject: %s\nMessage-ID: <%s@example.org>\n"
          b"\nbody\n" % (name.encode(), name.encode()))
    os.rename(root / "tmp" / name, root / "new" / name)


def dir_steps(root, cfg):
    """The issue's steps: new/ touched into the future, notmuch new,
    a delivery, notmuch new again.  Returns what each side saw."""
    Path(cfg).write_text(NOTMUCH_CONFIG.format(root=root))
    deliver(root, "m1")
    future = time.time_ns() + 3600 * G
    os.utime(root / "new", ns=(future, future))
    notmuch(root, cfg, "new")
    first = notmuch(root, cfg, "count", "*")
    lo, hi = now_window()
    deliver(root, "m2")
    st = os.stat(root / "new")
    dir_now = is_now(st.st_mtime_ns, lo, hi) and is_now(st.st_ctime_ns, lo, hi)
    # The other changes of a directory: link, unlink, rename, mkdir, rmdir.
    others = []
    for op in ("link", "unlink", "rename", "mkdir", "rmdir", "create"):
        os.utime(root / "cur", ns=(future, future))
        lo, hi = now_window()
        if op == "link":
            os.link(root / "new" / "m2", root / "cur" / "l")
        elif op == "unlink":
            os.unlink(root / "cur" / "l")
        elif op == "rename":
            os.rename(root / "new" / "m1", root / "cur" / "m1:2,")
        elif op == "mkdir":
            os.mkdir(root / "cur" / "d")
        elif op == "rmdir":
            os.rmdir(root / "cur" / "d")
        else:
            write(root / "cur" / ".state", b"x")
        st = os.stat(root / "cur")
        others.append((op, is_now(st.st_mtime_ns, lo, hi),
                       is_now(st.st_ctime_ns, lo, hi)))
    notmuch(root, cfg, "new")
    second = notmuch(root, cfg, "count", "*")
    return first, dir_now, second, others


def test_dir_mtime_is_now_like_ext4(mount, ext4, tmp_path):
    need("notmuch")
    mount.maildir()
    ref = dir_steps(ext4, tmp_path / "ext4.notmuch-config")
    got = dir_steps(mount.mnt, tmp_path / "mnt.notmuch-config")
    assert ref == ("1", True, "2", [(op, True, True) for op in
                                    ("link", "unlink", "rename", "mkdir",
                                     "rmdir", "create")])
    assert got == ref


# --- writes: mtime = ctime = now -----------------------------------------

def overwrite(path):
    with open(path, "r+b") as f:
        f.seek(12)
        f.write(b"HELO")


def append(path):
    write(path, b"appended\n", "ab")


def ftruncate_shorter(path):
    with open(path, "r+b") as f:
        os.ftruncate(f.fileno(), os.fstat(f.fileno()).st_size - 1)


def ftruncate_same(path):
    with open(path, "r+b") as f:
        os.ftruncate(f.fileno(), os.fstat(f.fileno()).st_size)


def otrunc_rewrite(path):
    write(path, b"Subject: t\n\nrewritten\n")


def otrunc_read_only(path):
    # Linux truncates at O_TRUNC even for O_RDONLY; ext4 stamps the times
    # (a message's stayed: helper-78).  Last: it leaves the file empty.
    os.close(os.open(path, os.O_RDONLY | os.O_TRUNC))


WRITES = [overwrite, append, ftruncate_shorter, ftruncate_same, otrunc_rewrite,
          otrunc_read_only]


def write_steps(root, files):
    """Each write after an old utime: are mtime and ctime now?"""
    seen = []
    for path in files:
        for op in WRITES:
            os.utime(path, ns=(G, G))
            lo, hi = now_window()
            op(path)
            st = os.stat(path)
            seen.append((path.name, op.__name__, is_now(st.st_mtime_ns, lo, hi),
                         is_now(st.st_ctime_ns, lo, hi)))
    return seen


def test_writes_set_mtime_ctime_now_like_ext4(mount, ext4):
    ref = write_steps(ext4, setup_tree(ext4)[:2])
    got = write_steps(mount.mnt, setup_tree(mount.mnt)[:2])
    assert all(r[2] and r[3] for r in ref), ref
    assert got == ref
    # And they stay after a remount (the message's mtime is stored).
    st = os.stat(mount.mnt / "cur" / "m:2,S")
    mount.remount()
    assert os.stat(mount.mnt / "cur" / "m:2,S").st_mtime_ns == st.st_mtime_ns


def writer_link_steps(root):
    """link() and rename() of a message whose writer is still open: does
    each move its ctime, and does the close keep it?"""
    p = root / "cur" / "w:2,S"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        os.write(fd, b"Subject: w\n\nstill being written\n")
        c0 = os.stat(p).st_ctime_ns
        time.sleep(0.05)
        os.link(p, root / "cur" / "w2:2,S")
        c1 = os.stat(p).st_ctime_ns
        time.sleep(0.05)
        os.rename(root / "cur" / "w2:2,S", root / "cur" / "w3:2,S")
        c2 = os.stat(p).st_ctime_ns
    finally:
        os.close(fd)
    c3 = os.stat(p).st_ctime_ns
    return c1 > c0, c2 > c1, c3 == c2


def test_link_of_a_message_being_written_moves_ctime_like_ext4(mount, ext4):
    """The time of a write not stored yet stood for the message's ctime
    too, so a link() or rename() meanwhile did not move it (helper-78's
    differential fuzzer)."""
    ref = writer_link_steps(ext4)
    assert all(ref), ref
    assert writer_link_steps(mount.mnt) == ref


def rsync_steps(root, dest):
    """rsync -a, overwrite 4 bytes of a message (same size), rsync -ai:
    the second run lists the message, and the copy has the new bytes."""
    write(root / "tmp" / "r", b"Subject: r\n\nold text\n")
    os.rename(root / "tmp" / "r", root / "cur" / "r:2,S")
    os.utime(root / "cur" / "r:2,S", ns=(G, G))
    subprocess.run(["rsync", "-a", f"{root}/", f"{dest}/"], check=True)
    with open(root / "cur" / "r:2,S", "r+b") as f:
        f.seek(12)
        f.write(b"new!")
    out = subprocess.run(["rsync", "-ai", f"{root}/", f"{dest}/"], check=True,
                         capture_output=True, text=True).stdout
    listed = [line.split(None, 1)[1] for line in out.splitlines()
              if line.startswith(">f")]
    return listed, (dest / "cur" / "r:2,S").read_bytes()


def test_rsync_second_pass_lists_written_message(mount, ext4, tmp_path):
    need("rsync")
    mount.maildir()
    ref = rsync_steps(ext4, tmp_path / "ext4-copy")
    got = rsync_steps(mount.mnt, tmp_path / "mnt-copy")
    assert ref == (["cur/r:2,S"], b"Subject: r\n\nnew!text\n")
    assert got == ref


# --- atime ----------------------------------------------------------------

def read(path):
    if path.is_dir():
        os.listdir(path)
    else:
        path.read_bytes()


def atime_steps(root, files):
    """utime keeps atime apart; reads move it by relatime."""
    seen = []
    for path in files:
        os.utime(path, ns=(1 * G, 2 * G))
        kept = times(path)
        lo, hi = now_window()
        read(path)                       # atime <= mtime: moves to now
        first = os.stat(path).st_atime_ns
        read(path)                       # atime > mtime, recent: stays
        second = os.stat(path).st_atime_ns
        now = time.time_ns()
        os.utime(path, ns=(now - 2 * DAY, now - 3 * DAY))
        lo2, hi2 = now_window()
        read(path)                       # a day old or more: moves
        third = os.stat(path).st_atime_ns
        seen.append((path.name, kept, is_now(first, lo, hi), second == first,
                     is_now(third, lo2, hi2)))
    return seen


def test_atime_relatime_like_ext4(mount, ext4):
    ref = atime_steps(ext4, setup_tree(ext4))
    got = atime_steps(mount.mnt, setup_tree(mount.mnt))
    assert all(r[1:] == ((G, 2 * G), True, True, True) for r in ref), ref
    assert got == ref


def test_atime_after_delivery_like_ext4(mount, ext4):
    """A message written through the mount (its bytes in the kernel's
    cache) and then read: atime > mtime, as zsh and mutt test for new
    mail."""
    def steps(root):
        deliver(root, "n")
        st = os.stat(root / "new" / "n")
        before = st.st_atime_ns <= st.st_mtime_ns
        read(root / "new" / "n")
        st = os.stat(root / "new" / "n")
        return before, st.st_atime_ns > st.st_mtime_ns
    mount.maildir()
    assert steps(ext4) == (True, True)
    assert steps(mount.mnt) == (True, True)


def test_utime_atime_survives_remount(mount):
    files = setup_tree(mount.mnt)
    for i, path in enumerate(files):
        os.utime(path, ns=(1 * G + i, 2 * G + i))
    mount.remount()
    for i, path in enumerate(files):
        assert times(path) == (1 * G + i, 2 * G + i), path.name


def test_noatime_option(make_mount, tmp_path):
    m = make_mount(options=["-o", "noatime"])
    with open("/proc/mounts") as f:
        opts = [line.split()[3] for line in f
                if line.split()[1] == str(m.mnt)]
    assert opts and "noatime" in opts[0].split(","), opts
    files = setup_tree(m.mnt)
    for path in files:
        os.utime(path, ns=(1 * G, 2 * G))
        read(path)
        read(path)
        assert times(path) == (1 * G, 2 * G), path.name


# --- space ----------------------------------------------------------------

def du_bytes(*paths):
    out = subprocess.run(["du", "-s", "-B1", "-c", *map(str, paths)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.splitlines()[-1].split()[0])


def test_du_counts_stored_bytes(make_mount):
    m = make_mount(options=["-o", "compress=gz"])
    md = m.maildir()
    words = [b"alpha", b"beta", b"gamma", b"delta", b"mail", b"store",
             b"folder", b"message", b"dovecot", b"maildir", b"index"]
    for i in range(400):
        body = b" ".join(words[(i * 7 + j * j) % len(words)] + b"%d" % (j % 97)
                         for j in range(900))
        write(md / "tmp" / f"m{i}", b"Subject: %d\n\n%s\n" % (i, body))
        os.rename(md / "tmp" / f"m{i}", md / "cur" / f"m{i}:2,S")
    write(m.mnt / "dovecot.index.log", os.urandom(20000))
    mnt = du_bytes(m.mnt)
    store = du_bytes(m.store / "storage", m.store / "files")
    plain = sum(os.stat(md / "cur" / f"m{i}:2,S").st_size for i in range(400))
    assert store < plain / 2  # compressed, so plaintext sizes would not do
    assert abs(mnt - store) <= store * 0.05, (mnt, store)


# --- dboxadm export / import ---------------------------------------------

def test_export_import_keep_times_like_cp_a(mount, ext4, tmp_path):
    def tree(root):
        files = setup_tree(root)
        stamps = [(1 * G + 5, 10413792000 * G + 7), (3 * G, -G - G // 2),
                  (-1, 15032385535 * G - 1)]
        for path, (a, mt) in zip(files, stamps):
            os.utime(path, ns=(a, mt))
        return files

    def listing(root):
        # stat() only: a listing or a read would move atimes (relatime).
        return [times(root / name) for name in
                ("cur/m:2,S", "dovecot-uidlist", "sub")]
    tree(ext4)
    want = listing(ext4)
    subprocess.run(["cp", "-a", f"{ext4}/.", str(tmp_path / "cp")], check=True)
    assert listing(tmp_path / "cp") == want

    tree(mount.mnt)
    assert listing(mount.mnt) == want
    mount.unmount()
    out = tmp_path / "exported"
    subprocess.run([str(DBOXADM), "export", str(mount.store), str(out)],
                   check=True, capture_output=True)
    assert listing(out) == want
    store2 = tmp_path / "store2"
    subprocess.run([str(DBOXADM), "import", str(store2), str(out)],
                   check=True, capture_output=True)
    mount.store = store2
    mount.mount()
    assert listing(mount.mnt) == want


# --- Dovecot reads the received dates ------------------------------------

def test_dovecot_reads_received_dates_of_any_width(mount):
    """R of records whose mtime was set past 2106, before 1970 (with a
    fraction) and clamped from 9999: Dovecot (force-resync of a copy of
    storage/) reads date.received as the mount's mtime, in whole seconds
    rounded down as time_t holds them."""
    from dovecot_ctl import dovecot_instance, need_dovecot
    need_dovecot()
    import shutil
    md = mount.maildir()
    stamps = {"new2300": 10413792000 * G + 5, "neg": -G - G // 2,
              "y9999": 253402300799 * G, "y2001": 1000000000 * G,
              "y2446": 15032385535 * G - 1}
    for name, mtime in stamps.items():
        write(md / "tmp" / name, b"Subject: %s\n\n%s\n" % (name.encode(),
                                                           name.encode()))
        os.rename(md / "tmp" / name, md / "cur" / f"{name}:2,")
        # First a 2001 date (8 hex digits), then the one to test.
        os.utime(md / "cur" / f"{name}:2,", ns=(G, 1000000000 * G))
        os.utime(md / "cur" / f"{name}:2,", ns=(G, mtime))
    want = {name.encode(): os.stat(md / "cur" / f"{name}:2,").st_mtime_ns // G
            for name in stamps}
    assert want[b"y9999"] == 15032385535 and want[b"neg"] == -2
    mount.unmount()
    with dovecot_instance() as dc:
        dest = dc.mdbox / "storage"
        dest.mkdir()
        for f in sorted((mount.store / "storage").glob("m.*")):
            shutil.copy2(f, dest / f.name)
        dc.chown_store()
        dc.force_resync()
        got = dc.fetch("date.received.unixtime text", "mailbox", "*", "all")
    # force-resync also restores the records the new ones replaced; the
    # mailbox's copy is the one with the latest record.
    # doveadm prints the time_t through an unsigned conversion (dec2str):
    # -2 shows as 2^64 - 2.
    seen = {}
    for g in got:
        name = g["text"].split(b"\n\n", 1)[1].strip()
        sec = int(g["date.received.unixtime"])
        seen.setdefault(name, set()).add(sec - 2**64 if sec >= 2**63 else sec)
    for name, sec in want.items():
        assert sec in seen[name], (name, sec, seen[name])


def mu_steps(root, muhome):
    """mu index, a word of a committed message overwritten in place (same
    size), mu index again: mu finds the new word only if the write moved
    the message's mtime."""
    write(root / "tmp" / "w", b"From: a@example.org\nSubject: words\n"
          b"Message-ID: <w@example.org>\n\nzebra giraffe\n")
    os.rename(root / "tmp" / "w", root / "cur" / "w:2,S")
    os.utime(root / "cur" / "w:2,S", ns=(G, G))
    env = {**os.environ, "HOME": str(muhome)}

    def mu(*args, ok=(0,)):
        r = subprocess.run(["mu", *args, f"--muhome={muhome}"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode in ok, (args, r.stdout, r.stderr)
        return r
    mu("init", f"--maildir={root}")
    mu("index")
    # mu compares the file's time with its last index run in whole
    # seconds: the write goes in a later second.
    time.sleep(1.1)
    data = (root / "cur" / "w:2,S").read_bytes()
    with open(root / "cur" / "w:2,S", "r+b") as f:
        f.seek(data.index(b"zebra"))
        f.write(b"okapi")
    mu("index")
    # mu find exits 2 (or 4 in some versions) when nothing matches.
    return [mu("find", word, ok=(0, 2, 4)).returncode == 0
            for word in ("okapi", "zebra")]


def test_mu_finds_overwritten_word(mount, ext4, tmp_path):
    need("mu")
    mount.maildir()
    ref = mu_steps(ext4, tmp_path / "mu-ext4")
    got = mu_steps(mount.mnt, tmp_path / "mu-mnt")
    assert ref == [True, False]
    assert got == ref


def test_rebuild_keeps_times(mount):
    """dboxadm rebuild keeps what the old index knew: atime apart from
    mtime, times past 2262 and before 1970."""
    files = setup_tree(mount.mnt)
    stamps = [(1 * G + 5, 10413792000 * G + 7), (3 * G, -G - G // 2),
              (-1, 15032385535 * G - 1)]
    for path, (a, mt) in zip(files, stamps):
        os.utime(path, ns=(a, mt))
    want = [times(p) for p in files]
    assert want == stamps
    mount.unmount()
    subprocess.run([str(DBOXADM), "rebuild", str(mount.store)], check=True,
                   capture_output=True)
    mount.mount()
    assert [times(p) for p in files] == want
