"""Alternate storage (Dovecot's mdbox ALT=): dboxfs -o alt=PATH and
dboxadm altmove, on real mounts.

Messages are written through the mount with received dates old and new;
altmove copies the old ones into m.N files under ALT/storage/ and switches
the index, and the mount must read every message byte for byte wherever it
lives, with the same name, inode, size and mtime - also while clients
deliver, rename and expunge, and after altmove was SIGKILLed at any point.
A missing ALT gives EIO for its messages only.  Dovecot's force-resync on
a copy of storage/ + ALT/storage/ finds every message.
"""
import errno
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import threading
import time

import pytest

from conftest import DBOXADM, index_rows, need_corpora, preload_shim, tmpfs
from dovecot_mdbox import Mdbox, dovecot_tmp  # noqa: F401

ROTATE = "rotate_size=16384"
OLD_NS = 1_500_000_000_000_000_000   # 2017: older than any --older-than


def adm(*args, check_rc=None, timeout=300):
    r = subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                       timeout=timeout)
    if check_rc is not None:
        assert r.returncode == check_rc, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    return r


def corpus(count):
    """count distinct messages: the lkml corpus, repeated with a header
    line that makes each copy unique."""
    mails = sorted((need_corpora() / "notmuch-lkml" / "cur").iterdir())
    out = []
    for i in range(count):
        out.append(b"X-Copy: %d\n" % i + mails[i % len(mails)].read_bytes())
    return out


def fill(cur, count, old_every=2, prefix="m"):
    """Write count messages into cur; every old_every-th gets an old
    received date (the rest: now).  Returns name -> bytes, and the set of
    old names."""
    data, old = {}, set()
    for i, body in enumerate(corpus(count)):
        name = f"{1600000000 + i}.{prefix}{i}.test:2,S"
        (cur / name).write_bytes(body)
        if i % old_every == 0:
            os.utime(cur / name, ns=(OLD_NS + i * 10**9,) * 2)
            old.add(name)
        data[name] = body
    return data, old


def altmoved(tmp_path, make_mount, count=6):
    """A store (tmp_path/store, mounted once on tmp_path/mnt, small m.N)
    with count messages in cur/, then altmoved offline to tmp_path/alt
    (made here): (store, alt, the unmounted Mount, data, old) as fill()
    gives them."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    data, old = fill(m.mnt / "cur", count)
    m.unmount()
    adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)
    return store, alt, m, data, old


def where(store):
    """name -> (file_id, alt) of every message name."""
    rows = index_rows(store, "SELECT e.name, m.file_id, f.alt FROM entry e"
                             " JOIN message m ON m.ino = e.ino"
                             " JOIN mfile f ON f.file_id = m.file_id")
    return {n.decode(): (fid, bool(alt)) for n, fid, alt in rows}


def attrs(cur, names):
    out = {}
    for n in names:
        st = os.stat(cur / n)
        out[n] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_nlink)
    return out


def check_store(store, data, alt):
    """Every message of data present exactly once in the index, and no m.N
    on disk outside the index (nothing doubled); dboxadm check agrees."""
    rows = index_rows(store, "SELECT e.name FROM entry e JOIN message m"
                             " ON m.ino = e.ino")
    names = sorted(n.decode() for (n,) in rows)
    assert names == sorted(data)
    files = {fid: bool(a) for fid, a in index_rows(store, "SELECT file_id, alt FROM mfile")}
    for fid, in_alt in files.items():
        d = (alt if in_alt else store) / "storage"
        assert (d / f"m.{fid}").exists(), (fid, in_alt)
    adm("check", store, check_rc=0)


def test_dump_of_alt_mfile_stops_at_committed_end(tmp_path, make_mount):
    """dump of an m.N in ALT stops at the committed end the index records,
    as it does for one in storage/: bytes after it (a crash's leftovers)
    are counted in a warning, not listed nor taken for a corrupt record.
    The same bytes as a file outside the store are walked to the end."""
    store, alt, m, _, _ = altmoved(tmp_path, make_mount)
    fid = next(f for f, a in where(store).values() if a)
    mfile = alt / "storage" / f"m.{fid}"
    before = adm("dump", store, f"m.{fid}", check_rc=0).stdout
    [(records,)] = index_rows(store, f"SELECT count(*) FROM message WHERE file_id = {fid}")
    assert len(before.splitlines()) == 1 + records
    with open(mfile, "ab") as f:
        f.write(b"\0" * 100 + b"junk")
    r = adm("dump", store, f"m.{fid}", check_rc=0)
    assert r.stdout == before
    assert b"104 bytes after the committed end" in r.stderr
    assert b"corrupt" not in r.stderr
    # Messages name the file where it is, in ALT (dump and cat).
    assert f"{mfile}: ".encode() in r.stderr, r.stderr
    assert f"{store}/storage/m.{fid}".encode() not in r.stderr, r.stderr
    r = adm("cat", store, f"m.{fid}", 1, check_rc=1)
    assert f"{mfile}: offset 1: ".encode() in r.stderr, r.stderr
    assert f"{store}/storage/m.{fid}".encode() not in r.stderr, r.stderr
    # Past the end is said as such, not as a damaged header (helper-85).
    size = mfile.stat().st_size
    r = adm("cat", store, f"m.{fid}", size + 10**6, check_rc=1)
    assert r.stderr.decode() == (f"dboxadm: {mfile}: offset {size + 10**6} is past the end "
                                 f"of the file ({size} bytes; dboxadm dump lists its records)\n")
    copy = tmp_path / "copy-of-mfile"
    shutil.copy(mfile, copy)
    r = adm("dump", store, copy, check_rc=1)
    assert b"corrupt record" in r.stderr
    assert r.stdout == before


def test_altmove_offline_then_reads(tmp_path, make_mount):
    """Offline altmove --older-than: old messages go to ALT, the rest
    stays; the mount reads all of them (ALT remembered from the store),
    names, inodes, sizes, mtimes and the hard link unchanged."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    cur = m.mnt / "cur"
    data, old = fill(cur, 60)
    lists = m.maildir(".Lists") / "cur"
    linked = sorted(old)[0]
    os.link(cur / linked, lists / linked)
    before = attrs(cur, sorted(data))
    m.unmount()

    r = adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)
    assert b"records moved       30" in r.stdout
    w = where(store)
    assert {n for n, (_, a) in w.items() if a} == old | {linked}
    assert all(not a for n, (_, a) in w.items() if n not in old)
    assert list((alt / "storage").glob("m.*"))
    adm("check", store, check_rc=0)
    # dump and cat find an m.N in ALT too.
    fid = w[linked][0]
    r = adm("dump", store, f"m.{fid}", check_rc=0)
    assert r.stdout
    off = dict((n.decode(), o) for n, o in index_rows(
        store, "SELECT e.name, m.offset FROM message m JOIN entry e ON e.ino = m.ino"))[linked]
    assert adm("cat", store, f"m.{fid}", off, check_rc=0).stdout == data[linked]

    m.mount()   # no -o alt: the store recorded it
    assert attrs(cur, sorted(data)) == before
    for n, body in data.items():
        assert (cur / n).read_bytes() == body
    assert (lists / linked).read_bytes() == data[linked]
    assert os.stat(lists / linked).st_ino == before[linked][0]
    # New mail still goes to STORE/storage.
    (cur / "new.1:2,").write_bytes(b"Subject: new\n\nnew\n")
    m.unmount()
    assert not where(store)["new.1:2,"][1]
    # A second run finds nothing more to move.
    r = adm("altmove", store, "--older-than", "30", check_rc=0)
    assert b"records moved       0" in r.stdout
    # Expunged from ALT: purge gives the bytes back there, and what stays
    # in ALT stays in ALT.
    m.mount()
    gone = sorted(old)[1:4]
    for n in gone:
        os.unlink(cur / n)
        del data[n]
    m.unmount()
    alt_before = {p.name for p in (alt / "storage").glob("m.*")}
    adm("purge", store, check_rc=0)
    st = json.loads(adm("stats", store, "--json", check_rc=0).stdout)
    assert st["dead_bytes"] == 0
    assert {p.name for p in (alt / "storage").glob("m.*")} != alt_before
    w = where(store)
    assert {n for n, (_, a) in w.items() if a} == (old | {linked}) - set(gone)
    m.mount()
    for n, body in data.items():
        assert (cur / n).read_bytes() == body
    m.unmount()
    adm("check", store, check_rc=0)


def test_altmove_summary_is_the_same_mounted_and_offline(tmp_path, make_mount):
    """Two copies of one store, one altmoved offline, one by its mount:
    both say the same records moved and files emptied, with the bytes
    those files held (the mount's said 0 bytes, and neither counted an
    emptied file of the append pool: helper-54)."""
    import re
    store = tmp_path / "store"
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    fill(m.mnt / "cur", 30, old_every=1)  # every message old: all move
    m.unmount()
    shutil.copytree(store, tmp_path / "copy", symlinks=True)
    said = {}
    for how in ("offline", "mounted"):
        alt = tmp_path / f"alt-{how}"
        alt.mkdir()
        if how == "offline":
            r = adm("altmove", store, "--older-than", "30", f"--alt={alt}",
                    check_rc=0)
            on_disk = store / "storage"
        else:
            c = make_mount(store=tmp_path / "copy", mnt=tmp_path / "mnt2",
                           options=["-o", f"{ROTATE},alt={alt}"])
            r = adm("altmove", c.store, "--older-than", "30", check_rc=0)
            c.unmount()
            on_disk = c.store / "storage"
        assert list(on_disk.glob("m.*")) == [], how
        out = r.stdout.decode()
        said[how] = re.search(r"records moved +(\d+) \((\d+) bytes\)\n"
                              r"files emptied +(\d+) \((\d+) bytes", out).groups()
    assert said["offline"] == said["mounted"], said
    records, _, files, freed = map(int, said["offline"])
    assert records == 30 and files > 1 and freed > 0, said


@pytest.mark.parametrize("how", ["offline", "mounted"])
def test_altmove_says_what_its_purge_removed(tmp_path, make_mount, how):
    """Half the messages old: the move leaves its sources partly dead and
    the purge after it removes them; the summary said 'files emptied 0'
    and nothing of the removed files (helper-85), and the mount's said
    nothing of them until helper-90.  Now a line counts them, and every
    source m.N it names is gone from storage/."""
    import re
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    data, old = fill(m.mnt / "cur", 30, old_every=2)
    m.unmount()
    before = {p.name for p in (store / "storage").glob("m.*")}
    if how == "offline":
        r = adm("altmove", store, "--older-than", "30", f"--alt={alt}",
                check_rc=0)
    else:
        m.options = ["-o", f"{ROTATE},alt={alt},purge_threshold=0"]
        m.mount()
        r = adm("altmove", store, "--older-than", "30", check_rc=0)
        m.unmount()
    out = r.stdout.decode()
    purged = re.search(r"files purged after +(\d+) \((\d+) bytes removed, (\d+) bytes", out)
    assert purged, out
    files, removed, copied = map(int, purged.groups())
    gone = before - {p.name for p in (store / "storage").glob("m.*")}
    emptied = int(re.search(r"files emptied +(\d+)", out).group(1))
    assert files > 0 and removed > copied > 0, out
    assert len(gone) == files + emptied, (out, before, gone)
    m.mount()
    assert {n: (m.mnt / "cur" / n).read_bytes() for n in data} == data
    m.unmount()
    adm("check", store, check_rc=0)


def test_altmove_folder(tmp_path, make_mount):
    """--folder moves the messages with a name in that folder only."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", ROTATE + f",alt={alt}"])
    inbox, _ = fill(m.mnt / "cur", 10, old_every=1)
    arch, _ = fill(m.maildir(".Archive") / "cur", 10, old_every=1, prefix="a")
    r = adm("altmove", store, "--folder", ".Archive", check_rc=0)
    assert b"records moved       10" in r.stdout
    w = where(store)
    assert all(w[n][1] for n in arch) and not any(w[n][1] for n in inbox)
    for n, body in arch.items():
        assert (m.mnt / ".Archive" / "cur" / n).read_bytes() == body
    adm("altmove", store, "--folder", ".Nope", check_rc=2)
    # The mailbox name stats shows works too ("Lists/Käse" is the
    # Maildir++ folder .Lists.K&AOQ-se).
    lists, _ = fill(m.maildir(".Lists.K&AOQ-se") / "cur", 5, old_every=1,
                    prefix="l")
    folders = json.loads(adm("stats", "--json", store, check_rc=0).stdout)["folders"]
    assert "Lists/Käse" in folders, folders
    r = adm("altmove", store, "--folder", "Lists/Käse", check_rc=0)
    assert b"records moved       5" in r.stdout, r.stdout
    w = where(store)
    assert all(w[n][1] for n in lists) and not any(w[n][1] for n in inbox)
    adm("altmove", store, "--folder", "Nope", check_rc=2)
    # A folder a client named in UTF-8 (".Lists.Käse" beside the modified
    # UTF-7 one): stats shows both as stored, and --folder takes each by
    # that name (it took the other folder's mail: helper-56).
    raw, _ = fill(m.maildir(".Lists.Käse") / "cur", 2, old_every=1, prefix="r")
    folders = json.loads(adm("stats", "--json", store, check_rc=0).stdout)["folders"]
    assert folders.get("Lists/Käse") == 2 and "Lists/K&AOQ-se" in folders, folders
    r = adm("altmove", store, "--folder", "Lists/Käse", check_rc=0)
    assert b"records moved       2" in r.stdout, r.stdout
    w = where(store)
    assert all(w[n][1] for n in raw)


def test_altmove_beside_a_message_being_written(tmp_path, make_mount):
    """altmove asked of the mount while a client is writing a message into
    the same m.N (open in tmp/): the committed messages move to ALT, and
    the writer's message ends up whole with every byte it wrote, before
    and after the move."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", f"alt={alt}"])
    data, _ = fill(m.mnt / "cur", 6, old_every=1)
    half = b"Subject: half\n\n" + b"still being written\n" * 20000
    fd = os.open(m.mnt / "tmp" / "writing.host", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, half)
        size = os.fstat(fd).st_size
        assert sum(e.stat().st_size for e in os.scandir(store / "storage")) > size
        adm("altmove", store, "--folder", "INBOX", check_rc=0)
        os.write(fd, b"the end\n")
    finally:
        os.close(fd)
    w = where(store)
    assert all(w[n][1] for n in data)
    for n, body in data.items():
        assert (m.mnt / "cur" / n).read_bytes() == body
    assert (m.mnt / "tmp" / "writing.host").read_bytes() == half + b"the end\n"
    m.unmount()
    adm("check", store, check_rc=0)


def test_altmove_online_under_load(tmp_path, make_mount):
    """altmove asked of the mount while a client delivers (tmp -> new ->
    cur), renames (flags) and expunges: afterwards the mount holds exactly
    what the client did, byte for byte, and old messages are in ALT."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", ROTATE + f",alt={alt},purge_threshold=0"])
    cur, new, tmp = m.mnt / "cur", m.mnt / "new", m.mnt / "tmp"
    data, old = fill(cur, 120)
    bodies = corpus(400)
    model = dict(data)     # name -> bytes, what the client expects
    errors, stop, ops = [], threading.Event(), [0]
    rnd = random.Random(15)

    def client():
        i = 0
        try:
            while not stop.is_set():
                i += 1
                # deliver
                name = f"{1700000000 + i}.load{i}.test"
                (tmp / name).write_bytes(bodies[i % 400] + b"load %d\n" % i)
                os.rename(tmp / name, new / name)
                model[name] = bodies[i % 400] + b"load %d\n" % i
                os.rename(new / name, cur / (name + ":2,"))
                model[name + ":2,"] = model.pop(name)
                if i % 2:   # old mail arriving late: the next altmove takes it
                    os.utime(cur / (name + ":2,"), ns=(OLD_NS, OLD_NS))
                    old.add(name + ":2,")
                ops[0] += 1
                names = sorted(model)
                # rename one (a flag change), expunge one
                n = rnd.choice(names)
                os.rename(cur / n, cur / (n + "F"))
                model[n + "F"] = model.pop(n)
                if i % 3 == 0:
                    n = rnd.choice(sorted(model))
                    os.unlink(cur / n)
                    del model[n]
                # read one
                n = rnd.choice(sorted(model))
                if (cur / n).read_bytes() != model[n]:
                    errors.append(n)
        except OSError as e:
            errors.append(repr(e))

    t = threading.Thread(target=client)
    t.start()
    try:
        for _ in range(5):
            r = adm("altmove", store, "--older-than", "30", check_rc=0)
            assert b"moved by the mount" in r.stdout
        # At least one more run after the client got going.
        while ops[0] < 20 and not errors:
            time.sleep(0.05)
        adm("altmove", store, "--older-than", "30", check_rc=0)
    finally:
        stop.set()
        t.join()
    assert errors == []
    # The mount wrote its progress for dboxadm's progress line.
    meta = dict(index_rows(store, "SELECT key, value FROM meta WHERE key LIKE 'altmove%'"))
    assert meta["altmove_progress_request_ns"] > 0
    assert meta["altmove_progress_records"] > 0
    assert sorted(os.listdir(cur)) == sorted(model)
    for n, body in model.items():
        assert (cur / n).read_bytes() == body
    # Every old message still there is in ALT now.
    w = where(store)
    old_left = [n for n in model if n.rstrip("F") in old]
    moved = [n for n in old_left if w[n][1]]
    # Everything old before the last run is in ALT; a message delivered
    # during it may not be yet.
    assert len(moved) > len(data) // 4
    assert all(w[n][1] for n in old_left if n in data or n.rstrip("F") in data)
    m.remount()
    for n, body in model.items():
        assert (cur / n).read_bytes() == body
    m.unmount()
    check_store(store, model, alt)


def test_altmove_killed_midway(tmp_path, make_mount):
    """SIGKILL of an offline altmove at random points, then of the mount
    during an online one; each rerun goes on, and in the end every message
    is there once, byte for byte, and in ALT."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", "rotate_size=4096"])
    cur = m.mnt / "cur"
    data, old = fill(cur, 600, old_every=1)
    m.unmount()
    rnd = random.Random(1515)
    # How long a whole run takes, on a copy: kills fall inside it.
    shutil.copytree(store, tmp_path / "copy")
    (tmp_path / "copy-alt").mkdir()
    t0 = time.monotonic()
    adm("altmove", tmp_path / "copy", "--older-than", "1",
        f"--alt={tmp_path / 'copy-alt'}", check_rc=0)
    span = time.monotonic() - t0
    shutil.copytree(store, tmp_path / "pristine")
    # scale shrinks each time a run ends before its kill: a span measured
    # while the machine was busier (a CI suite) made all 100 runs finish
    # first (kills 0).
    kills, midway, remaining, scale = 0, 0, 1.0, 1.0
    for attempt in range(100):
        p = subprocess.Popen([str(DBOXADM), "altmove", str(store), "--older-than", "1",
                              f"--alt={alt}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rnd.uniform(0.05, 0.6) * span * remaining * scale)
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            kills += 1
        p.communicate()
        check_store(store, data, alt)
        in_alt = sum(a for _, a in where(store).values())
        midway += 0 < in_alt < len(data)
        remaining = max(1 - in_alt / len(data), 0.2)
        if kills >= 6:
            break
        if p.returncode == 0:
            # Finished before the kill: start over from the same store.
            # The whole ALT goes: its mark names the finished store, and
            # an ALT left with it is refused as not empty (a loaded
            # machine, where a run finished after some kills).
            scale *= 0.7
            shutil.rmtree(store)
            shutil.rmtree(alt)
            alt.mkdir()
            shutil.copytree(tmp_path / "pristine", store)
            remaining = 1.0
    assert kills >= 6 and midway >= 3, (kills, midway)
    check_store(store, data, alt)
    moved = where(store)
    # Finish, then every message is in ALT (the path given again: a
    # kill may have come before the first run recorded it).
    adm("altmove", store, "--older-than", "1", f"--alt={alt}", check_rc=0)
    moved = where(store)
    assert all(a for _, a in moved.values())
    m.mount()
    for n, body in data.items():
        assert (cur / n).read_bytes() == body
    m.unmount()

    # Online: the mount does the copying; kill it in the middle.  The
    # ALT moves first, as an admin moving its disk would: every m.N
    # copied over, then the new path given.
    (tmp_path / "alt2").mkdir()
    shutil.copytree(alt / "storage", tmp_path / "alt2" / "storage")
    m.options = ["-o", f"rotate_size=4096,alt={tmp_path / 'alt2'}"]
    m.mount()
    assert f"alternate storage changed from {alt} to {tmp_path / 'alt2'}" in m.log_text()
    m.options = ["-o", "rotate_size=4096"]   # the new one is recorded
    data2, _ = fill(cur, 150, old_every=1, prefix="b")
    data.update(data2)
    m.unmount()
    alt = tmp_path / "alt2"
    midway, limit = 0, 0.3
    for attempt in range(40):
        m.mount()
        if all(a for _, a in where(store).values()):
            more, _ = fill(cur, 150, old_every=1, prefix=f"c{attempt}.")
            data.update(more)
        before = sum(a for _, a in where(store).values())
        p = subprocess.Popen([str(DBOXADM), "altmove", str(store), "--older-than", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(rnd.uniform(0.02, limit))
        m.kill()
        p.communicate()
        check_store(store, data, alt)
        in_alt = sum(a for _, a in where(store).values())
        if in_alt == len(data):
            limit /= 2
        midway += before < in_alt < len(data)
        if midway >= 3:
            break
    assert midway >= 3
    m.mount()
    adm("altmove", store, "--older-than", "1", check_rc=0)
    for n, body in data.items():
        assert (cur / n).read_bytes() == body
    m.unmount()
    assert all(a for _, a in where(store).values())
    check_store(store, data, alt)


def store_with_old_mail_in_alt(tmp_path, make_mount, n):
    """n messages (fill), the old ones moved to tmp_path/alt by an offline
    altmove: (the mount, unmounted; alt; {name: bytes}; the old names)."""
    alt = tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=tmp_path / "store", mnt=tmp_path / "mnt",
                   options=["-o", ROTATE])
    data, old = fill(m.mnt / "cur", n)
    m.unmount()
    adm("altmove", m.store, "--older-than", "30", f"--alt={alt}", check_rc=0)
    return m, alt, data, old


def read_once_alt_is_back(path, body):
    """Read path (a message stored in ALT) until it gives body: EIO until
    the running mount tries its ALT again (every DBOX_ALT_RETRY_SECONDS,
    10) and finds it; fails after three of those."""
    deadline = time.monotonic() + 3 * 10
    while True:
        try:
            assert path.read_bytes() == body
            return
        except OSError as e:
            assert e.errno == errno.EIO
            assert time.monotonic() < deadline, "ALT never tried again"
            time.sleep(0.5)


def test_missing_alt_gives_eio_for_its_messages_only(tmp_path, make_mount):
    m, alt, data, old = store_with_old_mail_in_alt(tmp_path, make_mount, 20)
    store, cur = m.store, m.mnt / "cur"
    alt.rename(tmp_path / "alt.away")

    m.mount()
    # Listing complete, stat works.
    assert sorted(os.listdir(cur)) == sorted(data)
    for n, body in data.items():
        assert os.stat(cur / n).st_size == len(body)
        if n in old:
            with pytest.raises(OSError) as e:
                (cur / n).read_bytes()
            assert e.value.errno == errno.EIO
        else:
            assert (cur / n).read_bytes() == body
    log = m.log_text()
    assert f"{alt}/storage" in log, log[-3000:]
    # Said at the mount and at most once per try of the ALT (every 10 s),
    # not once per message read (117 lines for 67 messages: helper-54).
    said = log.count("not available")
    assert 1 <= said <= 3, log[-3000:]
    # check names the ALT's m.N by their ALT path, not as storage/m.N.
    in_alt = {fid for fid, a in where(store).values() if a}
    r = adm("check", store, check_rc=1)
    for fid in in_alt:
        assert f"{alt}/storage/m.{fid}".encode() in r.stdout, r.stdout
    assert f" storage/m.{min(in_alt)} ".encode() not in r.stdout, r.stdout
    # Its advice is to bring the ALT back, not a repair: a rebuild or
    # a backup's m.N are for bytes that are gone (helper-90).
    assert b"is not reachable: unreadable (EIO) until its storage is back" \
        in r.stdout, r.stdout
    assert b"make the storage named above reachable" in r.stdout, r.stdout
    assert b"rebuild" not in r.stdout and b"missing or damaged" not in r.stdout, \
        r.stdout
    # stats counts the ALT's m.N as not on disk (not as no file at all),
    # says why, and exits 1; with the ALT back, 0 and none missing.
    r = adm("stats", "--json", "--files", store, check_rc=1)
    s = json.loads(r.stdout)
    assert (s["missing_mfiles"], s["missing_alt_mfiles"], s["alt_mfiles"]) \
        == (len(in_alt), len(in_alt), 0), s
    # --files marks each ALT m.N, missing or not (helper-85: no marker).
    assert {int(f["file"][2:]) for f in s["files"] if f["alt"]} == in_alt, s
    assert s["missing_mfile_bytes"] > sum(len(data[n]) for n in old), s
    assert b"the alternate storage is not available" in r.stderr, r.stderr

    # Back in place (its disk mounted late): the running mount tries it
    # again and its messages read again (they stayed EIO until a remount).
    (tmp_path / "alt.away").rename(alt)
    first = sorted(old)[0]
    read_once_alt_is_back(cur / first, data[first])
    assert "the alternate storage is back" in m.log_text()
    for n, body in data.items():
        assert (cur / n).read_bytes() == body
    s = json.loads(adm("stats", "--json", "--files", store, check_rc=0).stdout)
    assert (s["missing_mfiles"], s["alt_mfiles"]) == (0, len(in_alt)), s
    assert {int(f["file"][2:]) for f in s["files"] if f["alt"]} == in_alt, s
    text = adm("stats", "--files", store, check_rc=0).stdout.decode()
    marked = {int(line.split()[0][2:]) for line in text.splitlines()
              if line.startswith("  m.") and line.rstrip().endswith("ALT")}
    assert marked == in_alt, text
    m.unmount()
    m.mount()
    for n, body in data.items():
        assert (cur / n).read_bytes() == body


def test_alt_mount_point_without_its_disk_is_no_alt(tmp_path, make_mount):
    """The ALT path as an empty directory - the disk's mount point, the
    disk not mounted yet at boot - is not the alternate storage: the mount
    made storage/ in it, took it, and never looked again, so the ALT's
    messages read EIO until a remount even once the disk was there
    (helper-53).  Now nothing is made in it, and the disk is used once it
    is mounted."""
    m, alt, data, old = store_with_old_mail_in_alt(tmp_path, make_mount, 12)
    cur = m.mnt / "cur"
    alt.rename(tmp_path / "alt.disk")
    alt.mkdir()  # the bare mount point
    m.mount()
    first = sorted(old)[0]
    with pytest.raises(OSError) as e:
        (cur / first).read_bytes()
    assert e.value.errno == errno.EIO
    assert os.listdir(alt) == [], "made something in the bare mount point"
    assert "alternate storage not available" in m.log_text()
    m.unmount()
    # An empty storage/ there (as the mount made one before): the same.
    (alt / "storage").mkdir()
    m.mount()
    with pytest.raises(OSError) as e:
        (cur / first).read_bytes()
    assert e.value.errno == errno.EIO
    assert os.listdir(alt / "storage") == []
    assert "not the alternate storage" in m.log_text()
    shutil.rmtree(alt)
    (tmp_path / "alt.disk").rename(alt)  # the disk mounted
    read_once_alt_is_back(cur / first, data[first])
    for n, body in data.items():
        assert (cur / n).read_bytes() == body


@pytest.fixture
def tiny_alt_fs(tmp_path):
    """A 1 MiB tmpfs for an ALT, unmounted in teardown."""
    yield from tmpfs(tmp_path / "altfs", "1m")


def test_alt_full_is_enospc_and_leaves_no_partial_copy(tmp_path, make_mount,
                                                       tiny_alt_fs):
    """An altmove that fills ALT says so (ENOSPC, not a bare EIO), on the
    mount and offline, loses nothing, and cuts the copy it was making at
    once: check finds no unfinished write in ALT afterwards."""
    alt = tiny_alt_fs / "alt"
    alt.mkdir(mode=0o700)
    store = tmp_path / "store"
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", f"{ROTATE},alt={alt}"])
    cur, rnd = m.mnt / "cur", random.Random(7)
    data = {}
    for i in range(40):   # some 2 MiB: twice what ALT holds
        body = b"Subject: %d\n\n" % i + rnd.randbytes(40000).hex().encode()
        name = f"{1600000000 + i}.full{i}.test:2,S"
        (cur / name).write_bytes(body)
        os.utime(cur / name, ns=(OLD_NS + i * 10**9,) * 2)
        data[name] = body

    r = adm("altmove", store, "--older-than", "30", check_rc=1)
    assert b"No space left on device" in r.stderr, r.stderr[-2000:]
    assert {n: (cur / n).read_bytes() for n in data} == data
    m.unmount()
    r = adm("check", store, check_rc=0)
    assert b"unfinished write" not in r.stdout + r.stderr, r.stdout[-2000:]

    r = adm("altmove", store, "--older-than", "30", check_rc=1)
    assert b"No space left on device" in r.stderr, r.stderr[-2000:]
    r = adm("check", store, check_rc=0)
    assert b"unfinished write" not in r.stdout + r.stderr, r.stdout[-2000:]
    m.mount()
    assert {n: (cur / n).read_bytes() for n in data} == data


def recorded_alt(store):
    return [v.decode() if isinstance(v, bytes) else v for (v,) in index_rows(
        store, "SELECT value FROM setting WHERE key = 'alt_path'")]


def test_refused_alt_is_not_recorded(tmp_path, make_mount):
    """A wrong --alt (missing, a typo, another owner's) or -o alt= changes
    nothing: the recorded ALT stays, and its messages go on reading."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    os.chown(other, 65534, 65534)
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    data, old = fill(m.mnt / "cur", 8)
    m.unmount()
    adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)
    assert recorded_alt(store) == [str(alt)]
    for wrong in (tmp_path / "alt-typo", other):
        r = adm("altmove", store, "--older-than", "0", f"--alt={wrong}",
                check_rc=2)
        err = r.stderr.decode()
        assert str(wrong) in err and f"keeps {alt}" in err, err
        assert recorded_alt(store) == [str(alt)]
    # A mount with a wrong -o alt= keeps (and uses) the recorded one.
    m.options += ["-o", f"alt={tmp_path / 'alt-typo'}"]
    m.mount()
    for n, body in data.items():
        assert (m.mnt / "cur" / n).read_bytes() == body
    log = m.log_text()
    assert str(tmp_path / "alt-typo") in log and f"keeps {alt}" in log, log
    m.unmount()
    assert recorded_alt(store) == [str(alt)]
    assert all(a for n, (_, a) in where(store).items() if n in old)


def test_logs_name_alt_files_by_the_alt_path(tmp_path, make_mount):
    """check and recovery name an m.N of the alternate storage as
    ALT/storage/m.N, not STORE/storage/m.N (which does not exist)."""
    store, alt, m, data, old = altmoved(tmp_path, make_mount)
    moved = sorted((alt / "storage").iterdir())[0]
    shutil.copyfile(moved, alt / "storage" / "m.99")
    r = adm("check", store, check_rc=1)
    assert f"{alt}/storage/m.99 is not in the index".encode() in r.stdout, r.stdout
    (alt / "storage" / "m.99").unlink()
    with open(moved, "ab") as f:
        f.write(b"unfinished bytes")
    m.mount()
    log = m.log_text()
    m.unmount()
    assert f"{moved}: cutting 16 bytes" in log, log
    assert f"{store}/storage/{moved.name}" not in log, log

    # A read that finds another record than the index knows (its GUID
    # changed in place) names the ALT file too.
    name = sorted(old)[0]
    fid, in_alt = where(store)[name]
    assert in_alt
    (guid, offset), = index_rows(store, "SELECT m.guid, m.offset FROM message m"
                                        " JOIN entry e ON e.ino = m.ino"
                                        f" WHERE e.name = CAST('{name}' AS BLOB)")
    path = alt / "storage" / f"m.{fid}"
    raw = bytearray(path.read_bytes())
    at = raw.index(guid.encode(), offset)
    raw[at] = ord("0") if raw[at] != ord("0") else ord("1")
    path.write_bytes(bytes(raw))
    m.mount()
    with pytest.raises(OSError) as e:
        (m.mnt / "cur" / name).read_bytes()
    assert e.value.errno == errno.EIO
    log = m.log_text()
    m.unmount()
    assert f"{path} offset {offset}: record has GUID" in log, log
    assert f"{store}/storage/m.{fid}" not in log, log


def test_rebuild_never_drops_alt_files_silently(tmp_path, make_mount):
    """rebuild without --alt, the old index knowing m.N in ALT but not
    (any more) its path: refused, saying how many and that --alt is
    needed; with --alt every message is back."""
    import sqlite3
    store, alt, m, data, old = altmoved(tmp_path, make_mount)
    n_alt = len(list((alt / "storage").iterdir()))
    assert n_alt > 0
    db = sqlite3.connect(store / "index.sqlite")
    db.execute("DELETE FROM setting WHERE key = 'alt_path'")
    db.commit()
    db.close()
    before = where(store)
    r = adm("rebuild", store, check_rc=2)
    err = r.stderr.decode()
    assert f"has {n_alt} m.N in the alternate storage" in err, err
    assert "--alt=PATH" in err, err
    assert where(store) == before
    adm("rebuild", store, f"--alt={alt}", check_rc=0)
    assert {n for n, (_, a) in where(store).items() if a} == old


def test_rebuild_without_index_reads_alt_from_the_kept_one(tmp_path, make_mount):
    """index.sqlite gone after a rebuild kept the one before it: the next
    rebuild reads names from that kept index, and its ALT path too (it
    rebuilt from storage/ alone, 'lost' every ALT message and exited 0).
    With that ALT away it refuses and changes nothing; messages of the
    old index with no record left (an m.N deleted) are named as lost."""
    store, alt, m, data, old = altmoved(tmp_path, make_mount)
    adm("rebuild", store, check_rc=0)
    before = where(store)
    assert {n for n, (_, a) in before.items() if a} == old
    (store / "index.sqlite").unlink()

    alt.rename(tmp_path / "alt.away")
    r = adm("rebuild", store, check_rc=2)
    assert str(alt).encode() in r.stderr, r.stderr
    assert not (store / "index.sqlite").exists()
    (tmp_path / "alt.away").rename(alt)

    r = adm("rebuild", store, check_rc=0)
    assert where(store) == before, r.stdout + r.stderr
    assert b"lost:" not in r.stdout, r.stdout
    m.mount()
    for n, body in data.items():
        assert (m.mnt / "cur" / n).read_bytes() == body
    m.unmount()

    # An m.N of storage/ deleted: its messages are lost, and said to be.
    gone = {n for n, (fid, a) in before.items() if not a and fid == min(
        f for f, a2 in before.values() if not a2)}
    fid = before[next(iter(gone))][0]
    (store / "storage" / f"m.{fid}").unlink()
    # (Exit 0: the same line counts messages expunged and purged after an
    # index put back was copied, which are not lost.)
    r = adm("rebuild", store, check_rc=0)
    assert f"lost: {len(gone)} messages".encode() in r.stdout, r.stdout
    assert set(where(store)) == set(data) - gone


def test_alt_of_another_owner_is_refused(tmp_path, make_mount):
    """An ALT directory not owned by the store's owner is not used (a path
    recorded in a user-writable index must not lead another user's process
    elsewhere): its messages fail with EIO and the log says why."""
    store, alt, m, data, old = altmoved(tmp_path, make_mount)
    os.chown(alt, 65534, 65534)
    m.mount()
    n = sorted(old)[0]
    with pytest.raises(OSError) as e:
        (m.mnt / "cur" / n).read_bytes()
    assert e.value.errno == errno.EIO
    assert "belongs to uid 65534" in m.log_text()
    m.unmount()
    r = adm("altmove", store, "--older-than", "0", check_rc=2)
    assert b"alternate storage" in r.stderr
    r = adm("check", store, check_rc=1)
    assert b"refused" in r.stdout + r.stderr
    r = adm("rebuild", store, check_rc=2)
    assert b"refused" in r.stderr
    assert (store / "index.sqlite").exists()


def test_alt_reached_through_a_third_users_directory_is_refused(tmp_path, make_mount):
    """Root's store whose ALT (root's) lies in a directory another user
    owns: that user can put a symbolic link to any store of root's there,
    and root's purge would then cut and remove that store's m.N (it did,
    before 2026-12-02).  The ALT is refused: its messages fail with EIO,
    and the store behind the switched link keeps every byte."""
    store, pub = tmp_path / "store", tmp_path / "pub"
    pub.mkdir()
    alt = pub / "alt"
    alt.mkdir(mode=0o700)
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    data, old = fill(m.mnt / "cur", 6)
    m.unmount()
    adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)
    victim = tmp_path / "victim"
    v = make_mount(store=victim, mnt=tmp_path / "mnt-v", options=["-o", ROTATE])
    fill(v.mnt / "cur", 20)
    v.unmount()
    before = {p.name: p.read_bytes() for p in (victim / "storage").iterdir()}
    os.chown(pub, 65534, 65534)
    os.rename(alt, pub / "alt.real")
    os.symlink(victim, alt)

    m.mount()
    with pytest.raises(OSError) as e:
        (m.mnt / "cur" / sorted(old)[0]).read_bytes()
    assert e.value.errno == errno.EIO
    assert "directory or symbolic link of uid 65534" in m.log_text()
    m.unmount()
    adm("purge", store)
    r = adm("check", store, check_rc=1)
    assert b"reached through another user's directory" in r.stdout + r.stderr
    assert {p.name: p.read_bytes() for p in (victim / "storage").iterdir()} == before
    adm("check", victim, check_rc=0)


def test_backup_without_its_alt_is_refused(tmp_path, make_mount):
    """A backup of a store whose ALT (holding some of its m.N) is not
    there, its disk not mounted: refused, and no DEST made, rather than
    a half store that looks whole (an attack run found one, exit 1 and
    warnings naming the ALT files as storage/)."""
    store, alt, m, _, _ = altmoved(tmp_path, make_mount)
    assert list((alt / "storage").glob("m.*"))
    alt.rename(tmp_path / "alt.off")
    r = adm("backup", store, tmp_path / "bk", check_rc=2)
    assert b"nothing was backed up" in r.stderr, r.stderr
    assert not (tmp_path / "bk").exists()
    (tmp_path / "alt.off").rename(alt)
    adm("backup", store, tmp_path / "bk", check_rc=0)


def test_dovecot_resync_over_primary_and_alt(dovecot_tmp, make_mount):
    """storage/ and ALT/storage/ copied to a Dovecot mdbox root with ALT=:
    force-resync finds every message, byte-equal."""
    store, alt = dovecot_tmp / "store", dovecot_tmp / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=dovecot_tmp / "mnt",
                   options=["-o", ROTATE + f",alt={alt}"])
    data, old = fill(m.mnt / "cur", 40)
    lists, _ = fill(m.maildir(".Lists") / "cur", 10, prefix="l")
    adm("altmove", store, "--older-than", "30", check_rc=0)
    m.unmount()
    assert list((alt / "storage").glob("m.*")) and list((store / "storage").glob("m.*"))

    live = dict(index_rows(store, "SELECT m.guid, e.name FROM message m"
                                  " JOIN entry e ON e.ino = m.ino"))
    root, altroot = dovecot_tmp / "mdbox", dovecot_tmp / "mdbox-alt"
    for src, dst in ((store, root), (alt, altroot)):
        (dst / "storage").mkdir(parents=True)
        for p in (src / "storage").glob("m.*"):
            shutil.copy(p, dst / "storage" / p.name)
    dv = Mdbox(root, dovecot_tmp / "dovecot", location=f"mdbox:{root}:ALT={altroot}")
    for d in (altroot,):
        for dp, dirs, files in os.walk(d):
            for n in [dp, *(os.path.join(dp, f) for f in files)]:
                os.lchown(n, dv.uid, dv.gid)
    dv.doveadm("mailbox", "create", "INBOX", check=False)
    dv.doveadm("force-resync", "*")
    found = dv.messages()
    assert sorted(t["guid"] for t in found) == sorted(live)
    for t in found:
        name = live[t["guid"]].decode()
        want = data.get(name) if t["mailbox"] == "INBOX" else lists.get(name)
        assert want is not None, (t, name)
        assert dv.text(t["mailbox"], t["uid"]) == want


def test_rebuild_export_stats_know_alt(tmp_path, make_mount):
    """rebuild scans ALT/storage/ too (ALT taken from the old index, or
    --alt when the index is gone), export reads messages wherever they
    are, and the mount reads them all after a rebuild."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    cur = m.mnt / "cur"
    data, old = fill(cur, 30)
    m.unmount()
    adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)

    st = json.loads(adm("stats", store, "--json", check_rc=0).stdout)
    alt_bytes = sum(p.stat().st_size for p in (alt / "storage").glob("m.*"))
    all_bytes = alt_bytes + sum(p.stat().st_size for p in (store / "storage").glob("m.*"))
    assert (st["alt_mfiles"], st["alt_mfile_bytes"]) == (1, alt_bytes)
    assert st["mfile_bytes"] == all_bytes
    assert st["messages"] == len(data)
    # The moved records are dead in the primary files until a purge.
    adm("purge", store, check_rc=0)
    st = json.loads(adm("stats", store, "--json", check_rc=0).stdout)
    assert st["dead_bytes"] == 0
    assert sum(a for _, a in where(store).values()) == len(old)

    out = tmp_path / "export"
    adm("export", store, out, check_rc=0)
    assert {p.name: p.read_bytes() for p in (out / "cur").iterdir()} == data

    adm("rebuild", store, check_rc=0)
    assert sum(a for _, a in where(store).values()) == len(old)
    adm("check", store, check_rc=0)
    # Without an index to say where ALT is: --alt.
    for p in store.glob("index.sqlite*"):
        p.unlink()
    adm("rebuild", store, check_rc=0)
    assert sum(a for _, a in where(store).values()) == 0   # ALT not known
    for p in store.glob("index.sqlite*"):
        p.unlink()
    adm("rebuild", store, f"--alt={alt}", check_rc=0)
    assert sum(a for _, a in where(store).values()) == len(old)
    m.mount()   # names are new (no old index): compare the bytes
    assert sorted(p.read_bytes() for p in cur.iterdir()) == sorted(data.values())
    m.unmount()
    adm("check", store, check_rc=0)


def test_import_dovecot_with_alt(dovecot_tmp, make_mount):
    """A Dovecot mdbox that moved mail to ALT= with `doveadm altmove` is
    adopted: its ALT m.N are hard-linked into the store's alternate
    storage, and the mount shows every message Dovecot lists, byte-equal."""
    from test_import_dovecot import check_adopted
    mails = corpus(12)
    root, altroot, store = dovecot_tmp / "mdbox", dovecot_tmp / "mdbox-alt", dovecot_tmp / "store"
    salt = dovecot_tmp / "store-alt"
    altroot.mkdir()
    salt.mkdir()
    dv = Mdbox(root, dovecot_tmp / "dovecot", location=f"mdbox:{root}:ALT={altroot}")
    os.chown(altroot, dv.uid, dv.gid)
    dv.doveadm("mailbox", "create", "Archive")
    for i, body in enumerate(mails):
        dv.save("INBOX" if i < 8 else "Archive", body)
    dv.doveadm("copy", "Archive", "mailbox", "INBOX", "uid", "2")
    dv.doveadm("altmove", "mailbox", "INBOX", "uid", "1:5")
    dv.doveadm("altmove", "mailbox", "Archive", "all")
    assert list((altroot / "storage").glob("m.*"))
    truth = dv.messages()
    texts = {(t["mailbox"], t["uid"]): dv.text(t["mailbox"], t["uid"]) for t in truth}

    # Without --dovecot-alt the ALT messages are not found.
    r = adm("import-dovecot", dovecot_tmp / "nostore", root, check_rc=1)
    assert b"alternate storage" in r.stderr
    adm("import-dovecot", store, root, f"--dovecot-alt={altroot}", f"--alt={salt}",
        check_rc=0)
    ours = list((salt / "storage").glob("m.*"))
    assert ours
    # Hard links: no byte copied.
    assert all(p.stat().st_nlink == 2 for p in ours)
    alt_files = [f for f, a in index_rows(store, "SELECT file_id, alt FROM mfile") if a]
    assert sorted(f"m.{f}" for f in alt_files) == sorted(p.name for p in ours)
    adm("check", store, check_rc=0)
    m = make_mount(store=store, mnt=dovecot_tmp / "mnt")
    check_adopted(m.mnt, truth, lambda t: texts[(t["mailbox"], t["uid"])])


def test_alt_recorded_by_a_user_leads_root_nowhere(tmp_path):
    """The ALT path is recorded in an index its user may write.  Pointed at
    a directory of root's, neither root's dboxadm altmove (it drops to the
    store's owner) nor root's mount of the store (ALT must belong to the
    store's owner) creates or changes anything there."""
    from sysenv import (as_user, need_root, sample_maildir, unprivileged_user,
                        user_scratch)
    from conftest import Mount, unmount
    import sqlite3
    need_root()
    name, uid, gid = unprivileged_user()
    scratch = user_scratch(name, "dboxfs-alt-")
    try:
        store = scratch / "store"
        src = sample_maildir(scratch / "Maildir", owner=name, messages=3)
        r = as_user(name, [DBOXADM, "import", store, src])
        assert r.returncode == 0, r.stderr
        m = Mount(store, scratch / "mnt").mount()   # root's mount, user's store
        try:
            body = b"Subject: x\n\nx\n"
            (m.mnt / "cur" / "1.x:2,S").write_bytes(body)
            os.utime(m.mnt / "cur" / "1.x:2,S", ns=(OLD_NS, OLD_NS))
        finally:
            m.unmount()
        for victim_mode in (0o700, 0o755, 0o777):
            victim = tmp_path / f"root-{victim_mode:o}"
            victim.mkdir()
            victim.chmod(victim_mode)
            db = sqlite3.connect(store / "index.sqlite")
            with db:
                db.execute("INSERT OR REPLACE INTO setting VALUES ('alt_path', ?)",
                           (str(victim).encode(),))
            db.close()
            for p in [store, *store.rglob("*")]:
                os.chown(p, uid, gid, follow_symlinks=False)
            r = adm("altmove", store, "--older-than", "1")
            assert r.returncode == 2, (r.stdout, r.stderr)
            m = Mount(store, scratch / "mnt").mount()
            try:
                assert (m.mnt / "cur" / "1.x:2,S").read_bytes() == body
            finally:
                m.unmount()
            assert list(victim.iterdir()) == [], victim_mode
            assert all(not a for _, a in where(store).values())
    finally:
        unmount(scratch / "mnt")
        shutil.rmtree(scratch, ignore_errors=True)


KILL_AT_SYNC = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Kill the process when the KILL_SYNC_N-th fdatasync of a file whose
   path starts with KILL_SYNC_OF returns. */
int fdatasync(int fd)
{
	static int (*real)(int);
	static int seen;
	const char *of = getenv("KILL_SYNC_OF"), *n = getenv("KILL_SYNC_N");
	char link[64], path[4096];
	ssize_t len;
	int ret;

	if (real == NULL)
		real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
	ret = real(fd);
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if (of != NULL && n != NULL &&
	    (len = readlink(link, path, sizeof(path) - 1)) > 0) {
		path[len] = '\0';
		if (strncmp(path, of, strlen(of)) == 0 && ++seen == atoi(n))
			kill(getpid(), SIGKILL);
	}
	return ret;
}
"""


def old_mail(cur, count, prefix="k", one_name=False):
    """count messages written into cur with old received dates, without
    the corpora; one_name: each has a second name at its close, so its
    record carries no path (as Dovecot's records).  Returns name ->
    bytes."""
    data = {}
    for i in range(count):
        name = f"{1600000000 + i}.{prefix}{i}.test:2,S"
        data[name] = b"Subject: %d\n\n" % i + b"old mail, moved to ALT\n" * (40 + i)
        with open(cur / name, "wb") as f:
            f.write(data[name])
            if one_name:
                os.link(cur / name, cur / (name + "2"))
        if one_name:
            os.unlink(cur / (name + "2"))
        os.utime(cur / name, ns=(OLD_NS + i * 10**9,) * 2)
    return data


def old_mail_in_alt(tmp_path, make_mount, count):
    """A store (tmp_path/store, mounted once on tmp_path/mnt, small m.N)
    with count old messages (old_mail, no corpora), altmoved offline to
    tmp_path/alt (made here): (store, alt, the unmounted Mount, data)."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    data = old_mail(m.mnt / "cur", count)
    m.unmount()
    adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)
    return store, alt, m, data


def test_a_new_alt_path_without_the_alt_mail_is_not_taken(tmp_path, make_mount):
    """A second --alt= (or -o alt=) naming a directory without the m.N
    the index places in ALT - a typo, a disk not mounted - is refused and
    not recorded: taken, the next altmove put mail there and the rest
    stayed in the first, with EIO for whichever half the mount did not
    see (helper-77).  Nothing is made in it; the recorded ALT serves."""
    store, alt, m, data = old_mail_in_alt(tmp_path, make_mount, 20)
    typo = tmp_path / "alt-typo"
    typo.mkdir()
    r = adm("altmove", store, "--older-than", "30", f"--alt={typo}")
    assert r.returncode == 2, r
    assert b"not recorded" in r.stderr, r.stderr
    (typo / "storage").mkdir()       # storage/ there, but not the mail
    r = adm("altmove", store, "--older-than", "30", f"--alt={typo}")
    assert r.returncode == 2 and b"holds no m." in r.stderr, r
    m.options = ["-o", f"{ROTATE},alt={typo}"]
    m.mount()
    assert "not recorded" in m.log_text(), m.log_text()
    for name, body in data.items():
        assert (m.mnt / "cur" / name).read_bytes() == body
    m.unmount()
    assert os.listdir(typo / "storage") == []
    check_store(store, data, alt)
    assert all(a for _, a in where(store).values())


def test_a_killed_altmove_is_judged_once_alt_is_back(tmp_path, make_mount,
                                                     monkeypatch):
    """An offline altmove killed right after it synced its first copies
    into ALT, before the commit that switches the index to them; the
    next mount runs while ALT's disk is not there, then ALT comes back.
    That recovery cannot look at the ALT m.N, and it dropped the copies'
    in-flight mark all the same: with ALT back, every check and mount
    took the copies for mail an older index did not know ('run dboxadm
    rebuild'), purge refused the file, and a rebuild brought back a
    message expunged meanwhile (helper-77).  The mark now stays until a
    recovery reaches the file and cuts the copies."""
    shim = preload_shim(tmp_path, monkeypatch, "killsync", KILL_AT_SYNC)
    monkeypatch.delenv("LD_PRELOAD")
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt", options=["-o", ROTATE])
    cur = m.mnt / "cur"
    # No path in the records: recovery could put back copies with one.
    data = old_mail(cur, 40, one_name=True)
    m.unmount()
    r = subprocess.run([str(DBOXADM), "altmove", str(store), "--older-than", "30",
                        f"--alt={alt}"], capture_output=True,
                       env=dict(os.environ, LD_PRELOAD=str(shim),
                                KILL_SYNC_OF=str(alt / "storage") + "/m.",
                                KILL_SYNC_N="2"))
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-2000:])
    assert not any(a for _, a in where(store).values()), "the switch committed"

    os.rename(alt, tmp_path / "alt.away")
    alt.mkdir()                      # ALT's disk is not mounted
    m.mount()
    m.unmount()
    alt.rmdir()
    os.rename(tmp_path / "alt.away", alt)

    m.mount()
    log = m.log_text()
    for name, body in data.items():
        assert (cur / name).read_bytes() == body
    victim = sorted(data)[0]
    os.unlink(cur / victim)
    del data[victim]
    m.unmount()
    assert "rebuild" not in log, log
    adm("purge", store, check_rc=0)
    check_store(store, data, alt)
    adm("altmove", store, "--older-than", "30", check_rc=0)
    check_store(store, data, alt)
    m.mount()
    assert sorted(os.listdir(cur)) == sorted(data)
    m.unmount()


def test_two_altmoves_asked_of_one_mount_at_once_both_run(tmp_path, make_mount):
    """Two dboxadm altmove with different selections sent to one mount at
    the same moment: each runs, and each reports its own outcome.  The
    mount has one request slot; the second request overwrote the first,
    which never ran, and both dboxadm exited 0 with the one outcome
    (helper-77, 5 of 5 rounds).  A request now waits while another one
    is there that the mount has not run."""
    store, alt = tmp_path / "store", tmp_path / "alt"
    alt.mkdir()
    m = make_mount(store=store, mnt=tmp_path / "mnt",
                   options=["-o", f"{ROTATE},alt={alt}"])
    inbox = old_mail(m.mnt / "cur", 30, prefix="i")
    archive = m.maildir(".Archive")
    for i in range(30):
        (archive / "cur" / f"{1700000000 + i}.a{i}.test:2,S").write_bytes(
            b"Subject: archived %d\n\nrecent, in a folder\n" % i)
    procs = [subprocess.Popen([str(DBOXADM), "altmove", str(store), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for args in (["--folder=.Archive"], ["--older-than=30"])]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, (out, err)
    placed = where(store)
    assert all(placed[n][1] for n in inbox), "INBOX's old mail not moved"
    assert all(a for n, (_, a) in placed.items() if ".a" in n), \
        "the folder's mail not moved"
    m.unmount()


def alt_ids(store, alt):
    """(the index's alt_id setting or None, ALT's mark or None)."""
    rows = index_rows(store, "SELECT value FROM setting WHERE key = 'alt_id'")
    mark = alt / "dboxfs-alt-id"
    value = rows[0][0] if rows else None
    return (value.decode() if isinstance(value, bytes) else value,
            mark.read_text() if mark.exists() else None)


def mfile_bytes(storage):
    """name -> bytes of every m.N in storage."""
    return {p.name: p.read_bytes() for p in sorted(storage.glob("m.*"))}


def test_alt_of_another_store_is_refused_by_every_opener(tmp_path, make_mount):
    """Two stores, each with mail in its own ALT under the same m.N
    numbers; store A's recorded ALT path is a symbolic link, switched to
    B's ALT.  Before, `dboxadm backup A` exited 0 with B's mail in it
    (helper-77), and A's purge, rebuild and mount worked on B's m.N under
    A's numbers.  Each ALT now carries a mark of its store
    (ALT/dboxfs-alt-id, engine/alt-mark.h) that every opener judges:
    A's backup, check, rebuild and mount refuse B's ALT, and B's m.N are
    not changed by anything run on A.  With the link back, all is well."""
    link = tmp_path / "alt-link"
    stores = {}
    for s in ("a", "b"):
        alt = tmp_path / f"alt-{s}"
        alt.mkdir()
        m = make_mount(store=tmp_path / f"store-{s}", mnt=tmp_path / f"mnt-{s}",
                       options=["-o", ROTATE])
        data = old_mail(m.mnt / "cur", 20, prefix=s)
        m.unmount()
        if s == "a":
            link.symlink_to(alt)
        adm("altmove", m.store, "--older-than", "30",
            f"--alt={link if s == 'a' else alt}", check_rc=0)
        stores[s] = (m, alt, data)
    (ma, alt_a, data_a), (mb, alt_b, data_b) = stores["a"], stores["b"]
    # Marked at the first altmove, each with its own id, in ALT and index.
    ida, idb = alt_ids(ma.store, alt_a), alt_ids(mb.store, alt_b)
    assert ida[0] is not None and ida[1] == ida[0] + "\n", ida
    assert idb[0] is not None and idb[1] == idb[0] + "\n", idb
    assert ida[0] != idb[0]
    shared = set(mfile_bytes(alt_a / "storage")) & set(mfile_bytes(alt_b / "storage"))
    assert shared, "the two ALTs share no m.N number: nothing to confuse"
    b_files = mfile_bytes(alt_b / "storage")

    link.unlink()
    link.symlink_to(alt_b)           # A's ALT path now leads to B's ALT
    r = adm("backup", ma.store, tmp_path / "bk", check_rc=2)
    assert b"another store" in r.stderr, r.stderr
    assert not (tmp_path / "bk").exists()
    r = adm("check", ma.store)
    assert r.returncode != 0 and b"another store" in r.stdout + r.stderr, r
    ma.mount()
    assert "another store" in ma.log_text()
    # The refusal said once, not again as a bare errno (helper-85).
    assert os.strerror(errno.EXDEV) not in ma.log_text()
    for name, body in data_a.items():  # A's ALT mail: EIO, never B's bytes
        with pytest.raises(OSError) as e:
            (ma.mnt / "cur" / name).read_bytes()
        assert e.value.errno == errno.EIO
    victim = sorted(data_a)[0]
    os.unlink(ma.mnt / "cur" / victim)  # its m.N now has a dead record
    ma.unmount()
    adm("purge", ma.store)
    r = adm("rebuild", ma.store)
    assert r.returncode != 0 and b"another store" in r.stderr, r
    assert mfile_bytes(alt_b / "storage") == b_files, "B's ALT changed"
    assert alt_ids(mb.store, alt_b) == idb
    adm("check", mb.store, check_rc=0)

    link.unlink()
    link.symlink_to(alt_a)           # back
    del data_a[victim]
    ma.mount()
    for name, body in data_a.items():
        assert (ma.mnt / "cur" / name).read_bytes() == body
    ma.unmount()
    check_store(ma.store, data_a, alt_a)
    adm("backup", ma.store, tmp_path / "bk", check_rc=0)


def test_altmove_into_another_stores_alt_says_why_once(tmp_path, make_mount):
    """altmove --alt= another store's ALT: refused with the mark as the
    reason; it said 'Invalid cross-device link' and 'give --alt=PATH'
    (which it had been given) after it (helper-85)."""
    alt = tmp_path / "alt"
    alt.mkdir()
    stores = []
    for name in ("a", "b"):
        m = make_mount(store=tmp_path / name, mnt=tmp_path / f"mnt-{name}", options=["-o", ROTATE])
        fill(m.mnt / "cur", 4, old_every=1)
        m.unmount()
        stores.append(m.store)
    adm("altmove", stores[0], "--older-than", "30", f"--alt={alt}", check_rc=0)
    r = adm("altmove", stores[1], "--older-than", "30", f"--alt={alt}", check_rc=2)
    err = r.stderr.decode()
    assert "the alternate storage of another store" in err, err
    assert os.strerror(errno.EXDEV) not in err and "give --alt=PATH" not in err, err
    assert f"--alt={alt} not taken" in err, err


def test_alt_marks_of_old_stores_and_copies(tmp_path, make_mount):
    """A store and ALT from before the marks (neither has one) are marked
    at the next writable open, with one id; an index without the id whose
    ALT holds its mail (restored from before the marks, or a rebuild's)
    takes the ALT's; a backup (a store of its own, without ALT) given the
    original's ALT is refused, and nothing is written there; a rebuild
    keeps the id."""
    store, alt, m, data = old_mail_in_alt(tmp_path, make_mount, 12)
    mark = alt / "dboxfs-alt-id"
    first = alt_ids(store, alt)
    assert first[0] is not None and first[1] == first[0] + "\n"

    def forget(setting=True, file=True):
        if setting:
            db = sqlite3.connect(str(store / "index.sqlite"))
            db.execute("DELETE FROM setting WHERE key = 'alt_id'")
            db.commit()
            db.close()
        if file:
            mark.unlink()

    forget()                          # as before the marks
    m.mount()
    for n, body in data.items():
        assert (m.mnt / "cur" / n).read_bytes() == body
    m.unmount()
    again = alt_ids(store, alt)
    assert again[0] is not None and again[1] == again[0] + "\n", again
    forget(file=False)                # an index without it: takes ALT's
    m.mount()
    m.unmount()
    assert alt_ids(store, alt) == again
    forget(setting=False)             # an ALT without it: gets the index's
    m.mount()
    m.unmount()
    assert alt_ids(store, alt) == again
    mark.write_text("not an id\n")    # damaged: rewritten
    m.mount()
    m.unmount()
    assert alt_ids(store, alt) == again

    adm("backup", store, tmp_path / "bk", check_rc=0)
    bk = make_mount(store=tmp_path / "bk", mnt=tmp_path / "mnt-bk",
                    options=["-o", f"alt={alt}"])
    assert "another store" in bk.log_text(), bk.log_text()[-2000:]
    for n, body in data.items():     # its own copies, all of them
        assert (bk.mnt / "cur" / n).read_bytes() == body
    bk.unmount()
    assert index_rows(tmp_path / "bk", "SELECT value FROM setting WHERE key"
                      " IN ('alt_id', 'alt_path')") == []

    adm("rebuild", store, check_rc=0)
    assert alt_ids(store, alt) == again
    check_store(store, data, alt)


def test_an_unmarked_alt_of_another_store_is_told_by_its_content(tmp_path, make_mount):
    """Store B's ALT moved the documented way (its storage/ copied over,
    so without its mark), then store A pointed at it by a typo, with -o
    alt= and with altmove --alt=: A's mount took it, wrote A's id into
    it, and A's purge removed B's m.N; B was then refused its own ALT
    (helper-81).  Without a mark, an ALT is this store's only if the
    first message the index places there is in it (its GUID at its
    offset), or, for a store with no mail in ALT, if it holds no m.N:
    both are refused now, and B's ALT is left as it was."""
    stores = {}
    for s in ("a", "b"):
        store, alt = tmp_path / f"store-{s}", tmp_path / f"alt-{s}"
        alt.mkdir()
        m = make_mount(store=store, mnt=tmp_path / f"mnt-{s}", options=["-o", ROTATE])
        data = old_mail(m.mnt / "cur", 12, prefix=s)
        m.unmount()
        adm("altmove", store, "--older-than", "30", f"--alt={alt}", check_rc=0)
        stores[s] = (store, alt, m, data)
    store_a, alt_a, ma, data_a = stores["a"]
    store_b, alt_b, mb, data_b = stores["b"]
    moved = tmp_path / "alt-b-new"                 # B's ALT, moved: no mark
    (moved / "storage").mkdir(parents=True)
    for p in (alt_b / "storage").iterdir():
        shutil.copy2(p, moved / "storage" / p.name)
    assert not (moved / "dboxfs-alt-id").exists()
    b_files = mfile_bytes(moved / "storage")
    assert set(b_files) & set(mfile_bytes(alt_a / "storage"))

    ma.options = ["-o", f"{ROTATE},alt={moved}"]   # the typo
    ma.mount()
    assert "another store" in ma.log_text(), ma.log_text()[-2000:]
    for name, body in data_a.items():              # A's own ALT still serves
        assert (ma.mnt / "cur" / name).read_bytes() == body
    victim = sorted(data_a)[0]
    os.unlink(ma.mnt / "cur" / victim)
    ma.unmount()
    assert index_rows(store_a, "SELECT value FROM setting WHERE key = 'alt_path'")[0][0] \
        in (str(alt_a), str(alt_a).encode())
    adm("purge", store_a, check_rc=0)
    assert mfile_bytes(moved / "storage") == b_files
    assert not (moved / "dboxfs-alt-id").exists()

    # A store with no mail in ALT, sent to B's unmarked ALT by altmove.
    c_store = tmp_path / "store-c"
    mc = make_mount(store=c_store, mnt=tmp_path / "mnt-c", options=["-o", ROTATE])
    old_mail(mc.mnt / "cur", 4, prefix="c")
    mc.unmount()
    r = adm("altmove", c_store, "--older-than", "30", f"--alt={moved}")
    assert r.returncode == 2 and b"another store" in r.stderr, r
    assert mfile_bytes(moved / "storage") == b_files
    assert not (moved / "dboxfs-alt-id").exists()

    # B itself takes its moved ALT, by its content, and marks it.
    mb.options = ["-o", f"{ROTATE},alt={moved}"]
    mb.mount()
    for name, body in data_b.items():
        assert (mb.mnt / "cur" / name).read_bytes() == body
    mb.unmount()
    assert (moved / "dboxfs-alt-id").read_text().strip() == \
        alt_ids(store_b, moved)[0]
