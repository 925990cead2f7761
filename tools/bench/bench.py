#!/usr/bin/python3
"""bench: dboxfs against a native ext4 maildir, side by side.

    bench.py [--quick] [--only NAMES] [--repeats N] [--out DIR]

Runs the benchmarks of issue #5 (delivery, imap, hcache, read, space,
listing, renames, scale), the cost of one FUSE request (roundtrip),
messages written again in place (rewrites) and the backups of issue #15
(backup, backup_scale),
each repeating native and dboxfs in alternating order; the write rows
(delivery, rewrites, imap, hcache, renames) also run on the FUSE floor
(passthrough_ll over ext4, `make` builds it) in the same rotation, and
counts gives requests, daemon syscalls and daemon CPU per operation and
the fsync() latency of a delivery on both.  Writes OUT/results.md
(Markdown table), OUT/results.png (gnuplot chart) and OUT/results.json
(every sample).  Scratch data lives in
OUT/tmp/ (generated corpora are kept there between runs; delete it to
free the space).  Needs root (drop_caches, Dovecot as user mail) and the
packages of `make bench-deps`.  --only runs a subset and writes
OUT/tmp/results-only.md instead.
"""
import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib  # noqa: E402
from benchlib import (Floor, Mount, Row, corpus, corpus_messages, count_inodes,  # noqa: E402
                      du_bytes, fresh_dir, import_store, log, tiny_maildir)
import report  # noqa: E402

# Sizes: full run / quick run.
SIZES = {
    "corpus": (50000, 5000),        # hcache, read, space; delivery bytes
    "list": (100000, 20000),        # ls -f, ls -l, renames
    "scale": (1000000, 100000),
    "delivery_fsync": (2000, 400),
    "delivery": (5000, 1000),
    "imap_seconds": (10, 3),
    "renames": (10000, 2000),
    "roundtrip": (20000, 5000),
    "rewrites": (2000, 300),
}
HEAVY = {"hcache", "read", "scale", "backup", "backup_scale"}
ORDER = ["roundtrip", "counts", "delivery", "rewrites", "imap", "hcache", "read", "space",
         "listing", "renames", "scale", "backup", "backup_scale"]


class Context:
    def __init__(self, quick, repeats, out):
        self.quick = quick
        self.repeats = repeats
        self.out = Path(out)
        self.tmp = self.out / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)

    def n(self, what):
        return SIZES[what][1 if self.quick else 0]

    def repeats_for(self, name):
        """Repeats of benchmark name: the heavy ones (minutes per repeat in
        a full run) repeat 3 times, to stay within 30 minutes."""
        if self.repeats_set or self.quick:
            return self.repeats
        return 3 if name in HEAVY else self.repeats


def setup_work(ctx, stack):
    """Empty mounted stores and an empty native root for writers: ctx.mnt
    mounted by root for itself, the writers' mount, and ctx.imap_mnt
    mounted by user mail for itself, for Dovecot, whose mail processes
    run as mail (as docs/dovecot.md advises: no allow_other; the daemon
    checks permissions on both)."""
    ctx.native_root = fresh_dir(ctx.tmp / "work-native")
    store = ctx.tmp / "work-store"
    fresh_dir(store).rmdir()
    m = Mount(store, ctx.tmp / "work-mnt")
    stack.append(m)
    m.mount()
    ctx.mnt = m.mnt
    own = fresh_dir(ctx.tmp / "imap-own")
    shutil.chown(own, "mail", "mail")
    m = Mount(own / "store", own / "mnt", user="mail")
    stack.append(m)
    m.mount()
    ctx.imap_mnt = m.mnt
    ctx.work_floor = mount_floor(ctx, stack, fresh_dir(ctx.tmp / "work-floor-src"),
                                 ctx.tmp / "work-floor-mnt")
    ctx.floor_mnt = ctx.work_floor.mnt


def mount_floor(ctx, stack, source, mnt):
    """passthrough_ll serving source on mnt (benchlib.Floor), mounted."""
    f = Floor(source, mnt)
    stack.append(f)
    f.mount()
    return f


def setup_corpus(ctx, stack):
    """The corpus natively and as an imported, mounted store."""
    ctx.hc_count = ctx.n("corpus")
    ctx.hc_native = corpus(ctx.tmp, ctx.hc_count)
    ctx.messages = corpus_messages(ctx.hc_native)
    store = import_store(ctx.tmp / "corpus-store", ctx.hc_native)
    ctx.hc_store_size_snapshot = {"du": du_bytes(store), "inodes": count_inodes(store)}
    m = Mount(store, ctx.tmp / "corpus-mnt")
    stack.append(m)
    m.mount()
    ctx.hc_mount = m.mnt
    # The floor serves the native corpus itself (NeoMutt only reads it),
    # when it can hold a descriptor for every message.
    floor = None
    if ctx.hc_count <= benchlib.floor_max_inodes():
        floor = mount_floor(ctx, stack, ctx.hc_native, ctx.tmp / "corpus-floor-mnt").mnt
    # (messages, mount, native, floor or None) of each hcache scale.
    ctx.hc_scales = [(ctx.hc_count, ctx.hc_mount, ctx.hc_native, floor)]


def setup_hcache_floor(ctx, stack):
    """A second, smaller corpus for hcache when passthrough_ll cannot hold
    the first: it keeps a descriptor per inode the kernel looked up, and
    RLIMIT_NOFILE's hard limit (which root here cannot raise) is below the
    corpus.  The floor, dboxfs and native open the smaller one in the same
    rotation, so hcache populate has its ratio to the floor."""
    if ctx.hc_scales[0][3] is not None:
        return
    n = benchlib.floor_max_inodes() // 5000 * 5000
    native = corpus(ctx.tmp, n)
    store = import_store(ctx.tmp / f"corpus-{n}-store", native)
    m = Mount(store, ctx.tmp / f"corpus-{n}-mnt")
    stack.append(m)
    m.mount()
    floor = mount_floor(ctx, stack, native, ctx.tmp / f"corpus-{n}-floor-mnt").mnt
    ctx.hc_scales.append((n, m.mnt, native, floor))


def setup_list(ctx, stack):
    ctx.list_count = ctx.n("list")
    log(f"listing: writing {ctx.list_count} native messages and importing them")
    ctx.list_native = fresh_dir(ctx.tmp / "list-native")
    tiny_maildir(ctx.list_native, ctx.list_count)
    store = import_store(ctx.tmp / "list-store", ctx.list_native)
    m = Mount(store, ctx.tmp / "list-mnt")
    stack.append(m)
    m.mount()
    ctx.list_mount = m.mnt
    src = ctx.tmp / "list-floor-src"
    if src.exists():
        benchlib.shutil.rmtree(src)
    benchlib.run(["cp", "-a", ctx.list_native, src])
    ctx.list_floor = mount_floor(ctx, stack, src, ctx.tmp / "list-floor-mnt")
    if ctx.n("renames") > benchlib.floor_max_inodes():
        sys.exit("bench: passthrough_ll cannot hold the renames' inodes here")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (bench-quick)")
    ap.add_argument("--repeats", type=int, help="repeats per benchmark (5 full, 3 quick)")
    ap.add_argument("--only", help="comma-separated subset of " + ",".join(ORDER))
    ap.add_argument("--out", default=str(benchlib.ROOT / "bench"))
    ap.add_argument("--update", action="store_true",
                    help="with --only: put the new rows into OUT/results.* in place of "
                         "the old ones (after a change that touches one benchmark)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench: needs root (drop_caches, Dovecot running as mail)")
    for exe in (benchlib.DBOXFS, benchlib.DBOXADM, benchlib.PASSTHROUGH_LL):
        if not exe.exists():
            sys.exit(f"bench: {exe} missing: run make {exe.relative_to(benchlib.ROOT)} first")
    only = args.only.split(",") if args.only else ORDER
    for name in only:
        if name not in ORDER:
            sys.exit(f"bench: unknown benchmark {name}")
    ctx = Context(args.quick, args.repeats or (3 if args.quick else 5), args.out)
    ctx.repeats_set = args.repeats is not None
    meta = report.meta_now("quick" if args.quick else "full",
                           ctx.repeats if ctx.quick or ctx.repeats_set
                           else f"{ctx.repeats} (hcache, read, scale: 3)")
    log(f"{meta['mode']} run, {ctx.repeats} repeats, load {meta['load']}")

    import b_delivery, b_imap, b_hcache, b_read, b_space, b_listing, b_scale  # noqa: E401
    import b_roundtrip, b_counts, b_backup, b_rewrite  # noqa: E401
    modules = {"roundtrip": b_roundtrip, "counts": b_counts, "delivery": b_delivery,
               "rewrites": b_rewrite,
               "imap": b_imap, "hcache": b_hcache, "read": b_read, "space": b_space,
               "listing": b_listing, "renames": b_listing.Renames, "scale": b_scale,
               "backup": b_backup, "backup_scale": b_backup.Scale}
    rows, stack = [], []
    base_repeats = ctx.repeats
    try:
        if {"counts", "delivery", "imap", "hcache", "read", "space", "backup"} & set(only):
            setup_corpus(ctx, stack)
        if "hcache" in only:
            setup_hcache_floor(ctx, stack)
        if {"delivery", "rewrites", "imap"} & set(only):
            setup_work(ctx, stack)
        if {"listing", "renames"} & set(only):
            setup_list(ctx, stack)
        for name in ORDER:
            if name in only:
                log(f"== {name}")
                ctx.repeats = ctx.repeats_for(name)
                rows += modules[name].run(ctx)
                ctx.repeats = base_repeats
    finally:
        for m in stack:
            m.unmount()

    out = Path(args.out)
    if args.only and args.update:
        rows, meta = updated(out / "results.json", rows, meta, only)
    md = report.markdown(rows, meta)
    print(md)
    if args.only and not args.update:
        (ctx.tmp / "results-only.md").write_text(md)
        return 0
    (out / "results.md").write_text(md)
    (out / "results.json").write_text(json.dumps(
        {"meta": meta, "rows": [r.to_json() for r in rows]}, indent=1) + "\n")
    report.chart(rows, meta, out / "results.png", ctx.tmp)
    log(f"wrote {out}/results.md, results.png, results.json")
    return 0


def updated(path, new_rows, new_meta, only):
    """The rows of an earlier full run (results.json) with new_rows in
    place of the rows of the same name, and its meta saying which
    benchmarks (only) were measured again, when."""
    old = json.loads(path.read_text())
    meta = old["meta"]
    by_name = {r.name: r for r in new_rows}
    rows = [by_name.pop(d["name"], None) or benchlib.Row.from_json(d) for d in old["rows"]]
    rows += by_name.values()
    meta["date"] += f"; {', '.join(only)} again {new_meta['date']}"
    return rows, meta


if __name__ == "__main__":
    sys.exit(main())
