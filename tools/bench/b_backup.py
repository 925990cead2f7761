"""Backup: `dboxadm backup` of a mounted store against what maildir users
do today with the same mail as a native maildir, cold caches (sync and
drop_caches before every timed command, on both sides):

- full: dboxadm backup STORE DEST vs `cp -a` and `rsync -a` of the maildir;
- then 1% of the messages change flags (renamed through the mount, and
  natively) and 1% new mail arrives (delivered through the mount, and
  natively), and the incremental: dboxadm backup --link-dest=FULL vs
  `rsync -a --delete` into the earlier rsync copy, and vs an
  rsnapshot-style `rsync -a --link-dest=FULL` snapshot of the maildir;
- the disk the next snapshot costs (du -B1 of both snapshots together,
  less the first: hard links count once): --link-dest backup vs the
  rsync --link-dest snapshot.

Two sizes: "backup" on the realistic corpus (50k messages in the full
run), "backup_scale" on the scale benchmark's 1M small messages (its
native tree and store are reused; made here when missing).  Each works
on copies (made once, untimed) so the inputs of other benchmarks stay as
they are; the copies change a little with every repeat (1% more mail)."""
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from benchlib import (DBOXADM, Mount, Row, drop_caches, du_bytes, fresh_dir, log, paired,
                      run as run_cmd)

GOAL = ("<=", 0.05, False)  # incremental at least 20x faster than rsync


def cold(cmd):
    """Wall seconds of cmd (a list) after sync + drop_caches."""
    drop_caches()
    t = time.monotonic()
    subprocess.run([str(a) for a in cmd], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t


def rm(*paths):
    for p in paths:
        if Path(p).exists():
            shutil.rmtree(p)


def extra_bytes(first, second):
    """Disk bytes second adds to first (du counts a hard link once)."""
    out = run_cmd(["du", "-s", "-B1", first, second], capture_output=True,
                  text=True).stdout.splitlines()
    return int(out[1].split()[0])


def change_one_percent(native, mnt, step, messages):
    """1% of the messages get the flag F (the same names on both sides),
    and 1% new messages arrive in new/.  Returns (renamed, delivered)."""
    everything = os.listdir(native / "cur")
    names = sorted(n for n in everything if ":2," in n and "F" not in n.split(":2,")[1])
    k = min(len(names), max(1, len(everything) // 100))
    renamed = 0
    for n in names[step::max(1, len(names) // k)][:k]:
        base, flags = n.split(":2,")
        new = f"{base}:2,{''.join(sorted(flags + 'F'))}"
        for root in (native, mnt):
            os.rename(root / "cur" / n, root / "cur" / new)
        renamed += 1
    count = sum(1 for _ in os.scandir(native / "cur"))
    for i in range(max(1, count // 100)):
        name = f"{1800000000 + step * 100000 + i}.M{i}P{step}.bench.example.org"
        data = messages[i % len(messages)]
        for root in (native, mnt):
            with open(root / "tmp" / name, "wb") as f:
                f.write(data)
            os.rename(root / "tmp" / name, root / "new" / name)
    return renamed, max(1, count // 100)


def measure(ctx, label, native_src, store_src, messages):
    tmp = Path(ctx.tmp) / ("backup-" + label.replace(" ", "-"))
    native, store = tmp / "native", tmp / "store"
    if not (tmp / ".complete").exists():
        log(f"backup {label}: copying the inputs")
        rm(tmp)
        tmp.mkdir(parents=True)
        run_cmd(["cp", "-a", native_src, native])
        # The source may be mounted (the corpus store is): copied as a
        # backup, which is consistent either way.
        run_cmd([DBOXADM, "backup", store_src, store], stdout=subprocess.DEVNULL)
        (tmp / ".complete").touch()
    full_cp = Row(f"full backup, {label}: dboxadm backup vs cp -a", "time", "s", None,
                  "store mounted; cold cache")
    full_rs = Row(f"full backup, {label}: dboxadm backup vs rsync -a", "time", "s", None,
                  "store mounted; cold cache")
    inc_rs = Row(f"incremental backup (1% flags, 1% new), {label}: vs rsync -a", "time", "s",
                 GOAL, "--link-dest vs rsync -a --delete into the last copy")
    inc_ln = Row(f"incremental backup, {label}: vs rsync --link-dest snapshot", "time", "s",
                 GOAL, "rsnapshot-style native snapshot")
    disk = Row(f"disk cost of the next snapshot, {label}", "bytes", "B", None,
               "--link-dest backup vs rsync --link-dest snapshot")
    out = tmp / "out"
    with Mount(store, tmp / "mnt") as m:
        for r in range(ctx.repeats):
            fresh_dir(out)
            # A daily backup finds its sealed m.N hours old; a file changed
            # less than 2 s before a backup is never linked by the next.
            time.sleep(2.1)
            d_full, n_cp, n_rs = out / "dbox-full", out / "cp", out / "rsync"
            dsec, nsec = paired(r, lambda: cold(["cp", "-a", native, n_cp]),
                                lambda: cold([DBOXADM, "backup", store, d_full]))
            full_cp.add(dsec, nsec)
            nsec = cold(["rsync", "-a", f"{native}/", f"{n_rs}/"])
            full_rs.add(dsec, nsec)
            renamed, delivered = change_one_percent(native, m.mnt, r, messages)
            d_inc, n_snap = out / "dbox-inc", out / "rsync-snap"
            dsec, nsec = paired(
                r, lambda: cold(["rsync", "-a", "--delete", f"{native}/", f"{n_rs}/"]),
                lambda: cold([DBOXADM, "backup", store, d_inc,
                              f"--link-dest={d_full}"]))
            inc_rs.add(dsec, nsec)
            nsec = cold(["rsync", "-a", f"--link-dest={n_cp}", f"{native}/", f"{n_snap}/"])
            inc_ln.add(dsec, nsec)
            disk.add(extra_bytes(d_full, d_inc), extra_bytes(n_cp, n_snap))
            summary = json.loads(run_cmd([DBOXADM, "backup", "--json", store, out / "check",
                                          f"--link-dest={d_inc}"], capture_output=True,
                                         text=True).stdout)
            run_cmd([DBOXADM, "check", d_inc], stdout=subprocess.DEVNULL)
            log(f"backup {label} #{r}: full {full_cp.dbox[-1]:.2f}s (cp -a "
                f"{full_cp.native[-1]:.2f}s, rsync {full_rs.native[-1]:.2f}s); "
                f"{renamed} renamed, {delivered} new: incremental {inc_rs.dbox[-1]:.2f}s "
                f"(rsync {inc_rs.native[-1]:.2f}s, rsync --link-dest "
                f"{inc_ln.native[-1]:.2f}s); disk {disk.dbox[-1] / 2**20:.1f} MiB vs "
                f"{disk.native[-1] / 2**20:.1f} MiB; unchanged again: "
                f"{summary['files_linked']} linked, {summary['files_copied']} copied")
    rm(out)
    return [full_cp, full_rs, inc_rs, inc_ln, disk]


def run(ctx):
    """The realistic corpus (setup_corpus made it and its store)."""
    store = Path(ctx.tmp) / "corpus-store"
    return measure(ctx, f"{ctx.hc_count // 1000}k msgs", ctx.hc_native, store, ctx.messages)


class Scale:
    """backup_scale: the scale benchmark's 1M small messages."""

    @staticmethod
    def run(ctx):
        import b_scale
        native, store, _ = b_scale.inputs(ctx)
        cur = native / "cur"
        msgs = [(cur / n).read_bytes() for n in sorted(os.listdir(cur))[:100]]
        return measure(ctx, f"{ctx.n('scale') // 1000}k small msgs", native, store, msgs)
