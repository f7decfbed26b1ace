#!/usr/bin/env python3
# Runs piper under a real one-node Slurm cluster (tools/slurm-local-up.sh): a tiny pp=2 x dp=2 GPT through
# slurm/single-node.sbatch and slurm/multi-node.sbatch, then `srun piper` directly; a bad job must fail fast.
# Needs root (or passwordless sudo) on Debian; the cluster is always torn down (tools/slurm-local-down.sh).
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

START = time.monotonic()
DEADLINE = START + 540          # ctest kills the test at 600 s; leave time for the teardown
STEPS = 20
RANKS = 4
JOB_TIMEOUT_S = 300             # a good batch job must end within this
BAD_JOB_PROMPT_S = 30           # a job with a bad job file must end within this

SOURCE_DIR = os.path.abspath(os.environ.get("PIPER_SOURCE_DIR")
                             or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
PIPER = os.path.abspath(os.environ.get("PIPER") or os.path.join(SOURCE_DIR, "build", "piper"))
DATA = os.path.join(SOURCE_DIR, "data", "fortunes.txt")
UP = os.path.join(SOURCE_DIR, "tools", "slurm-local-up.sh")
DOWN = os.path.join(SOURCE_DIR, "tools", "slurm-local-down.sh")
SINGLE = os.path.join(SOURCE_DIR, "slurm", "single-node.sbatch")
MULTI = os.path.join(SOURCE_DIR, "slurm", "multi-node.sbatch")

STEP_LINE = re.compile(r"^step\s+(\d+)/\d+\s+\|\s+loss\s+(\S+)\s+\|", re.MULTILINE)
ACTIVE_STATES = {"", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                 "RESIZING", "STAGE_OUT", "SIGNALING"}

JOB_TOML = """\
# Tiny GPT on 4 ranks: 2 pipeline stages x 2 data-parallel replicas.
[job]
name = "slurm-test"
steps = {steps}
seed = 1234
backend = "cpu"
threads = 1
{extra}
[model]
kind = "gpt"
vocab = 256
seq_len = 32
d_model = 64
n_layers = 4
n_heads = 4

[data]
path = "{data}"
batch = 8

[optimizer]
kind = "adamw"
lr = 1e-3

[mesh]
pp = 2
dp = 2
"""


class TestFailure(Exception):
    pass


def log(msg):
    print(f"[{time.monotonic() - START:6.1f}s] {msg}", flush=True)


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


def budget(seconds):
    """Seconds a wait may take: its own limit, but never past the test's deadline."""
    return max(5.0, min(seconds, DEADLINE - time.monotonic()))


def slurm_env(**extra):
    """This environment without the variables of any surrounding Slurm job, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env.update(extra)
    return env


def as_root(cmd):
    if os.geteuid() == 0:
        return cmd
    if shutil.which("sudo") is None:
        raise TestFailure("the Slurm test needs root (or passwordless sudo) to start the local cluster")
    return ["sudo", "-n"] + cmd


def run(cmd, timeout, within_deadline=True, **kw):
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=budget(timeout) if within_deadline else timeout, **kw)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise TestFailure(f"`{' '.join(cmd)}` did not finish within {e.timeout:.0f} s; output so far:\n{out}")
    return p.returncode, p.stdout, time.monotonic() - t0


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return f"<{path} does not exist>"


def job_info(job_id):
    """(state, exit code) of a job from scontrol, or from the jobcomp log once scontrol has forgotten it."""
    p = subprocess.run(["scontrol", "-o", "show", "job", job_id], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True, timeout=30)
    text = p.stdout if p.returncode == 0 else ""
    if not text:
        for line in read("/var/log/slurm/jobcomp.log").splitlines():
            if line.startswith(f"JobId={job_id} "):
                text = line
    state = re.search(r"\bJobState=(\S+)", text)
    code = re.search(r"\bExitCode=(\S+)", text)
    return (state.group(1) if state else ""), (code.group(1) if code else "")


def submit(script, name, out_dir, env, args=()):
    cmd = ["sbatch", "--parsable", "-J", name, "-o", os.path.join(out_dir, f"{name}-%j.out")] + list(args) + [script]
    rc, out, _ = run(cmd, 60, env=env, cwd=SOURCE_DIR)
    check(rc == 0, f"`{' '.join(cmd)}` failed with exit code {rc}:\n{out}")
    job_id = out.strip().splitlines()[-1].split(";")[0]
    check(job_id.isdigit(), f"sbatch --parsable printed {out!r}, not a job id")
    return job_id, os.path.join(out_dir, f"{name}-{job_id}.out")


def wait_job(job_id, out_path, timeout):
    """Polls scontrol until the job has ended; returns (state, exit code, seconds waited)."""
    t0 = time.monotonic()
    limit = budget(timeout)
    while True:
        state, code = job_info(job_id)
        if state not in ACTIVE_STATES:
            return state, code, time.monotonic() - t0
        if time.monotonic() - t0 > limit:
            subprocess.run(["scancel", job_id], stderr=subprocess.DEVNULL)
            raise TestFailure(f"job {job_id} still {state or 'unknown'} after {limit:.0f} s; "
                              f"output so far ({out_path}):\n{read(out_path)}")
        time.sleep(0.2)


def losses_from_log(text):
    steps = [(int(s), float(l)) for s, l in STEP_LINE.findall(text)]
    return [s for s, _ in steps], [l for _, l in steps]


def check_training(what, steps, losses, output):
    check(steps == list(range(1, STEPS + 1)),
          f"{what}: expected steps 1..{STEPS} once each, found {len(steps)} step lines {steps}\n{output}")
    check(all(l == l and abs(l) != float("inf") for l in losses), f"{what}: a loss is not finite: {losses}")
    check(losses[-1] < losses[0], f"{what}: loss did not go down: first {losses[0]}, last {losses[-1]}")
    check(sum(losses[-5:]) < sum(losses[:5]), f"{what}: the last 5 losses average no lower than the first 5: {losses}")


def test_batch_job(script, name, tmp, job, env, args=()):
    job_id, out_path = submit(script, name, tmp, slurm_env(**env, PIPER=PIPER, PIPER_JOB=job), args)
    state, code, waited = wait_job(job_id, out_path, JOB_TIMEOUT_S)
    output = read(out_path)
    log(f"{os.path.basename(script)}: job {job_id} ended {state} (ExitCode={code}) {waited:.1f} s after submission")
    check(state == "COMPLETED" and code == "0:0",
          f"{os.path.basename(script)}: job {job_id} ended {state} with ExitCode={code}, expected COMPLETED 0:0; "
          f"output ({out_path}):\n{output}")
    steps, losses = losses_from_log(output)
    check_training(f"{os.path.basename(script)} job {job_id}", steps, losses, output)
    log(f"  {len(steps)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return losses


def test_requeue(tmp):
    steps = 1500
    ck = os.path.join(tmp, "requeue-ck")
    job = os.path.join(tmp, "requeue.toml")
    with open(job, "w") as f:
        f.write(JOB_TOML.format(steps=steps, data=DATA, extra="log_every = 50\n") +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 100000\n')
    ref = os.path.join(tmp, "requeue-ref.jsonl")
    cmd = ["srun", "-n", str(RANKS), PIPER, "--config", job, "--metrics", ref, "--set", f'checkpoint.dir="{ck}-ref"']
    rc, out, took = run(cmd, 180, env=slurm_env(), cwd=tmp)
    check(rc == 0, f"`{' '.join(cmd)}` failed with exit code {rc}:\n{out}")
    log(f"requeue: uninterrupted reference run of {steps} steps, {took:.1f} s")

    got = os.path.join(tmp, "requeue.jsonl")
    # piper's own options go after the script
    cmd = ["sbatch", "--parsable", "-J", "piper-requeue", "-o", os.path.join(tmp, "piper-requeue-%j.out"),
           "-n", str(RANKS), SINGLE, "--metrics", got]
    rc, out, _ = run(cmd, 60, env=slurm_env(PIPER=PIPER, PIPER_JOB=job), cwd=SOURCE_DIR)
    check(rc == 0, f"`{' '.join(cmd)}` failed with exit code {rc}:\n{out}")
    job_id = out.strip().splitlines()[-1].split(";")[0]
    out_path = os.path.join(tmp, f"piper-requeue-{job_id}.out")
    t0 = time.monotonic()
    while True:     # signal once the run has trained a while
        steps_seen, _ = losses_from_log(read(out_path))
        if steps_seen and steps_seen[-1] >= 100:
            break
        state, code = job_info(job_id)
        check(state in ACTIVE_STATES, f"job {job_id} ended {state} ({code}) before it could be signalled:\n"
                                      f"{read(out_path)}")
        check(time.monotonic() - t0 < budget(120), f"job {job_id}: no step 100 within 120 s:\n{read(out_path)}")
        time.sleep(0.1)
    rc, out, _ = run(["scancel", "--signal=USR1", job_id], 30)
    check(rc == 0, f"scancel --signal=USR1 {job_id} failed:\n{out}")
    log(f"requeue: job {job_id} signalled at step {steps_seen[-1]}")
    nudged = False
    pending_since = None
    limit = budget(JOB_TIMEOUT_S)
    while True:
        p = subprocess.run(["scontrol", "-o", "show", "job", job_id], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, timeout=30)
        restarts = re.search(r"\bRestarts=(\d+)", p.stdout)
        state, code = job_info(job_id)
        if state == "PENDING" and restarts and int(restarts.group(1)) >= 1 and not nudged and pending_since is None:
            pending_since = time.monotonic()
        # Slurm holds a requeued job for about two minutes, time for the first run's step to be cleaned up
        # (its PMIx socket would clash with the next run's step of the same id): once that is done, start it.
        if (state == "PENDING" and not nudged and pending_since is not None and time.monotonic() - pending_since > 3
                and not os.path.exists(f"/var/spool/slurmd/stepd.slurm.pmix.{job_id}.0")):
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], stderr=subprocess.DEVNULL)
            nudged = True
            log(f"requeue: job {job_id} is back in the queue (Restarts={restarts.group(1)})")
        if state not in ACTIVE_STATES:
            break
        if time.monotonic() - t0 > limit:
            subprocess.run(["scancel", job_id], stderr=subprocess.DEVNULL)
            raise TestFailure(f"requeue: job {job_id} still {state} after {limit:.0f} s:\n{read(out_path)}")
        time.sleep(0.2)
    output = read(out_path)
    check(state == "COMPLETED" and code == "0:0" and nudged,
          f"requeue: job {job_id} ended {state} ({code}), requeued: {nudged}; expected a requeue, then COMPLETED 0:0:"
          f"\n{output}")
    stop = re.search(r"stopped by a signal after step (\d+)", output)
    resumed = re.search(r"resumed from \S+ at step (\d+)", output)
    check(stop and resumed and stop.group(1) == resumed.group(1) and "exit code 4" in output,
          f"requeue: expected a stop with a checkpoint (exit code 4) and a resume at the same step:\n{output}")
    want = [(r["step"], r["loss"]) for r in map(json.loads, read(ref).splitlines())]
    have = [(r["step"], r["loss"]) for r in map(json.loads, read(got).splitlines())]
    if have != want:
        first = next(i for i in range(max(len(have), len(want)))
                     if i >= len(have) or i >= len(want) or have[i] != want[i])
        raise TestFailure(f"requeue: the interrupted and requeued run's {len(have)} metrics lines differ from the "
                          f"uninterrupted run's {len(want)}; first difference at line {first + 1}: "
                          f"{have[first] if first < len(have) else None} vs {want[first] if first < len(want) else None}")
    log(f"requeue: stopped at step {stop.group(1)}, requeued, resumed, {steps} steps bit-identical to the "
        f"uninterrupted run, {time.monotonic() - t0:.1f} s")


def main():
    for path, what in [(PIPER, "the piper executable (set PIPER)"), (DATA, "the data (run tools/prepare-data.sh)"),
                       (UP, "tools/slurm-local-up.sh"), (DOWN, "tools/slurm-local-down.sh"),
                       (SINGLE, "slurm/single-node.sbatch"), (MULTI, "slurm/multi-node.sbatch")]:
        check(os.path.exists(path), f"{path} not found: {what}")
    for script in (SINGLE, MULTI, UP, DOWN):
        rc, out, _ = run(["bash", "-n", script], 30)
        check(rc == 0, f"{script} is not valid bash:\n{out}")

    tmp = tempfile.mkdtemp(prefix="piper-slurm-test-")
    os.chmod(tmp, 0o755)
    job = os.path.join(tmp, "job.toml")
    bad_job = os.path.join(tmp, "bad.toml")
    with open(job, "w") as f:
        f.write(JOB_TOML.format(steps=STEPS, data=DATA, extra=""))
    with open(bad_job, "w") as f:
        f.write(JOB_TOML.format(steps=STEPS, data=DATA, extra="unknown_key = 1\n"))
    log(f"work dir {tmp}")

    # Two runs of this test on one machine would share (and tear down) one cluster: take turns.
    lock_path = os.path.join(tempfile.gettempdir(), "piper-slurm-test.lock")
    try:
        lock = open(lock_path, "a")
    except OSError as e:
        raise TestFailure(f"cannot open the lock file {lock_path}: {e}")
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            check(time.monotonic() - START < 240, f"another run of this test held {lock_path} for 240 s")
            time.sleep(1)
    log(f"holding {lock_path}")

    passed = False
    try:
        rc, out, took = run(as_root([UP]), 300)
        check(rc == 0, f"tools/slurm-local-up.sh failed with exit code {rc}:\n{out}")
        log(f"slurm-local-up.sh: {took:.1f} s")

        # 1. The single-node template with 4 tasks on the one node.
        sbatch_losses = test_batch_job(SINGLE, "piper-single", tmp, job, {}, ["-n", str(RANKS)])

        # 2. The multi-node template, squeezed onto the one node this cluster has.
        test_batch_job(MULTI, "piper-multi", tmp, job, {},
                       ["-N", "1", f"--ntasks-per-node={RANKS}", "--cpus-per-task=1"])

        # 3. Direct launch: srun starts the ranks itself (PMIx), no batch script.
        metrics = os.path.join(tmp, "metrics.jsonl")
        cmd = ["srun", "-n", str(RANKS), PIPER, "--config", job, "--metrics", metrics]
        rc, out, took = run(cmd, 120, env=slurm_env(), cwd=tmp)
        log(f"srun -n {RANKS} piper: exit code {rc}, {took:.1f} s")
        check(rc == 0, f"`{' '.join(cmd)}` failed with exit code {rc}:\n{out}")
        lines = [l for l in read(metrics).splitlines() if l.strip()]
        check(len(lines) == STEPS, f"{metrics}: expected {STEPS} lines, found {len(lines)}:\n" + "\n".join(lines))
        try:
            records = [json.loads(l) for l in lines]
        except ValueError as e:
            raise TestFailure(f"{metrics}: not JSON lines ({e}):\n" + "\n".join(lines))
        steps, losses = [r.get("step") for r in records], [float(r.get("loss", "nan")) for r in records]
        check_training("srun --metrics", steps, losses, "\n".join(lines))
        log(f"  {len(lines)} metrics lines, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
        # Same job, same layout: the batch run and the direct run train identically (the log rounds to 1e-6).
        worst = max(abs(a - b) for a, b in zip(sbatch_losses, losses))
        check(worst < 1e-4, f"srun and sbatch runs of the same job differ by up to {worst} in loss:\n"
                            f"{sbatch_losses}\n{losses}")

        # 4. A bad job file: the batch job must fail at once, with piper's message printed once.
        job_id, out_path = submit(SINGLE, "piper-bad", tmp, slurm_env(PIPER=PIPER, PIPER_JOB=bad_job),
                                  ["-n", str(RANKS)])
        state, code, waited = wait_job(job_id, out_path, 120)
        output = read(out_path)
        log(f"bad job file: job {job_id} ended {state} (ExitCode={code}) {waited:.1f} s after submission")
        check(state != "COMPLETED" and code not in ("", "0:0"),
              f"job {job_id} with a bad job file ended {state} with ExitCode={code}; expected a failure:\n{output}")
        check(waited < BAD_JOB_PROMPT_S, f"job {job_id} with a bad job file took {waited:.1f} s to end "
                                         f"(limit {BAD_JOB_PROMPT_S} s):\n{output}")
        n_errors = output.count("piper: error:")
        check(n_errors == 1 and "unknown_key" in output,
              f"job {job_id}: expected piper's error about 'unknown_key' exactly once, found "
              f"'piper: error:' {n_errors} times in {out_path}:\n{output}")

        # 5. The same bad job file launched directly with srun.
        cmd = ["srun", "-n", str(RANKS), PIPER, "--config", bad_job]
        rc, out, took = run(cmd, BAD_JOB_PROMPT_S, env=slurm_env(), cwd=tmp)
        log(f"srun -n {RANKS} piper (bad job file): exit code {rc}, {took:.1f} s")
        check(rc != 0, f"`{' '.join(cmd)}` exited 0 for a bad job file:\n{out}")
        check(out.count("piper: error:") == 1 and "unknown_key" in out,
              f"`{' '.join(cmd)}`: expected piper's error about 'unknown_key' exactly once:\n{out}")
        # 6. Stopped and requeued: scancel --signal=USR1 (what the template's --signal line makes Slurm send
        #    before the time limit) makes every rank checkpoint and exit 4; the template requeues the job, whose
        #    next run resumes (--resume auto) and ends exactly like an uninterrupted run.
        test_requeue(tmp)
        passed = True
    finally:
        rc, out, took = run(as_root([DOWN]), 60, within_deadline=False)
        log(f"slurm-local-down.sh: exit code {rc}, {took:.1f} s")
        if rc != 0:
            message = f"tools/slurm-local-down.sh failed with exit code {rc}:\n{out}"
            if passed:
                raise TestFailure(message)
            log(message)    # the failure that is already on its way matters more
    shutil.rmtree(tmp, ignore_errors=True)
    log("PASS")


if __name__ == "__main__":
    # ctest ends a test that runs too long with a signal: still tear the cluster down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("test_slurm: terminated"))
    try:
        main()
    except TestFailure as e:
        log(f"FAIL: {e}")
        sys.exit(1)
