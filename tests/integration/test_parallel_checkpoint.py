"""Every rank writes its own slices of the one checkpoint file: a model whose largest tensors span several
checksum blocks (1.5 Mi elements), saved by DP3 (ZeRO-0, -3, asynchronous) so that slices meet inside blocks,
gives files that verify byte for byte (piper-ckpt verify), hold the single-process parameters (piper-ckpt diff)
and resume as one process continuing the single-process run."""
import os

from common import compare, fail, losses, piper_ckpt, run, tempdir, tiny_gpt, write

WIDE = ["--set", "model.d_model=128", "--set", "model.d_ff=12288", "--set", "model.n_heads=4", "--set",
        "data.batch=6"]


def main():
    d = tempdir()
    cfg = write(d, "job.toml", tiny_gpt(steps=6, layers=2))
    ref = os.path.join(d, "ref.jsonl")
    run(1, cfg, *WIDE, "--metrics", ref, "--set", f'checkpoint.dir="{d}/ref"', "--set", "checkpoint.every=3")
    full = losses(ref)
    shape = piper_ckpt("ls", os.path.join(d, "ref", "step_00000003.h5"), want=None).stdout
    if "(128, 12288)" not in shape and "(12288, 128)" not in shape:
        fail(f"the model has no tensor of 1.5 Mi elements:\n{shape}")
    for label, extra in (("DP3 ZeRO-0", ["--set", "mesh.dp=3"]),
                         ("DP3 ZeRO-3", ["--set", "mesh.dp=3", "--set", "mesh.zero=3"]),
                         ("DP3 ZeRO-1 async", ["--set", "mesh.dp=3", "--set", "mesh.zero=1", "--set",
                                               "checkpoint.async=true"])):
        ck = os.path.join(d, label.replace(" ", "_"))
        run(3, cfg, *WIDE, *extra, "--steps", "3", "--set", f'checkpoint.dir="{ck}"', "--set", "checkpoint.every=3")
        saved = os.path.join(ck, "step_00000003.h5")
        v = piper_ckpt("verify", saved, want=None)
        if v.returncode != 0:
            fail(f"{label}: the file does not verify:\n{v.stdout}{v.stderr}")
        p = piper_ckpt("diff", saved, os.path.join(d, "ref", "step_00000003.h5"), "--rtol", "1e-3", "--atol", "2e-5",
                       want=None)
        if p.returncode != 0:
            fail(f"{label}: the checkpoint differs from the single-process one:\n{p.stdout}{p.stderr}")
        if "world=3" not in piper_ckpt("meta", saved, want=None).stdout:
            fail(f"{label}: the layout attribute does not say world=3")
        out = os.path.join(d, label.replace(" ", "_") + ".jsonl")
        run(1, cfg, *WIDE, "--resume", saved, "--metrics", out, "--set", f'checkpoint.dir="{ck}-resumed"')
        compare(f"{label} checkpoint resumed as one process", full[3:], losses(out), 1e-5)
        print(f"ok  {label}: written by 3 ranks, verifies, holds the single-process state and resumes it")


if __name__ == "__main__":
    main()
