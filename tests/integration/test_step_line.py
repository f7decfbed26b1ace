"""What a run prints per step and writes to --metrics: the step of the run's last, loss, lr, gradient norm, tokens/s,
MFU, the step's time, rank 0's peak memory and the time left, on 1 and 2 ranks.

MFU is the model's FLOP/s over every rank's peak: with job.peak_tflops = 0.001 (1 GFLOP/s a rank) the metrics'
mfu is flops_per_s / (ranks x 1e9), and the step line shows the same percentage; without it the CPU's peak is
measured at start and named. peak_bytes is the peak that --report-json gives for rank 0 at the end."""
import csv
import json
import os
import re
import subprocess
import sys

from common import ROOT, fail, metrics, run, tempdir, tiny_gpt, write

STEP = re.compile(r"^step +(\d+)/(\d+) \| loss (\S+) \| lr (\S+) \| grad +(\S+) \| +(\d+) tok/s \| MFU +([\d.]+)% \| "
                  r"+([\d.]+) ms \| ([\d.]+) (MiB|GiB) \| ETA (\d+):(\d\d):(\d\d)$")


def main():
    d = tempdir()
    for ranks in (1, 2):
        cfg = write(d, f"t{ranks}.toml", tiny_gpt(steps=6).replace("[job]\n", "[job]\npeak_tflops = 0.001\n", 1))
        out, rep = os.path.join(d, f"m{ranks}.jsonl"), os.path.join(d, f"r{ranks}.json")
        p = run(ranks, cfg, "--metrics", out, "--report-json", rep, *(["--set", "mesh.dp=2"] if ranks == 2 else []))
        lines = [STEP.match(l) for l in p.stdout.splitlines() if l.startswith("step ")]
        rows = metrics(out)
        if len(lines) != 6 or not all(lines) or len(rows) != 6:
            fail(f"{ranks} rank(s): step lines do not read as expected:\n{p.stdout}")
        if "MFU against 0.001 TFLOP/s a rank (job.peak_tflops)" not in p.stdout:
            fail(f"the start lines do not name the MFU peak:\n{p.stdout}")
        for m, row in zip(lines, rows):
            step, last = int(m.group(1)), int(m.group(2))
            mfu = row["flops_per_s"] / (ranks * 1e9)
            if (step != row["step"] or last != 6 or abs(row["mfu"] - mfu) > 2e-5 * mfu
                    or abs(float(m.group(7)) - 100 * mfu) > 0.051 + 1e-3 * 100 * mfu
                    or abs(float(m.group(5)) - row["grad_norm"]) > 1e-3 * row["grad_norm"]):
                fail(f"step line {m.group(0)!r} against metrics {row}")
        if lines[-1].group(11, 12, 13) != ("0", "00", "00"):
            fail(f"the last step has time left: {lines[-1].group(0)}")
        doc = json.load(open(rep))
        peaks = [r["memory"]["peak_total_bytes"] for r in doc["ranks"]] if "ranks" in doc else []
        if not peaks or rows[-1]["peak_bytes"] != peaks[0] or not 0 < rows[0]["peak_bytes"] <= rows[-1]["peak_bytes"]:
            fail(f"metrics peak_bytes {[r['peak_bytes'] for r in rows]} against the report's rank 0 peak {peaks[:1]}")
        print(f"ok  {ranks} rank(s): 6 step lines 'step N/6' with grad, MFU (= metrics mfu "
              f"{rows[-1]['mfu']:.3g}), memory {lines[-1].group(9)} {lines[-1].group(10)} and ETA; peak_bytes = report")
    csv_metrics(d)
    plot(d)
    tensorboard(d)
    p = run(1, write(d, "measured.toml", tiny_gpt(steps=2)))
    if not re.search(r"^MFU against \d+ GFLOP/s a rank \(this rank's matmul of the model's shape", p.stdout, re.M):
        fail(f"without job.peak_tflops the start lines do not name the measured peak:\n{p.stdout}")
    print("ok  without job.peak_tflops: " + next(l for l in p.stdout.splitlines() if l.startswith("MFU against")))


def csv_metrics(d):
    """--metrics FILE.csv: a header and one row per step; a resumed run keeps the header and the rows up to its
    checkpoint, and its rows are the uninterrupted run's (loss to the bit)."""
    ck = os.path.join(d, "ck")
    cfg = write(d, "csv.toml", tiny_gpt(steps=6) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 3\n')
    whole, part = os.path.join(d, "whole.csv"), os.path.join(d, "part.csv")
    run(1, cfg, "--metrics", whole, "--set", f'checkpoint.dir="{ck}-whole"')
    run(1, cfg, "--metrics", part, "--steps", "5")  # checkpoint at 3; rows 4 and 5 are trained again on resume
    run(1, cfg, "--metrics", part, "--resume", "auto")
    rows = {}
    for name in (whole, part):
        with open(name, newline="") as f:
            rows[name] = list(csv.DictReader(f))
        header = open(name).readline().strip()
        if header != ("step,loss,lr,grad_norm,tokens_per_s,ms,flops_per_s,mfu,peak_bytes,xent,balance_loss,skipped,"
                      "val_loss"):
            fail(f"{name}: header {header!r}")
    steps = [int(r["step"]) for r in rows[part]]
    if steps != [1, 2, 3, 4, 5, 6] or [int(r["step"]) for r in rows[whole]] != steps:
        fail(f"CSV metrics steps: resumed {steps}, whole {[r['step'] for r in rows[whole]]}")
    if [r["loss"] for r in rows[part]] != [r["loss"] for r in rows[whole]] or any(
            float(r["mfu"]) <= 0 or int(r["peak_bytes"]) <= 0 or r["xent"] != "" for r in rows[part]):
        fail(f"CSV metrics rows differ from the uninterrupted run's: {rows[part]} against {rows[whole]}")
    print("ok  --metrics FILE.csv: header and one row per step; resumed, each step once, the uninterrupted losses")


def plot(d):
    """tools/plot-metrics.py draws the runs above, JSON lines and CSV together: a PNG, and per panel one curve a run
    (read back from the script's own summary)."""
    png = os.path.join(d, "runs.png")
    files = [os.path.join(d, "m1.jsonl"), os.path.join(d, "m2.jsonl"), os.path.join(d, "whole.csv")]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot-metrics.py"), *files, "--label", "one",
                        "--label", "two", "--label", "csv", "--out", png, "--smooth", "3", "--summary"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"plot-metrics exited {p.returncode}: {p.stderr}")
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    want = {k: ["one", "two", "csv"] for k in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu")}
    with open(png, "rb") as f:
        head = f.read(8)
    if summary["panels"] != want or head != b"\x89PNG\r\n\x1a\n" or os.path.getsize(png) < 10000:
        fail(f"plot-metrics drew {summary} into {png} ({os.path.getsize(png)} bytes, starts {head!r})")
    print(f"ok  tools/plot-metrics.py: {os.path.getsize(png)} byte PNG, 5 panels of 3 runs (JSON lines and CSV)")


def tensorboard(d):
    """tools/metrics-to-tensorboard.py writes the CSV run above as TensorBoard events, read back by the tensorboard
    package's own reader: every step's loss. Skipped (and said so) where no interpreter has the package: it is an
    optional extra (TENSORBOARD_PYTHON names one that has it)."""
    reader = """
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
print(" ".join(f"{e.step}:{e.value!r}" for e in acc.Scalars("loss")))
"""
    pythons = [os.environ.get("TENSORBOARD_PYTHON"), sys.executable, "/usr/bin/python3"]
    python = next((p for p in pythons if p and os.path.exists(p) and subprocess.run(
        [p, "-c", "import tensorboard"], capture_output=True).returncode == 0), None)
    if python is None:
        print("ok  tools/metrics-to-tensorboard.py: skipped, no interpreter here has the tensorboard package")
        return
    logdir = os.path.join(d, "tb")
    p = subprocess.run([python, os.path.join(ROOT, "tools", "metrics-to-tensorboard.py"), os.path.join(d, "whole.csv"),
                        "--logdir", logdir], capture_output=True, text=True, timeout=120)
    got = subprocess.run([python, "-c", reader, logdir], capture_output=True, text=True, timeout=120)
    with open(os.path.join(d, "whole.csv"), newline="") as f:
        want = [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f)]
    pairs = [(int(s), float(v)) for s, v in (x.split(":") for x in got.stdout.split())]
    if p.returncode != 0 or len(pairs) != len(want) or any(
            s != ws or abs(v - wv) > 1e-6 * abs(wv) for (s, v), (ws, wv) in zip(pairs, want)):
        fail(f"TensorBoard events read back {pairs}, the metrics have {want}\n{p.stderr}{got.stderr}")
    print(f"ok  tools/metrics-to-tensorboard.py: {len(pairs)} steps of loss read back by tensorboard's reader")


if __name__ == "__main__":
    main()
