#!/usr/bin/env python3
"""Expert parallelism side by side in one run: the configs/qwen3-moe-small.toml model (8 experts, top-2) on 4
ranks as PP2 x EP2 (experts sharded over each stage's 2 ranks, the rest data-parallel), once with 1F1B (two
stages of two layers) and once with DualPipeV (four one-layer stages in a V, whose slots hold F and B of
different microbatches); and without a pipeline as EP4 over DP4 (every rank a quarter of the experts) and as
EP2 inside DP4 (two expert groups of 2 ranks, each expert held twice, its copies data-parallel). For each:
step time, all-to-all time per step, the part of it exposed (not hidden behind compute), from the end-of-run
report (mean over ranks), and the cost model's predicted step time from --dry-run next to the measured one.

    bench/moe.py BUILD_DIR [--rounds R] [--steps N] [--microbatches M]

On a machine with fewer cores than ranks the ranks share cores, so compute and communication compete
and "hidden" understates what separate devices would overlap; the numbers are what this machine did.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

from bench_common import ROOT, mpi_env, overlap, piper_path, union

EXPERTS = "\n".join(f'            ["model.layers.{i}.mlp.experts", "model.layers.{i}.mlp.experts"],' for i in range(4))


KINDS = ("1f1b", "dualpipev", "ep4-dp4", "ep2-in-dp4")
LABELS = {"1f1b": "PP2 x EP2, 1F1B", "dualpipev": "PP2 x EP2, DualPipeV", "ep4-dp4": "EP4 over DP4",
          "ep2-in-dp4": "EP2 inside DP4"}


def strategy(kind, m):
    if kind.startswith("ep"):  # one stage on 4 ranks: expert groups of 4 (the whole set) or of 2; each replica
        # has 4 of the 16 sequences, in 2 microbatches
        return f"\n[mesh]\ndp = 4\nep = {kind[2]}\nzero = 1\nmicrobatches = 2\n"
    text = "\n[[annotate]]\ntag = \"EP\"\nsegments = [\n" + EXPERTS + "\n]\n"
    text += f"\n[[directive]]\nop = \"split\"\ncount = {m}\n"
    if kind == "1f1b":
        text += "\n[[annotate]]\ntag = \"PP\"\nlayers = [[0, 1], [2, 3]]\n"
        places = ((0, "[0, 2]"), (1, "[1, 3]"))
    else:
        text += "\n[[annotate]]\ntag = \"PP\"\nlayers = [[0, 0], [1, 1], [2, 2], [3, 3]]\n"
        places = ((0, "[0, 2]"), (1, "[1, 3]"), (2, "[1, 3]"), (3, "[0, 2]"))
    for s, devices in places:
        text += f"\n[[directive]]\nop = \"place\"\nfilter = {{ PP = {s} }}\ndevices = {devices}\n"
    text += "\n[[directive]]\nop = \"replicate\"\nfilter = {}\nzero = 1\n"
    text += "\n[[directive]]\nop = \"shard\"\nfilter = { EP = \"*\" }\nstream = \"ep\"\n"
    return text + f"\n[[directive]]\nop = \"schedule\"\nkind = \"{kind}\"\n"


def predicted_exchange(timeline):
    """Mean over ranks of the predicted all-to-all time and its part not under compute (ms per step)."""
    events = [e for e in json.load(open(timeline))["traceEvents"] if e.get("ph") == "X"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in json.load(open(timeline))["traceEvents"]
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    per_rank = {}
    for e in events:
        kind = "a2a" if e["name"].startswith("ALL_TO_ALL") else (
            "compute" if threads.get((e["pid"], e["tid"])) == "compute" else None)
        if kind:
            per_rank.setdefault(e["pid"], {"a2a": [], "compute": []})[kind].append((e["ts"], e["ts"] + e["dur"]))
    a2a, exposed = [], []
    for r in per_rank.values():
        x, c = union(r["a2a"]), union(r["compute"])
        total = sum(b - a for a, b in x)
        a2a.append(total / 1e3)
        exposed.append((total - overlap(x, c)) / 1e3)
    return statistics.mean(a2a), statistics.mean(exposed)


def run(cmd, log):
    print("+ " + " ".join(cmd) + f"   > {os.path.relpath(log, ROOT)}", flush=True)
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=mpi_env())
    if p.returncode != 0:
        sys.exit(f"moe.py: command failed ({p.returncode}); see {log}")
    return open(log).read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=8)
    a = ap.parse_args()
    piper = piper_path(a.build)
    out = os.path.join(os.path.abspath(a.build), "bench-results", "moe")
    os.makedirs(out, exist_ok=True)
    base = open(os.path.join(ROOT, "configs", "qwen3-moe-small.toml")).read()
    base = base[:base.index("[checkpoint]")]
    results = {}
    predicted = {}
    for kind in KINDS:
        cfg = os.path.join(out, f"{kind}.toml")
        with open(cfg, "w") as f:
            f.write(base + strategy(kind, a.microbatches))
        plan_dir = os.path.join(out, f"{kind}-plan")
        text = run([piper, "--config", cfg, "--dry-run", "--world", "4", "--set", "job.threads=1", "--dump-plan",
                    plan_dir], os.path.join(out, f"{kind}-dry.log"))
        step = float(re.search(r"predicted step ([0-9.e+-]+) s", text).group(1))
        predicted[kind] = (step * 1e3,) + predicted_exchange(os.path.join(plan_dir, "timeline.json"))
    for r in range(1, a.rounds + 1):
        for kind in KINDS:
            cfg = os.path.join(out, f"{kind}.toml")
            text = run(["mpirun", "-np", "4", piper, "--config", cfg, "--steps", str(a.steps), "--set", "job.threads=1"],
                       os.path.join(out, f"{kind}-r{r}.log"))
            rows = [dict(kv.split("=") for kv in l.split()[1:]) for l in text.splitlines() if l.startswith("timeline rank=")]
            mean = lambda k: statistics.mean(float(x[k]) for x in rows)
            res = (mean("wall_ms"), mean("a2a_ms"), mean("a2a_exposed_ms"))
            results.setdefault(kind, []).append(res)
            print(f"  round {r} {kind}: step {res[0]:.1f} ms, all-to-all {res[1]:.1f} ms, exposed {res[2]:.1f} ms",
                  flush=True)
    print()
    print(f"4 ranks, 16 sequences a step ({a.microbatches} microbatches under PP2, 2 per replica under DP4), median "
          f"over {a.rounds} rounds of the mean over ranks of steps 2-{a.steps}")
    head = ("layout", "step ms (predicted)", "all-to-all ms (predicted)", "exposed all-to-all ms (predicted)",
            "hidden share (predicted)")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for kind in KINDS:
        rs = results[kind]
        step = statistics.median(x[0] for x in rs)
        a2a = statistics.median(x[1] for x in rs)
        exposed = statistics.median(x[2] for x in rs)
        ps, pa, pe = predicted[kind]
        print(f"| {LABELS[kind]} | {step:.1f} ({ps:.1f}) | {a2a:.1f} ({pa:.1f}) | {exposed:.1f} ({pe:.1f}) | "
              f"{(1 - exposed / a2a) if a2a > 0 else 0:.2f} ({(1 - pe / pa) if pa > 0 else 0:.2f}) |")
    e1 = statistics.median(x[2] for x in results["1f1b"])
    ev = statistics.median(x[2] for x in results["dualpipev"])
    print(f"exposed all-to-all, DualPipeV / 1F1B: measured {ev / e1:.2f}, predicted "
          f"{predicted['dualpipev'][2] / predicted['1f1b'][2]:.2f} (the goal: 0.5 or less)")
    print("predicted: the cost model of --dry-run (its [cost] preset; cpu unless the job sets one), from the "
          "timeline.json of --dump-plan")


if __name__ == "__main__":
    main()
