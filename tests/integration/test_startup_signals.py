"""Stop signals before the training loop: SIGTERM to one rank during start-up, and SIGUSR1 to mpirun while a
--resume starts, end the job with exit code 4 and a message saying it stopped before training, with nothing
written and the checkpoint folder as it was; a later --resume auto continues from the same checkpoint. The
sbatch template requeues such a job (exit 4) like one stopped with a checkpoint. Every wait is bounded."""
import glob
import os
import shutil
import signal
import subprocess
import time

from common import PIPER, ROOT, fail, rank_pids, run, tempdir, tiny_gpt, write

SINGLE = os.path.join(ROOT, "slurm", "single-node.sbatch")


def handles(pid, sig):
    """Has process `pid` a handler for `sig` installed (SigCgt in /proc/PID/status)?"""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except OSError:
        pass
    return False


def ranks_handling(root, ranks, sig, proc, within=30):
    """Waits until all `ranks` processes under `root` handle `sig`; returns {rank: pid}."""
    t0 = time.time()
    while time.time() - t0 < within:
        pids = rank_pids(root)
        if len(pids) == ranks and all(handles(p, sig) for p in pids.values()):
            return pids
        if proc.poll() is not None:
            fail(f"the job ended before it could be signalled: exit {proc.returncode}\n{proc.communicate()[1]}")
        time.sleep(0.002)
    proc.kill()
    fail(f"the {ranks} ranks did not all handle signal {sig} within {within} s")


def finish(proc, what, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        fail(f"{what}: the job did not end within {timeout} s of the signal\n{err}")
    return proc.returncode, out, err


def folder_state(ck):
    """Every file of the folder but its lock, with size and modification time."""
    return sorted((os.path.relpath(f, ck), os.path.getsize(f), os.path.getmtime(f))
                  for f in glob.glob(os.path.join(ck, "**"), recursive=True)
                  if os.path.isfile(f) and os.path.basename(f) != ".lock")


def expect_stopped_before_training(rc, out, err, what):
    if rc != 4 or "before training started" not in out or "stopping before training starts" not in err:
        fail(f"{what}: exit {rc}, expected 4 with 'stopped ... before training started'\nstdout:\n{out}\nstderr:\n{err}")
    if "step      1 |" in out:
        fail(f"{what}: a training step ran after the signal:\n{out}")


def sigterm_during_startup(d):
    ck = os.path.join(d, "ck-start")
    cfg = write(d, "start.toml", tiny_gpt(name="start", steps=50, layers=2, batch=8) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n')
    mlog = os.path.join(d, "start.jsonl")
    proc = subprocess.Popen(["mpirun", "-np", "2", PIPER, "--config", cfg, "--metrics", mlog, "--set", "mesh.dp=2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pids = ranks_handling(proc.pid, 2, signal.SIGTERM, proc)
    os.kill(pids[1], signal.SIGTERM)
    rc, out, err = finish(proc, "SIGTERM during start-up")
    expect_stopped_before_training(rc, out, err, "SIGTERM to rank 1 during start-up")
    if glob.glob(os.path.join(ck, "step_*.h5")) or (os.path.exists(mlog) and os.path.getsize(mlog) > 0):
        fail(f"SIGTERM during start-up: something was written: {os.listdir(ck) if os.path.isdir(ck) else []}")
    print("ok  SIGTERM to one rank during start-up: exit 4, stopped before training, nothing written")


def sigusr1_during_resume(d):
    ck = os.path.join(d, "ck-resume")
    cfg = write(d, "resume.toml", tiny_gpt(name="resume", steps=40, layers=2, batch=8) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\nkeep = 0\n')
    run(2, cfg, "--steps", "10", "--set", "mesh.dp=2")
    before = folder_state(ck)
    proc = subprocess.Popen(["mpirun", "-np", "2", PIPER, "--config", cfg, "--resume", "auto", "--set", "mesh.dp=2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ranks_handling(proc.pid, 2, signal.SIGUSR1, proc)
    proc.send_signal(signal.SIGUSR1)  # mpirun forwards it to every rank, as Slurm's --signal does
    rc, out, err = finish(proc, "SIGUSR1 during a resume")
    expect_stopped_before_training(rc, out, err, "SIGUSR1 to mpirun while a --resume starts")
    if folder_state(ck) != before:
        fail(f"SIGUSR1 during a resume changed the checkpoint folder:\nbefore {before}\nafter  {folder_state(ck)}")
    p = run(2, cfg, "--resume", "auto", "--set", "mesh.dp=2")
    if "at step 10" not in p.stdout:
        fail(f"the next --resume auto did not continue from step 10:\n{p.stdout}")
    print("ok  SIGUSR1 to mpirun while a --resume starts: exit 4, folder unchanged; the next resume continues at 10")


def template_requeues(d):
    """slurm/single-node.sbatch with stand-ins for srun (mpirun on 2 ranks) and scontrol (records its call)."""
    bin_dir = os.path.join(d, "bin")
    os.makedirs(bin_dir)
    calls = os.path.join(d, "scontrol.log")
    write(bin_dir, "srun", '#!/usr/bin/env bash\n# srun stand-in: drops its own options, runs the rest on 2 ranks\n'
          'while [ $# -gt 0 ] && [ "${1#--}" != "$1" ]; do shift; done\n'
          'exec mpirun -np 2 "$@"\n')
    write(bin_dir, "scontrol", f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    for n in ("srun", "scontrol"):
        os.chmod(os.path.join(bin_dir, n), 0o755)
    ck = os.path.join(d, "ck-slurm")
    cfg = write(d, "slurm.toml", tiny_gpt(name="slurm", steps=40, layers=2, batch=8) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n')
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], PIPER=PIPER, PIPER_JOB=cfg,
               SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=ROOT)
    proc = subprocess.Popen(["bash", SINGLE, "--set", "mesh.dp=2"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    pids = ranks_handling(proc.pid, 2, signal.SIGUSR1, proc)
    for pid in pids.values():  # Slurm's --signal=USR1@N reaches every task of the step
        os.kill(pid, signal.SIGUSR1)
    rc, out, err = finish(proc, "the sbatch template")
    recorded = open(calls).read() if os.path.exists(calls) else ""
    if rc != 0 or "requeue 4242" not in recorded or "before training started" not in out:
        fail(f"the template with a stop during start-up: exit {rc}, scontrol calls {recorded!r}; expected a requeue "
             f"and exit 0\nstdout:\n{out}\nstderr:\n{err}")
    print("ok  slurm/single-node.sbatch requeues a job stopped during start-up (exit 4 -> scontrol requeue)")


def main():
    d = tempdir()
    try:
        sigterm_during_startup(d)
        sigusr1_during_resume(d)
        template_requeues(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
