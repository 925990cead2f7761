"""Extended attributes, fallocate and O_TMPFILE, answered as the man page
says (dboxfs(1), "What the mount does not do").

- -o user_xattr: user.* attributes behave as on ext4 (set/get/list/
  remove, XATTR_CREATE / XATTR_REPLACE, ENODATA, ERANGE when the buffer
  is too small, 0-byte probes, on files, messages and directories, not
  on symlinks and fifos, kept across rename, link and remount; cp -a and
  rsync -aX keep them, dboxadm export and import too).  The same steps
  run on ext4 and on the mount and the results must be equal.  trusted.*
  and security.* are not stored (EOPNOTSUPP).
- Without -o user_xattr: every attribute call is EOPNOTSUPP (as on main).
- fallocate on a plain file as on ext4 (sizes, KEEP_SIZE, PUNCH_HOLE);
  on a message EOPNOTSUPP, and posix_fallocate works there anyway.
- O_TMPFILE: EOPNOTSUPP (libfuse 3.14 has no TMPFILE request).
"""
import ctypes
import errno
import os
import subprocess
import time

from conftest import DBOXADM
from kinds_env import tree_view, twin_trees  # noqa: F401

libc = ctypes.CDLL(None, use_errno=True)


def probe(results, what, fn):
    try:
        results.append((what, fn()))
    except OSError as e:
        results.append((what, errno.errorcode[e.errno]))


def c_getxattr(path, name, size):
    """getxattr(2) with a buffer of size bytes: the length, or OSError."""
    buf = ctypes.create_string_buffer(max(size, 1))
    n = libc.getxattr(str(path).encode(), name.encode(), buf if size else None,
                      ctypes.c_size_t(size))
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return n


def c_listxattr(path, size):
    buf = ctypes.create_string_buffer(max(size, 1))
    n = libc.listxattr(str(path).encode(), buf if size else None, ctypes.c_size_t(size))
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return n


def xattr_view(root):
    """(path, sorted user.* attributes with values) of every file and
    directory below root."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                continue
            attrs = sorted((n, os.getxattr(p, n)) for n in os.listxattr(p)
                           if n.startswith("user."))
            out.append((os.path.relpath(p, root), attrs))
    return sorted(out)


def xattr_steps(root):
    w = root / "w"
    for d in ("cur", "new", "tmp"):
        (w / d).mkdir(parents=True)
    f, msg = w / "dovecot-uidlist", w / "cur/1.host:2,S"
    f.write_bytes(b"state\n")
    msg.write_bytes(b"Subject: x\n\nbody\n")
    os.symlink("dovecot-uidlist", w / "link")
    os.mkfifo(w / "fifo")
    r = []
    for p in (f, msg, w / "cur"):
        tag = p.name
        probe(r, f"{tag} empty list", lambda: os.listxattr(p))
        probe(r, f"{tag} set", lambda: os.setxattr(p, "user.mime_type", b"text/plain"))
        probe(r, f"{tag} get", lambda: os.getxattr(p, "user.mime_type"))
        probe(r, f"{tag} create existing", lambda: os.setxattr(
            p, "user.mime_type", b"x", os.XATTR_CREATE))
        probe(r, f"{tag} replace missing", lambda: os.setxattr(
            p, "user.other", b"x", os.XATTR_REPLACE))
        probe(r, f"{tag} replace", lambda: os.setxattr(
            p, "user.mime_type", b"text/html", os.XATTR_REPLACE))
        probe(r, f"{tag} create", lambda: os.setxattr(
            p, "user.bin", bytes(range(256)) * 4, os.XATTR_CREATE))
        probe(r, f"{tag} empty value", lambda: os.setxattr(p, "user.empty", b""))
        probe(r, f"{tag} get empty", lambda: os.getxattr(p, "user.empty"))
        probe(r, f"{tag} missing", lambda: os.getxattr(p, "user.missing"))
        probe(r, f"{tag} probe size", lambda: c_getxattr(p, "user.bin", 0))
        probe(r, f"{tag} small buffer", lambda: c_getxattr(p, "user.bin", 100))
        probe(r, f"{tag} list size", lambda: c_listxattr(p, 0))
        probe(r, f"{tag} list small", lambda: c_listxattr(p, 5))
        probe(r, f"{tag} list", lambda: sorted(os.listxattr(p)))
        probe(r, f"{tag} long name", lambda: os.setxattr(p, "user." + "n" * 251, b"v"))
        probe(r, f"{tag} longest name", lambda: os.setxattr(p, "user." + "n" * 250, b"v"))
        probe(r, f"{tag} remove", lambda: os.removexattr(p, "user.empty"))
        probe(r, f"{tag} remove missing", lambda: os.removexattr(p, "user.empty"))
        probe(r, f"{tag} no namespace", lambda: os.setxattr(p, "mime_type", b"v"))
        probe(r, f"{tag} list after", lambda: sorted(os.listxattr(p)))
        probe(r, f"{tag} ctime moves", lambda: (
            lambda before: (os.setxattr(p, "user.t", b"1"),
                            os.stat(p).st_ctime_ns >= before)[1])(os.stat(p).st_ctime_ns))
        # The value it has: ext4 changes nothing, ctime neither
        # (helper-78).
        probe(r, f"{tag} same value keeps ctime", lambda: (
            lambda before: (time.sleep(0.02), os.setxattr(p, "user.t", b"1"),
                            os.stat(p).st_ctime_ns == before)[2])(os.stat(p).st_ctime_ns))
    probe(r, "symlink set", lambda: os.setxattr(w / "link", "user.a", b"v",
                                                follow_symlinks=False))
    probe(r, "symlink follows", lambda: os.getxattr(w / "link", "user.mime_type"))
    probe(r, "fifo set", lambda: os.setxattr(w / "fifo", "user.a", b"v"))
    probe(r, "rename", lambda: os.rename(msg, w / "new/1.host"))
    probe(r, "link", lambda: os.link(w / "new/1.host", w / "cur/copy:2,"))
    probe(r, "renamed get", lambda: os.getxattr(w / "cur/copy:2,", "user.mime_type"))
    probe(r, "unlink", lambda: os.unlink(w / "new/1.host"))
    probe(r, "view", lambda: xattr_view(w))
    return r


def test_user_xattrs_as_ext4(make_mount, tmp_path):
    base = tmp_path
    plain = base / "plain"
    plain.mkdir()
    m = make_mount(options=["-o", "user_xattr"])
    want = xattr_steps(plain)
    got = xattr_steps(m.mnt)
    assert got == want
    assert ("cur small buffer", "ERANGE") in got and ("cur probe size", 1024) in got
    view = xattr_view(m.mnt / "w")
    m.remount()
    assert xattr_view(m.mnt / "w") == view
    # Limits: the kernel's (64 KiB values) rather than one ext4 block.
    big = m.mnt / "w/dovecot-uidlist"
    os.setxattr(big, "user.big", b"b" * 65536)
    assert os.getxattr(big, "user.big") == b"b" * 65536
    try:
        os.setxattr(big, "user.big", b"b" * 65537)
        raise AssertionError("a value over 64 KiB was set")
    except OSError as e:
        assert e.errno == errno.E2BIG
    os.removexattr(big, "user.big")
    # Namespaces that are not stored.
    for ns in ("trusted.a", "security.a"):
        try:
            os.setxattr(m.mnt / "w/dovecot-uidlist", ns, b"v")
            raise AssertionError(f"{ns} was set")
        except OSError as e:
            assert e.errno == errno.EOPNOTSUPP, ns
    # cp -a and rsync -aX, both ways.
    subprocess.run(["cp", "-a", f"{plain}/w", f"{m.mnt}/cp"], check=True)
    assert xattr_view(m.mnt / "cp") == xattr_view(plain / "w")
    subprocess.run(["rsync", "-aX", f"{m.mnt}/w/", f"{plain}/back"], check=True)
    assert xattr_view(plain / "back") == view
    subprocess.run(["rsync", "-aX", f"{plain}/w/", f"{m.mnt}/rs"], check=True)
    assert xattr_view(m.mnt / "rs") == xattr_view(plain / "w")
    # dboxadm export (mounted) and import.
    out = tmp_path / "export"
    r = subprocess.run([str(DBOXADM), "export", str(m.store), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert xattr_view(out / "w") == view
    store2 = tmp_path / "store2"
    r = subprocess.run([str(DBOXADM), "import", str(store2), str(plain / "w")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    m2 = make_mount(store=store2, mnt=tmp_path / "mnt2", options=["-o", "user_xattr"])
    assert xattr_view(m2.mnt) == xattr_view(plain / "w")
    # dboxadm rebuild keeps them (salvaged from the old index).
    view = xattr_view(m.mnt)
    m.unmount()
    r = subprocess.run([str(DBOXADM), "rebuild", str(m.store)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    m.mount()
    assert xattr_view(m.mnt) == view


def test_rows_of_other_namespaces_are_neither_listed_nor_exported(make_mount, tmp_path):
    """Attribute rows a store's owner wrote into the index by hand
    (security.capability, trusted.*, a name with a NUL): listxattr listed
    them though getxattr refused them, so root's rsync -aX of the mount
    exited 23, and dboxadm export set them on the files it wrote - a
    file capability from a user's index (helper-91).  Only user.* names
    are listed and exported."""
    import sqlite3
    m = make_mount(options=["-o", "user_xattr"])
    f = m.mnt / "plain"
    f.write_bytes(b"x\n")
    os.setxattr(f, "user.kept", b"1")
    ino = os.stat(f).st_ino
    m.unmount()
    db = sqlite3.connect(m.store / "index.sqlite")
    with db:
        for name in (b"security.capability", b"trusted.foo", b"user.a\0b",
                     b"user." + b"x" * 300):
            db.execute("INSERT INTO xattr (ino, name, value) VALUES (?, ?, ?)",
                       (ino, name, b"\x01\x00\x00\x02" + b"\xff" * 16))
    db.close()
    m.mount()
    assert os.listxattr(f) == ["user.kept"]
    out = tmp_path / "rs"
    r = subprocess.run(["rsync", "-aX", f"{m.mnt}/", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.listxattr(out / "plain") == ["user.kept"]
    m.unmount()
    out = tmp_path / "export"
    r = subprocess.run([str(DBOXADM), "export", str(m.store), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.listxattr(out / "plain") == ["user.kept"]


def test_xattrs_off_by_default(mount):
    p = mount.mnt / "file"
    p.write_bytes(b"x")
    for fn in (lambda: os.setxattr(p, "user.a", b"v"), lambda: os.getxattr(p, "user.a"),
               lambda: os.listxattr(p), lambda: os.removexattr(p, "user.a")):
        try:
            fn()
            raise AssertionError("an xattr call succeeded without -o user_xattr")
        except OSError as e:
            assert e.errno == errno.EOPNOTSUPP


def fallocate_steps(root):
    for d in ("cur", "new", "tmp"):
        (root / "w" / d).mkdir(parents=True)
    f = root / "w/plain"
    f.write_bytes(b"abc")
    r = []
    probe(r, "fallocate 1M", lambda: subprocess.run(
        ["fallocate", "-l", "1048576", str(f)], capture_output=True).returncode)
    probe(r, "size", lambda: os.stat(f).st_size)
    probe(r, "keep size", lambda: subprocess.run(
        ["fallocate", "-n", "-o", "1048576", "-l", "65536", str(f)],
        capture_output=True).returncode)
    probe(r, "size kept", lambda: os.stat(f).st_size)
    probe(r, "punch", lambda: subprocess.run(
        ["fallocate", "-p", "-o", "0", "-l", "2", str(f)], capture_output=True).returncode)
    probe(r, "bytes", lambda: f.read_bytes()[:4])
    fd = os.open(root / "w/tmp/1.host", os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, b"Subject: x\n\n")
    probe(r, "posix_fallocate message", lambda: os.posix_fallocate(fd, 0, 100))
    os.close(fd)
    probe(r, "message size", lambda: os.stat(root / "w/tmp/1.host").st_size)
    probe(r, "message bytes", lambda: (root / "w/tmp/1.host").read_bytes())
    return r


def test_fallocate_and_tmpfile(twin_trees):
    base, plain, m = twin_trees
    want = fallocate_steps(plain)
    got = fallocate_steps(m.mnt)
    assert got == want
    assert ("size", 1048576) in got and ("message size", 100) in got
    # On a message fallocate(2) itself is refused.
    r = subprocess.run(["fallocate", "-l", "4096", str(m.mnt / "w/tmp/1.host")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "Operation not supported" in r.stderr, r.stderr
    # O_TMPFILE: EOPNOTSUPP (ext4 has it).
    fd = os.open(plain / "w", os.O_TMPFILE | os.O_WRONLY, 0o600)
    os.close(fd)
    try:
        os.close(os.open(m.mnt / "w", os.O_TMPFILE | os.O_WRONLY, 0o600))
        raise AssertionError("O_TMPFILE worked: update the man page")
    except OSError as e:
        assert e.errno == errno.EOPNOTSUPP
