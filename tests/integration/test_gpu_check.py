"""tools/gpu-check.sh without a GPU: its time bounds, its output folder and its preflight, on a stand-in bundle.

The bundle has real ELF files linked against stand-in CUDA libraries (cudart, cuBLAS, NCCL built here with cc),
a kernel-test binary that hangs, a stand-in piper (Python) and stand-ins for nvidia-smi and compute-sanitizer.
The default configs include two trained in bf16 (NAME-bf16: configs/NAME.toml with job.precision = "bf16").
"""
import os
import shutil
import subprocess
import tempfile
import time

from common import ROOT, fail

CHECK = os.path.join(ROOT, "tools", "gpu-check.sh")
CONFIGS = ["quickstart", "qwen3-small", "qwen3-moe-small", "gpt2-124m"]
BF16_CONFIGS = ["quickstart-bf16", "qwen3-small-bf16", "qwen3-moe-small-bf16"]  # configs/NAME.toml in bf16

LIB_C = r"""
#ifdef __cplusplus
extern "C"
#endif
int %s(int* v) { *v = %d; return 0; }
"""

# Links all three libraries and hangs, as a kernel test that never returns would.
TESTS_C = r"""
#include <stdio.h>
#include <unistd.h>
#ifdef __cplusplus
extern "C" {
#endif
int cudaRuntimeGetVersion(int*); int cublasGetVersion(int*); int ncclGetVersion(int*);
#ifdef __cplusplus
}
#endif
int main(void) {
  int v;
  cudaRuntimeGetVersion(&v); cublasGetVersion(&v); ncclGetVersion(&v);
  printf("kernel tests: started\n");
  fflush(stdout);
  for (;;) pause();
}
"""

# Writes metrics like piper's: the same losses on both backends, but 1% off on CUDA for qwen3-small (its
# comparison must fail) and from step 3 on for the MoE config, whose CPU run with a perturbed learning rate
# drifts by 0.5% from step 3 on (the envelope of 4x that drift lets it pass); it hangs for GPT-2 124M (the
# throughput step must time out). `piper sample` writes logits 1% off on CUDA for the MoE config (its check must fail).
PIPER_PY = r"""#!/usr/bin/env python3
import array, json, os, sys, time
args = sys.argv[1:]
if "--version" in args:
    print("piper 0.0.0 (stand-in)")
    sys.exit(0)
opt = lambda name: args[args.index(name) + 1]
if args[0] == "sample":  # the logits of a checkpoint made below: 1% off on CUDA for the MoE config
    config = open(args[1]).read()
    off = "--backend" in args and opt("--backend") == "cuda" and config == "qwen3-moe-small"
    with open(opt("--logits-out"), "wb") as f:
        f.write(array.array("f", [(0.5 + 0.01 * i) * (1.01 if off else 1.0) for i in range(256)]).tobytes())
    print("81 58 | 32 32 32")
    print("piper sample: 16 new tokens in 0.10 s (160.0 tokens/s), stand-in", file=sys.stderr)
    sys.exit(0)
config = os.path.basename(opt("--config"))[:-len(".toml")]
if "--metrics" not in args:  # a checkpoint run: its one file names the config
    folder = [a for a in args if a.startswith("checkpoint.dir=")][0].split("=", 1)[1].strip('"')
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "step_%08d.h5" % int(opt("--steps"))), "w") as f:
        f.write(config)
    sys.exit(0)
steps = int(opt("--steps"))
backend = "cuda" if 'job.backend="cuda"' in args else "cpu"
print(f"backend {backend}: {config}" + (" in bf16" if 'job.precision="bf16"' in args else ""), flush=True)
if int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
    print("piper: ranks share a GPU; their communication goes through host memory (MPI)", file=sys.stderr)
if config == "gpt2-124m":
    time.sleep(3600)
if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
    with open(opt("--metrics"), "w") as f:
        for s in range(1, steps + 1):
            off = backend == "cuda" and (config == "qwen3-small" or (config == "qwen3-moe-small" and s >= 3))
            drift = config == "qwen3-moe-small" and s >= 3 and any(a.startswith("optimizer.lr=") for a in args)
            loss = (5.5 - 0.01 * s) * (1.01 if off else 1.0) * (1.005 if drift else 1.0)
            f.write(json.dumps({"step": s, "loss": loss, "tokens_per_s": 1000.0, "flops_per_s": 1e12}) + "\n")
"""

ENV_SH = """# Source this: the stand-in bundle's binaries and its CUDA libraries.
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="$B/bin:$PATH"
export LD_LIBRARY_PATH="$B/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
"""

NVIDIA_SMI_OK = "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n"
NVIDIA_SMI_BROKEN = ("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                     "driver.\"\nexit 9\n")
SANITIZER = "#!/bin/sh\necho '========= Device not supported'\nexit 1\n"


def script(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def compiler():
    for cc in ("cc", "gcc", "clang", "c++", "g++"):
        if shutil.which(cc):
            return cc
    fail("no C compiler (cc, gcc, clang, c++, g++) to build the stand-in libraries")


def build_bundle(top):
    b = os.path.join(top, "bundle")
    for d in ("bin", "tools", "configs", "data", "cuda/lib", "src"):
        os.makedirs(os.path.join(b, d))
    shutil.copy(CHECK, os.path.join(b, "tools"))
    for c in CONFIGS:
        shutil.copy(os.path.join(ROOT, "configs", c + ".toml"), os.path.join(b, "configs"))
    with open(os.path.join(b, "data", "fortunes.txt"), "w") as f:
        f.write("A stand-in corpus.\n" * 10)
    cc, lib = compiler(), os.path.join(b, "cuda", "lib")
    for name, fn, version in (("libcudart.so.99", "cudaRuntimeGetVersion", 13000),
                              ("libcublas.so.99", "cublasGetVersion", 130000),
                              ("libnccl.so.99", "ncclGetVersion", 22105)):
        src = os.path.join(b, "src", name + ".c")
        with open(src, "w") as f:
            f.write(LIB_C % (fn, version))
        subprocess.run([cc, "-x", "c", "-shared", "-fPIC", "-o", os.path.join(lib, name), f"-Wl,-soname,{name}", src],
                       check=True)
    link = ["-L" + lib, "-Wl,--no-as-needed", "-l:libcudart.so.99", "-l:libcublas.so.99", "-l:libnccl.so.99"]
    src = os.path.join(b, "src", "tests.c")
    with open(src, "w") as f:
        f.write(TESTS_C)
    subprocess.run([cc, "-x", "c", src, "-x", "none", "-o", os.path.join(b, "bin", "piper_tests")] + link, check=True)
    src = os.path.join(b, "src", "backend.c")
    with open(src, "w") as f:
        f.write("int piper_backend_stub(void) { return 0; }\n")
    subprocess.run([cc, "-x", "c", "-shared", "-fPIC", "-o", os.path.join(b, "bin", "libpiper_cuda.so"), src,
                    "-x", "none"] + link, check=True)
    script(os.path.join(b, "bin", "piper"), PIPER_PY)
    with open(os.path.join(b, "env.sh"), "w") as f:
        f.write(ENV_SH)
    fake = os.path.join(top, "fakebin")
    os.makedirs(fake)
    script(os.path.join(fake, "nvidia-smi"), NVIDIA_SMI_OK)
    script(os.path.join(fake, "compute-sanitizer"), SANITIZER)
    return b, fake


def listing(d):
    return sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)


def run_check(bundle, fake, cwd, args, **env):
    e = dict(os.environ)
    e["PATH"] = fake + os.pathsep + e["PATH"]
    for k in ("OUT", "TOTAL_S", "STEPS", "SANITIZE", "REFERENCE", "CONFIGS"):
        e.pop(k, None)
    e.update({k: str(v) for k, v in env.items()})
    t0 = time.time()
    p = subprocess.run([os.path.join(bundle, "tools", "gpu-check.sh")] + args, cwd=cwd, env=e,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    p.seconds = time.time() - t0
    return p


def summary(out):
    path = os.path.join(out, "summary.txt")
    if not os.path.exists(path):
        fail(f"no summary in {out}: {os.listdir(out) if os.path.isdir(out) else 'no folder'}")
    with open(path) as f:
        return f.read()


def expect(text, what, where):
    if what not in text:
        fail(f"{where}: expected {what!r} in:\n{text}")


def leftovers(bundle):
    """Processes still running a program of the bundle (the hung kernel tests, the stand-in piper)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if bundle + "/bin/" in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def main():
    top = tempfile.mkdtemp(prefix="piper-gpu-check-")
    bundle, fake = build_bundle(top)
    cwd = os.path.join(top, "cwd")
    os.makedirs(cwd)

    # Bundle time: the CPU reference losses, with the same stand-in piper.
    p = run_check(bundle, fake, cwd, ["--make-references", os.path.join(bundle, "reference"), "4"],
                  PIPER=os.path.join(bundle, "bin", "piper"))
    if p.returncode != 0:
        fail(f"--make-references exited {p.returncode}:\n{p.stdout}")
    for c in CONFIGS[:3] + BF16_CONFIGS:
        for name in (c + ".jsonl", c + ".perturbed.jsonl"):
            with open(os.path.join(bundle, "reference", name)) as f:
                if len(f.readlines()) != 4:
                    fail(f"reference/{name} does not have 4 steps")
    print(f"ok  references made at bundle time ({p.seconds:.1f} s)")

    # The whole check: the kernel tests and the throughput run hang and must time out, the rest goes on.
    before = listing(bundle)
    out = os.path.join(top, "out")
    total = 25
    p = run_check(bundle, fake, cwd, ["--out", out], STEPS=4, TESTS_TIMEOUT_S=2, STEP_TIMEOUT_S=3, MIN_STEP_S=1,
                  TOTAL_S=total, SANITIZE=1)
    s = summary(out)
    if p.returncode != 1:
        fail(f"the check exited {p.returncode}, expected 1 (timeouts, a failed comparison):\n{p.stdout}")
    if p.seconds > total + 6:
        fail(f"the check took {p.seconds:.1f} s, past its deadline TOTAL_S={total} (+ the kill grace)")
    for what in ("GPUs: 1 — GPU 0: NVIDIA H200", "NCCL 2.21.5", "preflight: passed",
                 "kernels: TIMED OUT after 2 s", "throughput-gpt2-124m: TIMED OUT after 3 s",
                 "throughput-gpt2-124m-bf16: TIMED OUT after 3 s",
                 "train quickstart-bf16: cuda: max relative loss difference 0.00e+00 over 4 steps, 0.00 of the step's "
                 "tolerance (tolerance 0.001): OK",
                 "train qwen3-small-bf16: cuda: max relative loss difference 1.00e-02 over 4 steps, 10.00 of the "
                 "step's tolerance (tolerance 0.001): FAILED",
                 "train quickstart: cuda: max relative loss difference 0.00e+00 over 4 steps, 0.00 of the step's "
                 "tolerance (tolerance 0.001): OK",
                 "train qwen3-small: cuda: max relative loss difference 1.00e-02 over 4 steps, 10.00 of the step's "
                 "tolerance (tolerance 0.001): FAILED",
                 "train qwen3-moe-small: cuda: max relative loss difference 1.00e-02 over 4 steps, 0.50 of the step's "
                 "tolerance (tolerance 0.001; 2 steps, after the perturbed CPU twin drifted past it, 4x its drift "
                 "(up to 5.00e-03)): OK",
                 "two ranks on one GPU: 4 steps through host memory; cuda-2on1: max relative loss difference 0.00e+00",
                 "compute-sanitizer memcheck: unavailable", "compute-sanitizer racecheck: unavailable",
                 "sample qwen3-small: ok — CUDA first-token logits within 0 of the CPU's",
                 "sample qwen3-moe-small: FAILED — CUDA first-token logits within 0.01 of the CPU's",
                 "result: FAILED — 3 failed, 3 timed out, 0 skipped"):
        expect(s, what, "summary")
    logs = ["summary.txt", "steps.txt", "preflight.log", "nvidia-smi.txt", "ldd-piper_tests.txt",
            "ldd-libpiper_cuda.so.txt", "cuda-tests.log", "two-ranks-one-gpu.log", "two-ranks-one-gpu.jsonl",
            "throughput-gpt2-124m.log", "throughput-gpt2-124m-bf16.log", "memcheck.log", "racecheck.log"]
    for c in CONFIGS[:3] + BF16_CONFIGS:
        logs += [f"train-{c}-cuda.log", f"train-{c}-cuda.jsonl", f"compare-{c}.txt"]
    missing = [f for f in logs if not os.path.isfile(os.path.join(out, f))]
    if missing:
        fail(f"not in the output folder: {missing}; it holds {listing(out)}")
    expect(open(os.path.join(out, "cuda-tests.log")).read(), "kernel tests: started", "cuda-tests.log")
    expect(open(os.path.join(out, "train-quickstart-bf16-cuda.log")).read(), "backend cuda: quickstart in bf16",
           "train-quickstart-bf16-cuda.log")
    if listing(bundle) != before:
        fail(f"the check wrote into the bundle: {sorted(set(listing(bundle)) - set(before))}")
    if os.listdir(cwd):
        fail(f"the check wrote into the current folder: {os.listdir(cwd)}")
    left = leftovers(bundle)
    if left:
        fail("processes of timed-out steps still run:\n" + "\n".join(left))
    print(f"ok  timed-out steps named, the rest ran, all logs in the output folder ({p.seconds:.1f} s)")

    # The deadline: after the hung kernel tests less than MIN_STEP_S is left, and every later step is skipped.
    out = os.path.join(top, "out-deadline")
    p = run_check(bundle, fake, cwd, [], OUT=out, STEPS=4, TESTS_TIMEOUT_S=4, STEP_TIMEOUT_S=3, MIN_STEP_S=3,
                  TOTAL_S=6)
    s = summary(out)
    if p.returncode != 1 or p.seconds > 6 + 6:
        fail(f"with TOTAL_S=6 the check exited {p.returncode} after {p.seconds:.1f} s:\n{p.stdout}")
    for what in ("kernels: TIMED OUT after", "train-quickstart-cuda: SKIPPED", "train-qwen3-moe-small-cuda: SKIPPED",
                 "two-ranks-one-gpu: SKIPPED", "throughput-gpt2-124m: SKIPPED", "throughput-gpt2-124m-bf16: SKIPPED",
                 "train-quickstart-bf16-cuda: SKIPPED", "sample-qwen3-small-checkpoint: SKIPPED", "11 skipped"):
        expect(s, what, "summary with TOTAL_S=6")
    print(f"ok  steps past the deadline skipped and named ({p.seconds:.1f} s)")

    # Preflight: a driver that nvidia-smi cannot reach.
    script(os.path.join(fake, "nvidia-smi"), NVIDIA_SMI_BROKEN)
    out = os.path.join(top, "out-no-driver")
    p = run_check(bundle, fake, cwd, [], OUT=out)
    s = summary(out)
    if p.returncode != 2 or p.seconds > 5:
        fail(f"without a driver the check exited {p.returncode} after {p.seconds:.1f} s (expected 2, seconds)")
    expect(s, "preflight: MISSING nvidia-smi -L: exit 9 — NVIDIA-SMI has failed", "summary without a driver")
    expect(s, "preflight: FAILED", "summary without a driver")
    print(f"ok  preflight names nvidia-smi's failure, exit 2 ({p.seconds:.1f} s)")

    # Preflight: NCCL not found by the dynamic loader.
    script(os.path.join(fake, "nvidia-smi"), NVIDIA_SMI_OK)
    os.remove(os.path.join(bundle, "cuda", "lib", "libnccl.so.99"))
    out = os.path.join(top, "out-no-nccl")
    p = run_check(bundle, fake, cwd, [], OUT=out)
    s = summary(out)
    if p.returncode != 2 or p.seconds > 5:
        fail(f"without NCCL the check exited {p.returncode} after {p.seconds:.1f} s (expected 2, seconds)")
    expect(s, "preflight: MISSING libnccl.so.99: not found by ldd (needed by piper_tests, libpiper_cuda.so", "summary")
    if "cuda-tests.log" in os.listdir(out):
        fail("the kernel tests ran although the preflight failed")
    print(f"ok  preflight names the library ldd cannot find, exit 2 ({p.seconds:.1f} s)")
    if os.environ.get("KEEP"):  # to look at the output folders
        print(f"kept {top}")
    else:
        shutil.rmtree(top)


if __name__ == "__main__":
    main()
