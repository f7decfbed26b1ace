#!/usr/bin/env python3
"""Model families side by side in one run: the quickstart GPT-2 (configs/quickstart.toml) and a Qwen3 of the
same size and FLOPs per token (configs/qwen3-small.toml: GQA, q/k norms, RoPE, SwiGLU), each trained by
piper on one process, interleaved with the sgemm peak in rounds; prints tokens/s, model FLOP/s and their
fraction of the peak measured in the same run (target >= 0.5 at all cores).

    bench/families.py BUILD_DIR [--rounds R] [--steps N] [--skip K] [--threads "A B"] [--baseline PIPER]

--baseline PIPER adds a row for another piper build on the GPT-2 job (to compare builds in one run).
"""
import argparse
import json
import os
import re
import statistics

from bench_common import piper_path, run_logged

JOBS = (("gpt", "configs/quickstart.toml"), ("qwen3", "configs/qwen3-small.toml"))


def run(cmd, log):
    return run_logged(cmd, log, "families.py")


def piper_run(piper, config, threads, steps, skip, out, tag):
    metrics = os.path.join(out, f"{tag}.jsonl")
    text = run([piper, "--config", config, "--steps", str(steps), "--metrics", metrics,
                "--set", 'checkpoint.dir=""', "--set", f"job.threads={threads}"], os.path.join(out, f"{tag}.log"))
    rows = [json.loads(l) for l in open(metrics) if l.strip()]
    rows = [r for r in rows if r["step"] > skip]
    m = re.search(r"model: (\d+) parameters.*\((\d+) FLOP per token\)", text)
    return (statistics.median(r["tokens_per_s"] for r in rows), statistics.median(r["flops_per_s"] for r in rows),
            int(m.group(1)) if m else 0, int(m.group(2)) if m else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--threads", default="")
    ap.add_argument("--baseline", default="", help="another piper binary, run on the GPT-2 job too")
    a = ap.parse_args()
    piper = piper_path(a.build)
    sgemm = os.path.abspath(os.path.join(a.build, "bench", "sgemm_peak"))
    out = os.path.join(os.path.abspath(a.build), "bench-results", "families")
    os.makedirs(out, exist_ok=True)
    cores = os.cpu_count() or 1
    threads = [int(t) for t in a.threads.split()] if a.threads else sorted({cores, 1}, reverse=True)
    env = {v: os.environ.get(v, "<unset>") for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    print(f"environment (left as it is): {env}; load average {open('/proc/loadavg').read().split()[:3]}")
    jobs = list(JOBS)
    if a.baseline:
        jobs.append(("gpt (baseline build)", "configs/quickstart.toml"))
    results = {}  # (threads, job) -> list of (tok/s, flop/s, params, flop/token); threads -> peaks
    peaks = {}
    for t in threads:
        for r in range(1, a.rounds + 1):
            text = run([sgemm, "--threads", str(t), "--size", "2048", "--reps", "10", "--warmup", "2"],
                       os.path.join(out, f"sgemm-t{t}-r{r}.log"))
            peaks.setdefault(t, []).append(float(re.search(r"gflops=([0-9.]+)", text).group(1)) * 1e9)
            for name, config in jobs:
                binary = a.baseline if "baseline" in name else piper
                tag = f"{name.split()[0]}{'-base' if 'baseline' in name else ''}-t{t}-r{r}"
                res = piper_run(binary, config, t, a.steps, a.skip, out, tag)
                results.setdefault((t, name), []).append(res)
                print(f"  threads {t} round {r}: {name} {res[0]:.0f} tok/s, {res[1] / 1e9:.1f} GFLOP/s", flush=True)
    print()
    print("model families, median over rounds of each run's median step (steps "
          f"{a.skip + 1}-{a.steps}); peak = best sgemm 2048^3 of the same run")
    head = ("threads", "model", "parameters", "FLOP/token", "tok/s", "GFLOP/s", "sgemm GFLOP/s", "frac of peak")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for t in threads:
        peak = max(peaks[t])
        for name, _ in jobs:
            rs = results[(t, name)]
            tps = statistics.median(x[0] for x in rs)
            fps = statistics.median(x[1] for x in rs)
            print(f"| {t} | {name} | {rs[0][2]} | {rs[0][3]} | {tps:.0f} | {fps / 1e9:.1f} | {peak / 1e9:.1f} | "
                  f"{fps / peak:.2f} |")
    for t in threads:
        spread = ", ".join(f"{name} {min(x[0] for x in results[(t, name)]):.0f}-"
                           f"{max(x[0] for x in results[(t, name)]):.0f}" for name, _ in jobs)
        print(f"range over rounds, threads {t}: {spread} tok/s")
    print("frac = model FLOP/s (3 x forward matmul + causal attention FLOPs) / sgemm peak at the same thread count")


if __name__ == "__main__":
    main()
