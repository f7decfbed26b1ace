"""bf16 mixed precision (job.precision = "bf16"): every strategy of a bf16 run equals the one-process bf16 run.

The matmuls of linear layers take bf16-rounded operands with fp32 accumulation; master weights, optimizer,
norms, softmax and loss stay fp32. Tolerance: bf16 rounding turns an fp32 last-bit difference (a reduction in
another order, which fp32 keeps near 1e-8 over 20 steps) into a bf16 last-bit flip, 2^16 times larger, with a
probability of about 2^-16 per rounded value, and each flip grows like any perturbation of training; measured,
strategies stay within 5e-6 to 1.5e-4 of one process. They are held to 5e-4 here, while the bf16 run itself is
1e-3 and more away from the fp32 run (asserted, so that the comparison sees bf16). Compared over 20 steps: GPT-2 DP2, PP2 x DP2 under 1F1B and DualPipeV, DP2 ZeRO-3; Qwen3
DP2 and ZeRO-3; Qwen3-MoE EP2 x DP2. A bf16 checkpoint resumes bit for bit. The start line names the matmul path
(oneDNN where the processor has bf16 instructions; PIPER_BF16_GEMM=rounded forces sgemm of rounded operands,
which trains alike). job.precision = "fp16" is an error (exit 2)."""
import os

from common import compare, fail, losses, mesh, run, tempdir, tiny_gpt, tiny_qwen3, tiny_qwen3_moe, write

RTOL_BF16 = 5e-4


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


def main():
    d = tempdir()
    gpt = bf16(tiny_gpt())
    ref, p = train(d, "gpt", gpt)
    if "precision bf16: matmuls through " not in p.stdout:
        fail(f"the start lines do not name the bf16 matmul path:\n{p.stdout}")
    print("ok  start line: " + next(line for line in p.stdout.splitlines() if line.startswith("precision bf16")))
    compare("GPT-2 bf16 DP2", ref, train(d, "gpt-dp2", gpt, 2, mesh(dp=2))[0], RTOL_BF16)
    for schedule in ("1f1b", "dualpipev"):
        compare(f"GPT-2 bf16 PP2 x DP2 {schedule}", ref,
                train(d, f"gpt-pp2-dp2-{schedule}", gpt, 4, mesh(pp=2, dp=2, m=4, schedule=schedule))[0], RTOL_BF16)
    compare("GPT-2 bf16 DP2 ZeRO-3", ref, train(d, "gpt-z3", gpt, 2, mesh(dp=2, zero=3))[0], RTOL_BF16)

    q = tiny_qwen3()
    fp32, _ = train(d, "q-fp32", q)
    qref, _ = train(d, "q", bf16(q))
    away = max(abs(a - b) / abs(a) for a, b in zip(fp32, qref))
    if away < 2 * RTOL_BF16:
        fail(f"Qwen3: the bf16 run is only {away:.2e} from the fp32 run: the tolerance {RTOL_BF16} would not tell them apart")
    print(f"ok  Qwen3 bf16 is {away:.2e} from fp32 (final losses {qref[-1]:.5f} and {fp32[-1]:.5f})")
    compare("Qwen3 bf16 DP2", qref, train(d, "q-dp2", bf16(q), 2, mesh(dp=2))[0], RTOL_BF16)
    compare("Qwen3 bf16 DP2 ZeRO-3", qref, train(d, "q-z3", bf16(q), 2, mesh(dp=2, zero=3))[0], RTOL_BF16)

    moe = bf16(tiny_qwen3_moe())
    mref, _ = train(d, "moe", moe)
    compare("Qwen3-MoE bf16 EP2 x DP2", mref, train(d, "moe-ep2", moe, 2, mesh(dp=2) + ["--set", "mesh.ep=2"])[0],
            RTOL_BF16)

    # A bf16 checkpoint resumes bit for bit under the same strategy.
    ck = os.path.join(d, "ck")
    saved = bf16(q) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n'
    train(d, "q-ck", saved, 2, mesh(dp=2) + ["--steps", "10"])
    whole, _ = train(d, "q-whole", bf16(q), 2, mesh(dp=2))
    resumed, _ = train(d, "q-resumed", saved, 2, mesh(dp=2) + ["--resume", os.path.join(ck, "step_00000010.h5")])
    compare("Qwen3 bf16 DP2 resumed at step 10 (bit for bit)", whole[10:], resumed, 0.0)

    # The path without bf16 instructions: sgemm of rounded operands trains alike.
    rounded, p = train(d, "q-rounded", bf16(q), env={"PIPER_BF16_GEMM": "rounded"})
    if "OpenBLAS sgemm of bf16-rounded operands" not in p.stdout:
        fail(f"PIPER_BF16_GEMM=rounded: the start lines do not name the rounded path:\n{p.stdout}")
    compare("Qwen3 bf16 through sgemm of rounded operands", qref, rounded, 2e-3)

    bad = write(d, "bad.toml", q.replace("[job]\n", '[job]\nprecision = "fp16"\n', 1))
    p = run(1, bad, check=False)
    if p.returncode != 2 or "precision" not in p.stderr:
        fail(f'job.precision = "fp16": exit {p.returncode}, expected 2 with a message naming it\n{p.stderr}')
    print("ok  job.precision = \"fp16\" is refused: " + next(line for line in p.stderr.splitlines() if "precision" in line))


if __name__ == "__main__":
    main()
