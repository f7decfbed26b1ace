#!/usr/bin/env python3
"""Peak memory under ZeRO at a size where it matters: a GPT of 25.4 M parameters (8 layers, d_model 512,
d_ff 2048) on DP4 for 2 steps, ZeRO 0, 2 and 3 with large and small buckets and 1 or 3 microbatches: the
peak of parameters and gradients, the optimizer state and the peak total, max over ranks, in MiB, as the
runtime measured them, with the compiler's estimate in brackets. Under ZeRO 2 and 3 at most
grad_buckets_in_flight (default 2) full-gradient buffers are alive at once, so the gradient peak is the
owned shard plus two buckets; each such row is also run with the bound lifted (grad_buckets_in_flight =
1048576: buffers live until their reduce-scatter happens to complete, up to every bucket at once).

    bench/zero_peak.py BUILD_DIR
"""
import os
import subprocess
import sys

from bench_common import ROOT, mpi_env, piper_path

MODEL = ["--set", "model.d_model=512", "--set", "model.n_layers=8", "--set", "model.d_ff=2048", "--set",
         "model.n_heads=8", "--set", "data.batch=24"]
ROWS = [(0, 25, 1), (2, 25, 1), (2, 1, 1), (3, 25, 1), (3, 1, 1), (3, 1, 3)]
UNBOUNDED = 1 << 20
MIB = 1024.0 * 1024.0


def memory(out):
    rows = []
    for line in out.splitlines():
        if line.startswith("memory rank="):
            rows.append({k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])})
    return rows


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    print("| zero | bucket_mb | microbatches | grad_buckets_in_flight | params peak | grads peak | optimizer | peak total |")
    print("|---|---|---|---|---|---|---|---|")
    for zero, bucket_mb, mbs, in_flight in [(z, b, m, f) for z, b, m in ROWS for f in ([2, UNBOUNDED] if z >= 2 else [2])]:
        cmd = ["mpirun", "-np", "4", piper_path(build), "--config", os.path.join(ROOT, "configs/quickstart.toml"),
               *MODEL, "--steps", "2", "--set", "job.threads=1", "--set", 'checkpoint.dir=""', "--set", "mesh.dp=4",
               "--set", f"mesh.zero={zero}", "--set", f"mesh.bucket_mb={bucket_mb}", "--set",
               f"mesh.microbatches={mbs}", "--set", f"mesh.grad_buckets_in_flight={in_flight}"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=ROOT)
        if p.returncode != 0:
            sys.exit(f"zero_peak: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}")
        rows = memory(p.stdout)
        cell = lambda k: f"{max(r['peak_' + k] for r in rows) / MIB:.2f} ({max(r['est_peak_' + k] for r in rows) / MIB:.2f})"
        optim = max(r["peak_optim"] for r in rows) / MIB
        total = (f"{max(r['peak_total'] for r in rows) / MIB:.2f} "
                 f"({max(r['est_peak_total'] for r in rows) / MIB:.2f})")
        limit = "unbounded" if in_flight == UNBOUNDED else str(in_flight)
        print(f"| {zero} | {bucket_mb} | {mbs} | {limit} | {cell('param')} | {cell('grad')} | {optim:.2f} | {total} |",
              flush=True)


if __name__ == "__main__":
    main()
