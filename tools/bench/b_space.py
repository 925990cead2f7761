"""Space: bytes on disk (du -B1, allocated blocks) and inodes of the
corpus as a native maildir and as a store made by dboxadm import
(storage/, index.sqlite, files/); the same with gzip-compressed bodies
(dboxadm import --compress gz), against the native maildir and against
the mdbox Dovecot itself writes of the same corpus with its zlib plugin
(zlib_save = gz, doveadm import in direct mode, no server)."""
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from benchlib import DBOXADM, Row, count_inodes, du_bytes, fresh_dir, log, skipped
from benchlib import run as run_cmd

DOVECOT_CONF = """\
mail_location = mdbox:{root}
base_dir = {conf}
state_dir = {conf}
log_path = /dev/stderr
protocols =
ssl = no
mail_uid = {uid}
mail_gid = {gid}
first_valid_uid = 1
first_valid_gid = 1
mail_plugins = zlib
namespace inbox {{
  inbox = yes
  separator = /
}}
plugin {{
  zlib_save = gz
}}
"""


def dovecot_gz_mdbox(tmp, maildir):
    """The corpus as Dovecot's own gz mdbox: doveadm import from the
    maildir (read only: its index in memory, its control files in conf/)
    into a fresh mdbox root owned by user mail.  Returns the root."""
    base = fresh_dir(Path(tmp) / "space-dovecot")
    root, conf, ctl = base / "root", base / "conf", base / "control"
    mail = pwd.getpwnam("mail")
    for d in (root, conf, ctl):
        d.mkdir()
        os.chown(d, mail.pw_uid, mail.pw_gid)
    os.chmod(base, 0o755)
    (conf / "dovecot.conf").write_text(DOVECOT_CONF.format(
        root=root, conf=conf, uid=mail.pw_uid, gid=mail.pw_gid))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "USER": "bench", "HOME": str(conf)}
    run_cmd(["doveadm", "-c", conf / "dovecot.conf", "import",
         f"maildir:{maildir}:INDEX=MEMORY:CONTROL={ctl}", "", "all"], env=env)
    out = run_cmd(["doveadm", "-c", conf / "dovecot.conf", "mailbox", "status",
               "messages", "INBOX"], env=env, capture_output=True, text=True).stdout
    return root, int(out.split("=")[1])


def run_gz(ctx, native_du):
    gz_store = Path(ctx.tmp) / "space-gz-store"
    if gz_store.exists():
        shutil.rmtree(gz_store)
    run_cmd([DBOXADM, "import", "--compress", "gz", gz_store, ctx.hc_native],
        stdout=subprocess.DEVNULL)
    gz_du = du_bytes(gz_store)
    vs_native = Row(f"space, du with compress=gz ({ctx.hc_count} msgs)", "bytes", "B",
                    ("<=", 0.5, False))
    vs_native.add(gz_du, native_du)
    rows = [vs_native]
    log(f"space: gz store {gz_du} B / native {native_du} B")
    if shutil.which("doveadm") is None:
        rows.append(skipped("space, gz store / Dovecot's gz mdbox",
                            "Dovecot not installed", ("<=", 1.0, False)))
        return rows
    root, count = dovecot_gz_mdbox(ctx.tmp, ctx.hc_native)
    if count != ctx.hc_count:
        raise RuntimeError(f"doveadm import: {count} messages, want {ctx.hc_count}")
    dovecot_du = du_bytes(root)
    vs_dovecot = Row(f"space, gz store / Dovecot's gz mdbox ({ctx.hc_count} msgs)",
                     "bytes", "B", ("<=", 1.0, False),
                     "the native column is Dovecot 2.3's mdbox with zlib_save=gz "
                     "(m.N + its indexes) of the same corpus")
    vs_dovecot.add(gz_du, dovecot_du)
    log(f"space: gz store {gz_du} B / Dovecot gz mdbox {dovecot_du} B")
    rows.append(vs_dovecot)
    shutil.rmtree(root.parent, ignore_errors=True)
    shutil.rmtree(gz_store, ignore_errors=True)
    return rows


def run(ctx):
    nat, store = ctx.hc_native, ctx.hc_store_size_snapshot
    native_du = du_bytes(nat)
    du = Row(f"space, du ({ctx.hc_count} msgs)", "bytes", "B", ("<=", 0.9, False))
    du.add(store["du"], native_du)
    ino = Row(f"space, inodes ({ctx.hc_count} msgs)", "count", "inodes", None)
    ino.add(store["inodes"], count_inodes(nat))
    log(f"space: store {store['du']} B / native {native_du} B; inodes "
        f"{store['inodes']} / {ino.native[0]}")
    return [du, ino] + run_gz(ctx, native_du)
