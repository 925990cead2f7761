"""Every exit says why, and bytes from files are escaped when shown.

dboxfs and dboxadm refuse or stop with one line naming the reason; text
taken from a store (metadata bytes, names) reaches a terminal or the log
with its control bytes escaped, so a hostile file cannot clear a screen,
recolour it or forge log lines.
"""
import os
import subprocess
import time

import pytest

from conftest import DBOXADM, DBOXFS, Mount, is_mounted, unmount

EVIL_NAME = "evil\x1b[31mRED\x07:2,"
EVIL_GUID = b"\x1b[2J\x9b1m\n"  # clear screen, an 8-bit CSI, a new line


def raw_controls(data):
    """Control bytes in data other than the line and tab breaks, and
    the 8-bit CSI (0x9b) outside a UTF-8 sequence."""
    bad = [b for b in data if (b < 0x20 and b not in (0x09, 0x0a)) or b == 0x7f]
    return bad + ([0x9b] if b"\x9b" in data.replace(b"\xc2\x9b", b"") else [])


def run_dboxfs(store, mnt, *opts):
    """Run dboxfs -f; a mount it makes (old code mounted some stores it
    must refuse) is taken away again.  Returns the finished process."""
    mnt.mkdir(exist_ok=True)
    with subprocess.Popen([str(DBOXFS), str(store), str(mnt), "-f", *opts],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as p:
        deadline = time.monotonic() + 30
        while p.poll() is None and time.monotonic() < deadline:
            if is_mounted(mnt):
                unmount(mnt)
                break
            time.sleep(0.02)
        out, err = p.communicate(timeout=60)
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.parametrize("lock", ["directory", "symlink", "fifo"])
def test_dboxfs_says_why_it_cannot_take_the_lock(tmp_path, lock):
    m = Mount(tmp_path / "store", tmp_path / "mnt").mount()
    m.unmount()
    path = m.store / "lock"
    path.unlink()
    if lock == "directory":
        path.mkdir()
    elif lock == "symlink":
        path.symlink_to(tmp_path / "elsewhere")
    else:
        os.mkfifo(path)
    r = run_dboxfs(m.store, m.mnt)
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "lock" in lines[0], r.stderr
    assert not (tmp_path / "elsewhere").exists()


def test_dboxfs_says_why_on_every_refusal(tmp_path):
    """A store that is a file, a store that cannot be read: one line each."""
    (tmp_path / "file").write_text("x")
    r = run_dboxfs(tmp_path / "file", tmp_path / "mnt")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "file" in r.stderr


@pytest.mark.parametrize("layout", ["top", "folder"])
def test_dboxfs_says_a_maildir_is_not_a_store(tmp_path, layout):
    """A Maildir given as STORE: the hint is import, never rebuild."""
    md = tmp_path / "Maildir"
    top = md if layout == "top" else md / ".Sent"
    for sub in ("cur", "new", "tmp"):
        (top / sub).mkdir(parents=True)
    (top / "cur" / "1:2,S").write_bytes(b"Subject: x\n\nx\n")
    r = run_dboxfs(md, tmp_path / "mnt")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "maildir, not a store" in r.stderr, r.stderr
    assert "dboxadm import" in r.stderr and "rebuild" not in r.stderr
    assert sorted(os.listdir(md)) == sorted(
        ["cur", "new", "tmp"] if layout == "top" else [".Sent"])


def damaged_store(tmp_path):
    """A store with a message named with terminal escapes, whose record's
    GUID was overwritten with an escape sequence."""
    m = Mount(tmp_path / "store", tmp_path / "mnt").mount()
    (m.mnt / "tmp" / "x").write_bytes(b"Subject: x\n\nbody\n")
    os.rename(m.mnt / "tmp" / "x", m.mnt / "cur" / EVIL_NAME)
    m.unmount()
    p = m.store / "storage" / "m.1"
    data = p.read_bytes()
    i = data.index(b"\nG") + 2
    p.write_bytes(data[:i] + EVIL_GUID[:-1] + data[i + len(EVIL_GUID) - 1:])
    return m


def test_check_escapes_bytes_from_the_store(tmp_path):
    m = damaged_store(tmp_path)
    r = subprocess.run([str(DBOXADM), "check", str(m.store)], capture_output=True)
    assert r.returncode == 1
    assert b"GUID" in r.stdout
    assert raw_controls(r.stdout + r.stderr) == [], r.stdout
    assert b"\\x1b[2J" in r.stdout, r.stdout


def test_daemon_log_escapes_bytes_from_the_store(tmp_path):
    m = damaged_store(tmp_path)
    m.mount()
    try:
        with pytest.raises(OSError):
            (m.mnt / "cur" / EVIL_NAME).read_bytes()
    finally:
        m.unmount()
    log = m.log.read_bytes()
    assert b"GUID" in log
    assert raw_controls(log) == [], log


def terminal_controls(data):
    """Every character of data that could act on a terminal but a line or
    tab break: C0, DEL, the C1 controls U+0080-U+009F as UTF-8, and bytes
    of no UTF-8 sequence in 0x80-0x9f (an 8-bit CSI alone)."""
    text = data.decode("utf-8", "surrogateescape")
    return [hex(ord(c)) for c in text
            if (ord(c) < 0x20 and c not in "\t\n") or ord(c) == 0x7f
            or 0x80 <= ord(c) <= 0x9f or 0xdc80 <= ord(c) <= 0xdc9f]


def test_dump_and_json_escape_c1_controls(tmp_path):
    """A folder named with a C1 control (U+009B, a CSI to a terminal that
    takes 8-bit controls) and a GUID with the byte 0x9b alone reach root's
    terminal escaped from `dump` and `stats --json`, as from check and the
    log (helper-83: both went through as they were)."""
    m = Mount(tmp_path / "store", tmp_path / "mnt").mount()
    folder = m.maildir(".evil\u009b31mRED")
    (folder / "tmp" / "x").write_bytes(b"Subject: x\n\nbody\n")
    os.rename(folder / "tmp" / "x", folder / "cur" / "x:2,")
    m.unmount()
    p = m.store / "storage" / "m.1"
    data = p.read_bytes()
    i = data.index(b"\nG") + 2
    p.write_bytes(data[:i] + b"\x9b1m" + data[i + 3:])
    dump = subprocess.run([str(DBOXADM), "dump", str(m.store), "m.1"],
                          capture_output=True)
    assert dump.returncode == 0, dump.stderr
    assert b"\\x9b1m" in dump.stdout and b"\\xc2\\x9b31mRED" in dump.stdout, dump.stdout
    stats = subprocess.run([str(DBOXADM), "stats", str(m.store), "--json"],
                           capture_output=True)
    assert stats.returncode == 0, stats.stderr
    assert b"\\u009b31mRED" in stats.stdout, stats.stdout
    for out in (dump.stdout + dump.stderr, stats.stdout + stats.stderr):
        assert terminal_controls(out) == [], out


def test_root_verb_on_a_missing_name_in_tmp_says_it_is_missing():
    """Root's check of a mistyped store name straight in /tmp said only
    that root makes no store in a directory others may write to, which
    read as a refusal of a store that exists (helper-90)."""
    if os.geteuid() != 0:
        pytest.skip("root's rule")
    name = f"/tmp/dboxfs-no-such-store-{os.getpid()}"
    assert not os.path.exists(name)
    for verb in ("check", "stats"):
        r = subprocess.run([str(DBOXADM), verb, name], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert f"{name}: No such file or directory" in r.stderr, r.stderr
    assert not os.path.exists(name)
