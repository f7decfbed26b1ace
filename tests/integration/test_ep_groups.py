"""Expert groups inside data parallelism: `shard` with `group = k` (or [mesh] ep = k) spreads each MoE layer's
experts over expert groups of k consecutive ranks of a device set, and the groups' copies of each expert are
data-parallel (their gradients reduced over the copies, ZeRO 1-3 sharding them). EP2 inside DP4, with capacity,
with ZeRO-1 and ZeRO-3 on experts and dense parameters, from [mesh] ep and from a pattern annotation, EP2 x DP2 x
PP2 under DualPipeV on 8 ranks, and resuming an EP2 x DP2 checkpoint as one process and as EP4 each train the
same run as one process within 1e-5 over 20 steps (also from [mesh] with DualPipeV's V of 2·pp stages), with the
same per-layer routing statistics (overload, dropped assignments), also with auxiliary-loss-free bias balancing
(which evens the loads and resumes from a checkpoint), and with shared experts; bad group sizes are rejected with
exit 2."""
import os
import statistics

from common import (compare, fail, losses, metrics, moe_reference_losses, pipeline, replicate, run, shard, tempdir,
                    tiny_qwen3_moe, write)

RTOL = 1e-5
LAYERS = 4
PATTERN = '\n[[annotate]]\ntag = "EP"\nsegments = "model.layers.*.mlp.experts"\n'


def job(name, capacity=0.0, extra=""):
    return tiny_qwen3_moe(name, capacity, LAYERS, extra)


def v_set(stage):
    """DualPipeV on 2 pipeline ranks, four stages of one layer in a V (stage s on pipeline rank s, then 3 - s);
    pipeline rank p's set is ranks p, p + 2, p + 4, p + 6: two expert groups of 2."""
    p = stage if stage < 2 else 3 - stage
    return [p, p + 2, p + 4, p + 6]


def mesh(dp, ep, zero=0, pp=1, schedule=None, microbatches=0):
    text = f"\n[mesh]\npp = {pp}\ndp = {dp}\nep = {ep}\nzero = {zero}\n"
    if microbatches:
        text += f"microbatches = {microbatches}\n"
    if schedule:
        text += f'schedule = "{schedule}"\n'
    return text


def main():
    d = tempdir()
    refs = moe_reference_losses(d)

    cases = [
        ("EP2 inside DP4, dropless", 4, 0.0, PATTERN + replicate() + shard(2)),
        ("EP2 inside DP4, capacity 0.6", 4, 0.6, PATTERN + replicate() + shard(2)),
        ("EP2 inside DP4, ZeRO-1 on experts and dense parameters", 4, 0.0, PATTERN + replicate(1) + shard(2)),
        ("EP2 inside DP4, ZeRO-2", 4, 0.0, PATTERN + replicate(2) + shard(2)),
        ("EP2 inside DP4, ZeRO-3 on experts and dense parameters", 4, 0.0, PATTERN + replicate(3) + shard(2)),
        ("[mesh] dp = 4, ep = 2", 4, 0.0, mesh(4, 2)),
        ("[mesh] dp = 4, ep = 2, ZeRO-3, 2 microbatches", 4, 0.0, mesh(4, 2, zero=3, microbatches=2)),
        ("EP2 x DP2 x PP2 under DualPipeV, 8 ranks", 8, 0.0,
         PATTERN + pipeline("dualpipev", 4, [(i, i) for i in range(4)], v_set, before_schedule=replicate() + shard(2))),
        ("[mesh] pp = 2, dp = 4, ep = 2, DualPipeV (4 stages in a V), ZeRO-1", 8, 0.0,
         mesh(4, 2, zero=1, pp=2, schedule="dualpipev")),
    ]
    for i, (name, ranks, capacity, extra) in enumerate(cases):
        cfg = write(d, f"g{i}.toml", job(f"g{i}", capacity, extra))
        out = os.path.join(d, f"g{i}.jsonl")
        run(ranks, cfg, "--metrics", out, timeout=300)
        compare(name, refs[capacity], losses(out), RTOL)
        if i < 2:  # the routing statistics are of the whole global batch: the same in every layout
            want = [m["moe_layers"] for m in metrics(os.path.join(d, f"ref{capacity}.jsonl"))]
            got = [m["moe_layers"] for m in metrics(out)]
            if got != want:
                fail(f"{name}: per-layer overload and dropped tokens differ from one process:\n{got[:2]}\n{want[:2]}")
            dropped = sum(layer["dropped"] for step in got for layer in step)
            if (capacity > 0) != (dropped > 0):
                fail(f"{name}: {dropped} dropped assignments with capacity_factor = {capacity}")
            print(f"ok  {name}: per-layer overload and dropped assignments equal one process's "
                  f"({dropped:.0f} dropped over 20 steps)")

    # The dry run names the regions the pattern made, and the exchange inside each expert group.
    p = run(1, write(d, "dry.toml", job("dry", 0.0, PATTERN + replicate() + shard(2))), "--dry-run", "--world", "4")
    for layer in range(LAYERS):
        if f"segments model.layers.{layer}.mlp.experts .. model.layers.{layer}.mlp.experts" not in p.stdout:
            fail(f"the dry run does not list the region of layer {layer}'s experts:\n{p.stdout}")
    if "from the 2 ranks of its expert group" not in p.stdout:
        fail(f"the dry run does not say the rows come from the 2 ranks of an expert group:\n{p.stdout}")
    print("ok  --dry-run lists a region per expert segment and the expert group of 2")

    # An EP2 x DP2 checkpoint (ZeRO-1) resumes as one process and as EP4 on 4 ranks.
    ck = os.path.join(d, "ck")
    run(4, write(d, "save.toml", job("resume", 0.0, PATTERN + replicate(1) + shard(2))
                 + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n'), "--steps", "10")
    step10 = os.path.join(ck, "step_00000010.h5")
    for name, ranks, extra in (("as one process", 1, ""), ("as EP4", 4, PATTERN + replicate() + shard(4))):
        out = os.path.join(d, f"resumed{ranks}.jsonl")
        cfg = write(d, f"resume{ranks}.toml", job("resume", 0.0, extra) + f'\n[checkpoint]\ndir = "{ck}_{ranks}"\n')
        run(ranks, cfg, "--resume", step10, "--metrics", out)
        compare(f"resume an EP2 x DP2 checkpoint {name}", refs[0.0][10:], losses(out), RTOL)

    # Auxiliary-loss-free balancing: a selection bias per expert, moved after each step by the global batch's
    # loads, the same in every layout; it evens the loads out and is saved and resumed with the checkpoint.
    def biased(name, rate, extra=""):
        return job(name, 0.0, extra).replace("aux_loss_coef = 0.01", f"aux_loss_coef = 0\nbias_update_rate = {rate}")
    runs = {}
    for rate in (0.0, 0.01):
        path = os.path.join(d, f"bias{rate}.jsonl")
        run(1, write(d, f"bias{rate}.toml", biased("bias", rate)), "--metrics", path)
        runs[rate] = metrics(path)
    # mean over the layers and steps 11-20 of the overload (1: even, 2: every token on the same 2 of 4 experts);
    # without a balance loss this small router collapses toward 2 within a few steps
    late = lambda ms: statistics.mean(layer["overload"] for m in ms[10:] for layer in m["moe_layers"])
    if not late(runs[0.01]) < late(runs[0.0]) - 0.05:
        fail(f"the selection bias did not even out the loads: mean overload of steps 11-20 {late(runs[0.01]):.3f} "
             f"with it, {late(runs[0.0]):.3f} without")
    print(f"ok  bias balancing: mean overload of steps 11-20 {late(runs[0.01]):.3f}, {late(runs[0.0]):.3f} without")
    ck = os.path.join(d, "bias-ck")
    out = os.path.join(d, "bias-ep.jsonl")
    run(4, write(d, "bias-ep.toml", biased("bias", 0.01, PATTERN + replicate(1) + shard(2))
                 + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n'), "--metrics", out)
    compare("bias balancing, EP2 inside DP4, ZeRO-1", [m["loss"] for m in runs[0.01]], losses(out), RTOL)
    if [m["moe_layers"] for m in metrics(out)] != [m["moe_layers"] for m in runs[0.01]]:
        fail("bias balancing, EP2 inside DP4: the routing statistics differ from one process's")
    out = os.path.join(d, "bias-resumed.jsonl")
    run(1, write(d, "bias-one.toml", biased("bias", 0.01) + f'\n[checkpoint]\ndir = "{ck}_one"\n'),
        "--resume", os.path.join(ck, "step_00000010.h5"), "--metrics", out)
    compare("bias balancing: resume the EP2 x DP2 checkpoint as one process", [m["loss"] for m in runs[0.01]][10:],
            losses(out), RTOL)

    # Shared experts (every token through one SwiGLU of their summed width besides its routed experts), in
    # the combine's region: data-parallel like the other dense parameters.
    def shared(name, extra=""):
        return job(name, 0.0, extra).replace("capacity_factor = 0.0", "capacity_factor = 0.0\nshared_experts = 2\nd_shared = 12")
    ref = os.path.join(d, "shared-ref.jsonl")
    run(1, write(d, "shared-ref.toml", shared("shared")), "--metrics", ref)
    for name, ranks, extra in (("shared experts, EP2 inside DP4, ZeRO-1", 4, PATTERN + replicate(1) + shard(2)),
                               ("shared experts, EP2 x DP2 x PP2 under DualPipeV, ZeRO-3", 8,
                                mesh(4, 2, zero=3, pp=2, schedule="dualpipev"))):
        out = os.path.join(d, "shared.jsonl")
        run(ranks, write(d, "shared.toml", shared("shared", extra)), "--metrics", out, timeout=300)
        compare(name, losses(ref), losses(out), RTOL)
    if "mlp.shared_experts.gate_proj.weight" not in run(1, write(d, "shared-dry.toml", shared("shared")),
                                                        "--dry-run", "--dump-plan", os.path.join(d, "shared-plan")).stdout + \
            open(os.path.join(d, "shared-plan", "plan_set0.txt")).read():
        fail("the shared experts' parameters are not in the plan under DeepSeek-V3's names")

    # Group sizes that do not divide the ranks are rejected before training, with what would be right.
    for extra, want in ((PATTERN + replicate() + shard(3), "does not divide the 4 ranks"),
                        (mesh(4, 3), "ep = 3 ranks per expert group do not divide dp = 4")):
        bad = run(4, write(d, "bad.toml", job("bad", 0.0, extra)), check=False)
        if bad.returncode != 2 or want not in bad.stdout + bad.stderr:
            fail(f"expected exit 2 and '{want}', got {bad.returncode}:\n{bad.stdout}{bad.stderr}")
        print(f"ok  rejected with exit 2: {want}")
    missing = run(1, write(d, "nomatch.toml", job("nomatch", 0.0, PATTERN.replace("experts", "expert"))),
                  "--dry-run", check=False)
    if missing.returncode != 2 or "matches no segment" not in missing.stdout + missing.stderr:
        fail(f"a pattern matching nothing: expected exit 2, got {missing.returncode}:\n{missing.stdout}{missing.stderr}")
    print("ok  a pattern that matches no segment is rejected with exit 2")


if __name__ == "__main__":
    main()
