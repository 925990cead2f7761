"""Requests and daemon syscalls per operation, dboxfs against the FUSE
floor (passthrough_ll over ext4).  Both are counts, not times, so they
do not depend on the load of the machine: the same code gives the same
figures on every run.

- requests: the daemon runs with -d (libfuse logs every request it
  reads) while one process delivers K messages the maildir way (fsync
  off, then on) and then makes K flag renames in cur/; the requests
  logged during each phase, divided by K.  dboxfs runs twice: mounted
  by its user alone (no options: the daemon checks permissions), the
  main rows, and with -o allow_other (the kernel checks them,
  default_permissions), the rows named "allow_other mount", which also
  have Dovecot's phase (Dovecot's processes run as user mail).
- syscalls: `strace -c -f` attached to the daemon (every thread) of a
  normal mount during the same phases; syscalls per operation, with the
  biggest ones named in the note.
- SQL statements (dboxfs): the same mount runs with build/sqlcount.so
  preloaded, which counts the statements the daemon starts and the
  COMMITs among them.
- Dovecot APPEND (when Dovecot is installed): a private Dovecot serving a
  maildir on the mount (b_imap.py), one connection APPENDing K messages;
  its start and first APPEND are not counted.

The rows after them are times, so they move with the load: R repeats of
both sides in turn, each on a fresh normal mount (no -d, no strace),
with the same phases except Dovecot's:
- daemon CPU per operation: user + system time of every thread of the
  daemon during each phase (/proc/PID/task/TID/schedstat: nanoseconds on
  the CPU), divided by K;
- fsync() latency: the client times each os.fsync() of the delivery with
  fsync on; the median and the 90th percentile of the repeat.

Run alone for a quick look (a few seconds, no other benchmark; the times
take R repeats more, about 10 s each at K = 300 here):
    tools/bench/b_counts.py [--ops K] [--side dboxfs|floor] [--repeats R]
"""
import collections
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import BUILD, Floor, Mount, Row, fmt_num, fresh_dir, log, sides  # noqa: E402

SQLCOUNT = BUILD / "sqlcount.so"

_host = socket.gethostname()
OPS = {"full": 1000, "quick": 200}
PHASES = ("delivery, fsync off", "delivery, fsync on", "flag rename")
MAILDIR = TIMED = PHASES  # one user's phases; the timed ones (daemon CPU)
if shutil.which("dovecot"):
    PHASES += ("Dovecot APPEND",)
SHARED = ("allow_other",)  # the mount options of a mount others reach


def _deliver(folder, msgs, fsync, into="new", tag="c", lat=None):
    """Deliver msgs the maildir way; lat: a list that gets the
    nanoseconds of every fsync()."""
    tmp, dest = os.path.join(folder, "tmp"), os.path.join(folder, into)
    for i, data in enumerate(msgs):
        name = f"{1790000000 + i}.M{i}P{os.getpid()}Q{tag}.{_host}"
        path = os.path.join(tmp, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            t = time.perf_counter_ns()
            os.fsync(fd)
            if lat is not None:
                lat.append(time.perf_counter_ns() - t)
        os.close(fd)
        os.rename(path, os.path.join(dest, name + (":2,S" if into == "cur" else "")))


def _renames(cur):
    """A phase of flag renames of every message in cur (listed before the
    phase starts: a flag rename is its LOOKUPs and the RENAME)."""
    def phase(start, stop):
        names = sorted(os.listdir(cur))
        start()
        for name in names:
            base, flags = name.split(":2,")
            os.rename(os.path.join(cur, name),
                      os.path.join(cur, f"{base}:2,{''.join(sorted(flags + 'T'))}"))
        stop()
    return phase


def _simple(fn):
    """A phase that is measured whole."""
    def phase(start, stop):
        start()
        fn()
        stop()
    return phase


def _appends(root, msgs, tmp):
    """A phase of Dovecot APPENDs to a maildir on root (b_imap.Dovecot):
    Dovecot's start, login and first APPEND are not measured."""
    def phase(start, stop):
        import imaplib
        from b_imap import Dovecot
        os.chmod(root, 0o755)
        with Dovecot(Path(tmp) / "counts-dovecot", Path(root) / ".imap") as dc:
            imap = imaplib.IMAP4("127.0.0.1", dc.port)
            imap.login("bench", "x")
            imap.append("INBOX", None, None, msgs[0])
            start()
            for data in msgs:
                typ, _ = imap.append("INBOX", None, None, data)
                if typ != "OK":
                    raise RuntimeError("APPEND failed")
            stop()
            imap.logout()
    return phase


def _phases(root, msgs, tmp, lat=None, names=PHASES):
    """The workloads on a mount root: phase(start, stop) callables for
    the phases names (in PHASES order), each doing len(msgs) operations
    between start() and stop().  Folders are made (not counted) by
    prepare().  lat gets the fsync() times of the delivery with fsync
    on."""
    def prepare():
        for f in ("off", "on", "ren"):
            for sub in ("cur", "new", "tmp"):
                os.makedirs(os.path.join(root, "." + f, sub), exist_ok=True)
        # One warm-up delivery each: the folders' names are cached.
        _deliver(os.path.join(root, ".off"), msgs[:1], False, tag="w")
        _deliver(os.path.join(root, ".on"), msgs[:1], True, tag="w")
        _deliver(os.path.join(root, ".ren"), msgs, False, into="cur")
        os.listdir(os.path.join(root, ".ren", "cur"))
    phases = [
        _simple(lambda: _deliver(os.path.join(root, ".off"), msgs, False)),
        _simple(lambda: _deliver(os.path.join(root, ".on"), msgs, True, lat=lat)),
        _renames(os.path.join(root, ".ren", "cur")),
    ]
    if "Dovecot APPEND" in names:
        phases.append(_appends(root, msgs, tmp))
    return prepare, phases


_OPCODE = re.compile(r"opcode: (\w+)")


def count_requests(make_mount, msgs, log_path, names=PHASES):
    """{phase: Counter of opcodes} over the phases names on a mount made
    by make_mount(debug_log) (libfuse -d)."""
    out = {}
    m = make_mount(log_path)
    m.mount()
    try:
        prepare, work = _phases(m.mnt, msgs, Path(log_path).parent, names=names)
        prepare()
        for phase, fn in zip(names, work):
            pos = []

            def start():
                time.sleep(0.3)  # asynchronous RELEASEs of the step before
                pos.append(os.path.getsize(log_path))

            def stop():
                time.sleep(0.3)
                with open(log_path, errors="replace") as f:
                    f.seek(pos[0])
                    out[phase] = collections.Counter(_OPCODE.findall(f.read()))
            fn(start, stop)
    finally:
        m.unmount()
    return out


def _all_traced(pid):
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for t in tasks:
        try:
            status = Path(f"/proc/{pid}/task/{t}/status").read_text()
        except OSError:
            continue
        if re.search(r"^TracerPid:\s+0$", status, re.M):
            return False
    return True


def _strace_summary(path):
    """{syscall: calls} and the total from an `strace -c` summary."""
    calls, total = {}, 0
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if len(f) < 5 or not f[3].isdigit():
            continue
        if f[-1] == "total":
            total = int(f[3])
        else:
            calls[f[-1]] = int(f[3])
    return calls, total


def _sql_counters(path):
    data = Path(path).read_bytes() if path is not None else b""
    if len(data) < 16:
        return None
    return int.from_bytes(data[:8], sys.byteorder), int.from_bytes(data[8:16], sys.byteorder)


def count_syscalls(make_mount, msgs, tmp, sql=False, names=PHASES):
    """{phase: (total, {syscall: calls}, (statements, commits) or None)}
    over the phases names with strace -c -f attached to the daemon of a
    mount made by make_mount(None); sql: with sqlcount.so preloaded into
    the daemon."""
    out = {}
    m = make_mount(None)
    sqlfile = None
    if sql and SQLCOUNT.exists():
        sqlfile = Path(tmp) / "sqlcount.bin"
        if sqlfile.exists():
            sqlfile.unlink()
        os.environ["LD_PRELOAD"] = str(SQLCOUNT)
        os.environ["SQLCOUNT_FILE"] = str(sqlfile)
    try:
        m.mount()
    finally:
        os.environ.pop("LD_PRELOAD", None)
        os.environ.pop("SQLCOUNT_FILE", None)
    try:
        pid = m.pid()
        prepare, work = _phases(m.mnt, msgs, tmp, names=names)
        prepare()
        for k, (phase, fn) in enumerate(zip(names, work)):
            path = Path(tmp) / f"strace-{k}.txt"
            st, sql0 = [], []

            def start():
                time.sleep(0.3)
                st.append(subprocess.Popen(["strace", "-c", "-f", "-q", "-o", str(path),
                                            "-p", str(pid)], stderr=subprocess.DEVNULL))
                for _ in range(400):
                    if _all_traced(pid):
                        break
                    time.sleep(0.01)
                sql0.append(_sql_counters(sqlfile))

            def stop():
                time.sleep(0.3)
                st[0].send_signal(signal.SIGINT)
                st[0].wait(60)
                sql1 = _sql_counters(sqlfile)
                calls, total = _strace_summary(path)
                out[phase] = (total, calls, None if sql0[0] is None or sql1 is None
                              else (sql1[0] - sql0[0][0], sql1[1] - sql0[0][1]))
            fn(start, stop)
    finally:
        m.unmount()
    return out


def _maker(tmp, side, args=(), options=()):
    """make(debug_log): a Mount (side "dboxfs", of a new store, with the
    dboxfs arguments args and -o options) or a Floor (of a new empty
    directory) in scratch directory tmp, not yet mounted."""
    tmp = Path(tmp)

    def make(debug_log):
        if side == "dboxfs":
            store = tmp / "counts-store"
            fresh_dir(store).rmdir()
            return Mount(store, tmp / "counts-mnt", options, debug_log=debug_log, args=args)
        src = fresh_dir(tmp / "counts-floor-src")
        return Floor(src, tmp / "counts-mnt", debug_log=debug_log)
    return make


def measure(tmp, msgs, side, args=(), options=(), names=PHASES):
    """(requests, syscalls) over the phases names of side "dboxfs" (with
    -o options) or "floor" (count_requests, count_syscalls) in scratch
    directory tmp."""
    make = _maker(tmp, side, args, options)
    req = count_requests(make, msgs, Path(tmp) / f"counts-{side}.log", names)
    sysc = count_syscalls(make, msgs, tmp, sql=side == "dboxfs", names=names)
    return req, sysc


_SCHEDSTAT = os.path.exists("/proc/self/schedstat")
_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def _thread_cpu_ns(pid):
    """{tid: nanoseconds on the CPU, user + system} of every live thread
    of pid: the first field of /proc/PID/task/TID/schedstat, or where
    the kernel has none utime + stime of .../stat (clock ticks, 10 ms at
    100 Hz: then K must be large)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if _SCHEDSTAT:
                out[tid] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            else:
                f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                out[tid] = (int(f[11]) + int(f[12])) * _TICK_NS
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread exited since the listing
    return out


def measure_times(tmp, msgs, side, args=()):
    """({phase: daemon CPU ns}, [fsync() ns]) of one repeat of the TIMED
    phases on a fresh normal mount of side (no -d, no strace).  A thread
    that exits during a phase takes its time with it (logged; libfuse
    keeps up to 10 idle workers: none has exited with one writer)."""
    m = _maker(tmp, side, args)(None)
    m.mount()
    cpu, lat = {}, []
    try:
        pid = m.pid()
        prepare, work = _phases(m.mnt, msgs, tmp, lat, names=TIMED)
        prepare()
        for phase, fn in zip(TIMED, work):
            before = []

            def start():
                time.sleep(0.3)  # as count_requests: the step before is done
                before.append(_thread_cpu_ns(pid))

            def stop():
                time.sleep(0.3)  # the asynchronous RELEASEs count
                after = _thread_cpu_ns(pid)
                gone = before[0].keys() - after.keys()
                if gone:
                    log(f"{side}: {len(gone)} daemon threads exited during {phase}")
                cpu[phase] = sum(v - before[0].get(t, 0) for t, v in after.items())
            fn(start, stop)
    finally:
        m.unmount()
    return cpu, lat


def timed_repeats(tmp, msgs, repeats, args=()):
    """[(dboxfs, floor)] of measure_times() over repeats, the side that
    goes first alternating (benchlib.sides)."""
    return [sides(r, [lambda: measure_times(tmp, msgs, "dboxfs", args),
                      lambda: measure_times(tmp, msgs, "floor")])
            for r in range(repeats)]


def _top(counter, k, per):
    return ", ".join(f"{n} {v / per:.1f}" for n, v in counter.most_common(k))


REQ_TARGET = {"delivery, fsync off": 7, "delivery, fsync on": 7, "flag rename": 2}
SYS_TARGET = {"delivery, fsync off": 30}


def _merged(own, shared):
    """measure() results of dboxfs: the owner's mount's phases, and the
    shared mount's for the phases the owner's has not (Dovecot's)."""
    (oreq, osys), (sreq, ssys) = own, shared
    return ({**sreq, **oreq}, {**ssys, **osys})


def rows_from(k, own, shared, flo):
    """Rows of requests and syscalls per operation from measure() of
    dboxfs mounted by its user alone (own: the MAILDIR phases), with
    allow_other (shared: every phase) and of the floor, over k
    operations per phase."""
    rows = []
    (dreq, dsys), (freq, fsys) = _merged(own, shared), flo
    for phase in PHASES:
        dn, fn = sum(dreq[phase].values()), sum(freq[phase].values())
        t = REQ_TARGET.get(phase)
        where = "allow_other mount" if phase not in MAILDIR else "owner's mount"
        row = Row(f"requests per {phase}", "count", "", ("<=", t, True) if t else None,
                  f"dboxfs ({where}): {_top(dreq[phase], 12, k)}; "
                  f"floor: {_top(freq[phase], 12, k)}")
        row.add(dn / k, None, fn / k)
        rows.append(row)
    sreq = shared[0]
    for phase in MAILDIR:
        dn, fn = sum(sreq[phase].values()), sum(freq[phase].values())
        row = Row(f"requests per {phase}, allow_other mount", "count", "", None,
                  f"the kernel checks permissions (default_permissions): "
                  f"dboxfs: {_top(sreq[phase], 12, k)}")
        row.add(dn / k, None, fn / k)
        rows.append(row)
    for phase in PHASES:
        (dt, dc, _), (ft, fc, _) = dsys[phase], fsys[phase]
        t = SYS_TARGET.get(phase)
        row = Row(f"daemon syscalls per {phase}", "count", "",
                  ("<=", t, True) if t else None,
                  f"dboxfs: {_top(collections.Counter(dc), 10, k)}; "
                  f"floor: {_top(collections.Counter(fc), 6, k)}")
        row.add(dt / k, None, ft / k)
        rows.append(row)
    for phase in PHASES:
        sql = dsys[phase][2]
        if sql is None:
            continue
        row = Row(f"SQL statements per {phase}", "count", "", None,
                  f"dboxfs; of them COMMITs: {sql[1] / k:.2f}")
        row.add(sql[0] / k)
        rows.append(row)
    return rows


CPU_TARGET = {"delivery, fsync off": 1.3, "delivery, fsync on": 1.3}  # x floor


def _p90(values):
    return statistics.quantiles(values, n=10)[8]


def time_rows(k, runs):
    """Rows of daemon CPU per operation (µs) and fsync() latency (ms)
    from timed_repeats() over k operations per phase."""
    rows = []
    how = f"user + system, all threads ({'schedstat' if _SCHEDSTAT else 'clock ticks'})"
    for phase in TIMED:
        row = Row(f"daemon CPU per {phase}", "time", "µs", None,
                  how + ", normal mount")
        for (dcpu, _), (fcpu, _) in runs:
            row.add(dcpu[phase] / k / 1e3, None, fcpu[phase] / k / 1e3)
        rows.append(row)
        # The floor's CPU per operation jumps about threefold between
        # repeats of the same work (bench/README, "The floor's CPU is
        # bimodal"), so a median of paired ratios may compare against its
        # slow mode.  The target is checked on each side's least repeat:
        # what the work costs it when nothing gets in the way.
        t = CPU_TARGET.get(phase)
        if t:
            least = Row(f"daemon CPU per {phase}, least of the repeats",
                        "time", "µs", None, how + ", least repeat of each side",
                        ("<=", t))
            least.add(min(row.dbox), None, min(row.floor))
            rows.append(least)
    for what, fn, target in (("median", statistics.median, ("<=", 1.5)), ("p90", _p90, None)):
        row = Row(f"fsync() latency in delivery, {what}", "time", "ms", None,
                  f"as the client sees it (fsync on), {what} of each repeat", target)
        for (_, dlat), (_, flat) in runs:
            row.add(fn(dlat) / 1e6, None, fn(flat) / 1e6)
        rows.append(row)
    return rows


def run(ctx):
    k = OPS["quick" if ctx.quick else "full"]
    msgs = (ctx.messages * (k // len(ctx.messages) + 1))[:k]
    own = measure(ctx.tmp, msgs, "dboxfs", names=MAILDIR)
    shared = measure(ctx.tmp, msgs, "dboxfs", options=SHARED)
    flo = measure(ctx.tmp, msgs, "floor")
    rows = rows_from(k, own, shared, flo)
    for row in rows:
        log(f"{row.name}: dboxfs {row.dbox[0]:.1f}" +
            (f" floor {row.floor[0]:.1f}" if row.floor else ""))
    times = time_rows(k, timed_repeats(ctx.tmp, msgs, ctx.repeats))
    for row in times:
        log(f"{row.name}: {_spread(row)}")
    return rows + times


def _spread(row):
    """dboxfs, floor and dboxfs / floor as median (min-max)."""
    def cell(v, unit):
        return (f"{fmt_num(statistics.median(v), unit)} "
                f"({fmt_num(min(v), '')}-{fmt_num(max(v), '')})")
    return (f"dboxfs {cell(row.dbox, row.unit)}, floor {cell(row.floor, row.unit)}, "
            f"/ floor {cell(row.floor_ratios(), '')}")


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--side", choices=("dboxfs", "floor", "both"), default="both")
    ap.add_argument("--repeats", type=int, default=5,
                    help="repeats of the timed rows (daemon CPU, fsync latency), both "
                         "sides in turn; only with --side both (0: none)")
    ap.add_argument("--arg", action="append", default=[],
                    help="a dboxfs argument (-s, -o max_idle_threads=1); repeatable")
    ap.add_argument("--allow-other", action="store_true",
                    help="mount dboxfs with -o allow_other (the kernel checks "
                         "permissions; needed for Dovecot's phase, run only then)")
    ap.add_argument("--tmp", default=str(Path(__file__).resolve().parents[2] / "bench" / "tmp"))
    args = ap.parse_args()
    tmp = Path(args.tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    msgs = [(b"From: a@example.org\nTo: b@example.org\nSubject: counts %d\n\n" % i) +
            b"x" * (3000 + i % 4000) + b"\n" for i in range(args.ops)]
    for side in (("dboxfs", "floor") if args.side == "both" else (args.side,)):
        names = PHASES if args.allow_other or side == "floor" else MAILDIR
        req, sysc = measure(tmp, msgs, side, args.arg if side == "dboxfs" else (),
                            SHARED if args.allow_other else (), names)
        for phase in names:
            n = sum(req[phase].values())
            print(f"{side}: requests per {phase}: {n / args.ops:.2f} "
                  f"({_top(req[phase], 12, args.ops)})")
        for phase in names:
            total, calls, sql = sysc[phase]
            print(f"{side}: syscalls per {phase}: {total / args.ops:.1f} "
                  f"({_top(collections.Counter(calls), 14, args.ops)})")
            if sql is not None:
                print(f"{side}: SQL statements per {phase}: {sql[0] / args.ops:.2f} "
                      f"(COMMITs {sql[1] / args.ops:.2f})")
    if args.side == "both" and args.repeats > 0:
        for row in time_rows(args.ops, timed_repeats(tmp, msgs, args.repeats, args.arg)):
            print(f"{row.name}: {_spread(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
