"""Outputs that cannot be written end the run with exit code 1 and a message naming the file and the errno
text, after the checkpoint logic had its chance to save: --metrics on a full file system (a small tmpfs) and
on /dev/full, --trace on /dev/full, and --dump-plan on a full file system. Nothing is lost quietly."""
import glob
import os
import shutil
import subprocess

from common import PIPER, fail, run, tempdir, tiny_gpt, write


def ckpt_steps(ck):
    return sorted(int(os.path.basename(f)[5:13]) for f in glob.glob(os.path.join(ck, "step_*.h5")))


def expect_failure(p, what, *needles):
    if p.returncode != 1:
        fail(f"{what}: exit {p.returncode}, expected 1\nstdout:\n{p.stdout[-2000:]}\nstderr:\n{p.stderr}")
    for n in needles:
        if n not in p.stderr:
            fail(f"{what}: {n!r} not in stderr:\n{p.stderr}")
    line = next((l for l in p.stderr.splitlines() if "error" in l), "")
    print(f"ok  {what}: exit 1: {line[:150]}")


def small_tmpfs(d, name, kib):
    mnt = os.path.join(d, name)
    os.makedirs(mnt)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", mnt], capture_output=True, text=True)
    if m.returncode != 0:
        print(f"skip {name}: cannot mount a tmpfs ({(m.stderr or m.stdout).strip()})")
        return None
    return mnt


def metrics_on_full_disk(d):
    mnt = small_tmpfs(d, "small", 4)
    if mnt is None:
        return
    try:
        ck = os.path.join(d, "ck-full")
        cfg = write(d, "full.toml", tiny_gpt(name="full", steps=400, layers=2, batch=8) +
                    f'\n[checkpoint]\ndir = "{ck}"\nevery = 100000\n')
        mlog = os.path.join(mnt, "m.jsonl")
        p = run(2, cfg, "--metrics", mlog, "--set", "mesh.dp=2", check=False)
        expect_failure(p, "--metrics on a full file system", mlog, "No space left on device")
        steps = ckpt_steps(ck)
        if len(steps) != 1 or not 1 < steps[0] < 400:
            fail(f"--metrics on a full file system: checkpoints at {steps}, expected one written when the run ended "
                 f"early\n{p.stderr}")
        print(f"ok  --metrics on a full file system: the run ended after step {steps[0]} with its checkpoint")
    finally:
        subprocess.run(["umount", mnt])


def metrics_and_trace_on_dev_full(d):
    ck = os.path.join(d, "ck-devfull")
    cfg = write(d, "devfull.toml", tiny_gpt(name="devfull", steps=50, layers=2, batch=8) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 100000\n')
    p = run(1, cfg, "--metrics", "/dev/full", check=False)
    expect_failure(p, "--metrics /dev/full", "/dev/full", "No space left on device")
    if ckpt_steps(ck) != [2]:
        fail(f"--metrics /dev/full: checkpoints at {ckpt_steps(ck)}, expected step 2 (the step after the failed "
             f"line of step 1)\n{p.stderr}")
    p = run(1, cfg, "--steps", "3", "--trace", "/dev/full", "--set", 'checkpoint.dir=""', check=False)
    expect_failure(p, "--trace /dev/full", "--trace", "/dev/full", "No space left on device")


def dump_plan_on_full_disk(d):
    mnt = small_tmpfs(d, "small-dump", 8)
    if mnt is None:
        return
    try:
        cfg = write(d, "dump.toml", tiny_gpt(name="dump", steps=10, layers=2, batch=8))
        p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--dump-plan", os.path.join(mnt, "plans")],
                           capture_output=True, text=True, timeout=120)
        expect_failure(p, "--dump-plan on a full file system", "--dump-plan", mnt, "No space left on device")
    finally:
        subprocess.run(["umount", mnt])


def main():
    d = tempdir()
    try:
        metrics_on_full_disk(d)
        metrics_and_trace_on_dev_full(d)
        dump_plan_on_full_disk(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
