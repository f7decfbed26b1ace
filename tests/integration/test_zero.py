"""ZeRO 1, 2 and 3 with DP2, DP4 and PP2xDP2: the loss equals the single-process loss within 1e-5 over 20
steps; after the last step every parameter copy is bit-identical across replicas (the run checks it and
says so); the bytes each rank holds between steps match the fp32-AdamW theory (16Ψ, (8+8/N)Ψ, (4+12/N)Ψ,
16Ψ/N) within 5% plus bucket padding; ZeRO-3's transient parameter peak stays within two buckets of full
parameters; under ZeRO-2 and -3 at most grad_buckets_in_flight (default 2; 1 is tried too) full-gradient
buffers are alive at once, so the gradient peak stays within the shard plus that many of the largest
bucket; the compiler's peak-memory estimate is within 10% of the measured peak, its gradient peak within 2%.
(Memory, the replica check and bucket sizes are read from --report-json and --dry-run --json.)"""
import os

from common import compare, dry_run_json, fail, losses, report, run, tempdir, tiny_gpt, write

V, T, C, F, L = 256, 16, 32, 64, 6


def block_params():
    return 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C


def stage_params(first_layer, last_layer, has_embedding, has_head):
    n = block_params() * (last_layer - first_layer + 1)
    if has_embedding:
        n += V * C + T * C
    if has_head:
        n += 2 * C + (0 if has_embedding else V * C)  # the head holds a copy of wte unless it is local
    return n


def theory(zero, psi, n):
    return {0: 16 * psi, 1: (8 + 8 / n) * psi, 2: (4 + 12 / n) * psi, 3: 16 * psi / n}[zero]


def held(memory):
    """Bytes held between steps: parameters, gradients and optimizer state (measured)."""
    return sum(memory["held_bytes"][k] for k in ("parameters", "gradients", "optimizer"))


def memory_by_rank(path):
    """{rank: memory} of a run's --report-json: measured held and peak bytes by kind and the estimates."""
    return {r["rank"]: r["memory"] for r in report(path)["ranks"]}


def bucket_bytes(cfg, world, sets):
    """Full-bucket sizes of device set 0's plan, from --dry-run --json."""
    return [4 * b["padded"] for b in dry_run_json(cfg, "--world", str(world), *sets)["device_sets"][0]["buckets"]]


def replicas_checked(path):
    """Did the run compare replicated parameters and find every copy bit-identical?"""
    replicas = report(path)["replicas"]
    return replicas["identical"] and replicas["copies_compared"] > 0


def main():
    d = tempdir()
    base = tiny_gpt(layers=L, batch=16)
    ref_cfg = write(d, "ref.toml", base)
    run(1, ref_cfg, "--metrics", os.path.join(d, "ref.jsonl"))
    ref = losses(os.path.join(d, "ref.jsonl"))

    layouts = [("DP2", 2, ["--set", "mesh.dp=2"], 2),
               ("DP4", 4, ["--set", "mesh.dp=4"], 4),
               ("PP2xDP2", 4, ["--set", "mesh.pp=2", "--set", "mesh.dp=2", "--set", "mesh.microbatches=2"], 2)]
    cases = [(zero, name, ranks, sets, n, 0.05) for zero in (0, 1, 2, 3) for name, ranks, sets, n in layouts]
    cases += [(zero, "DP2", 2, ["--set", "mesh.dp=2"], 2, 0.02) for zero in (2, 3)]  # a bucket per layer
    in_flight = 2  # the default grad_buckets_in_flight
    for zero, name, ranks, sets, n, bucket_mb in cases:
        sets = sets + ["--set", f"mesh.zero={zero}", "--set", f"mesh.bucket_mb={bucket_mb}"]
        out = os.path.join(d, f"z{zero}{name}{bucket_mb}.jsonl")
        summary = os.path.join(d, f"z{zero}{name}{bucket_mb}.json")
        p = run(ranks, ref_cfg, "--metrics", out, "--report-json", summary, *sets)
        label = f"ZeRO-{zero} {name}" + (f" bucket_mb={bucket_mb}" if bucket_mb != 0.05 else "")
        compare(label, ref, losses(out), 1e-5)
        if not replicas_checked(summary):
            fail(f"{label}: no replica check in the report: {report(summary)['replicas']}\n{p.stdout}")
        mem = memory_by_rank(summary)
        if sorted(mem) != list(range(ranks)):
            fail(f"{label}: the report has the memory of ranks {sorted(mem)}, expected 0..{ranks - 1}")
        buckets = bucket_bytes(ref_cfg, ranks, sets)
        for rank, m in mem.items():
            peak, est = m["peak_bytes"], m["estimated_peak_bytes"]
            if name.startswith("PP"):
                stage = rank % 2
                psi = stage_params(0, 2, True, False) if stage == 0 else stage_params(3, 5, False, True)
            else:
                psi = stage_params(0, L - 1, True, True)
            between_steps = held(m)
            want = theory(zero, psi, n)  # bytes: Ψ parameters, fp32 AdamW
            padding = 4 * 4 * n * (len(buckets) + 1)  # up to n-1 elements per bucket in 4 buffers
            if not (want <= between_steps <= want * 1.05 + padding):
                fail(f"{label} rank {rank}: holds {between_steps:.0f} bytes between steps, theory {want:.0f} "
                     f"(+5% and {padding} padding)")
            est_total, meas = m["estimated_peak_total_bytes"], m["peak_total_bytes"]
            if abs(est_total - meas) > 0.10 * meas:
                fail(f"{label} rank {rank}: estimated peak {est_total:.0f} vs measured {meas:.0f} (> 10% apart)")
            if zero >= 2:
                # measured, and the compiler's estimate (the worst case it allows): at most two buckets'
                # full gradients alive, whatever the number of buckets
                transient = max(peak["gradients"], est["gradients"]) - m["held_bytes"]["gradients"]
                if transient > in_flight * max(buckets):
                    fail(f"{label} rank {rank}: transient gradient peak {transient:.0f} bytes exceeds "
                         f"{in_flight} bucket(s) in flight ({in_flight * max(buckets)} bytes)")
                if abs(est["gradients"] - peak["gradients"]) > 0.02 * peak["gradients"]:
                    fail(f"{label} rank {rank}: estimated gradient peak {est['gradients']} vs measured "
                         f"{peak['gradients']} (> 2% apart)")
            if zero == 3:
                transient = peak["parameters"] - m["held_bytes"]["parameters"]
                if transient > 2 * max(buckets) * 1.05:
                    fail(f"{label} rank {rank}: transient parameter peak {transient:.0f} bytes exceeds two "
                         f"buckets ({2 * max(buckets)} bytes)")
        r0 = mem[0]
        held0 = held(r0)
        print(f"    rank 0 holds {held0 / 1024:.1f} KiB between steps; peak {r0['peak_total_bytes'] / 1024:.1f} KiB, "
              f"estimated {r0['estimated_peak_total_bytes'] / 1024:.1f} KiB; {len(buckets)} buckets")
    schedules_with_zero(d, ref)


def schedules_with_zero(d, ref):
    """ZeRO levels compose with every schedule: PP2xDP2 with split backward, interleaving and the V layout."""
    base = tiny_gpt(layers=L, batch=16)
    def job(kind, zero, ranges, rank_of, m):
        t = base + "\n[[annotate]]\ntag = \"PP\"\nlayers = " + str([list(r) for r in ranges]) + "\n"
        t += f"\n[[directive]]\nop = \"split\"\ncount = {m}\n"
        for s, r in enumerate(rank_of):
            t += f"\n[[directive]]\nop = \"place\"\nfilter = {{ PP = {s} }}\ndevices = [{r}, {r + 2}]\n"
        t += f"\n[[directive]]\nop = \"replicate\"\nfilter = {{}}\nzero = {zero}\nbucket_mb = 0.05\n"
        return t + f"\n[[directive]]\nop = \"schedule\"\nkind = \"{kind}\"\n"
    cases = [("zb-h1", 3, [(0, 2), (3, 5)], [0, 1], 4),
             ("dualpipev", 2, [(0, 0), (1, 2), (3, 4), (5, 5)], [0, 1, 1, 0], 4),
             ("interleaved-1f1b", 1, [(0, 1), (2, 2), (3, 4), (5, 5)], [0, 1, 0, 1], 2),
             ("gpipe", 3, [(0, 1), (2, 5)], [0, 1], 2)]
    for kind, zero, ranges, rank_of, m in cases:
        cfg = write(d, f"{kind}{zero}.toml", job(kind, zero, ranges, rank_of, m))
        out = os.path.join(d, f"{kind}{zero}.jsonl")
        summary = os.path.join(d, f"{kind}{zero}.json")
        run(4, cfg, "--metrics", out, "--report-json", summary)
        compare(f"{kind} with ZeRO-{zero}, PP2xDP2", ref, losses(out), 1e-5)
        if not replicas_checked(summary):
            fail(f"{kind} ZeRO-{zero}: no replica check in the report: {report(summary)['replicas']}")


if __name__ == "__main__":
    main()
