"""bf16 mixed precision (job.precision = "bf16"): every strategy of a bf16 run equals the one-process bf16 run.

The matmuls of linear layers and of attention take bf16-rounded operands with fp32 accumulation, and the blocks'
stashes (with their inputs) are held in bf16; master weights, optimizer, norms, softmax and loss stay fp32. Tolerance: bf16
rounding turns an fp32 last-bit difference (a reduction in another order, which fp32 keeps near 1e-8 over 20
steps) into a bf16 last-bit flip, 2^16 times larger, with a probability of about 2^-16 per rounded value, and each
flip grows like any perturbation of training; measured, strategies stay within 5e-6 to 1.5e-4 of one process over
20 steps, and are held to 5e-4 here. That each ran in bf16 is checked at step 1, before any update: there every
strategy gives the one-process bf16 loss within 1e-7 (measured: the same bits, and 1.8e-9 under TP2, whose split
products sum in another order), while the fp32 run is 1.5e-7 and more away (measured 3.3e-6 for GPT-2, 5.7e-7 for
Qwen3, whose roundings happen to cancel more at step 1 now that attention's are among them); after 20
steps the bf16 loss is within 2% of the fp32 loss (bench/bf16.py --curves compares 300 steps on 3 seeds).

Where a pass's fp32 view would pass a twelfth of a microbatch's held stashes, it runs by pieces of at least 512 rows
(each piece's stash held after the one before, so that the view holds one piece): a longer Qwen3 (whose attention
view keeps its norms' statistics and log-sum-exps, a large share of so narrow a model's stash) compares DP2, ZB-H1 and
PP2 x DP2 with pieces to one process, and it, configs/quickstart.toml and configs/qwen3-small.toml (4 layers) hold
their activation peak in bf16 at most 0.55 of fp32's (configs/qwen3-moe-small.toml at most 0.62: its routed segments'
passes go whole), the compiler's estimate within 2% of the measured peak.

Compared: GPT-2 DP2, PP2 x DP2 under 1F1B and DualPipeV, DP2 ZeRO-3, PP2 under ZB-H1 (backward input and weight
apart, each reading the bf16 stash) and TP2; Qwen3 DP2 and ZeRO-3; Qwen3-MoE EP2 x DP2, whose routed rows are bf16
(the dry run says 2 · d_model bytes a row, 4 · d_model in fp32), within 2% of fp32 after 20 steps. A bf16 checkpoint resumes
bit for bit, and as an fp32 run (it holds the fp32 master weights). The start line and --report-json name the matmul path (oneDNN where the processor has bf16
instructions; PIPER_BF16_GEMM=rounded forces sgemm of rounded operands, which trains alike), and whether attention
runs on AMX tiles (where the processor has them: on GPT-2 and Qwen3 with sequences and heads of 64 and 32 it trains
as oneDNN's gemm does, PIPER_BF16_ATTENTION=gemm; another value is an error, exit 2), each metrics line says
"precision": "bf16", and so does the dry run. job.precision = "fp16" is an error (exit 2)."""
import json
import os
import re
import subprocess

from common import (PIPER, ROOT, compare, dry_run_json, fail, losses, mesh, run, tempdir, tiny_gpt, tiny_qwen3,
                    tiny_qwen3_moe, write)

RTOL_BF16 = 5e-4
STEP_ONE = 1e-7  # at step 1 a strategy of the bf16 run is the one-process bf16 run; fp32 is further than 1.5e-7


def same_run(name, ref, got):
    """The one-process bf16 losses `ref` against a strategy's `got`: every step within RTOL_BF16, step 1 within
    STEP_ONE."""
    compare(name, ref, got, RTOL_BF16)
    if abs(got[0] - ref[0]) > STEP_ONE * abs(ref[0]):
        fail(f"{name}: step 1 loss {got[0]!r} is not the one-process bf16 loss {ref[0]!r} (within {STEP_ONE})")
    print(f"    step 1: {abs(got[0] - ref[0]) / abs(ref[0]):.2e} from the one-process bf16 loss")


def bf16(text):
    return text.replace("[job]\n", '[job]\nprecision = "bf16"\n', 1)


def train(d, name, text, ranks=1, args=(), env=None):
    cfg = write(d, f"{name}.toml", text)
    out = os.path.join(d, f"{name}.jsonl")
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        p = run(ranks, cfg, "--metrics", out, *args, timeout=600)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return losses(out), p


def peak_act(config, precision):
    """The measured and estimated activation peaks (bytes) of one step of the job file `config` in `precision`."""
    p = run(1, config, "--steps", "1", "--set", f'job.precision="{precision}"', "--set", 'checkpoint.dir=""',
            "--set", "job.threads=1")
    line = next(l for l in p.stdout.splitlines() if l.startswith("memory rank=0"))
    fields = dict(w.split("=", 1) for w in line.split()[1:])
    return int(fields["peak_act"]), int(fields["est_peak_act"])


def held_in_pieces(d, config, blocks):
    """The plan of `config` (bf16, one process) holds the stashes of the blocks whose names end in `blocks` in pieces:
    the dump's forward of each says pieces=N with N > 1, and its view is smaller than its held stash."""
    dump = os.path.join(d, "plan-dump")
    subprocess.run([PIPER, "--config", config, "--dry-run", "--dump-plan", dump], check=True, capture_output=True)
    sizes, pieces = {}, {}
    for line in open(os.path.join(dump, "plan_set0.txt")):
        words = line.split()
        if len(words) >= 4 and words[0].startswith("%") and words[3] == "B":
            sizes[words[1]] = int(words[2])
        m = re.search(r"\[compute\] forward (\S+) .*stash=%(\d+) view=%(\d+) pieces=(\d+)", line)
        if m and m.group(1).endswith(blocks):
            pieces[m.group(1)] = (int(m.group(4)), m.group(2), m.group(3))
    ids = {line.split()[0][1:]: line.split()[1] for line in open(os.path.join(dump, "plan_set0.txt"))
           if line.split() and line.split()[0].startswith("%")}
    whole = {block: n for block, (n, stash, view) in pieces.items()
             if n < 2 or sizes[ids[view]] >= sizes[ids[stash]]}
    if not pieces or whole:
        fail(f"{config}: not every {blocks} block's passes go by pieces: {pieces} ({whole} do not)")
    print(f"ok  {os.path.basename(config)}: {len(pieces)} {blocks} blocks' passes by pieces "
          f"({', '.join(sorted({str(n) for n, _, _ in pieces.values()}))} each; each view smaller than its held stash)")


def peak_ratio(configs, most=0.55):
    """bf16's activation peak at most `most` of fp32's, the estimates within 2% of the measurements."""
    for config in configs:
        (f, fe), (b, be) = (peak_act(config, p) for p in ("fp32", "bf16"))
        if b > most * f or abs(be - b) > 0.02 * b or abs(fe - f) > 0.02 * f:
            fail(f"{os.path.basename(config)}: activation peak bf16 {b} (estimate {be}) against fp32 {f} (estimate {fe}): "
                 f"{b / f:.3f} of fp32's, at most {most} wanted, estimates within 2%")
        print(f"ok  {os.path.basename(config)}: bf16's activation peak {b / 2**20:.1f} MiB is {b / f:.3f} of fp32's {f / 2**20:.1f} MiB "
              f"(estimates {be / b:.4f} and {fe / f:.4f} of the measurements)")


def main():
    d = tempdir()
    gpt = bf16(tiny_gpt())
    report = os.path.join(d, "report.json")
    ref, p = train(d, "gpt", gpt, args=["--report-json", report])
    if "precision bf16: matmuls through " not in p.stdout:
        fail(f"the start lines do not name the bf16 matmul path:\n{p.stdout}")
    print("ok  start line: " + next(line for line in p.stdout.splitlines() if line.startswith("precision bf16")))
    doc = json.load(open(report))
    lines = [json.loads(line) for line in open(os.path.join(d, "gpt.jsonl"))]
    if doc.get("precision") != "bf16" or not doc.get("bf16_matmuls") or any(m.get("precision") != "bf16" for m in lines):
        fail(f"the report ({doc.get('precision')}, {doc.get('bf16_matmuls')}) or the metrics lines do not say bf16")
    print(f"ok  --report-json: precision bf16, bf16_matmuls \"{doc['bf16_matmuls']}\"; every metrics line says bf16")
    same_run("GPT-2 bf16 DP2", ref, train(d, "gpt-dp2", gpt, 2, mesh(dp=2))[0])
    for schedule in ("1f1b", "dualpipev"):
        same_run(f"GPT-2 bf16 PP2 x DP2 {schedule}", ref,
                 train(d, f"gpt-pp2-dp2-{schedule}", gpt, 4, mesh(pp=2, dp=2, m=4, schedule=schedule))[0])
    same_run("GPT-2 bf16 DP2 ZeRO-3", ref, train(d, "gpt-z3", gpt, 2, mesh(dp=2, zero=3))[0])
    same_run("GPT-2 bf16 PP2 ZB-H1 (backward split in two)", ref,
             train(d, "gpt-zb", gpt, 2, mesh(pp=2, m=4, schedule="zb-h1"))[0])
    same_run("GPT-2 bf16 TP2", ref, train(d, "gpt-tp2", gpt, 2, ["--set", "mesh.tp=2"])[0])

    # A longer Qwen3 (sequences of 64, a batch of 32, two layers): its attention passes run in pieces of at least
    # 512 rows (its view keeps the statistics of its three norms per row and head and the log-sum-exps, over a
    # twelfth of its stash at width 32; its MLP's view only the norm's statistics, one piece), fewer per replica
    # under DP2 and per microbatch under ZB-H1's split backward, whose
    # BI→BW stash is in pieces too, each piece's stash held after the one before; every strategy is still the
    # one-process bf16 run. 10 steps: with 8 times the rounded values of the tiny run, strategies part faster.
    long = bf16(tiny_qwen3(layers=2, batch=32)).replace("seq_len = 16", "seq_len = 64")
    ten = ["--steps", "10"]
    lref, _ = train(d, "long", long, args=ten)
    same_run("Qwen3 bf16 in pieces, DP2", lref, train(d, "long-dp2", long, 2, mesh(dp=2) + ten)[0])
    same_run("Qwen3 bf16 in pieces, PP2 ZB-H1", lref,
             train(d, "long-zb", long, 2, mesh(pp=2, m=2, schedule="zb-h1") + ten)[0])
    same_run("Qwen3 bf16 in pieces, PP2 x DP2 1f1b (one piece each)", lref,
             train(d, "long-pp2-dp2", long, 4, mesh(pp=2, dp=2, m=2) + ten)[0])
    held_in_pieces(d, write(d, "long.toml", long), ".self_attn")
    peak_ratio([os.path.join(ROOT, "configs", c) for c in ("quickstart.toml", "qwen3-small.toml")])

    q = tiny_qwen3()
    qref, _ = train(d, "q", bf16(q))
    for label, text, bf in (("GPT-2", tiny_gpt(), ref), ("Qwen3", q, qref)):
        fp32, _ = train(d, f"{label}-fp32", text)
        away = abs(bf[0] - fp32[0]) / abs(fp32[0])
        if away < 1.5 * STEP_ONE:
            fail(f"{label}: at step 1 the bf16 run is only {away:.2e} from the fp32 run: bf16 did not take effect")
        if abs(bf[-1] - fp32[-1]) > 0.02 * fp32[-1]:
            fail(f"{label}: after {len(bf)} steps the bf16 loss {bf[-1]} is not within 2% of fp32's {fp32[-1]}")
        print(f"ok  {label}: at step 1 bf16 is {away:.2e} from fp32; after {len(bf)} steps {bf[-1]:.5f} against "
              f"{fp32[-1]:.5f} (within 2%)")
    same_run("Qwen3 bf16 DP2", qref, train(d, "q-dp2", bf16(q), 2, mesh(dp=2))[0])
    same_run("Qwen3 bf16 DP2 ZeRO-3", qref, train(d, "q-z3", bf16(q), 2, mesh(dp=2, zero=3))[0])

    moe = bf16(tiny_qwen3_moe())
    mref, _ = train(d, "moe", moe)
    same_run("Qwen3-MoE bf16 EP2 x DP2", mref, train(d, "moe-ep2", moe, 2, mesh(dp=2) + ["--set", "mesh.ep=2"])[0])
    # Its routed rows (the experts' inputs and outputs and their gradients) are bf16: half the bytes held and
    # exchanged, as the dry run says; the run is still within 2% of fp32's after 20 steps.
    widths = {}
    for name, text in (("fp32", tiny_qwen3_moe()), ("bf16", moe)):
        widths[name] = dry_run_json(write(d, f"moe-dry-{name}.toml", text))["routed_rows"]["bytes_per_row"]
    if widths != {"fp32": 4 * 32, "bf16": 2 * 32}:
        fail(f"routed rows of d_model 32: {widths} bytes each, expected 128 in fp32 and 64 in bf16")
    print(f"ok  a routed row of d_model 32 is {widths['bf16']} bytes in bf16, {widths['fp32']} in fp32 (the dry run)")
    mfp32, _ = train(d, "moe-fp32", tiny_qwen3_moe())
    if abs(mref[-1] - mfp32[-1]) > 0.02 * mfp32[-1] or abs(mref[0] - mfp32[0]) < 1.5 * STEP_ONE * abs(mfp32[0]):
        fail(f"Qwen3-MoE: bf16 losses {mref[0]}..{mref[-1]} against fp32's {mfp32[0]}..{mfp32[-1]}: not a bf16 run "
             "within 2% of fp32")
    print(f"ok  Qwen3-MoE: after {len(mref)} steps bf16 {mref[-1]:.5f} against fp32 {mfp32[-1]:.5f} (within 2%)")
    # The experts' SwiGLU stash (g, u, silu(g)·u) and the gradients of g and u are bf16 activations too; a routed
    # segment's passes do not go by pieces, so its views keep the dispatch's fp32 parts (measured 0.600).
    peak_ratio([os.path.join(ROOT, "configs", "qwen3-moe-small.toml")], most=0.62)

    # A bf16 checkpoint resumes bit for bit under the same strategy.
    ck = os.path.join(d, "ck")
    saved = bf16(q) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n'
    train(d, "q-ck", saved, 2, mesh(dp=2) + ["--steps", "10"])
    whole, _ = train(d, "q-whole", bf16(q), 2, mesh(dp=2))
    resumed, _ = train(d, "q-resumed", saved, 2, mesh(dp=2) + ["--resume", os.path.join(ck, "step_00000010.h5")])
    compare("Qwen3 bf16 DP2 resumed at step 10 (bit for bit)", whole[10:], resumed, 0.0)
    # The checkpoint holds fp32 master weights and moments: an fp32 run resumes it too.
    as_fp32, _ = train(d, "q-resumed-fp32", saved.replace('precision = "bf16"', 'precision = "fp32"'), 1,
                       ["--resume", os.path.join(ck, "step_00000010.h5")])
    if len(as_fp32) != 10 or abs(as_fp32[0] - whole[10]) > 0.02 * whole[10]:
        fail(f"the bf16 checkpoint resumed in fp32 trains {as_fp32[:1]} at step 11, the bf16 run {whole[10]}")
    print(f"ok  the bf16 checkpoint resumes as an fp32 run: step 11 loss {as_fp32[0]:.5f} (bf16: {whole[10]:.5f})")

    # The path without bf16 instructions: sgemm of rounded operands trains alike.
    rounded, p = train(d, "q-rounded", bf16(q), env={"PIPER_BF16_GEMM": "rounded"})
    if "OpenBLAS sgemm of bf16-rounded operands" not in p.stdout:
        fail(f"PIPER_BF16_GEMM=rounded: the start lines do not name the rounded path:\n{p.stdout}")
    compare("Qwen3 bf16 through sgemm of rounded operands", qref, rounded, 2e-3)

    # Attention on AMX tiles (where the processor has them) trains as oneDNN's gemm does: shapes whose sequences and
    # heads are whole multiples of 32, on both attention kernels.
    amx = "amx_bf16" in open("/proc/cpuinfo").read()
    for name, text in (("gpt", gpt.replace("seq_len = 16", "seq_len = 64").replace("d_model = 32", "d_model = 64")
                        .replace("n_heads = 4", "n_heads = 2")),
                       ("qwen3", bf16(tiny_qwen3()).replace("seq_len = 16", "seq_len = 64")
                        .replace("head_dim = 8", "head_dim = 32"))):
        on_tiles, p = train(d, f"{name}-tiles", text)
        if amx != ("attention on AMX tiles" in p.stdout):
            fail(f"{name}: the start line {'does not name' if amx else 'names'} attention on AMX tiles on a processor "
                 f"{'with' if amx else 'without'} them:\n{p.stdout}")
        by_gemm, p = train(d, f"{name}-gemm", text, env={"PIPER_BF16_ATTENTION": "gemm"})
        if "attention on AMX tiles" in p.stdout:
            fail(f"{name}: PIPER_BF16_ATTENTION=gemm still names the tiles:\n{p.stdout}")
        compare(f"{name} bf16 attention on {'AMX tiles' if amx else 'oneDNN (no AMX here)'} against oneDNN's gemm",
                by_gemm, on_tiles, RTOL_BF16)
    cfg = write(d, "bad-attention.toml", gpt)
    saved_env = dict(os.environ)
    os.environ["PIPER_BF16_ATTENTION"] = "fast"
    try:
        p = run(1, cfg, check=False)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
    if p.returncode != 2 or "PIPER_BF16_ATTENTION" not in p.stderr:
        fail(f"PIPER_BF16_ATTENTION=fast: exit {p.returncode}, expected 2 with a message naming it\n{p.stderr}")
    print("ok  PIPER_BF16_ATTENTION=fast is refused: " +
          next(line for line in p.stderr.splitlines() if "PIPER_BF16_ATTENTION" in line))

    dry = subprocess.run([PIPER, "--config", write(d, "dry.toml", gpt), "--dry-run"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=60)
    if dry.returncode != 0 or "precision bf16: matmuls on bf16 operands" not in dry.stdout:
        fail(f"the dry run of a bf16 job does not say so (exit {dry.returncode}):\n{dry.stdout}")
    print("ok  the dry run says: " + next(line for line in dry.stdout.splitlines() if line.startswith("precision")))

    bad = write(d, "bad.toml", q.replace("[job]\n", '[job]\nprecision = "fp16"\n', 1))
    p = run(1, bad, check=False)
    if p.returncode != 2 or "precision" not in p.stderr:
        fail(f'job.precision = "fp16": exit {p.returncode}, expected 2 with a message naming it\n{p.stderr}')
    print("ok  job.precision = \"fp16\" is refused: " + next(line for line in p.stderr.splitlines() if "precision" in line))


if __name__ == "__main__":
    main()
