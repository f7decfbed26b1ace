#!/usr/bin/env bash
# Writes the seeds of fuzz_plan (fuzz/corpus/plan/*.bin) from example jobs with a dry run's --dump-plan:
# run it after a change of the plan format (kPlanVersion). Usage: tools/fuzz-plan-seeds.sh [PIPER]
set -euo pipefail
cd "$(dirname "$0")/.."
piper=${1:-build/piper}
out=fuzz/corpus/plan
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -f "$out"/*.bin
mkdir -p "$out"
# name  world  config  overrides...: small plans that together use every op (read_counts: the one-process MoE;
# recompute: the ZB-H1 pipeline; activation all-reduce, reduce-scatter and all-gather: tensor parallelism), buffer
# role and group kind
seed() {
  local name=$1 world=$2 config=$3
  shift 3
  "$piper" --config "configs/$config.toml" --dry-run --world "$world" --dump-plan "$tmp/$name" "$@" >/dev/null
  local n
  n=$(ls "$tmp/$name"/plan_set*.bin | wc -l)
  if [ "$n" -eq 1 ]; then
    cp "$tmp/$name/plan_set0.bin" "$out/$name.bin"
  else
    for f in "$tmp/$name"/plan_set*.bin; do
      local s
      s=$(basename "$f" .bin)
      cp "$f" "$out/$name-${s#plan_}.bin"
    done
  fi
}
seed mlp 1 mlp
seed dp2 2 dp2
seed qwen3-small 1 qwen3-small
seed pp2-1f1b 2 pp2-1f1b
seed qwen3-moe-small 1 qwen3-moe-small
seed moe-ep2-dp2 2 moe-ep2-dp2
seed moe-ep2-dp4-zero3 4 moe-ep2-dp4 --set mesh.zero=3
seed pp2-dp2-zero3 4 pp2-dp2 --set directive.3.zero=3 --set directive.0.count=2
seed pp2-zbh1-recompute 4 qwen3-small --set mesh.pp=2 --set mesh.dp=2 --set mesh.microbatches=4 \
  --set 'mesh.schedule="zb-h1"' --set 'mesh.recompute="full"'
seed tp2-sequence 2 qwen3-small --set mesh.tp=2 --set mesh.sequence=true
seed moe-tp2-ep2 2 qwen3-moe-small --set mesh.tp=2 --set mesh.ep=2
seed dp2-bf16 2 dp2 --set 'job.precision="bf16"'
seed dp2-zero2-bf16-reduce 2 quickstart --set mesh.dp=2 --set 'job.precision="bf16"' --set 'job.grad_reduce="bf16"' --set mesh.zero=2
seed dp2-zero3-bf16 2 quickstart --set mesh.dp=2 --set 'job.precision="bf16"' --set mesh.zero=3
ls -l "$out"
