"""Bad input ends the job cleanly: the message is printed once (naming file, line, key or directive), every
rank exits with code 2 within seconds, and nothing is written (no metrics file, no checkpoint directory).
Covers every config error class through the real CLI, and every rejected strategy before launch."""
import os
import subprocess
import time

from common import PIPER, fail, run, tempdir, tiny_gpt, write

# "Promptly": within a few seconds of what a successful launch of as many ranks takes on this machine right
# now (mpirun alone takes seconds on a loaded 2-core machine); a hang would hit the 60 s timeout instead.
PROMPT_MARGIN = 10.0
_launch_seconds = {}


def launch_seconds(ranks):
    """Time of `mpirun -np ranks piper --version`, measured once per rank count."""
    if ranks not in _launch_seconds:
        t0 = time.time()
        subprocess.run(["mpirun", "-np", str(ranks), PIPER, "--version"], capture_output=True, timeout=60)
        _launch_seconds[ranks] = time.time() - t0
    return _launch_seconds[ranks]


def expect_rejected(d, name, ranks, text, needles, *args):
    cfg = write(d, name.replace(" ", "_") + ".toml", text)
    metrics = os.path.join(d, name.replace(" ", "_") + ".jsonl")
    ckdir = os.path.join(d, "ck_" + name.replace(" ", "_"))
    p = run(ranks, cfg, "--metrics", metrics, "--set", f'checkpoint.dir="{ckdir}"', *args, check=False, timeout=60)
    errors = [line for line in p.stderr.splitlines() if line.startswith("piper: error:")]
    if p.returncode != 2:
        fail(f"{name}: exit code {p.returncode}, expected 2\n{p.stderr}")
    if len(errors) != 1:
        fail(f"{name}: expected the error printed once, got {len(errors)} times:\n{p.stderr}")
    for needle in needles:
        if needle not in errors[0]:
            fail(f"{name}: message lacks {needle!r}:\n{errors[0]}")
    if os.path.exists(metrics) or os.path.exists(ckdir):
        fail(f"{name}: something was written although the job was rejected")
    bound = launch_seconds(ranks) + PROMPT_MARGIN
    if p.seconds > bound:
        fail(f"{name}: took {p.seconds:.1f} s to exit (a plain launch of {ranks} ranks takes "
             f"{launch_seconds(ranks):.1f} s here)")
    print(f"ok  {name:40s} {ranks} ranks, exit 2 in {p.seconds:4.1f} s: {errors[0][len('piper: error: '):][:110]}")


def main():
    d = tempdir()
    base = tiny_gpt(layers=4, batch=16)
    job = os.path.join(d, "")

    # ---- config error classes (through the CLI) ----
    expect_rejected(d, "unknown key", 2, base + "\n[checkpoint]\neveryy = 3\n",
                    [".toml:", "unknown key 'checkpoint.everyy'", "did you mean 'checkpoint.every'"])
    expect_rejected(d, "wrong type", 2, base.replace("batch = 16", "batch = \"16\""),
                    [".toml:", "data.batch: expected an integer in [1, 16777216], found string \"16\""])
    expect_rejected(d, "out of range", 1, base.replace("lr = 3e-3", "lr = -1.0"),
                    [".toml:", "optimizer.lr: expected a number > 0", "found float -1"])
    expect_rejected(d, "syntax error", 1, base + "\n[job\n", [".toml:", "TOML syntax error"])
    expect_rejected(d, "bad --set", 1, base, ["--set model.n_heads", "n_heads (3) must divide d_model (32)"],
                    "--set", "model.n_heads=3")
    expect_rejected(d, "unknown CLI option", 1, base, ["command line", "unrecognised option '--stepz'"], "--stepz", "3")
    expect_rejected(d, "missing data", 2, base.replace("fortunes.txt", "missing.txt"), ["data.path", "no readable file"])
    expect_rejected(d, "unusable checkpoint folder", 1, base, ["checkpoint.dir = \"/proc/piper-test\"", "cannot be"],
                    "--set", 'checkpoint.dir="/proc/piper-test"')

    # ---- strategies rejected before launch ----
    ann = "\n[[annotate]]\ntag = \"PP\"\nlayers = [[0, 1], [2, 3]]\n"
    def place(stage, devices):
        return f"\n[[directive]]\nop = \"place\"\nfilter = {{ PP = {stage} }}\ndevices = {devices}\n"
    rep = "\n[[directive]]\nop = \"replicate\"\nfilter = { PP = \"*\" }\n"
    expect_rejected(d, "ranks beyond the world", 2, base + ann + place(0, [0]) + place(1, [2]),
                    ["directive #1 (op = \"place\"", ".toml:", "name rank 2 but the job runs on 2 ranks",
                     "device counts do not match the world size"])
    expect_rejected(d, "ranks left idle", 4, base + ann + place(0, [0]) + place(1, [1]),
                    ["use 2 of the 4 ranks", "ranks [2, 3] hold nothing"])
    expect_rejected(d, "overlapping sets", 4, base + ann + place(0, [0, 1]) + place(1, [1, 2]) + rep,
                    ["directive #1 (op = \"place\"", "overlap device set [0, 1] of directive #0", "rank 1 in both"])
    expect_rejected(d, "unequal sets", 3, base + ann + place(0, [0]) + place(1, [1, 2]) + rep,
                    ["directive #1", "device set [1, 2] has 2 ranks", "has 1; all device sets must have the same size"])
    expect_rejected(d, "filter matches nothing", 2, base + ann + place(0, [0]) + place(5, [1]),
                    ["directive #1 (op = \"place\"", "filter {PP = 5} matches no region"])
    expect_rejected(d, "region left unplaced", 1, base + ann + place(0, [0]),
                    ["region 1 {PP=1}", "is not placed"])
    expect_rejected(d, "microbatches do not divide", 2,
                    base + ann + place(0, [0]) + place(1, [1]) + "\n[[directive]]\nop = \"split\"\ncount = 5\n",
                    ["directive #2 (op = \"split\"", "5 microbatches do not divide the per-replica batch of 16"])
    expect_rejected(d, "batch does not divide replicas", 3, base + "\n[mesh]\ndp = 3\n",
                    ["data.batch = 16 does not divide among the 3 replicas"])
    expect_rejected(d, "mesh size differs from world", 4, base + "\n[mesh]\npp = 2\n",
                    ["[mesh] pp = 2", "the job runs on 4 ranks"])
    cycle = ("\n[[directive]]\nop = \"order\"\n"
             "filters = [[{ PP = 0, MB = 0, PASS = \"B\" }], [{ PP = 0, MB = 0, PASS = \"F\" }]]\n")
    expect_rejected(d, "order cycle", 2, base + ann + place(0, [0]) + place(1, [1]) + cycle,
                    ["directive #2 (op = \"order\"", ".toml:", "cycle", "F[MB=0,PP=0]", "B[MB=0,PP=0]"])
    across = ("\n[[directive]]\nop = \"order\"\n"
              "filters = [[{ PP = 0, MB = 0, PASS = \"F\" }], [{ PP = 1, MB = 0, PASS = \"F\" }]]\n")
    expect_rejected(d, "order across device sets", 2, base + ann + place(0, [0]) + place(1, [1]) + across,
                    ["directive #2 (op = \"order\"", "applies to one device set"])
    nomatch = ("\n[[directive]]\nop = \"order\"\nfilters = [[{ PP = 0, MB = 7, PASS = \"F\" }]]\n")
    expect_rejected(d, "order filter matches nothing", 2, base + ann + place(0, [0]) + place(1, [1]) + nomatch,
                    ["directive #2 (op = \"order\"", "slot 0 filter {MB = 7, PASS = \"F\", PP = 0} matches no compute node"])
    expect_rejected(d, "replicated set without replicate", 2, base, ["runs on 2 ranks", "no replicate directive"])
    del job


if __name__ == "__main__":
    main()
