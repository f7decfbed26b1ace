#!/usr/bin/env python3
"""Tensor parallelism side by side in one run: the configs/qwen3-small.toml model (8 heads, 4 key/value heads,
d_ff 768, vocab 256: all divide by 2) as TP2 on 2 ranks (`[mesh] tp = 2`: attention, MLP and LM head split over
the pair, all-reduces and the head's all-gather on the "tp" stream), next to the same job on 1 rank (with 2
threads, the whole machine, and with 1 thread, one rank's share of it) and, for reference, DP2 on 2 ranks
(`[mesh] dp = 2`, one gradient all-reduce on the "dp" stream). Every layout trains the same 16 sequences a step.
For each: step time, the collectives' time per step (the union of the instructions on streams other than
"compute", from the --trace file: per rank, per step) and the part of it exposed (not overlapping the compute
stream's instructions, as the runtime's `timeline` line counts it), and the cost model's predicted step and
collective times from --dry-run --json --dump-plan (its timeline.json) next to the measured ones. Also the
last step's loss of each layout and its relative difference from the 1-rank runs' (reported, never asserted).

    bench/tensor_parallel.py BUILD_DIR [--rounds R] [--steps N]

The layouts run alternately in each round, so that a noisy machine slows them alike. On a machine with fewer
cores than 2 ranks x threads the ranks share cores, so compute and communication compete; the numbers are
what this machine did.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_common import ROOT, mpi_env, overlap, piper_path, union

# name: (label, ranks, threads per rank, [mesh] text)
LAYOUTS = {
    "1rank-2t": ("1 rank, 2 threads", 1, 2, ""),
    "1rank-1t": ("1 rank, 1 thread", 1, 1, ""),
    "tp2": ("TP2 on 2 ranks", 2, 1, "\n[mesh]\ntp = 2\n"),
    "dp2": ("DP2 on 2 ranks", 2, 1, "\n[mesh]\ndp = 2\n"),
}


def collectives(trace):
    """From a Chrome trace (--trace, or --dump-plan's timeline.json): {step: (collective ms, exposed ms)}, each the
    mean over ranks, and the names of the streams the collectives ran on. Collectives: every instruction on a
    stream other than "compute"; compute: the compute stream's instructions but the step sync."""
    events = json.load(open(trace))["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e["name"] == "thread_name"}
    per = {}  # (step, rank) -> {"comm": [...], "compute": [...]}
    streams = set()
    for e in events:
        if e.get("ph") != "X":
            continue
        stream = threads.get((e["pid"], e["tid"]))
        key = (e["args"].get("step", 1), e["pid"])
        slot = per.setdefault(key, {"comm": [], "compute": []})
        if stream == "compute":
            if not e["name"].startswith("STEP_SYNC"):
                slot["compute"].append((e["ts"], e["ts"] + e["dur"]))
        else:
            streams.add(stream)
            slot["comm"].append((e["ts"], e["ts"] + e["dur"]))
    steps = {}
    for (step, _), slot in per.items():
        x, c = union(slot["comm"]), union(slot["compute"])
        total = sum(b - a for a, b in x)
        steps.setdefault(step, []).append((total / 1e3, (total - overlap(x, c)) / 1e3))
    return ({s: (statistics.mean(v[0] for v in vals), statistics.mean(v[1] for v in vals))
             for s, vals in steps.items()}, sorted(streams))


def run(cmd, log):
    print("+ " + " ".join(cmd) + f"   > {os.path.relpath(log, ROOT)}", flush=True)
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=mpi_env())
    if p.returncode != 0:
        sys.exit(f"tensor_parallel.py: command failed ({p.returncode}); see {log}")
    return open(log).read()


def load_average():
    try:
        return open("/proc/loadavg").read().split()[0]
    except OSError:
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("tensor_parallel.py: --steps must be at least 2 (the first step is left out)")
    piper = piper_path(a.build)
    out = os.path.join(os.path.abspath(a.build), "bench-results", "tensor_parallel")
    os.makedirs(out, exist_ok=True)
    base = open(os.path.join(ROOT, "configs", "qwen3-small.toml")).read()
    base = base[:base.index("[checkpoint]")].replace('"data/', f'"{ROOT}/data/')
    predicted, streams = {}, {}
    for kind, (_, ranks, threads, mesh) in LAYOUTS.items():
        cfg = os.path.join(out, f"{kind}.toml")
        with open(cfg, "w") as f:
            f.write(base + mesh)
        plan_dir = os.path.join(out, f"{kind}-plan")
        text = run([piper, "--config", cfg, "--dry-run", "--json", "--world", str(ranks), "--set",
                    f"job.threads={threads}", "--dump-plan", plan_dir], os.path.join(out, f"{kind}-dry.log"))
        doc = json.loads(text[text.index("{"):])
        step = doc["cost_model"]["predicted_step"] * (1e3 if doc["cost_model"]["unit"] == "s" else 1)
        per_step, _ = collectives(os.path.join(plan_dir, "timeline.json"))
        comm = per_step.get(1, (0.0, 0.0)) if per_step else (0.0, 0.0)
        predicted[kind] = (step,) + comm
    results = {k: [] for k in LAYOUTS}
    for r in range(1, a.rounds + 1):
        line = []
        for kind, (_, ranks, threads, _) in LAYOUTS.items():
            cfg = os.path.join(out, f"{kind}.toml")
            metrics = os.path.join(out, f"{kind}-r{r}.jsonl")
            trace = os.path.join(out, f"{kind}-r{r}.trace.json")
            report = os.path.join(out, f"{kind}-r{r}.report.json")
            for path in (metrics, trace):
                if os.path.exists(path):
                    os.remove(path)
            run(["mpirun", "-np", str(ranks), piper, "--config", cfg, "--steps", str(a.steps), "--set",
                 f"job.threads={threads}", "--metrics", metrics, "--trace", trace, "--report-json", report],
                os.path.join(out, f"{kind}-r{r}.log"))
            rows = [json.loads(l) for l in open(metrics).read().splitlines() if l.strip()]
            timed = [x for x in rows if x["step"] >= 2]
            per_step, names = collectives(trace) if os.path.exists(trace) else ({}, [])
            streams[kind] = names
            comm = statistics.median(v[0] for v in per_step.values()) if per_step else 0.0
            exposed = statistics.median(v[1] for v in per_step.values()) if per_step else 0.0
            reported = statistics.mean(x["time"]["communication_ms"] for x in json.load(open(report))["ranks"])
            res = {"ms": statistics.median(x["ms"] for x in timed), "comm": comm, "exposed": exposed,
                   "reported_comm": reported, "loss": rows[-1]["loss"], "last_step": rows[-1]["step"]}
            results[kind].append(res)
            line.append(f"{kind} {res['ms']:.1f} ms, coll {comm:.1f} ({exposed:.1f} exposed; report {reported:.1f})")
        print(f"  round {r}: " + " | ".join(line) + f"; load {load_average()}", flush=True)
    print()
    print(f"qwen3-small, 16 sequences x 128 tokens a step; median over {a.rounds} rounds of each run's median over "
          f"steps 2-{a.steps} (collectives: per step the mean over ranks)")
    head = ("layout", "step ms (predicted)", "collectives ms/step (predicted)", "exposed ms/step (predicted)",
            "hidden share", "vs 1 rank, 2 threads", f"loss at step {a.steps}")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    ref = statistics.median(x["ms"] for x in results["1rank-2t"])
    for kind, (label, _, _, _) in LAYOUTS.items():
        rs = results[kind]
        ms = statistics.median(x["ms"] for x in rs)
        comm = statistics.median(x["comm"] for x in rs)
        exposed = statistics.median(x["exposed"] for x in rs)
        ps, pc, pe = predicted[kind]
        where = f"{', '.join(streams[kind])}: " if streams.get(kind) else ""
        coll = f"{where}{comm:.1f} ({pc:.1f})" if comm > 0 or pc > 0 else "—"
        expo = f"{exposed:.1f} ({pe:.1f})" if comm > 0 or pc > 0 else "—"
        hidden = f"{1 - exposed / comm:.2f}" if comm > 0 else "—"
        print(f"| {label} | {ms:.1f} ({ps:.1f}) | {coll} | {expo} | {hidden} | {ms / ref:.2f} | {rs[-1]['loss']:.8g} |")
    print()
    for kind in ("tp2", "dp2"):
        for one in ("1rank-1t", "1rank-2t"):
            diffs = [abs(x["loss"] - y["loss"]) / abs(y["loss"]) for x, y in zip(results[kind], results[one])]
            print(f"last-step loss, {LAYOUTS[kind][0]} vs {LAYOUTS[one][0]}: relative difference {max(diffs):.2e} "
                  f"(largest over rounds)")
    print("predicted: the cost model of --dry-run (its [cost] preset; cpu unless the job sets one: a rank is a device "
          "of its own, whatever the threads), from the timeline.json of --dump-plan; 'report': the communication_ms "
          "of --report-json (mean over ranks and steps 2-N), a check on the trace's figure")


if __name__ == "__main__":
    main()
