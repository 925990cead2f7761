"""Fifos, sockets and devices behave as on ext4, in plain directories and
in cur/ new/ tmp/ (where they are not messages).

mkfifo, mknod (character and block, as root), bind() of a unix socket;
then I/O through them (served by the kernel), link, rename (over one
another too), chmod, chown, utimensat, open with O_TRUNC, truncate,
unlink.  The same steps run on a plain ext4 directory and on the mount
and every result (or errno) must be equal, also after a remount, rsync
-a, dboxadm export and import.  Then gpg-agent with its GNUPGHOME on the
mount (its socket S.gpg-agent), and a socket in a $HOME-like 0700 dir
served to another process.
"""
import errno
import os
import shutil
import socket
import stat
import subprocess
import threading

import pytest

from conftest import DBOXADM
from kinds_env import tree_view, twin_trees  # noqa: F401


def probe(results, what, fn):
    try:
        results.append((what, fn()))
    except OSError as e:
        results.append((what, errno.errorcode[e.errno]))


def lview(p):
    st = os.lstat(p)
    return (stat.S_IFMT(st.st_mode), oct(stat.S_IMODE(st.st_mode)), st.st_size,
            st.st_nlink, st.st_uid, st.st_gid, st.st_rdev)


def fifo_roundtrip(path):
    r = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        w = os.open(path, os.O_WRONLY)
        os.write(w, b"through the fifo")
        os.close(w)
        return os.read(r, 100)
    finally:
        os.close(r)


def socket_roundtrip(path):
    # Closed also on failure: a bound socket would keep the mount busy.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as cli:
        srv.bind(str(path))
        srv.listen(1)
        cli.connect(str(path))
        conn, _ = srv.accept()
        with conn:
            cli.sendall(b"through the socket")
            return conn.recv(100)


def special_steps(root):
    w = root / "w"
    for d in ("cur", "new", "tmp"):
        (w / d).mkdir(parents=True)
    r = []
    for where in (w, w / "cur"):
        tag = where.name
        probe(r, f"{tag} mkfifo", lambda: os.mkfifo(where / "fifo", 0o640))
        probe(r, f"{tag} mknod chr",
              lambda: os.mknod(where / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3)))
        probe(r, f"{tag} mknod blk",
              lambda: os.mknod(where / "loop", stat.S_IFBLK | 0o660, os.makedev(7, 0)))
        probe(r, f"{tag} mknod sock", lambda: os.mknod(where / "msock", stat.S_IFSOCK | 0o600))
        probe(r, f"{tag} mknod reg", lambda: os.mknod(where / "reg", stat.S_IFREG | 0o600))
        probe(r, f"{tag} exists", lambda: os.mkfifo(where / "fifo"))
        for n in ("fifo", "null", "loop", "msock", "reg"):
            probe(r, f"{tag} lstat {n}", lambda: lview(where / n))
        probe(r, f"{tag} fifo io", lambda: fifo_roundtrip(where / "fifo"))
        probe(r, f"{tag} socket io", lambda: socket_roundtrip(where / "sock"))
        probe(r, f"{tag} lstat sock", lambda: lview(where / "sock"))
        probe(r, f"{tag} bind again", lambda: socket_roundtrip(where / "sock"))
        probe(r, f"{tag} link", lambda: os.link(where / "fifo", where / "fifo2"))
        probe(r, f"{tag} link lstat", lambda: lview(where / "fifo"))
        probe(r, f"{tag} chmod", lambda: os.chmod(where / "fifo", 0o600))
        probe(r, f"{tag} chown", lambda: os.chown(where / "null", 12, 34))
        t = 1_400_000_000_987_654_321
        probe(r, f"{tag} utime", lambda: os.utime(where / "sock", ns=(t, t)))
        probe(r, f"{tag} utime lstat", lambda: os.lstat(where / "sock").st_mtime_ns)
        probe(r, f"{tag} open trunc", lambda: os.close(os.open(
            where / "fifo", os.O_RDWR | os.O_TRUNC)))
        probe(r, f"{tag} truncate", lambda: os.truncate(where / "fifo", 0))
        probe(r, f"{tag} opendir", lambda: os.listdir(where / "fifo"))
        probe(r, f"{tag} rename", lambda: os.rename(where / "fifo2", where / "moved"))
        probe(r, f"{tag} rename over", lambda: os.rename(where / "msock", where / "moved"))
        probe(r, f"{tag} moved lstat", lambda: lview(where / "moved"))
        probe(r, f"{tag} fifo after", lambda: lview(where / "fifo"))
        probe(r, f"{tag} unlink", lambda: os.unlink(where / "sock"))
        probe(r, f"{tag} unlinked", lambda: os.lstat(where / "sock"))
    probe(r, "rename to new", lambda: os.rename(w / "cur/fifo", w / "new/fifo"))
    probe(r, "rename to root", lambda: os.rename(w / "cur/moved", w / "moved2"))
    probe(r, "new list", lambda: sorted(os.listdir(w / "new")))
    probe(r, "tree", lambda: tree_view(w))
    return r


def test_special_files_as_ext4(twin_trees, tmp_path):
    base, plain, m = twin_trees
    want = special_steps(plain)
    got = special_steps(m.mnt)
    assert got == want
    assert ("w mkfifo", None) in got and ("cur socket io", b"through the socket") in got
    view = tree_view(m.mnt / "w")
    m.remount()
    assert tree_view(m.mnt / "w") == view
    rows = {row[0]: row for row in view}
    assert rows["null"][1] == oct(0o20644) and rows["null"][4] == (1, 3)

    subprocess.run(["rsync", "-a", f"{plain}/w/", f"{m.mnt}/rs"], check=True)
    assert tree_view(m.mnt / "rs") == tree_view(plain / "w")
    out = tmp_path / "export"
    r = subprocess.run([str(DBOXADM), "export", "--same-owner", str(m.store), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tree_view(out / "w") == view
    store2 = tmp_path / "store2"
    r = subprocess.run([str(DBOXADM), "import", str(store2), str(plain / "w")],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "skipped" not in r.stderr, r.stderr
    m.unmount()
    for args in (["check", str(store2)], ["check", str(m.store)],
                 ["stats", str(m.store)]):
        r = subprocess.run([str(DBOXADM), *args], capture_output=True, text=True)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    m.store = store2
    m.mount()
    assert tree_view(m.mnt) == tree_view(plain / "w")


def test_sockets_in_a_home_on_the_mount(twin_trees):
    """A $HOME on the mount: a 0700 dir with a listening socket another
    process connects to, and gpg-agent with GNUPGHOME there."""
    base, plain, m = twin_trees
    home = m.mnt / "home"
    home.mkdir(mode=0o700)
    path = home / "S.agent"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.sendall(conn.recv(100).upper())
        conn.close()

    t = threading.Thread(target=serve)
    t.start()
    r = subprocess.run(["python3", "-c", "import socket, sys\n"
                        "s = socket.socket(socket.AF_UNIX)\n"
                        f"s.connect({str(path)!r}); s.sendall(b'hello')\n"
                        "sys.stdout.write(s.recv(100).decode())"],
                       capture_output=True, text=True, timeout=30)
    t.join(timeout=30)
    srv.close()
    assert r.stdout == "HELLO", r.stderr
    assert stat.S_ISSOCK(os.lstat(path).st_mode)

    if shutil.which("gpg-connect-agent") is None:
        pytest.skip("gnupg (gpg-agent) is not installed")
    gnupg = home / ".gnupg"
    gnupg.mkdir(mode=0o700)
    env = dict(os.environ, GNUPGHOME=str(gnupg))
    try:
        # The agent forks and keeps its stdio: not captured.
        r = subprocess.run(["gpgconf", "--launch", "gpg-agent"], env=env,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)
        assert r.returncode == 0
        r = subprocess.run(["gpg-connect-agent", "--no-autostart", "GETINFO version",
                            "/bye"], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout.startswith("D "), (r.stdout, r.stderr)
        assert stat.S_ISSOCK(os.lstat(gnupg / "S.gpg-agent").st_mode)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(gnupg), "--kill", "gpg-agent"],
                       env=env, capture_output=True, timeout=60)
