"""Fixtures for mounted tests: a real dboxfs on a temporary store.

Every mount made here is unmounted in teardown, also when the test fails;
a session finalizer unmounts anything still left under the test's temp
directory (lazy unmount as the last resort), so no FUSE mount outlives
the test run.
"""
import os
import subprocess
import time
from pathlib import Path

import pytest

BUILD = Path(os.environ.get("DBOXFS_BUILD", Path(__file__).resolve().parents[2] / "build"))
DBOXFS = BUILD / "dboxfs"
DBOXADM = BUILD / "dboxadm"
SHARED = Path(os.environ.get("DBOXFS_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))
CORPORA = SHARED / "corpora"


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


class Mount:
    """A dboxfs mount of `store` on `mnt`, started with extra `options`."""

    def __init__(self, store, mnt, options=()):
        self.store = Path(store)
        self.mnt = Path(mnt)
        self.options = list(options)
        self.mnt.mkdir(parents=True, exist_ok=True)

    def mount(self):
        subprocess.run([str(DBOXFS), str(self.store), str(self.mnt), *self.options],
                       check=True, timeout=30)
        assert is_mounted(self.mnt)
        return self

    def unmount(self):
        unmount(self.mnt)
        # The daemon exits after unmount; wait until it released the store lock.
        for _ in range(100):
            r = subprocess.run(["flock", "-n", str(self.store / "lock"), "true"])
            if r.returncode == 0:
                return
            time.sleep(0.05)

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


def need_corpora():
    if not CORPORA.is_dir():
        pytest.skip("../shared/corpora not present")
    return CORPORA
