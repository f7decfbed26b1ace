#!/usr/bin/env python3
"""Checkpoint bandwidth: a GPT whose checkpoint (parameters and both AdamW moments) holds 1.2 GB is saved
by 1, 2 and 4 data-parallel ranks (every rank writes its own slices into the one file) and resumed by as
many, next to `dd` writing (conv=fsync) and reading the same number of bytes on the same disk, in one run;
rank 0's memory growth during a save, for that model and for the quickstart's 30 times smaller one; and
what checkpoints cost the quickstart's training (60 steps at 2 threads, a save every 10 steps: none,
synchronous, asynchronous, interleaved), from the run's own time for its training loop.

Each checkpoint is resumed twice on as many ranks: as it was saved (ZeRO-0: every replica holds the whole
state; each reads a part and broadcasts it to the others) and under ZeRO-3 (every rank reads only its shard). The page cache is dropped before every read (piper's resume and dd's) when /proc/sys/vm/drop_caches is
writable; the script says whether it was. Piper's read is two phases: rank 0 verifies the file's structure
and checksum (attributes and block hashes, not the tensors' bytes), then every rank reads its own ranges
through whole blocks and checks each against its hash.

    bench/checkpoint_io.py BUILD_DIR [--rounds N] [--ranks 1,2,4] [--dir DIR] [--steps 60] [--parts io,training]
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from bench_common import ROOT, mpi_env, piper_path

# d_model 1024, 8 layers, d_ff 4096: 101.1 M parameters, 1.213 GB of checkpoint.
BIG = ["--set", "model.d_model=1024", "--set", "model.n_layers=8", "--set", "model.n_heads=16", "--set",
       "model.d_ff=4096", "--set", "model.seq_len=32", "--set", "data.batch=4"]
SAVED = re.compile(r"saved (\S+): ([\d.]+) GB by (\d+) ranks? in ([\d.]+) s \(([\d.]+) GB/s\)"
                   r"(?:, rank 0 memory \+([\d.]+) MiB)?")
LOOP = re.compile(r"trained steps \d+\.\.\d+ in ([\d.]+) s: ([\d.]+) ms a step")
RESUMED = re.compile(r"resumed from \S+ at step \d+ \(([\d.]+) GB: its structure and checksum verified by rank 0 "
                     r"in ([\d.]+) s, every rank's ranges read and checked in ([\d.]+) s\)")


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def piper(build, ranks, *args):
    threads = 2 if ranks == 1 else 1
    cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none", piper_path(build), "--config", os.path.join(ROOT, "configs/quickstart.toml"),
           "--set", f"job.threads={threads}", "--set", f"mesh.dp={ranks}", *args]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(), cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"checkpoint_io: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}")
    return p.stdout


def save(build, ranks, folder, model):
    shutil.rmtree(folder, ignore_errors=True)
    out = piper(build, ranks, *model, "--steps", "1", "--set", f'checkpoint.dir="{folder}"',
                "--set", "checkpoint.every=1")
    m = SAVED.search(out)
    if not m:
        sys.exit(f"checkpoint_io: no 'saved' line in:\n{out[-3000:]}")
    return {"gb": float(m.group(2)), "s": float(m.group(4)), "mib": float(m.group(6) or "nan"),
            "path": os.path.join(folder, m.group(1))}


def resume(build, ranks, path, model, zero=0):
    drop_caches()
    out = piper(build, ranks, *model, "--steps", "2", "--resume", path, "--set", 'checkpoint.dir=""',
                "--set", f"mesh.zero={zero}")
    m = RESUMED.search(out)
    if not m:
        sys.exit(f"checkpoint_io: no 'resumed' line in:\n{out[-3000:]}")
    return {"verify_s": float(m.group(2)), "read_s": float(m.group(3))}


def dd(folder, nbytes):
    path = os.path.join(folder, "dd.bin")
    count = (nbytes + (1 << 20) - 1) >> 20
    w = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "conv=fsync"],
                       stderr=subprocess.PIPE, text=True, check=True).stderr
    drop_caches()
    r = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M"], stderr=subprocess.PIPE, text=True,
                       check=True).stderr
    os.remove(path)
    rate = lambda text: float(re.search(r"copied, ([\d.]+) s", text).group(1))
    return count * (1 << 20) / 1e9, rate(w), rate(r)


def training_cost(build, folder, steps, rounds):
    """Per-step time of the quickstart with no checkpoints, synchronous and asynchronous ones every 10 steps."""
    modes = {"none": ['checkpoint.dir=""'],
             "sync": [f'checkpoint.dir="{folder}"', "checkpoint.every=10", "checkpoint.async=false"],
             "async": [f'checkpoint.dir="{folder}"', "checkpoint.every=10", "checkpoint.async=true"]}
    ms = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, sets in modes.items():
            shutil.rmtree(folder, ignore_errors=True)
            args = [x for kv in sets for x in ("--set", kv)]
            out = piper(build, 1, "--steps", str(steps), *args)
            m = LOOP.search(out)
            if not m:
                sys.exit(f"checkpoint_io: no 'trained steps' line in:\n{out[-3000:]}")
            ms[mode].append(float(m.group(2)))
    shutil.rmtree(folder, ignore_errors=True)
    med = {m: statistics.median(v) for m, v in ms.items()}
    print(f"\nquickstart, {steps} steps at 2 threads, a checkpoint every 10 steps, {rounds} interleaved round(s), "
          "ms a step of the training loop (median; every round):")
    print("| checkpoints | ms a step | vs none | rounds |")
    print("|---|---|---|---|")
    for mode in modes:
        rows = ", ".join(f"{x:.1f}" for x in ms[mode])
        print(f"| {mode} | {med[mode]:.1f} | {100 * (med[mode] / med['none'] - 1):+.1f}% | {rows} |")


def bandwidth(build, ranks, rounds, work):
    """Saves and resumes of the 1.2 GB checkpoint on each rank count, next to dd, interleaved."""
    rows = {r: [] for r in ranks}
    dd_rows = []
    for rnd in range(rounds):
        for r in ranks:
            s = save(build, r, os.path.join(work, f"np{r}"), BIG)
            s.update(resume(build, r, s["path"], BIG))
            z3 = resume(build, r, s["path"], BIG, zero=3) if r > 1 else dict(s)
            s["z3_verify_s"], s["z3_read_s"] = z3["verify_s"], z3["read_s"]
            rows[r].append(s)
            shutil.rmtree(os.path.join(work, f"np{r}"), ignore_errors=True)
            gb, dd_w, dd_r = dd(work, int(s["gb"] * 1e9))
            dd_rows.append((gb, dd_w, dd_r))
            print(f"round {rnd + 1} ranks {r}: save {s['gb']:.3f} GB in {s['s']:.3f} s, rank 0 +{s['mib']:.1f} MiB; "
                  f"resume: verify {s['verify_s']:.3f} s, ranges {s['read_s']:.3f} s (ZeRO-3: {s['z3_read_s']:.3f} s); "
                  f"dd {gb:.3f} GB: write {dd_w:.3f} s, read {dd_r:.3f} s", flush=True)

    med = statistics.median
    dd_w = med(gb / w for gb, w, _ in dd_rows)
    dd_r = med(gb / r for gb, _, r in dd_rows)
    print()
    print(f"median of {rounds} round(s); dd (same bytes, same disk, between piper's runs): "
          f"write {dd_w:.3f} GB/s, read {dd_r:.3f} GB/s")
    print("| ranks | GB | save GB/s | save / dd write | rank 0 memory during save | resume: rank 0 check s | "
          "ranges read and checked GB/s | whole resume / dd read | ZeRO-3 resume / dd read |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in ranks:
        gb = rows[r][0]["gb"]
        save_bw = med(x["gb"] / x["s"] for x in rows[r])
        check_s = med(x["verify_s"] for x in rows[r])
        read_bw = med(x["gb"] / x["read_s"] for x in rows[r])
        whole = med(x["gb"] / (x["verify_s"] + x["read_s"]) for x in rows[r])
        whole3 = med(x["gb"] / (x["z3_verify_s"] + x["z3_read_s"]) for x in rows[r])
        mib = med(x["mib"] for x in rows[r])
        print(f"| {r} | {gb:.3f} | {save_bw:.3f} | {save_bw / dd_w:.2f} | +{mib:.1f} MiB | {check_s:.3f} | "
              f"{read_bw:.3f} | {whole / dd_r:.2f} | {whole3 / dd_r:.2f} |")

    small = save(build, 1, os.path.join(work, "small"), [])
    big = med(x["mib"] for x in rows[ranks[0]])
    print(f"\nrank 0 memory growth during a save on {ranks[0]} rank(s): {small['gb']:.3f} GB checkpoint "
          f"+{small['mib']:.1f} MiB, {rows[ranks[0]][0]['gb']:.3f} GB checkpoint +{big:.1f} MiB")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--steps", type=int, default=60, help="quickstart steps of the training-cost part (0: skip it)")
    ap.add_argument("--parts", default="io,training", help="io: bandwidth against dd; training: cost to training")
    ap.add_argument("--dir", default=None, help="folder on the disk to measure (default: a temporary folder)")
    a = ap.parse_args()
    ranks = [int(r) for r in a.ranks.split(",")]
    work = a.dir or tempfile.mkdtemp(prefix="piper-ckpt-io-")
    os.makedirs(work, exist_ok=True)
    dropped = drop_caches()
    print(f"folder {work}; page cache dropped before each read: {'yes' if dropped else 'no (not permitted)'}")

    if "io" in a.parts:
        bandwidth(a.build, ranks, a.rounds, work)
    if "training" in a.parts and a.steps > 0:
        training_cost(a.build, os.path.join(work, "quickstart"), a.steps, a.rounds)
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
