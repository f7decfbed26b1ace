"""Resume with replicas that share the reading: under DP2 and DP4 (ZeRO 0, every replica holds the whole
state) each replica reads and checks a part of the ranges the replicas hold alike and broadcasts it. A resumed run continues bit
for bit, and a damaged block anywhere in the file, whichever replica checks it, ends every rank with exit
code 2 naming the damaged tensor, printed by the replica that found it; nothing hangs."""
import os
import shutil
import subprocess

from common import fail, metrics, run, tempdir, tiny_gpt, write


def damage_at(src, dst, fraction):
    data = bytearray(open(src, "rb").read())
    at = int(len(data) * fraction)
    for i in range(at, at + 64, 4):
        data[i] ^= 0x01  # low mantissa bits: still finite values, another hash
    open(dst, "wb").write(bytes(data))


def main():
    d = tempdir()
    try:
        ck = os.path.join(d, "ck")
        cfg = write(d, "shared.toml", tiny_gpt(name="shared", steps=20, layers=2, batch=8) +
                    f'\n[checkpoint]\ndir = "{ck}"\nevery = 10\nkeep = 0\n')
        full = os.path.join(d, "full.jsonl")
        run(2, cfg, "--set", "mesh.dp=2", "--metrics", full, "--set", f'checkpoint.dir="{ck}-full"')
        run(2, cfg, "--set", "mesh.dp=2", "--steps", "10")
        for ranks in (2, 4):
            part = os.path.join(d, f"resumed{ranks}.jsonl")
            run(ranks, cfg, "--set", f"mesh.dp={ranks}", "--resume", os.path.join(ck, "step_00000010.h5"),
                "--metrics", part, "--set", f'checkpoint.dir="{ck}-{ranks}"')
            if ranks == 2 and [m["loss"] for m in metrics(part)] != [m["loss"] for m in metrics(full)][10:]:
                fail("DP2: the resumed run differs from the uninterrupted run")
        print("ok  DP2 resumed with shared reading continues bit for bit; DP4 resumes")
        good = os.path.join(ck, "step_00000010.h5")
        for fraction in (0.2, 0.5, 0.8, 0.95):
            bad = os.path.join(d, "bad", "step_00000010.h5")
            os.makedirs(os.path.dirname(bad), exist_ok=True)
            damage_at(good, bad, fraction)
            for ranks in (2, 4):
                p = run(ranks, cfg, "--set", f"mesh.dp={ranks}", "--resume", bad, "--set", 'checkpoint.dir=""',
                        check=False, timeout=120)
                errors = [l for l in p.stderr.splitlines() if "error" in l]
                if p.returncode != 2 or not any("damaged" in l or "checksum" in l for l in errors):
                    fail(f"DP{ranks}, damage at {fraction:.0%} of the file: exit {p.returncode}, expected 2 naming "
                         f"the damage\nstderr:\n{p.stderr}")
            print(f"ok  damage at {fraction:.0%} of the file: DP2 and DP4 exit 2: {errors[0][:110]}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
