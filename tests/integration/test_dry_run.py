"""--dry-run compiles and verifies without training: it reports each distinct plan's instruction count, plan
bytes and estimated peak memory by kind, the time and memory of each compile phase (--json: one JSON document,
read here; the text shows the same rows), --dump-plan writes the DAG (text, DOT) and the plans (text and
binary), and nothing else is written (no metrics, no checkpoints). Outside a launcher it starts no MPI.
--fit-memory finds, per ZeRO level, the largest microbatch whose estimate fits (checked against dry runs at
that size and one more). --json and --report-json are refused where they do not apply. --help and --version
exit 0."""
import json
import os
import subprocess

from common import PIPER, dry_run_json, fail, run, tempdir, tiny_gpt, write


KINDS = ("parameters", "gradients", "optimizer", "activations", "communication", "workspace")


def dry_peak(cfg, *sets):
    """The highest estimated peak (bytes) over the device sets of a 4-rank dry run."""
    args = ["--world", "4"]
    for s in sets:
        args += ["--set", s]
    return max(s["memory"]["peak_total_bytes"] for s in dry_run_json(cfg, *args)["device_sets"])


def check_fit_memory(d, cfg):
    # a limit a few sequences past one: the search must stop strictly inside it
    one, two = dry_peak(cfg, "data.batch=8"), dry_peak(cfg, "data.batch=16")  # 1 and 2 sequences per microbatch
    limit = int(one + 5.5 * (two - one))
    fit = dry_run_json(cfg, "--world", "4", "--fit-memory", f"{limit}B", timeout=120)["fit_memory"]
    if fit["batch_per_sequence"] != 8 or fit["limit_bytes"] != limit or not fit["replicated"]:
        fail(f"--fit-memory does not say how data.batch follows (4 microbatches x 2 replicas): {fit}")
    every = fit["rows"]
    policies = ("none", "selective", "full")
    if [(r["zero"], r["recompute"]) for r in every] != [(z, p) for z in range(4) for p in policies]:
        fail(f"--fit-memory should give one row per ZeRO level 0-3 and recompute policy {policies}: {every}")
    rows = [r for r in every if r["recompute"] == "none"]  # the job as given: it has no recompute directive
    for none, sel, full in zip(*([r for r in every if r["recompute"] == p] for p in policies)):
        if not (full["sequences"] >= sel["sequences"] >= none["sequences"]
                and none["extra_flops"] == 0 < sel["extra_flops"] < full["extra_flops"] < 0.34):
            fail(f"--fit-memory: more recompute should fit at least as much, for more FLOPs: {none}, {sel}, {full}")
    for r in rows:
        zero, seqs, why = r["zero"], r["sequences"], r["limited_by"]
        if (seqs < 2 or r["data_batch"] != 8 * seqs or r["error"] is not None or r["capped"] or why is None
                or not 0 <= why["rank"] < 4 or why["device_set"] not in (0, 1) or why["buffer_kind"] not in KINDS
                or not 0 < why["buffer_kind_bytes"] <= why["peak_bytes"]):
            fail(f"--fit-memory row {r} (limit {limit} B)")
        fits = dry_peak(cfg, f"data.batch={8 * seqs}", f"mesh.zero={zero}")
        over = dry_peak(cfg, f"data.batch={8 * (seqs + 1)}", f"mesh.zero={zero}")
        if not (fits <= limit < over) or fits != r["peak_bytes"] or over != why["peak_bytes"]:
            fail(f"zero {zero}: {seqs} sequences peak at {fits} B, {seqs + 1} at {over} B; limit {limit} B; row {r}")
    print(f"ok  --fit-memory {limit} --json: per ZeRO level the largest fitting microbatch "
          f"({', '.join(str(r['sequences']) for r in rows)} sequences), each checked against dry runs at it and one more")
    # the table for people: its header and a row per level
    p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--world", "4", "--fit-memory", f"{limit}B"],
                       capture_output=True, text=True, timeout=120)
    text_rows = [l.split() for l in p.stdout.splitlines() if l.split()[:1] in (["0"], ["1"], ["2"], ["3"]) and "rank" in l]
    if (p.returncode != 0 or "data.batch = sequences per microbatch x 8" not in p.stdout
            or [(int(t[0]), t[1], int(t[2])) for t in text_rows] != [(r["zero"], r["recompute"], r["sequences"])
                                                                     for r in every]):
        fail(f"--fit-memory as text ({p.returncode}) does not show the rows of --json {every}:\n{p.stdout}\n{p.stderr}")
    print("ok  --fit-memory as text: the same rows in a table")
    for size, why in (("80 parsecs", "is not a memory size"), ("-1GiB", "is not a memory size"),
                      ("80", "'80' has no unit; say which (80GiB, 80GB, or 80B for bytes)")):
        p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--fit-memory", size], capture_output=True, text=True,
                           timeout=30)
        if p.returncode != 2 or why not in p.stderr or "--fit-memory" not in p.stderr:
            fail(f"--fit-memory {size!r}: exit {p.returncode}, {p.stderr!r}")
    p = subprocess.run([PIPER, "--config", cfg, "--fit-memory", "1GiB"], capture_output=True, text=True, timeout=30)
    if p.returncode != 2 or "only works with --dry-run" not in p.stderr:
        fail(f"--fit-memory without --dry-run: exit {p.returncode}, {p.stderr!r}")
    print("ok  --fit-memory: a bad size, a size without a unit, or no --dry-run, exits 2 and says why")


def main():
    d = tempdir()
    ck = os.path.join(d, "ck")
    cfg = write(d, "job.toml", tiny_gpt() + f'\n[checkpoint]\ndir = "{ck}"\nevery = 1\n'
                + "\n[mesh]\npp = 2\ndp = 2\nmicrobatches = 4\n")
    dump = os.path.join(d, "plan")
    metrics = os.path.join(d, "m.jsonl")
    doc = dry_run_json(cfg, "--world", "4", "--dump-plan", dump, "--metrics", metrics)
    if doc["job"] != "t" or doc["world"] != 4 or doc["model"]["kind"] != "gpt" or doc["model"]["parameters"] <= 0:
        fail(f"--dry-run --json: job, world or model wrong: {doc['job']!r}, {doc['world']}, {doc['model']}")
    if not any("(op = \"order\", generated, default schedule)" in x["text"] and x["op"] == "order"
               for x in doc["directives"]):
        fail(f"--dry-run --json: no generated order directive among {doc['directives']}")
    # every phase of the compile with its time and memory; the phases add up to no more than the compile
    phases = {ph["name"]: ph for ph in doc["compile_phases"]}
    want = ["model", "graph", "passes", "lowering", "verification", "serialization"]
    if [ph["name"] for ph in doc["compile_phases"]] != want:
        fail(f"dry-run phases are {list(phases)}, expected {want}")
    total = doc["compile_seconds"]
    times = [phases[k]["seconds"] for k in want[:-1]]
    if any(t < 0 for t in times) or sum(times) > total + 0.003 or not phases["lowering"]["resident_bytes"] > 0:
        fail(f"dry-run phase times {times} (resident {phases['lowering']['resident_bytes']} B) against a compile of "
             f"{total} s")
    # one entry per device set, with its size and memory estimate by kind in exact bytes
    sets = doc["device_sets"]
    if [s["device_set"] for s in sets] != [0, 1] or sorted(r for s in sets for r in s["ranks"]) != [0, 1, 2, 3]:
        fail(f"expected one entry per device set (2) covering ranks 0-3, got {sets}")
    for s in sets:
        mem = s["memory"]
        if (s["instructions"] <= 0 or s["plan_bytes"] <= 0 or sorted(mem["peak_bytes"]) != sorted(KINDS)
                or sorted(mem["steady_bytes"]) != sorted(KINDS) or not 0 <= s["predicted_bubble"] < 1
                or not max(mem["peak_bytes"].values()) <= mem["peak_total_bytes"] <= sum(mem["peak_bytes"].values())
                or not all(isinstance(v, int) for v in list(mem["peak_bytes"].values()) + [mem["peak_total_bytes"]])
                or not s["buckets"]):
            fail(f"device set {s['device_set']}: {s}")
    if doc["plan_bytes_sent"] != sum(s["plan_bytes"] for s in sets) or not doc["cost_model"]["predicted_step"] > 0:
        fail(f"plan bytes sent {doc['plan_bytes_sent']} or predicted step {doc['cost_model']}")
    if doc["dump_plan"]["dir"] != dump or "plan_set1.bin" not in doc["dump_plan"]["files"]:
        fail(f"--dump-plan in the document: {doc['dump_plan']}")
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

    # a CUDA job's dry run predicts with a GPU's rates (H100, named), not the CPU's; a written preset wins
    cpu_step = doc["cost_model"]["predicted_step"]
    gpu = dry_run_json(cfg, "--world", "4", "--set", 'job.backend="cuda"')["cost_model"]
    h200 = dry_run_json(cfg, "--world", "4", "--set", 'job.backend="cuda"', "--set", 'cost.preset="h200"')["cost_model"]
    if (not gpu["name"].startswith('h100 (the preset of backend = "cuda")') or not h200["name"].startswith("h200:")
            or not gpu["predicted_step"] < cpu_step / 2):
        fail(f"a CUDA dry run's cost model: {gpu} (CPU job: {cpu_step} s a step), with preset h200: {h200}")
    print(f"ok  a CUDA job's dry run predicts with {gpu['name'].split(':')[0]}: {gpu['predicted_step']:.3g} s a step "
          f"against {cpu_step:.3g} s on the CPU model")

    # outside a launcher a dry run starts no MPI: an MPI that cannot start does not stop it
    env = dict(os.environ, OMPI_MCA_pml="does-not-exist")
    for k in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID"):
        env.pop(k, None)
    p = subprocess.run([PIPER, "--config", cfg, "--dry-run", "--world", "4"], capture_output=True, text=True,
                       timeout=60, env=env)
    if p.returncode != 0 or "dry run of 't' for 4 ranks" not in p.stdout:
        fail(f"a dry run outside mpirun with a broken MPI: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    print("ok  --dry-run outside a launcher runs without MPI")
    # the report for people: the same numbers as the document, in columns
    out = p.stdout
    for needle in ("instructions", "plan bytes", "est. peak MiB", "compile time", "compile phase serialization",
                   "(op = \"order\", generated, default schedule)"):
        if needle not in out:
            fail(f"dry-run output lacks {needle!r}:\n{out}")
    rows = [l.split() for l in out.splitlines() if l.strip().startswith(("0 ", "1 ")) and len(l.split()) > 5]
    if [(int(r[0]), int(r[2])) for r in rows] != [(s["device_set"], s["instructions"]) for s in sets]:
        fail(f"the text rows do not show the document's device sets {sets}:\n{out}")
    print("ok  --dry-run as text: the same device sets in a table")

    # under mpirun a dry run compiles once (rank 0) and exits 0 on every rank
    p = run(2, cfg, "--dry-run", "--json", "--set", "mesh.pp=2", "--set", "mesh.dp=1")
    try:
        one = json.loads(p.stdout)  # two ranks printing would make two documents
    except ValueError as e:
        fail(f"dry run under mpirun did not print one JSON document ({e}):\n{p.stdout}")
    if one["world"] != 2 or len(one["device_sets"]) != 2:
        fail(f"dry run under mpirun: world {one['world']}, {len(one['device_sets'])} device sets")
    print("ok  --dry-run --json under mpirun: one document, exit 0")

    # --json belongs to the dry run, --report-json to a training run
    for args, why in ((["--json"], "--json only works with --dry-run"),
                      (["--dry-run", "--report-json", os.path.join(d, "r.json")], "--report-json FILE has no effect")):
        p = subprocess.run([PIPER, "--config", cfg] + args, capture_output=True, text=True, timeout=30)
        if p.returncode != 2 or why not in p.stderr or p.stdout:
            fail(f"{args}: exit {p.returncode}, {p.stdout!r}, {p.stderr!r}")
    inside_file = os.path.join(cfg, "r.json")
    p = run(1, cfg, "--report-json", inside_file, "--set", "mesh.pp=1", "--set", "mesh.dp=1", check=False)
    if p.returncode != 2 or f"--report-json {inside_file}: cannot be written" not in p.stderr or os.path.exists(ck):
        fail(f"--report-json inside a file: exit {p.returncode}, {p.stderr!r}")
    print("ok  --json without --dry-run, --report-json with it, or where no file can be made: exit 2, nothing run")

    check_fit_memory(d, cfg)
    # recompute lets a larger microbatch fit where activations bound it
    rows = dry_run_json("configs/qwen3-1b-pp8-dp2.toml", "--world", "16", "--fit-memory", "80GiB")["fit_memory"]["rows"]
    by = {(r["zero"], r["recompute"]): r["sequences"] for r in rows}
    if not all(by[(z, "full")] > by[(z, "selective")] > by[(z, "none")] > 0 for z in range(4)):
        fail(f"--fit-memory 80GiB on configs/qwen3-1b-pp8-dp2.toml: recompute should fit more sequences: {by}")
    print(f"ok  --fit-memory 80GiB, qwen3-1b-pp8-dp2: {by[(0, 'none')]} sequences per microbatch without recompute, "
          f"{by[(0, 'selective')]} with selective, {by[(0, 'full')]} with full")

    for flag, needle in (("--help", "--config"), ("--version", "piper ")):
        p = subprocess.run([PIPER, flag], capture_output=True, text=True, timeout=30)
        if p.returncode != 0 or needle not in p.stdout:
            fail(f"{flag}: exit {p.returncode}, output {p.stdout!r}")
    print("ok  --help and --version")


if __name__ == "__main__":
    main()
