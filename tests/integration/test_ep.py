"""Expert parallelism: the shard directive spreads each MoE layer's experts over the ranks of a device set,
and all-to-all exchanges (counts first, then the routed rows) carry tokens to their experts and back. EP2
and EP4 (dropless and with capacity), EP with microbatches, EP with ZeRO 1-3 on the other parameters,
EP2 x PP2 under 1F1B, ZB-H1 and DualPipeV, every token routed to the same experts, and resuming an EP
checkpoint as one process each train the same run as one process within 1e-5 over 20 steps; in the cost
model's timeline DualPipeV's slots hide at least half of the all-to-all time 1F1B exposes."""
import os
import sys

from common import (DATA, ROOT, compare, fail, losses, moe_reference_losses, pipeline, replicate, run, shard,
                    split, tempdir, tiny_qwen3_moe, write)

DATA_LINE = f'path = "{DATA}"'

RTOL = 1e-5
LAYERS = 4


def job(name, capacity=0.0, extra=""):
    return tiny_qwen3_moe(name, capacity, LAYERS, extra)


def experts_annotation():
    ranges = [[f"model.layers.{i}.mlp.experts"] * 2 for i in range(LAYERS)]
    return "\n[[annotate]]\ntag = \"EP\"\nsegments = " + str(ranges).replace("'", '"') + "\n"


def pair(stage):
    """PP2 x EP2: pipeline stage s on ranks s and s + 2, its experts sharded over the two."""
    return [stage, stage + 2]


def v_pair(stage):
    """DualPipeV on 2 pipeline ranks x EP2: four stages of one layer, V layout (stage s on pair s, 3 - s)."""
    return pair(stage if stage < 2 else 3 - stage)


def main():
    d = tempdir()
    refs = moe_reference_losses(d)
    ep = experts_annotation()
    experts = replicate() + shard()  # the rest replicated, the experts sharded inside each device set
    cases = [
        ("EP2 dropless", 2, 0.0, ep + replicate() + shard()),
        ("EP4 dropless", 4, 0.0, ep + replicate() + shard()),
        ("EP2 with capacity 0.6", 2, 0.6, ep + replicate() + shard()),
        ("EP4 with capacity 0.6", 4, 0.6, ep + replicate() + shard()),
        ("EP2 with 4 microbatches", 2, 0.0, ep + split(4) + replicate() + shard()),
        ("EP2, ZeRO-1 on the rest", 2, 0.0, ep + replicate(1) + shard()),
        ("EP2, ZeRO-2 on the rest, 2 microbatches", 2, 0.0, ep + split(2) + replicate(2) + shard()),
        ("EP4, ZeRO-3 on the rest", 4, 0.0, ep + replicate(3) + shard()),
        ("EP2 x PP2 1f1b m=4", 4, 0.0, ep + pipeline("1f1b", 4, [(0, 1), (2, 3)], pair, before_schedule=experts)),
        ("EP2 x PP2 zb-h1 m=4", 4, 0.0, ep + pipeline("zb-h1", 4, [(0, 1), (2, 3)], pair, before_schedule=experts)),
        ("EP2 x PP2 dualpipev m=4", 4, 0.0,
         ep + pipeline("dualpipev", 4, [(i, i) for i in range(4)], v_pair, before_schedule=experts)),
    ]
    for i, (name, ranks, capacity, extra) in enumerate(cases):
        cfg = write(d, f"ep{i}.toml", job(f"ep{i}", capacity, extra))
        out = os.path.join(d, f"ep{i}.jsonl")
        p = run(ranks, cfg, "--metrics", out)
        if i == 0 and "ALL_TO_ALL" not in run(1, cfg, "--dry-run", "--world", "2", "--dump-plan",
                                               os.path.join(d, "dump")).stdout + open(
                os.path.join(d, "dump", "graph.txt")).read():
            fail("EP2: the training graph has no ALL_TO_ALL nodes")
        compare(name, refs[capacity], losses(out), RTOL)

    # Deliberately unbalanced routing: a data file of one repeated byte gives every token the same hidden
    # state, so every token of every sequence goes to the same two experts (all on one rank under EP4).
    same = os.path.join(d, "same.txt")
    with open(same, "w") as f:
        f.write("a" * 4096)
    for capacity in (0.0, 0.6):
        text = job("same", capacity).replace(DATA_LINE, f'path = "{same}"')
        path = os.path.join(d, f"same-ref{capacity}.jsonl")
        run(1, write(d, f"same-ref{capacity}.toml", text), "--metrics", path)
        for ranks in (2, 4):
            out = os.path.join(d, f"same{ranks}-{capacity}.jsonl")
            run(ranks, write(d, f"same{ranks}-{capacity}.toml", text + ep + replicate() + shard()), "--metrics", out)
            compare(f"EP{ranks}, every token routed to the same experts, capacity {capacity}", losses(path),
                    losses(out), RTOL)

    # The example jobs compile for their rank counts.
    for config, world in (("configs/moe-ep2-dp2.toml", 2), ("configs/moe-pp2-ep2-dualpipev.toml", 4),
                          ("configs/qwen3-moe-1b-pp8-dp2.toml", 16)):
        p = run(1, os.path.join(ROOT, config), "--dry-run", "--world", str(world))
        print(f"ok  {config} compiles for {world} ranks")

    # The cost model's timeline: DualPipeV's slots hide most of the all-to-all time that 1F1B exposes.
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from moe import predicted_exchange, strategy
    base = open(os.path.join(ROOT, "configs", "qwen3-moe-small.toml")).read()
    base = base[:base.index("[checkpoint]")]
    exposed = {}
    for kind in ("1f1b", "dualpipev"):
        plan = os.path.join(d, f"{kind}-plan")
        run(1, write(d, f"{kind}-pred.toml", base + strategy(kind, 8)), "--dry-run", "--world", "4",
            "--set", "job.threads=1", "--dump-plan", plan)
        exposed[kind] = predicted_exchange(os.path.join(plan, "timeline.json"))[1]
    ratio = exposed["dualpipev"] / exposed["1f1b"]
    if not ratio <= 0.5:
        fail(f"predicted exposed all-to-all time, DualPipeV / 1F1B = {ratio:.2f}, expected at most 0.5")
    print(f"ok  predicted exposed all-to-all time, DualPipeV / 1F1B: {ratio:.2f} (at most 0.5)")

    # An EP checkpoint (experts saved by their owners) resumes as one process.
    ck = os.path.join(d, "ck")
    cfg = write(d, "resume.toml", job("resume", 0.0, ep + replicate(1) + shard()) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n')
    run(2, cfg, "--steps", "10")
    one = write(d, "one.toml", job("resume", 0.0) + f'\n[checkpoint]\ndir = "{ck}_one"\n')
    out = os.path.join(d, "resumed.jsonl")
    run(1, one, "--resume", os.path.join(ck, "step_00000010.h5"), "--metrics", out)
    compare("resume an EP2 checkpoint as one process", refs[0.0][10:], losses(out), RTOL)

    # Bad layouts are rejected before launch.
    bad = run(2, write(d, "bad.toml", job("bad", 0.0, ep.replace('"model.layers.0.mlp.experts"]', '"model.layers.1.mlp.router"]', 1)
                                           + replicate() + shard())), check=False)
    if bad.returncode != 2 or "cannot be sharded" not in bad.stdout + bad.stderr:
        fail(f"sharding a region with non-expert segments: expected exit 2 and 'cannot be sharded', got "
             f"{bad.returncode}:\n{bad.stdout}{bad.stderr}")
    print("ok  a shard over non-expert segments is rejected with exit 2")


if __name__ == "__main__":
    main()
