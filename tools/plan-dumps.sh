#!/usr/bin/env bash
# Writes the --dump-plan output of every example config and of GPipe, 1F1B, ZB-H1, interleaved 1F1B and
# DualPipeV at ZeRO 0-3 to OUT, to compare two builds: tools/plan-dumps.sh OLD_PIPER a; ... NEW b; diff -r a b
set -u
[ $# -eq 2 ] || { echo "usage: tools/plan-dumps.sh PIPER OUT" >&2; exit 2; }
piper=$(realpath "$1")
out=$(realpath -m "$2")
cd "$(dirname "$0")/.."
rm -rf "$out"
mkdir -p "$out"
failed=0
# each example on the smallest world that it compiles for
for c in configs/*.toml; do
  n=$(basename "$c" .toml)
  ok=0
  for w in 1 2 4 8 16 32; do
    if "$piper" --config "$c" --dry-run --world $w --dump-plan "$out/$n" >"$out/$n.stdout" 2>&1; then ok=1; break; fi
  done
  [ $ok = 1 ] || { echo "cannot compile $c" >&2; failed=1; }
done
# the mesh's schedules over 4 stages and 2 replicas, and DualPipeV (a V of 4 stages on 2 ranks) from its example
for s in gpipe 1f1b zb-h1 interleaved-1f1b; do
  for z in 0 1 2 3; do
    "$piper" --config configs/quickstart.toml --dry-run --world 8 --dump-plan "$out/$s-zero$z" --set mesh.pp=4 \
      --set mesh.dp=2 --set mesh.microbatches=8 --set "mesh.schedule=\"$s\"" --set mesh.zero=$z \
      --set model.n_layers=8 >"$out/$s-zero$z.stdout" 2>&1 || { echo "cannot compile $s zero $z" >&2; failed=1; }
  done
done
for z in 0 1 2 3; do
  "$piper" --config configs/moe-pp2-ep2-dualpipev.toml --dry-run --world 4 --set directive.5.zero=$z \
    --dump-plan "$out/dualpipev-zero$z" >"$out/dualpipev-zero$z.stdout" 2>&1 || { echo "cannot compile dualpipev zero $z" >&2; failed=1; }
done
# timings, resident memory and the folder's own name are not the plan's
sed -i -E '/compiled in|compile phase|compile time/d; s#'"$out"'#OUT#g' "$out"/*.stdout
exit $failed
