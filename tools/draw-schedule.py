#!/usr/bin/env python3
"""Draws a Piper step's schedule as a PNG with matplotlib: one row per rank on a time axis, its compute passes
(F blue, B green, BI orange, BW purple, R (a recomputed forward) light blue, optimizer grey; labelled with the
microbatch) and below them a lane of its communication (sends and receives, collectives, all-to-alls).

Input: the predicted timeline of a dry run (`piper ... --dry-run --dump-plan DIR` writes DIR/timeline.json: one
timeline per device set, drawn once for each of the set's ranks) or a measured one (`piper ... --trace FILE`; the
first traced step is drawn unless --step says which). matplotlib: Debian's python3-matplotlib (`make` installs it)
or pip; run under an interpreter without it, the script runs itself again with /usr/bin/python3 when that has it.

    tools/draw-schedule.py DIR/timeline.json -o schedule.png [--title "1F1B, p=4, m=8"] [--summary]
"""
import argparse
import json
import re
import sys

from pyplot_import import pyplot

COLORS = {"F": "#4c72b0", "B": "#55a868", "BI": "#dd8452", "BW": "#8172b2", "R": "#64b5cd", "UPDATE": "#969696"}
COMM_COLORS = {"p2p": "#c44e52", "collective": "#937860", "all_to_all": "#da8bc3"}


def comm_kind(name):
    head = name.split()[0]
    if head in ("SEND", "RECV"):
        return "p2p"
    if head == "ALL_TO_ALL":
        return "all_to_all"
    if head in ("ALL_REDUCE", "REDUCE_SCATTER", "ALL_GATHER", "STEP_SYNC"):
        return "collective"
    return None


def read_rows(events, step):
    """{pid: {"ranks": [...], "set": label, "passes": [...], "comm": [...]}} of one step."""
    names, procs = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e["args"]
    rows = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        if step is not None and args.get("step", step) != step:
            continue
        row = rows.setdefault(e["pid"], {"passes": [], "comm": []})
        kind = e["name"].split()[0]
        if names.get((e["pid"], e["tid"])) == "compute" and kind in COLORS:
            node, box = args.get("node", e["name"]), row["passes"]
            if box and box[-1]["node"] == node and box[-1]["kind"] == kind:  # one pass's instructions merged
                box[-1]["end"] = e["ts"] + e["dur"]
            else:
                box.append({"node": node, "kind": kind, "mb": args.get("mb", -1), "start": e["ts"],
                            "end": e["ts"] + e["dur"]})
        elif comm_kind(e["name"]):
            row["comm"].append({"kind": comm_kind(e["name"]), "start": e["ts"], "end": e["ts"] + e["dur"]})
    for pid, row in rows.items():
        meta = procs.get(pid, {})
        label = meta.get("name", f"rank {pid}")
        m = re.search(r"device set (\d+)", label)
        row["set"] = m.group(1) if m else None
        row["ranks"] = meta.get("ranks") or [pid]
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline", help="timeline.json from --dump-plan, or a --trace file")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--step", type=int, help="which traced step to draw (default: the first in the file)")
    ap.add_argument("--title", default="", help="a line of text above the picture")
    ap.add_argument("--width", type=float, default=12, help="width in inches (110 pixels each)")
    ap.add_argument("--summary", action="store_true", help="print what was drawn as one JSON line")
    a = ap.parse_args()
    data = json.load(open(a.timeline))
    events = data["traceEvents"] if isinstance(data, dict) else data
    predicted = isinstance(data, dict) and data.get("predicted", False)
    uniform = isinstance(data, dict) and data.get("uniform", False)  # the uniform cost model: F = 1 unit (1000 "us")
    step = a.step
    if step is None:
        steps = sorted({e["args"]["step"] for e in events if e.get("ph") == "X" and "step" in e.get("args", {})})
        step = steps[0] if steps else None
    rows = read_rows(events, step)
    if not any(r["passes"] for r in rows.values()):
        sys.exit("draw-schedule: no compute passes found in " + a.timeline)
    lanes = sorted(((rank, pid) for pid, r in rows.items() for rank in r["ranks"]))  # a row per rank
    t0 = min(b["start"] for r in rows.values() for b in r["passes"] + r["comm"])
    plt = pyplot("draw-schedule")
    from matplotlib.patches import Patch
    fig, ax = plt.subplots(figsize=(a.width, 0.75 + 0.62 * len(lanes)))
    ms = 1e-3  # trace times are microseconds
    for i, (rank, pid) in enumerate(lanes):
        y = len(lanes) - 1 - i
        r = rows[pid]
        for b in r["passes"]:
            x0, w = (b["start"] - t0) * ms, (b["end"] - b["start"]) * ms
            ax.broken_barh([(x0, w)], (y + 0.32, 0.6), facecolors=COLORS[b["kind"]], edgecolor="white", linewidth=0.4)
            if b["mb"] >= 0 and w > 0:
                ax.text(x0 + w / 2, y + 0.62, str(b["mb"]), ha="center", va="center", fontsize=6, color="white",
                        clip_on=True)
        for c in r["comm"]:
            ax.broken_barh([((c["start"] - t0) * ms, (c["end"] - c["start"]) * ms)], (y + 0.05, 0.2),
                           facecolors=COMM_COLORS[c["kind"]], alpha=0.7)
    ax.set_yticks([len(lanes) - 1 - i + 0.5 for i in range(len(lanes))])
    ax.set_yticklabels([f"rank {rank}" + (f" (set {rows[pid]['set']})" if rows[pid]["set"] is not None else "")
                        for rank, pid in lanes], fontsize=8)
    ax.set_ylim(0, len(lanes))
    ax.set_xlabel("time (units: F = 1, B = 2; the uniform cost model)" if uniform
                  else "time (ms" + (", predicted by the cost model)" if predicted else ")"))
    ax.grid(axis="x", alpha=0.3)
    kinds = sorted({b["kind"] for r in rows.values() for b in r["passes"]}, key=list(COLORS).index)
    comms = sorted({c["kind"] for r in rows.values() for c in r["comm"]})
    ax.legend(handles=[Patch(color=COLORS[k], label=k) for k in kinds]
              + [Patch(color=COMM_COLORS[k], alpha=0.7, label=k.replace("_", "-")) for k in comms],
              fontsize=7, ncol=len(kinds) + len(comms), loc="upper center", bbox_to_anchor=(0.5, -0.35 / len(lanes) - 0.12),
              frameon=False)
    if a.title:
        ax.set_title(a.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    passes = sum(len(rows[pid]["passes"]) for _, pid in lanes)
    if a.summary:
        print(json.dumps({"out": a.out, "ranks": [rank for rank, _ in lanes], "passes": passes,
                          "communication": sum(len(rows[pid]["comm"]) for _, pid in lanes), "step": step}))
    else:
        print(f"draw-schedule: wrote {a.out} ({len(lanes)} ranks, {passes} passes)")


if __name__ == "__main__":
    main()
