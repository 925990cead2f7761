"""The mount stays usable when the machine is short of something: disk
space, open files, or time (a big message being written must not hold
up everyone else).

Each test makes the shortage real - a small filesystem of its own, a low
RLIMIT_NOFILE, a message of hundreds of MiB - and checks what clients see
against what a local filesystem gives them.
"""
import errno
import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from conftest import DBOXADM

RNG = random.Random(12)


def adm(*args):
    return subprocess.run([str(DBOXADM), *map(str, args)], capture_output=True,
                          timeout=300)


def check_problems(store):
    r = adm("check", store, "--json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)["problems"]


def tree(root):
    """{relative path: bytes} of every regular file under root."""
    out = {}
    for d, _dirs, files in os.walk(root):
        for n in files:
            p = Path(d) / n
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 6 MiB tmpfs, unmounted in teardown (after any dboxfs on it)."""
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs",
                    str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def delivery_errors(path, data):
    """Deliver data to path the way an agent does (write, fsync, close)
    and go on after a failure, as agents do to clean up: the errno of
    each step that failed, as {step: errno}."""
    errs = {}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        errs["write"] = e.errno
    try:
        os.fsync(fd)
    except OSError as e:
        errs["fsync"] = e.errno
    try:
        os.close(fd)
    except OSError as e:
        errs["close"] = e.errno
    return errs


# --- a full disk with compression -----------------------------------------------

def test_compressed_delivery_out_of_space_is_enospc_throughout(small_tmpfs, make_mount,
                                                              tmp_path):
    """-o compress=gz: the delivery that runs out of space gets ENOSPC at
    every step that fails (write, fsync and close), never EIO; what was
    delivered before is intact and the store is clean."""
    m = make_mount(store=small_tmpfs / "store", mnt=tmp_path / "mnt",
                   options=["-o", "compress=gz"])
    md = m.maildir()
    delivered, failed = {}, None
    for i in range(200):
        name = f"{i}.gz.host"
        # Random bytes do not compress: the stream takes their size.
        data = b"Subject: %d\n\n" % i + RNG.randbytes(300_000)
        failed = delivery_errors(md / "tmp" / name, data)
        if failed:
            break
        os.rename(md / "tmp" / name, md / "new" / name)
        delivered[name] = data
    assert failed, "the disk never filled"
    assert delivered
    assert set(failed.values()) == {errno.ENOSPC}, failed
    # A failed write or fsync is reported again at close.
    assert "close" in failed, failed
    assert tree(md / "new") == delivered
    m.unmount()
    assert check_problems(m.store) == []
    m.mount()
    assert tree(md / "new") == delivered
