#!/usr/bin/env python3
"""Activation recompute on configs/qwen3-small.toml, one process: per policy (none, full, selective) the step time
(median over rounds of each run's median step), the FLOPs the reruns add, and the activation peak measured by the
runtime next to the compiler's estimate. Usage: bench/recompute.py BUILD_DIR [--rounds R] [--steps N]
[--policies none,full,selective]. The policies run alternately in each round, so that a noisy machine slows
them alike."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from bench_common import ROOT, mpi_env, piper_path


def directive(policy):
    return "" if policy == "none" else f'\n[[directive]]\nop = "recompute"\nfilter = {{}}\npolicy = "{policy}"\n'


def run(piper, d, policy, steps, rnd):
    text = open(os.path.join(ROOT, "configs", "qwen3-small.toml")).read().replace('"data/', f'"{ROOT}/data/')
    cfg = os.path.join(d, f"{policy}.toml")
    with open(cfg, "w") as f:
        f.write(text + directive(policy))
    metrics, summary = os.path.join(d, f"{policy}-{rnd}.jsonl"), os.path.join(d, f"{policy}-{rnd}.json")
    p = subprocess.run(["mpirun", "-np", "1", piper, "--config", cfg, "--steps", str(steps), "--metrics", metrics,
                        "--report-json", summary], capture_output=True, text=True, env=mpi_env())
    if p.returncode != 0:
        sys.exit(f"recompute {policy}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    ms = statistics.median(json.loads(l)["ms"] for l in open(metrics).read().splitlines()[2:])
    memory = json.load(open(summary))["ranks"][0]["memory"]
    extra = re.search(r"recompute: ([0-9.]+) GFLOP per step more \(([0-9.]+)% of the model's\)", p.stdout)
    model = re.search(r"model: \d+ parameters, ([0-9.]+) GFLOP per step", p.stdout)
    return {"ms": ms, "peak": memory["peak_bytes"]["activations"],
            "estimate": memory["estimated_peak_bytes"]["activations"],
            "model_gflop": float(model.group(1)), "extra_gflop": float(extra.group(1)) if extra else 0.0}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--policies", default="none,full,selective")
    a = ap.parse_args()
    piper = piper_path(a.build)
    policies = a.policies.split(",")
    d = tempfile.mkdtemp(prefix="piper-bench-recompute-")
    runs = {p: [] for p in policies}
    for rnd in range(a.rounds):
        for policy in policies:
            runs[policy].append(run(piper, d, policy, a.steps, rnd))
    base = statistics.median(r["ms"] for r in runs[policies[0]])
    base_peak = runs[policies[0]][0]["peak"]
    print(f"qwen3-small, 1 process, {a.steps} steps, median of {a.rounds} rounds (step times: median of steps 3-{a.steps})")
    print("| policy | step ms | vs " + policies[0] + " | model GFLOP/step | rerun GFLOP/step (share) | activation peak MiB "
          "(vs " + policies[0] + ") | estimate / measured |")
    print("|---|---|---|---|---|---|---|")
    for policy in policies:
        r = runs[policy]
        ms = statistics.median(x["ms"] for x in r)
        one = r[0]
        print(f"| {policy} | {ms:.1f} | {ms / base:.2f} | {one['model_gflop']:.2f} | {one['extra_gflop']:.2f} "
              f"({one['extra_gflop'] / one['model_gflop']:.1%}) | {one['peak'] / 2**20:.1f} ({one['peak'] / base_peak:.2f}) "
              f"| {one['estimate'] / one['peak']:.4f} |")


if __name__ == "__main__":
    main()
