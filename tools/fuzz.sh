#!/usr/bin/env bash
# Runs every libFuzzer target of a PIPER_FUZZ build for a bounded time from its checked-in seeds
# (fuzz/corpus/<target>); any crash, sanitizer report, timeout or out-of-memory fails, but for the known limits
# of HDF5 itself (tools/fuzz-triage.py, fuzz/README.md). Called by `make fuzz`.
#   tools/fuzz.sh [BUILD_DIR] [SECONDS_PER_TARGET]     (defaults: build-fuzz, 60)
# New inputs go to BUILD_DIR/fuzz-work/<target>/corpus; a failing input is left in .../artifacts and named
# here: save it under tests/fuzz-regressions/<target>/ so the unit tests replay it (test_fuzz_regressions.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
seconds=${2:-60}
# Leaks are findings too: the targets start no MPI, so nothing of Open MPI's is there to suppress.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

failed=()
for exe in "$build"/fuzz/fuzz_*; do
  [ -x "$exe" ] || continue
  name=$(basename "$exe")
  target=${name#fuzz_}
  seeds=fuzz/corpus/$target
  work=$build/fuzz-work/$target
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1
        -artifact_prefix="$work/artifacts/")
  [ -f "fuzz/$target.dict" ] && args+=(-dict="fuzz/$target.dict")
  # fuzz/<target>.options: more flags, one per line
  [ -f "fuzz/$target.options" ] && mapfile -t -O ${#args[@]} args < <(grep -v '^#' "fuzz/$target.options")
  echo "fuzz: $name for ${seconds}s from $(ls "$seeds" | wc -l) seeds" >&2
  rc=0
  "$exe" "${args[@]}" "$work/corpus" "$seeds" > "$work/log.txt" 2>&1 || rc=$?
  grep -E '^stat::number_of_executed_units|^stat::new_units_added|^#[0-9]+: cov: .* exec/s' "$work/log.txt" |
    tail -n 2 | tr '\n' ' ' >&2
  echo >&2
  # every input left behind is run again and sorted: only known limits of HDF5 may pass (fuzz-triage.py)
  mapfile -t left < <(find "$work/artifacts" -type f | sort)
  if [ ${#left[@]} -gt 0 ]; then
    rc=0
    tools/fuzz-triage.py "$exe" "${left[@]}" || rc=1
  elif [ "$rc" -ne 0 ]; then
    echo "fuzz: $name exited $rc; last lines of $work/log.txt:" >&2
    tail -n 60 "$work/log.txt" >&2
  fi
  [ "$rc" -eq 0 ] || failed+=("$name")
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: ${failed[*]} found a failing input (save it under tests/fuzz-regressions/<target>/)" >&2
  exit 1
fi
echo "fuzz: every target ran ${seconds}s without a finding" >&2
