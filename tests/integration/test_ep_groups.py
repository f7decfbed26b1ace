"""Expert groups inside data parallelism: `shard` with `group = k` (or [mesh] ep = k) spreads each MoE layer's
experts over expert groups of k consecutive ranks of a device set, and the groups' copies of each expert are
data-parallel (their gradients reduced over the copies, ZeRO 1-3 sharding them). EP2 inside DP4, with capacity,
with ZeRO-1 and ZeRO-3 on experts and dense parameters, from [mesh] ep and from a pattern annotation, EP2 x DP2 x
PP2 under DualPipeV on 8 ranks, and resuming an EP2 x DP2 checkpoint as one process and as EP4 each train the
same run as one process within 1e-5 over 20 steps; bad group sizes are rejected with exit 2."""
import os

from common import compare, fail, losses, pipeline, run, tempdir, tiny_qwen3, write

RTOL = 1e-5
LAYERS = 4
PATTERN = '\n[[annotate]]\ntag = "EP"\nsegments = "model.layers.*.mlp.experts"\n'


def job(name, capacity=0.0, extra=""):
    moe = (f"\n[model.moe]\nexperts = 4\ntop_k = 2\nd_expert = 24\naux_loss_coef = 0.01\n"
           f"capacity_factor = {capacity}\n")
    return tiny_qwen3(name=name, layers=LAYERS).replace("\n[data]", moe + "\n[data]", 1) + extra


def shard(group):
    return f'\n[[directive]]\nop = "shard"\nfilter = {{ EP = "*" }}\ngroup = {group}\n'


def replicate(zero=0):
    return f'\n[[directive]]\nop = "replicate"\nfilter = {{}}\nzero = {zero}\n'


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
    refs = {}
    for capacity in (0.0, 0.6):
        path = os.path.join(d, f"ref{capacity}.jsonl")
        run(1, write(d, f"ref{capacity}.toml", job("ref", capacity)), "--metrics", path)
        refs[capacity] = losses(path)

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
    ]
    for i, (name, ranks, capacity, extra) in enumerate(cases):
        cfg = write(d, f"g{i}.toml", job(f"g{i}", capacity, extra))
        out = os.path.join(d, f"g{i}.jsonl")
        run(ranks, cfg, "--metrics", out, timeout=300)
        compare(name, refs[capacity], losses(out), RTOL)

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
