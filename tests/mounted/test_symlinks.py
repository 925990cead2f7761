"""Symbolic links behave as on ext4, anywhere in the tree.

symlink/readlink/lstat, d_type DT_LNK, followed by the kernel (never by
the daemon), in folders and in cur/ (where a symlink is a symlink, not a
message), dangling, absolute, looping and 4095-byte targets, rename,
hard link, lchown, utimensat and chmod without following, unlink.  The
same steps run on a plain ext4 directory and on the mount and every
result (or errno) must be equal; the tree survives a remount, rsync -a
both ways, dboxadm export and import, and dboxadm rebuild.  Then
Dovecot's shared-folder quick recipe, `ln -s ../shared/.Announce
Maildir/.Announce`, lists and fetches the symlinked folder as on ext4.
"""
import errno
import os
import stat
import subprocess

from conftest import DBOXADM
from kinds_env import ALICE, dovecot_running, sh, team_users, tree_view, twin_trees  # noqa: F401
from maildir_tools import need


def probe(results, what, fn):
    try:
        results.append((what, fn()))
    except OSError as e:
        results.append((what, errno.errorcode[e.errno]))


def open_close(path, flags, mode=0o600):
    """open(2) and close at once: the result is only whether it opened."""
    os.close(os.open(path, flags, mode))
    return "opened"


def lview(p):
    st = os.lstat(p)
    return (stat.S_IFMT(st.st_mode), oct(stat.S_IMODE(st.st_mode)), st.st_size,
            st.st_nlink, st.st_uid, st.st_gid)


def symlink_steps(root):
    """The steps; returns every result in order."""
    w = root / "w"
    for d in ("user/cur", "user/new", "user/tmp", "shared/.Announce/cur",
              "shared/.Announce/new", "shared/.Announce/tmp"):
        (w / d).mkdir(parents=True)
    (w / "shared/.Announce/cur/1.host:2,S").write_bytes(b"Subject: hi\n\nall\n")
    user = w / "user"
    r = []
    probe(r, "folder", lambda: os.symlink("../shared/.Announce", user / ".Announce"))
    probe(r, "readlink", lambda: os.readlink(user / ".Announce"))
    probe(r, "lstat", lambda: lview(user / ".Announce"))
    probe(r, "stat through", lambda: stat.S_IFMT(os.stat(user / ".Announce").st_mode))
    probe(r, "list through", lambda: os.listdir(user / ".Announce/cur"))
    probe(r, "read through",
          lambda: (user / ".Announce/cur/1.host:2,S").read_bytes())
    probe(r, "in cur", lambda: os.symlink("../../shared/.Announce/cur/1.host:2,S",
                                          user / "cur/2.link:2,S"))
    probe(r, "in cur lstat", lambda: lview(user / "cur/2.link:2,S"))
    probe(r, "in cur read", lambda: (user / "cur/2.link:2,S").read_bytes())
    probe(r, "in cur nofollow", lambda: open_close(user / "cur/2.link:2,S",
                                                   os.O_RDONLY | os.O_NOFOLLOW))
    probe(r, "dangling", lambda: os.symlink("nowhere", user / "dangling"))
    probe(r, "dangling stat", lambda: os.stat(user / "dangling"))
    probe(r, "dangling excl", lambda: open_close(user / "dangling",
                                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    probe(r, "absolute", lambda: os.symlink("/etc/hostname", user / "abs"))
    probe(r, "absolute readlink", lambda: os.readlink(user / "abs"))
    probe(r, "loop a", lambda: os.symlink("b", user / "a"))
    probe(r, "loop b", lambda: os.symlink("a", user / "b"))
    probe(r, "loop open", lambda: open_close(user / "a", os.O_RDONLY))
    probe(r, "long", lambda: os.symlink("x" * 4095, user / "long"))
    probe(r, "long lstat", lambda: lview(user / "long"))
    probe(r, "too long", lambda: os.symlink("x" * 4096, user / "toolong"))
    probe(r, "exists", lambda: os.symlink("y", user / "abs"))
    probe(r, "mkdir over", lambda: os.mkdir(user / "abs"))
    probe(r, "rmdir link to dir", lambda: os.rmdir(user / ".Announce"))
    probe(r, "d_type", lambda: sorted((e.name, e.is_symlink(), e.is_dir(follow_symlinks=False))
                                      for e in os.scandir(user)))
    probe(r, "rename", lambda: os.rename(user / "dangling", user / "new/dangling"))
    probe(r, "hard link", lambda: os.link(user / "abs", user / "abs2", follow_symlinks=False))
    probe(r, "hard link lstat", lambda: lview(user / "abs2"))
    probe(r, "lchown", lambda: os.chown(user / "abs2", 12, 34, follow_symlinks=False))
    probe(r, "lchown lstat", lambda: lview(user / "abs"))
    t = 1_500_000_000_123_456_789
    probe(r, "utime nofollow", lambda: os.utime(user / "abs", ns=(t, t),
                                                follow_symlinks=False))
    probe(r, "utime lstat", lambda: os.lstat(user / "abs").st_mtime_ns)
    probe(r, "create through dangling", lambda: os.close(os.open(
        user / "new/dangling", os.O_CREAT | os.O_WRONLY, 0o600)))
    probe(r, "created target", lambda: os.path.exists(user / "new/nowhere"))
    probe(r, "unlink", lambda: os.unlink(user / "abs2"))
    probe(r, "unlinked lstat", lambda: lview(user / "abs"))
    probe(r, "rename over", lambda: os.rename(user / "long", user / "a"))
    probe(r, "tree", lambda: tree_view(w))
    return r


def test_symlinks_as_ext4(twin_trees, tmp_path):
    base, plain, m = twin_trees
    want = symlink_steps(plain)
    got = symlink_steps(m.mnt)
    assert got == want
    assert ("folder", None) in got
    view = tree_view(m.mnt / "w")
    assert ("user/.Announce", oct(0o120777), "root", "root",
            "../shared/.Announce") in view
    m.remount()
    assert tree_view(m.mnt / "w") == view

    # rsync -a both ways keeps them as symlinks.
    subprocess.run(["rsync", "-a", f"{plain}/w/", f"{m.mnt}/rs"], check=True)
    subprocess.run(["rsync", "-a", f"{m.mnt}/w/", f"{plain}/back"], check=True)
    assert tree_view(m.mnt / "rs") == tree_view(plain / "w")
    assert tree_view(plain / "back") == view

    # dboxadm export (of the mounted store) and import.
    out = tmp_path / "export"
    r = subprocess.run([str(DBOXADM), "export", "--same-owner", str(m.store), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert tree_view(out / "w") == view
    store2 = tmp_path / "store2"
    r = subprocess.run([str(DBOXADM), "import", str(store2), str(plain / "w")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "skipped" not in r.stderr
    m.unmount()
    for args in (["check", str(store2)], ["stats", str(store2)],
                 ["check", str(m.store)], ["purge", str(m.store)]):
        r = subprocess.run([str(DBOXADM), *args], capture_output=True, text=True)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    r = subprocess.run([str(DBOXADM), "rebuild", str(m.store)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    m.mount()
    assert tree_view(m.mnt / "w") == view
    m.unmount()
    m.store = store2
    m.mount()
    assert tree_view(m.mnt) == tree_view(plain / "w")


DOVECOT_CONF = """base_dir = {base}/run
state_dir = {base}/state
log_path = {base}/dovecot.log
instance_name = dboxfs-test-symlink-{pid}
protocols =
ssl = no
stats_writer_socket_path =
first_valid_uid = 1
mail_location = maildir:~/Maildir
namespace inbox {{
  inbox = yes
  separator = /
}}
userdb {{
  driver = passwd-file
  args = {base}/users
}}
passdb {{
  driver = static
  args = nopassword=y
}}
"""


def test_symlinked_folder_in_dovecot(twin_trees):
    """Dovecot's quick recipe for a shared folder: a Maildir++ folder that
    is a symlink to another maildir lists and fetches as on ext4."""
    need("dovecot", "doveadm")
    users = team_users()
    pw = users[ALICE]
    base, plain, m = twin_trees
    lines = []
    for where, root in (("plain", plain), ("mount", m.mnt)):
        sh("root", f"""mkdir -p Maildir/cur Maildir/new Maildir/tmp
            mkdir -p shared/.Announce/cur shared/.Announce/new shared/.Announce/tmp
            printf 'Subject: announce\\n\\nto everyone\\n' > 'shared/.Announce/cur/1.h:2,S'
            ln -s ../shared/.Announce Maildir/.Announce
            chown -R {ALICE} Maildir shared""", root)
        lines.append(f"{ALICE}-{where}::{pw.pw_uid}:{pw.pw_gid}::{root}::")
    (base / "users").write_text("\n".join(lines) + "\n")
    seen = {}
    with dovecot_running(base, DOVECOT_CONF.format(base=base, pid=os.getpid())) as doveadm:
        for where in ("plain", "mount"):
            user = f"{ALICE}-{where}"
            out = [doveadm(user, "mailbox", "list"),
                   doveadm(user, "fetch", "flags text", "mailbox", "Announce", "all")]
            for r in out:
                assert r.returncode == 0, (where, r.stderr)
            seen[where] = (sorted(out[0].stdout.split()), out[1].stdout)
    assert b"Announce" in seen["plain"][0]
    assert b"to everyone" in seen["plain"][1]
    assert seen["mount"] == seen["plain"]
    # Dovecot wrote its index files through the symlink, into shared/.
    assert "dovecot-uidlist" in os.listdir(m.mnt / "shared/.Announce")
    assert os.path.islink(m.mnt / "Maildir/.Announce")
