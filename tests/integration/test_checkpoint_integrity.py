"""Checkpoint integrity: a changed attribute byte, damaged, truncated, garbage and misnamed files are refused
with exit code 2 naming the file, and --resume auto skips them for the newest intact one; pruning keeps the
newest verified file; one job per checkpoint folder (a second one exits 2 naming the holder and touches
nothing); stale temporary files are removed at start; a full disk is reported with its errno text and keeps
the older checkpoints; a non-finite tensor is never written."""
import glob
import os
import random
import re
import shutil
import signal
import subprocess
import time

from common import PIPER, fail, metrics, run, tempdir, tiny_gpt, write


def job(d, name, ck, steps, every, extra=""):
    return write(d, f"{name}.toml", tiny_gpt(name=name, steps=steps, layers=2, batch=8) +
                 f'\n[checkpoint]\ndir = "{ck}"\nevery = {every}\n' + extra)


def first_line(text):
    lines = [l for l in text.strip().splitlines() if "piper:" in l]
    return (lines or [""])[0][:160]


def expect_refused(p, what, *needles):
    """Exit code 2, every needle in stderr, and no internal HDF5 call name."""
    out = p.stdout + p.stderr
    if p.returncode != 2:
        fail(f"{what}: exit {p.returncode}, expected 2\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    for n in needles:
        if n not in p.stderr:
            fail(f"{what}: {n!r} not in stderr:\n{p.stderr}")
    if "HDF5 call failed" in out or re.search(r"\bH5[A-Z][a-z]", out):
        fail(f"{what}: the message names an internal HDF5 call:\n{out}")
    print(f"ok  {what}: exit 2: {first_line(p.stderr)}")


def attr_step(path):
    out = subprocess.run(["h5dump", "-a", "step", path], capture_output=True, text=True).stdout
    return out.split("(0):")[1].split()[0] if "(0):" in out else None


def change_step_byte(path, step):
    """Changes one byte of the value of the root attribute `step` (int64 little-endian) in place."""
    data = bytearray(open(path, "rb").read())
    value = int(step).to_bytes(8, "little")
    spots = []
    at = data.find(b"step\x00")
    while at >= 0:
        if data[at - 1:at] != b"_":  # not data_step
            v = data.find(value, at, at + 64)
            if v >= 0:
                spots.append(v)
        at = data.find(b"step\x00", at + 1)
    if len(spots) != 1:
        fail(f"{path}: found the step attribute's value {len(spots)} times, expected once")
    data[spots[0]] ^= 0x40
    open(path, "wb").write(bytes(data))
    if attr_step(path) != str(step ^ 0x40):
        fail(f"{path}: h5dump reads step {attr_step(path)} after the change, expected {step ^ 0x40}")


def damage_data(src, dst):
    """A copy with bytes flipped inside the dataset payload (the middle of the file)."""
    data = bytearray(open(src, "rb").read())
    for i in range(len(data) // 2, len(data) // 2 + 2048, 7):
        data[i] ^= 0xFF
    open(dst, "wb").write(bytes(data))


def main():
    d = tempdir()
    ck = os.path.join(d, "ck")
    os.makedirs(ck)
    # A stale temporary file of an interrupted save is removed at start.
    stale = os.path.join(ck, ".step_00000003.h5.tmp")
    write(ck, ".step_00000003.h5.tmp", "partial")
    cfg = job(d, "base", ck, steps=10, every=5)
    p = run(1, cfg, "--metrics", os.path.join(d, "full.jsonl"))
    if os.path.exists(stale) or "removed " + stale not in p.stdout:
        fail(f"stale temporary file: exists={os.path.exists(stale)}, stdout:\n{p.stdout}")
    print("ok  a stale .step_*.h5.tmp is removed at start, with a message")
    full = metrics(os.path.join(d, "full.jsonl"))
    step5, step10 = os.path.join(ck, "step_00000005.h5"), os.path.join(ck, "step_00000010.h5")
    lock = open(os.path.join(ck, ".lock")).read()
    if f"pid " not in lock or "job base" not in lock or "host " not in lock:
        fail(f".lock does not name host, pid and job: {lock!r}")
    other = os.path.join(d, "other")  # checkpoint.dir of runs that only read a checkpoint

    # One byte of the `step` attribute changed: the checksum catches it (the name check cannot: other name).
    changed = os.path.join(d, "changed.h5")
    shutil.copy(step10, changed)
    change_step_byte(changed, 10)
    p = run(1, cfg, "--resume", changed, "--set", f'checkpoint.dir="{other}"', check=False)
    expect_refused(p, "one byte of the step attribute changed", changed, "checksum mismatch")

    # A file whose name's step differs from its `step` attribute.
    misnamed = os.path.join(d, "misnamed", "step_00000007.h5")
    os.makedirs(os.path.dirname(misnamed))
    shutil.copy(step5, misnamed)
    p = run(1, cfg, "--resume", misnamed, "--set", f'checkpoint.dir="{other}"', check=False)
    expect_refused(p, "name step_00000007.h5 holding step 5", misnamed, "name says step 7", "'step' is 5")

    # --resume PATH of a truncated and of a garbage file.
    truncated = os.path.join(d, "truncated.h5")
    open(truncated, "wb").write(open(step10, "rb").read()[: os.path.getsize(step10) // 2])
    p = run(1, cfg, "--resume", truncated, "--set", f'checkpoint.dir="{other}"', check=False)
    expect_refused(p, "--resume PATH of a truncated file", truncated)
    garbage = os.path.join(d, "garbage.h5")
    open(garbage, "wb").write(os.urandom(4096))
    p = run(1, cfg, "--resume", garbage, "--set", f'checkpoint.dir="{other}"', check=False)
    expect_refused(p, "--resume PATH of a garbage file", garbage)
    # Whole size, but its last tenth (tensors' headers and data) overwritten by garbage.
    tail = os.path.join(d, "tail.h5")
    data = bytearray(open(step10, "rb").read())
    rnd = random.Random(1)
    for i in range(len(data) * 9 // 10, len(data)):
        data[i] = rnd.randrange(256)
    open(tail, "wb").write(bytes(data))
    p = run(1, cfg, "--resume", tail, "--set", f'checkpoint.dir="{other}"', check=False)
    expect_refused(p, "--resume PATH of a file whose last tenth is garbage", tail)

    # --resume auto skips a damaged newest file and a garbage step_99999999.h5, with a warning naming each,
    # and continues bit-for-bit from the older intact one; keep = 1 then never prunes the file it wrote.
    auto = os.path.join(d, "auto")
    os.makedirs(auto)
    shutil.copy(step5, auto)
    damage_data(step10, os.path.join(auto, "step_00000010.h5"))
    shutil.copy(garbage, os.path.join(auto, "step_99999999.h5"))
    p = run(1, cfg, "--resume", "auto", "--set", f'checkpoint.dir="{auto}"', "--set", "checkpoint.keep=1",
            "--metrics", os.path.join(d, "auto.jsonl"), check=False)
    if p.returncode != 0:
        fail(f"--resume auto past damaged files: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    for name in ("step_99999999.h5", "step_00000010.h5"):
        if not any("warning" in l and name in l for l in p.stderr.splitlines()):
            fail(f"--resume auto: no warning naming the skipped {name}:\n{p.stderr}")
    if f"resumed from {os.path.join(auto, 'step_00000005.h5')} at step 5" not in p.stdout:
        fail(f"--resume auto did not resume from step 5:\n{p.stdout}")
    got, want = [m["loss"] for m in metrics(os.path.join(d, "auto.jsonl"))], [m["loss"] for m in full[5:]]
    if got != want:
        fail(f"--resume auto from step 5: losses {got} differ from the uninterrupted run {want}")
    print("ok  --resume auto skips a damaged newest and a garbage step_99999999.h5 (warnings), resumes from step 5")
    left = sorted(os.listdir(auto))
    if "step_00000010.h5" not in left:
        fail(f"keep = 1 pruned the checkpoint just written (in favour of an unverified newer name): {left}")
    print(f"ok  keep = 1 keeps the newest verified checkpoint: {left}")

    # Files exist but none verifies: exit 2 listing them.
    none = os.path.join(d, "none")
    os.makedirs(none)
    shutil.copy(garbage, os.path.join(none, "step_00000004.h5"))
    shutil.copy(truncated, os.path.join(none, "step_00000010.h5"))
    p = run(1, cfg, "--resume", "auto", "--set", f'checkpoint.dir="{none}"', check=False)
    expect_refused(p, "--resume auto where no file verifies", "step_00000004.h5", "step_00000010.h5")
    if glob.glob(os.path.join(none, "step_0000000[5-9].h5")):
        fail("--resume auto where no file verifies still trained and wrote checkpoints")

    concurrent_jobs(d)
    full_disk(d, os.path.getsize(step5))
    full_disk(d, os.path.getsize(step5), asynchronous=True)
    non_finite(d)


def concurrent_jobs(d):
    """A second job on a running job's folder exits 2 naming the holder and changes nothing there."""
    ck = os.path.join(d, "shared")
    first = job(d, "first", ck, steps=3000, every=1000)
    a = subprocess.Popen(["mpirun", "-np", "1", PIPER, "--config", first], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    lock_path, pid, t0 = os.path.join(ck, ".lock"), None, time.time()
    while pid is None and time.time() - t0 < 60 and a.poll() is None:
        text = open(lock_path).read() if os.path.exists(lock_path) else ""
        if "job first" in text:
            pid = int(text.split("pid ")[1].split()[0])
        time.sleep(0.01)
    if pid is None:
        fail(f"the first job never wrote its lock file (exit {a.poll()})")
    os.kill(pid, signal.SIGSTOP)  # hold the first job inside its run while the second one starts
    try:
        lock_before = open(lock_path).read()
        planted = os.path.join(ck, ".step_00000999.h5.tmp")
        write(ck, ".step_00000999.h5.tmp", "another job's file in the making")
        before = sorted(os.listdir(ck))
        second = job(d, "second", ck, steps=4, every=2)
        p = run(1, second, check=False)
        expect_refused(p, "a second job on a folder in use", f"pid {pid}", "job first", "host ", ck)
        if open(lock_path).read() != lock_before or sorted(os.listdir(ck)) != before:
            fail(f"the second job changed the first one's folder: {before} -> {sorted(os.listdir(ck))}")
        print("ok  the second job left the lock, the files and a temporary file of the first untouched")
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = a.communicate(timeout=300)
    if a.returncode != 0:
        fail(f"the first job failed after the second was refused: exit {a.returncode}\n{out}\n{err}")
    files = sorted(f for f in os.listdir(ck) if f.startswith("step_"))
    if files != ["step_00001000.h5", "step_00002000.h5", "step_00003000.h5"]:
        fail(f"the first job's checkpoints: {files}")
    # The folder is free again: a resume verifies the newest file and removes the stale temporary file.
    p = run(1, first, "--resume", "auto")
    if "resumed from " + os.path.join(ck, "step_00003000.h5") not in p.stdout or os.path.exists(planted):
        fail(f"resume after the first job:\n{p.stdout}\n{p.stderr}")
    print("ok  the first job completed; its checkpoints verify; the lock was released at its end")


def full_disk(d, checkpoint_bytes, asynchronous=False):
    """On a full file system the save fails with exit 1 and the errno text; the older checkpoint stays. With
    checkpoint.async the failure of the write on rank 0's thread surfaces at the end of the run, the same way."""
    label = "full disk, async" if asynchronous else "full disk"
    mnt = os.path.join(d, "small-async" if asynchronous else "small")
    os.makedirs(mnt)
    size_kib = (checkpoint_bytes * 3 // 2) // 1024 + 8  # room for one checkpoint and the lock file, not two
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", mnt], capture_output=True, text=True)
    if m.returncode != 0:
        print(f"skip full disk: cannot mount a tmpfs ({(m.stderr or m.stdout).strip()})")
        return
    try:
        ck = os.path.join(mnt, "ck")
        cfg = job(d, "full", ck, steps=10, every=5, extra="async = true\n" if asynchronous else "")
        p = run(1, cfg, check=False)
        tmp = os.path.join(ck, ".step_00000010.h5.tmp")
        if p.returncode != 1 or "No space left on device" not in p.stderr or tmp not in p.stderr:
            fail(f"{label}: exit {p.returncode}, expected 1 naming {tmp} with 'No space left on device':\n{p.stderr}")
        if "older checkpoints are kept" not in p.stderr:
            fail(f"{label}: the message does not say the older checkpoints are kept:\n{p.stderr}")
        left = sorted(os.listdir(ck))
        if left != [".lock", "step_00000005.h5"]:
            fail(f"{label}: files left {left}, expected the lock and step 5 only")
        print(f"ok  {label}: exit 1: {first_line(p.stderr)}")
    finally:
        subprocess.run(["umount", mnt])


def non_finite(d):
    """Parameters that overflow (weight decay lr * wd = 100 flips and grows them 99-fold a step) are never
    written: the step's non-finite guard, or behind it the save's own check of every tensor, ends the job
    with exit code 3, leaving no temporary file and no checkpoint of the last step."""
    ck = os.path.join(d, "nan")
    cfg = job(d, "nan", ck, steps=30, every=1)
    p = run(1, cfg, "--set", "optimizer.lr=10", "--set", "optimizer.min_lr=10", "--set", "optimizer.weight_decay=10",
            "--set", "optimizer.warmup_steps=0", "--set", "optimizer.grad_clip=0", check=False)
    if p.returncode != 3 or "finite" not in p.stderr:
        fail(f"non-finite parameters: exit {p.returncode}, expected 3:\n{p.stdout}\n{p.stderr}")
    files = sorted(f for f in os.listdir(ck) if f.startswith(("step_", ".step_")))
    if not files or files[-1] == "step_00000030.h5" or any(f.startswith(".") for f in files):
        fail(f"non-finite parameters: files {files}")
    print(f"ok  non-finite values are not checkpointed: exit 3: {first_line(p.stderr)}")


if __name__ == "__main__":
    main()
