"""MoE routing runs on the device: in a real run (--profile counts every device-to-host copy by region) no model
segment copies device memory to the host, dropless or with a capacity, on one process and under EP2 inside DP4.
The host learns the experts' row counts from the plan: from a counts read (COUNTS, one per MoE layer and
microbatch, on the compute stream) where the experts are local, from the exchange itself where they are not; the
step sync reads the step's sums once."""
import os

from common import fail, replicate, report, run, shard, split, tempdir, tiny_qwen3_moe, write

LAYERS = 4
PATTERN = '\n[[annotate]]\ntag = "EP"\nsegments = "model.layers.*.mlp.experts"\n'
NOT_SEGMENTS = {"optimizer", "step sync", "read counts", "(none)"}


def downloads(summary, rank):
    """{region: device-to-host copies per step} of one rank's profile."""
    prof = report(summary)["ranks"][rank].get("profile")
    if not prof:
        fail(f"--profile: no profile for rank {rank} in {summary}")
    return {r["name"]: r["downloads_per_step"] for r in prof["regions"]}


def main():
    d = tempdir()
    cases = [
        ("one process, dropless", 1, 0.0, "", LAYERS),
        ("one process, capacity 0.6, 2 microbatches", 1, 0.6, split(2), 2 * LAYERS),
        ("EP2 inside DP4, capacity 0.6", 4, 0.6, PATTERN + replicate() + shard(2), 0),
    ]
    for i, (name, ranks, capacity, extra, reads) in enumerate(cases):
        cfg = write(d, f"r{i}.toml", tiny_qwen3_moe(f"r{i}", capacity, LAYERS, extra))
        summary = os.path.join(d, f"r{i}.json")
        run(ranks, cfg, "--steps", "4", "--profile", "--report-json", summary)
        for rank in range(ranks):
            regions = downloads(summary, rank)
            segments = {k: v for k, v in regions.items() if k not in NOT_SEGMENTS}
            if not any(k.endswith("experts") for k in segments) or any(v != 0 for v in segments.values()):
                fail(f"{name}, rank {rank}: model segments copy to the host: {segments}")
            if regions.get("read counts", 0) != reads:
                fail(f"{name}, rank {rank}: {regions.get('read counts', 0)} counts reads a step, expected {reads}")
            if regions.get("step sync", 0) != 1:
                fail(f"{name}, rank {rank}: the step sync reads {regions.get('step sync', 0)} times a step, not once")
        print(f"ok  {name}: no model segment copies to the host on any of {ranks} rank(s); {reads} counts reads "
              f"and one step-sync read a step")


if __name__ == "__main__":
    main()
