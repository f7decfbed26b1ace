#!/usr/bin/env bash
# Runs the unit and integration tests of a PIPER_SANITIZE build (`make sanitize`); every ASan or UBSan report
# of any process (piper ranks too) goes to a log file, and any such file fails the run.
#   tools/sanitize-test.sh [BUILD_DIR] [JOBS]     (defaults: build-asan, nproc)
# Leak checking is off: Open MPI unloads its plugins at MPI_Finalize, so what they keep until exit has no
# module left to tell it from piper's (the fuzz targets, which start no MPI, do check leaks). The Slurm test is
# skipped: it starts a Slurm cluster for minutes and runs no piper code the other tests do not.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=${1:-build-asan}
jobs=${2:-$(nproc)}
logs=$root/$build/sanitizer-logs
rm -rf "$logs"
mkdir -p "$logs"
# A report also makes the process exit 99, so a test that expects exit 1 (a system failure) does not pass.
export ASAN_OPTIONS="log_path=$logs/asan:exitcode=99:detect_leaks=0:strict_string_checks=1"
export UBSAN_OPTIONS="log_path=$logs/ubsan:exitcode=99:halt_on_error=1:print_stacktrace=1"
status=0
(cd "$build" && ctest --output-on-failure -j "$jobs" -E '^integration\.test_slurm$') || status=$?
reports=$(find "$logs" -type f | sort)
if [ -n "$reports" ]; then
  for f in $reports; do
    echo "sanitize: report in $f:" >&2
    head -n 60 "$f" >&2
  done
  echo "sanitize: $(echo "$reports" | wc -l) sanitizer report(s)" >&2
  exit 1
fi
[ "$status" -eq 0 ] || { echo "sanitize: tests failed (exit $status)" >&2; exit "$status"; }
echo "sanitize: every test passed without a sanitizer report" >&2
