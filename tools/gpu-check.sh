#!/usr/bin/env bash
# Checks the CUDA backend on a GPU machine: builds $BUILD (build-gpu), runs the CUDA-vs-CPU kernel tests,
# trains configs/quickstart.toml (GPT-2) and configs/qwen3-small.toml STEPS (20) steps on CUDA and on CPU and
# compares the losses (2+ GPUs: PP=2, DP=2).
# Usage: tools/gpu-check.sh [STEPS]    env: BUILD, CUDA_ARCH (default 90), TOL (relative loss tolerance, 2e-3)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-gpu}
STEPS=${1:-20}
ARCH=${CUDA_ARCH:-90}
TOL=${TOL:-2e-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU is visible (nvidia-smi -L failed); run this on a GPU machine" >&2
  exit 2
fi
gpus=$(nvidia-smi -L | grep -c '^GPU' || true)
echo "== $gpus GPU(s)"
nvidia-smi -L

echo "== build ($BUILD, sm_$ARCH)"
# CMAKE_CUDA20_STANDARD_COMPILE_OPTION: CMake < 3.26 does not know nvcc's C++20 flag.
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
  -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 > "$BUILD/gpu-check.configure.log" 2>&1 ||
  { cat "$BUILD/gpu-check.configure.log"; exit 1; }
if ! grep -q "CUDA backend ON" "$BUILD/gpu-check.configure.log"; then
  cat "$BUILD/gpu-check.configure.log"
  echo "gpu-check: CMake did not enable the CUDA backend (nvcc, cuBLAS and NCCL are needed)" >&2
  exit 1
fi
cmake --build "$BUILD" -j "$(nproc)"

echo "== CUDA kernels against the CPU kernels"
"$BUILD/tests/piper_tests" "[cuda]" | tee "$BUILD/gpu-check.cuda-tests.log"
if grep -q "CUDA test skipped" "$BUILD/gpu-check.cuda-tests.log"; then
  echo "gpu-check: the CUDA tests were skipped although nvidia-smi lists a GPU" >&2
  exit 1
fi

tools/prepare-data.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# train NAME RANKS [overrides...]: runs piper and keeps its metrics in $tmp/NAME.jsonl
train() {
  local name=$1 ranks=$2
  shift 2
  local launch=("$BUILD/piper")
  if [ "$ranks" -gt 1 ]; then launch=(mpirun -np "$ranks" "$BUILD/piper"); fi
  if ! "${launch[@]}" --config "$CONFIG" --steps "$STEPS" --set checkpoint.dir="$tmp/$(basename "$CONFIG" .toml)-$name" \
    --metrics "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1; then
    cat "$tmp/$name.log"
    echo "gpu-check: the $name run failed" >&2
    exit 1
  fi
  grep -m 1 "backend" "$tmp/$name.log" || true
  grep "^step" "$tmp/$name.log" | tail -n 1
}

# compare NAME: per-step loss of the CPU run and of NAME, within relative tolerance TOL
compare() {
  python3 - "$tmp/cpu.jsonl" "$tmp/$1.jsonl" "$TOL" "$1" <<'EOF'
import json, sys
cpu = [json.loads(line) for line in open(sys.argv[1])]
other = [json.loads(line) for line in open(sys.argv[2])]
tol, name = float(sys.argv[3]), sys.argv[4]
print(f"{'step':>5} {'cpu loss':>12} {name + ' loss':>16} {'rel diff':>10}")
worst = 0.0
for a, b in zip(cpu, other):
    d = abs(a["loss"] - b["loss"]) / abs(a["loss"])
    worst = max(worst, d)
    print(f"{a['step']:5d} {a['loss']:12.6f} {b['loss']:16.6f} {d:10.2e}")
ok = len(cpu) == len(other) and worst <= tol
print(f"{name}: max relative loss difference {worst:.2e} (tolerance {tol:g}): {'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
}

status=0
for CONFIG in configs/quickstart.toml configs/qwen3-small.toml; do
  echo "== training: $CONFIG, $STEPS steps"
  rm -f "$tmp"/*.jsonl
  train cpu 1 --set 'job.backend="cpu"'
  train cuda 1 --set 'job.backend="cuda"'
  compare cuda || status=1
  if [ "$gpus" -ge 2 ]; then
    train cuda-pp2 2 --set 'job.backend="cuda"' --set mesh.pp=2 --set mesh.microbatches=4
    compare cuda-pp2 || status=1
    train cuda-dp2 2 --set 'job.backend="cuda"' --set mesh.dp=2
    compare cuda-dp2 || status=1
  else
    echo "== one GPU: the two-rank NCCL runs (PP=2, DP=2) are skipped"
  fi
done
exit $status
