"""Helpers for the tests of setgid folders, symlinks, special files and
extended attributes (test_setgid.py, test_symlinks.py, ...): real users
and a group as in Dovecot's shared-mailbox recipe, and a world-traversable
base directory holding a plain ext4 tree and a dboxfs mount (-o
allow_other) on which the same steps run.

Users (created when missing, left in place, as sysenv.unprivileged_user):
dboxfs-alice and dboxfs-bob in group dboxfs-team, dboxfs-carol outside it.
"""
import contextlib
import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import is_mounted
from sysenv import add_system_user, need_root

TEAM = "dboxfs-team"
ALICE, BOB, CAROL = "dboxfs-alice", "dboxfs-bob", "dboxfs-carol"


def team_users():
    """Create group TEAM and users ALICE, BOB (members) and CAROL (not)
    when missing; returns {name: pwd entry}."""
    need_root()
    try:
        grp.getgrnam(TEAM)
    except KeyError:
        subprocess.run(["groupadd", "--system", TEAM], check=True)
    users = {}
    for name, member in ((ALICE, True), (BOB, True), (CAROL, False)):
        try:
            users[name] = pwd.getpwnam(name)
        except KeyError:
            users[name] = add_system_user(name, "/bin/sh",
                                          [TEAM] if member else [])
    members = grp.getgrnam(TEAM).gr_mem
    assert ALICE in members and BOB in members and CAROL not in members
    return users


def sh(user, script, cwd, check=True):
    """Run a shell script as user (runuser: the user's groups, umask 022)
    in cwd; returns the CompletedProcess."""
    cmd = ["runuser", "-u", user, "--"] if user != "root" else []
    r = subprocess.run(cmd + ["sh", "-ec", "umask 022\n" + script], cwd=cwd,
                       capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, (user, script, r.stdout, r.stderr)
    return r


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid


def group_name(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return gid


def tree_view(root, skip=()):
    """Every path below root (not followed) with its type and permission
    bits in octal, owner and group names, size of non-directories and
    symlink target: what ls -lR shows."""
    out = []
    for dirpath, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            if rel.split("/")[0] in skip:
                continue
            st = os.lstat(p)
            row = [rel, oct(st.st_mode), user_name(st.st_uid), group_name(st.st_gid)]
            if stat.S_ISLNK(st.st_mode):
                row.append(os.readlink(p))
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                row.append((os.major(st.st_rdev), os.minor(st.st_rdev)))
            elif stat.S_ISREG(st.st_mode):
                row.append(st.st_size)
            out.append(tuple(row))
    return out


@pytest.fixture
def twin_trees(make_mount):
    """(base, plain, mount): a world-traversable base directory with a
    plain ext4 directory `plain` and a dboxfs mount `mnt` (allow_other),
    both 0755 root.  Unmounted and removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="dboxfs-test-kinds-"))
    os.chmod(base, 0o755)
    plain = base / "plain"
    plain.mkdir()
    os.chmod(plain, 0o755)
    m = make_mount(store=base / "store", mnt=base / "mnt",
                   options=["-o", "allow_other"])
    os.chmod(m.mnt, 0o755)
    try:
        yield base, plain, m
    finally:
        m.unmount()
        if not is_mounted(m.mnt):
            shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def dovecot_running(base, conf_text):
    """Dovecot started with conf_text (written to base/dovecot.conf, with
    run/ and state/ under base), stopped at the end; yields a function
    doveadm(user, *args) that runs doveadm as the system user the
    Dovecot user name starts with (NAME-where), so that it has that
    user's groups (doveadm dropping privileges from root would not)."""
    conf = base / "dovecot.conf"
    for d in ("run", "state"):
        (base / d).mkdir(exist_ok=True)
    conf.write_text(conf_text)
    subprocess.run(["dovecot", "-c", str(conf)], check=True, timeout=30)

    def doveadm(user, *args, data=None):
        n = 2 if args[0] in ("mailbox", "flags") else 1
        return subprocess.run(["runuser", "-u", user.rsplit("-", 1)[0], "--", "doveadm",
                               "-c", str(conf), *args[:n], "-u", user, *args[n:]],
                              input=data, capture_output=True, timeout=60)
    try:
        yield doveadm
    finally:
        subprocess.run(["doveadm", "-c", str(conf), "stop"], capture_output=True,
                       timeout=30)
        for _ in range(100):
            if not (base / "run" / "master.pid").exists():
                break
            time.sleep(0.05)
