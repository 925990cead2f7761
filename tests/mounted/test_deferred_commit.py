"""Deferred commits (docs/durability.md, "Deferred commits").

A message renamed within its directory (a flag change in cur/) is not
committed to the index when rename() returns: it shares the next commit,
made by any other operation or by the mount's thread at most
DBOX_DEFER_MS (10 ms) later.  What that may cost is bounded: a daemon
killed within those milliseconds undoes the flag change, never the
message.  These tests hold the mount to each side of that promise, as
another process (SQLite's own module, or dboxadm) sees the index.
"""
import os
import subprocess
import time

from conftest import DBOXADM, index_rows

N = 60


def deliver(md, n, prefix="m"):
    """n messages into cur/ (tmp/, fsync, rename: each commits at once);
    {name: bytes}."""
    sent = {}
    for i in range(n):
        name = f"{prefix}{i}.dboxfs.test:2,"
        body = f"Subject: {prefix} {i}\n\n{'x' * (i * 37 % 3000)}\n".encode()
        with open(md / "tmp" / name, "wb") as f:
            f.write(body)
            os.fsync(f.fileno())
        os.rename(md / "tmp" / name, md / "cur" / name)
        sent[name] = body
    return sent


def flag_all(md, sent):
    """Rename every message to its name with flag S; the new names."""
    for name in sent:
        os.rename(md / "cur" / name, md / "cur" / (name + "S"))
    return {name + "S": body for name, body in sent.items()}


def flagged_in_index(store):
    return index_rows(store, "SELECT count(*) FROM entry WHERE CAST(name AS TEXT) LIKE '%:2,S'")[0][0]


def check_clean(store):
    r = subprocess.run([str(DBOXADM), "check", str(store)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def cur_of(md):
    return {n: (md / "cur" / n).read_bytes() for n in os.listdir(md / "cur")}


def test_flag_renames_reach_the_index_within_the_bound(mount):
    """Without any other operation after them, the mount's thread commits
    the renames: another connection sees them soon (10 ms, plus a loaded
    machine's delays), not at the next client operation."""
    md = mount.maildir("")
    flag_all(md, deliver(md, N))
    deadline = time.monotonic() + 5
    while flagged_in_index(mount.store) < N and time.monotonic() < deadline:
        time.sleep(0.005)
    assert flagged_in_index(mount.store) == N


def test_a_kill_right_after_flag_renames_loses_no_message(mount):
    """SIGKILL at once after the renames: each message is there exactly
    once with its bytes, under its old or its new name, and the store is
    clean."""
    md = mount.maildir("")
    sent = deliver(md, N)
    flag_all(md, sent)
    mount.kill()
    mount.mount()
    got = cur_of(md)
    assert len(got) == N
    for name, body in sent.items():
        copies = [n for n in (name, name + "S") if n in got]
        assert len(copies) == 1, (name, copies)
        assert got[copies[0]] == body
    check_clean(mount.store)


def test_a_kill_after_the_bound_keeps_every_flag_rename(mount):
    """Renames that returned longer ago than the bound are committed: a
    SIGKILL then keeps every one (as it keeps every other operation)."""
    md = mount.maildir("")
    want = flag_all(md, deliver(md, N))
    time.sleep(0.5)  # 50 times DBOX_DEFER_MS
    mount.kill()
    mount.mount()
    assert cur_of(md) == want
    check_clean(mount.store)


def test_a_delivery_commits_the_flag_renames_before_it(mount):
    """A delivery's rename out of tmp/ commits at once, and that commit
    carries every deferred rename made before it: killed right after the
    delivery returned, both are kept."""
    md = mount.maildir("")
    want = flag_all(md, deliver(md, N))
    want.update(deliver(md, 1, prefix="late"))
    mount.kill()
    mount.mount()
    assert cur_of(md) == want
    check_clean(mount.store)


def test_an_unmount_right_after_flag_renames_keeps_them(mount):
    """A clean unmount (and SIGTERM, which stops the mount the same way)
    commits what is deferred before the index closes."""
    md = mount.maildir("")
    want = flag_all(md, deliver(md, N))
    mount.unmount()
    assert flagged_in_index(mount.store) == N
    mount.mount()
    assert cur_of(md) == want


def test_a_failed_rename_leaves_the_deferred_ones(mount, tmp_path):
    """A rename that fails (its target a non-empty directory) after
    deferred ones undoes itself only: the mount and, once committed, the
    index show the earlier renames; a plain directory does the same."""
    md = mount.maildir("")
    plain = tmp_path / "plain"
    for d in (md, plain):
        for sub in ("cur", "new", "tmp"):
            (d / sub).mkdir(parents=True, exist_ok=True)
    results = []
    for d in (md, plain):
        sent = deliver(d, 5)
        (d / "cur" / "dir").mkdir()
        (d / "cur" / "dir" / "f").write_bytes(b"x")
        flag_all(d, sent)  # deferred: the failing rename comes at once
        try:
            os.rename(d / "cur" / "dir", d / "cur" / (next(iter(sent)) + "S"))
            results.append("renamed")
        except OSError as e:
            results.append(e.errno)
        results.append(sorted(os.listdir(d / "cur")))
    assert results[0:2] == results[2:4]
    mount.unmount()
    assert flagged_in_index(mount.store) == 5
    mount.mount()
