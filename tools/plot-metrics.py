#!/usr/bin/env python3
"""Plots one or several runs' --metrics files (JSON lines or CSV) with matplotlib: loss (and validation loss where
the files have it), learning rate, gradient norm, tokens/s and MFU, one panel each, one curve per run, so runs can
be compared on one picture.

usage: tools/plot-metrics.py METRICS [METRICS ...] --out PLOT.png [--label NAME ...] [--smooth N] [--summary]
  --label   a name per file for the legend (default: the file's name)
  --smooth  also draw each loss as a running mean over N steps (the raw curve faint behind it)
  --summary print what was drawn as one JSON line: per panel, the curves (run labels) it holds
matplotlib: Debian's python3-matplotlib (tools/install-deps.sh installs it) or `pip install matplotlib`; run under
another interpreter without it, the script runs itself again with /usr/bin/python3 when that one has it."""
import argparse
import csv
import json
import os
import sys

from pyplot_import import pyplot

PANELS = [("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "gradient norm"),
          ("tokens_per_s", "tokens/s"), ("mfu", "MFU (%)")]


def read_metrics(path):
    """{column: [values]} of a metrics file, steps ascending; numbers only (missing and non-finite cells: None)."""
    rows = []
    with open(path, newline="") as f:
        first = f.readline()
        f.seek(0)
        if first.lstrip().startswith("{"):
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        sys.exit(f"plot-metrics: {path}:{n}: not a JSON metrics line ({e.msg})")
        else:
            for row in csv.DictReader(f):
                rows.append({k: (float(v) if v not in ("", None) else None) for k, v in row.items()})
    if not rows or any("step" not in r for r in rows):
        sys.exit(f"plot-metrics: {path}: no metrics lines with a step")
    rows.sort(key=lambda r: r["step"])
    keys = {k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {k: [r.get(k) if isinstance(r.get(k), (int, float)) else None for r in rows] for k in sorted(keys)}


def running_mean(values, n):
    out, window = [], []
    for v in values:
        window.append(v)
        if len(window) > n:
            window.pop(0)
        out.append(sum(window) / len(window))
    return out


def main():
    ap = argparse.ArgumentParser(description="Plot piper --metrics files", add_help=True)
    ap.add_argument("metrics", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", action="append", default=[])
    ap.add_argument("--smooth", type=int, default=0)
    ap.add_argument("--summary", action="store_true")
    a = ap.parse_args()
    if a.label and len(a.label) != len(a.metrics):
        sys.exit(f"plot-metrics: {len(a.label)} --label for {len(a.metrics)} files")
    runs = [(a.label[i] if a.label else os.path.basename(p), read_metrics(p)) for i, p in enumerate(a.metrics)]
    plt = pyplot("plot-metrics")
    panels = [(key, title) for key, title in PANELS if any(key in cols for _, cols in runs)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), sharex=True, squeeze=False)
    drawn = {}
    for ax, (key, title) in zip(axes[:, 0], panels):
        curves = []
        for label, cols in runs:
            for column, name in ((key, label), ("val_loss", f"{label} (validation)") if key == "loss" else (None, None)):
                if column is None or column not in cols:
                    continue
                pts = [(s, v) for s, v in zip(cols["step"], cols[column]) if v is not None]
                if not pts:
                    continue
                xs, ys = zip(*pts)
                if key == "mfu":
                    ys = [100 * y for y in ys]
                if a.smooth > 1 and column == "loss":
                    line, = ax.plot(xs, ys, alpha=0.25)
                    ax.plot(xs, running_mean(ys, a.smooth), color=line.get_color(), label=name)
                else:
                    ax.plot(xs, ys, label=name, marker="o" if column == "val_loss" else None, markersize=3)
                curves.append(name)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        drawn[key] = curves
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    if a.summary:
        print(json.dumps({"out": a.out, "panels": drawn}))
    else:
        print(f"plot-metrics: wrote {a.out}: " + ", ".join(f"{k} ({len(v)} curves)" for k, v in drawn.items()))


if __name__ == "__main__":
    main()
