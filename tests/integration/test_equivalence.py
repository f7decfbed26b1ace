"""Every strategy trains the same run: over 20 steps the loss of DP2, DP4, PP2, PP4, PP2xDP2 with GPipe
and 1F1B, uneven stage splits and 1, 2, 4 and 8 microbatches equals the single-process loss within 1e-5."""
import os

from common import annotate_layers, compare, fail, losses, place, run, schedule, split, tempdir, tiny_gpt, write

RTOL = 1e-5


REPLICATE = "\n[[directive]]\nop = \"replicate\"\nfilter = { PP = \"*\" }\n"


def main():
    d = tempdir()
    base = tiny_gpt(name="ref", layers=6, batch=16)
    ref_cfg = write(d, "ref.toml", base)
    run(1, ref_cfg, "--metrics", os.path.join(d, "ref.jsonl"))
    ref = losses(os.path.join(d, "ref.jsonl"))
    if not ref[-1] < ref[0]:
        fail(f"single-process loss did not go down: {ref[0]} -> {ref[-1]}")

    cases = []  # (name, ranks, extra job text, --set arguments)
    cases.append(("DP2 (mesh)", 2, "", ["--set", "mesh.dp=2"]))
    cases.append(("DP4 (mesh)", 4, "", ["--set", "mesh.dp=4"]))
    cases.append(("single process, 8 microbatches", 1, split(8), []))
    for kind in ("gpipe", "1f1b"):
        for m in (1, 2, 4, 8):
            extra = annotate_layers([(0, 2), (3, 5)]) + place(0, [0]) + place(1, [1]) + split(m) + schedule(kind)
            cases.append((f"PP2 {kind} m={m}", 2, extra, []))
    # uneven stages: 1 + 5 layers, and 1/2/1/2 over four stages
    cases.append(("PP2 uneven [0,0],[1,5] 1f1b m=4", 2,
                  annotate_layers([(0, 0), (1, 5)]) + place(0, [0]) + place(1, [1]) + split(4), []))
    pp4 = annotate_layers([(0, 0), (1, 2), (3, 3), (4, 5)]) + "".join(place(s, [s]) for s in range(4))
    cases.append(("PP4 uneven 1f1b m=4", 4, pp4 + split(4), []))
    cases.append(("PP4 uneven 1f1b m=8", 4, pp4 + split(8), []))
    cases.append(("PP4 uneven gpipe m=2", 4, pp4 + split(2) + schedule("gpipe"), []))
    ppdp = annotate_layers([(0, 2), (3, 5)]) + place(0, [0, 2]) + place(1, [1, 3]) + REPLICATE
    for kind in ("gpipe", "1f1b"):
        for m in (1, 2, 4):
            cases.append((f"PP2xDP2 {kind} m={m}", 4, ppdp + split(m) + schedule(kind), []))
    cases.append(("PP2xDP2 (mesh)", 4, "", ["--set", "mesh.pp=2", "--set", "mesh.dp=2", "--set", "mesh.microbatches=4"]))

    for i, (name, ranks, extra, sets) in enumerate(cases):
        cfg = write(d, f"case{i}.toml", base + extra)
        out = os.path.join(d, f"case{i}.jsonl")
        run(ranks, cfg, "--metrics", out, *sets)
        compare(name, ref, losses(out), RTOL)


if __name__ == "__main__":
    main()
