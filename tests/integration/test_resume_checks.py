"""Resume checks: --resume refuses a job whose seed, data file or model keys differ from the checkpoint's
(exit 2 naming the setting and both values) unless checkpoint.allow_changes lists them (a warning, and the
run goes on); a resumed run's --metrics file holds each step once, equal to the uninterrupted run's;
--steps must be past the checkpoint's step and at most job.steps; a job without [model] is refused; a data
file truncated during a run ends it with exit code 2 naming the file, not with SIGBUS."""
import os
import shutil
import subprocess
import time

from common import DATA, PIPER, fail, metrics, run, tempdir, tiny_gpt, write


def expect_exit2(name, p, needles):
    text = p.stdout + p.stderr
    if p.returncode != 2:
        fail(f"{name}: exit code {p.returncode}, expected 2\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    for needle in needles:
        if needle not in p.stderr:
            fail(f"{name}: stderr lacks {needle!r}:\n{p.stderr}")
    said = next((line.strip() for line in p.stderr.splitlines() if needles[0] in line), "")
    print(f"ok  {name}: exit 2: {said[:150]}")
    return text


def main():
    d = tempdir()
    ck = os.path.join(d, "ck")
    cfg = write(d, "job.toml", tiny_gpt(steps=8, layers=2, batch=8) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 4\n')
    full = os.path.join(d, "full.jsonl")
    run(1, cfg, "--metrics", full, "--set", f'checkpoint.dir="{d}/ck_full"')
    # a run stopped at step 6 (after logging steps 5 and 6 past its checkpoint at step 4), resumed from step 4
    part = os.path.join(d, "part.jsonl")
    run(1, cfg, "--steps", "6", "--metrics", part)
    ck4 = os.path.join(ck, "step_00000004.h5")
    run(1, cfg, "--resume", ck4, "--metrics", part, "--set", f'checkpoint.dir="{d}/ck_resumed"')
    want, got = metrics(full), metrics(part)
    if [m["step"] for m in got] != list(range(1, 9)):
        fail(f"metrics after resume: steps {[m['step'] for m in got]}, expected each of 1..8 once")
    if [m["loss"] for m in got] != [m["loss"] for m in want]:
        fail(f"metrics after resume: losses {[m['loss'] for m in got]} differ from the uninterrupted run "
             f"{[m['loss'] for m in want]}")
    print("ok  metrics after --resume: steps 1..8 once each, losses equal to the uninterrupted run's")

    def resume(*args, check=False):
        return run(1, cfg, "--resume", ck4, "--set", f'checkpoint.dir="{d}/ck_other"', *args, check=check)

    expect_exit2("another seed", resume("--set", "job.seed=12"), ["job.seed", "checkpoint 11, job 12", "allow_changes"])
    p = resume("--set", "job.seed=12", "--set", 'checkpoint.allow_changes=["job.seed"]', check=True)
    if "piper: warning:" not in p.stderr or "job.seed: checkpoint 11, job 12" not in p.stderr or "step      8" not in p.stdout:
        fail(f"allow_changes = [\"job.seed\"]: expected a warning and a run to step 8\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    print("ok  allow_changes = [\"job.seed\"]: warns and trains to step 8")

    other = os.path.join(d, "other.txt")
    with open(DATA, "rb") as f:
        content = bytearray(f.read())
    content[100:110] = b"0123456789"
    with open(other, "wb") as f:
        f.write(content)
    expect_exit2("another data file", resume("--set", f'data.path="{other}"'), ["data.path", DATA, other, "fnv1a64:"])
    same = os.path.join(d, "same.txt")
    shutil.copyfile(DATA, same)
    resume("--set", f'data.path="{same}"', "--steps", "5", check=True)
    print("ok  the same data under another path resumes")

    expect_exit2("another model.d_ff", resume("--set", "model.d_ff=128"), ["model.d_ff: checkpoint 64, job 128"])
    expect_exit2("--resume with --steps at the checkpoint's step", resume("--steps", "4"), ["--steps 4", "step 4"])
    expect_exit2("--steps past job.steps", run(1, cfg, "--steps", "9", check=False), ["--steps 9", "job.steps = 8"])
    no_model = write(d, "no_model.toml", f'[job]\nsteps = 3\n[data]\npath = "{DATA}"\n')
    expect_exit2("a job without [model]", run(1, no_model, check=False), ["no_model.toml", "[model]: missing"])

    # The data file is truncated while the run trains on it: exit 2 naming the file, no SIGBUS; on two ranks
    # the rank that sees it ends the job with the same code.
    for ranks, sets in ((1, []), (2, ["--set", "mesh.dp=2"])):
        data = os.path.join(d, f"shrinking{ranks}.txt")
        shutil.copyfile(DATA, data)
        long = write(d, f"long{ranks}.toml", tiny_gpt(steps=100000, layers=2, batch=8).replace(DATA, data))
        proc = subprocess.Popen(["mpirun", "-np", str(ranks), PIPER, "--config", long, *sets], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if line.startswith("step"):  # a step has run: cut the file in half under the running job
                os.truncate(data, os.path.getsize(data) // 2)
                break
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            fail(f"data file truncated under {ranks} rank(s): the run went on for 60 s")
        p = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        text = expect_exit2(f"data file truncated during a run of {ranks} rank(s)", p, [f"'{data}' changed during the run"])
        # (Open MPI's abort sends the other ranks SIGTERM, which piper reports: not a crash)
        if "Bus error" in text or "SIGBUS" in text or "signal 7" in text or "core dumped" in text:
            fail(f"truncated data file: the run crashed:\n{text}")

if __name__ == "__main__":
    main()
