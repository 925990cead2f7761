"""Delivery as Postfix local(8)/virtual(8) does it (src/local/maildir.c),
written out here because Postfix itself needs a running MTA:

  open(tmp/<sec>.P<pid>.<host>, O_WRONLY|O_CREAT|O_EXCL, 0600)
  fstat() -> new name <sec>.V<st_dev hex>I<st_ino hex>M<usec>.<host>
  write, fsync, close
  link(tmp, new/<name>)   -- no rename() fallback: an error is a failed
  unlink(tmp)                delivery (bounce or defer)

Several processes deliver at once into two folders, on the mount and on a
native maildir; every delivery must succeed, every name must be unique
(the inode in the name is the message's inode, which stays unique while
the message lives), and the folders must hold the same messages.
"""
import multiprocessing
import os
import re
import socket
import time

from conftest import need_corpora
from maildir_tools import content_view, corpus_messages

HOST = socket.gethostname()


def postfix_deliver(maildir, data):
    """One delivery; returns the new/ name.  Raises on any failure."""
    now = time.time()
    tmp = os.path.join(maildir, "tmp", f"{int(now)}.P{os.getpid()}.{HOST}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        st = os.fstat(fd)
        name = (f"{int(now)}.V{st.st_dev:x}I{st.st_ino:x}"
                f"M{int(now * 1e6) % 1000000}.{HOST}")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, os.path.join(maildir, "new", name))
    finally:
        os.unlink(tmp)
    return name


def worker(args):
    root, msgs, k = args
    out = []
    for i, data in enumerate(msgs):
        folder = root if (i + k) % 3 else os.path.join(root, ".Sent")
        out.append((folder, postfix_deliver(folder, data)))
    return out


def unique(base):
    return re.sub(r"^\d+\.V[0-9a-f]+I[0-9a-f]+M\d+\.", "", base)


def deliver_parallel(root, msgs, procs=4):
    for d in (root, root / ".Sent"):
        for sub in ("cur", "new", "tmp"):
            (d / sub).mkdir(parents=True, exist_ok=True)
    chunks = [(str(root), msgs[k::procs], k) for k in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        return [x for part in pool.map(worker, chunks) for x in part]


def test_postfix_style_delivery(mount, tmp_path):
    msgs = corpus_messages(need_corpora() / "notmuch-lkml", 200)
    got = deliver_parallel(mount.mnt / "pf", msgs)
    ref = deliver_parallel(tmp_path / "native" / "pf", msgs)
    assert len(got) == len(ref) == len(msgs)
    assert len({n for _, n in got}) == len(msgs)
    view = content_view(mount.mnt / "pf", unique=unique)
    assert view == content_view(tmp_path / "native" / "pf", unique=unique)
    assert sum(view.values()) == len(msgs)
    for folder, name in got:
        st = os.stat(os.path.join(folder, "new", name))
        assert int(re.search(r"I([0-9a-f]+)M", name).group(1), 16) == st.st_ino
        assert st.st_nlink == 1
    for d in (mount.mnt / "pf", mount.mnt / "pf" / ".Sent"):
        assert os.listdir(d / "tmp") == []
    mount.remount()
    assert content_view(mount.mnt / "pf", unique=unique) == view
