"""Helpers for integration tests: write job files, run piper under mpirun, read metrics, compare runs.

Every test script runs real MPI jobs of the piper executable (env PIPER) from the repository root.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

PIPER = os.environ.get("PIPER", os.path.join(os.getcwd(), "build", "piper"))
CKPT = os.path.join(os.path.dirname(PIPER), "piper-ckpt")
ROOT = os.environ.get("PIPER_SOURCE_DIR", os.getcwd())
DATA = os.path.join(ROOT, "data", "fortunes.txt")

# A tiny GPT that still has every piece: 4 blocks, tied embedding, 4 heads.
TINY_GPT = """
[job]
name = "{name}"
steps = {steps}
seed = 11
threads = 1

[model]
kind = "gpt"
vocab = 256
seq_len = 16
d_model = 32
n_layers = {layers}
n_heads = 4
d_ff = 64

[data]
path = "{data}"
batch = {batch}

[optimizer]
lr = 3e-3
warmup_steps = 3
weight_decay = 0.1
grad_clip = 1.0
"""


# A tiny Qwen3 with every piece: GQA (4 query heads over 2 key/value heads), q/k norms, RoPE, SwiGLU.
TINY_QWEN3 = """
[job]
name = "{name}"
steps = {steps}
seed = 11
threads = 1

[model]
kind = "qwen3"
vocab = 256
seq_len = 16
d_model = 32
n_layers = {layers}
n_heads = 4
n_kv_heads = 2
head_dim = 8
d_ff = 48
rope_theta = 10000.0
tie_embeddings = {tied}

[data]
path = "{data}"
batch = {batch}

[optimizer]
lr = 3e-3
warmup_steps = 3
weight_decay = 0.1
grad_clip = 1.0
"""


def tiny_qwen3(name="q", steps=20, layers=4, batch=16, tied=False, extra=""):
    return TINY_QWEN3.format(name=name, steps=steps, layers=layers, batch=batch, data=DATA,
                             tied="true" if tied else "false") + extra


def tiny_qwen3_moe(name="q", capacity=0.0, layers=4, extra=""):
    """tiny_qwen3 with a mixture of experts in every layer: 4 experts of width 24, top-2, balance loss 0.01."""
    moe = (f"\n[model.moe]\nexperts = 4\ntop_k = 2\nd_expert = 24\naux_loss_coef = 0.01\n"
           f"capacity_factor = {capacity}\n")
    return tiny_qwen3(name=name, layers=layers).replace("\n[data]", moe + "\n[data]", 1) + extra


def moe_reference_losses(d, capacities=(0.0, 0.6)):
    """{capacity: losses} of tiny_qwen3_moe on one process, 20 steps; metrics in d/ref{capacity}.jsonl."""
    refs = {}
    for capacity in capacities:
        path = os.path.join(d, f"ref{capacity}.jsonl")
        run(1, write(d, f"ref{capacity}.toml", tiny_qwen3_moe("ref", capacity)), "--metrics", path)
        refs[capacity] = losses(path)
    return refs


def replicate(zero=0):
    """A replicate directive over every region (experts with copies included) at a ZeRO level."""
    return f'\n[[directive]]\nop = "replicate"\nfilter = {{}}\nzero = {zero}\n'


def shard(group=0, stream="ep"):
    """A shard directive over the EP regions: expert groups of `group` ranks (0: the whole device set)."""
    text = f'\n[[directive]]\nop = "shard"\nfilter = {{ EP = "*" }}\nstream = "{stream}"\n'
    return text + (f"group = {group}\n" if group else "")


# A tiny MLP (a synthetic classification task: no token file).
TINY_MLP = """
[job]
name = "{name}"
steps = {steps}
threads = 1

[model]
kind = "mlp"
d_in = 8
d_hidden = 16
n_layers = 2
n_classes = 4

[data]
batch = 8
"""


def tiny_mlp(name="mlp", steps=2):
    return TINY_MLP.format(name=name, steps=steps)


def checkpoint(d, name, text):
    """Trains the job `text` on one process for 2 steps with a checkpoint at step 2, in d/name; returns its path."""
    ck = os.path.join(d, name)
    run(1, write(d, f"{name}.toml", text + f'\n[checkpoint]\ndir = "{ck}"\nevery = 2\n'), "--steps", "2")
    return os.path.join(ck, "step_00000002.h5")


def python_with(env, modules):
    """An interpreter that imports `modules` ("transformers, torch"): $env's, this one or Debian's; None if none does."""
    pythons = [os.environ.get(env), sys.executable, "/usr/bin/python3"]
    return next((p for p in pythons if p and os.path.exists(p) and subprocess.run(
        [p, "-c", f"import {modules}"], capture_output=True).returncode == 0), None)


def tiny_gpt(name="t", steps=20, layers=4, batch=16, extra=""):
    return TINY_GPT.format(name=name, steps=steps, layers=layers, batch=batch, data=DATA) + extra


def write(dirpath, name, text):
    path = os.path.join(dirpath, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def run(np, config, *args, timeout=180, check=True):
    """Runs piper on `np` ranks; returns the CompletedProcess (stdout+stderr as text)."""
    cmd = ["mpirun", "-np", str(np), PIPER, "--config", config] + list(args)
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    p.seconds = time.time() - t0
    if check and p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def dry_run_json(config, *args, timeout=60):
    """The document of `piper --dry-run --json` on one process (no launcher); `args`: more options."""
    cmd = [PIPER, "--config", config, "--dry-run", "--json"] + list(args)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return json.loads(p.stdout)


def report(path):
    """The document a run's --report-json wrote."""
    with open(path) as f:
        return json.load(f)


def piper_ckpt(*args, want=0, timeout=120):
    """Runs piper-ckpt; fails unless it exits `want` (None: any code, the caller looks)."""
    p = subprocess.run([CKPT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if want is not None and p.returncode != want:
        fail(f"piper-ckpt {' '.join(args)} exited {p.returncode}, expected {want}\nstdout:\n{p.stdout}\n"
             f"stderr:\n{p.stderr}")
    return p


def split(m):
    """The directive that splits every step into `m` microbatches."""
    return f"\n[[directive]]\nop = \"split\"\ncount = {m}\n"


def annotate_layers(ranges):
    """Pipeline stages tagged PP = 0, 1, ... over the layers of each (first, last) range."""
    return "\n[[annotate]]\ntag = \"PP\"\nlayers = " + str([list(r) for r in ranges]) + "\n"


def place(stage, devices):
    """The directive that places pipeline stage `stage` on the ranks `devices` (a list)."""
    return f"\n[[directive]]\nop = \"place\"\nfilter = {{ PP = {stage} }}\ndevices = {devices}\n"


def schedule(kind, keys=""):
    """The schedule directive, with more of its keys (TOML lines) after `kind`."""
    return f"\n[[directive]]\nop = \"schedule\"\nkind = \"{kind}\"\n" + keys


def pipeline(kind, m, stages, devices, count=None, before_schedule="", schedule_keys=""):
    """The directives of a pipeline: `stages` (a list of (first, last) layer ranges, or [[annotate]] text),
    a split into `m` microbatches, stage s placed on devices(s) (a rank or a list of ranks) for each of the
    `count` stages (default: one per range), `before_schedule` (more directives), then the schedule `kind`
    with `schedule_keys`."""
    text = (stages if isinstance(stages, str) else annotate_layers(stages)) + split(m)
    for s in range(len(stages) if count is None else count):
        ranks = devices(s)
        text += place(s, ranks if isinstance(ranks, list) else [ranks])
    return text + before_schedule + schedule(kind, schedule_keys)


def mesh(pp=1, dp=1, m=0, zero=0, schedule=""):
    """--set options of a [mesh] layout: pp x dp ranks, m microbatches (0: the default), a ZeRO level and a
    schedule kind ("": the default)."""
    args = ["--set", f"mesh.pp={pp}", "--set", f"mesh.dp={dp}", "--set", f"mesh.zero={zero}"]
    if m:
        args += ["--set", f"mesh.microbatches={m}"]
    if schedule:
        args += ["--set", f'mesh.schedule="{schedule}"']
    return args


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(path):
    return [m["loss"] for m in metrics(path)]


def compare(name, ref, got, rtol):
    """Fails unless every step's loss matches within rtol (relative)."""
    if len(ref) != len(got):
        fail(f"{name}: {len(got)} steps, reference has {len(ref)}")
    worst = 0.0
    for i, (a, b) in enumerate(zip(ref, got)):
        rel = abs(a - b) / max(abs(a), 1e-12)
        worst = max(worst, rel)
        if rel > rtol:
            fail(f"{name}: step {i + 1} loss {b!r} differs from single-process {a!r} (relative {rel:.3g} > {rtol})")
    print(f"ok  {name:48s} max relative difference {worst:.2e} over {len(ref)} steps")
    return worst


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def tempdir():
    return tempfile.mkdtemp(prefix="piper-test-")


def rank_pids(root):
    """{rank: pid} of the processes under `root` (mpirun) that Open MPI started as ranks."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    ranks, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK" in env:
            ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
    return ranks
