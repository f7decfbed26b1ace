"""What a run prints per step and writes to --metrics: the step of the run's last, loss, lr, gradient norm, tokens/s,
MFU, the step's time, rank 0's peak memory and the time left, on 1 and 2 ranks.

MFU is the model's FLOP/s over every rank's peak: with job.peak_tflops = 0.001 (1 GFLOP/s a rank) the metrics'
mfu is flops_per_s / (ranks x 1e9), and the step line shows the same percentage; without it the CPU's peak is
measured at start and named. peak_bytes is the peak that --report-json gives for rank 0 at the end."""
import json
import os
import re

from common import fail, metrics, run, tempdir, tiny_gpt, write

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
    p = run(1, write(d, "measured.toml", tiny_gpt(steps=2)))
    if not re.search(r"^MFU against \d+ GFLOP/s a rank \(this rank's matmul of the model's shape", p.stdout, re.M):
        fail(f"without job.peak_tflops the start lines do not name the measured peak:\n{p.stdout}")
    print("ok  without job.peak_tflops: " + next(l for l in p.stdout.splitlines() if l.startswith("MFU against")))


if __name__ == "__main__":
    main()
