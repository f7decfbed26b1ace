#!/usr/bin/env python3
"""Runs that end well: a non-finite loss stops the job (exit 3) or skips the update, never writes or keeps
non-finite weights, and the metrics stay JSON; SIGTERM/SIGUSR1 on any rank makes every rank write a checkpoint
and exit 4, and the resumed run continues bit-for-bit; a second signal exits at once."""
import glob
import json
import math
import os
import shutil
import signal
import subprocess
import time

from common import PIPER, fail, metrics, rank_pids, run, tempdir, tiny_gpt, write

# lr 10 without clipping diverges to a NaN gradient norm (step 275 on one process; 195 in an ASan+UBSan build,
# whose rounding differs); after a skipped update the next steps can be finite again.
DIVERGE = ["--set", "optimizer.lr=10", "--set", "optimizer.grad_clip=0", "--set", "optimizer.warmup_steps=0",
           "--set", "optimizer.beta2=0.5"]
# With a vanishing AdamW eps as well it diverges for good between the first checkpoint (step 50) and step 300
# on one process and on two in either build (steps 113 and 73; 104 and 108 under ASan+UBSan); without it two
# ranks of the ASan+UBSan build were still finite at step 300.
DIVERGE_FOR_GOOD = DIVERGE + ["--set", "optimizer.eps=1e-30"]


def json_lines(path):
    """Every line must be JSON (no -nan); returns them."""
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            try:
                out.append(json.loads(line))
            except ValueError as e:
                fail(f"{path}:{i + 1}: not JSON ({e}): {line.strip()}")
    return out


def ckpt_step(path):
    return int(os.path.basename(path)[5:13])


def check_nonfinite_stop(d):
    ck = os.path.join(d, "nf")
    cfg = write(d, "nf.toml", tiny_gpt(name="nf", steps=300, layers=2, batch=4) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 50\nkeep = 2\n')
    for ranks, sets in ((1, []), (2, ["--set", "mesh.pp=2"])):
        for f in glob.glob(os.path.join(ck, "*.h5")):
            os.remove(f)
        mpath = os.path.join(d, f"nf{ranks}.jsonl")
        p = run(ranks, cfg, "--metrics", mpath, *DIVERGE_FOR_GOOD, *sets, check=False)
        if p.returncode != 3:
            fail(f"non-finite loss on {ranks} rank(s): exit {p.returncode}, expected 3\n{p.stdout[-2000:]}\n{p.stderr}")
        if "not finite" not in p.stderr or "no checkpoint written" not in p.stderr:
            fail(f"non-finite stop: the message does not say what happened:\n{p.stderr}")
        lines = json_lines(mpath)
        bad = lines[-1]
        if bad.get("grad_norm") is not None and bad.get("loss") is not None:
            fail(f"the last metrics line should hold null for the non-finite value: {bad}")
        files = sorted(glob.glob(os.path.join(ck, "step_*.h5")))
        if not files or ckpt_step(files[-1]) >= bad["step"]:
            fail(f"checkpoints after the non-finite step {bad['step']}: {files}")
        # the newest checkpoint holds finite weights: one more step from it is finite
        rpath = os.path.join(d, f"nf{ranks}-resumed.jsonl")
        run(ranks, cfg, "--resume", files[-1], "--steps", str(ckpt_step(files[-1]) + 1), "--metrics", rpath, *sets,
            "--set", f'checkpoint.dir="{ck}-resumed"')
        loss = metrics(rpath)[-1]["loss"]
        if not isinstance(loss, (int, float)) or not math.isfinite(loss):
            fail(f"resumed from {files[-1]}: loss {loss}")
        print(f"ok  non-finite at step {bad['step']} on {ranks} rank(s): exit 3, metrics JSON, "
              f"newest checkpoint step {ckpt_step(files[-1])} resumes finite")


def check_nonfinite_skip(d):
    ck = os.path.join(d, "skip")
    cfg = write(d, "skip.toml", tiny_gpt(name="skip", steps=300, layers=2, batch=4) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 1\nkeep = 3\n')
    mpath = os.path.join(d, "skip.jsonl")
    # Whether the steps after a non-finite one are finite again is chaotic: it differs between builds and
    # processors, and from seed to seed (measured on a Zen 2 EPYC: 2 of 7 seeds in the release build, 1 of 5 under
    # ASan+UBSan, whose rounding differs). The first run whose divergence passes is checked: each recipe on the
    # job's seed, then on seeds 1 to 8.
    tried = []
    runs = [(recipe, seed) for seed in (None, 1, 2, 3, 4, 5, 6, 7, 8)
            for recipe in (DIVERGE, DIVERGE + ["--set", "optimizer.eps=1e-12"])]
    for recipe, seed in runs:
        shutil.rmtree(ck, ignore_errors=True)
        seeded = ["--set", f"job.seed={seed}"] if seed else []
        p = run(1, cfg, "--metrics", mpath, *recipe, *seeded, "--set", 'job.on_nonfinite="skip"', "--set",
                "job.max_skipped=3", check=False)
        lines = json_lines(mpath)
        skipped = [m["step"] for m in lines if m.get("skipped")]
        after = [m for m in lines if skipped and m["step"] > skipped[0] and not m.get("skipped")]
        tried.append(f"{' '.join(recipe + seeded)}: exit {p.returncode}, skipped {skipped[:8]}")
        if skipped and after:
            break
    else:
        fail("on_nonfinite = skip: no run gave a skipped step after which training went on:\n" + "\n".join(tried))
    if p.returncode != 3 or "3 steps in a row" not in p.stderr:
        fail(f"on_nonfinite = skip, max_skipped = 3: exit {p.returncode}, expected 3 after three in a row\n{p.stderr}")
    # the last two checkpoints follow skipped steps: parameters and moments must be unchanged
    files = sorted(glob.glob(os.path.join(ck, "step_*.h5")))
    last_two = [ckpt_step(f) for f in files[-2:]]
    if not all(s in skipped for s in last_two):
        fail(f"expected the last checkpoints {last_two} after skipped steps {skipped}")
    for group in ("params", "adam_m", "adam_v"):
        h = subprocess.run(["h5diff", files[-2], files[-1], f"/{group}", f"/{group}"], capture_output=True, text=True)
        if h.returncode != 0:
            fail(f"a skipped step changed /{group}: h5diff {files[-2]} {files[-1]} exit {h.returncode}\n{h.stdout[:1000]}")
    print(f"ok  on_nonfinite = skip: steps {skipped} skipped without changing parameters or moments, "
          f"training went on, exit 3 after three in a row")


def start(ranks, cfg, *args):
    cmd = ["mpirun", "-np", str(ranks), PIPER, "--config", cfg] + list(args)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_lines(mpath, n, proc, deadline=60):
    t0 = time.time()
    while time.time() - t0 < deadline:
        if os.path.exists(mpath) and sum(1 for _ in open(mpath)) >= n:
            return
        if proc.poll() is not None:
            fail(f"the job ended before it could be signalled: exit {proc.returncode}\n{proc.stderr.read()}")
        time.sleep(0.05)
    fail(f"no {n} metrics lines within {deadline} s")


def finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        fail(f"the job did not end within {timeout} s after the signal\n{err}")
    return proc.returncode, out, err


def check_signals(d):
    steps = 6000
    ck = os.path.join(d, "sig")
    cfg = write(d, "sig.toml", tiny_gpt(name="sig", steps=steps, layers=2, batch=8) +
                f'\n[checkpoint]\ndir = "{ck}"\nevery = 100000\nkeep = 0\n')
    sets = ["--set", "mesh.dp=2"]
    full = os.path.join(d, "sig-full.jsonl")
    run(2, cfg, "--metrics", full, *sets, "--set", f'checkpoint.dir="{ck}-full"')
    ref = {m["step"]: m["loss"] for m in metrics(full)}

    # SIGTERM to one rank: every rank stops after the same step with one checkpoint, exit 4
    part = os.path.join(d, "sig-part.jsonl")
    proc = start(2, cfg, "--metrics", part, *sets)
    wait_for_lines(part, 20, proc)
    os.kill(rank_pids(proc.pid)[1], signal.SIGTERM)
    rc, out, err = finish(proc)
    files = glob.glob(os.path.join(ck, "step_*.h5"))
    if rc != 4 or len(files) != 1 or "got SIGTERM" not in err:
        fail(f"SIGTERM to one rank: exit {rc} (expected 4), checkpoints {files}\n{out[-1500:]}\n{err}")
    stopped = ckpt_step(files[0])
    if not 20 <= stopped < steps or metrics(part)[-1]["step"] != stopped:
        fail(f"stopped at step {stopped}, metrics end at {metrics(part)[-1]['step']}")
    resumed = os.path.join(d, "sig-resumed.jsonl")
    run(2, cfg, "--resume", "auto", "--metrics", resumed, *sets)
    tail = metrics(resumed)
    want = [ref[m["step"]] for m in tail]
    if [m["loss"] for m in tail] != want or tail[0]["step"] != stopped + 1 or tail[-1]["step"] != steps:
        fail(f"the run resumed after SIGTERM at step {stopped} differs from the uninterrupted run")
    print(f"ok  SIGTERM to one of 2 ranks: both stopped after step {stopped} with a checkpoint, exit 4; "
          f"--resume auto continued bit-for-bit to step {steps}")

    # SIGUSR1 to mpirun (forwarded to every rank): exit 4 with a checkpoint
    for f in glob.glob(os.path.join(ck, "*")):
        os.remove(f)
    part = os.path.join(d, "usr1.jsonl")
    proc = start(2, cfg, "--metrics", part, *sets)
    wait_for_lines(part, 20, proc)
    proc.send_signal(signal.SIGUSR1)
    rc, out, err = finish(proc)
    files = glob.glob(os.path.join(ck, "step_*.h5"))
    if rc != 4 or len(files) != 1:
        fail(f"SIGUSR1 to mpirun: exit {rc} (expected 4), checkpoints {files}\n{err}")
    print(f"ok  SIGUSR1 to mpirun: checkpoint at step {ckpt_step(files[0])}, exit 4")

    # two signals to one rank: it exits at once with 128 + SIGTERM, the job ends
    part = os.path.join(d, "twice.jsonl")
    proc = start(2, cfg, "--metrics", part, *sets, "--set", f'checkpoint.dir="{ck}-twice"')
    wait_for_lines(part, 20, proc)
    # the other rank is held (SIGSTOP), so the signalled one waits at the step boundary when the second comes
    ranks = rank_pids(proc.pid)
    held, victim = ranks[0], ranks[1]
    os.kill(held, signal.SIGSTOP)
    os.kill(victim, signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.time()
    os.kill(victim, signal.SIGTERM)
    for _ in range(100):
        if not os.path.exists(f"/proc/{victim}") or open(f"/proc/{victim}/stat").read().split()[2] == "Z":
            break
        time.sleep(0.05)
    else:
        fail("a second SIGTERM did not end the rank within 5 s")
    os.kill(held, signal.SIGCONT)
    rc, out, err = finish(proc, timeout=30)
    if rc in (0, 4) or "second stop signal" not in err or glob.glob(os.path.join(ck + "-twice", "step_*.h5")):
        fail(f"a second SIGTERM: exit {rc}, expected an immediate failure without a checkpoint\n{err}")
    print(f"ok  a second SIGTERM ends the rank at once: job exit {rc} after {time.time() - t0:.1f} s")


def main():
    d = tempdir()
    check_nonfinite_stop(d)
    check_nonfinite_skip(d)
    check_signals(d)


if __name__ == "__main__":
    main()
