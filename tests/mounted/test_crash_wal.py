"""SIGKILL the daemon while several writers deliver and other processes
read the index: the WAL's writes (docs/durability.md, "The WAL's writes")
under a crash and under readers.

The index's VFS holds a transaction's WAL frames in memory and writes them
when the commit frame arrives.  A commit that stayed in that buffer when
dboxfs replies would be lost by a SIGKILL; frames that reached the file in
the wrong order, or over another connection's, would make a reader see a
malformed database.  So each cycle here:

  - mounts the store and starts WRITERS processes, each looping over a
    delivery (create in tmp/, write, fsync, rename into new/ - tiny
    messages mostly, some of 1-2 MB), a flag rename into cur/ and an
    unlink of one of its own messages; each logs "A" before the final
    step and "D" once it returned, fsynced, outside the mount;
  - runs readers in other processes at the same time: SQLite (Python's
    module) opening STORE/index.sqlite read-only and counting rows with a
    quick_check, and `dboxadm stats STORE` (which reads a mounted store);
  - SIGKILLs the daemon at a random moment, takes the dead mount away,
    mounts again and checks: every message whose last step returned is
    under its name with its bytes (one in flight at the kill may be at
    either name, and so may one whose flag rename returned just before
    the kill: a deferred commit), nothing else is in new/ or cur/, and `dboxadm check`
    finds no problem.

No reader may see "malformed" or hang.  DBOXFS_CRASH_WAL_CYCLES sets the
number of cycles (default 10, some 40 s); DBOXFS_CRASH_SEED the seed.
"""
import errno
import multiprocessing
import os
import queue
import random
import sqlite3
import subprocess
import time

from conftest import DBOXADM, Mount

CYCLES = int(os.environ.get("DBOXFS_CRASH_WAL_CYCLES", "10"))
SEED = int(os.environ.get("DBOXFS_CRASH_SEED", str(random.randrange(1 << 30))))
WRITERS = 4
# A flag rename is a deferred commit (docs/durability.md, "Deferred
# commits"), committed at most DBOX_DEFER_MS (10 ms) after it returned:
# one that returned this many seconds before the kill may be undone (the
# margin covers a loaded machine's scheduling).
DEFER_GRACE = 1.0
# What a writer may get from a mount that went away under it.
GONE = (errno.ENOTCONN, errno.ECONNABORTED, errno.ENOENT)


def body(name, size):
    """The bytes of message `name`: derived from it, so any reader can check."""
    head = f"From: w@example.org\nSubject: {name}\n\n".encode()
    return head + random.Random(name).randbytes(size)


def note(fd, *fields):
    os.write(fd, (" ".join(map(str, fields)) + "\n").encode())
    os.fsync(fd)


def writer(mnt, log, cycle, wid, seed, live):
    """Deliver, flag and unlink until the mount goes (a process)."""
    rng = random.Random(seed)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    live = dict(live)
    n = 0
    try:
        while True:
            x = rng.random()
            if x < 0.7 or len(live) < 3:
                n += 1
                name = f"c{cycle}w{wid}n{n}"
                size = (rng.randrange(1 << 20, 2 << 20) if rng.random() < 0.04
                        else rng.randrange(20, 3000))
                tmp = mnt / "tmp" / name
                rel = f"new/{name}"
                with open(tmp, "wb") as f:
                    f.write(body(name, size))
                    f.flush()
                    # A kill between the fsync's flush and its commit
                    # leaves the synced record, which recovery puts
                    # back in new/ (docs/durability.md): at least once.
                    note(fd, "F", name, size, "-", rel)
                    os.fsync(f.fileno())
                note(fd, "A", name, size, "-", rel)
                os.rename(tmp, mnt / rel)
                note(fd, "D", name, size, "-", rel)
                live[name] = (size, rel)
            elif x < 0.9:
                name = rng.choice(sorted(live))
                size, old = live[name]
                new = f"cur/{name}:2,{rng.choice(('S', 'RS', 'FS'))}"
                if new == old:
                    continue
                note(fd, "A", name, size, old, new)
                os.rename(mnt / old, mnt / new)
                note(fd, "D", name, size, old, new, time.monotonic())
                live[name] = (size, new)
            else:
                name = rng.choice(sorted(live))
                size, old = live[name]
                note(fd, "A", name, size, old, "-")
                os.unlink(mnt / old)
                note(fd, "D", name, size, old, "-")
                del live[name]
    except OSError as e:
        if e.errno not in GONE:
            note(fd, "X", repr(e).replace(" ", "_"))
    os._exit(0)


def reader(store, stop, out, reads):
    """Read the index from other processes until stop is set; report
    anything malformed or hung in out, count whole reads in reads."""
    i = 0
    while not stop.is_set():
        i += 1
        try:
            db = sqlite3.connect(f"file:{store}/index.sqlite?mode=ro",
                                 uri=True, timeout=10)
            for table in ("message", "entry", "inode"):
                db.execute(f"SELECT count(*) FROM {table}").fetchone()
            check = db.execute("PRAGMA quick_check").fetchone()[0]
            db.close()
            if check != "ok":
                out.put(f"quick_check: {check}")
            with reads.get_lock():
                reads.value += 1
        except sqlite3.OperationalError as e:
            if "malformed" in str(e) or "not a database" in str(e):
                out.put(f"sqlite: {e}")
        except sqlite3.DatabaseError as e:
            out.put(f"sqlite: {e}")
        if i % 4 == 0:
            try:
                p = subprocess.run([str(DBOXADM), "stats", str(store)],
                                   capture_output=True, text=True,
                                   errors="replace", timeout=60)
                text = p.stdout + p.stderr
                if "malformed" in text or "corrupt" in text.lower():
                    out.put(f"dboxadm stats: {text[-500:]}")
            except subprocess.TimeoutExpired:
                out.put("dboxadm stats hung")
    os._exit(0)


def replay(log, live, maybe, killed):
    """Apply a writer's ledger to live ({name: (size, rel)}).  A flag
    rename that returned less than DEFER_GRACE seconds before the kill
    (killed, time.monotonic()) may be undone (a deferred commit): its
    names before go into maybe ({name: set of rels}).  Returns the step in
    flight at the kill as (name, size, old, new), or None."""
    pending = None
    for line in log.read_text().splitlines():
        kind, *rest = line.split()
        assert kind != "X", f"{log}: {line}"
        name, size, old, new = rest[0], int(rest[1]), rest[2], rest[3]
        if kind in ("A", "F"):
            pending = (name, size, old, new)
            continue
        pending = None
        if new == "-":
            del live[name]
            maybe.pop(name, None)
        elif old != "-" and float(rest[4]) > killed - DEFER_GRACE:
            maybe.setdefault(name, set()).add(old)
            live[name] = (size, new)
        else:
            maybe.pop(name, None)
            live[name] = (size, new)
    return pending


def check_cycle(mnt, live, pending, maybe):
    """Every acknowledged message under its name with its bytes (or one of
    its names in maybe: a flag rename deferred at the kill); an in-flight
    one at either name (or gone, for a delivery or unlink).  Updates live
    to what is there.  Returns the problems found."""
    problems = []
    for name, olds in maybe.items():
        if name in live and not (mnt / live[name][1]).exists():
            there = [rel for rel in olds if (mnt / rel).exists()]
            if len(there) == 1:
                live[name] = (live[name][0], there[0])
    for name, size, old, new in pending:
        names = [n for n in (old, new, *maybe.get(name, ()))
                 if n != "-" and (mnt / n).exists()]
        assert len(names) <= 1, f"{name} at both {old} and {new}"
        if names:
            live[name] = (size, names[0])
        else:
            assert old == "-" or new == "-", f"flag rename lost {name}"
            live.pop(name, None)
    for name, (size, rel) in live.items():
        path = mnt / rel
        if not path.exists():
            problems.append(f"lost {name} ({rel})")
        elif path.read_bytes() != body(name, size):
            problems.append(f"bytes of {name} ({rel}) differ")
    want = sorted(rel for _, rel in live.values())
    have = sorted(f"{sub}/{e}" for sub in ("new", "cur")
                  for e in os.listdir(mnt / sub))
    if have != want:
        problems.append(f"extra {sorted(set(have) - set(want))[:5]}, "
                        f"missing {sorted(set(want) - set(have))[:5]}")
    return problems


def test_kill_under_writers_and_index_readers(tmp_path):
    rng = random.Random(SEED)
    print(f"crash-wal: {CYCLES} cycles, seed {SEED}")
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    ctx = multiprocessing.get_context("fork")
    live = {}
    delivered = 0
    m.mount()
    try:
        for sub in ("cur", "new", "tmp"):
            (m.mnt / sub).mkdir(exist_ok=True)
        stop = ctx.Event()
        out = ctx.Queue()
        reads = ctx.Value("i", 0)
        readers = [ctx.Process(target=reader, args=(m.store, stop, out, reads))
                   for _ in range(2)]
        for p in readers:
            p.start()
        for cycle in range(CYCLES):
            logs = [tmp_path / f"c{cycle}w{w}.log" for w in range(WRITERS)]
            own = [{k: v for k, v in live.items() if f"w{w}n" in k}
                   for w in range(WRITERS)]
            procs = [ctx.Process(target=writer,
                                 args=(m.mnt, logs[w], cycle, w,
                                       rng.randrange(1 << 30), own[w]))
                     for w in range(WRITERS)]
            for p in procs:
                p.start()
            time.sleep(rng.uniform(0.3, 1.2))
            killed = time.monotonic()
            m.kill()
            for p in procs:
                p.join(30)
                assert p.exitcode == 0, f"writer hung or failed: {p.exitcode}"
            pending, maybe = [], {}
            for log in logs:
                if log.exists():
                    step = replay(log, live, maybe, killed)
                    delivered += sum(1 for line in log.read_text().splitlines()
                                     if line.startswith("D ") and " - new/" in line)
                    if step is not None:
                        pending.append(step)
            m.mount()
            problems = check_cycle(m.mnt, live, pending, maybe)
            assert not problems, f"cycle {cycle} (seed {SEED}): {problems[:10]}"
            check = subprocess.run([str(DBOXADM), "check", str(m.store)],
                                   capture_output=True, text=True)
            assert check.returncode == 0, \
                f"cycle {cycle} (seed {SEED}): {check.stdout}{check.stderr}"
            for e in os.listdir(m.mnt / "tmp"):
                os.unlink(m.mnt / "tmp" / e)
        stop.set()
        for p in readers:
            p.join(120)
            assert p.exitcode == 0, "an index reader hung"
        seen = []
        while True:
            try:
                seen.append(out.get(timeout=0.5))
            except queue.Empty:
                break
        assert not seen, f"readers saw (seed {SEED}): {seen[:5]}"
        assert reads.value >= CYCLES, reads.value
        print(f"crash-wal: {CYCLES} kill cycles passed, {delivered} deliveries "
              f"acknowledged, {len(live)} messages checked at the end, "
              f"{reads.value} index reads, seed {SEED}")
        m.unmount()
    finally:
        m.kill()
