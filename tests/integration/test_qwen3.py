"""Qwen3 (GQA, q/k norms, RoPE, SwiGLU; tied and untied embeddings) under every strategy trains the same run
as one process within 1e-5 over 20 steps: DP, ZeRO 1-3, PP with uneven stages and a cut inside a layer,
PP x DP, all five schedules and a schedule file; checkpoints resume bit-for-bit and under another strategy;
the model learns; checkpoint names are Hugging Face's."""
import glob
import os
import subprocess

from common import annotate_layers, compare, fail, losses, mesh, metrics, pipeline, run, tempdir, tiny_qwen3, write

RTOL = 1e-5
LAYERS = 4


def annotate_segments(ranges):
    return "\n[[annotate]]\ntag = \"PP\"\nsegments = " + str([list(r) for r in ranges]).replace("'", '"') + "\n"


def equivalence(d, tied):
    label = "tied" if tied else "untied"
    base = tiny_qwen3(name=label, layers=LAYERS, tied=tied)
    run(1, write(d, f"ref-{label}.toml", base), "--metrics", os.path.join(d, f"ref-{label}.jsonl"))
    ref = losses(os.path.join(d, f"ref-{label}.jsonl"))
    if not ref[-1] < ref[0]:
        fail(f"qwen3 {label}: single-process loss did not go down: {ref[0]} -> {ref[-1]}")
    even = annotate_layers([(0, 1), (2, 3)])
    cases = [
        ("DP2", 2, "", mesh(dp=2)),
        ("DP2 ZeRO-1", 2, "", mesh(dp=2, zero=1)),
        ("DP2 ZeRO-2", 2, "", mesh(dp=2, zero=2)),
        ("DP4 ZeRO-3", 4, "", mesh(dp=4, zero=3)),
        ("PP2 uneven [0,0],[1,3] 1f1b m=4", 2, pipeline("1f1b", 4, annotate_layers([(0, 0), (1, 3)]), lambda s: s, 2), []),
        ("PP2 cut between attention and MLP of layer 1, m=2", 2,
         pipeline("1f1b", 2, annotate_segments([("model.embed_tokens", "model.layers.1.self_attn"),
                                                ("model.layers.1.mlp", "head")]), lambda s: s, 2), []),
        ("PP2xDP2 1f1b m=2 ZeRO-3", 4, "", mesh(pp=2, dp=2, m=2, zero=3)),
        ("PP2xDP2 gpipe m=4 ZeRO-2", 4, "", mesh(pp=2, dp=2, m=4, zero=2, schedule="gpipe")),
    ]
    if not tied:
        cases += [
            ("PP2 gpipe m=4", 2, pipeline("gpipe", 4, even, lambda s: s, 2), []),
            ("PP2 zb-h1 m=4", 2, pipeline("zb-h1", 4, even, lambda s: s, 2), []),
            ("PP4 1f1b m=8", 4, pipeline("1f1b", 8, annotate_layers([(i, i) for i in range(4)]), lambda s: s, 4), []),
            ("PP2 interleaved-1f1b v=2 m=4", 2,
             pipeline("interleaved-1f1b", 4, annotate_layers([(i, i) for i in range(4)]), lambda s: s % 2, 4), []),
            ("PP2 dualpipev m=4", 2,
             pipeline("dualpipev", 4, annotate_layers([(i, i) for i in range(4)]), lambda s: s if s < 2 else 3 - s, 4), []),
        ]
        schedule_file = write(d, "custom.toml", """
[[rank]]
slots = ["F0.0", "F0.1", "B0.0", "B0.1"]
[[rank]]
slots = ["F1.0", "BI1.0", "F1.1", "BI1.1", "BW1.0", "BW1.1"]
""")
        keys = f"file = \"{os.path.basename(schedule_file)}\"\n"
        cases.append(("PP2 schedule file m=2", 2, pipeline("file", 2, even, lambda s: s, 2, schedule_keys=keys), []))
    for i, (name, ranks, extra, sets) in enumerate(cases):
        cfg = write(d, f"{label}{i}.toml", base + extra)
        out = os.path.join(d, f"{label}{i}.jsonl")
        run(ranks, cfg, "--metrics", out, *sets)
        compare(f"qwen3 {label}: {name}", ref, losses(out), RTOL)
    return ref


def resume(d, ref):
    ck = os.path.join(d, "ck")
    cfg = write(d, "resume.toml", tiny_qwen3(name="resume", layers=LAYERS) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n')
    run(1, cfg, "--steps", "12", "--metrics", os.path.join(d, "part.jsonl"))
    run(1, cfg, "--resume", os.path.join(ck, "step_00000010.h5"), "--metrics", os.path.join(d, "same.jsonl"),
        "--set", f'checkpoint.dir="{ck}_same"')
    got = [m["loss"] for m in metrics(os.path.join(d, "same.jsonl"))]
    if got != ref[10:]:
        fail(f"qwen3: resumed losses {got} differ from the uninterrupted run {ref[10:]}")
    print("ok  qwen3: --resume from step 10 on one process continues bit-for-bit")
    out = os.path.join(d, "cross.jsonl")
    run(4, cfg, "--resume", os.path.join(ck, "step_00000010.h5"), "--metrics", out, *mesh(pp=2, dp=2, m=2, zero=1),
        "--set", f'checkpoint.dir="{ck}_cross"')
    compare("qwen3: resume a one-process checkpoint under PP2xDP2 ZeRO-1", ref[10:], losses(out), RTOL)

    names = subprocess.run(["h5ls", "-r", os.path.join(ck, "step_00000010.h5")], capture_output=True,
                           text=True).stdout
    for want in ("/params/model.embed_tokens.weight", "/params/model.layers.3.self_attn.q_proj.weight",
                 "/params/model.layers.0.self_attn.k_norm.weight", "/params/model.layers.2.mlp.gate_proj.weight",
                 "/params/model.layers.1.post_attention_layernorm.weight", "/params/model.norm.weight",
                 "/params/lm_head.weight"):
        if want not in names:
            fail(f"qwen3 checkpoint lacks {want}:\n{names}")
    print("ok  qwen3 checkpoint tensors carry Hugging Face's state-dict names")


def learns(d):
    cfg = write(d, "learn.toml", tiny_qwen3(name="learn", steps=300, layers=2))
    run(1, cfg, "--metrics", os.path.join(d, "learn.jsonl"))
    l = losses(os.path.join(d, "learn.jsonl"))
    tail = sum(l[-10:]) / 10
    if not (abs(l[0] - 5.545) < 0.05 and tail < 3.4):
        fail(f"qwen3: first loss {l[0]:.3f} (expected ln 256 = 5.545), mean of last 10 {tail:.3f} (expected < 3.4)")
    print(f"ok  tiny qwen3 learns: loss {l[0]:.3f} -> mean of last 10 steps {tail:.3f} (< 3.4)")


def errors(d):
    """Bad qwen3 keys and unknown segment names end the job with exit 2 and a message naming file, line, key."""
    base = tiny_qwen3(name="bad", layers=LAYERS)
    cases = [
        ("n_kv_heads not dividing n_heads", base.replace("n_kv_heads = 2", "n_kv_heads = 3"),
         "model.n_kv_heads: n_kv_heads (3) must divide n_heads (4)"),
        ("odd head_dim", base.replace("head_dim = 8", "head_dim = 7"), "model.head_dim: head_dim (7) must be even"),
        ("unknown key", base.replace("d_ff = 48", "d_ff = 48\nn_expert = 4"), "model.n_expert"),
        ("unknown segment name", base + annotate_segments([("model.embed_tokens", "model.layers.1.attn"),
                                                           ("model.layers.1.mlp", "head")]),
         'annotate.0.segments: the qwen3 model has no segment "model.layers.1.attn"'),
    ]
    for i, (name, text, want) in enumerate(cases):
        p = run(2, write(d, f"bad{i}.toml", text), check=False)
        out = p.stdout + p.stderr
        if p.returncode != 2 or want not in out or "bad" + str(i) + ".toml:" not in out:
            fail(f"qwen3 {name}: expected exit 2 and '{want}' with the file location, got {p.returncode}:\n{out}")
        print(f"ok  qwen3 {name}: exit 2, {want}")


def main():
    d = tempdir()
    errors(d)
    ref = equivalence(d, tied=False)
    equivalence(d, tied=True)
    resume(d, ref)
    learns(d)


if __name__ == "__main__":
    main()
