"""The watchdog ends a job in which a rank stopped: with job.watchdog_s = 3, SIGSTOP on one rank of a PP2 or a
DP2 job ends the whole job within watchdog_s + 15 s with exit code 5, and stderr holds the watchdog's message
(naming job.watchdog_s) and the flight recorder of a rank that still runs, naming its unfinished instruction.
A healthy job with watchdog_s = 2 (checkpoints included) finishes with exit code 0 and no word of the watchdog.
A rank held inside a checkpoint save (its checkpoint write delayed by strace's fault injection, as a stopped
rank or a hung file system would) ends the job the same way, within the save's own limit, and the message
names the save. Every wait is bounded: the script never hangs, whatever the build does."""
import glob
import os
import re
import shutil
import signal
import subprocess
import threading
import time

from common import PIPER, fail, rank_pids, run, tempdir, tiny_gpt, write

WATCHDOG_S = 3
END_WITHIN = WATCHDOG_S + 15  # seconds from SIGSTOP to the end of the job
START_WITHIN = 30             # seconds until the job has run a few steps


def signal_quietly(pid, sig):
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stopped_rank_job(d, name, ranks, stop_rank, sets):
    """Starts a job of many steps, stops rank `stop_rank` once steps run, returns (exit code, seconds, stderr)."""
    cfg = write(d, name + ".toml", tiny_gpt(name=name, steps=1000000, layers=2, batch=8))
    cmd = ["mpirun", "-np", str(ranks), PIPER, "--config", cfg, "--set", f"job.watchdog_s={WATCHDOG_S}"] + sets
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    stepping = threading.Event()

    def read_stdout():
        for line in p.stdout:
            out.append(line)
            if re.match(r"step\s+3/", line):
                stepping.set()

    def read_stderr():
        for line in p.stderr:
            err.append(line)

    readers = [threading.Thread(target=read_stdout, daemon=True), threading.Thread(target=read_stderr, daemon=True)]
    for t in readers:
        t.start()
    pids = {}
    try:
        if not stepping.wait(START_WITHIN):
            fail(f"{name}: no step 3 within {START_WITHIN} s\nstdout:\n{''.join(out)}\nstderr:\n{''.join(err)}")
        pids = rank_pids(p.pid)
        if sorted(pids) != list(range(ranks)):
            fail(f"{name}: found the processes of ranks {sorted(pids)} under mpirun, expected 0..{ranks - 1}")
        os.kill(pids[stop_rank], signal.SIGSTOP)
        t0 = time.time()
        try:
            code = p.wait(timeout=END_WITHIN)
        except subprocess.TimeoutExpired:
            fail(f"{name}: the job still runs {END_WITHIN} s after rank {stop_rank} stopped\n"
                 f"stderr:\n{''.join(err)}")
        seconds = time.time() - t0
        for t in readers:
            t.join(timeout=5)
        return code, seconds, "".join(err)
    finally:
        if p.poll() is None:
            pids = pids or rank_pids(p.pid)
        for pid in pids.values():  # leftovers: let a stopped rank go, then end it
            signal_quietly(pid, signal.SIGCONT)
            signal_quietly(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)


def expect_watchdog(d, name, ranks, stop_rank, sets):
    code, seconds, err = stopped_rank_job(d, name, ranks, stop_rank, sets)
    if code != 5:
        fail(f"{name}: exit code {code}, expected 5\nstderr:\n{err}")
    fired = [l for l in err.splitlines() if re.match(r"piper: rank \d+: watchdog: no instruction finished", l)]
    if not fired or "job.watchdog_s = 3" not in fired[0]:
        fail(f"{name}: no watchdog message naming job.watchdog_s\nstderr:\n{err}")
    # a rank that still runs prints its flight recorder: its unfinished instruction, and its last instructions
    unfinished = [l for l in err.splitlines()
                  if re.match(r"piper: rank \d+: stream \d+ \([^)]+\): unfinished #\d+ [A-Z_]+", l)
                  and not l.startswith(f"piper: rank {stop_rank}:")]
    if not unfinished:
        fail(f"{name}: no running rank named its unfinished instruction\nstderr:\n{err}")
    running = unfinished[0].split(":")[1].strip()  # "rank N"
    records = [l for l in err.splitlines()
               if l.startswith(f"piper: {running}:   step ") and re.search(r"start +-?\d+\.\d+ +end ", l)]
    if not records:
        fail(f"{name}: {running} printed no flight recorder records\nstderr:\n{err}")
    print(f"ok  {name:34s} exit 5 {seconds:4.1f} s after SIGSTOP of rank {stop_rank}: "
          f"{unfinished[0][len('piper: '):][:90]}")


def held_in_save(d):
    """Rank 1's first pwrite (its share of the step-10 checkpoint) waits 60 s; the watchdog must end the job."""
    if not shutil.which("strace"):
        fail("strace is not installed (tools/install-deps.sh installs it)")
    wrapper = write(d, "hold-rank1.sh", '#!/usr/bin/env bash\n# rank 1 runs under strace, its writes delayed\n'
                    'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then\n'
                    '  exec strace -f -qq -o /dev/null -e trace=pwrite64 -e inject=pwrite64:delay_enter=60s "$@"\n'
                    'fi\nexec "$@"\n')
    os.chmod(wrapper, 0o755)
    ck = os.path.join(d, "ck-held")
    cfg = write(d, "held.toml", tiny_gpt(name="held", steps=40, layers=2, batch=8) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\n')
    cmd = ["mpirun", "-np", "2", wrapper, PIPER, "--config", cfg, "--set", f"job.watchdog_s={WATCHDOG_S}",
           "--set", "mesh.dp=2"]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=END_WITHIN + 20)
    except subprocess.TimeoutExpired as e:
        fail(f"a rank held in a save: the job still ran after {END_WITHIN + 20} s\nstderr:\n{e.stderr}")
    seconds = time.time() - t0
    fired = [l for l in p.stderr.splitlines() if "watchdog: the save of checkpoint step 10 has not ended" in l]
    if p.returncode != 5 or not fired or "job.watchdog_s = 3" not in fired[0]:
        fail(f"a rank held in a save: exit {p.returncode} after {seconds:.1f} s, expected 5 with the watchdog "
             f"naming the save of step 10\nstderr:\n{p.stderr}")
    if glob.glob(os.path.join(ck, "step_00000010.h5")):
        fail("a rank held in a save: the unfinished checkpoint got its final name")
    print(f"ok  {'DP2, rank 1 held in a save':34s} exit 5 in {seconds:4.1f} s: {fired[0][len('piper: '):][:90]}")


def main():
    d = tempdir()
    # A healthy job: steps take milliseconds, the checkpoints between them do not count; nothing fires.
    cfg = write(d, "healthy.toml", tiny_gpt(name="healthy", steps=40, layers=2, batch=8))
    ck = os.path.join(d, "ck")
    p = run(2, cfg, "--set", "job.watchdog_s=2", "--set", "mesh.pp=2", "--set", "mesh.microbatches=2",
            "--set", f'checkpoint.dir="{ck}"', "--set", "checkpoint.every=10", timeout=60)
    if "watchdog" in p.stderr:
        fail(f"healthy job: the watchdog spoke\nstderr:\n{p.stderr}")
    print(f"ok  {'healthy PP2, watchdog_s = 2':34s} exit 0 in {p.seconds:4.1f} s, the watchdog stayed quiet")

    # The last pipeline stage stops: the first waits for its gradients. Then a data-parallel replica stops.
    expect_watchdog(d, "PP2, rank 1 stopped", 2, 1, ["--set", "mesh.pp=2", "--set", "mesh.microbatches=2"])
    expect_watchdog(d, "DP2, rank 0 stopped", 2, 0, ["--set", "mesh.dp=2"])
    held_in_save(d)


if __name__ == "__main__":
    main()
