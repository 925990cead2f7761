"""Listing and stat of a big cur/ (`ls -f`, `ls -l`, warm caches after
one untimed listing of each side), and flag changes the maildir way:
rename cur/<unique>:2,<flags> to the same unique with a flag added, as
mail clients do (a different slice of messages every repeat), also on
the FUSE floor (passthrough_ll over a copy of the native folder)."""
import os
import time

from benchlib import Row, log, paired, sh_time, sides


def renames(cur, names):
    t = time.monotonic()
    for name in names:
        base, flags = name.split(":2,")
        os.rename(os.path.join(cur, name),
                  os.path.join(cur, f"{base}:2,{''.join(sorted(flags + 'T'))}"))
    return len(names) / (time.monotonic() - t)


def run(ctx):
    n = ctx.list_count
    nat, mnt = ctx.list_native / "cur", ctx.list_mount / "cur"
    for d in (nat, mnt):  # warm up: names and attributes cached once
        sh_time(f"ls -l {d} > /dev/null")
    rows = []
    for cmd in ("ls -f", "ls -l"):
        row = Row(f"`{cmd}` of {n // 1000}k folder", "time", "s",
                  ("<=", 1.5, False) if cmd == "ls -l" else None)
        for r in range(ctx.repeats):
            dbx, nt = paired(r, lambda: sh_time(f"{cmd} {nat} > /dev/null"),
                             lambda: sh_time(f"{cmd} {mnt} > /dev/null"))
            row.add(dbx, nt)
        log(f"{row.name}: ratio {row.ratio():.2f}")
        rows.append(row)
    return rows


def run_renames(ctx):
    n = ctx.list_count
    nat, mnt = ctx.list_native / "cur", ctx.list_mount / "cur"
    for d in (nat, mnt):  # warm up: names and attributes cached once
        sh_time(f"ls -l {d} > /dev/null")
    m = ctx.n("renames")
    row = Row(f"flag renames in {n // 1000}k folder", "rate", "renames/s",
              (">=", 1.0, False), f"{m} renames per run; the floor is mounted "
              "afresh each repeat and stats only the names it renames (it holds "
              "a descriptor per inode it has seen)", floor_target=(">=", 0.9))
    names = sorted(os.listdir(nat))
    if names != sorted(os.listdir(mnt)):
        raise RuntimeError("the native and mounted folders differ")
    floor = ctx.list_floor

    def floor_side(part):
        floor.unmount()
        floor.mount()
        cur = floor.mnt / "cur"
        for name in part:  # warm: these names and attributes cached
            os.stat(cur / name)
        return renames(cur, part)
    for r in range(ctx.repeats):
        part = names[r * m:(r + 1) * m]
        dbx, nt, fl = sides(r, [lambda: renames(mnt, part), lambda: renames(nat, part),
                                lambda: floor_side(part)])
        row.add(dbx, nt, fl)
        log(f"{row.name}: dboxfs {dbx:.0f}/s native {nt:.0f}/s floor {fl:.0f}/s")
    return [row]


class Renames:
    """The flag renames as a benchmark of their own (bench.py renames)."""
    run = staticmethod(run_renames)
