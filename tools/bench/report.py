"""report: the results table as Markdown and the chart as a PNG (gnuplot).

Columns: benchmark, dboxfs, native, floor, ratio, ratio to the floor,
target, met?.  Values are medians with (min-max) over the repeats; the
ratio is the median of the paired per-repeat ratios dboxfs / native,
with their min-max; the floor (passthrough_ll over ext4, for the write
rows and the counts) likewise."""
import os
import platform
import subprocess
import time
from pathlib import Path


def machine():
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024 // 1024
    try:
        deb = Path("/etc/debian_version").read_text().strip()
    except OSError:
        deb = "?"
    fs = "?"
    root = os.path.realpath(Path(__file__).resolve().parents[2])
    best = ""
    for line in Path("/proc/mounts").read_text().splitlines():
        f = line.split()
        if root.startswith(f[1]) and len(f[1]) > len(best):
            best, fs = f[1], f[2]
    return (f"{cpu}, {os.cpu_count()} cores, {mem} GiB RAM, Debian {deb}, "
            f"Linux {platform.release()}, {fs}")


def _cell(row, values, with_range=True):
    from benchlib import fmt_num
    if not values:
        return "-"
    s = sorted(values)
    med = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    if len(s) == 1 or not with_range:
        return fmt_num(med, row.unit)
    return f"{fmt_num(med, row.unit)} ({fmt_num(s[0], row.unit)}-{fmt_num(s[-1], row.unit)})"


def _target(row):
    out = []
    if row.target is not None:
        op, v, absolute = row.target
        op = "≤" if op == "<=" else "≥"
        if absolute:
            from benchlib import fmt_num
            out.append(f"{op} {fmt_num(v, row.unit)}")
        else:
            out.append(f"{op} {v:g} x")
    if row.floor_target is not None:
        op, v = row.floor_target
        out.append(f"{'≤' if op == '<=' else '≥'} {v:.2g} x floor")
    return "; ".join(out) or "-"


def _ratio_cell(r):
    if not r:
        return "-"
    s = sorted(r)
    med = s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2
    return f"{med:.2f} ({s[0]:.2f}-{s[-1]:.2f})" if len(s) > 1 else f"{s[0]:.2f}"


def _met(row):
    out = [m for m in (row.met(), row.floor_met()) if m is not None]
    return "; ".join("yes" if m else "**no**" for m in out) or "-"


def markdown(rows, meta):
    out = [f"Machine: {meta['machine']}  ",
           f"Date: {meta['date']}; mode: {meta['mode']}, {meta['repeats']} repeats; "
           f"load average at start: {meta['load']}  ",
           "Each cell: median (min-max) over the repeats; ratio = dboxfs / native "
           "measured side by side in each repeat; floor = libfuse's passthrough_ll "
           "over ext4 in the same repeats (the write rows), / floor = dboxfs / floor.", "",
           "| benchmark | dboxfs | native | floor | ratio | / floor | target | met? |",
           "|---|---|---|---|---|---|---|---|"]
    notes = []
    for row in rows:
        if row.skipped:
            out.append(f"| {row.name} | - | - | - | - | - | {_target(row)} | skipped |")
            notes.append(f"- {row.name}: {row.skipped}")
            continue
        out.append(f"| {row.name} | {_cell(row, row.dbox)} | {_cell(row, row.native)} | "
                   f"{_cell(row, row.floor)} | {_ratio_cell(row.ratios())} | "
                   f"{_ratio_cell(row.floor_ratios())} | {_target(row)} | {_met(row)} |")
        if row.note:
            notes.append(f"- {row.name}: {row.note}")
    if notes:
        out += ["", *notes]
    return "\n".join(out) + "\n"


def chart(rows, meta, png, workdir):
    """Bar chart of the ratio rows (median, min-max error bars, target
    marks), drawn by gnuplot into png."""
    data = Path(workdir) / "chart.dat"
    lines = []
    i = 0
    for row in rows:
        if row.skipped or not row.ratios() or row.target is None or row.target[2]:
            continue
        r = sorted(row.ratios())
        label = row.name.replace('"', "'").replace("`", "")
        lines.append(f'{i} {row.ratio():.4f} {r[0]:.4f} {r[-1]:.4f} {row.target[1]:.4f} '
                     f'{1 if row.met() else 0} "{label}"')
        i += 1
    data.write_text("\n".join(lines) + "\n")
    script = f"""
set terminal pngcairo size 1400,800 font "sans,10"
set output "{png}"
set title "dboxfs / native maildir, same run (median, min-max); {meta['date']}\\n{meta['machine']}" noenhanced
set ylabel "ratio dboxfs / native (rates: higher is better; times: lower is better)"
set logscale y
set grid ytics
set style fill solid 0.6 border -1
set boxwidth 0.6
set xtics rotate by -35 noenhanced font ",9"
set bmargin 12
set key top left
set xrange [-0.7:{i - 0.3}]
plot "{data}" using 1:2:($6 > 0 ? 0x2ca02c : 0xd62728):xtic(7) with boxes lc rgb variable title "ratio (green: target met)", \\
     "" using 1:2:3:4 with yerrorbars lc rgb "black" pt -1 title "min-max", \\
     "" using 1:5 with points pt 9 ps 2 lc rgb "#1f3fbf" title "target"
"""
    (Path(workdir) / "chart.gp").write_text(script)
    subprocess.run(["gnuplot", str(Path(workdir) / "chart.gp")], check=True)


def meta_now(mode, repeats):
    return {"machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "mode": mode, "repeats": repeats,
            "load": " ".join(Path("/proc/loadavg").read_text().split()[:3])}
