"""The price of one FUSE request on this machine, for reading the other
rows: stat() of a directory on a mount with attr_timeout=0 (every stat
is a GETATTR answered by the daemon from its index) against stat() of a
native directory.  Informational: no target."""
import os
import time
from pathlib import Path

from benchlib import Mount, Row, fresh_dir, log, paired


def stats_per_second(path, n):
    t = time.monotonic()
    for _ in range(n):
        os.stat(path)
    return n / (time.monotonic() - t)


def run(ctx):
    n = ctx.n("roundtrip")
    tmp = Path(ctx.tmp)
    store = tmp / "rt-store"
    fresh_dir(store).rmdir()
    native = fresh_dir(tmp / "rt-native")
    row = Row("stat() round trip (GETATTR, attr_timeout=0)", "rate", "stat/s", None,
              f"{n} stats per run; one FUSE request costs about "
              "1 / (dboxfs rate) seconds here")
    with Mount(store, tmp / "rt-mnt", ["attr_timeout=0"]) as m:
        (m.mnt / "d").mkdir()
        for r in range(ctx.repeats):
            dbx, nat = paired(r, lambda: stats_per_second(native, n),
                              lambda: stats_per_second(m.mnt / "d", n))
            row.add(dbx, nat)
    log(f"{row.name}: dboxfs {row.dbox[-1]:.0f}/s native {row.native[-1]:.0f}/s")
    return [row]
