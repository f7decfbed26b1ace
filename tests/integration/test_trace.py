"""--trace writes one Chrome-trace JSON for the whole job: a process per rank, a thread per stream, spans for
F/B/BI/BW/UPDATE and every communication, and flow arrows pairing each SEND with its RECV; the run prints
each rank's measured bubble next to the predicted one; tools/draw-schedule.py draws the trace as a PNG; --profile
reports every rank's per-kernel breakdown (read from --report-json)."""
import json
import os
import re
import subprocess
import sys

from common import PIPER, ROOT, fail, report, run, tempdir, tiny_gpt, write


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
    summary = os.path.join(d, "report.json")
    p = run(4, write(d, "job.toml", job), "--trace", trace, "--report-json", summary)
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

    ranks = report(summary)["ranks"]
    if [r["rank"] for r in ranks] != [0, 1, 2, 3] or any("time" not in r for r in ranks):
        fail(f"expected the times of every rank in the report: {ranks}")
    for r in ranks:
        t = r["time"]
        if not (0 <= t["bubble"] < 1 and 0 < t["predicted_bubble"] < 1):
            fail(f"rank {r['rank']}: measured and predicted bubble out of range: {t}")
    if len([l for l in p.stdout.splitlines() if l.startswith("timeline rank=")]) != 4:  # the lines for people
        fail(f"expected a timeline line per rank:\n{p.stdout}")
    print("ok  measured bubble reported next to the predicted one on every rank (--report-json and text)")

    # the pictures (matplotlib): the measured step, and the dry run's predicted one, a row per rank of the 4 (the
    # dry run's timeline has one per device set, listing its ranks), with the communication lane beside
    dump = os.path.join(d, "plan")
    subprocess.run([PIPER, "--config", write(d, "job.toml", job), "--dry-run", "--world", "4", "--dump-plan", dump],
                   check=True, capture_output=True, timeout=120)
    for source in (trace, os.path.join(dump, "timeline.json")):
        png = source + ".png"
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "draw-schedule.py"), source, "-o", png,
                            "--summary"], capture_output=True, text=True, timeout=120)
        drawn = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
        if (r.returncode != 0 or open(png, "rb").read(8) != b"\x89PNG\r\n\x1a\n" or drawn["ranks"] != [0, 1, 2, 3]
                or drawn["passes"] < 4 * 4 or drawn["communication"] < 4):
            fail(f"draw-schedule {source}: {r.stdout}{r.stderr}")
        print(f"ok  draw-schedule {os.path.basename(source)}: {drawn['ranks']} as rows, {drawn['passes']} passes, "
              f"{drawn['communication']} communication spans")

    # --profile: every rank's kernel, region and matmul-shape tables, after the warm-up step
    summary = os.path.join(d, "profile.json")
    p = run(2, write(d, "pp2.toml", tiny_gpt(steps=4, layers=4, batch=16)), "--profile", "--set", "mesh.pp=2",
            "--report-json", summary)
    ranks = report(summary)["ranks"]
    shapes, regions = [], set()
    for rank in (0, 1):
        prof = ranks[rank].get("profile")
        if (not prof or prof["steps"] != 3 or not 0 < prof["kernel_ms_per_step"] <= prof["wall_ms_per_step"] * 1.05
                or f"profile rank {rank}: 3 steps" not in p.stdout):
            fail(f"--profile: no plausible summary for rank {rank}: {prof}\n{p.stdout}")
        shapes += [m for m in prof["matmul_shapes"] if m["kernel"].startswith("linear_")]
        regions |= {r["name"] for r in prof["regions"]
                    if re.fullmatch(r"blocks\.\d\.(attn|mlp)|embedding|head|loss", r["name"])}
    if (not shapes or any(not m["gflops_per_s"] > 0 or min(m["rows"], m["in_features"], m["out_features"]) <= 0
                          for m in shapes)
            or regions != {f"blocks.{i}.{half}" for i in range(4) for half in ("attn", "mlp")} | {"embedding", "head", "loss"}):
        fail(f"--profile: matmul shapes with GFLOP/s and every segment expected: {shapes}, {sorted(regions)}")
    print(f"ok  --profile: both ranks' tables, {len(shapes)} matmul shape rows, regions {sorted(regions)}")

if __name__ == "__main__":
    main()
