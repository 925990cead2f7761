"""fsync of messages by concurrent writers (group commit of the index,
m.N data synced outside the store lock): every delivery whose fsync and
rename returned is there, byte-exact and exactly once, after the daemon
is killed with SIGKILL and the store mounted again.  Also fsync of a
message written again after its fsync, fsync of a committed message
through a read-only descriptor, and fsyncdir."""
import os
import threading

from conftest import is_mounted


def deliver_fsync(md, name, data):
    tmp = os.path.join(md, "tmp", name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, os.path.join(md, "new", name))


def test_concurrent_fsync_deliveries_survive_sigkill(make_mount):
    m = make_mount()
    md = m.maildir(".in")
    writers, per = 4, 40
    sent = {}
    errors = []

    def writer(w):
        try:
            for i in range(per):
                name = f"w{w}.m{i}"
                data = os.urandom(200 + 97 * i) + f"\n{name}\n".encode()
                deliver_fsync(md, name, data)
                sent[name] = data
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    fd = os.open(os.path.join(md, "new"), os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)  # fsyncdir
    os.close(fd)

    m.kill()
    assert not is_mounted(m.mnt)
    m.mount()
    names = sorted(os.listdir(os.path.join(md, "new")))
    assert names == sorted(sent)
    for name, data in sent.items():
        with open(os.path.join(md, "new", name), "rb") as f:
            assert f.read() == data
    assert os.listdir(os.path.join(md, "tmp")) == []


def test_fsync_write_fsync_again(mount):
    md = mount.maildir()
    path = os.path.join(md, "tmp", "again")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"first part\n")
    os.fsync(fd)
    os.write(fd, b"second part\n")
    os.fsync(fd)
    os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"first part\nsecond part\n"
    assert os.stat(path).st_size == len(b"first part\nsecond part\n")
    mount.remount()
    with open(path, "rb") as f:
        assert f.read() == b"first part\nsecond part\n"


def test_fsync_committed_message_read_only(mount):
    md = mount.maildir()
    path = os.path.join(md, "cur", "ro:2,S")
    with open(path, "wb") as f:
        f.write(b"committed\n")
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    assert os.read(fd, 100) == b"committed\n"
    os.close(fd)
