#!/usr/bin/env bash
# Builds the default training corpus data/fortunes.txt from the text of Debian's fortune databases
# (packages fortunes-min and fortunes, installed by tools/install-deps.sh). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
src=/usr/share/games/fortunes
out=data/fortunes.txt
[ -s "$out" ] && exit 0
if [ ! -d "$src" ]; then
  echo "prepare-data: $src is missing; run tools/install-deps.sh (installs fortunes-min and fortunes)" >&2
  exit 2
fi
mkdir -p data
tmp=$(mktemp data/.fortunes.XXXXXX)
# plain-text databases only: skip the .dat indexes and the .u8 links
find "$src" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | LC_ALL=C sort | while read -r f; do
  cat "$f"
done > "$tmp"
chmod 644 "$tmp"
mv "$tmp" "$out"
echo "prepare-data: wrote $out ($(wc -c < "$out") bytes)" >&2
