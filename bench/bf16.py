#!/usr/bin/env python3
"""bf16 mixed precision side by side in one run: piper fp32, piper bf16 (job.precision = "bf16") and the current
PyTorch on CPU with autocast bf16 (eager and torch.compile), on the quickstart GPT-2 (configs/quickstart.toml) and
the small Qwen3 (configs/qwen3-small.toml), at the same thread count, interleaved in rounds; the activation peak of
both models at 4, 12 and 24 layers in fp32 and bf16, measured by the runtime next to the compiler's estimate; then
(--curves) each model trained for 300 steps on 3 seeds in fp32 and bf16 by piper and in autocast bf16 by PyTorch:
final losses, their spread, and a plot of the curves.

    bench/bf16.py BUILD_DIR [--rounds R] [--steps N] [--skip K] [--threads T] [--no-throughput] [--no-memory]
                  [--curves] [--curve-steps S] [--seeds "1 2 3"] [--plot PNG] [--reuse]

TORCH_PYTHON: an interpreter with a current torch (default: the venv bench/quickstart.sh makes,
~/.cache/piper-bench/torch-venv, made here the same way when missing). OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
are left as they are.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

from bench_common import piper_path, run_logged

JOBS = (("gpt", "configs/quickstart.toml"), ("qwen3", "configs/qwen3-small.toml"))


def torch_python():
    """A python with a current torch: TORCH_PYTHON, or the benchmarks' venv (made on first use)."""
    py = os.environ.get("TORCH_PYTHON")
    if py:
        return py
    venv = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "piper-bench", "torch-venv")
    py = os.path.join(venv, "bin", "python")
    ready = os.path.exists(py) and subprocess.run([py, "-c", "import torch"], capture_output=True).returncode == 0
    if not ready:
        print(f"+ python3 -m venv {venv} && pip install torch numpy (the current PyTorch from PyPI)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "torch", "numpy"], check=True)
    return py


def run(cmd, log):
    return run_logged(cmd, log, "bf16.py")


def piper_run(piper, config, precision, threads, steps, out, tag, seed=None, reuse=False):
    """A run of `steps` steps; with a seed, a whole run of that many (job.steps: the schedule ends there)."""
    metrics, log = os.path.join(out, f"{tag}.jsonl"), os.path.join(out, f"{tag}.log")
    cmd = [piper, "--config", config, "--steps", str(steps), "--metrics", metrics, "--set", 'checkpoint.dir=""',
           "--set", f"job.threads={threads}", "--set", f'job.precision="{precision}"']
    if seed is not None:
        cmd += ["--set", f"job.seed={seed}", "--set", f"job.steps={steps}"]
    done = reuse and os.path.exists(metrics) and sum(1 for line in open(metrics) if line.strip()) == steps
    text = open(log).read() if done else run(cmd, log)
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    path = re.search(r"matmuls through (.*?);", text)
    return rows, path.group(1) if path else "fp32 sgemm"


def torch_run(py, model, autocast, compile_, threads, steps, skip, out, tag, seed=1234, decay=None, reuse=False):
    losses, log = os.path.join(out, f"{tag}.losses"), os.path.join(out, f"{tag}.log")
    cmd = [py, "bench/torch_gpt.py", "--model", model, "--threads", str(threads), "--steps", str(steps),
           "--warmup", str(skip), "--sdpa", "--adamw", "auto", "--autocast", autocast, "--seed", str(seed),
           "--losses", losses]
    if compile_:
        cmd.append("--compile")
    if decay:
        cmd += ["--decay-steps", str(decay)]
    done = reuse and os.path.exists(losses) and sum(1 for line in open(losses) if line.strip()) == steps
    text = open(log).read() if done else run(cmd, log)
    m = re.search(r"RESULT .*tokens_per_s=([0-9.]+)", text)
    return float(m.group(1)), [float(x) for x in open(losses)]


def cpu_line():
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    bf16 = [f for f in flags if f in ("avx512_bf16", "amx_bf16", "amx_tile")]
    return f"{model}, {os.cpu_count()} cores, bf16 instructions: {' '.join(bf16) or 'none'}"


def instruction_ceiling(build, threads):
    """bench/fma_peak's line: the processor's bf16 dot-product and AMX tile rates against its fp32 FMA rate."""
    exe = os.path.join(os.path.abspath(build), "bench", "fma_peak")
    if not os.path.exists(exe):
        return "fma_peak not built"
    text = subprocess.run([exe, "--threads", str(threads)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"fp32_gflops=(\S+) bf16_gflops=(\S+) ratio=(\S+) amx_gflops=(\S+) amx_ratio=(\S+)(.*)", text)
    if not m:
        return text
    if m.group(1) == "none":  # not measured here: fma_peak says why
        return f"not measured {m.group(6).strip()}"
    return (f"fp32 FMA {m.group(1)} GFLOP/s, bf16 dot {m.group(2)} GFLOP/s (/ fp32 {m.group(3)}), "
            f"AMX bf16 tiles {m.group(4)} GFLOP/s (/ fp32 {m.group(5)})")


def throughput(a, piper, py, out):
    rows = {}
    paths = set()
    for r in range(1, a.rounds + 1):
        for model, config in JOBS:
            for precision in ("fp32", "bf16"):
                res, path = piper_run(piper, config, precision, a.threads, a.steps, out, f"{model}-{precision}-r{r}")
                paths.add(path)
                tps = statistics.median(x["tokens_per_s"] for x in res if x["step"] > a.skip)
                rows.setdefault((model, f"piper {precision}"), []).append(tps)
            for mode, compile_ in (("eager", False), ("compile", True)):
                tps, _ = torch_run(py, model, "bf16", compile_, a.threads, a.steps, a.skip, out,
                                   f"{model}-torch-{mode}-r{r}")
                rows.setdefault((model, f"torch {mode} autocast bf16"), []).append(tps)
            print(f"  round {r}: {model} " + ", ".join(f"{k[1]} {v[-1]:.0f}" for k, v in rows.items() if k[0] == model),
                  flush=True)
    print()
    print(f"bf16 throughput, {a.threads} thread(s), median over {a.rounds} rounds of each run's median step "
          f"(steps {a.skip + 1}-{a.steps}); {cpu_line()}; piper's bf16 matmuls: {', '.join(sorted(paths - {'fp32 sgemm'}))}")
    print(f"instruction ceiling (bench/fma_peak, {a.threads} thread(s)): {instruction_ceiling(a.build, a.threads)}")
    print("| model | run | tok/s | / piper fp32 | / piper bf16 |")
    print("|---|---|---|---|---|")
    for model, _ in JOBS:
        base = statistics.median(rows[(model, "piper fp32")])
        b16 = statistics.median(rows[(model, "piper bf16")])
        for (m, name), v in rows.items():
            if m == model:
                t = statistics.median(v)
                print(f"| {model} | {name} | {t:.0f} | {t / base:.2f} | {t / b16:.2f} |")


def memory(a, piper, out):
    print()
    print("activation peak per rank, MiB: measured by the runtime (the compiler's estimate), 2 steps, one process")
    print("| model | layers | fp32 | bf16 | bf16 / fp32 |")
    print("|---|---|---|---|---|")
    for model, config in JOBS:
        for layers in (4, 12, 24):
            peak = {}
            for precision in ("fp32", "bf16"):
                report = os.path.join(out, f"memory-{model}-{layers}-{precision}.json")
                run([piper, "--config", config, "--steps", "2", "--set", 'checkpoint.dir=""', "--set",
                     f"model.n_layers={layers}", "--set", f'job.precision="{precision}"', "--report-json", report],
                    os.path.join(out, f"memory-{model}-{layers}-{precision}.log"))
                mem = json.load(open(report))["ranks"][0]["memory"]
                peak[precision] = (mem["peak_bytes"]["activations"], mem["estimated_peak_bytes"]["activations"])
            f, b = peak["fp32"], peak["bf16"]
            mib = lambda x: f"{x[0] / 2**20:.1f} ({x[1] / 2**20:.1f})"
            print(f"| {model} | {layers} | {mib(f)} | {mib(b)} | {b[0] / f[0]:.3f} |", flush=True)


def curves(a, piper, py, out):
    seeds = [int(s) for s in a.seeds.split()]
    finals, series = {}, {}
    tail = 20  # PyTorch samples other batches: its curve is compared by the mean of the last steps
    for model, config in JOBS:
        for seed in seeds:
            for precision in ("fp32", "bf16"):
                res, _ = piper_run(piper, config, precision, a.threads, a.curve_steps, out,
                                   f"curve-{model}-{precision}-s{seed}", seed=seed, reuse=a.reuse)
                losses = [x["loss"] for x in res]
                series[(model, f"piper {precision}", seed)] = losses
            # the same schedule as piper's: cosine decay until job.steps = curve_steps
            _, losses = torch_run(py, model, "bf16", False, a.threads, a.curve_steps, 1, out,
                                  f"curve-{model}-torch-s{seed}", seed=seed, decay=a.curve_steps, reuse=a.reuse)
            series[(model, "torch autocast bf16", seed)] = losses
    print()
    print(f"bf16 against fp32 over {a.curve_steps} steps, seeds {seeds} (the same data for piper's fp32 and bf16 runs "
          f"of a seed; PyTorch samples its own windows of the same file, so it is compared by the mean of its last "
          f"{tail} steps); {cpu_line()}")
    print("| model | run | final loss per seed | mean ± spread | mean of last 20 | vs piper fp32 |")
    print("|---|---|---|---|---|---|")
    for model, _ in JOBS:
        ref = {s: series[(model, "piper fp32", s)] for s in seeds}
        ref_tail = statistics.mean(statistics.mean(ref[s][-tail:]) for s in seeds)
        for name in ("piper fp32", "piper bf16", "torch autocast bf16"):
            fin = [series[(model, name, s)][-1] for s in seeds]
            tl = statistics.mean(statistics.mean(series[(model, name, s)][-tail:]) for s in seeds)
            if name == "piper bf16":
                vs = " ".join(f"{(series[(model, name, s)][-1] - ref[s][-1]) / ref[s][-1]:+.2%}" for s in seeds)
            else:
                vs = f"{(tl - ref_tail) / ref_tail:+.2%} (last {tail})"
            spread = statistics.pstdev(fin)
            print(f"| {model} | {name} | {' '.join(f'{x:.4f}' for x in fin)} | {statistics.mean(fin):.4f} ± {spread:.4f} "
                  f"| {tl:.4f} | {vs} |")
    curves_json = os.path.join(out, "curves.json")
    with open(curves_json, "w") as f:
        json.dump({f"{m}|{n}|{s}": v for (m, n, s), v in series.items()}, f)
    if a.plot:
        plot(py, curves_json, seeds, os.path.abspath(a.plot))


PLOT = r"""
import json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
series, models, seeds, path = json.load(open(sys.argv[1])), sys.argv[2].split(), sys.argv[3].split(), sys.argv[4]
colors = {"piper fp32": "tab:blue", "piper bf16": "tab:orange", "torch autocast bf16": "tab:green"}
fig, axes = plt.subplots(1, len(models), figsize=(12, 4.2))
for ax, model in zip(axes, models):
    for name, color in colors.items():
        for i, s in enumerate(seeds):
            y = series[f"{model}|{name}|{s}"]
            smooth = [statistics.mean(y[max(0, j - 9):j + 1]) for j in range(len(y))]  # running mean of 10 steps
            ax.plot(range(1, len(y) + 1), smooth, color=color, alpha=0.8, lw=1, label=name if i == 0 else None)
    ax.set_title(f"{model}: loss, running mean of 10 steps, seeds {', '.join(seeds)}", fontsize=10)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_ylim(top=min(4.0, ax.get_ylim()[1]))
    ax.legend()
fig.tight_layout()
fig.savefig(path, dpi=90)
"""


def plot(py, curves_json, seeds, path):
    """The curves drawn by matplotlib in the torch interpreter (installed there from PyPI when missing)."""
    if subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        subprocess.run([py, "-m", "pip", "install", "-q", "matplotlib"], check=True)
    subprocess.run([py, "-c", PLOT, curves_json, " ".join(m for m, _ in JOBS), " ".join(map(str, seeds)), path],
                   check=True)
    print(f"plot: {path}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--curves", action="store_true", help="also the 300-step curves on 3 seeds (about 20 minutes)")
    ap.add_argument("--curve-steps", type=int, default=300)
    ap.add_argument("--seeds", default="1 2 3")
    ap.add_argument("--plot", default="", help="PNG of the curves")
    ap.add_argument("--reuse", action="store_true", help="keep the curve runs already complete in the output folder")
    a = ap.parse_args()
    piper = piper_path(a.build)
    out = os.path.join(os.path.abspath(a.build), "bench-results", "bf16")
    os.makedirs(out, exist_ok=True)
    env = {v: os.environ.get(v, "<unset>") for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    print(f"environment (left as it is): {env}; load average {open('/proc/loadavg').read().split()[:3]}")
    py = torch_python()
    if not a.no_throughput:
        throughput(a, piper, py, out)
    if not a.no_memory:
        memory(a, piper, out)
    if a.curves:
        curves(a, piper, py, out)


if __name__ == "__main__":
    main()
