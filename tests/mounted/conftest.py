"""Fixtures for mounted tests: a real dboxfs on a temporary store.

Every mount made here is unmounted in teardown, also when the test fails;
a session finalizer unmounts anything still left under the test's temp
directory (lazy unmount as the last resort), so no FUSE mount outlives
the test run.

The daemon runs in the foreground (-f) as a child of the test, with its
stderr in a log file next to the mount point (Mount.log), so tests can
read its log lines, and sanitizer reports (ASan, LSan at exit, UBSan,
TSan) are not lost to the /dev/null of a daemon: unmount() waits for the
daemon to exit and fails the test if the log holds such a report.
"""
import os
import pwd
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("DBOXFS_BUILD", Path(__file__).resolve().parents[2] / "build"))
DBOXFS = BUILD / "dboxfs"
DBOXADM = BUILD / "dboxadm"
SHARED = Path(os.environ.get("DBOXFS_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))
CORPORA = SHARED / "corpora"


def adm_finishing(*args, limit=60):
    """dboxadm ARGS run to its end (text output), failing the test when it
    is still running after limit seconds: for stores made to trap it."""
    try:
        return subprocess.run([str(DBOXADM), *map(str, args)],
                              capture_output=True, text=True,
                              errors="replace", timeout=limit)
    except subprocess.TimeoutExpired:
        pytest.fail(f"dboxadm {' '.join(map(str, args))}: still running "
                    f"after {limit} s")


def tmpfs(d, size):
    """A generator: a tmpfs of size (mount(8)'s size=, e.g. "6m") on the
    new directory d, yielded, and unmounted when the generator resumes
    (after any dboxfs on it).  For fixtures: `yield from tmpfs(...)`."""
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def preload_shim(tmp_path, monkeypatch, name, source, libs=("-ldl",)):
    """Compile the C source into tmp_path/name.so and preload it (with
    monkeypatch: LD_PRELOAD) into the processes started from now on,
    such as the next mount; skip the test without a C compiler.  Returns
    the shim's path."""
    src, shim = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    src.write_text(source)
    r = subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(src),
                        *libs], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no C compiler for the shim: {r.stderr[-300:]}")
    monkeypatch.setenv("LD_PRELOAD", str(shim))
    # A sanitizer build wants its runtime first in the preload list.
    monkeypatch.setenv("ASAN_OPTIONS", os.environ.get("ASAN_OPTIONS", "") +
                       ":verify_asan_link_order=0")
    return shim


def index_rows(store, sql):
    """The rows of a read-only query of STORE/index.sqlite."""
    db = sqlite3.connect(f"file:{store / 'index.sqlite'}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def is_mounted(path):
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == path for line in f)


def unmount(path):
    """Unmount path; lazy unmount if it is busy.  Never raises."""
    if not is_mounted(path):
        return
    for args in (["fusermount3", "-u", str(path)], ["fusermount3", "-uz", str(path)]):
        subprocess.run(args, stderr=subprocess.DEVNULL)
        for _ in range(50):
            if not is_mounted(path):
                return
            time.sleep(0.1)


# What a sanitizer prints when it finds something (ASan, LSan, UBSan, TSan).
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                     "runtime error:", "WARNING: ThreadSanitizer",
                     "ERROR: ThreadSanitizer")


def sanitizer_report(text):
    """The sanitizer report lines in a daemon log, or []."""
    return [line for line in text.splitlines()
            if any(tag in line for tag in SANITIZER_REPORTS)]


class Mount:
    """A dboxfs mount of `store` on `mnt`, started with extra `options`,
    by root or, with `user`, by that user (uid, primary gid and
    supplementary groups; the store must be theirs)."""

    def __init__(self, store, mnt, options=(), user=None):
        self.store = Path(store)
        self.mnt = Path(mnt)
        self.options = list(options)
        self.user = user
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.log = self.mnt.parent / (self.mnt.name + ".dboxfs.log")
        self.proc = None
        self._log_start = 0

    def mount(self):
        """Start dboxfs -f in the background; return once mounted."""
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        creds = {}
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            creds = dict(user=pw.pw_uid, group=pw.pw_gid,
                         extra_groups=os.getgrouplist(self.user, pw.pw_gid))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(DBOXFS), str(self.store), str(self.mnt), "-f", *self.options],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, **creds)
        deadline = time.monotonic() + 30
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                self.proc = None
                raise AssertionError("dboxfs did not mount: " + self.log_text()[-4000:])
            time.sleep(0.01)
        return self

    def log_text(self):
        """What the daemon logged since the last mount()."""
        if not self.log.exists():
            return ""
        with open(self.log, "rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def kill(self):
        """SIGKILL the daemon (a crash) and take the dead mount away."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None
        subprocess.run(["fusermount3", "-uz", str(self.mnt)], stderr=subprocess.DEVNULL)
        for _ in range(100):
            if not is_mounted(self.mnt):
                return
            time.sleep(0.02)

    def unmount(self):
        """Unmount, wait for the daemon to exit (and release the store
        lock), and fail if it reported a sanitizer error or a bad exit."""
        unmount(self.mnt)
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"dboxfs did not exit after unmount; log: {self.log}")
        reports = sanitizer_report(self.log_text())
        assert not reports, f"sanitizer report in {self.log}:\n" + \
            "\n".join(reports[:20])
        assert rc == 0, f"dboxfs exited with {rc}; log: {self.log}"

    def remount(self):
        self.unmount()
        return self.mount()

    def maildir(self, *parts):
        """Create cur/new/tmp under mnt/parts (a folder) and return it."""
        d = self.mnt.joinpath(*parts)
        for sub in ("cur", "new", "tmp"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        return d


_all_mounts = []


@pytest.fixture
def mount(tmp_path):
    """A fresh store, mounted; unmounted in teardown even on failure."""
    m = Mount(tmp_path / "store", tmp_path / "mnt")
    _all_mounts.append(m)
    try:
        yield m.mount()
    finally:
        m.unmount()


@pytest.fixture
def make_mount(tmp_path):
    """Factory for mounts with options or of existing stores."""
    made = []

    def make(store=None, mnt=None, options=(), mounted=True):
        m = Mount(store or tmp_path / "store", mnt or tmp_path / "mnt", options)
        made.append(m)
        _all_mounts.append(m)
        return m.mount() if mounted else m

    try:
        yield make
    finally:
        for m in made:
            m.unmount()


@pytest.fixture(scope="session", autouse=True)
def no_mount_left_behind():
    yield
    for m in _all_mounts:
        unmount(m.mnt)
        if m.proc is not None:
            m.proc.kill()
            m.proc.wait()


def need_corpora():
    if not CORPORA.is_dir():
        pytest.skip("../shared/corpora not present")
    return CORPORA
