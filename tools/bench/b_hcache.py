"""NeoMutt header cache, the classic procedure: NeoMutt opens a flat
maildir twice per header-cache backend of the installed NeoMutt (run 1
populates an empty cache, run 2 reloads with it), on the mount and on
the native copy.  NeoMutt needs a terminal: it runs under script(1) and
quits as soon as the folder is open.  Every run must show Msgs:N in its
status line, N = messages in the folder, or the benchmark fails.  The FUSE floor
(passthrough_ll serving the native copy) opens it in the same rotation; when
the floor cannot hold a descriptor for each message of the corpus, all three
also open a smaller corpus that it can (bench.py, setup_hcache_floor)."""
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from benchlib import Row, log, sides

MUTTRC = """\
set mbox_type=Maildir
set folder={folder}
set header_cache={cache}
set header_cache_backend={backend}
set wait_key=no
set mail_check_stats=no
set status_format="-NeoMutt: [Msgs:%m]---"
"""

# header_cache_backend names NeoMutt knows, as `neomutt -v` lists them.
KNOWN = ("bdb", "gdbm", "kyotocabinet", "lmdb", "qdbm", "rocksdb",
         "tdb", "tokyocabinet")


def backends():
    """The hcache backends of the installed NeoMutt (from neomutt -v)."""
    out = subprocess.run(["neomutt", "-v"], capture_output=True, text=True).stdout
    m = re.search(r"^storage:\s*(.*)$", out, re.M)
    names = m.group(1).replace(",", " ").split() if m else []
    return [b for b in names if b in KNOWN]


def open_folder(folder, cache, backend, rcdir, expect):
    """Seconds for NeoMutt to open folder and quit."""
    rc = Path(rcdir) / "muttrc"
    rc.write_text(MUTTRC.format(folder=folder.parent, cache=cache, backend=backend))
    cmd = f"neomutt -n -F {rc} -f {folder} -e 'push <quit>'"
    t = time.monotonic()
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"],
                       env={**os.environ, "TERM": "xterm"}, capture_output=True,
                       timeout=900)
    elapsed = time.monotonic() - t
    seen = re.findall(rb"Msgs:(\d+)", r.stdout)
    if r.returncode != 0 or not seen or int(seen[-1]) != expect:
        raise RuntimeError(f"neomutt on {folder}: rc {r.returncode}, saw "
                           f"{seen[-1:] or 'no status line'}, want Msgs:{expect}")
    return elapsed


def run(ctx):
    if shutil.which("neomutt") is None:
        from benchlib import skipped
        return [skipped("hcache", "neomutt not installed")]
    rows = []
    for n, mount, native, floor in ctx.hc_scales:
        for backend in backends():
            rows += scale_rows(ctx, backend, n, mount, native, floor)
    return rows


def scale_rows(ctx, backend, n, mount, native, floor):
    """The populate and reload rows of one backend on the n-message
    corpus: dboxfs (mount), native and, when there is one, the floor."""
    pop = Row(f"hcache populate ({backend}, {n} msgs)", "time", "s", ("<=", 1.25, False),
              "" if floor else "no floor: passthrough_ll holds a descriptor per "
              "message, more than this machine's limit (the smaller corpus has one)",
              floor_target=("<=", 1 / 0.9) if floor else None)
    rel = Row(f"hcache reload ({backend}, {n} msgs)", "time", "s", ("<=", 1.10, False))
    for r in range(ctx.repeats):
        def side(folder, label):
            cache = Path(ctx.tmp) / f"hcache-{label}-{backend}-{n}"
            if cache.is_dir():
                shutil.rmtree(cache)
            elif cache.exists():
                cache.unlink()
            rcdir = Path(ctx.tmp)
            t1 = open_folder(folder, cache, backend, rcdir, n)
            t2 = open_folder(folder, cache, backend, rcdir, n)
            return t1, t2
        fns = [lambda: side(mount, "dboxfs"), lambda: side(native, "native")]
        if floor:
            fns.append(lambda: side(floor, "floor"))
        (d1, d2), (n1, n2), *flo = sides(r, fns)
        f1, f2 = flo[0] if flo else (None, None)
        pop.add(d1, n1, f1)
        rel.add(d2, n2, f2)
        log(f"hcache {backend} {n}: populate dboxfs {d1:.2f}s native {n1:.2f}s "
            f"floor {f1}; reload dboxfs {d2:.2f}s native {n2:.2f}s floor {f2}")
    return [pop, rel]
