#!/usr/bin/env python3
"""Draws the schedule grid of a Piper plan as a PNG: one row per rank, one box per forward/backward pass
(F blue, B green, BI orange, BW purple, R (a recomputed forward) light blue, optimizer grey), labelled with its
microbatch.

Input: the predicted timeline of a dry run (`piper ... --dry-run --dump-plan DIR` writes DIR/timeline.json)
or a measured one (`piper ... --trace FILE`; the first traced step is drawn unless --step says which).
Needs only the Python standard library.

    tools/draw-schedule.py DIR/timeline.json -o schedule.png [--title "1F1B, p=4, m=8"]
"""
import argparse
import json
import struct
import sys
import zlib

COLORS = {"F": (76, 114, 176), "B": (85, 168, 104), "BI": (221, 132, 82), "BW": (129, 114, 178),
          "R": (100, 181, 205), "UPDATE": (150, 150, 150)}
# 3x5 pixel glyphs
GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "F": "111100110100100", "B": "110101110101110",
    "I": "111010010010111", "W": "101101101111101", "U": "101101101101111", "P": "111101111100100",
    "R": "110101110101101", "A": "010101111101101", "N": "101111111111101", "K": "101110100110101",
    " ": "000000000000000", "=": "000111000111000", "-": "000000111000000", ",": "000000000010100",
    "M": "101111111101101", "S": "111100111001111", "T": "111010010010010", "E": "111100111100111",
    "D": "110101101101110", "L": "100100100100111", "O": "111101101101111", "C": "111100100100111",
    "G": "111100101101111", "H": "101101111101101", "V": "101101101101010", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111", "J": "001001001101111", "Q": "111101101111001",
    "(": "010100100100010", ")": "010001001001010", ".": "000000000000010", ":": "000010000010000",
}


class Canvas:
    def __init__(self, w, h):
        self.w, self.h = w, h
        self.px = bytearray([255]) * (w * h * 3)

    def rect(self, x0, y0, x1, y1, color):
        x0, y0, x1, y1 = max(0, int(x0)), max(0, int(y0)), min(self.w, int(x1)), min(self.h, int(y1))
        for y in range(y0, y1):
            row = (y * self.w) * 3
            for x in range(x0, x1):
                i = row + x * 3
                self.px[i:i + 3] = bytes(color)

    def text(self, x, y, s, scale=2, color=(0, 0, 0)):
        for ch in s.upper():
            g = GLYPHS.get(ch, GLYPHS[" "])
            for r in range(5):
                for c in range(3):
                    if g[r * 3 + c] == "1":
                        self.rect(x + c * scale, y + r * scale, x + (c + 1) * scale, y + (r + 1) * scale, color)
            x += 4 * scale
        return x

    def png(self, path):
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                    + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(s, scale=2):
    return len(s) * 4 * scale


def passes(events, step):
    """Compute-stream boxes per rank: consecutive instructions of one node merged into one pass."""
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    rows = {}
    for e in events:
        if e.get("ph") != "X" or names.get((e["pid"], e["tid"])) != "compute":
            continue
        args = e.get("args", {})
        if step is not None and args.get("step", step) != step:
            continue
        kind = e["name"].split()[0]
        if kind not in COLORS:
            continue
        node = args.get("node", e["name"])
        box = rows.setdefault(e["pid"], [])
        if box and box[-1]["node"] == node and box[-1]["kind"] == kind:
            box[-1]["end"] = e["ts"] + e["dur"]
        else:
            box.append({"node": node, "kind": kind, "mb": args.get("mb", -1), "start": e["ts"], "end": e["ts"] + e["dur"]})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("timeline", help="timeline.json from --dump-plan, or a --trace file")
    ap.add_argument("-o", "--out", required=True, help="PNG to write")
    ap.add_argument("--step", type=int, help="which traced step to draw (default: the first in the file)")
    ap.add_argument("--title", default="", help="a line of text above the grid")
    ap.add_argument("--width", type=int, default=1200, help="image width in pixels")
    a = ap.parse_args()
    data = json.load(open(a.timeline))
    events = data["traceEvents"] if isinstance(data, dict) else data
    step = a.step
    if step is None:
        steps = sorted({e.get("args", {}).get("step") for e in events if e.get("ph") == "X" and "step" in e.get("args", {})})
        step = steps[0] if steps else None
    rows = passes(events, step)
    if not rows:
        sys.exit("draw-schedule: no compute passes found in " + a.timeline)
    t0 = min(b["start"] for r in rows.values() for b in r)
    t1 = max(b["end"] for r in rows.values() for b in r)
    label_w, row_h, top = 110, 34, 40 if a.title else 12
    height = top + row_h * len(rows) + 40
    c = Canvas(a.width, height)
    if a.title:
        c.text(10, 10, a.title, scale=3)
    span = max(t1 - t0, 1e-9)
    xs = lambda t: label_w + (t - t0) / span * (a.width - label_w - 10)
    for i, rank in enumerate(sorted(rows)):
        y = top + i * row_h
        c.text(10, y + 10, f"RANK {rank}", scale=2)
        c.rect(label_w, y + 2, a.width - 10, y + row_h - 2, (238, 238, 238))
        for b in rows[rank]:
            x0, x1 = xs(b["start"]), xs(b["end"])
            if x1 - x0 < 1:
                continue
            c.rect(x0, y + 4, x1 - 1, y + row_h - 4, COLORS[b["kind"]])
            label = str(b["mb"]) if b["mb"] >= 0 else ""
            if label and text_width(label) + 4 <= x1 - x0:
                c.text(int((x0 + x1) / 2 - text_width(label) / 2), y + 12, label, scale=2, color=(255, 255, 255))
    x = label_w
    y = top + row_h * len(rows) + 14
    for kind in ("F", "B", "BI", "BW", "UPDATE"):
        c.rect(x, y, x + 14, y + 14, COLORS[kind])
        x = c.text(x + 20, y + 2, kind, scale=2) + 18
    c.png(a.out)
    print(f"draw-schedule: wrote {a.out} ({len(rows)} ranks, {sum(len(r) for r in rows.values())} passes)")


if __name__ == "__main__":
    main()
