"""Checkpoints: a run stopped at step k and resumed (--resume auto and PATH) continues bit-for-bit like the
uninterrupted run, on one process and under PP2xDP2; resuming under a different strategy continues within
1e-5; files are complete HDF5 with checksums, written atomically, pruned to checkpoint.keep."""
import glob
import os
import re
import subprocess

from common import compare, fail, losses, metrics, run, tempdir, tiny_gpt, write


def check_bitwise(name, full, tail):
    """The resumed run's losses must be exactly the uninterrupted run's (same printed bits)."""
    want = [m["loss"] for m in full[-len(tail):]]
    got = [m["loss"] for m in tail]
    if want != got:
        fail(f"{name}: resumed losses {got} differ from the uninterrupted run {want}")
    steps = [m["step"] for m in tail]
    print(f"ok  {name}: steps {steps[0]}..{steps[-1]} bit-identical")


def main():
    d = tempdir()
    for label, ranks, sets in (("single process", 1, []),
                               ("PP2xDP2", 4, ["--set", "mesh.pp=2", "--set", "mesh.dp=2", "--set", "mesh.microbatches=2"])):
        ck = os.path.join(d, label.replace(" ", "_"))
        cfg = write(d, f"{ranks}.toml", tiny_gpt(steps=20) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 5\nkeep = 2\n')
        run(ranks, cfg, "--metrics", os.path.join(d, f"full{ranks}.jsonl"), *sets,
            "--set", f'checkpoint.dir="{ck}_full"')
        full = metrics(os.path.join(d, f"full{ranks}.jsonl"))
        # stop at step 12: checkpoints at 5, 10 and the final 12 (keep = 2 leaves 10 and 12)
        run(ranks, cfg, "--steps", "12", "--metrics", os.path.join(d, f"part{ranks}.jsonl"), *sets)
        files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(ck, "*")))
        if files != ["step_00000010.h5", "step_00000012.h5"]:
            fail(f"{label}: expected checkpoints step 10 and 12 after pruning, found {files}")
        if glob.glob(os.path.join(ck, ".*.tmp")):
            fail(f"{label}: temporary files left behind: {glob.glob(os.path.join(ck, '.*.tmp'))}")
        run(ranks, cfg, "--resume", os.path.join(ck, "step_00000010.h5"), "--steps", "20",
            "--metrics", os.path.join(d, f"path{ranks}.jsonl"), *sets, "--set", f'checkpoint.dir="{ck}_path"')
        check_bitwise(f"{label} --resume PATH from step 10", full, metrics(os.path.join(d, f"path{ranks}.jsonl")))
        run(ranks, cfg, "--resume", "auto", "--metrics", os.path.join(d, f"auto{ranks}.jsonl"), *sets)
        check_bitwise(f"{label} --resume auto from step 12", full, metrics(os.path.join(d, f"auto{ranks}.jsonl")))

    # Save under PP2xDP2, resume under DP2 and under one process: same training run within 1e-5.
    full = losses(os.path.join(d, "full1.jsonl"))
    ck = os.path.join(d, "PP2xDP2_full", "step_00000015.h5")
    for label, ranks, sets in (("DP2", 2, ["--set", "mesh.dp=2", "--set", "mesh.zero=1"]), ("one process", 1, [])):
        out = os.path.join(d, f"cross{ranks}.jsonl")
        run(ranks, os.path.join(d, "1.toml"), "--resume", ck, "--metrics", out, *sets,
            "--set", f'checkpoint.dir="{d}/cross{ranks}"')
        compare(f"resume PP2xDP2 checkpoint under {label}", full[15:], losses(out), 1e-5)

    # The file is self-describing: h5dump reads it, and each tensor carries its block checksums.
    h5 = os.path.join(d, "single_process", "step_00000020.h5")
    out = subprocess.run(["h5dump", "-p", "-H", "-d", "/params/wte", h5], capture_output=True, text=True).stdout
    if "CONTIGUOUS" not in out or 'ATTRIBUTE "checksum_xxh64"' not in out or 'ATTRIBUTE "checksum_block"' not in out:
        fail(f"params/wte is not contiguous with its block checksums:\n{out}")
    attrs = subprocess.run(["h5dump", "-A", "-a", "step", h5], capture_output=True, text=True).stdout
    if "(0): 20" not in attrs:
        fail(f"step attribute is not 20:\n{attrs}")
    print("ok  checkpoint is contiguous with block checksums, step attribute 20")

    # A damaged checkpoint is refused with a clear message and exit code != 0, not silently loaded.
    bad = os.path.join(d, "damaged.h5")
    with open(h5, "rb") as f:
        data = bytearray(f.read())
    # flip bytes inside the payload of params/wte, where h5dump says it lies
    offset = int(re.search(r"OFFSET (\d+)", out).group(1))
    for i in range(offset + 64, offset + 64 + 4096, 7):
        data[i] ^= 0xFF
    with open(bad, "wb") as f:
        f.write(bytes(data))
    p = run(1, os.path.join(d, "1.toml"), "--resume", bad, "--set", f'checkpoint.dir="{d}/bad"', check=False)
    if p.returncode != 2 or "checksum mismatch" not in p.stderr:
        fail(f"a damaged checkpoint: exit {p.returncode}, stderr {p.stderr!r}")
    print(f"ok  damaged checkpoint refused (exit {p.returncode}): {p.stderr.strip().splitlines()[0][:120]}")

    p = run(1, os.path.join(d, "1.toml"), "--resume", os.path.join(d, "missing.h5"), check=False)
    if p.returncode != 2 or "no checkpoint file" not in p.stderr:
        fail(f"missing checkpoint: exit {p.returncode}, stderr {p.stderr!r}")
    print("ok  missing checkpoint: exit 2 with a message")


if __name__ == "__main__":
    main()
