#!/usr/bin/env python3
"""Compile time and plan size at scale: a 64-layer GPT with 64 microbatches compiled (graph, passes,
lowering, verification by whole-job simulation) for 64, 512 and 4096 ranks with --dry-run --world N, on
one process. Prints the compile time piper reports, the bytes rank 0 sends (one plan body per device set)
and the largest plan.

    bench/compile_scale.py BUILD_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

JOB = """
[job]
name = "gpt-64L"
steps = 100
[model]
kind = "gpt"
vocab = 50304
seq_len = 2048
d_model = 8192
n_layers = 64
n_heads = 64
d_ff = 32768
[data]
path = "{data}"
batch = {batch}
[mesh]
pp = {pp}
dp = {dp}
microbatches = 64
zero = 1
"""


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    piper = os.path.abspath(os.path.join(build, "piper"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = os.path.join(root, "data", "fortunes.txt")
    print("== compile time and plan size: 64-layer GPT, 64 microbatches, ZeRO-1 (--dry-run --world N) ==")
    print(f"{'ranks':>6} {'layout':>12} {'device sets':>12} {'instr/plan':>11} {'max plan B':>11} "
          f"{'sent by rank 0':>15} {'compile s':>10}")
    for world, pp, dp in ((64, 16, 4), (512, 16, 32), (4096, 16, 256)):
        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(JOB.format(data=data, pp=pp, dp=dp, batch=64 * dp))
        cmd = [piper, "--config", f.name, "--dry-run", "--world", str(world)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        os.unlink(f.name)
        rows = [l.split() for l in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s+\d+\s", l)]
        instrs = max(int(r[2]) for r in rows)
        plan_bytes = max(int(r[3]) for r in rows)
        sent = int(re.search(r"plan bytes sent by rank 0: (\d+)", out).group(1))
        secs = float(re.search(r"compile time ([\d.]+) s", out).group(1))
        print(f"{world:>6} {f'PP{pp}xDP{dp}':>12} {len(rows):>12} {instrs:>11} {plan_bytes:>11} {sent:>15} {secs:>10.3f}")
    print("command: " + " ".join([piper, "--config", "JOB.toml", "--dry-run", "--world", "N"]))


if __name__ == "__main__":
    main()
