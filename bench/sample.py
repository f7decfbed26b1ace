#!/usr/bin/env python3
"""Sampling speed: `piper sample` against transformers' generate() on the same checkpoint, prompt and threads.

usage: TRANSFORMERS_PYTHON=/path/to/python bench/sample.py BUILD_DIR [--tokens N] [--threads T] [--rounds R]
Trains configs/qwen3-small.toml for 50 steps (a checkpoint under bench/out/sample/), exports it as a Hugging Face
folder, then continues one 33-byte prompt greedily for N new tokens (default 96) R times (default 3) each with:
piper (a forward over the whole context per token), transformers with its key/value cache (generate's default) and
transformers without it (use_cache=False, the same work as piper). Prints tokens/s (median of the rounds, interleaved)
and whether each greedy continuation equals piper's. Without an interpreter that has transformers and torch, prints
piper's rate alone."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

from bench_common import ROOT, piper_path

PROMPT = "Q: What is the meaning of life? A:"  # 33 bytes

HF = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(int(sys.argv[4]))
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], attn_implementation="eager").float().eval()
ids = torch.tensor([json.loads(sys.argv[2])])
n, out = int(sys.argv[3]), {}
with torch.no_grad():
    m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4, pad_token_id=0)  # warm up
    for cache in (True, False):
        t0 = time.perf_counter()
        g = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                       use_cache=cache, pad_token_id=0)
        out["cache" if cache else "nocache"] = {"s": time.perf_counter() - t0, "ids": g[0, ids.shape[1]:].tolist()}
print(json.dumps(out))
"""


def has_transformers(python):
    return python and os.path.exists(python) and subprocess.run(
        [python, "-c", "import transformers, torch"], capture_output=True).returncode == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    piper = piper_path(a.build)
    out = os.path.join(ROOT, "bench", "out", "sample")
    os.makedirs(out, exist_ok=True)
    ckpt = os.path.join(out, "ckpt", "step_00000050.h5")
    if not os.path.exists(ckpt):
        subprocess.run([piper, "--config", "configs/qwen3-small.toml", "--steps", "50", "--set",
                        f'checkpoint.dir="{os.path.join(out, "ckpt")}"', "--set", "checkpoint.every=50"],
                       cwd=ROOT, check=True, capture_output=True)
    folder = os.path.join(out, "hf")
    if not os.path.exists(folder):
        subprocess.run([os.path.join(a.build, "piper-ckpt"), "export", ckpt, "--to", folder], check=True,
                       capture_output=True)
    prompt = [b for b in PROMPT.encode()]
    python = os.environ.get("TRANSFORMERS_PYTHON") or os.environ.get("TORCH_PYTHON")
    hf_ok = has_transformers(python)
    rates = {"piper": [], "transformers, key/value cache": [], "transformers, no cache": []}
    ids = {}
    for _ in range(a.rounds):
        p = subprocess.run([piper, "sample", ckpt, "--prompt-ids", ",".join(map(str, prompt)), "--greedy", "--ids",
                            "--no-stop", "--max-new-tokens", str(a.tokens), "--threads", str(a.threads)],
                           capture_output=True, text=True, check=True)
        seconds = float(re.search(r"tokens in ([0-9.]+) s", p.stderr).group(1))
        rates["piper"].append(a.tokens / seconds)
        ids["piper"] = [int(w) for w in p.stdout.split("|")[1].split()]
        if hf_ok:
            r = subprocess.run([python, "-c", HF, folder, json.dumps(prompt), str(a.tokens), str(a.threads)],
                               capture_output=True, text=True, check=True,
                               env=dict(os.environ, OMP_NUM_THREADS=str(a.threads)))
            got = json.loads(r.stdout.strip().splitlines()[-1])
            rates["transformers, key/value cache"].append(a.tokens / got["cache"]["s"])
            rates["transformers, no cache"].append(a.tokens / got["nocache"]["s"])
            ids["transformers, key/value cache"] = got["cache"]["ids"]
            ids["transformers, no cache"] = got["nocache"]["ids"]
    print(f"sampling configs/qwen3-small.toml (50 steps), a {len(prompt)}-token prompt, {a.tokens} new tokens greedy, "
          f"{a.threads} threads, median of {a.rounds} interleaved rounds")
    print(f"{'':32} {'tokens/s':>9} {'vs piper':>9}  greedy ids = piper's")
    base = statistics.median(rates["piper"])
    for name, r in rates.items():
        if not r:
            print(f"{name:32} {'-':>9}  (no interpreter with transformers and torch: TRANSFORMERS_PYTHON)")
            continue
        m = statistics.median(r)
        print(f"{name:32} {m:9.1f} {m / base:9.2f}  {ids[name] == ids['piper']}")


if __name__ == "__main__":
    sys.exit(main())
