"""benchlib: what every benchmark shares.

- Row: one line of the results table: samples of dboxfs and of native
  maildir taken side by side in the same run (and of the FUSE floor,
  for the write rows), and the target the ratio dboxfs / native is held
  to (or an absolute limit).
- Mount: a dboxfs mount of a store, always unmounted (even on error).
- Floor: libfuse's passthrough_ll over an ext4 directory, the cheapest a
  FUSE filesystem gets on this machine: what dboxfs is measured against
  apart from FUSE itself.
- timing, repeating (native and dboxfs alternate inside every repeat, so
  a noisy neighbour hurts both alike), dropping caches, small corpora.

Never leaves a FUSE mount behind: every mount goes through Mount, whose
registry is unmounted at exit (atexit) as the last resort.
"""
import atexit
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("DBOXFS_BUILD", ROOT / "build"))
DBOXFS = BUILD / "dboxfs"
DBOXADM = BUILD / "dboxadm"
# Built by the Makefile from libfuse3-dev's example source (never committed).
PASSTHROUGH_LL = BUILD / "passthrough_ll"
GEN_CORPUS = ROOT / "tools" / "gen-corpus"
PYTHON = "/usr/bin/python3"


def log(*args):
    print("[bench]", *args, file=sys.stderr, flush=True)


# --- results ---------------------------------------------------------------

class Row:
    """One benchmark result.

    kind: "time" (seconds, lower is better), "rate" (per second, higher is
    better), "bytes", "count".  dbox and native are lists of samples
    taken in pairs (sample i of both in the same repeat), so ratio i =
    dbox[i] / native[i].  target: (op, value, absolute) where op is "<="
    or ">="; absolute=True compares the dboxfs median itself (mount time,
    RSS), else the median of the paired ratios.  floor: samples of
    passthrough_ll taken in the same repeats; floor_target: (op, value)
    for the median of the ratios dboxfs / floor.
    """

    def __init__(self, name, kind, unit, target=None, note="", floor_target=None):
        self.name, self.kind, self.unit = name, kind, unit
        self.target, self.note = target, note
        self.floor_target = floor_target
        self.dbox, self.native, self.floor = [], [], []
        self.skipped = None

    def add(self, dbox, native=None, floor=None):
        self.dbox.append(dbox)
        if native is not None:
            self.native.append(native)
        if floor is not None:
            self.floor.append(floor)

    def ratios(self):
        return [d / n for d, n in zip(self.dbox, self.native) if n]

    def ratio(self):
        r = self.ratios()
        return statistics.median(r) if r else None

    def floor_ratios(self):
        return [d / f for d, f in zip(self.dbox, self.floor) if f]

    def floor_met(self):
        r = self.floor_ratios()
        if self.floor_target is None or not r:
            return None
        v = statistics.median(r)
        return v <= self.floor_target[1] if self.floor_target[0] == "<=" \
            else v >= self.floor_target[1]

    def value(self):
        """What the target is checked against."""
        if self.target is None:
            return None
        if self.target[2]:
            return statistics.median(self.dbox) if self.dbox else None
        return self.ratio()

    def met(self):
        v = self.value()
        if v is None:
            return None
        op, limit = self.target[0], self.target[1]
        return v <= limit if op == "<=" else v >= limit

    def to_json(self):
        return {"name": self.name, "kind": self.kind, "unit": self.unit,
                "target": self.target, "note": self.note, "dbox": self.dbox,
                "native": self.native, "floor": self.floor,
                "floor_target": self.floor_target, "skipped": self.skipped}

    @classmethod
    def from_json(cls, d):
        row = cls(d["name"], d["kind"], d["unit"],
                  tuple(d["target"]) if d["target"] else None, d["note"],
                  tuple(d["floor_target"]) if d.get("floor_target") else None)
        row.dbox, row.native, row.skipped = d["dbox"], d["native"], d["skipped"]
        row.floor = d.get("floor", [])
        return row


def skipped(name, why, target=None):
    row = Row(name, "time", "s", target)
    row.skipped = why
    return row


# --- running things --------------------------------------------------------

def run(args, **kw):
    """subprocess.run with check=True and text output captured."""
    kw.setdefault("check", True)
    return subprocess.run([str(a) for a in args], **kw)


def timed(fn, *args, **kw):
    """(seconds, result) of fn(*args, **kw), monotonic wall time."""
    t = time.monotonic()
    res = fn(*args, **kw)
    return time.monotonic() - t, res


def sh_time(cmd, cwd=None):
    """Wall seconds of a shell command (output thrown away)."""
    t = time.monotonic()
    subprocess.run(cmd, shell=True, check=True, cwd=cwd,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def drop_caches():
    """Write back and drop the page, dentry and inode caches (root)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def fmt_num(v, unit):
    if v is None:
        return "-"
    if unit == "B":
        for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if v >= s:
                return f"{v / s:.1f} {u}"
        return f"{v:.0f} B"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
    if v >= 100:
        return f"{v:,.0f} {unit}".strip()
    return f"{v:.3g} {unit}".strip()


# --- mounts ----------------------------------------------------------------

def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


_mounts = []


def unmount_path(mnt):
    """fusermount3 -u mnt, lazily (-uz) if it stays busy; waits up to 5 s
    for each."""
    for args in (["fusermount3", "-u", mnt], ["fusermount3", "-uz", mnt]):
        if not is_mounted(mnt):
            break
        subprocess.run([str(a) for a in args], stderr=subprocess.DEVNULL)
        for _ in range(100):
            if not is_mounted(mnt):
                break
            time.sleep(0.05)


class _FuseOpenToUsers:
    """/dev/fuse readable and writable by everyone (Debian's 0666) while
    an ordinary user mounts: libfuse opens it before it falls back to
    fusermount3, and containers often make it 0600.  The mode it had is
    put back on exit."""

    DEV = Path("/dev/fuse")

    def __enter__(self):
        self.mode = self.DEV.stat().st_mode & 0o7777
        if self.mode & 0o006 != 0o006:
            self.DEV.chmod(0o666)
        return self

    def __exit__(self, *exc):
        self.DEV.chmod(self.mode)


class Mount:
    """dboxfs STORE MNT [-o options]: mounted on enter, unmounted on exit.
    Without options the mount is its user's alone (root's, or with user
    that user's, who must be able to create STORE) and the daemon checks
    permissions; allow_other lets others in and leaves the checks to the
    kernel."""

    def __init__(self, store, mnt, options=(), debug_log=None, args=(), user=None):
        self.store, self.mnt = Path(store), Path(mnt)
        self.options = list(options)
        self.args = list(args)  # more command line arguments (-s)
        self.user = user
        self.mount_seconds = None
        self.debug_log = debug_log
        self.proc = None

    def mount(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        args = [DBOXFS, self.store, self.mnt, *self.args]
        if self.options:
            args += ["-o", ",".join(self.options)]
        if self.user is not None:
            # fusermount3 wants a mount point its user may write.
            shutil.chown(self.mnt, self.user, self.user)
            args = ["runuser", "-u", self.user, "--", *args]
        _mounts.append(self)
        if self.debug_log is not None:
            # -d: libfuse logs every request to stderr (request counts).
            self.proc = _start_logged(args + ["-d"], self.debug_log, self.mnt)
            return self
        # dboxfs returns once the store is open and the mount is up.
        if self.user is not None:
            with _FuseOpenToUsers():
                self.mount_seconds, _ = timed(run, args)
        else:
            self.mount_seconds, _ = timed(run, args)
        if not is_mounted(self.mnt):
            raise RuntimeError(f"dboxfs did not mount {self.mnt}")
        return self

    def pid(self):
        """PID of the daemon serving this mount (by its command line)."""
        if self.proc is not None:
            return self.proc.pid
        store = str(self.store)
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"dboxfs") and store.encode() in argv:
                return int(d)
        return None

    def rss_bytes(self):
        pid = self.pid()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return None

    def unmount(self):
        unmount_path(self.mnt)
        if self.proc is not None:
            self.proc.wait()
            self.proc = None
        # The daemon exits after the unmount; wait for the store lock.
        for _ in range(200):
            r = subprocess.run(["flock", "-n", str(self.store / "lock"), "true"])
            if r.returncode == 0:
                break
            time.sleep(0.05)

    def __enter__(self):
        return self.mount()

    def __exit__(self, *exc):
        self.unmount()


def _start_logged(args, log_path, mnt):
    """Start a FUSE daemon in the foreground (-d given by the caller),
    stderr into log_path; return its Popen once mnt is mounted."""
    logf = open(log_path, "w")
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.DEVNULL,
                            stderr=logf, preexec_fn=_raise_nofile)
    logf.close()
    for _ in range(400):
        if is_mounted(mnt):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.025)
    raise RuntimeError(f"{args[0]} did not mount {mnt}: see {log_path}")


def _raise_nofile():
    """In the child: as many descriptors as allowed (passthrough_ll holds
    an O_PATH descriptor per inode it has looked up): the kernel's
    maximum with CAP_SYS_RESOURCE, else the hard limit."""
    import resource
    n = int(Path("/proc/sys/fs/nr_open").read_text())
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))
    except (ValueError, OSError):
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def floor_max_inodes():
    """How many inodes passthrough_ll can hold at once here (its
    descriptor limit, less a margin for the directories and its own)."""
    import resource
    n = int(Path("/proc/sys/fs/nr_open").read_text())
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if os.geteuid() == 0 and hard < n:
        try:  # can this process raise it (CAP_SYS_RESOURCE)?
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, n))
            hard = n
        except (ValueError, OSError):
            pass
    return hard - 200


class Floor:
    """libfuse's passthrough_ll serving source (a directory on the same
    ext4 as the native side) on mnt: the FUSE floor.  cache=always (the
    kernel keeps names, attributes and pages, as it does for dboxfs with
    its 3600 s timeouts and keep_cache), allow_other (Dovecot runs as
    mail), no default_permissions (passthrough_ll checks nothing).
    debug_log: run with -d and log every request there."""

    def __init__(self, source, mnt, debug_log=None):
        self.source, self.mnt = Path(source), Path(mnt)
        self.debug_log = debug_log
        self.proc = None

    def mount(self):
        self.mnt.mkdir(parents=True, exist_ok=True)
        args = [PASSTHROUGH_LL, "-f", "-o",
                f"source={self.source},cache=always,allow_other", self.mnt]
        if self.debug_log is not None:
            args.append("-d")
        _mounts.append(self)
        self.proc = _start_logged(args, self.debug_log or os.devnull, self.mnt)
        return self

    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def unmount(self):
        unmount_path(self.mnt)
        if self.proc is not None:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def __enter__(self):
        return self.mount()

    def __exit__(self, *exc):
        self.unmount()


@atexit.register
def _unmount_all():
    for m in _mounts:
        if is_mounted(m.mnt):
            m.unmount()


# --- corpora ---------------------------------------------------------------

def fresh_dir(path):
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def corpus(tmp, n, seed=1):
    """A flat gen-corpus maildir of n realistic messages (all in cur/),
    cached in tmp across runs: the seed fixes its bytes."""
    path = Path(tmp) / f"corpus-{n}-seed{seed}"
    done = path / ".complete"
    if not done.exists():
        log(f"generating a {n}-message corpus (seed {seed})")
        if path.exists():
            shutil.rmtree(path)
        run([PYTHON, GEN_CORPUS, path, "--messages", n, "--seed", seed,
             "--flat", "--folders", "INBOX"])
        done.touch()
    return path


def corpus_messages(path):
    """Bytes of every message of a flat corpus, in name order."""
    cur = Path(path) / "cur"
    return [(cur / name).read_bytes() for name in sorted(os.listdir(cur))]


def tiny_maildir(path, n, start=1_790_000_000):
    """A maildir whose cur/ holds n small messages (about 300 bytes) with
    maildir names and flags: for listing and scale, where sizes do not
    matter and n is large.  Written straight with os calls (fast)."""
    path = Path(path)
    for sub in ("cur", "new", "tmp"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    cur = os.open(path / "cur", os.O_RDONLY | os.O_DIRECTORY)
    flags = ("S", "RS", "FS", "S", "")
    try:
        for i in range(n):
            when = start - i * 29
            name = f"{when}.M{i % 1000000}P{1000 + i % 9000}Q{i}.bench.example.org:2,{flags[i % 5]}"
            body = (f"From: bench{i % 97}@example.org\nTo: user@example.org\n"
                    f"Subject: message {i}\nMessage-ID: <{i}.{when}@bench.example.org>\n"
                    f"Date: Thu, 1 Jan 2026 00:00:00 +0000\n\nBody of message {i}.\n").encode()
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=cur)
            os.write(fd, body)
            os.close(fd)
            os.utime(name, (when, when), dir_fd=cur)
    finally:
        os.close(cur)
    return path


def import_store(store, maildir):
    """A new store holding maildir (dboxadm import)."""
    store = Path(store)
    if store.exists():
        shutil.rmtree(store)
    run([DBOXADM, "import", store, maildir], stdout=subprocess.DEVNULL)
    return store


def du_bytes(path):
    """Bytes on disk (du -s -B1: allocated blocks) of a tree."""
    out = run(["du", "-s", "-B1", path], capture_output=True, text=True).stdout
    return int(out.split()[0])


def count_inodes(path):
    """Files and directories in a tree, path itself included."""
    n = 1
    for _, dirs, files in os.walk(path):
        n += len(dirs) + len(files)
    return n


def sides(r, fns):
    """Run one repeat of every side (callables, in a fixed order); the
    side that goes first rotates with the repeat number r.  Returns their
    results in the order of fns."""
    out = [None] * len(fns)
    for k in range(len(fns)):
        i = (r + k) % len(fns)
        out[i] = fns[i]()
    return out


def paired(r, native_fn, dbox_fn):
    """Run one repeat of both sides; the side that goes first alternates
    with the repeat number r.  Returns (dbox result, native result)."""
    if r % 2 == 0:
        nat = native_fn()
        dbx = dbox_fn()
    else:
        dbx = dbox_fn()
        nat = native_fn()
    return dbx, nat
