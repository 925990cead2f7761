"""Space: bytes on disk (du -B1, allocated blocks) and inodes of the
corpus as a native maildir and as a store made by dboxadm import
(storage/, index.sqlite, files/).  Compressed stores need dboxfs'
-o compress=gz: measured when `dboxfs --help` offers it."""
import subprocess

from benchlib import DBOXFS, Row, count_inodes, du_bytes, log, skipped


def has_compress():
    out = subprocess.run([str(DBOXFS), "--help"], capture_output=True, text=True)
    return "compress" in out.stdout + out.stderr


def run(ctx):
    nat, store = ctx.hc_native, ctx.hc_store_size_snapshot
    du = Row(f"space, du ({ctx.hc_count} msgs)", "bytes", "B", ("<=", 0.9, False))
    du.add(store["du"], du_bytes(nat))
    ino = Row(f"space, inodes ({ctx.hc_count} msgs)", "count", "inodes", None)
    ino.add(store["inodes"], count_inodes(nat))
    log(f"space: store {store['du']} B / native {du.native[0]} B; inodes "
        f"{store['inodes']} / {ino.native[0]}")
    rows = [du, ino]
    if not has_compress():
        rows.append(skipped("space, du with compress=gz", "dboxfs has no -o compress "
                            "yet (issue #4): not measured", ("<=", 0.5, False)))
    return rows
