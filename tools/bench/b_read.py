"""Reading every message of the corpus (cat of each file, in readdir
order, via find | xargs cat), with warm caches and cold ones (sync and
drop_caches before every cold run, on both sides).  The bytes read must
add up to the corpus size."""
import subprocess
import time

from benchlib import Row, drop_caches, log, paired


def read_all(folder, expect_bytes):
    t = time.monotonic()
    p = subprocess.run(f"find {folder}/cur -type f -print0 | xargs -0 cat | wc -c",
                       shell=True, check=True, capture_output=True, text=True)
    elapsed = time.monotonic() - t
    if int(p.stdout) != expect_bytes:
        raise RuntimeError(f"{folder}: read {p.stdout.strip()} bytes, want {expect_bytes}")
    return elapsed


def run(ctx):
    expect = sum(len(m) for m in ctx.messages)
    nat, mnt = ctx.hc_native, ctx.hc_mount
    cold = Row(f"read every message, cold cache ({ctx.hc_count} msgs)", "time", "s",
               ("<=", 0.8, False))
    warm = Row(f"read every message, warm cache ({ctx.hc_count} msgs)", "time", "s",
               ("<=", 1.3, False))
    for r in range(ctx.repeats):
        def cold_run(folder):
            drop_caches()
            return read_all(folder, expect)
        dbx, nt = paired(r, lambda: cold_run(nat), lambda: cold_run(mnt))
        cold.add(dbx, nt)
    log(f"{cold.name}: ratio {cold.ratio():.2f}")
    read_all(nat, expect)
    read_all(mnt, expect)
    for r in range(ctx.repeats):
        dbx, nt = paired(r, lambda: read_all(nat, expect), lambda: read_all(mnt, expect))
        warm.add(dbx, nt)
    log(f"{warm.name}: ratio {warm.ratio():.2f}")
    return [cold, warm]
