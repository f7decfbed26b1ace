"""Tensor parallelism (the `tp` directive, [mesh] tp): Qwen3's attention and MLP halves split over a group of ranks
in the Megatron layout (q, k, v, gate, up by output rows; o, down by input columns; key/value heads copied when
fewer than the group), each partial output and input gradient summed by an all-reduce node on the group's stream.
Every run equals the one-process run within 1e-5 over 20 steps: TP2 and TP4 (4 key/value heads, and 2 over a
group of 4), TP2 x DP2 with ZeRO-1 and ZeRO-3, TP2 x PP2 x DP2 under 1F1B and DualPipeV. A TP2 checkpoint resumes
as one process and as TP4 to the same losses as the run that never stopped. The plans hold the all-reduces on
the tp stream; a group that does not divide the heads is an error (exit 2). configs/qwen3-70b-tp8-pp8.toml (a
Llama-3-70B-shaped Qwen3 on TP8 x PP8 x DP16, interleaved 1F1B) compiles for 1,024 ranks in under 10 s with every
rank's memory, and --fit-memory 80GiB answers for it."""
import glob
import os
import subprocess

from common import PIPER, compare, dry_run_json, fail, losses, mesh, run, tempdir, tiny_qwen3, write

STEPS = 20
RTOL = 1e-5


def tp(n):
    return ["--set", f"mesh.tp={n}"]


def train(d, name, text, ranks=1, args=(), steps=STEPS):
    cfg = write(d, f"{name}.toml", text)
    out = os.path.join(d, f"{name}.jsonl")
    run(ranks, cfg, "--steps", str(steps), "--metrics", out, *args, timeout=600)
    return losses(out)


def tp_sums(d, name, ranks, args):
    """The all-reduce instructions on the tp stream in the plans of d/name.toml on `ranks` ranks."""
    out = os.path.join(d, name + "-plans")
    subprocess.run([PIPER, "--config", os.path.join(d, f"{name}.toml"), "--dry-run", "--world", str(ranks),
                    "--dump-plan", out, *args], check=True, stdout=subprocess.DEVNULL)
    n = 0
    for p in glob.glob(os.path.join(out, "plan_set*.txt")):
        text = open(p).read()
        streams = [line for line in text.splitlines() if line.startswith("streams:")]
        n += sum(1 for line in text.splitlines() if "[tp] all_reduce" in line)
        if not streams or "tp" not in streams[0]:
            fail(f"{name}: the plan has no tp stream: {streams}")
    return n


def main():
    d = tempdir()
    q = tiny_qwen3("q")  # 4 query heads over 2 key/value heads
    ref = train(d, "one", q)
    compare("Qwen3 TP2 (2 kv heads split)", ref, train(d, "tp2", q, 2, tp(2)), RTOL)
    if tp_sums(d, "tp2", 2, tp(2)) == 0:
        fail("TP2: no all-reduce on the tp stream in the plans")
    compare("Qwen3 TP4 (2 kv heads copied)", ref, train(d, "tp4", q, 4, tp(4)), RTOL)

    more = q.replace("n_kv_heads = 2", "n_kv_heads = 4")
    ref_more = train(d, "one-mha", more)
    compare("Qwen3 TP2 (4 kv heads split)", ref_more, train(d, "tp2-mha", more, 2, tp(2)), RTOL)

    for zero in (1, 3):
        compare(f"Qwen3 TP2 x DP2 ZeRO-{zero}", ref, train(d, f"tp2-dp2-z{zero}", q, 4, mesh(dp=2, zero=zero) + tp(2)), RTOL)
    for schedule in ("1f1b", "dualpipev"):
        compare(f"Qwen3 TP2 x PP2 x DP2 {schedule}", ref,
                train(d, f"tp2-pp2-dp2-{schedule}", q, 8, mesh(pp=2, dp=2, m=4, schedule=schedule) + tp(2)), RTOL)

    # resume: TP2 to step 10, then one process and TP4 from its checkpoint
    ck = os.path.join(d, "ck")
    saved = q + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n'
    train(d, "tp2-ck", saved, 2, tp(2), steps=10)
    for ranks in (1, 4):
        got = train(d, f"resume-{ranks}", saved, ranks, ["--resume", os.path.join(ck, "step_00000010.h5")] +
                    (tp(4) if ranks == 4 else []))
        compare(f"Qwen3 TP2 -> {'one process' if ranks == 1 else 'TP4'} resume (steps 11-20)", ref[10:], got, RTOL)

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
