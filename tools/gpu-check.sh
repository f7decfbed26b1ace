#!/usr/bin/env bash
# Checks the CUDA backend on a GPU machine, from a bundle (tools/gpu-bundle.sh; nothing is built) or from a
# source tree (builds $BUILD): every CUDA-vs-CPU kernel test with its worst error, compute-sanitizer when
# present, GPT-2 and Qwen3 trained STEPS (50) steps on CUDA and on CPU with the losses compared, two ranks on
# one GPU, and GPT-2 124M-shaped throughput with MFU. Writes a summary ($SUMMARY, gpu-check-summary.txt).
# Usage: tools/gpu-check.sh [STEPS]  env: BUILD, CUDA_ARCH (90), TOL (relative loss tolerance, 1e-3),
#        PEAK_TFLOPS (the chip's fp32 peak without tensor cores; 67 for H100/H200 SXM), SUMMARY
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
STEPS=${1:-50}
TOL=${TOL:-1e-3}
PEAK_TFLOPS=${PEAK_TFLOPS:-67}
SUMMARY=${SUMMARY:-$HERE/gpu-check-summary.txt}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check: no NVIDIA GPU is visible (nvidia-smi -L failed); run this on a GPU machine" >&2
  exit 2
fi
gpus=$(nvidia-smi -L | grep -c '^GPU' || true)
say "gpu-check $(date -u +%Y-%m-%dT%H:%MZ): $gpus GPU(s): $(nvidia-smi -L | head -n 1)"

if [ -f "$HERE/env.sh" ]; then  # a bundle: binaries are in bin/
  . "$HERE/env.sh"
  PIPER="$HERE/bin/piper" TESTS="$HERE/bin/piper_tests"
  say "binaries: the bundle in $HERE"
else
  BUILD=${BUILD:-build-gpu}
  ARCH=${CUDA_ARCH:-90}
  echo "== build ($BUILD, sm_$ARCH)"
  mkdir -p "$BUILD"
  # CMAKE_CUDA20_STANDARD_COMPILE_OPTION: CMake < 3.26 does not know nvcc's C++20 flag.
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 > "$BUILD/gpu-check.configure.log" 2>&1 ||
    { cat "$BUILD/gpu-check.configure.log"; exit 1; }
  if ! grep -q "CUDA backend ON" "$BUILD/gpu-check.configure.log"; then
    cat "$BUILD/gpu-check.configure.log"
    echo "gpu-check: CMake did not enable the CUDA backend (nvcc, cuBLAS and NCCL are needed)" >&2
    exit 1
  fi
  cmake --build "$BUILD" -j "$(nproc)"
  tools/prepare-data.sh
  PIPER="$BUILD/piper" TESTS="$BUILD/tests/piper_tests"
  say "binaries: built in $BUILD"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

echo "== CUDA kernels against the CPU kernels"
"$TESTS" "[cuda]" > "$tmp/cuda-tests.log" 2>&1 && tests_ok=1 || tests_ok=0
tail -n 4 "$tmp/cuda-tests.log"
if grep -q "CUDA test skipped" "$tmp/cuda-tests.log"; then
  say "kernels: the CUDA tests were skipped although nvidia-smi lists a GPU"
  status=1
fi
say "kernels: $( ((tests_ok)) && echo passed || echo FAILED) — $(grep -E '^(All tests passed|test cases)' "$tmp/cuda-tests.log" | tail -n 1)"
grep '^cuda-vs-cpu' "$tmp/cuda-tests.log" | sed 's/^/  /' >> "$SUMMARY" || true
((tests_ok)) || status=1
if command -v compute-sanitizer >/dev/null 2>&1; then
  for tool in memcheck racecheck; do  # bounded, so that the whole check fits in about 8 minutes
    limit=$([ "$tool" = memcheck ] && echo 150 || echo 120)
    if timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 "$TESTS" "[cuda]" > "$tmp/$tool.log" 2>&1; then
      say "compute-sanitizer $tool: no errors"
    else
      code=$?
      if [ "$code" = 124 ]; then
        found=$(grep -c -E 'Invalid|hazard' "$tmp/$tool.log" || true)
        say "compute-sanitizer $tool: stopped after ${limit} s, not finished; $found error reports until then"
        [ "$found" = 0 ] || status=1
        continue
      fi
      say "compute-sanitizer $tool: exit $code — $(grep -m 3 -E 'ERROR SUMMARY|Invalid|hazard' "$tmp/$tool.log" | tr '\n' ' ')"
      status=1
    fi
  done
else
  say "compute-sanitizer: not on this machine"
fi


# train NAME RANKS [overrides...]: runs piper (TRAIN_STEPS or STEPS steps), metrics in $tmp/NAME.jsonl
train() {
  local name=$1 ranks=$2 steps=${TRAIN_STEPS:-$STEPS}
  shift 2
  local launch=("$PIPER")
  if [ "$ranks" -gt 1 ]; then launch=(mpirun -np "$ranks" "$PIPER"); fi
  if ! "${launch[@]}" --config "$CONFIG" --steps "$steps" --set checkpoint.dir="$tmp/$(basename "$CONFIG" .toml)-$name" \
    --metrics "$tmp/$name.jsonl" "$@" > "$tmp/$name.log" 2>&1; then
    tail -n 20 "$tmp/$name.log"
    say "$CONFIG $name: the run failed (exit, last lines above)"
    return 1
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
ok = 0 < len(other) <= len(cpu) and worst <= tol
print(f"{name}: max relative loss difference {worst:.2e} over {len(other)} steps (tolerance {tol:g}): "
      f"{'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
}

for CONFIG in configs/quickstart.toml configs/qwen3-small.toml; do
  echo "== training: $CONFIG, $STEPS steps"
  rm -f "$tmp"/*.jsonl
  train cpu 1 --set 'job.backend="cpu"' || { status=1; continue; }
  train cuda 1 --set 'job.backend="cuda"' || { status=1; continue; }
  cp "$tmp/cpu.jsonl" "$tmp/cpu-$(basename "$CONFIG" .toml).jsonl"
  compare cuda > "$tmp/compare.txt" || status=1
  cat "$tmp/compare.txt"; say "$CONFIG: $(tail -n 1 "$tmp/compare.txt")"
  if [ "$gpus" -ge 2 ]; then
    train cuda-dp2 2 --set 'job.backend="cuda"' --set mesh.dp=2 && compare cuda-dp2 > "$tmp/compare.txt" || status=1
    say "$CONFIG: $(tail -n 1 "$tmp/compare.txt")"
  fi
done

echo "== two ranks on one GPU (NCCL needs a GPU per rank: Piper falls back to MPI through host memory)"
CONFIG=configs/quickstart.toml
if TRAIN_STEPS=5 train cuda-2on1 2 --set 'job.backend="cuda"' --set mesh.dp=2; then
  cp "$tmp/cpu-quickstart.jsonl" "$tmp/cpu.jsonl" 2>/dev/null || true
  compare cuda-2on1 > "$tmp/compare.txt" || true
  how=$(grep -q "ranks share a GPU" "$tmp/cuda-2on1.log" && echo "through host memory" || echo "with NCCL")
  say "two ranks on one GPU: ran 5 steps $how; $(tail -n 1 "$tmp/compare.txt")"
else
  say "two ranks on one GPU: failed — $(grep -m 1 -iE 'nccl|error' "$tmp/cuda-2on1.log" || echo 'see the output above')"
fi

echo "== throughput: configs/gpt2-124m.toml"
CONFIG=configs/gpt2-124m.toml
if TRAIN_STEPS=30 train gpt2-124m 1; then
  python3 - "$tmp/gpt2-124m.jsonl" "$PEAK_TFLOPS" <<'PY' | tee -a "$SUMMARY"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][10:]
tps = statistics.median(r["tokens_per_s"] for r in rows)
fps = statistics.median(r["flops_per_s"] for r in rows)
peak = float(sys.argv[2]) * 1e12
print(f"GPT-2 124M shape (12 x 768, T 1024, batch 8, fp32 without TF32): {tps:.0f} tokens/s, model {fps / 1e12:.2f} TFLOP/s, "
      f"MFU {fps / peak:.3f} = model FLOP/s / ({sys.argv[2]} TFLOP/s fp32 peak); model FLOP/s = 3 x forward "
      f"(matmul + causal attention) FLOPs per token x tokens/s; median of steps 11-30")
PY
else
  status=1
fi
echo "summary: $SUMMARY"
exit $status
