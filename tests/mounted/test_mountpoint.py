"""Mount points that cannot work are refused before anything changes.

A store inside its own mount point would hang every access; a dead mount
(daemon killed) left on the mount point would be stacked over; an unknown
-o option must not leave a new empty store behind.
"""
import os
import signal
import subprocess
import time

import pytest

from conftest import DBOXFS, is_mounted, unmount


def run_dboxfs(*args):
    return subprocess.run([str(DBOXFS), *map(str, args)], capture_output=True,
                          text=True, timeout=30)


def test_store_inside_mount_point_is_refused(tmp_path):
    mnt = tmp_path / "mnt"
    (mnt / "inner").mkdir(parents=True)
    for store in (mnt / "inner", mnt, mnt / "new-store"):
        r = run_dboxfs(store, mnt)
        assert r.returncode != 0
        assert "inside the mount point" in r.stderr
        assert not is_mounted(mnt)
    assert os.listdir(mnt) == ["inner"]  # nothing created
    assert os.listdir(mnt / "inner") == []


def test_unknown_option_creates_no_store(tmp_path):
    (tmp_path / "mnt").mkdir()
    r = run_dboxfs("-o", "no_such_option=1", tmp_path / "store", tmp_path / "mnt")
    assert r.returncode != 0
    assert not (tmp_path / "store").exists()
    assert not is_mounted(tmp_path / "mnt")


BAD_NUMBERS = [
    ("rotate_size=0", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=-1", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=12abc", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=4294967296", "want a whole number of bytes from 1 to 4294967295"),
    ("rotate_size=18446744073709551617", "want a whole number of bytes from 1 to 4294967295"),
    ("entry_timeout=-1", "want seconds from 0 to 31536000"),
    ("entry_timeout=nan", "want seconds from 0 to 31536000"),
    ("entry_timeout=1e99", "want seconds from 0 to 31536000"),
    ("attr_timeout=abc", "want seconds from 0 to 31536000"),
    ("attr_timeout=31536000.5", "want seconds from 0 to 31536000"),
    ("purge_threshold=101", "want a whole percentage from 0 to 100"),
    ("purge_threshold=-1", "want a whole percentage from 0 to 100"),
    ("purge_threshold=4294967296", "want a whole percentage from 0 to 100"),
    ("purge_threshold=", "want a whole percentage from 0 to 100"),
]


@pytest.mark.parametrize("opt,want", BAD_NUMBERS, ids=[o for o, _ in BAD_NUMBERS])
def test_numeric_option_out_of_range_is_refused(tmp_path, opt, want):
    """One line naming the option and its range, exit 1, and neither a new
    store nor a change to an existing one."""
    (tmp_path / "mnt").mkdir()
    try:
        r = run_dboxfs(tmp_path / "store", tmp_path / "mnt", "-o", "ro," + opt)
        assert not is_mounted(tmp_path / "mnt")
    finally:
        unmount(tmp_path / "mnt")
    assert r.returncode == 1
    assert r.stderr == f"{DBOXFS}: -o {opt}: {want}\n"
    assert not (tmp_path / "store").exists()


def test_numeric_options_at_their_limits_mount(make_mount):
    """The ends of every range are accepted, and the bad one of two
    occurrences is found."""
    m = make_mount(options=["-o", "rotate_size=1,entry_timeout=0,attr_timeout=0.5,"
                                  "purge_threshold=100"])
    (m.mnt / "cur" / "1.x:2,S").write_bytes(b"Subject: a\n\na\n")
    (m.mnt / "cur" / "2.x:2,S").write_bytes(b"Subject: b\n\nb\n")
    m.unmount()
    assert sorted(p.name for p in (m.store / "storage").glob("m.*")) == ["m.1", "m.2"]
    m2 = make_mount(store=m.store, options=["-o", "rotate_size=4294967295,"
                                            "entry_timeout=31536000,purge_threshold=0"])
    assert (m2.mnt / "cur" / "2.x:2,S").read_bytes() == b"Subject: b\n\nb\n"
    m2.unmount()
    before = sorted(os.listdir(m.store))
    try:
        r = run_dboxfs(m.store, m.mnt, "-o", "purge_threshold=5", "-o", "purge_threshold=500")
    finally:
        unmount(m.mnt)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [f"{DBOXFS}: -o purge_threshold=500: "
                                     "want a whole percentage from 0 to 100"]
    assert sorted(os.listdir(m.store)) == before
    assert not is_mounted(m.mnt)


def test_dead_mount_is_not_stacked_over(tmp_path):
    store, mnt = tmp_path / "store", tmp_path / "mnt"
    mnt.mkdir()
    try:
        assert run_dboxfs(store, mnt).returncode == 0  # a daemon in the background
        pid = int(subprocess.run(["pgrep", "-f", f"dboxfs {store} "],
                                 capture_output=True, text=True).stdout.split()[0])
        # The crash: the daemon dies, its mount stays (no fusermount3 -u).
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            try:
                os.stat(mnt)
            except OSError:
                break
            time.sleep(0.05)
        r = run_dboxfs(store, mnt)
        assert r.returncode != 0
        assert "fusermount3 -u" in r.stderr
        with open("/proc/mounts") as f:
            assert sum(line.split()[1] == str(mnt) for line in f) == 1
    finally:
        while is_mounted(mnt):
            subprocess.run(["fusermount3", "-uz", str(mnt)], stderr=subprocess.DEVNULL)
