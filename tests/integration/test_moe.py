"""Qwen3 with a mixture of experts (4 experts, top-2, every layer or every other layer; dropless and with a
capacity) trains the same run as one process within 1e-5 over 20 steps under DP with ZeRO 0-3, PP with
1F1B, ZB-H1 and DualPipeV, and PP x DP; metrics report cross-entropy and balance loss apart (loss = sum);
a checkpoint resumes under another strategy; expert parameters carry Hugging Face's Qwen3-MoE names."""
import os
import subprocess

from common import compare, fail, losses, mesh, metrics, pipeline, run, tempdir, tiny_qwen3, write

RTOL = 1e-5


def moe(every=1, capacity=0.0):
    return (f"\n[model.moe]\nexperts = 4\ntop_k = 2\nd_expert = 24\nevery = {every}\naux_loss_coef = 0.01\n"
            f"capacity_factor = {capacity}\n")


def main():
    d = tempdir()
    # [model.moe] follows [model]'s keys: inserted just before [data]
    def job(name, every=1, capacity=0.0, extra=""):
        text = tiny_qwen3(name=name, layers=4)
        return text.replace("\n[data]", moe(every, capacity) + "\n[data]", 1) + extra

    refs = {}
    for every, capacity in ((1, 0.0), (2, 0.6)):
        label = f"every={every} capacity={capacity}"
        base = job(f"moe{every}", every, capacity)
        ref_path = os.path.join(d, f"ref{every}.jsonl")
        run(1, write(d, f"ref{every}.toml", base), "--metrics", ref_path)
        ref = refs[every] = losses(ref_path)
        rows = metrics(ref_path)
        for r in rows:
            if abs(r["xent"] + r["balance_loss"] - r["loss"]) > 1e-6 * abs(r["loss"]) or not r["balance_loss"] > 0:
                fail(f"MoE {label}: metrics line {r} does not split loss into xent + balance_loss > 0")
        if not ref[-1] < ref[0]:
            fail(f"MoE {label}: loss did not go down: {ref[0]} -> {ref[-1]}")
        print(f"ok  MoE {label}: loss = xent + balance_loss on every step (balance {rows[0]['balance_loss']:.3g})")
        cases = [
            ("DP2", 2, "", mesh(dp=2)),
            ("DP2 ZeRO-1", 2, "", mesh(dp=2, zero=1)),
            ("DP4 ZeRO-2", 4, "", mesh(dp=4, zero=2)),
            ("DP2 ZeRO-3 m=2", 2, "", mesh(dp=2, m=2, zero=3)),
            ("PP2 1f1b m=4", 2, pipeline("1f1b", 4, [(0, 1), (2, 3)], lambda s: s), []),
            ("PP2 zb-h1 m=4", 2, pipeline("zb-h1", 4, [(0, 0), (1, 3)], lambda s: s), []),
            ("PP2 dualpipev m=4", 2, pipeline("dualpipev", 4, [(i, i) for i in range(4)],
                                              lambda s: s if s < 2 else 3 - s), []),
            ("PP2xDP2 ZeRO-1 m=2", 4, "", mesh(pp=2, dp=2, m=2, zero=1)),
        ]
        for i, (name, ranks, extra, sets) in enumerate(cases):
            cfg = write(d, f"c{every}-{i}.toml", base + extra)
            out = os.path.join(d, f"c{every}-{i}.jsonl")
            run(ranks, cfg, "--metrics", out, *sets)
            compare(f"MoE {label}: {name}", ref, losses(out), RTOL)

    # resume a PP2xDP2 checkpoint as one process
    ck = os.path.join(d, "ck")
    cfg = write(d, "resume.toml", job("resume") + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n')
    run(4, cfg, "--steps", "10", *mesh(pp=2, dp=2, m=2, zero=1))
    out = os.path.join(d, "resumed.jsonl")
    run(1, cfg, "--resume", os.path.join(ck, "step_00000010.h5"), "--metrics", out,
        "--set", f'checkpoint.dir="{ck}_one"')
    compare("MoE: resume a PP2xDP2 checkpoint as one process", refs[1][10:], losses(out), RTOL)
    names = subprocess.run(["h5ls", "-r", os.path.join(ck, "step_00000010.h5")], capture_output=True, text=True).stdout
    for want in ("/params/model.layers.1.mlp.gate.weight", "/params/model.layers.3.mlp.experts.2.down_proj.weight",
                 "/params/model.layers.0.mlp.experts.0.gate_proj.weight", "/params/model.layers.2.mlp.experts.3.up_proj.weight"):
        if want not in names:
            fail(f"MoE checkpoint lacks {want}:\n{names}")
    print("ok  MoE checkpoint tensors carry Hugging Face's Qwen3-MoE names")


if __name__ == "__main__":
    main()
