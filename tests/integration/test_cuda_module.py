"""The CUDA backend is a library piper loads only for job.backend = "cuda" (libpiper_cuda.so next to the
executable): piper itself does not link the CUDA libraries, a CUDA job loads the backend with every symbol
bound (on a machine without a GPU it then stops at the device check), and a piper copied without the
library says what is missing and exits 2. Skipped (and says so) in builds without CUDA."""
import os
import shutil
import subprocess

from common import PIPER, fail, tempdir, tiny_gpt, write


def main():
    module = os.path.join(os.path.dirname(PIPER), "libpiper_cuda.so")
    if not os.path.isfile(module):
        print("skipped: this build has no CUDA backend (no libpiper_cuda.so beside piper)")
        return
    ldd = subprocess.run(["ldd", PIPER], capture_output=True, text=True, check=True).stdout
    linked = [l.split()[0] for l in ldd.splitlines() if any(k in l for k in ("libcudart", "libcublas", "libnccl"))]
    if linked:
        fail(f"piper links CUDA libraries it should load only with the backend: {linked}")
    print("ok  piper links no CUDA library")

    d = tempdir()
    cfg = write(d, "job.toml", tiny_gpt(steps=2))
    args = ["--config", cfg, "--steps", "1", "--set", 'job.backend="cuda"']
    p = subprocess.run([PIPER, *args], capture_output=True, text=True, timeout=120)
    gpu = shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    if gpu:
        if p.returncode != 0:
            fail(f"a CUDA job on a GPU machine failed ({p.returncode}):\n{p.stderr[-2000:]}")
        print("ok  a CUDA job loads the backend and trains")
    else:
        if p.returncode == 0 or "no CUDA device is usable" not in p.stderr:
            fail(f"without a GPU a CUDA job should load the backend and stop at the device check; exit "
                 f"{p.returncode}:\n{p.stderr[-2000:]}")
        print("ok  a CUDA job loads libpiper_cuda.so (every symbol bound) and stops at the device check")

    alone = os.path.join(d, "bin")
    os.makedirs(alone)
    shutil.copy2(PIPER, alone)
    p = subprocess.run([os.path.join(alone, "piper"), *args], capture_output=True, text=True, timeout=120)
    if p.returncode != 2 or "libpiper_cuda.so is missing" not in p.stderr:
        fail(f"piper without its CUDA library: exit {p.returncode}, {p.stderr[-1500:]!r}")
    p = subprocess.run([os.path.join(alone, "piper"), "--config", cfg, "--steps", "1"], capture_output=True,
                       text=True, timeout=120)
    if p.returncode != 0:
        fail(f"piper without its CUDA library cannot train on CPU ({p.returncode}):\n{p.stderr[-1500:]}")
    print("ok  piper copied without libpiper_cuda.so trains on CPU, and a CUDA job says the library is missing (exit 2)")


if __name__ == "__main__":
    main()
