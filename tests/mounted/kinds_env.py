"""Helpers for the tests of setgid folders, symlinks, special files and
extended attributes (test_setgid.py, test_symlinks.py, ...): real users
and a group as in Dovecot's shared-mailbox recipe, and a world-traversable
base directory holding a plain ext4 tree and a dboxfs mount (-o
allow_other) on which the same steps run.

Users (created when missing, left in place, as sysenv.unprivileged_user):
dboxfs-alice and dboxfs-bob in group dboxfs-team, dboxfs-carol outside it.
"""
import grp
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import is_mounted
from sysenv import need_root

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
            pwd.getpwnam(name)
        except KeyError:
            cmd = ["useradd", "--system", "--user-group", "--no-create-home",
                   "--shell", "/bin/sh"]
            if member:
                cmd += ["-G", TEAM]
            subprocess.run(cmd + [name], check=True)
        users[name] = pwd.getpwnam(name)
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
            row = [rel, oct(st.st_mode), pwd.getpwuid(st.st_uid).pw_name,
                   grp.getgrgid(st.st_gid).gr_name]
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
