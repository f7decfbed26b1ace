"""Quiet input mistakes get an error naming the key, file or line (exit 2), never a hang: checkpoint.every
without a checkpoint.dir, an empty job.name, a range error that shows the value as given, a job file over
16 MiB, a FIFO or a folder as job file or schedule file, a schedule file with an out-of-range number or more
[[rank]] tables than the pipeline has ranks. --set 'job={steps=3}' sets job.steps and keeps the other [job]
keys. piper-ckpt refuses an HDF5 file piper did not write, lists the real dtype of every tensor, and `show`
refuses a file that `verify` fails."""
import os
import shutil
import subprocess

from common import PIPER, fail, run, tempdir, tiny_gpt, write

CKPT = os.path.join(os.path.dirname(PIPER), "piper-ckpt")


def refused(p, what, *needles):
    if p.returncode != 2:
        fail(f"{what}: exit {p.returncode}, expected 2\nstdout:\n{p.stdout[-1500:]}\nstderr:\n{p.stderr}")
    for n in needles:
        if n not in p.stderr:
            fail(f"{what}: {n!r} not in stderr:\n{p.stderr}")
    print(f"ok  {what}: exit 2: {(p.stderr.strip().splitlines() or [''])[0][:140]}")


def piper(*args, timeout=60):
    try:
        return subprocess.run([PIPER] + list(args), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(f"piper {' '.join(args)} did not end within {timeout} s")


def job_checks(d):
    cfg = write(d, "every.toml", tiny_gpt(name="every", steps=10, layers=2, batch=8) +
                '\n[checkpoint]\ndir = ""\nevery = 5\n')
    refused(piper("--config", cfg, "--dry-run"), "checkpoint.every = 5 with an empty checkpoint.dir",
            "checkpoint.every", "checkpoint.dir", "every.toml:")
    ok = write(d, "every-ok.toml", tiny_gpt(name="everyok", steps=4, layers=2, batch=8) +
               f'\n[checkpoint]\ndir = "{os.path.join(d, "ck")}"\nevery = 2\n')
    p = run(1, ok, "--set", 'checkpoint.dir=""')
    if os.path.exists(os.path.join(d, "ck")):
        fail("--set checkpoint.dir=\"\" did not turn checkpoints off")
    print("ok  --set checkpoint.dir=\"\" still turns a job's checkpoints off")

    cfg = write(d, "name.toml", tiny_gpt(name="", steps=10, layers=2, batch=8))
    refused(piper("--config", cfg, "--dry-run"), "job.name = \"\"", "job.name", "name.toml:")

    cfg = write(d, "range.toml", tiny_gpt(name="range", steps=10, layers=2, batch=8).replace(
        "weight_decay = 0.1", "weight_decay = 10.0000001"))
    refused(piper("--config", cfg, "--dry-run"), "a range error", "10.0000001", "weight_decay")

    cfg = write(d, "merge.toml", tiny_gpt(name="merged", steps=20, layers=2, batch=8).replace("seed = 11", "seed = 77"))
    p = run(1, cfg, "--set", "job={steps=3}")
    if "merged: 1 rank" not in p.stdout or "steps 0..3" not in p.stdout:
        fail(f"--set 'job={{steps=3}}' did not keep job.name and set job.steps:\n{p.stdout}")
    print("ok  --set 'job={steps=3}' sets job.steps and keeps the other [job] keys")

    big = os.path.join(d, "big.toml")
    with open(big, "w") as f:
        f.write(tiny_gpt(name="big", steps=10, layers=2, batch=8))
        f.write(("# " + "x" * 1022 + "\n") * (17 * 1024))
    refused(piper("--config", big, "--dry-run"), "a 17 MiB job file", "big.toml", "16 MiB")

    fifo = os.path.join(d, "job.fifo")
    os.mkfifo(fifo)
    refused(piper("--config", fifo, "--dry-run", timeout=20), "a FIFO as job file", "job.fifo", "FIFO")
    refused(piper("--config", d, "--dry-run", timeout=20), "a folder as job file", "folder")


def schedule_checks(d):
    def pipeline_job(name, schedule):
        return write(d, f"{name}.toml", tiny_gpt(name=name, steps=4, layers=2, batch=8) +
                     f'\n[mesh]\npp = 2\nmicrobatches = 2\n\n[[directive]]\nop = "schedule"\nkind = "file"\n'
                     f'file = "{schedule}"\n')

    good = ('[[rank]]\nslots = ["F0.0", "F0.1", "B0.0", "B0.1"]\n'
            '[[rank]]\nslots = ["F1.0", "B1.0", "F1.1", "B1.1"]\n')
    sched = write(d, "sched-good.toml", good)
    p = piper("--config", pipeline_job("good", sched), "--dry-run", "--world", "2")
    if p.returncode != 0:
        fail(f"a valid schedule file is refused:\n{p.stderr}")

    sched = write(d, "sched-range.toml", good.replace("F1.1", "F1.99999999999"))
    refused(piper("--config", pipeline_job("rs", sched), "--dry-run", "--world", "2"),
            "an out-of-range number in a schedule file", "sched-range.toml:", "out of range")
    sched = write(d, "sched-extra.toml", good + '[[rank]]\nslots = ["F0.0"]\n')
    refused(piper("--config", pipeline_job("extra", sched), "--dry-run", "--world", "2"),
            "an extra [[rank]] table", "sched-extra.toml:5", "[[rank]]")
    sched = write(d, "range.csv", "rank,slot,pass,stage,mb\n0,0,F,0,99999999999\n")
    refused(piper("--config", pipeline_job("rcsv", sched), "--dry-run", "--world", "2"),
            "an out-of-range number in a CSV schedule", "range.csv:2", "out of range")
    fifo = os.path.join(d, "sched.fifo")
    os.mkfifo(fifo)
    refused(piper("--config", pipeline_job("fifo", fifo), "--dry-run", "--world", "2", timeout=20),
            "a FIFO as schedule file", "sched.fifo", "FIFO")


def ckpt_tool_checks(d):
    values = write(d, "values.txt", "1.0 2.0 3.0 4.0\n")
    conf = write(d, "import.conf", "PATH params/w\nINPUT-CLASS TEXTFP\nINPUT-SIZE 64\nRANK 1\nDIMENSION-SIZES 4\n"
                 "OUTPUT-CLASS FP\nOUTPUT-SIZE 64\n")
    foreign = os.path.join(d, "foreign.h5")
    subprocess.run(["h5import", values, "-c", conf, "-o", foreign], check=True, capture_output=True)
    for cmd in ("meta", "ls"):
        p = subprocess.run([CKPT, cmd, foreign], capture_output=True, text=True, timeout=60)
        refused(p, f"piper-ckpt {cmd} on an HDF5 file piper did not write", "not a piper checkpoint")

    ck = os.path.join(d, "ck-real")
    run(1, write(d, "real.toml", tiny_gpt(name="real", steps=2, layers=2, batch=8) +
                 f'\n[checkpoint]\ndir = "{ck}"\nevery = 2\n'))
    mixed = os.path.join(d, "mixed.h5")
    shutil.copy(os.path.join(ck, "step_00000002.h5"), mixed)
    subprocess.run(["h5copy", "-i", foreign, "-o", mixed, "-s", "/params/w", "-d", "/params/extra"], check=True,
                   capture_output=True)
    p = subprocess.run([CKPT, "ls", mixed], capture_output=True, text=True, timeout=60)
    line = next((l for l in p.stdout.splitlines() if "params/extra" in l), "")
    if p.returncode != 0 or "float64" not in line or "32 bytes" not in line:
        fail(f"piper-ckpt ls does not report params/extra as float64 (32 bytes): exit {p.returncode}\n{p.stdout}")
    print("ok  piper-ckpt ls reports a float64 tensor as float64")
    v = subprocess.run([CKPT, "verify", mixed], capture_output=True, text=True, timeout=60)
    s = subprocess.run([CKPT, "show", mixed, "params/extra"], capture_output=True, text=True, timeout=60)
    if v.returncode == 0 or s.returncode == 0:
        fail(f"piper-ckpt verify exit {v.returncode}, show exit {s.returncode} on a file with a tensor piper did "
             f"not write; both must fail\nshow:\n{s.stdout}{s.stderr}")
    print(f"ok  piper-ckpt show fails where verify does: exit {s.returncode}: {s.stderr.strip()[:120]}")


def main():
    d = tempdir()
    try:
        job_checks(d)
        schedule_checks(d)
        ckpt_tool_checks(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
