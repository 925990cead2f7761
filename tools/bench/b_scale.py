"""Scale: one folder with a very large cur/ (1,000,000 small messages in
the full run).  The store is made by dboxadm import of the native tree
(its rate is reported too).  Measured: mount time (dboxfs start until
the mount answers, a fresh daemon each repeat), the time to list all
names (`ls -f | wc -l`) against native, and the daemon's RSS after
listing and stat-ing every message (`ls -l`)."""
import hashlib
import subprocess
import time
from pathlib import Path

from benchlib import (DBOXADM, Mount, Row, import_store, log, paired, run as run_cmd,
                      tiny_maildir, timed)


def list_count(folder):
    t = time.monotonic()
    out = subprocess.run(f"ls -f {folder} | wc -l", shell=True, check=True,
                         capture_output=True, text=True).stdout
    return time.monotonic() - t, int(out) - 2  # . and ..


def inputs(ctx):
    """The native tree and the store of n small messages, made when
    missing (kept between runs); returns (native, store, import row)."""
    n = ctx.n("scale")
    tmp = Path(ctx.tmp)
    native = tmp / f"scale-native-{n}"
    if not (native / ".complete").exists():
        log(f"scale: writing {n} native messages")
        subprocess.run(["rm", "-rf", str(native)], check=True)
        tiny_maildir(native, n)
        (native / ".complete").touch()
    store = tmp / f"scale-store-{n}"
    # The import takes minutes: a store imported by this very dboxadm
    # from this tree is kept between runs (nothing here changes it).
    key = f"{n} {hashlib.sha256(DBOXADM.read_bytes()).hexdigest()}\n"
    stamp = tmp / f"scale-store-{n}.key"
    imp = Row(f"dboxadm import of {n // 1000}k messages", "rate", "msg/s", None,
              "informational")
    if stamp.exists() and stamp.read_text() == key and store.exists():
        imp.skipped = "store kept from an earlier run with the same dboxadm"
    else:
        stamp.unlink(missing_ok=True)
        secs, _ = timed(import_store, store, native)
        stamp.write_text(key)
        imp.add(n / secs)
        log(f"scale: import {n / secs:.0f} msg/s")
    return native, store, imp


def run(ctx):
    n = ctx.n("scale")
    tmp = Path(ctx.tmp)
    native, store, imp = inputs(ctx)

    mount_row = Row(f"mount, {n // 1000}k-message folder", "time", "s", ("<=", 1.0, True))
    list_row = Row(f"list all names, {n // 1000}k folder", "time", "s", ("<=", 2.0, False))
    rss_row = Row(f"daemon RSS after ls -l of {n // 1000}k", "bytes", "B",
                  ("<=", 150 * 2**20, True))
    mnt = tmp / "scale-mnt"
    subprocess.run(f"ls -f {native}/cur > /dev/null", shell=True, check=True)
    for r in range(ctx.repeats):
        with Mount(store, mnt) as m:
            mount_row.add(m.mount_seconds)
            (dsec, dcount), (nsec, ncount) = paired(
                r, lambda: list_count(native / "cur"), lambda: list_count(mnt / "cur"))
            if dcount != n or ncount != n:
                raise RuntimeError(f"scale: listed {dcount} / {ncount}, want {n}")
            list_row.add(dsec, nsec)
            subprocess.run(f"ls -l {mnt}/cur > /dev/null", shell=True, check=True)
            rss_row.add(m.rss_bytes())
        log(f"scale: mount {mount_row.dbox[-1]:.3f}s list {dsec:.2f}s vs {nsec:.2f}s "
            f"rss {rss_row.dbox[-1] / 2**20:.0f} MiB")
    return [mount_row, list_row, rss_row, imp]
