"""A data file replaced by rename during a run (`mv new data.txt`): the run goes on with the file it opened and
says that data.path names another file now; its checkpoints record the file it read (size and hash of the old
content), so resuming with the new file, never trained on, is refused with exit code 2 naming data.path, and
resuming with the content actually used is accepted."""
import os
import re
import shutil
import subprocess
import time

from common import DATA, PIPER, fail, run, tempdir, tiny_gpt, write

CKPT = os.path.join(os.path.dirname(PIPER), "piper-ckpt")
STEPS = 6000


def fnv1a64_identity(path):
    """The identity a checkpoint records: FNV-1a 64 of the first and the last MiB (data/data.hpp)."""
    data = open(path, "rb").read()
    mib = 1 << 20
    h = 14695981039346656037
    for b in data[:mib] + data[max(0, len(data) - mib):]:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return len(data), f"fnv1a64:{h:016x}"


def recorded_data(path):
    p = subprocess.run([CKPT, "meta", path], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"piper-ckpt meta {path}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    size = re.search(r"data_bytes\s*[:=]?\s*(\d+)", p.stdout)
    digest = re.search(r"(fnv1a64:[0-9a-f]{16})", p.stdout)
    if not size or not digest:
        fail(f"piper-ckpt meta {path} shows no data_bytes and data_hash:\n{p.stdout}")
    return int(size.group(1)), digest.group(1)


def main():
    d = tempdir()
    try:
        data = os.path.join(d, "data.txt")
        shutil.copy(DATA, data)
        old = os.path.join(d, "old.txt")
        shutil.copy(DATA, old)
        new = os.path.join(d, "new.txt")
        content = open(DATA, "rb").read()
        with open(new, "wb") as f:  # other text of the same length: every id still fits the vocabulary
            f.write(content[len(content) // 2:] + content[:len(content) // 2])
        ck = os.path.join(d, "ck")
        cfg = write(d, "swap.toml", tiny_gpt(name="swap", steps=STEPS, layers=2, batch=8).replace(DATA, data) +
                    f'\n[checkpoint]\ndir = "{ck}"\nevery = 2000\nkeep = 0\n')
        mlog = os.path.join(d, "m.jsonl")
        proc = subprocess.Popen(["mpirun", "-np", "1", PIPER, "--config", cfg, "--metrics", mlog],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while not (os.path.exists(mlog) and sum(1 for _ in open(mlog)) >= 20):
            if proc.poll() is not None or time.time() - t0 > 60:
                proc.kill()
                fail(f"the run ended or ran no 20 steps before the swap:\n{proc.communicate()[1]}")
            time.sleep(0.02)
        os.rename(new, data)  # mv new.txt data.txt
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            fail("the run did not end within 300 s")
        if proc.returncode != 0:
            fail(f"the run with a swapped data file exited {proc.returncode}\n{err}")
        if "was replaced during the run" not in err or data not in err:
            fail(f"no warning that data.path was replaced during the run:\n{err}")
        last = os.path.join(ck, f"step_{STEPS:08d}.h5")
        want = fnv1a64_identity(old)
        got = recorded_data(last)
        if got != want:
            fail(f"{last} records the data file as {got}; the run read {want} (the file it opened)")
        print(f"ok  a data file renamed over during the run: warned, and the checkpoints record the file read {want}")

        more = ["--set", f"job.steps={STEPS + 10}"]
        p = run(1, cfg, "--resume", "auto", *more, check=False)
        if p.returncode != 2 or "data.path" not in p.stderr:
            fail(f"resuming with the new file, never trained on: exit {p.returncode}, expected 2 naming data.path\n"
                 f"{p.stderr}")
        print("ok  resuming with the new file is refused: exit 2: " +
              next((l for l in p.stderr.splitlines() if "data.path" in l), "")[:120])
        shutil.copy(old, data)
        p = run(1, cfg, "--resume", "auto", *more, check=False)
        if p.returncode != 0 or f"at step {STEPS}" not in p.stdout:
            fail(f"resuming with the data actually trained on: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        print("ok  resuming with the data the run read is accepted")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
