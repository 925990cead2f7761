"""System-level helpers for the install and mounting tests.

- install(): `make install` of the build under test into a DESTDIR.
- MountNamespace: a private mount namespace (unshare + nsenter) in which
  the DESTDIR's bin/ is bind-mounted on /usr/local/bin, so `mount -t
  fuse.dboxfs` (mount.fuse3, which runs dboxfs by its default PATH) starts
  the build under test; the host's /usr/local/bin and /proc/mounts stay
  untouched.  close() unmounts whatever is left in it and ends it.
- unprivileged_user(): the ordinary user the non-root tests run as (created with
  useradd when missing, and left in place).
- system_settings(): the lock under which tests change machine-wide FUSE
  settings (/dev/fuse mode, /etc/fuse.conf), restoring them afterwards.

Everything here needs root.
"""
import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import BUILD

ROOT = Path(__file__).resolve().parents[2]
GEN_CORPUS = ROOT / "tools" / "gen-corpus"
TEST_USER = "dboxfs-test"
FUSE_CONF = Path("/etc/fuse.conf")
FUSE_DEV = Path("/dev/fuse")
# Serialises tests (of any worktree) that change machine-wide settings.
SYSTEM_LOCK = Path("/tmp/.dboxfs-tests-system.lock")


def need_root():
    if os.geteuid() != 0:
        pytest.skip("needs root (installs, mount namespaces, useradd, runuser)")


def install(destdir, prefix="/usr/local", target="install"):
    """make TARGET of the build under test into destdir; returns the run."""
    return subprocess.run(
        ["make", "-C", str(ROOT), "--no-print-directory", f"BUILD={BUILD}",
         f"DESTDIR={destdir}", f"PREFIX={prefix}", target],
        capture_output=True, text=True, timeout=600)


def fuse_mounts(mounts_file, under="/"):
    """Mount points of FUSE filesystems in mounts_file below directory under."""
    under = os.path.realpath(under).rstrip("/") + "/"
    out = []
    with open(mounts_file) as f:
        for line in f:
            fields = line.split()
            fuse = fields[2] in ("fuse", "fuseblk") or fields[2].startswith("fuse.")
            if fuse and (fields[1] + "/").startswith(under):
                out.append(fields[1])
    return out


def mount_options(mounts_file, mnt):
    """(fstype, options) of the mount on mnt in mounts_file, or None."""
    mnt = os.path.realpath(mnt)
    with open(mounts_file) as f:
        for line in f:
            fields = line.split()
            if fields[1] == mnt:
                return fields[2], fields[3].split(",")
    return None


def store_released(store, timeout=10.0):
    """Wait until no process holds STORE/lock (the daemon has exited)."""
    deadline = time.monotonic() + timeout
    while True:
        r = subprocess.run(["flock", "-n", str(Path(store) / "lock"), "true"])
        if r.returncode == 0:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


class MountNamespace:
    """A private mount namespace held open by a sleeping process."""

    def __init__(self, scratch, bindir=None):
        self.scratch = os.path.realpath(scratch)
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"])
        mine = os.readlink("/proc/self/ns/mnt")
        for _ in range(200):
            try:
                if os.readlink(f"/proc/{self.proc.pid}/ns/mnt") != mine:
                    break
            except OSError:
                pass
            time.sleep(0.01)
        else:
            self.close()
            raise RuntimeError("unshare did not enter a new mount namespace")
        # The namespace starts with copies of every mount, other people's
        # FUSE mounts too; a copy would keep such a filesystem alive after
        # its owner unmounts it, so detach them here (the originals are
        # not touched).
        for mnt in fuse_mounts(self.mounts_file):
            self.run(["umount", "-l", mnt])
        if bindir is not None:
            self.run(["mount", "--bind", "-o", "ro", str(bindir), "/usr/local/bin"],
                     check=True)

    @property
    def mounts_file(self):
        return f"/proc/{self.proc.pid}/mounts"

    def run(self, args, user=None, **kw):
        """Run args inside the namespace (as user, when given)."""
        cmd = ["nsenter", "-t", str(self.proc.pid), "-m", "--"]
        if user is not None:
            cmd += ["runuser", "-u", user, "--"]
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(cmd + [str(a) for a in args], **kw)

    def close(self):
        if self.proc.poll() is None:
            for mnt in fuse_mounts(self.mounts_file, self.scratch):
                self.run(["umount", "-l", mnt])
            self.proc.kill()
        self.proc.wait()


def add_system_user(name, shell="/usr/sbin/nologin", groups=()):
    """Create system user name (no home) with its own group and the
    supplementary groups; a group of that name left behind (userdel of
    the user alone) becomes its group, where --user-group would refuse
    it.  Returns the pwd entry."""
    try:
        grp.getgrnam(name)
        group = ["--gid", name]
    except KeyError:
        group = ["--user-group"]
    extra = ["-G", ",".join(groups)] if groups else []
    subprocess.run(["useradd", "--system", *group, "--no-create-home",
                    "--shell", shell, *extra, name], check=True)
    return pwd.getpwnam(name)


def unprivileged_user():
    """(name, uid, gid) of the unprivileged test user, created if missing."""
    try:
        pw = pwd.getpwnam(TEST_USER)
    except KeyError:
        pw = add_system_user(TEST_USER)
    return pw.pw_name, pw.pw_uid, pw.pw_gid


def as_user(user, args, **kw):
    """Run args as user (runuser, no shell, no login)."""
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 120)
    return subprocess.run(["runuser", "-u", user, "--", *[str(a) for a in args]], **kw)


def user_scratch(user, prefix):
    """A directory under /tmp that user owns and everyone may traverse
    (pytest's own tmp_path is root-only)."""
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    shutil.chown(d, user, user)
    return d


def sample_maildir(dest, owner=None, messages=40, seed=11):
    """A gen-corpus Maildir++ tree (INBOX, .Sent, .Archive, ...) at dest."""
    subprocess.run([str(GEN_CORPUS), str(dest), "--messages", str(messages),
                    "--seed", str(seed)], check=True, capture_output=True)
    if owner is not None:
        subprocess.run(["chown", "-R", f"{owner}:{owner}", str(dest)], check=True)
    return dest


class SystemSettings:
    """Machine-wide FUSE settings, changed only while the lock is held."""

    def __init__(self):
        self.conf_text = FUSE_CONF.read_text() if FUSE_CONF.exists() else None
        self.dev_mode = FUSE_DEV.stat().st_mode & 0o7777

    def users_may_mount(self):
        """Make /dev/fuse rw for everyone (Debian's mode, 0666): libfuse
        opens it before it falls back to fusermount3."""
        FUSE_DEV.chmod(0o666)

    def user_allow_other(self, allowed):
        """Write /etc/fuse.conf with user_allow_other on or off."""
        lines = [l for l in (self.conf_text or "").splitlines()
                 if l.strip() != "user_allow_other"]
        if allowed:
            lines.append("user_allow_other")
        FUSE_CONF.write_text("\n".join(lines) + "\n")

    def restore(self):
        FUSE_DEV.chmod(self.dev_mode)
        if self.conf_text is None:
            FUSE_CONF.unlink(missing_ok=True)
        else:
            FUSE_CONF.write_text(self.conf_text)


@contextlib.contextmanager
def system_settings():
    """Hold the system lock; yield a SystemSettings; restore on exit."""
    with open(SYSTEM_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        settings = SystemSettings()
        try:
            yield settings
        finally:
            settings.restore()
