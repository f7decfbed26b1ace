#!/usr/bin/env bash
# Quickstart benchmark: piper vs PyTorch eager on the configs/quickstart.toml model, side by side in one
# invocation, with the machine's sgemm peak measured in the same run; prints tokens/s and fraction of peak.
# Usage: bench/quickstart.sh [options] BUILD_DIR   (options: bench/quickstart.sh --help)
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: bench/quickstart.sh [options] BUILD_DIR
  --rounds R            interleaved rounds of (sgemm_peak, piper, torch) per thread count (default 3)
  --steps N             training steps per run (default 40)
  --skip K              first steps of each run left out of the timing (default 10)
  --threads "A B"       thread counts to measure (default: all cores, then 1)
  --unset-openblas-env  unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for every command run here
  --omp-wait-policy P   set OMP_WAIT_POLICY=P (ACTIVE or PASSIVE) for every command run here
  --sdpa                let torch use F.scaled_dot_product_attention where it exists
environment: PYTHON (default /usr/bin/python3, the interpreter Debian's python3-torch is built for)
EOF
  exit "${1:-2}"
}

ROUNDS=3
STEPS=40
SKIP=10
THREADS=""
UNSET_OPENBLAS=0
WAIT_POLICY=""
TORCH_EXTRA=()
BUILD=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS="${2:?}"; shift 2 ;;
    --steps) STEPS="${2:?}"; shift 2 ;;
    --skip) SKIP="${2:?}"; shift 2 ;;
    --threads) THREADS="${2:?}"; shift 2 ;;
    --unset-openblas-env) UNSET_OPENBLAS=1; shift ;;
    --omp-wait-policy) WAIT_POLICY="${2:?}"; shift 2 ;;
    --sdpa) TORCH_EXTRA+=(--sdpa); shift ;;
    -h|--help) usage 0 ;;
    -*) echo "quickstart.sh: unknown option $1" >&2; usage ;;
    *) [[ -z "$BUILD" ]] || usage; BUILD="$1"; shift ;;
  esac
done
[[ -n "$BUILD" ]] || usage
[[ -z "$WAIT_POLICY" || "$WAIT_POLICY" == ACTIVE || "$WAIT_POLICY" == PASSIVE ]] || usage
(( STEPS > SKIP && SKIP >= 0 && ROUNDS >= 1 )) || { echo "quickstart.sh: need --steps > --skip >= 0 and --rounds >= 1" >&2; exit 2; }

die() { echo "quickstart.sh: error: $*" >&2; exit 1; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -d "$BUILD" ]] || die "build directory $BUILD not found"
BUILD="$(cd "$BUILD" && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-/usr/bin/python3}"
CONFIG=configs/quickstart.toml
DATA=data/fortunes.txt
PIPER="$BUILD/piper"
SGEMM="$BUILD/bench/sgemm_peak"
OUT="$BUILD/bench-results/quickstart"
CORES="$(nproc)"
[[ -n "$THREADS" ]] || { THREADS="$CORES"; [[ "$CORES" == 1 ]] || THREADS="$CORES 1"; }

[[ -x "$PIPER" ]] || die "$PIPER not found; build first (make build BUILD=...)"
if [[ ! -x "$SGEMM" ]]; then
  echo "building sgemm_peak"
  cmake --build "$BUILD" --target sgemm_peak >/dev/null || die "cannot build sgemm_peak in $BUILD"
fi
[[ -f "$DATA" ]] || die "$DATA not found; run make data (tools/prepare-data.sh)"

# PyTorch from Debian (python3-torch), installed on first use.
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  SUDO=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "python3-torch is missing and installing it needs root"
    SUDO=(sudo -n env DEBIAN_FRONTEND=noninteractive)
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "+ ${SUDO[*]} apt-get install -y --no-install-recommends python3-torch"
  if ! "${SUDO[@]}" apt-get install -y --no-install-recommends python3-torch >"$BUILD/apt-python3-torch.log" 2>&1; then
    "${SUDO[@]}" apt-get update >>"$BUILD/apt-python3-torch.log" 2>&1 || true
    "${SUDO[@]}" apt-get install -y --no-install-recommends python3-torch >>"$BUILD/apt-python3-torch.log" 2>&1 ||
      die "apt-get install python3-torch failed (see $BUILD/apt-python3-torch.log)"
  fi
  "$PYTHON" -c 'import torch' || die "python3-torch installed but $PYTHON cannot import torch"
fi

# OpenBLAS tuning variables are left as the user has them unless asked otherwise.
# Every command below starts with `env ENVP...`, so that the printed commands are complete.
show_env() { for v in OPENBLAS_CORETYPE OPENBLAS_L2_SIZE OMP_WAIT_POLICY; do printf '%s=%s ' "$v" "${!v-<unset>}"; done; }
echo "environment: $(show_env)"
ENVP=(env)
if (( UNSET_OPENBLAS )); then
  echo "note: --unset-openblas-env: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for every command below"
  ENVP+=(-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
fi
if [[ -n "$WAIT_POLICY" ]]; then
  echo "note: --omp-wait-policy: OMP_WAIT_POLICY=$WAIT_POLICY for every command below"
  ENVP+=(OMP_WAIT_POLICY="$WAIT_POLICY")
fi
RUN_ENV="$( (( UNSET_OPENBLAS )) && unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE; [[ -z "$WAIT_POLICY" ]] || OMP_WAIT_POLICY="$WAIT_POLICY"; show_env)"
echo "machine: $CORES cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "torch: $("$PYTHON" -c 'import torch; print(torch.__version__)')"
echo "runs: threads {$THREADS} x $ROUNDS interleaved rounds of sgemm_peak, piper, torch; $STEPS steps each, first $SKIP not timed"
echo "logs: $OUT"
rm -rf "$OUT"
mkdir -p "$OUT"
RESULTS="$OUT/results.txt"
: >"$RESULTS"

# Runs a command (printed exactly, with its environment prefix), its output to a log; a failure ends the bench.
run() {
  local log="$1"; shift
  printf '+'; printf ' %q' "$@"; printf '   > %s\n' "${log#"$ROOT"/}"
  if ! "$@" >"$log" 2>&1; then
    echo "quickstart.sh: command failed; last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}

# median of the metrics lines after the first SKIP steps: prints "tokens_per_s flops_per_s"
piper_median() {
  "$PYTHON" - "$1" "$SKIP" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r["step"] > int(sys.argv[2])]
if not rows:
    sys.exit("no timed steps in " + sys.argv[1])
print(statistics.median(r["tokens_per_s"] for r in rows), statistics.median(r["flops_per_s"] for r in rows))
EOF
}

field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" "$2" | tail -n 1; }

for T in $THREADS; do
  for ((r = 1; r <= ROUNDS; ++r)); do
    tag="t$T-r$r"
    run "$OUT/sgemm-$tag.log" "${ENVP[@]}" "$SGEMM" --threads "$T" --size 2048 --reps 10 --warmup 2
    gf="$(field gflops "$OUT/sgemm-$tag.log")"
    [[ -n "$gf" ]] || die "no RESULT line in $OUT/sgemm-$tag.log"

    run "$OUT/piper-$tag.log" "${ENVP[@]}" "$PIPER" --config "$CONFIG" --steps "$STEPS" --metrics "$OUT/piper-$tag.jsonl" \
      --set 'checkpoint.dir=""' --set "job.threads=$T"
    read -r p_tps p_fps < <(piper_median "$OUT/piper-$tag.jsonl") || die "cannot read $OUT/piper-$tag.jsonl"
    model_line="$(grep -m1 '^model:' "$OUT/piper-$tag.log" || true)"
    p_params="$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' <<<"$model_line")"
    p_fpt="$(sed -n 's/.*(\([0-9.]*\) FLOP per token).*/\1/p' <<<"$model_line")"

    run "$OUT/torch-$tag.log" "${ENVP[@]}" OMP_NUM_THREADS="$T" OPENBLAS_NUM_THREADS="$T" "$PYTHON" bench/torch_gpt.py \
      --data "$DATA" --threads "$T" --steps "$STEPS" --warmup "$SKIP" "${TORCH_EXTRA[@]}"
    t_tps="$(field tokens_per_s "$OUT/torch-$tag.log")"
    t_params="$(field params "$OUT/torch-$tag.log")"
    t_fpt="$(field flops_per_token "$OUT/torch-$tag.log")"
    [[ -n "$t_tps" ]] || die "no RESULT line in $OUT/torch-$tag.log"

    printf '  threads %s round %s: sgemm %.1f GFLOP/s | piper %.0f tok/s | torch %.0f tok/s\n' "$T" "$r" "$gf" "$p_tps" "$t_tps"
    echo "$T $r $gf $p_tps $p_fps $p_params $p_fpt $t_tps $t_params $t_fpt" >>"$RESULTS"
  done
done

"$PYTHON" - "$RESULTS" "$RUN_ENV" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by_t = {}
for t, r, gf, p_tps, p_fps, p_params, p_fpt, t_tps, t_params, t_fpt in rows:
    by_t.setdefault(int(t), []).append(dict(gf=float(gf), p_tps=float(p_tps), p_fps=float(p_fps), t_tps=float(t_tps),
                                            p_params=p_params, t_params=t_params, p_fpt=float(p_fpt), t_fpt=float(t_fpt)))
print()
print("quickstart model, median over rounds of each run's median step (sgemm peak = best of all its rounds)")
head = ("threads", "sgemm GFLOP/s", "piper tok/s", "torch tok/s", "piper/torch",
        "piper GFLOP/s", "piper frac", "torch GFLOP/s", "torch frac")
print("| " + " | ".join(head) + " |")
print("|" + "|".join("-" * (len(h) + 2) for h in head) + "|")
warnings = []
for t in sorted(by_t, reverse=True):
    rs = by_t[t]
    peak = max(x["gf"] for x in rs) * 1e9
    p_tps = statistics.median(x["p_tps"] for x in rs)
    t_tps = statistics.median(x["t_tps"] for x in rs)
    p_fps = statistics.median(x["p_fps"] for x in rs)
    fpt = rs[0]["p_fpt"]
    t_fps = t_tps * fpt  # torch's model FLOPs: the same FLOPs per token as piper reports
    cells = (str(t), f"{peak / 1e9:.1f}", f"{p_tps:.0f}", f"{t_tps:.0f}", f"{p_tps / t_tps:.2f}x",
             f"{p_fps / 1e9:.1f}", f"{p_fps / peak:.2f}", f"{t_fps / 1e9:.1f}", f"{t_fps / peak:.2f}")
    print("| " + " | ".join(c.rjust(len(h)) for c, h in zip(cells, head)) + " |")
    for x in rs:
        if x["p_params"] != x["t_params"]:
            warnings.append(f"parameter counts differ: piper {x['p_params']}, torch {x['t_params']}")
        if abs(x["p_fpt"] - x["t_fpt"]) > 0.5:
            warnings.append(f"FLOP per token differ: piper {x['p_fpt']:.0f}, torch {x['t_fpt']:.0f}")
spread = []
for t in sorted(by_t, reverse=True):
    rs = by_t[t]
    spread.append(f"threads {t}: piper {min(x['p_tps'] for x in rs):.0f}-{max(x['p_tps'] for x in rs):.0f}, "
                  f"torch {min(x['t_tps'] for x in rs):.0f}-{max(x['t_tps'] for x in rs):.0f} tok/s")
print("range over rounds: " + "; ".join(spread))
first = rows[0]
print(f"model: piper {first[5]} parameters, torch {first[8]} parameters; {float(first[6]):.0f} FLOP per token")
print("environment of the runs: " + sys.argv[2].strip())
print("frac = model FLOP/s (3 x forward matmul + causal attention FLOPs) / sgemm peak at the same thread count; target >= 0.5")
for w in sorted(set(warnings)):
    print("WARNING: " + w + " (the comparison is not like for like)")
EOF
