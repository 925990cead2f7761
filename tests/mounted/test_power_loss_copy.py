"""A message written again (a copy-on-write copy, fs/fs-write.c) is one
message after a power loss, whichever sync the loss follows.

A write to a committed message goes to a copy; the index names the old
record until a close or fsync finishes the copy.  Any sync of the copy's
m.N can come before the commit that finishes it: the timed round (store-
sync.c syncs each m.N before the WAL) or the fsync of a message delivered
after it into the same m.N.  A power loss right after that sync leaves
the copy's bytes on disk and its commit lost.  Recovery must then cut the
copy; it had put it back as a second message, or kept it as a record the
index did not know, which 'dboxadm rebuild' made a second message
(helper-71).  The copy's in-flight mark is now on disk before the copy's
first byte, so recovery finds it and cuts the copy.

The power loss is real in what it leaves: an LD_PRELOAD shim records the
WAL's size before each of its syncs that returned, and kills the daemon
right after the chosen m.N sync returns; the test then cuts the WAL back
to that size and drops the WAL-index, as a reboot would.  ext4 has no
counterpart (its journal is not ours to cut); what it promises is that a
file written again without fsync() holds one of its versions.
"""
import errno
import os
import subprocess
import time

import pytest

from conftest import DBOXADM, preload_shim
from test_fsync_one_flush import fsync_dir

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* PL_DIR/wal-synced: the WAL's size before its last sync that returned
   (every byte below it is on disk); PL_DIR/mfile-synced: the path of
   every m.N synced, a line each.  Once PL_DIR/arm exists, the first
   sync of an m.N that returns kills the process (after writing the
   m.N's path to PL_DIR/died). */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void note(const char *dir, const char *name, const char *text)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if ((f = fopen(path, "w")) != NULL) {
		fputs(text, f);
		fclose(f);
	}
}

static int hooked(int fd, int (*real)(int))
{
	const char *dir = getenv("PL_DIR");
	char link[64], path[4096], text[4096];
	struct stat sb;
	long long size = -1;
	ssize_t len;
	int ret, wal, mfile;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	if (dir == NULL || (len = readlink(link, path, sizeof(path) - 1)) < 0)
		return real(fd);
	path[len] = '\0';
	wal = len > 4 && strcmp(path + len - 4, "-wal") == 0;
	mfile = strstr(path, "/storage/m.") != NULL;
	if (wal && fstat(fd, &sb) == 0)
		size = (long long)sb.st_size;
	ret = real(fd);
	if (ret != 0)
		return ret;
	pthread_mutex_lock(&mu);
	if (wal && size >= 0) {
		snprintf(text, sizeof(text), "%lld\n", size);
		note(dir, "wal-synced", text);
	}
	if (mfile) {
		FILE *f;

		snprintf(text, sizeof(text), "%s/mfile-synced", dir);
		if ((f = fopen(text, "a")) != NULL) {
			fprintf(f, "%s\n", path);
			fclose(f);
		}
		snprintf(text, sizeof(text), "%s/arm", dir);
		if (access(text, F_OK) == 0) {
			note(dir, "died", path);
			kill(getpid(), SIGKILL);
		}
	}
	pthread_mutex_unlock(&mu);
	return ret;
}

int fdatasync(int fd)
{
	static int (*real)(int);

	if (real == NULL)
		real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
	return hooked(fd, real);
}

int fsync(int fd)
{
	static int (*real)(int);

	if (real == NULL)
		real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
	return hooked(fd, real);
}
"""

V0 = b"Subject: draft\n\nfirst version\n"
V1 = b"Subject: draft\n\nsecond version, written over the first\n"
TAIL = b"a line added at the end\n"


@pytest.fixture
def power_loss_shim(tmp_path, monkeypatch):
    """The shim above, preloaded into the next mount; its notes' folder."""
    preload_shim(tmp_path, monkeypatch, "powerloss", SHIM, ("-ldl", "-lpthread"))
    notes = tmp_path / "pl"
    notes.mkdir()
    monkeypatch.setenv("PL_DIR", str(notes))
    return notes


DRAFT = "cur/1.draft.host:2,DS"
PLAIN = "tmp/.1.draft"  # a plain file: its name starts with '.'


def fsynced_file(path):
    """V0 written to a new file and fsync()ed; its descriptor, open."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, V0)
    os.fsync(fd)
    return fd


def write_again(md, style):
    """A committed message or plain file written again, without fsync,
    as clients do: a rewrite (O_TRUNC, write, close) or an append to a
    message (both copy-on-write copies), or a plain file renamed to a
    message name, closed before or after the rename (its bytes copied
    into an m.N at the rename or at the close), or a new message written
    to again after its fsync.  The version before is all on disk (the
    last one only by its fsync, which syncs its m.N alone).  Returns the
    bytes the draft holds afterwards."""
    if style == "write after fsync":
        fd = fsynced_file(md / DRAFT)
        os.write(fd, TAIL)
        os.close(fd)
        return V0 + TAIL
    if style in ("truncate", "append"):
        os.close(fsynced_file(md / DRAFT))
    else:
        fd = fsynced_file(md / PLAIN)
        if style == "rename after close":
            os.close(fd)
    fsync_dir(md / "cur")
    fsync_dir(md / "tmp")
    if style == "truncate":
        fd = os.open(md / DRAFT, os.O_WRONLY | os.O_TRUNC)
        os.write(fd, V1)
        os.close(fd)
        return V1
    if style == "append":
        fd = os.open(md / DRAFT, os.O_WRONLY | os.O_APPEND)
        os.write(fd, TAIL)
        os.close(fd)
        return V0 + TAIL
    os.rename(md / PLAIN, md / DRAFT)
    if style == "rename before close":
        os.close(fd)
    return V0


def lose_power(m, notes, *held):
    """The daemon killed (if the shim has not) and the power lost: the
    descriptors held on the mount closed, the WAL cut back to its size at
    its last sync (notes/wal-synced), the WAL-index gone."""
    m.kill()
    for fd in held:
        try:
            os.close(fd)
        except OSError:
            pass
    wal = m.store / "index.sqlite-wal"
    synced = int((notes / "wal-synced").read_text())
    assert wal.stat().st_size >= synced
    os.truncate(wal, synced)
    (m.store / "index.sqlite-shm").unlink(missing_ok=True)


def assert_check_clean(m):
    """dboxadm check finds nothing in the unmounted store."""
    check = subprocess.run([str(DBOXADM), "check", str(m.store)],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def drafts(md):
    """{subdir/name: bytes} of every file in md's cur/, new/ and tmp/
    but the next delivery's."""
    out = {}
    for sub in ("cur", "new", "tmp"):
        for name in os.listdir(md / sub):
            if not name.startswith("2."):
                with open(md / sub / name, "rb") as f:
                    out[f"{sub}/{name}"] = f.read()
    return out


@pytest.mark.parametrize("style", ["truncate", "append", "write after fsync",
                                   "rename after close",
                                   "rename before close"])
@pytest.mark.parametrize("after", ["timed round", "fsync of the next delivery"])
def test_a_copy_is_one_message_after_a_power_loss(make_mount, power_loss_shim,
                                                  monkeypatch, style, after):
    m = make_mount()
    monkeypatch.delenv("LD_PRELOAD")
    md = m.maildir()
    now = write_again(md, style)
    (power_loss_shim / "arm").touch()
    if after == "fsync of the next delivery":
        # Into the same m.N as the copy; the daemon dies once that m.N
        # is synced (by this fsync, or by the round if it comes first).
        try:
            fd = os.open(md / "tmp" / "2.next.host",
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, b"Subject: next\n\nnot acknowledged\n")
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            assert e.errno in (errno.ENOTCONN, errno.ECONNABORTED), e
    deadline = time.monotonic() + 20
    while m.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m.proc.returncode == -9, "the shim did not kill the daemon"
    died = (power_loss_shim / "died").read_text()
    assert "/storage/m." in died, died
    lose_power(m, power_loss_shim)
    (power_loss_shim / "arm").unlink()
    monkeypatch.delenv("PL_DIR")
    m.mount()
    found = drafts(md)
    assert len(found) == 1 and list(found)[0] in (DRAFT, PLAIN), \
        (found, m.log_text())
    assert list(found.values())[0] in (V0, now)
    m.unmount()
    assert_check_clean(m)


def test_purge_copies_are_cut_after_a_power_loss(make_mount, power_loss_shim,
                                                 monkeypatch):
    """The same for purge's copies: dboxadm purge of an unmounted store
    dies right after it syncs the first m.N it copied live records to,
    before the commit that switches the index to them is on disk.  The
    copies' in-flight mark is on disk before their first byte, so the
    next open cuts them: every message reads as before and check finds
    nothing (it reported the copies as records the index did not know).
    """
    m = make_mount(options=["-o", "rotate_size=32768,purge_threshold=0"])
    monkeypatch.delenv("LD_PRELOAD")
    cur = m.maildir() / "cur"
    data = {f"{1600000000 + i}.P{i}.host:2,S":
            b"Subject: %d\n\n" % i + b"line of the body\n" * (100 + 7 * i)
            for i in range(40)}
    for name, body in data.items():
        (cur / name).write_bytes(body)
    for name in list(data)[::2]:
        os.unlink(cur / name)
        del data[name]
    m.unmount()
    wal = m.store / "index.sqlite-wal"
    start = wal.stat().st_size if wal.exists() else 0
    (power_loss_shim / "wal-synced").unlink(missing_ok=True)
    (power_loss_shim / "arm").touch()
    r = subprocess.run([str(DBOXADM), "purge", str(m.store)],
                       capture_output=True, text=True,
                       env=dict(os.environ,
                                LD_PRELOAD=str(power_loss_shim.parent /
                                               "powerloss.so")))
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr)
    synced = (power_loss_shim / "wal-synced")
    os.truncate(wal, int(synced.read_text()) if synced.exists() else start)
    (m.store / "index.sqlite-shm").unlink(missing_ok=True)
    (power_loss_shim / "arm").unlink()
    monkeypatch.delenv("PL_DIR")
    m.mount()
    assert sorted(os.listdir(cur)) == sorted(data)
    for name, body in data.items():
        assert (cur / name).read_bytes() == body
    m.unmount()
    assert_check_clean(m)


def test_a_new_mfile_is_on_disk_before_the_index_names_it(make_mount,
                                                         power_loss_shim,
                                                         monkeypatch):
    """A copy made while a delivery holds the only m.N of the pool goes to
    a new m.N, and the sync of the copy's mark puts the index row of that
    m.N on disk.  The daemon dies at once, and the power loss leaves the
    new file as a file never synced: empty.  Its header was not on disk
    then, and check reported "m.2 is 0 bytes, shorter than its committed
    end" for good (helper-74).  A new m.N's header is synced when it is
    made."""
    m = make_mount()
    monkeypatch.delenv("LD_PRELOAD")
    md = m.maildir()
    os.close(fsynced_file(md / DRAFT))
    fsync_dir(md / "cur")
    held = os.open(md / "tmp" / "2.held.host", os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                   0o600)
    os.write(held, b"Subject: held open\n\n")
    fd = os.open(md / DRAFT, os.O_WRONLY | os.O_APPEND)
    os.write(fd, TAIL)
    os.close(fd)
    lose_power(m, power_loss_shim, held)
    synced = set((power_loss_shim / "mfile-synced").read_text().split())
    mfiles = sorted((m.store / "storage").glob("m.*"))
    assert len(mfiles) >= 2, mfiles
    for p in mfiles:
        if str(p) not in synced:
            os.truncate(p, 0)
    monkeypatch.delenv("PL_DIR")
    m.mount()
    found = drafts(md)
    assert list(found) == [DRAFT], (found, m.log_text())
    assert found[DRAFT] in (V0, V0 + TAIL)
    m.unmount()
    assert_check_clean(m)


def test_an_fsync_after_an_empty_close_outlives_that_close(make_mount,
                                                          power_loss_shim,
                                                          monkeypatch):
    """Python's mailbox.Maildir.add opens a new message twice and closes
    the first descriptor before it writes: that close acknowledges the
    message empty (the key acked_empty.<ino>, engine/store.h) and the
    record stays open.  The write and fsync through the second descriptor
    then sync the m.N alone; a power loss takes their commit (and the
    key's deletion in it).  Recovery puts the fsynced record back at its
    path, and must not then store the message empty as the older close
    said: the fsync returned, the bytes are the message."""
    m = make_mount()
    monkeypatch.delenv("LD_PRELOAD")
    md = m.maildir()
    path = md / "tmp" / "1.acked.host"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    fd2 = os.open(path, os.O_WRONLY)
    os.close(fd)
    fsync_dir(md / "tmp")  # the create and the empty close on disk
    os.write(fd2, V0)
    os.fsync(fd2)
    lose_power(m, power_loss_shim, fd2)
    monkeypatch.delenv("PL_DIR")
    m.mount()
    assert drafts(md) == {"new/1.acked.host": V0}, m.log_text()
    m.unmount()
    assert_check_clean(m)
