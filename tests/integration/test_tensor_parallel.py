"""Tensor parallelism (the `tp` directive, [mesh] tp): Qwen3's and GPT-2's attention and MLP halves split over a
group of ranks in the Megatron layout (q, k, v, gate, up by output rows; o, down by input columns; key/value heads
copied when fewer than the group), each partial output and input gradient summed by an all-reduce node on the
group's stream. The embeddings and LM heads are vocabulary-parallel: the cross-entropy gathers 3 statistics a
token, never the logits. Every run equals the one-process run within 1e-5 over 20 steps: Qwen3 TP2 and TP4 (4
key/value heads, and 2 over a group of 4), TP2 with the head tied to the embedding, GPT-2 TP2, TP4, TP2 x PP2,
TP2 x PP2 x DP2 under 1F1B and DualPipeV, TP2 x DP2 ZeRO-3 and its TP2 checkpoint resumed as one process and TP4,
Qwen3 TP2 x DP2 with ZeRO-1 and ZeRO-3, TP2 x PP2 x DP2 under 1F1B and DualPipeV, TP2 x PP2 under GPipe, ZB-H1
and interleaved 1F1B with and without sequence parallelism, sequence parallelism with full and selective recompute; on Qwen3-MoE (dropless and with
capacity) TP2, TP2 folded with EP2 and TP2 x DP2 folded with EP2, in losses, balance losses, dropped assignments
and gradient norms (each rank of a group routes its share of the sequences to the experts). A TP2 checkpoint
resumes as one process and as TP4 to the same losses as the run that never stopped. A group that does not divide
the heads is an error (exit 2). configs/qwen3-70b-tp8-pp8.toml (a Llama-3-70B-shaped Qwen3 on TP8 x PP8 x DP16,
interleaved 1F1B) compiles for 1,024 ranks in under 10 s with every rank's memory, and --fit-memory 80GiB answers
for it."""
import glob
import json
import os
import subprocess

from common import (PIPER, compare, dry_run_json, fail, losses, mesh, metrics, run, tempdir, tiny_gpt, tiny_qwen3,
                    tiny_qwen3_moe, write)

STEPS = 20
RTOL = 1e-5


def tp(n):
    return ["--set", f"mesh.tp={n}"]


def train(d, name, text, ranks=1, args=(), steps=STEPS):
    cfg = write(d, f"{name}.toml", text)
    out = os.path.join(d, f"{name}.jsonl")
    run(ranks, cfg, "--steps", str(steps), "--metrics", out, *args, timeout=600)
    return losses(out)


def tp_sums(d, name, ranks, args, rows=None):
    """The all-reduce instructions on the tp stream in the plans of d/name.toml on `ranks` ranks. With `rows` (tokens
    of a microbatch), every all-gather on the tp stream must carry 3 floats a row (the cross-entropy statistics,
    never the logits)."""
    out = os.path.join(d, name + "-plans")
    subprocess.run([PIPER, "--config", os.path.join(d, f"{name}.toml"), "--dry-run", "--world", str(ranks),
                    "--dump-plan", out, *args], check=True, stdout=subprocess.DEVNULL)
    n = 0
    for p in glob.glob(os.path.join(out, "plan_set*.txt")):
        text = open(p).read()
        streams = [line for line in text.splitlines() if line.startswith("streams:")]
        n += sum(1 for line in text.splitlines() if "[tp] all_reduce" in line)
        gathers = [int(line.split("count=")[1].split()[0]) for line in text.splitlines() if "[tp] all_gather" in line]
        if rows is not None and (not gathers or any(c != 3 * rows for c in gathers)):
            fail(f"{name}: the tp all-gathers carry {gathers} floats, not the {3 * rows} of the statistics")
        if not streams or "tp" not in streams[0]:
            fail(f"{name}: the plan has no tp stream: {streams}")
    return n


def resumes(d, label, name, text, ref):
    """TP2 to step 10, then one process and TP4 from its checkpoint, each against the run that never stopped."""
    ck = os.path.join(d, f"{name}-ck")
    saved = text + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n'
    train(d, f"{name}-tp2-ck", saved, 2, tp(2), steps=10)
    for ranks in (1, 4):
        got = train(d, f"{name}-resume-{ranks}", saved, ranks, ["--resume", os.path.join(ck, "step_00000010.h5")] +
                    (tp(4) if ranks == 4 else []))
        compare(f"{label} TP2 -> {'one process' if ranks == 1 else 'TP4'} resume (steps 11-20)", ref[10:], got, RTOL)


def main():
    d = tempdir()
    q = tiny_qwen3("q")  # 4 query heads over 2 key/value heads
    ref = train(d, "one", q)
    compare("Qwen3 TP2 (2 kv heads split)", ref, train(d, "tp2", q, 2, tp(2)), RTOL)
    if tp_sums(d, "tp2", 2, tp(2), rows=16 * 16) == 0:
        fail("TP2: no all-reduce on the tp stream in the plans")
    print("ok  TP2 plans: all-reduces on the tp stream; the vocabulary-parallel head gathers 3 floats a token")
    tied = q.replace("tie_embeddings = false", "tie_embeddings = true")
    compare("Qwen3 TP2, LM head tied to the embedding", train(d, "one-tied", tied),
            train(d, "tp2-tied", tied, 2, tp(2)), RTOL)
    compare("Qwen3 TP4 (2 kv heads copied)", ref, train(d, "tp4", q, 4, tp(4)), RTOL)

    more = q.replace("n_kv_heads = 2", "n_kv_heads = 4")
    ref_more = train(d, "one-mha", more)
    compare("Qwen3 TP2 (4 kv heads split)", ref_more, train(d, "tp2-mha", more, 2, tp(2)), RTOL)

    gpt = tiny_gpt("g")  # 4 heads, fused qkv, biases, the LM head tied to the embedding
    ref_gpt = train(d, "gpt-one", gpt)
    for k in (2, 4):
        compare(f"GPT-2 TP{k}", ref_gpt, train(d, f"gpt-tp{k}", gpt, k, tp(k)), RTOL)
    compare("GPT-2 TP2 x PP2 1f1b", ref_gpt, train(d, "gpt-tp2-pp2", gpt, 4, mesh(pp=2, m=2) + tp(2)), RTOL)
    for schedule in ("1f1b", "dualpipev"):
        compare(f"GPT-2 TP2 x PP2 x DP2 {schedule}", ref_gpt,
                train(d, f"gpt-tp2-pp2-dp2-{schedule}", gpt, 8, mesh(pp=2, dp=2, m=4, schedule=schedule) + tp(2)), RTOL)
    compare("GPT-2 TP2 x DP2 ZeRO-3", ref_gpt, train(d, "gpt-tp2-dp2-z3", gpt, 4, mesh(dp=2, zero=3) + tp(2)), RTOL)
    resumes(d, "GPT-2", "gpt", gpt, ref_gpt)

    # sequence parallelism: the activations between split segments in parts, reduce-scattered and gathered
    sp = ["--set", "mesh.sequence=true"]
    compare("Qwen3 TP2 sequence-parallel", ref, train(d, "tp2-sp", q, 2, tp(2) + sp), RTOL)
    plans = os.path.join(d, "tp2-sp-plans")
    subprocess.run([PIPER, "--config", os.path.join(d, "tp2-sp.toml"), "--dry-run", "--world", "2", "--dump-plan",
                    plans] + tp(2) + sp, check=True, stdout=subprocess.DEVNULL)
    text = open(os.path.join(plans, "plan_set0.txt")).read()
    if text.count("[tp] reduce_scatter") == 0 or text.count("[tp] all_gather") < 2 or "regathered" not in text:
        fail("TP2 sequence-parallel: the plan should reduce-scatter, gather, and gather again for the backward")
    compare("Qwen3 TP2 sequence-parallel, selective recompute", ref,
            train(d, "tp2-sp-sel", q, 2, tp(2) + sp + ["--set", 'mesh.recompute="selective"']), RTOL)
    compare("Qwen3 TP2 x PP2 x DP2 sequence-parallel 1f1b", ref,
            train(d, "tp2-sp-pp2-dp2", q, 8, mesh(pp=2, dp=2, m=4) + tp(2) + sp), RTOL)
    compare("GPT-2 TP2 sequence-parallel", ref_gpt, train(d, "gpt-tp2-sp", gpt, 2, tp(2) + sp), RTOL)
    compare("Qwen3 TP2 sequence-parallel, full recompute", ref,
            train(d, "tp2-sp-full", q, 2, tp(2) + sp + ["--set", 'mesh.recompute="full"']), RTOL)
    # the other schedules, with and without sequence parallelism: GPipe, ZB-H1 (split backward), interleaved 1F1B
    for schedule in ("gpipe", "zb-h1", "interleaved-1f1b"):
        chunks = ["--set", "mesh.chunks=2"] if schedule == "interleaved-1f1b" else []
        for label, extra in (("", []), (" sequence-parallel", sp)):
            compare(f"Qwen3 TP2 x PP2 {schedule}{label}", ref,
                    train(d, f"tp2-pp2-{schedule}{len(extra)}", q, 4,
                          mesh(pp=2, m=4, schedule=schedule) + chunks + tp(2) + extra), RTOL)
    peaks = {}
    for label, extra in (("TP2", []), ("TP2 sequence-parallel", sp)):
        summary = os.path.join(d, f"small-{len(extra)}.json")
        run(2, write(d, f"small-{len(extra)}.toml", open("configs/qwen3-small.toml").read()), "--steps", "2",
            "--report-json", summary, *(tp(2) + extra), timeout=600)
        m = json.load(open(summary))["ranks"][0]["memory"]
        got, est = m["peak_bytes"]["activations"], m["estimated_peak_bytes"]["activations"]
        if abs(est - got) > 0.02 * got:
            fail(f"qwen3-small {label}: activation estimate {est} not within 2% of the measured {got}")
        peaks[label] = got
    if not peaks["TP2 sequence-parallel"] < peaks["TP2"]:
        fail(f"qwen3-small: sequence parallelism should lower the activation peak: {peaks}")
    print(f"ok  qwen3-small TP2 activation peak {peaks['TP2'] / 2**20:.1f} MiB, sequence-parallel "
          f"{peaks['TP2 sequence-parallel'] / 2**20:.1f} MiB; estimates within 2%")

    for zero in (1, 3):
        compare(f"Qwen3 TP2 x DP2 ZeRO-{zero}", ref, train(d, f"tp2-dp2-z{zero}", q, 4, mesh(dp=2, zero=zero) + tp(2)), RTOL)
    for schedule in ("1f1b", "dualpipev"):
        compare(f"Qwen3 TP2 x PP2 x DP2 {schedule}", ref,
                train(d, f"tp2-pp2-dp2-{schedule}", q, 8, mesh(pp=2, dp=2, m=4, schedule=schedule) + tp(2)), RTOL)

    # folded with experts: attention tensor-parallel, each rank of a group routing its share of the sequences to
    # experts spread over the same ranks (EP2), dropless and with capacity; the balance loss and routing statistics too
    for capacity in (0.0, 0.6):
        moe = tiny_qwen3_moe(f"m{capacity}", capacity)
        one = os.path.join(d, f"moe-one-{capacity}.jsonl")
        run(1, write(d, f"moe-one-{capacity}.toml", moe), "--metrics", one)
        for label, ranks, extra in (("TP2", 2, tp(2)), ("TP2 folded with EP2", 2, tp(2) + ["--set", "mesh.ep=2"]),
                                    ("TP2 x DP2 folded with EP2", 4, mesh(dp=2, zero=1) + tp(2) + ["--set", "mesh.ep=2"])):
            name = f"moe-{label.replace(' ', '-')}-{capacity}"
            got = os.path.join(d, f"{name}.jsonl")
            run(ranks, write(d, f"{name}.toml", moe), "--metrics", got, *extra)
            compare(f"Qwen3-MoE capacity {capacity} {label}", losses(one), losses(got), RTOL)
            a, b = metrics(one), metrics(got)
            for key in ("balance_loss", "moe_dropped", "grad_norm"):
                ra, rb = [m.get(key) for m in a], [m.get(key) for m in b]
                if any((x is None) != (y is None) or (x is not None and abs(x - y) > 1e-5 * max(abs(x), 1e-9))
                       for x, y in zip(ra, rb)):
                    fail(f"Qwen3-MoE capacity {capacity} {label}: {key} {rb} differs from one process {ra}")

    resumes(d, "Qwen3", "q", q, ref)

    # the plan of the real size: 1,024 ranks
    big = "configs/qwen3-70b-tp8-pp8.toml"
    doc = dry_run_json(big, "--world", "1024", timeout=120)
    sets = doc["device_sets"]
    if doc["world"] != 1024 or len(sets) != 8 or any(len(s["ranks"]) != 128 for s in sets):
        fail(f"{big}: expected 8 device sets of 128 ranks, got {[len(s['ranks']) for s in sets]}")
    if doc["compile_seconds"] >= 10:
        fail(f"{big}: the 1,024-rank plan compiled in {doc['compile_seconds']:.1f} s, over the 10 s bound")
    peaks = [s["memory"]["peak_total_bytes"] / 2**30 for s in sets]
    if not all(0 < p < 80 for p in peaks):
        fail(f"{big}: estimated peaks {peaks} GiB should fit 80 GiB")
    rows = dry_run_json(big, "--world", "1024", "--fit-memory", "80GiB", timeout=300)["fit_memory"]["rows"]
    fits = {(r["zero"], r["recompute"]): r["sequences"] for r in rows}
    if len(rows) != 12 or fits.get((1, "selective"), 0) < 1:
        fail(f"{big}: --fit-memory 80GiB should fit the job's one sequence per microbatch at ZeRO-1 with selective "
             f"recompute: {fits}")
    print(f"ok  {big}: 1,024 ranks compiled in {doc['compile_seconds']:.2f} s, peaks {min(peaks):.1f}-{max(peaks):.1f} "
          f"GiB a rank; --fit-memory 80GiB: ZeRO-1 selective fits {fits[(1, 'selective')]} sequence(s)")

    # a group that does not divide the heads
    p = run(3, write(d, "tp3.toml", q), "--steps", "1", *tp(3), check=False)
    if p.returncode != 2 or "cannot be split over 3 ranks" not in p.stderr:
        fail(f"TP3 over 4 heads: exit {p.returncode}\n{p.stderr}")
    print("ok  TP3 over 4 query heads is refused (exit 2)")


if __name__ == "__main__":
    main()
