"""Pruning to checkpoint.keep counts only this job's checkpoints that verify: a damaged newer file that --resume
auto went past, garbage files named like checkpoints of a later step and another job's checkpoint are moved
into checkpoint.dir/damaged/ with a warning naming each, never deleted and never counted, and the good older
checkpoints they would have displaced stay; afterwards every file left in the folder verifies."""
import os
import shutil
import subprocess

from common import PIPER, fail, run, tempdir, tiny_gpt, write

CKPT = os.path.join(os.path.dirname(PIPER), "piper-ckpt")


def job(d, name, ck, steps, every, keep):
    return write(d, f"{name}.toml", tiny_gpt(name=name, steps=steps, layers=2, batch=8) +
                 f'\n[checkpoint]\ndir = "{ck}"\nevery = {every}\nkeep = {keep}\n')


def step_name(step):
    return f"step_{step:08d}.h5"


def listing(ck):
    return sorted(f for f in os.listdir(ck) if f.endswith(".h5"))


def damage_data(path):
    """Flips bytes inside the tensor payload (the middle of the file): the structure and checksum attributes
    still read, a block hash no longer matches."""
    data = bytearray(open(path, "rb").read())
    for i in range(len(data) // 2, len(data) // 2 + 2048, 7):
        data[i] ^= 0xFF
    open(path, "wb").write(bytes(data))


def verify_folder(ck, what):
    p = subprocess.run([CKPT, "verify", ck], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"{what}: piper-ckpt verify {ck} exited {p.returncode}\n{p.stdout}\n{p.stderr}")


def expect_moved(p, ck, names, what):
    moved = sorted(os.listdir(os.path.join(ck, "damaged"))) if os.path.isdir(os.path.join(ck, "damaged")) else []
    if moved != sorted(names):
        fail(f"{what}: damaged/ holds {moved}, expected {sorted(names)}\nstderr:\n{p.stderr}")
    for n in names:
        if not any("moved aside" in l and n in l for l in p.stderr.splitlines()):
            fail(f"{what}: no warning names the move of {n}:\n{p.stderr}")


def damaged_newer_file(d):
    """keep = 2 with steps 15 and 20 on disk and 20 damaged: the resumed run's next save keeps 15."""
    ck = os.path.join(d, "ck-damaged")
    cfg = job(d, "prune", ck, steps=30, every=5, keep=2)
    run(1, cfg, "--steps", "20")
    if listing(ck) != [step_name(15), step_name(20)]:
        fail(f"after 20 steps with keep = 2: {listing(ck)}")
    damage_data(os.path.join(ck, step_name(20)))
    # every = 7: the resumed run saves step 21 (its end), not step 20 again.
    p = run(1, cfg, "--resume", "auto", "--steps", "21", "--set", "checkpoint.every=7")
    if "resumed from " + os.path.join(ck, step_name(15)) not in p.stdout:
        fail(f"--resume auto past the damaged step 20 did not resume from 15:\n{p.stdout}\n{p.stderr}")
    if listing(ck) != [step_name(15), step_name(21)]:
        fail(f"after the resumed save: {listing(ck)}, expected steps 15 and 21 (the damaged 20 moved aside)\n"
             f"{p.stderr}")
    expect_moved(p, ck, [step_name(20)], "damaged newer file")
    verify_folder(ck, "damaged newer file")
    print(f"ok  a damaged step 20 is moved to damaged/ and the good step 15 is kept: {listing(ck)}")


def garbage_and_foreign_files(d):
    """Garbage named step 98 and 99 and another job's valid checkpoint are not counted as the newest."""
    other_ck = os.path.join(d, "ck-other")
    run(1, job(d, "other", other_ck, steps=3, every=3, keep=0))
    ck = os.path.join(d, "ck-garbage")
    os.makedirs(ck)
    for step in (98, 99):
        with open(os.path.join(ck, step_name(step)), "wb") as f:
            f.write(os.urandom(4096))
    shutil.copy(os.path.join(other_ck, step_name(3)), os.path.join(ck, step_name(3)))
    p = run(1, job(d, "prune", ck, steps=30, every=5, keep=3))
    if listing(ck) != [step_name(20), step_name(25), step_name(30)]:
        fail(f"keep = 3 with garbage files of steps 98 and 99 and another job's step 3: {listing(ck)}, expected "
             f"steps 20, 25 and 30\n{p.stderr}")
    expect_moved(p, ck, [step_name(3), step_name(98), step_name(99)], "garbage and foreign files")
    if "another job" not in p.stderr:
        fail(f"the warning does not say step 3 is another job's checkpoint:\n{p.stderr}")
    verify_folder(ck, "garbage and foreign files")
    print(f"ok  garbage steps 98, 99 and another job's checkpoint are moved aside; keep = 3 holds {listing(ck)}")


def keep_all(d):
    """keep = 0 keeps everything and moves nothing."""
    ck = os.path.join(d, "ck-all")
    os.makedirs(ck)
    with open(os.path.join(ck, step_name(99)), "wb") as f:
        f.write(b"not a checkpoint")
    run(1, job(d, "prune", ck, steps=10, every=5, keep=0))
    if listing(ck) != [step_name(5), step_name(10), step_name(99)] or os.path.exists(os.path.join(ck, "damaged")):
        fail(f"keep = 0: {listing(ck)}")
    print("ok  keep = 0 prunes and moves nothing")


def main():
    d = tempdir()
    try:
        damaged_newer_file(d)
        garbage_and_foreign_files(d)
        keep_all(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
