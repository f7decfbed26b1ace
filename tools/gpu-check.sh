#!/usr/bin/env bash
# Checks the CUDA backend on a GPU machine within a fixed time budget: a preflight that fails in seconds, then
# every step (kernel tests, CUDA training against CPU reference losses, two ranks on one GPU, piper sample
# against the CPU, GPT-2 124M throughput, opt-in compute-sanitizer) under `timeout`, with every log and OUT/summary.txt kept in OUT.
#
# Usage: tools/gpu-check.sh [--out DIR | -o DIR] [STEPS]
#        tools/gpu-check.sh --make-references DIR [STEPS]   (CPU reference losses only; no GPU needed)
#   From a bundle (tools/gpu-bundle.sh: env.sh and bin/ beside tools/; nothing is built, the CPU reference
#   losses come from its reference/) or from a source tree (builds $BUILD first, computes the references).
#   With the device runner, which returns what is written under $OUT: OUT=$OUT tools/gpu-check.sh
# env: OUT (output folder, default ./gpu-check-out), STEPS (50), TOL (relative loss tolerance, 1e-3), ENVELOPE
#   (4: a step's tolerance, once the reference's perturbed CPU twin drifts past TOL, is 4x its drift so far),
#   PEAK_TFLOPS (fp32 peak without tensor cores; 67 for H100/H200 SXM), BF16_PEAK_TFLOPS (dense bf16 on tensor
#   cores; 989 for H100/H200 SXM), TOTAL_S (overall deadline, 450; 570
#   with SANITIZE=1), MIN_STEP_S (a step starts only with this much time left, 10), PREFLIGHT_TIMEOUT_S (15),
#   TESTS_TIMEOUT_S (kernel tests, 100), STEP_TIMEOUT_S (default of the four next), TRAIN_TIMEOUT_S (each
#   training run, 60), MPI_TIMEOUT_S (two ranks, 60), THROUGHPUT_TIMEOUT_S (90), SANITIZE_TIMEOUT_S (150),
#   SANITIZE (1: run compute-sanitizer memcheck and racecheck last), CONFIGS (trained configs, names under
#   configs/; NAME-bf16 trains configs/NAME.toml with job.precision = "bf16"), REFERENCE (folder of <config>.jsonl), BUILD (build-gpu), CUDA_ARCH (90), BUILD_TIMEOUT_S (1200)
# Exit: 0 every step passed; 1 a step failed, timed out or was skipped; 2 the preflight failed.
set -uo pipefail
START=$SECONDS
STEPS=${STEPS:-50}
MAKE_REFERENCES=""
while [ $# -gt 0 ]; do
  case $1 in
    -o | --out) OUT=${2:?"$1 needs a folder"}; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
    --make-references) MAKE_REFERENCES=${2:?"$1 needs a folder"}; shift 2 ;;
    -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    [0-9]*) STEPS=$1; shift ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "$0")/.." && pwd)
[ -n "$MAKE_REFERENCES" ] && OUT=${OUT:-$MAKE_REFERENCES}
OUT=${OUT:-gpu-check-out}
mkdir -p "$OUT" || { echo "gpu-check: cannot create the output folder '$OUT'" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
if [ -n "$MAKE_REFERENCES" ]; then
  mkdir -p "$MAKE_REFERENCES" && MAKE_REFERENCES=$(cd "$MAKE_REFERENCES" && pwd)
fi
cd "$HERE" || exit 2

TOL=${TOL:-1e-3}
PEAK_TFLOPS=${PEAK_TFLOPS:-67}
BF16_PEAK_TFLOPS=${BF16_PEAK_TFLOPS:-989}
SANITIZE=${SANITIZE:-0}
TOTAL_S=${TOTAL_S:-$([ "$SANITIZE" = 1 ] && echo 570 || echo 450)}
MIN_STEP_S=${MIN_STEP_S:-10}
PREFLIGHT_TIMEOUT_S=${PREFLIGHT_TIMEOUT_S:-15}
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-100}
TRAIN_TIMEOUT_S=${TRAIN_TIMEOUT_S:-${STEP_TIMEOUT_S:-60}}
MPI_TIMEOUT_S=${MPI_TIMEOUT_S:-${STEP_TIMEOUT_S:-60}}
THROUGHPUT_TIMEOUT_S=${THROUGHPUT_TIMEOUT_S:-${STEP_TIMEOUT_S:-90}}
SANITIZE_TIMEOUT_S=${SANITIZE_TIMEOUT_S:-${STEP_TIMEOUT_S:-150}}
CONFIGS=${CONFIGS:-quickstart qwen3-small qwen3-moe-small quickstart-bf16 qwen3-small-bf16 qwen3-moe-small-bf16}
SUMMARY=$OUT/summary.txt
export NCCL_DEBUG=WARN
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_plm_rsh_agent=${OMPI_MCA_plm_rsh_agent:-false}  # one node: no ssh

say() { echo "$*" | tee -a "$SUMMARY"; }
failed=0 timed_out=0 skipped=0

# run_step NAME LIMIT LOG CMD...: runs CMD under timeout with LIMIT seconds, or what is left before the
# deadline if less, its output in LOG. Sets RC (the exit code) and STATE (ok, failed, timeout, skipped); a
# timeout or skip is said in the summary. Killing the process group (timeout -k) takes hung children along.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left=$((START + TOTAL_S - SECONDS))
  if ((left < MIN_STEP_S)); then
    say "$name: SKIPPED (${left} s left of TOTAL_S=${TOTAL_S})"
    RC=125 STATE=skipped
    skipped=$((skipped + 1))
    return 0
  fi
  ((limit > left)) && limit=$left
  echo "== $name (up to ${limit} s; log ${log#"$OUT"/})"
  local t0=$SECONDS
  timeout -k 5 "$limit" "$@" < /dev/null > "$log" 2>&1  # no stdin: mpirun would read the terminal
  RC=$?
  local took=$((SECONDS - t0))
  if ((RC == 124)) || { ((RC == 137)) && ((took >= limit)); }; then
    say "$name: TIMED OUT after ${limit} s (log ${log#"$OUT"/})"
    STATE=timeout
    timed_out=$((timed_out + 1))
  elif ((RC == 0)); then
    STATE=ok
  else
    STATE=failed
  fi
  echo "   $name: $STATE (exit $RC) in $took s"
  echo "$name: $STATE, exit $RC, $took s of $limit s" >> "$OUT/steps.txt"
  return 0
}

# train NAME CONFIG BACKEND RANKS LIMIT METRICS [--set ...]: one piper training run of STEPS steps (or
# TRAIN_STEPS), log OUT/NAME.log; checkpoints off, so that OUT holds logs and metrics only.
train() {
  local name=$1 config=$2 backend=$3 ranks=$4 limit=$5 metrics=$6
  shift 6
  local launch=("$PIPER")
  if ((ranks > 1)); then
    # --bind-to none and no single-copy (CMA) transport: both fail in containers without ptrace rights.
    # shellcheck disable=SC2054  # commas: Open MPI's list of transports
    launch=(mpirun -np "$ranks" --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none
      -x NCCL_DEBUG "$PIPER")
  fi
  config_args "$config"
  run_step "$name" "$limit" "$OUT/$name.log" "${launch[@]}" --config "$CONFIG_FILE" "${CONFIG_EXTRA[@]}" \
    --steps "${TRAIN_STEPS:-$STEPS}" --metrics "$metrics" --set "job.backend=\"$backend\"" \
    --set 'checkpoint.dir=""' "$@"
}

# compare REF OTHER NAME: per-step loss of OTHER against the CPU reference REF. The tolerance of a step is TOL,
# or, once the reference's perturbed twin (REF's .perturbed.jsonl: the same CPU run with the learning rate moved
# by 1e-7 of itself) has drifted further, ENVELOPE times the twin's largest drift so far. A model whose loss
# hangs on discrete choices (a mixture of experts' top-k routing) turns a rounding difference into another
# choice for some token, and from then on two correct runs part by far more than rounding; the twin measures
# how far on the CPU alone, so the CUDA run is held to what a rounding difference does there.
compare() {
  local twin=${1%.jsonl}.perturbed.jsonl
  [ -s "$twin" ] || twin=""
  python3 - "$1" "$2" "$TOL" "$3" "${ENVELOPE:-4}" "$twin" <<'EOF'
import json, sys
def losses(path):
    return [json.loads(line) for line in open(path) if line.strip()]
cpu, other = losses(sys.argv[1]), losses(sys.argv[2])
tol, name, factor = float(sys.argv[3]), sys.argv[4], float(sys.argv[5])
twin = losses(sys.argv[6]) if sys.argv[6] else []
print(f"{'step':>5} {'cpu loss':>12} {name + ' loss':>16} {'rel diff':>10} {'twin diff':>10} {'tolerance':>10}")
worst, worst_ratio, drift, widened = 0.0, 0.0, 0.0, 0
for i, (a, b) in enumerate(zip(cpu, other)):
    d = abs(a["loss"] - b["loss"]) / abs(a["loss"])
    t = abs(a["loss"] - twin[i]["loss"]) / abs(a["loss"]) if i < len(twin) else 0.0
    drift = max(drift, t)
    step_tol = max(tol, factor * drift)
    widened += step_tol > tol
    worst, worst_ratio = max(worst, d), max(worst_ratio, d / step_tol)
    print(f"{a['step']:5d} {a['loss']:12.6f} {b['loss']:16.6f} {d:10.2e} {t:10.2e} {step_tol:10.2e}")
ok = 0 < len(other) <= len(cpu) and worst_ratio <= 1
how = f"tolerance {tol:g}"
if widened:
    how += f"; {widened} steps, after the perturbed CPU twin drifted past it, {factor:g}x its drift (up to {drift:.2e})"
print(f"{name}: max relative loss difference {worst:.2e} over {len(other)} steps, {worst_ratio:.2f} of the "
      f"step's tolerance ({how}): {'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
EOF
}

lines() { local n; n=$(grep -c . "$1" 2>/dev/null); echo "${n:-0}"; }

# config_args NAME: CONFIG_FILE, the job file of a trained config name, and CONFIG_EXTRA, its options: NAME-bf16
# (where no configs/NAME-bf16.toml exists) is configs/NAME.toml in bf16.
config_args() {
  CONFIG_FILE=configs/$1.toml
  CONFIG_EXTRA=()
  if [[ $1 == *-bf16 ]] && [ ! -f "$CONFIG_FILE" ]; then
    CONFIG_FILE=configs/${1%-bf16}.toml
    CONFIG_EXTRA=(--set 'job.precision="bf16"')
  fi
}

# make_reference CONFIG DIR: CPU losses of CONFIG for STEPS steps into DIR/CONFIG.jsonl (log beside it), and
# its perturbed twin (learning rate times 1 + 1e-7) into DIR/CONFIG.perturbed.jsonl, which compare reads.
make_reference() {
  local config=$1 dir=$2
  local limit=${REF_TIMEOUT_S:-${STEP_TIMEOUT_S:-300}}
  config_args "$config"
  local cpu=(--steps "$STEPS" --set 'job.backend="cpu"' --set 'checkpoint.dir=""' "${CONFIG_EXTRA[@]}")
  run_step "reference $config (cpu)" "$limit" "$dir/$config.log" "$PIPER" --config "$CONFIG_FILE" \
    "${cpu[@]}" --metrics "$dir/$config.jsonl"
  [ "$STATE" = ok ] && [ "$(lines "$dir/$config.jsonl")" -ge "$STEPS" ] || return 1
  local lr
  lr=$(python3 -c 'import sys, tomllib; print(repr(tomllib.load(open(sys.argv[1], "rb"))["optimizer"]["lr"] * (1 + 1e-7)))' \
    "$CONFIG_FILE" 2> "$dir/$config.perturbed.log") ||
    { say "reference $config: no perturbed twin (optimizer.lr not read; $config.perturbed.log)"; return 0; }
  run_step "reference $config perturbed (cpu, lr $lr)" "$limit" "$dir/$config.perturbed.log" "$PIPER" \
    --config "$CONFIG_FILE" "${cpu[@]}" --metrics "$dir/$config.perturbed.jsonl" --set "optimizer.lr=$lr"
  [ "$STATE" = ok ] || rm -f "$dir/$config.perturbed.jsonl"  # compare then holds every step to TOL
  return 0
}

if [ -n "$MAKE_REFERENCES" ]; then  # bundle time: the CPU runs, so that the GPU machine does not redo them
  SUMMARY=$MAKE_REFERENCES/made.txt
  TOTAL_S=${REF_TOTAL_S:-3600}
  : > "$SUMMARY"
  PIPER=${PIPER:-$HERE/build/piper}
  say "CPU reference losses: $STEPS steps, backend cpu, checkpoints off; $("$PIPER" --version 2>&1 | head -n 1)"
  for config in $CONFIGS; do
    config_args "$config"
    [ -f "$CONFIG_FILE" ] || { say "reference $config: no $CONFIG_FILE"; continue; }
    if make_reference "$config" "$MAKE_REFERENCES"; then
      say "reference $config: $(lines "$MAKE_REFERENCES/$config.jsonl") steps, perturbed twin $(lines "$MAKE_REFERENCES/$config.perturbed.jsonl")"
    else
      say "reference $config: FAILED (exit $RC) — $(tail -n 3 "$MAKE_REFERENCES/$config.log" | tr '\n' ' ')"
      failed=1
    fi
  done
  exit $((failed || timed_out))
fi

: > "$SUMMARY"
: > "$OUT/steps.txt"
say "gpu-check $(date -u +%Y-%m-%dT%H:%MZ) in $HERE: logs and this summary in $OUT; deadline ${TOTAL_S} s"

# --- preflight: every missing piece is named, within seconds -----------------------------------------------
problems=()
missing() { problems+=("$*"); }
preflight_fail() {
  for p in "${problems[@]}"; do say "preflight: MISSING $p"; done
  say "preflight: FAILED after $((SECONDS - START)) s; nothing was run (log preflight.log)"
  exit 2
}
PRE=$OUT/preflight.log
: > "$PRE"
pre() { timeout -k 2 "$PREFLIGHT_TIMEOUT_S" "$@" < /dev/null; }

if ! command -v nvidia-smi >/dev/null 2>&1; then
  missing "nvidia-smi: not on PATH (no NVIDIA driver on this machine?)"
else
  pre nvidia-smi -L > "$OUT/nvidia-smi.txt" 2>&1
  rc=$?
  cat "$OUT/nvidia-smi.txt" >> "$PRE"
  if ((rc != 0)); then
    missing "nvidia-smi -L: exit $rc$( ((rc == 124)) && echo " (timed out)") — $(head -n 1 "$OUT/nvidia-smi.txt")"
  elif ! grep -q '^GPU' "$OUT/nvidia-smi.txt"; then
    missing "nvidia-smi -L: lists no GPU"
  fi
fi
((${#problems[@]})) && preflight_fail
gpus=$(grep -c '^GPU' "$OUT/nvidia-smi.txt")
say "GPUs: $gpus — $(head -n 1 "$OUT/nvidia-smi.txt")"
driver=$(pre nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
[ -n "$driver" ] && say "driver, memory: $driver"

if [ -f "$HERE/env.sh" ]; then  # a bundle: binaries in bin/, CPU references in reference/
  # shellcheck disable=SC1091
  . "$HERE/env.sh"
  PIPER=$HERE/bin/piper TESTS=$HERE/bin/piper_tests CUDA_LIB=$HERE/bin/libpiper_cuda.so
  REFERENCE=${REFERENCE:-$HERE/reference}
  say "binaries: the bundle in $HERE"
else
  BUILD=${BUILD:-build-gpu}
  case $BUILD in /*) ;; *) BUILD=$HERE/$BUILD ;; esac
  ARCH=${CUDA_ARCH:-90}
  mkdir -p "$BUILD"
  echo "== build ($BUILD, sm_$ARCH; log build.log; not counted in the deadline)"
  # CMAKE_CUDA20_STANDARD_COMPILE_OPTION: CMake < 3.26 does not know nvcc's C++20 flag.
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$ARCH" \
    -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 > "$OUT/build.log" 2>&1
  if ! grep -q "CUDA backend ON" "$OUT/build.log"; then
    missing "the CUDA backend: CMake did not enable it (nvcc, cuBLAS and NCCL are needed; see build.log)"
    preflight_fail
  fi
  if ! timeout -k 5 "${BUILD_TIMEOUT_S:-1200}" cmake --build "$BUILD" -j "$(nproc)" >> "$OUT/build.log" 2>&1 ||
     ! tools/prepare-data.sh >> "$OUT/build.log" 2>&1; then
    missing "a build of $BUILD (see the end of build.log)"
    preflight_fail
  fi
  PIPER=$BUILD/piper TESTS=$BUILD/tests/piper_tests CUDA_LIB=$BUILD/libpiper_cuda.so
  START=$SECONDS  # the deadline counts from here
  say "binaries: built in $BUILD"
fi

for tool in python3 mpirun; do
  command -v "$tool" >/dev/null 2>&1 || missing "$tool: not on PATH"
done
for f in $CONFIGS gpt2-124m; do
  config_args "$f"
  [ -s "$CONFIG_FILE" ] || missing "$CONFIG_FILE: no such file"
done
[ -s data/fortunes.txt ] || missing "data/fortunes.txt: no such file (tools/prepare-data.sh makes it)"
# Every CUDA library the kernel tests and the backend link must resolve (env.sh adds the CUDA lib folders).
declare -A notfound=()
ldds=()
for bin in "$TESTS" "$CUDA_LIB"; do
  name=$(basename "$bin")
  if [ ! -f "$bin" ]; then missing "$name: no such file ($bin)"; continue; fi
  ldds+=("$OUT/ldd-$name.txt")
  pre ldd "$bin" > "$OUT/ldd-$name.txt" 2>&1
  rc=$?
  { echo "== ldd $bin (exit $rc)"; cat "$OUT/ldd-$name.txt"; } >> "$PRE"
  if grep -q 'not a dynamic executable' "$OUT/ldd-$name.txt" || ((rc != 0 && rc != 1)); then
    missing "$name: ldd cannot read it (exit $rc: $(head -n 1 "$OUT/ldd-$name.txt"))"
  fi
  while read -r lib _; do
    notfound[$lib]="${notfound[$lib]:+${notfound[$lib]}, }$name"
  done < <(grep 'not found' "$OUT/ldd-$name.txt")
done
for lib in "${!notfound[@]}"; do
  missing "$lib: not found by ldd (needed by ${notfound[$lib]}; LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
done
declare -A libpath=()
for lib in libcudart libcublas libnccl; do
  libpath[$lib]=$(cat "${ldds[@]}" /dev/null | awk -v l="$lib" 'index($1, l ".so") == 1 && $3 ~ /^\// {print $3; exit}')
  if [ -z "${libpath[$lib]}" ] && ! grep -q "^[[:space:]]*$lib\.so.*not found" "${ldds[@]}" /dev/null; then
    missing "$lib: neither $(basename "$TESTS") nor $(basename "$CUDA_LIB") links it"
  fi
done
out=$(pre "$PIPER" --version 2>&1)
rc=$?
echo "== piper --version (exit $rc): $out" >> "$PRE"
((rc == 0)) || missing "piper: $PIPER --version exits $rc — $(echo "$out" | head -n 1)"
((${#problems[@]})) && preflight_fail

# NCCL's version: from the library's file name (libnccl.so.2.21.5), else asked with ncclGetVersion.
nccl=${libpath[libnccl]}
nccl_version=$(basename "$(readlink -f "$nccl")" | sed -n 's/^libnccl\.so\.\([0-9]*\.[0-9]*\.[0-9]*\)$/\1/p')
if [ -z "$nccl_version" ]; then
  nccl_version=$(pre python3 -c '
import ctypes, sys
v = ctypes.c_int()
if ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v)) != 0: sys.exit(1)
c = v.value
print("%d.%d.%d" % ((c // 10000, c % 10000 // 100, c % 100) if c >= 10000 else (c // 1000, c % 1000 // 100, c % 100)))
' "$nccl" 2>>"$PRE") || nccl_version="unknown"
fi
say "$(echo "$out" | head -n 1); NCCL $nccl_version ($nccl); cudart ${libpath[libcudart]}; cuBLAS ${libpath[libcublas]}"
say "preflight: passed in $((SECONDS - START)) s"

# --- the kernel tests --------------------------------------------------------------------------------------
run_step "kernels" "$TESTS_TIMEOUT_S" "$OUT/cuda-tests.log" "$TESTS" "[cuda]"
case $STATE in
  ok | failed)
    if grep -q "CUDA test skipped" "$OUT/cuda-tests.log"; then
      say "kernels: the CUDA tests were skipped although nvidia-smi lists a GPU"
      failed=$((failed + 1))
    fi
    say "kernels: $([ "$STATE" = ok ] && echo passed || echo "FAILED (exit $RC)") — $(grep -E '^(All tests passed|test cases)' "$OUT/cuda-tests.log" | tail -n 1)"
    grep '^cuda-vs-cpu' "$OUT/cuda-tests.log" | sed 's/^/  /' >> "$SUMMARY"
    [ "$STATE" = ok ] || failed=$((failed + 1)) ;;
esac

# --- training on CUDA against the CPU reference losses ----------------------------------------------------
REFERENCE=${REFERENCE:-}
if [ -n "$REFERENCE" ] && [ -f "$REFERENCE/made.txt" ]; then
  say "CPU references: $REFERENCE ($(head -n 1 "$REFERENCE/made.txt"))"
fi
# ref_for CONFIG: sets REF to the CPU reference file of CONFIG with at least STEPS steps, made now if needed.
ref_for() {
  local config=$1
  REF=$REFERENCE/$config.jsonl
  [ -n "$REFERENCE" ] && [ "$(lines "$REF")" -ge "$STEPS" ] && return 0
  REF=$OUT/reference/$config.jsonl
  [ "$(lines "$REF")" -ge "$STEPS" ] && return 0
  mkdir -p "$OUT/reference"
  make_reference "$config" "$OUT/reference" && return 0
  [ "$STATE" = failed ] && { say "reference $config (cpu): FAILED (exit $RC)"; failed=$((failed + 1)); }
  return 1
}

for config in $CONFIGS; do
  train "train-$config-cuda" "$config" cuda 1 "$TRAIN_TIMEOUT_S" "$OUT/train-$config-cuda.jsonl"
  case $STATE in
    skipped) continue ;;
    timeout) continue ;;
    failed)
      say "train $config on CUDA: FAILED (exit $RC) — $(grep -m 1 -iE 'error|cuda|nccl' "$OUT/train-$config-cuda.log" || tail -n 1 "$OUT/train-$config-cuda.log")"
      failed=$((failed + 1))
      continue ;;
  esac
  ref_for "$config" || continue
  if compare "$REF" "$OUT/train-$config-cuda.jsonl" cuda > "$OUT/compare-$config.txt"; then
    say "train $config: $(tail -n 1 "$OUT/compare-$config.txt")"
  else
    say "train $config: $(tail -n 1 "$OUT/compare-$config.txt")"
    failed=$((failed + 1))
  fi
  if ((gpus >= 2)); then
    train "train-$config-cuda-dp2" "$config" cuda 2 "$MPI_TIMEOUT_S" "$OUT/train-$config-cuda-dp2.jsonl" --set mesh.dp=2
    if [ "$STATE" = ok ] && compare "$REF" "$OUT/train-$config-cuda-dp2.jsonl" cuda-dp2 > "$OUT/compare-$config-dp2.txt"; then
      say "train $config dp2 on $gpus GPUs: $(tail -n 1 "$OUT/compare-$config-dp2.txt")"
    elif [ "$STATE" != skipped ] && [ "$STATE" != timeout ]; then
      say "train $config dp2 on $gpus GPUs: FAILED — see train-$config-cuda-dp2.log, compare-$config-dp2.txt"
      failed=$((failed + 1))
    fi
  fi
done

# --- two ranks on one GPU: NCCL needs a GPU per rank, so Piper goes through host memory with MPI ----------
two_steps=$((STEPS < 5 ? STEPS : 5))
TRAIN_STEPS=$two_steps train two-ranks-one-gpu quickstart cuda 2 "$MPI_TIMEOUT_S" "$OUT/two-ranks-one-gpu.jsonl" \
  --set mesh.dp=2 --set job.threads=1
case $STATE in
  ok)
    how=$(grep -q "ranks share a GPU" "$OUT/two-ranks-one-gpu.log" && echo "through host memory" || echo "with NCCL")
    if ref_for quickstart && compare "$REF" "$OUT/two-ranks-one-gpu.jsonl" cuda-2on1 > "$OUT/compare-two-ranks.txt"; then
      say "two ranks on one GPU: $two_steps steps $how; $(tail -n 1 "$OUT/compare-two-ranks.txt")"
    else
      say "two ranks on one GPU: $two_steps steps $how; losses: $(tail -n 1 "$OUT/compare-two-ranks.txt" 2>/dev/null || echo 'no CPU reference')"
      failed=$((failed + 1))
    fi ;;
  failed)
    say "two ranks on one GPU: FAILED (exit $RC) — $(grep -m 1 -iE 'nccl|error' "$OUT/two-ranks-one-gpu.log" || tail -n 1 "$OUT/two-ranks-one-gpu.log")"
    failed=$((failed + 1)) ;;
esac

# --- piper sample on CUDA against the CPU: a 2-step CPU checkpoint of each family, the first token's logits --------
# sample_check CONFIG: the checkpoint, then `piper sample --greedy` on both backends; logits within 1e-4 of the
# largest, the same first greedy token
sample_check() {
  local config=$1 dir=$OUT/sample-$1
  config_args "$config"
  run_step "sample-$config-checkpoint" "$TRAIN_TIMEOUT_S" "$dir.log" "$PIPER" --config "$CONFIG_FILE" \
    "${CONFIG_EXTRA[@]}" --steps 2 --set 'job.backend="cpu"' --set "checkpoint.dir=\"$dir\"" --set checkpoint.every=2
  case $STATE in
    ok) ;;
    failed) say "sample $config: no checkpoint (exit $RC; $dir.log)"; failed=$((failed + 1)); return ;;
    *) return ;;  # timed out or skipped: counted as such
  esac
  local backend
  for backend in cpu cuda; do
    run_step "sample-$config-$backend" "$TRAIN_TIMEOUT_S" "$dir-$backend.log" "$PIPER" sample \
      "$dir/step_00000002.h5" --prompt 'Q: What is' --greedy --max-new-tokens 16 --ids --backend "$backend" \
      --logits-out "$dir-$backend.logits"
    case $STATE in
      ok) ;;
      failed) say "sample $config on $backend: FAILED (exit $RC) — $(tail -n 1 "$dir-$backend.log")"
        failed=$((failed + 1)); return ;;
      *) return ;;
    esac
  done
  if ! python3 - "$dir-cpu.logits" "$dir-cuda.logits" "$dir-cpu.log" "$dir-cuda.log" "$config" <<'PY' | tee -a "$SUMMARY"; then
import array, re, sys
def floats(p):
    a = array.array("f"); a.frombytes(open(p, "rb").read()); return list(a)
cpu, gpu = floats(sys.argv[1]), floats(sys.argv[2])
ids = [open(p).read().split("|")[1].split()[:1] for p in sys.argv[3:5]]
rate = re.search(r"\(([0-9.]+) tokens/s\)", open(sys.argv[4]).read())
gap = max(abs(x - y) for x, y in zip(cpu, gpu)) / max(abs(x) for x in cpu)
ok = len(cpu) == len(gpu) and gap < 1e-4 and ids[0] == ids[1]
print(f"sample {sys.argv[5]}: {'ok' if ok else 'FAILED'} — CUDA first-token logits within {gap:.2g} of the CPU's "
      f"(relative to the largest), first greedy ids {ids[1]} / {ids[0]}; {rate.group(1) if rate else '?'} tokens/s")
sys.exit(0 if ok else 1)
PY
    failed=$((failed + 1))
  fi
}
sample_check qwen3-small
sample_check qwen3-moe-small

# --- GPT-2 124M-shaped throughput and MFU, fp32 and bf16 -------------------------------------------------------
# throughput PRECISION PEAK_TFLOPS: 30 steps of configs/gpt2-124m.toml on CUDA in that precision, tokens/s and MFU
throughput() {
  local precision=$1 peak=$2 name=throughput-gpt2-124m
  [ "$precision" = fp32 ] || name=$name-$precision
  TRAIN_STEPS=30 train "$name" gpt2-124m cuda 1 "$THROUGHPUT_TIMEOUT_S" "$OUT/$name.jsonl" \
    --set "job.precision=\"$precision\""
  case $STATE in
    ok)
      if ! python3 - "$OUT/$name.jsonl" "$peak" "$precision" <<'PY' | tee -a "$SUMMARY"; then
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
first = 10 if len(rows) > 10 else len(rows) // 2  # the first steps warm up
rows = rows[first:]
tps = statistics.median(r["tokens_per_s"] for r in rows)
fps = statistics.median(r["flops_per_s"] for r in rows)
peak = float(sys.argv[2]) * 1e12
what = "fp32 without TF32" if sys.argv[3] == "fp32" else "bf16 matmuls on tensor cores"
print(f"GPT-2 124M shape (12 x 768, T 1024, batch 8, {what}): {tps:.0f} tokens/s, model {fps / 1e12:.2f} TFLOP/s, "
      f"MFU {fps / peak:.3f} = model FLOP/s / ({sys.argv[2]} TFLOP/s {sys.argv[3]} peak); model FLOP/s = 3 x forward "
      f"(matmul + causal attention) FLOPs per token x tokens/s; median of steps {first + 1}-{first + len(rows)}")
PY
        say "throughput: no metrics to read ($name.jsonl)"
        failed=$((failed + 1))
      fi ;;
    failed)
      say "throughput gpt2-124m $precision: FAILED (exit $RC) — $(tail -n 1 "$OUT/$name.log")"
      failed=$((failed + 1)) ;;
  esac
}
throughput fp32 "$PEAK_TFLOPS"
throughput bf16 "$BF16_PEAK_TFLOPS"

# --- compute-sanitizer, opt-in (SANITIZE=1): last, so that it cannot take the other steps' time ---------------
if [ "$SANITIZE" = 1 ]; then
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    say "compute-sanitizer: unavailable (not on PATH)"
  else
    for tool in memcheck racecheck; do
      run_step "compute-sanitizer $tool" "$SANITIZE_TIMEOUT_S" "$OUT/$tool.log" \
        compute-sanitizer --tool "$tool" --error-exitcode 9 "$TESTS" "[cuda]"
      found=$(grep -c -E 'Invalid|hazard' "$OUT/$tool.log")
      if grep -qiE '^=+ .*not supported|device not supported' "$OUT/$tool.log"; then
        say "compute-sanitizer $tool: unavailable — $(grep -m 1 -i 'not supported' "$OUT/$tool.log" | sed 's/^=* *//')"
      elif [ "$STATE" = ok ]; then
        say "compute-sanitizer $tool: no errors"
      elif [ "$STATE" = timeout ]; then
        say "compute-sanitizer $tool: $found error reports before the timeout"
        ((found == 0)) || failed=$((failed + 1))
      elif [ "$STATE" = failed ]; then
        say "compute-sanitizer $tool: exit $RC — $(grep -m 3 -E 'ERROR SUMMARY|Invalid|hazard' "$OUT/$tool.log" | tr '\n' ' ')"
        failed=$((failed + 1))
      fi
    done
  fi
else
  say "compute-sanitizer: not run (SANITIZE=1 runs memcheck and racecheck)"
fi

if ((failed + timed_out + skipped == 0)); then result=PASSED; else result=FAILED; fi
say "result: $result — $failed failed, $timed_out timed out, $skipped skipped; $((SECONDS - START)) s of ${TOTAL_S} s"
echo "summary: $SUMMARY"
[ "$result" = PASSED ]
