#!/usr/bin/env bash
# Quickstart benchmark: piper vs PyTorch on the configs/quickstart.toml GPT and the configs/qwen3-small.toml Qwen3,
# side by side in one invocation: Debian's PyTorch (eager) and the current PyTorch from PyPI (eager and
# torch.compile), with the machine's sgemm peak measured in the same run; prints tokens/s and fraction of peak.
# Usage: bench/quickstart.sh [options] BUILD_DIR   (options: bench/quickstart.sh --help)
set -euo pipefail

usage() {
  cat >&2 <<'EOF'
usage: bench/quickstart.sh [options] BUILD_DIR
  --rounds R            interleaved rounds of (sgemm_peak, then per model piper and each torch mode) per
                        thread count (default 3)
  --steps N             training steps per run (default 40)
  --skip K              first steps of each run left out of the timing (default 10)
  --threads "A B"       thread counts to measure (default: all cores, then 1)
  --models "M ..."      models: gpt (configs/quickstart.toml), qwen3 (configs/qwen3-small.toml); default "gpt qwen3"
  --torch "MODE ..."    torch peers (default "debian eager compile"):
                          debian   Debian's PyTorch (PYTHON) in eager mode, explicit attention, default AdamW
                          eager    the current PyTorch (TORCH_PYTHON) in eager mode, F.scaled_dot_product_attention
                                   (causal) and fused AdamW (foreach where this torch has no fused AdamW on CPU)
                          compile  the same under torch.compile
  --upgrade-torch       pip install --upgrade torch in the bench's own venv before the runs
  --unset-openblas-env  unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for every command run here
  --omp-wait-policy P   set OMP_WAIT_POLICY=P (ACTIVE or PASSIVE) for every command run here
  --sdpa                let Debian's torch use F.scaled_dot_product_attention where it exists
environment:
  PYTHON        interpreter of the debian peer (default /usr/bin/python3, the one Debian's python3-torch is
                built for; python3-torch is installed on first use)
  TORCH_PYTHON  interpreter of the eager and compile peers, with torch installed (default: the bench's own venv,
                created on first use with `python3 -m venv` and `pip install torch numpy`)
  TORCH_VENV    where that venv is (default ${XDG_CACHE_HOME:-$HOME/.cache}/piper-bench/torch-venv)
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
MODELS="gpt qwen3"
MODES="debian eager compile"
UPGRADE_TORCH=0
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
    --models) MODELS="${2:?}"; shift 2 ;;
    --torch) MODES="${2:?}"; shift 2 ;;
    --upgrade-torch) UPGRADE_TORCH=1; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "quickstart.sh: unknown option $1" >&2; usage ;;
    *) [[ -z "$BUILD" ]] || usage; BUILD="$1"; shift ;;
  esac
done
[[ -n "$BUILD" ]] || usage
[[ -z "$WAIT_POLICY" || "$WAIT_POLICY" == ACTIVE || "$WAIT_POLICY" == PASSIVE ]] || usage
(( STEPS > SKIP && SKIP >= 0 && ROUNDS >= 1 )) || { echo "quickstart.sh: need --steps > --skip >= 0 and --rounds >= 1" >&2; exit 2; }
for m in $MODELS; do [[ "$m" == gpt || "$m" == qwen3 ]] || { echo "quickstart.sh: unknown model $m" >&2; usage; }; done
for m in $MODES; do [[ "$m" == debian || "$m" == eager || "$m" == compile ]] || { echo "quickstart.sh: unknown torch mode $m" >&2; usage; }; done
[[ -n "${MODELS// /}" ]] || usage

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

has_mode() { [[ " $MODES " == *" $1 "* ]]; }

# Installs a Debian package (as root, or through sudo -n), its output to BUILD/apt-PKG.log.
apt_install() {
  local pkg="$1" log="$BUILD/apt-$1.log" SUDO=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "$pkg is missing and installing it needs root"
    SUDO=(sudo -n env DEBIAN_FRONTEND=noninteractive)
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "+ ${SUDO[*]} apt-get install -y --no-install-recommends $pkg"
  if ! "${SUDO[@]}" apt-get install -y --no-install-recommends "$pkg" >"$log" 2>&1; then
    "${SUDO[@]}" apt-get update >>"$log" 2>&1 || true
    "${SUDO[@]}" apt-get install -y --no-install-recommends "$pkg" >>"$log" 2>&1 ||
      die "apt-get install $pkg failed (see $log)"
  fi
}

# The debian peer: PyTorch from Debian (python3-torch), installed on first use.
if has_mode debian && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  apt_install python3-torch
  "$PYTHON" -c 'import torch' || die "python3-torch installed but $PYTHON cannot import torch"
fi

# The eager and compile peers: the current PyTorch from PyPI, in a venv of the bench's own made on first use
# (a few GB, once per machine: it lives outside the build directory), or TORCH_PYTHON's.
if has_mode eager || has_mode compile; then
  if [[ -n "${TORCH_PYTHON:-}" ]]; then
    "$TORCH_PYTHON" -c 'import torch' || die "TORCH_PYTHON=$TORCH_PYTHON cannot import torch"
    (( ! UPGRADE_TORCH )) || echo "note: --upgrade-torch has no effect with TORCH_PYTHON set"
  else
    TORCH_VENV="${TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/piper-bench/torch-venv}"
    TORCH_PYTHON="$TORCH_VENV/bin/python"
    if (( UPGRADE_TORCH )) || ! "$TORCH_PYTHON" -c 'import torch' 2>/dev/null; then
      mkdir -p "$(dirname "$TORCH_VENV")"
      pip_log="$TORCH_VENV.pip.log"
      if [[ ! -x "$TORCH_PYTHON" ]]; then
        echo "+ $PYTHON -m venv $TORCH_VENV"
        if ! "$PYTHON" -m venv "$TORCH_VENV" >"$pip_log" 2>&1; then
          apt_install python3-venv  # Debian's python3 makes venvs only with python3-venv (ensurepip)
          "$PYTHON" -m venv "$TORCH_VENV" >"$pip_log" 2>&1 || die "cannot create a venv at $TORCH_VENV (see $pip_log)"
        fi
      fi
      echo "+ $TORCH_PYTHON -m pip install --upgrade torch numpy   > $pip_log   (the current PyTorch from PyPI)"
      "$TORCH_PYTHON" -m pip install --upgrade torch numpy >>"$pip_log" 2>&1 ||
        die "pip install torch failed (see $pip_log); or point TORCH_PYTHON at an interpreter with torch"
      "$TORCH_PYTHON" -c 'import torch' || die "torch installed in $TORCH_VENV but cannot be imported"
    fi
    echo "current torch: the venv $TORCH_VENV (set TORCH_PYTHON to use another interpreter; --upgrade-torch to update it)"
  fi
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
! has_mode debian || echo "debian torch: $("$PYTHON" -c 'import torch; print(torch.__version__)') ($PYTHON)"
if has_mode eager || has_mode compile; then
  echo "current torch: $("$TORCH_PYTHON" -c 'import torch; print(torch.__version__)') ($TORCH_PYTHON)"
fi
echo "runs: threads {$THREADS} x $ROUNDS interleaved rounds of sgemm_peak, then for each model {$MODELS} piper and torch {$MODES}; $STEPS steps each, first $SKIP not timed"
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

config_of() { if [[ "$1" == qwen3 ]]; then echo configs/qwen3-small.toml; else echo configs/quickstart.toml; fi; }

for T in $THREADS; do
  for ((r = 1; r <= ROUNDS; ++r)); do
    tag="t$T-r$r"
    run "$OUT/sgemm-$tag.log" "${ENVP[@]}" "$SGEMM" --threads "$T" --size 2048 --reps 10 --warmup 2
    gf="$(field gflops "$OUT/sgemm-$tag.log")"
    [[ -n "$gf" ]] || die "no RESULT line in $OUT/sgemm-$tag.log"
    echo "$T $r - sgemm $gf" >>"$RESULTS"
    line="  threads $T round $r: sgemm $(printf '%.1f' "$gf") GFLOP/s"

    for M in $MODELS; do
      run "$OUT/piper-$M-$tag.log" "${ENVP[@]}" "$PIPER" --config "$(config_of "$M")" --steps "$STEPS" \
        --metrics "$OUT/piper-$M-$tag.jsonl" --set 'checkpoint.dir=""' --set "job.threads=$T"
      read -r p_tps p_fps < <(piper_median "$OUT/piper-$M-$tag.jsonl") || die "cannot read $OUT/piper-$M-$tag.jsonl"
      model_line="$(grep -m1 '^model:' "$OUT/piper-$M-$tag.log" || true)"
      p_params="$(sed -n 's/^model: \([0-9]*\) parameters.*/\1/p' <<<"$model_line")"
      p_fpt="$(sed -n 's/.*(\([0-9.]*\) FLOP per token).*/\1/p' <<<"$model_line")"
      echo "$T $r $M piper $p_tps $p_fps ${p_params:-0} ${p_fpt:-0}" >>"$RESULTS"
      line+=" | $M: piper $(printf '%.0f' "$p_tps")"

      for mode in $MODES; do
        case "$mode" in
          debian) py="$PYTHON"; margs=(--adamw default "${TORCH_EXTRA[@]}") ;;
          eager) py="$TORCH_PYTHON"; margs=(--sdpa --adamw auto) ;;
          compile) py="$TORCH_PYTHON"; margs=(--sdpa --adamw auto --compile) ;;
        esac
        log="$OUT/torch-$mode-$M-$tag.log"
        run "$log" "${ENVP[@]}" OMP_NUM_THREADS="$T" OPENBLAS_NUM_THREADS="$T" "$py" bench/torch_gpt.py --model "$M" \
          --data "$DATA" --threads "$T" --steps "$STEPS" --warmup "$SKIP" "${margs[@]}"
        t_tps="$(field tokens_per_s "$log")"
        [[ -n "$t_tps" ]] || die "no RESULT line in $log"
        echo "$T $r $M $mode $t_tps - $(field params "$log") $(field flops_per_token "$log") $(field torch "$log")" \
          "$(field attention "$log") $(field adamw "$log") $(field first_step_ms "$log")" >>"$RESULTS"
        line+=", $mode $(printf '%.0f' "$t_tps")"
      done
    done
    echo "$line tok/s; load average $(cut -d' ' -f1 /proc/loadavg)"
  done
done

"$PYTHON" - "$RESULTS" "$RUN_ENV" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
peaks, runs = {}, {}  # threads -> [GFLOP/s]; (threads, model, program) -> [row]
for row in rows:
    t, prog = int(row[0]), row[3]
    if prog == "sgemm":
        peaks.setdefault(t, []).append(float(row[4]) * 1e9)
    else:
        runs.setdefault((t, row[2], prog), []).append(row)
threads = sorted(peaks, reverse=True)
models = list(dict.fromkeys(k[1] for k in runs))
modes = [m for m in ("debian", "eager", "compile") if any(k[2] == m for k in runs)]
version = {m: next(r[8] for k, rs in runs.items() if k[2] == m for r in rs) for m in modes}
label = {"debian": f"torch {version.get('debian', '')} eager", "eager": f"torch {version.get('eager', '')} eager",
         "compile": f"torch {version.get('compile', '')} compile"}
med = lambda k, i=4: statistics.median(float(r[i]) for r in runs[k])
current = [m for m in modes if m != "debian"]

print()
print(f"quickstart models, median over rounds of each run's median step (sgemm peak = best of its rounds)")
head = ["threads", "model", "sgemm GFLOP/s", "piper tok/s"] + [label[m] + " tok/s" for m in modes]
if current:
    head.append("piper / best current torch")
if "debian" in modes:
    head.append("piper / " + label["debian"].replace(" eager", ""))
head += ["piper GFLOP/s", "piper frac"]
print("| " + " | ".join(head) + " |")
print("|" + "|".join("---" for _ in head) + "|")
warnings = []
for t in threads:
    peak = max(peaks[t])
    for m in models:
        p_tps, p_fps = med((t, m, "piper")), med((t, m, "piper"), 5)
        cells = [str(t), m, f"{peak / 1e9:.1f}", f"{p_tps:.0f}"] + [f"{med((t, m, x)):.0f}" for x in modes]
        if current:
            best = max(current, key=lambda x: med((t, m, x)))
            cells.append(f"{p_tps / med((t, m, best)):.2f}x ({best})")
        if "debian" in modes:
            cells.append(f"{p_tps / med((t, m, 'debian')):.2f}x")
        cells += [f"{p_fps / 1e9:.1f}", f"{p_fps / peak:.2f}"]
        print("| " + " | ".join(cells) + " |")
        for p in runs[(t, m, "piper")]:
            for x in modes:
                for q in runs[(t, m, x)]:
                    if p[6] != q[6]:
                        warnings.append(f"{m}: parameter counts differ: piper {p[6]}, {label[x]} {q[6]}")
                    if abs(float(p[7]) - float(q[7])) > 0.5:
                        warnings.append(f"{m}: FLOP per token differ: piper {p[7]}, {label[x]} {q[7]}")
for t in threads:
    spread = []
    for m in models:
        for x in ["piper"] + modes:
            v = [float(r[4]) for r in runs[(t, m, x)]]
            spread.append(f"{m} {label.get(x, x)} {min(v):.0f}-{max(v):.0f}")
    print(f"range over rounds, threads {t}: " + ", ".join(spread) + " tok/s; "
          f"sgemm {min(peaks[t]) / 1e9:.1f}-{max(peaks[t]) / 1e9:.1f} GFLOP/s")
for m in models:
    p = runs[(threads[0], m, "piper")][0]
    print(f"{m}: {p[6]} parameters, {float(p[7]):.0f} FLOP per token (piper)")
for x in modes:
    r = runs[(threads[0], models[0], x)][0]
    compile_s = ""
    if x == "compile":
        first = statistics.median(float(q[11]) for k, rs in runs.items() if k[2] == x for q in rs)
        compile_s = f"; first step (compilation) median {first / 1e3:.1f} s"
    print(f"{label[x]}: attention {'/'.join(sorted({q[9] for k, rs in runs.items() if k[2] == x for q in rs}))}, "
          f"AdamW {r[10]}{compile_s}")
print("environment of the runs: " + sys.argv[2].strip() + f"; load average at the end {sys.argv[3]}")
print("frac = model FLOP/s (3 x forward matmul + causal attention FLOPs) / sgemm peak at the same thread count; target >= 0.5")
for w in sorted(set(warnings)):
    print("WARNING: " + w + " (the comparison is not like for like)")
EOF
