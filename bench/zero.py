#!/usr/bin/env python3
"""ZeRO 0-3 on DP2 and PP2xDP2, side by side in one run: step time, bytes each rank sends per step in
collectives next to the theoretical volume, point-to-point bytes, peak memory per rank (measured and the
compiler's estimate), and the share of communication time hidden behind compute.

The model is the quickstart GPT (3.26M parameters) with one BLAS thread per rank.
Theory per rank (ring algorithms, Ψ parameters on the rank's device set, n replicas, m microbatches,
4 bytes per parameter): zero 0 and 1 send 2(n-1)/n·4Ψ, zero 2 sends (m+1)(n-1)/n·4Ψ (a reduce-scatter
per microbatch, one all-gather), zero 3 up to 3m(n-1)/n·4Ψ (gathers before each forward and backward,
a reduce-scatter per microbatch; a bucket still held is not gathered again). With two stages the tied
embedding adds a two-rank all-reduce of its owned gradient range.

    bench/zero.py BUILD_DIR [--steps N]
"""
import argparse
import os
import re
import subprocess
import sys

from bench_common import ROOT, mpi_env, piper_path

V, T, C, F, L = 256, 128, 256, 1024, 4


def block():
    return 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C


def psi(stage, pp):
    if pp == 1:
        return V * C + T * C + L * block() + 2 * C
    per = L // pp
    n = per * block()
    if stage == 0:
        n += V * C + T * C
    if stage == pp - 1:
        n += 2 * C + V * C  # ln_f and the head's copy of the tied embedding
    return n


def theory(zero, stage, pp, n, m):
    p = 4.0 * psi(stage, pp)
    ring = (n - 1) / n
    base = {0: 2 * ring * p, 1: 2 * ring * p, 2: (m + 1) * ring * p, 3: 3 * m * ring * p}[zero]
    if pp > 1 and stage in (0, pp - 1):
        tied = 4.0 * V * C / (n if zero >= 1 else 1)
        base += tied  # two-member all-reduce: each sends its half twice = the range once
    return base


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default="build")
    ap.add_argument("--steps", type=int, default=8)
    a = ap.parse_args()
    piper = piper_path(a.build)
    root = ROOT
    env = mpi_env()
    print("== ZeRO 0-3 (quickstart GPT, 1 thread per rank, mean of steps 2..%d) ==" % a.steps)
    print(f"{'layout':>9} {'zero':>4} {'step ms':>8} {'coll MB/rank':>13} {'theory MB':>10} {'p2p MB':>7} "
          f"{'peak MiB (est)':>16} {'held MiB':>9} {'hidden':>7}")
    for layout, np_, sets in (("DP2", 2, ["--set", "mesh.dp=2"]),
                              ("PP2xDP2", 4, ["--set", "mesh.pp=2", "--set", "mesh.dp=2", "--set", "mesh.microbatches=4"])):
        pp = 2 if layout.startswith("PP") else 1
        m = 4 if pp > 1 else 1
        for zero in range(4):
            cmd = ["mpirun", "-np", str(np_), piper, "--config", os.path.join(root, "configs", "quickstart.toml"),
                   "--steps", str(a.steps), "--set", 'checkpoint.dir=""', "--set", "job.threads=1",
                   "--set", f"mesh.zero={zero}", "--set", "mesh.bucket_mb=4"] + sets
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root)
            if out.returncode != 0:
                print(out.stdout + out.stderr, file=sys.stderr)
                sys.exit(f"zero bench: {' '.join(cmd)} failed")
            tl = {int(x.group(1)): x.group(0) for x in re.finditer(r"timeline rank=(\d+).*", out.stdout)}
            mem = {int(x.group(1)): x.group(0) for x in re.finditer(r"memory rank=(\d+).*", out.stdout)}
            def field(line, key):
                return float(re.search(rf"\b{key}=([\d.e+-]+)", line).group(1))
            for rank in sorted(tl)[: (2 if pp > 1 else 1)]:
                stage = rank % pp
                wall = field(tl[rank], "wall_ms")
                coll = field(tl[rank], "collective_mb")
                p2p = field(tl[rank], "p2p_mb")
                hidden = field(tl[rank], "hidden")
                peak = field(mem[rank], "peak_total") / 2**20
                est = field(mem[rank], "est_peak_total") / 2**20
                held = sum(field(mem[rank], k) for k in ("held_param", "held_grad", "held_optim")) / 2**20
                name = layout if pp == 1 else f"{layout}/s{stage}"
                print(f"{name:>9} {zero:>4} {wall:>8.1f} {coll:>13.2f} {theory(zero, stage, pp, 2, m) / 1e6:>10.2f} "
                      f"{p2p:>7.2f} {peak:>7.1f} ({est:>6.1f}) {held:>9.2f} {hidden:>7.1%}")
    print("command: mpirun -np N build/piper --config configs/quickstart.toml --set mesh.dp=2 [--set mesh.pp=2] "
          "--set mesh.zero=Z --set mesh.bucket_mb=4 --set job.threads=1")


if __name__ == "__main__":
    main()
