"""Every schedule trains the same run as one process: GPipe, 1F1B, interleaved 1F1B, ZB-H1, DualPipeV and a
hand-written schedule file, for p = 2 and 4 pipeline ranks and several microbatch counts, including uneven
stages; the loss stays within 1e-5 (relative) of the single-process loss over 20 steps."""
import os

from common import compare, losses, run, tempdir, tiny_gpt, write

LAYERS = 8


def pipeline_job(kind, p, m, ranges, rank_of, extra=""):
    text = "\n[[annotate]]\ntag = \"PP\"\nlayers = " + str([list(r) for r in ranges]) + "\n"
    text += f"\n[[directive]]\nop = \"split\"\ncount = {m}\n"
    for stage in range(len(ranges)):
        text += f"\n[[directive]]\nop = \"place\"\nfilter = {{ PP = {stage} }}\ndevices = [{rank_of(stage)}]\n"
    text += f"\n[[directive]]\nop = \"schedule\"\nkind = \"{kind}\"\n" + extra
    return text


def even(stages):
    per = LAYERS // stages
    return [(s * per, s * per + per - 1) for s in range(stages)]


def main():
    d = tempdir()
    base = tiny_gpt(layers=LAYERS, batch=16)
    run(1, write(d, "ref.toml", base), "--metrics", os.path.join(d, "ref.jsonl"))
    ref = losses(os.path.join(d, "ref.jsonl"))

    # a hand-written 1F1B-like order for 2 ranks and 4 microbatches, with split backward on rank 1
    schedule_file = write(d, "custom.toml", """
[[rank]]   # pipeline rank 0: stage 0
slots = ["F0.0", "F0.1", "B0.0", "F0.2", "B0.1", "F0.3", "B0.2", "B0.3"]
[[rank]]   # pipeline rank 1: stage 1, weight gradients deferred by one microbatch
slots = ["F1.0", "BI1.0", "F1.1", "BI1.1", "BW1.0", "F1.2", "BI1.2", "BW1.1", "F1.3", "BI1.3", "BW1.2", "BW1.3"]
""")
    schedule_csv = write(d, "custom.csv", "rank,slot,pass,stage,mb\n" + "".join(
        f"0,{i},F,0,{i}\n" for i in range(4)) + "".join(f"0,{4 + i},B,0,{i}\n" for i in range(4)) + "".join(
        f"1,{2 * i},F,1,{i}\n1,{2 * i + 1},B,1,{i}\n" for i in range(4)))

    cases = []
    for kind in ("gpipe", "1f1b", "zb-h1"):
        for p, m in ((2, 2), (2, 4), (4, 4), (4, 8)):
            cases.append((f"{kind} p={p} m={m}", p, pipeline_job(kind, p, m, even(p), lambda s: s)))
    cases.append(("zb-h1 p=4 m=8 uneven", 4, pipeline_job("zb-h1", 4, 8, [(0, 0), (1, 3), (4, 4), (5, 7)], lambda s: s)))
    cases.append(("1f1b p=2 m=8 uneven", 2, pipeline_job("1f1b", 2, 8, [(0, 1), (2, 7)], lambda s: s)))
    for p, m in ((2, 2), (2, 4), (4, 4), (4, 8)):
        cases.append((f"interleaved-1f1b p={p} v=2 m={m}", p, pipeline_job("interleaved-1f1b", p, m, even(2 * p),
                                                                            lambda s, p=p: s % p)))
    cases.append(("interleaved-1f1b p=2 v=2 m=4 uneven", 2,
                  pipeline_job("interleaved-1f1b", 2, 4, [(0, 0), (1, 3), (4, 5), (6, 7)], lambda s: s % 2)))
    for p, m in ((2, 4), (2, 8), (4, 8)):
        cases.append((f"dualpipev p={p} m={m}", p, pipeline_job("dualpipev", p, m, even(2 * p),
                                                                 lambda s, p=p: s if s < p else 2 * p - 1 - s)))
    cases.append(("dualpipev p=2 m=4 uneven", 2,
                  pipeline_job("dualpipev", 2, 4, [(0, 0), (1, 3), (4, 6), (7, 7)], lambda s: s if s < 2 else 3 - s)))
    cases.append(("file (TOML) p=2 m=4", 2, pipeline_job("file", 2, 4, even(2), lambda s: s,
                                                         f"file = \"{os.path.basename(schedule_file)}\"\n")))
    cases.append(("file (CSV) p=2 m=4", 2, pipeline_job("file", 2, 4, even(2), lambda s: s,
                                                        f"file = \"{os.path.basename(schedule_csv)}\"\n")))
    for i, (name, ranks, extra) in enumerate(cases):
        cfg = write(d, f"s{i}.toml", base + extra)
        out = os.path.join(d, f"s{i}.jsonl")
        run(ranks, cfg, "--metrics", out)
        compare(name, ref, losses(out), 1e-5)


if __name__ == "__main__":
    main()
