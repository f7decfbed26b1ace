#!/usr/bin/env python3
"""How the compile scales: `--dry-run --world N` of a GPT (d_model 1024, 1F1B, ZeRO-1) on one process,
swept along one axis at a time from a 4,096-rank base (64 layers, PP16 x DP256, 64 microbatches):
microbatches, pipeline stages (at 4,096 ranks), layers, and ranks (data-parallel width, up to 131,072),
then the 131,072-rank job of 128 layers, PP64 x DP2048 and 256 microbatches. Prints per run the seconds of
each compile phase piper reports (--dry-run), the process's wall time and peak resident memory, the
instructions of the largest plan and the plan bytes rank 0 sends; then per axis the log-log slope
(least squares) of each phase's time against the axis: 1 is linear, 0 flat.

    bench/compile_scale.py BUILD_DIR [--rounds R]    (each point: the fastest of R runs, default 1)
"""
import math
import os
import re
import subprocess
import sys
import tempfile
import time

from bench_common import ROOT, piper_path

PHASES = ["passes", "lowering", "verification", "serialization"]
BASE = {"layers": 64, "pp": 16, "dp": 256, "microbatches": 64}
AXES = [
    ("microbatches", [{"microbatches": m} for m in (32, 64, 128, 256)]),
    ("stages", [{"pp": p, "dp": 4096 // p} for p in (8, 16, 32, 64)]),
    ("layers", [{"layers": n} for n in (32, 64, 128, 256)]),
    ("ranks", [{"dp": d} for d in (256, 1024, 4096, 8192)]),
]
HEADLINE = {"layers": 128, "pp": 64, "dp": 2048, "microbatches": 256}


def compile_once(build, point):
    world = point["pp"] * point["dp"]
    cmd = [piper_path(build), "--config", os.path.join(ROOT, "configs/quickstart.toml"), "--dry-run",
           "--world", str(world), "--set", "model.d_model=1024", "--set", "model.n_heads=16", "--set",
           "model.d_ff=4096", "--set", f"model.n_layers={point['layers']}", "--set", f"mesh.pp={point['pp']}",
           "--set", f"mesh.dp={point['dp']}", "--set", f"mesh.microbatches={point['microbatches']}", "--set",
           "mesh.zero=1", "--set", f"data.batch={point['dp'] * point['microbatches']}"]
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - start
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if p.returncode != 0:
        sys.exit(f"compile_scale: {' '.join(cmd)} exited {p.returncode}:\n{text[-3000:]}")
    phases = {l.split()[2]: float(l.split()[3]) for l in text.splitlines()
              if l.startswith("compile phase ") and not l.split()[2].startswith("(")}
    rows = [l.split() for l in text.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s+\d+\s", l)]
    return {
        **phases,
        "compile": float(re.search(r"compiled in ([\d.]+) s", text).group(1)),
        "wall": wall,
        "peak_mib": usage.ru_maxrss / 1024.0,
        "instrs": max(int(r[2]) for r in rows),
        "sent": int(re.search(r"plan bytes sent by rank 0: (\d+)", text).group(1)),
        "cmd": cmd,
    }


def measure(build, point, rounds):
    runs = [compile_once(build, point) for _ in range(rounds)]
    return min(runs, key=lambda r: r["wall"])


def slope(xs, ys):
    """Least-squares slope of log y against log x (None when a time is too small to read)."""
    if min(ys) <= 0.0005:
        return None
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def row(point, r):
    world = point["pp"] * point["dp"]
    cells = [f"{point['layers']:>6}", f"{'PP%dxDP%d' % (point['pp'], point['dp']):>13}",
             f"{point['microbatches']:>5}", f"{world:>7}"]
    cells += [f"{r.get(ph, 0.0):>8.3f}" for ph in PHASES]
    cells += [f"{r['compile'] + r.get('serialization', 0.0):>8.3f}", f"{r['wall']:>7.2f}", f"{r['peak_mib']:>8.0f}",
              f"{r['instrs']:>8}", f"{r['sent']:>11}"]
    return " ".join(cells)


def main():
    args = sys.argv[1:]
    rounds = 1
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i:i + 2]
    build = args[0] if args else "build"
    print("== compile scaling: GPT d_model 1024, 1F1B, ZeRO-1, --dry-run --world N on one process ==")
    header = (f"{'layers':>6} {'layout':>13} {'mb':>5} {'ranks':>7} " + " ".join(f"{p[:8]:>8}" for p in PHASES)
              + f" {'compile':>8} {'wall s':>7} {'peak MiB':>8} {'instrs':>8} {'plan B sent':>11}")
    slopes = []
    for axis, points in AXES:
        print(f"-- {axis} (others at {BASE})")
        print(header)
        xs, times = [], {k: [] for k in PHASES + ["compile", "wall"]}
        for change in points:
            point = {**BASE, **change}
            r = measure(build, point, rounds)
            print(row(point, r), flush=True)
            xs.append({"microbatches": point["microbatches"], "stages": point["pp"], "layers": point["layers"],
                       "ranks": point["pp"] * point["dp"]}[axis])
            for k in times:
                times[k].append(r.get(k, 0.0) + (r.get("serialization", 0.0) if k == "compile" else 0.0))
        slopes.append((axis, {k: slope(xs, v) for k, v in times.items()}))
    print(f"-- the 131,072-rank job {HEADLINE}")
    print(header)
    r = measure(build, HEADLINE, rounds)
    print(row(HEADLINE, r))
    print("-- log-log slope of time against each axis (1 = linear; '-' = too fast to read)")
    print(f"{'axis':>13} " + " ".join(f"{k[:8]:>8}" for k in PHASES + ["compile", "wall"]))
    for axis, s in slopes:
        print(f"{axis:>13} " + " ".join(f"{'-' if s[k] is None else '%.2f' % s[k]:>8}" for k in PHASES + ["compile", "wall"]))
    print("compile = every phase, serialization included; wall = the whole process (start, job loading, output)")
    print("command of the last run: " + " ".join(r["cmd"]))


if __name__ == "__main__":
    main()
