"""Resharding through a checkpoint: one written under PP2 x DP2 with ZeRO-3 (parameters, gradients and
optimizer state sharded inside each stage) resumes as DP4 with ZeRO-3, as one process and as PP4, and each
continues the single-process run within 1e-5; its tensors are the logical ones whatever wrote them
(piper-ckpt diff of its parameters against the single-process checkpoint of the same step)."""
import os
import subprocess

from common import PIPER, compare, fail, losses, run, tempdir, tiny_gpt, write

CKPT = os.path.join(os.path.dirname(PIPER), "piper-ckpt")
STRATEGIES = {
    "PP2xDP2 ZeRO-3": (4, ["mesh.pp=2", "mesh.dp=2", "mesh.microbatches=2", "mesh.zero=3"]),
    "DP4 ZeRO-3": (4, ["mesh.dp=4", "mesh.zero=3"]),
    "one process": (1, []),
    "PP4": (4, ["mesh.pp=4", "mesh.microbatches=4"]),
}


def sets(names):
    return [a for n in names for a in ("--set", n)]


def main():
    d = tempdir()
    cfg = write(d, "job.toml", tiny_gpt(steps=20))
    ref = os.path.join(d, "ref.jsonl")
    run(1, cfg, "--metrics", ref, "--set", f'checkpoint.dir="{d}/ref"', "--set", "checkpoint.every=10")
    full = losses(ref)
    ranks, over = STRATEGIES["PP2xDP2 ZeRO-3"]
    run(ranks, cfg, "--steps", "10", *sets(over), "--set", f'checkpoint.dir="{d}/saved"', "--set",
        "checkpoint.every=10")
    saved = os.path.join(d, "saved", "step_00000010.h5")
    p = subprocess.run([CKPT, "diff", saved, os.path.join(d, "ref", "step_00000010.h5"), "--only", "params/",
                        "--rtol", "1e-3", "--atol", "1e-5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        fail(f"the PP2xDP2 ZeRO-3 checkpoint differs from the single-process one beyond 1e-5 + 1e-3 |b|:\n{p.stdout}{p.stderr}")
    print("ok  the PP2xDP2 ZeRO-3 checkpoint holds the single-process parameters (piper-ckpt diff, 1e-5 + 1e-3 |b|)")
    for label in ("DP4 ZeRO-3", "one process", "PP4"):
        ranks, over = STRATEGIES[label]
        out = os.path.join(d, label.replace(" ", "_") + ".jsonl")
        run(ranks, cfg, "--resume", saved, "--metrics", out, *sets(over), "--set",
            f'checkpoint.dir="{d}/{label.replace(" ", "_")}"')
        compare(f"PP2xDP2 ZeRO-3 checkpoint resumed as {label}", full[10:], losses(out), 1e-5)


if __name__ == "__main__":
    main()
