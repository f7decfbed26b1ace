"""--trace writes one Chrome-trace JSON for the whole job: a process per rank, a thread per stream, spans for
F/B/BI/BW/UPDATE and every communication, and flow arrows pairing each SEND with its RECV; the run prints
each rank's measured bubble next to the predicted one; tools/draw-schedule.py draws the trace as a PNG; --profile prints every rank's per-kernel breakdown."""
import json
import os
import re
import subprocess

from common import ROOT, fail, run, tempdir, tiny_gpt, write


def main():
    d = tempdir()
    job = tiny_gpt(steps=6, layers=4, batch=16) + """
[[annotate]]
tag = "PP"
layers = [[0, 1], [2, 3]]
[[directive]]
op = "split"
count = 4
[[directive]]
op = "place"
filter = { PP = 0 }
devices = [0, 2]
[[directive]]
op = "place"
filter = { PP = 1 }
devices = [1, 3]
[[directive]]
op = "replicate"
filter = {}
[[directive]]
op = "schedule"
kind = "zb-h1"
"""
    trace = os.path.join(d, "trace.json")
    p = run(4, write(d, "job.toml", job), "--trace", trace)
    data = json.load(open(trace))
    events = data["traceEvents"]
    procs = {e["pid"] for e in events if e.get("name") == "process_name"}
    if procs != {0, 1, 2, 3}:
        fail(f"expected one process per rank 0..3, got {sorted(procs)}")
    threads = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "thread_name"}
    for rank in range(4):
        for stream in ("compute", "p2p.fwd", "p2p.bwd", "dp"):
            if (rank, stream) not in threads:
                fail(f"rank {rank} has no thread for stream {stream}: {sorted(threads)}")
    spans = [e for e in events if e.get("ph") == "X"]
    kinds = {e["name"].split()[0] for e in spans}
    for k in ("F", "BI", "BW", "UPDATE", "SEND", "RECV", "ALL_REDUCE", "STEP_SYNC"):
        if k not in kinds:
            fail(f"no {k} spans in the trace (found {sorted(kinds)})")
    steps = {e["args"]["step"] for e in spans}
    if steps != {2, 3, 4, 5, 6}:
        fail(f"trace should hold steps 2..6 (after the warm-up step), holds {sorted(steps)}")
    starts = {e["id"] for e in events if e.get("ph") == "s"}
    ends = {e["id"] for e in events if e.get("ph") == "f"}
    sends = sum(1 for e in spans if e["name"].startswith("SEND"))
    if not starts or starts != ends or len(starts) != sends:
        fail(f"flow arrows: {len(starts)} starts, {len(ends)} ends, {sends} sends; every SEND needs one arrow to its RECV")
    print(f"ok  trace: 4 processes, streams per rank, {len(spans)} spans, {len(starts)} SEND->RECV arrows, steps 2..6")

    lines = [l for l in p.stdout.splitlines() if l.startswith("timeline rank=")]
    if len(lines) != 4:
        fail(f"expected a timeline line per rank:\n{p.stdout}")
    for l in lines:
        m = re.search(r"bubble=([\d.]+) predicted_bubble=([\d.]+)", l)
        if not m or not (0 <= float(m.group(1)) < 1 and 0 < float(m.group(2)) < 1):
            fail(f"measured and predicted bubble missing or out of range: {l}")
    print("ok  measured bubble printed next to the predicted one on every rank")

    png = os.path.join(d, "trace.png")
    r = subprocess.run(["python3", os.path.join(ROOT, "tools", "draw-schedule.py"), trace, "-o", png],
                       capture_output=True, text=True)
    if r.returncode != 0 or open(png, "rb").read(8) != b"\x89PNG\r\n\x1a\n":
        fail(f"draw-schedule failed: {r.stdout}{r.stderr}")
    print(f"ok  draw-schedule: {r.stdout.strip()}")

    # --profile: every rank's kernel, region and matmul-shape tables, after the warm-up step
    p = run(2, write(d, "pp2.toml", tiny_gpt(steps=4, layers=4, batch=16)), "--profile", "--set", "mesh.pp=2")
    for rank in (0, 1):
        m = re.search(rf"profile rank {rank}: 3 steps, ([\d.]+) ms per step, ([\d.]+) ms of it in kernels", p.stdout)
        if not m or not 0 < float(m.group(2)) <= float(m.group(1)) * 1.05:
            fail(f"--profile: no plausible summary for rank {rank}:\n{p.stdout}")
    shapes = re.findall(r"^  linear_\w+ +N=(\d+) +C=(\d+) +OC=(\d+) +[\d.]+ +[\d.]+ +[\d.]+% +([\d.]+)$", p.stdout, re.M)
    regions = set(re.findall(r"^  (blocks\.\d|embedding|head) ", p.stdout, re.M))
    if not shapes or any(float(g) <= 0 for *_, g in shapes) or regions != {"blocks.0", "blocks.1", "blocks.2",
                                                                           "blocks.3", "embedding", "head"}:
        fail(f"--profile: matmul shapes with GFLOP/s and every segment expected:\n{p.stdout}")
    print(f"ok  --profile: both ranks' tables, {len(shapes)} matmul shape rows, regions {sorted(regions)}")


if __name__ == "__main__":
    main()
