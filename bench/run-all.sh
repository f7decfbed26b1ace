#!/usr/bin/env bash
# Runs every benchmark in order: bench/run-all.sh BUILD_DIR (what `make bench` calls). Results are
# reported, never judged: the exit status is non-zero only when a benchmark fails to run.
set -uo pipefail

BUILD="${1:?usage: bench/run-all.sh BUILD_DIR}"
BENCH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# One benchmark per line: a script under bench/ and its arguments (BUILD_DIR is appended).
BENCHMARKS=(
  "quickstart.sh"
  "matmul_choice.sh"
  "families.py"
  "moe.py"
  "compile_scale.py"
  "zero.py"
  "zero_peak.py"
  "checkpoint_io.py"
  "schedules.py"
  "recompute.py"
  "tensor_parallel.py"
  "bf16.py"
  "sample.py"
)

failed=()
for entry in "${BENCHMARKS[@]}"; do
  read -r -a cmd <<<"$entry"
  echo "=== ${cmd[*]} $BUILD"
  if ! "$BENCH/${cmd[0]}" "${cmd[@]:1}" "$BUILD"; then
    failed+=("${cmd[0]}")
  fi
  echo
done

if (( ${#failed[@]} )); then
  echo "bench: failed to run: ${failed[*]}" >&2
  exit 1
fi
echo "bench: ${#BENCHMARKS[@]} benchmark(s) ran"
