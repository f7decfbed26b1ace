#!/usr/bin/env python3
"""Pipeline schedules on 2 ranks (one BLAS thread each), side by side in one run: GPipe, 1F1B, ZB-H1 and
DualPipeV on the quickstart GPT with 8 microbatches. Prints the measured step time and each rank's
measured bubble next to the cost model's prediction (piper's `cpu` preset; --dry-run shows the same).

    bench/schedules.py BUILD_DIR [--steps N] [--rounds R]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from bench_common import ROOT, mpi_env, piper_path
import tempfile


def job_text(root, kind):
    base = open(os.path.join(root, "configs", "quickstart.toml")).read()
    base = re.sub(r"\[checkpoint\][^\[]*", "", base)
    base = base.replace('path = "data/fortunes.txt"', f'path = "{os.path.join(root, "data", "fortunes.txt")}"')
    if kind == "dualpipev":  # V layout: 4 stages of one layer; rank 0 holds stages 0 and 3, rank 1 stages 1 and 2
        ranges, rank_of = [[0, 0], [1, 1], [2, 2], [3, 3]], [0, 1, 1, 0]
    else:
        ranges, rank_of = [[0, 1], [2, 3]], [0, 1]
    t = base + f"\n[[annotate]]\ntag = \"PP\"\nlayers = {ranges}\n\n[[directive]]\nop = \"split\"\ncount = 8\n"
    for s, r in enumerate(rank_of):
        t += f"\n[[directive]]\nop = \"place\"\nfilter = {{ PP = {s} }}\ndevices = [{r}]\n"
    return t + f"\n[[directive]]\nop = \"schedule\"\nkind = \"{kind}\"\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    piper = piper_path(a.build)
    root = ROOT
    env = mpi_env()
    kinds = ["gpipe", "1f1b", "zb-h1", "dualpipev"]
    results = {k: [] for k in kinds}
    tmp = tempfile.mkdtemp(prefix="piper-bench-")
    for _ in range(a.rounds):  # interleaved rounds: machine noise hits every schedule alike
        for kind in kinds:
            cfg = os.path.join(tmp, f"{kind}.toml")
            open(cfg, "w").write(job_text(root, kind))
            dry = subprocess.run([piper, "--config", cfg, "--dry-run", "--world", "2"], capture_output=True, text=True,
                                 cwd=root, check=True).stdout
            pred_step = float(re.search(r"predicted step ([\d.e+-]+)", dry).group(1))
            cmd = ["mpirun", "-np", "2", piper, "--config", cfg, "--steps", str(a.steps), "--set", "job.threads=1"]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
            if out.returncode != 0:
                print(out.stdout + out.stderr, file=sys.stderr)
                sys.exit(f"schedules bench: {' '.join(cmd)} failed")
            rows = re.findall(r"timeline rank=(\d) wall_ms=([\d.]+) .*? bubble=([\d.]+) predicted_bubble=([\d.]+)", out.stdout)
            results[kind].append((pred_step, [(float(w), float(b), float(pb)) for _, w, b, pb in rows]))
    print(f"== pipeline schedules, 2 ranks x 1 thread, quickstart GPT, 8 microbatches; median of {a.rounds} rounds, "
          f"mean of steps 2..{a.steps} ==")
    print(f"{'schedule':>10} {'step ms':>8} {'predicted':>9}   {'bubble r0':>9} {'(pred)':>7}   {'bubble r1':>9} {'(pred)':>7}")
    for kind in kinds:
        pred = results[kind][0][0] * 1e3
        step = statistics.median(max(r[0] for r in rows) for _, rows in results[kind])
        b0 = statistics.median(rows[0][1] for _, rows in results[kind])
        b1 = statistics.median(rows[1][1] for _, rows in results[kind])
        p0, p1 = results[kind][0][1][0][2], results[kind][0][1][1][2]
        print(f"{kind:>10} {step:>8.1f} {pred:>9.1f}   {b0:>9.1%} {p0:>7.1%}   {b1:>9.1%} {p1:>7.1%}")
    print("command: mpirun -np 2 build/piper --config JOB.toml --set job.threads=1   (JOB: quickstart + [[annotate]] "
          "PP, split 8, place, schedule kind; predictions from --dry-run)")


if __name__ == "__main__":
    main()
