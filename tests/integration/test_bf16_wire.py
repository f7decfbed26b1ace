"""Gradient reductions in bf16 (job.grad_reduce = "bf16"): the data-parallel all-reduce and reduce-scatter of the
gradients travel as bf16 (half the bytes: the run's collective_bytes) and each sum is rounded to bf16.

Checked on a bf16 GPT-2 over 2 ranks: the run is not the fp32-reduction run (the sums were rounded) but stays
within 1e-3 of it over 20 steps (measured 6.6e-5); ZeRO-2 and ZeRO-3, whose reduce-scatter sums the same two
values per element as ZeRO-0's all-reduce, are within 5e-4 of it, the tolerance test_bf16.py states for a bf16 run's
strategies (measured: the same bits with -O3; ZeRO-3's buckets, which keep the matmul weights apart, sum the
gradient norm in another order, a last-bit difference that an -O1 build shows at step 6); PP2 x DP2
(4 microbatches, their gradients accumulated in fp32 before one reduction) is within 5e-4 of DP2 as well. ZeRO-0 sends exactly half the bytes of its fp32 reduction; the measured memory peak is the
estimate to the byte (the bf16 staging is counted). The start line and the dry run say so;
job.grad_reduce = "fp16" is an error (exit 2). A one-process run has no reduction and is the same either way.

ZeRO-3 in a bf16 run keeps the parameters that only matmuls read (ParamSpec::bf16_operand) in buckets of their own
and gathers those in bf16: the rounding the matmul would do, done before the wire, so the run is still the
one-process bf16 run (GPT-2, and Qwen3-MoE whose router and experts are such parameters: the same loss at step 1,
within 5e-4 over 20 steps), with fewer collective bytes than the same ZeRO-3 run in fp32 (norms, biases and the
embeddings, which other kernels read, are gathered in fp32)."""
import os
import subprocess

from common import PIPER, compare, fail, losses, mesh, report, run, tempdir, tiny_gpt, tiny_qwen3_moe, write

RTOL_FP32_REDUCE = 1e-3
RTOL_STRATEGY = 5e-4


def bf16(text, reduce="bf16"):
    return text.replace("[job]\n", f'[job]\nprecision = "bf16"\ngrad_reduce = "{reduce}"\n', 1)


def find(doc, key):
    """Every value of `key` anywhere in a JSON document."""
    out = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key:
                out.append(v)
            out += find(v, key)
    elif isinstance(doc, list):
        for v in doc:
            out += find(v, key)
    return out


def train(d, name, text, ranks, args=()):
    cfg = write(d, f"{name}.toml", text)
    out, rep = os.path.join(d, f"{name}.jsonl"), os.path.join(d, f"{name}.report.json")
    p = run(ranks, cfg, "--metrics", out, "--report-json", rep, *args, timeout=600)
    return losses(out), report(rep), p


def main():
    d = tempdir()
    fp32_reduce, fp32_doc, _ = train(d, "fp32-reduce", bf16(tiny_gpt(), "fp32"), 2, mesh(dp=2))
    ref, doc, p = train(d, "dp2", bf16(tiny_gpt()), 2, mesh(dp=2))
    line = next((l for l in p.stdout.splitlines() if l.startswith("gradient reductions in bf16")), None)
    if line is None:
        fail(f"the start lines do not say the gradient reductions are in bf16:\n{p.stdout}")
    print("ok  start line: " + line)
    if ref == fp32_reduce:
        fail("job.grad_reduce = \"bf16\" trained the same losses as the fp32 reduction: nothing was rounded")
    compare("GPT-2 bf16 DP2, reduced in bf16 against fp32", fp32_reduce, ref, RTOL_FP32_REDUCE)

    sent32, sent16 = find(fp32_doc, "collective_bytes"), find(doc, "collective_bytes")
    if not sent32 or not sent16 or any(2 * b != a for a, b in zip(sent32, sent16)):
        fail(f"collective bytes per rank: fp32 reduction {sent32}, bf16 {sent16}: not half")
    print(f"ok  collective bytes per rank: {sent32[0]} in fp32, {sent16[0]} in bf16")
    peak, est = find(doc, "peak_total_bytes"), find(doc, "estimated_peak_total_bytes")
    if not peak or peak != est:
        fail(f"measured peaks {peak} are not the estimates {est}")
    print(f"ok  memory peak {peak[0]} bytes, the estimate to the byte")

    for zero in (2, 3):
        got, zdoc, _ = train(d, f"z{zero}", bf16(tiny_gpt()), 2, mesh(dp=2, zero=zero))
        worst = compare(f"ZeRO-{zero} reduced in bf16, against ZeRO-0", ref, got, RTOL_STRATEGY)
        if find(zdoc, "peak_total_bytes") != find(zdoc, "estimated_peak_total_bytes"):
            fail(f"ZeRO-{zero}: the measured peak is not the estimate")
        print(f"ok  ZeRO-{zero} reduced in bf16: {'the ZeRO-0 losses to the bit' if worst == 0 else 'within 5e-4'}, "
              f"peak = estimate")
    got, _, _ = train(d, "pp2-dp2", bf16(tiny_gpt()), 4, mesh(pp=2, dp=2, m=4, schedule="1f1b"))
    compare("PP2 x DP2 1F1B reduced in bf16", ref, got, RTOL_STRATEGY)

    dry = subprocess.run([PIPER, "--config", write(d, "dry.toml", bf16(tiny_gpt())), "--dry-run", "--world", "2",
                          "--set", "mesh.dp=2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=60)
    if dry.returncode != 0 or "gradient reductions in bf16" not in dry.stdout:
        fail(f"the dry run of a bf16-reduction job does not say so (exit {dry.returncode}):\n{dry.stdout}")
    print("ok  the dry run says: " + next(l for l in dry.stdout.splitlines() if l.startswith("gradient reductions")))

    zero3_gathers(d)

    p = run(1, write(d, "bad.toml", bf16(tiny_gpt(), "fp16")), check=False)
    if p.returncode != 2 or "grad_reduce" not in p.stderr:
        fail(f'job.grad_reduce = "fp16": exit {p.returncode}, expected 2 with a message naming it\n{p.stderr}')
    print("ok  job.grad_reduce = \"fp16\" is refused: " + next(l for l in p.stderr.splitlines() if "grad_reduce" in l))


def zero3_gathers(d):
    """ZeRO-3 of a bf16 run: matmul-only parameters gathered in bf16, the run still the one-process bf16 run."""
    for label, text in (("GPT-2", tiny_gpt()), ("Qwen3-MoE", tiny_qwen3_moe())):
        one, _, _ = train(d, f"{label}-one", bf16(text, "fp32"), 1)
        z3, doc, _ = train(d, f"{label}-z3", bf16(text, "fp32"), 2, mesh(dp=2, zero=3))
        _, fp32_doc, _ = train(d, f"{label}-z3-fp32", text, 2, mesh(dp=2, zero=3))
        compare(f"{label} bf16 ZeRO-3 gathering in bf16", one, z3, RTOL_STRATEGY)
        if abs(z3[0] - one[0]) > 1e-6 * abs(one[0]):
            fail(f"{label} ZeRO-3: step 1 loss {z3[0]!r} is not the one-process bf16 loss {one[0]!r}")
        sent16, sent32 = find(doc, "collective_bytes"), find(fp32_doc, "collective_bytes")
        if not sent16 or not sent32 or not all(b < a for a, b in zip(sent32, sent16)):
            fail(f"{label} ZeRO-3 collective bytes: fp32 run {sent32}, bf16 run {sent16}: the bf16 gathers send no less")
        if find(doc, "peak_total_bytes") != find(doc, "estimated_peak_total_bytes"):
            fail(f"{label} ZeRO-3 bf16: the measured peak is not the estimate")
        print(f"ok  {label} ZeRO-3: step 1 the one-process bf16 loss; collective bytes per rank {sent16[0]} "
              f"against {sent32[0]} in fp32 ({sent16[0] / sent32[0]:.2f}); peak = estimate")


if __name__ == "__main__":
    main()
