"""--dry-run compiles and verifies without training: it prints each distinct plan's instruction count, plan
bytes and estimated peak memory, the time and memory of each compile phase, --dump-plan writes the DAG (text, DOT) and the plans (text and binary), and nothing
else is written (no metrics, no checkpoints). Outside a launcher it starts no MPI. --fit-memory finds, per ZeRO level, the largest microbatch whose
estimate fits (checked against dry runs at that size and one more). --help and --version exit 0."""
import os
import subprocess

from common import PIPER, fail, run, tempdir, tiny_gpt, write


def dry_peak(cfg, *sets):
    """The highest estimated peak (MiB) over the device sets of a 4-rank dry run."""
    args = [PIPER, "--config", cfg, "--dry-run", "--world", "4"]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"dry run {sets} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    rows = [l.split() for l in p.stdout.splitlines() if l.strip()[:1].isdigit() and len(l.split()) == 11]
    return max(float(r[4]) for r in rows)


def check_fit_memory(d, cfg):
    # a limit a few sequences past one: the search must stop strictly inside it
    one, two = dry_peak(cfg, "data.batch=8"), dry_peak(cfg, "data.batch=16")  # 1 and 2 sequences per microbatch
    limit = int((one + 5.5 * (two - one)) * 1048576)
    p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--world", "4", "--fit-memory", str(limit)],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"--fit-memory failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    out = p.stdout
    if "data.batch = sequences per microbatch x 8" not in out:
        fail(f"--fit-memory does not say how data.batch follows (4 microbatches x 2 replicas):\n{out}")
    rows = [l.split() for l in out.splitlines() if l.split()[:1] in (["0"], ["1"], ["2"], ["3"]) and "rank" in l]
    if [r[0] for r in rows] != ["0", "1", "2", "3"]:
        fail(f"--fit-memory should print one row per ZeRO level 0-3:\n{out}")
    kinds = ("parameters", "gradients", "optimizer", "activations", "communication", "workspace")
    for r in rows:
        zero, seqs = r[0], int(r[1])
        if seqs < 2 or int(r[2]) != 8 * seqs or r[4] != "rank" or r[6] != "(device" or r[9] not in kinds:
            fail(f"--fit-memory row {r} (limit {limit} B):\n{out}")
        fits = dry_peak(cfg, f"data.batch={8 * seqs}", f"mesh.zero={zero}")
        over = dry_peak(cfg, f"data.batch={8 * (seqs + 1)}", f"mesh.zero={zero}")
        if not (fits * 1048576 <= limit < over * 1048576) or abs(fits - float(r[3])) > 0.01:
            fail(f"zero {zero}: {seqs} sequences peak at {fits} MiB, {seqs + 1} at {over} MiB; limit {limit} B; "
                 f"row {r}")
    print(f"ok  --fit-memory {limit}: per ZeRO level the largest fitting microbatch "
          f"({', '.join(r[1] for r in rows)} sequences), each checked against dry runs at it and one more")
    for size, why in (("80 parsecs", "is not a memory size"), ("-1GiB", "is not a memory size")):
        p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--fit-memory", size], capture_output=True, text=True,
                           timeout=30)
        if p.returncode != 2 or why not in p.stderr or "--fit-memory" not in p.stderr:
            fail(f"--fit-memory {size!r}: exit {p.returncode}, {p.stderr!r}")
    p = subprocess.run([PIPER, "--config", cfg, "--fit-memory", "1GiB"], capture_output=True, text=True, timeout=30)
    if p.returncode != 2 or "only works with --dry-run" not in p.stderr:
        fail(f"--fit-memory without --dry-run: exit {p.returncode}, {p.stderr!r}")
    print("ok  --fit-memory: a bad size, or no --dry-run, exits 2 and says why")


def main():
    d = tempdir()
    ck = os.path.join(d, "ck")
    cfg = write(d, "job.toml", tiny_gpt() + f'\n[checkpoint]\ndir = "{ck}"\nevery = 1\n'
                + "\n[mesh]\npp = 2\ndp = 2\nmicrobatches = 4\n")
    dump = os.path.join(d, "plan")
    metrics = os.path.join(d, "m.jsonl")
    p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--world", "4", "--dump-plan", dump, "--metrics", metrics],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"dry run failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    out = p.stdout
    for needle in ("dry run of 't' for 4 ranks", "instructions", "plan bytes", "est. peak MiB", "compile time",
                   "(op = \"order\", generated, default schedule)"):
        if needle not in out:
            fail(f"dry-run output lacks {needle!r}:\n{out}")
    # every phase of the compile with its time and memory; the phases add up to no more than the compile
    phases = {l.split()[2]: l.split()[3:] for l in out.splitlines() if l.startswith("compile phase ")}
    want = ["model", "graph", "passes", "lowering", "verification", "serialization"]
    if [k for k in phases if k != "(name)"] != want:
        fail(f"dry-run phases are {list(phases)}, expected {want}:\n{out}")
    total = float(out.split("compiled in ")[1].split()[0])
    times = [float(phases[k][0]) for k in want[:-1]]
    if any(t < 0 for t in times) or sum(times) > total + 0.003 or float(phases["lowering"][1]) <= 0:
        fail(f"dry-run phase times {times} (resident MiB {phases['lowering'][1]}) against a compile of {total} s")
    rows = [l for l in out.splitlines() if l.strip().startswith(("0 ", "1 ")) and len(l.split()) > 5]
    if len(rows) != 2:
        fail(f"expected one summary row per device set (2), got:\n{out}")
    for name in ("graph.txt", "graph.dot", "directives.txt", "plan_set0.txt", "plan_set1.txt", "plan_set0.bin",
                 "plan_set1.bin"):
        path = os.path.join(dump, name)
        if not os.path.isfile(path) or os.path.getsize(path) == 0:
            fail(f"--dump-plan did not write {name}")
    with open(os.path.join(dump, "plan_set1.bin"), "rb") as f:
        if f.read(4) != b"RPIP":  # kMagic 0x50495052, little-endian
            fail("plan_set1.bin does not start with the plan magic")
    plan = open(os.path.join(dump, "plan_set0.txt")).read()
    for needle in ("forward", "backward", "send", "recv", "all_reduce", "step_sync", "update", "buckets:"):
        if needle not in plan:
            fail(f"plan_set0.txt lacks {needle!r}")
    dot = open(os.path.join(dump, "graph.dot")).read()
    if not dot.startswith("digraph") or "cluster_set1" not in dot:
        fail("graph.dot is not a Graphviz digraph with one cluster per device set")
    if os.path.exists(ck) or os.path.exists(metrics):
        fail("a dry run wrote checkpoints or metrics")
    print("ok  --dry-run --world 4 --dump-plan: summary, graph (text, DOT), plans; nothing trained or written")

    # outside a launcher a dry run starts no MPI: an MPI that cannot start does not stop it
    env = dict(os.environ, OMPI_MCA_pml="does-not-exist")
    for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID"):
        env.pop(k, None)
    p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--world", "4"], capture_output=True, text=True,
                       timeout=60, env=env)
    if p.returncode != 0 or "dry run of 't' for 4 ranks" not in p.stdout:
        fail(f"a dry run outside mpirun with a broken MPI: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    print("ok  --dry-run outside a launcher runs without MPI")

    # under mpirun a dry run compiles once (rank 0) and exits 0 on every rank
    p = run(2, cfg, "--dry-run", "--set", "mesh.pp=2", "--set", "mesh.dp=1")
    if p.stdout.count("dry run of") != 1:
        fail(f"dry run under mpirun printed {p.stdout.count('dry run of')} summaries")
    print("ok  --dry-run under mpirun: one summary, exit 0")

    check_fit_memory(d, cfg)

    for flag, needle in (("--help", "--config"), ("--version", "piper ")):
        p = subprocess.run([PIPER, flag], capture_output=True, text=True, timeout=30)
        if p.returncode != 0 or needle not in p.stdout:
            fail(f"{flag}: exit {p.returncode}, output {p.stdout!r}")
    print("ok  --help and --version")


if __name__ == "__main__":
    main()
