"""Mount points that cannot work are refused before anything changes.

A store inside its own mount point would hang every access; a dead mount
(daemon killed) left on the mount point would be stacked over; an unknown
-o option must not leave a new empty store behind.
"""
import os
import signal
import subprocess
import time

from conftest import DBOXFS, is_mounted


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
