"""Asynchronous checkpoints (checkpoint.async = true): every rank writes its slices on a thread while training
goes on, and the files are the synchronous ones bit for bit — on one process and under PP2xDP2 — with the
same metrics, the same pruning, and a resume from them that continues the uninterrupted run bit for bit. A
SIGTERM during an asynchronous run still ends it with exit 4 and a checkpoint that verifies. (A full disk
under async: test_checkpoint_integrity.)"""
import os
import signal
import subprocess
import time

from common import PIPER, fail, losses, metrics, piper_ckpt, rank_pids, run, tempdir, tiny_gpt, write


def main():
    d = tempdir()
    for label, ranks, sets in (("one process", 1, []),
                               ("PP2xDP2", 4, ["--set", "mesh.pp=2", "--set", "mesh.dp=2", "--set",
                                               "mesh.microbatches=2"])):
        runs = {}
        for mode in ("sync", "async"):
            ck = os.path.join(d, f"{ranks}-{mode}")
            cfg = write(d, f"{ranks}-{mode}.toml", tiny_gpt(steps=20) +
                        f'\n[checkpoint]\ndir = "{ck}"\nevery = 5\nkeep = 2\nasync = {str(mode == "async").lower()}\n')
            out = os.path.join(d, f"{ranks}-{mode}.jsonl")
            run(ranks, cfg, "--metrics", out, *sets)
            runs[mode] = (ck, losses(out), sorted(os.listdir(ck)))
        (sck, sl, sfiles), (ack, al, afiles) = runs["sync"], runs["async"]
        if sl != al:
            fail(f"{label}: the asynchronous run's losses differ from the synchronous run's")
        if afiles != sfiles or afiles != [".lock", "step_00000015.h5", "step_00000020.h5"]:
            fail(f"{label}: files {afiles} (async) against {sfiles} (sync)")
        for f in afiles[1:]:
            p = piper_ckpt("diff", os.path.join(sck, f), os.path.join(ack, f), want=None)
            if p.returncode != 0:
                fail(f"{label}: {f} differs between the synchronous and the asynchronous run:\n{p.stdout}{p.stderr}")
            if piper_ckpt("verify", os.path.join(ack, f), want=None).returncode != 0:
                fail(f"{label}: {f} of the asynchronous run does not verify")
        print(f"ok  {label}: asynchronous checkpoints are the synchronous ones bit for bit, pruned alike")

    # resume from an asynchronous checkpoint: the uninterrupted run, bit for bit
    ck = os.path.join(d, "resume")
    cfg = write(d, "resume.toml", tiny_gpt(steps=20) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 5\nasync = true\n')
    run(1, cfg, "--steps", "12")
    out = os.path.join(d, "resumed.jsonl")
    run(1, cfg, "--resume", "auto", "--metrics", out)
    full = losses(os.path.join(d, "1-sync.jsonl"))
    got = [m["loss"] for m in metrics(out)]
    if got != full[12:]:
        fail(f"resume from an asynchronous checkpoint: {got} against {full[12:]}")
    print("ok  a resume from an asynchronous checkpoint continues the uninterrupted run bit for bit")

    # SIGTERM during an asynchronous run: exit 4, and the checkpoint it names is complete and verifies
    ck = os.path.join(d, "stop")
    cfg = write(d, "stop.toml", tiny_gpt(steps=100000) + f'\n[checkpoint]\ndir = "{ck}"\nevery = 50\nasync = true\n')
    proc = subprocess.Popen(["mpirun", "-np", "2", PIPER, "--config", cfg, "--set", "mesh.dp=2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and len([f for f in os.listdir(ck)] if os.path.isdir(ck) else []) < 3:
        time.sleep(0.2)  # .lock and two checkpoints: writes have happened beside training
    pids = rank_pids(proc.pid)
    os.kill(pids[min(pids)], signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    files = sorted(f for f in os.listdir(ck) if f.startswith("step_"))
    if proc.returncode != 4 or not files or any(f.startswith(".") and f.endswith(".tmp") for f in os.listdir(ck)):
        fail(f"SIGTERM under async: exit {proc.returncode} (expected 4), files {os.listdir(ck)}\n{out[-800:]}\n{err}")
    p = piper_ckpt("verify", ck, want=None)
    if p.returncode != 0:
        fail(f"SIGTERM under async: the checkpoints do not verify:\n{p.stdout}{p.stderr}")
    print(f"ok  SIGTERM during an asynchronous run: exit 4, {len(files)} checkpoints, all verify")


if __name__ == "__main__":
    main()
