#!/usr/bin/env python3
"""Writes a piper --metrics file (JSON lines or CSV) as TensorBoard event files, through the tensorboard package's
own writer (`pip install tensorboard`, an optional extra): one scalar per metric (loss, lr, grad_norm, tokens_per_s,
mfu, val_loss, ...) at each step. With --follow it keeps reading the file as a run appends to it, so
`tensorboard --logdir LOGDIR` shows the run live.

usage: tools/metrics-to-tensorboard.py METRICS --logdir LOGDIR [--follow] [--poll S]
  --follow  after the lines there, wait for more (until interrupted, or --idle seconds without a new line)"""
import argparse
import csv
import io
import json
import sys
import time


def rows_of(text, csv_header):
    """(rows, header) of the complete lines in `text` (JSON lines, or CSV with `csv_header` once known)."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            rows.append(json.loads(line))
        elif csv_header is None:
            csv_header = line.strip().split(",")
        else:
            values = next(csv.reader(io.StringIO(line)))
            rows.append({k: float(v) for k, v in zip(csv_header, values) if v != ""})
    return rows, csv_header


def main():
    ap = argparse.ArgumentParser(description="piper --metrics to TensorBoard event files")
    ap.add_argument("metrics")
    ap.add_argument("--logdir", required=True)
    ap.add_argument("--follow", action="store_true")
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--idle", type=float, default=0.0, help="with --follow: stop after this many seconds without a line")
    a = ap.parse_args()
    try:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        sys.exit("metrics-to-tensorboard: the tensorboard package is not installed: pip install tensorboard")
    writer = EventFileWriter(a.logdir)
    header, pending, written, quiet_since = None, "", 0, time.time()
    with open(a.metrics) as f:
        while True:
            chunk = f.read()
            pending += chunk
            complete, _, pending = pending.rpartition("\n")  # a line still being written waits for its newline
            rows, header = rows_of(complete, header)
            for r in rows:
                step = int(r["step"])
                values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in r.items()
                          if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
                writer.add_event(event_pb2.Event(wall_time=time.time(), step=step,
                                                 summary=summary_pb2.Summary(value=values)))
                written += 1
            if rows:
                writer.flush()
                quiet_since = time.time()
            if not a.follow or (a.idle > 0 and time.time() - quiet_since > a.idle):
                break
            time.sleep(a.poll)
    writer.close()
    print(f"metrics-to-tensorboard: {written} steps of {a.metrics} written to {a.logdir}")


if __name__ == "__main__":
    main()
