#!/usr/bin/env bash
# The matmul library and split choice, measured (bench/README.md "matmul"): bench/matmul_choice.sh BUILD_DIR.
# Times the quickstart's linear-layer matmuls on piper's splits, OpenBLAS's threads, BLIS and oneDNN (the
# last two when their Debian packages are installed), at every core count given in THREADS (default: all, 1).
set -euo pipefail
BUILD="${1:?usage: bench/matmul_choice.sh BUILD_DIR}"
for t in ${THREADS:-$(nproc) 1}; do
  OPENBLAS_NUM_THREADS=1 "$BUILD/bench/matmul_choice" --threads "$t" --reps "${REPS:-21}"
done
