#!/usr/bin/env bash
# Builds the GPU bundle's OpenBLAS from Debian's source package: single precision, no LAPACK, no Fortran runtime,
# pthreads, CPU dispatch among x86-64 server cores, soname libopenblas.so.0; built once, cached in DIR.
# Usage: tools/bundle-openblas.sh [DIR]   (default build-bundle/openblas; prints the path of DIR/libopenblas.so.0)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-bundle/openblas}
# Debian 12's openblas source package; the .dsc is pinned, the tarballs are checked against its SHA-256 sums.
VERSION=0.3.21+ds-4
DSC_SHA256=2faed37b360c6d2a31e82032f8278d29bbec19d99425de2ce501614dff4e5880
# shellcheck source=tools/rootfs-lib.sh
. tools/rootfs-lib.sh
POOL=${DEBIAN_POOL:-$(rootfs_mirror bookworm)/pool/main/o/openblas}  # the machine's configured Debian mirror
# The bundle's binaries need AVX2 (x86-64-v3), so only AVX2 and AVX-512 cores: Haswell and later Intel, Zen 1-3,
# Skylake-X/Cascade Lake (AVX-512), Cooper Lake kernels for every CPU with AVX512-BF16 (OpenBLAS 0.3.21 runs
# Sapphire/Emerald Rapids and Zen 4 on them). PRESCOTT is always in; a CPU it does not know gets the best of
# these by its features.
DYNAMIC_LIST="HASWELL ZEN SKYLAKEX COOPERLAKE"
# Debian's pthread flavour (debian/rules) without LAPACK, Fortran and the double and complex BLAS.
OPTIONS=(DYNAMIC_ARCH=1 "DYNAMIC_LIST=$DYNAMIC_LIST" TARGET=GENERIC USE_THREAD=1 USE_OPENMP=0 NUM_THREADS=64
         INTERFACE64=0 NO_AFFINITY=1 NO_WARMUP=1 NO_LAPACK=1 NO_LAPACKE=1 NOFORTRAN=1 BUILD_SINGLE=1)
LIB="$DIR/libopenblas.so.0"
STAMP="$VERSION ${OPTIONS[*]}"

if [ -f "$LIB" ] && [ "$(cat "$DIR/stamp" 2>/dev/null)" = "$STAMP" ]; then echo "$LIB"; exit 0; fi

installed=$(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || true)
[ "$installed" = "$VERSION" ] ||
  echo "bundle-openblas: the system has OpenBLAS ${installed:-(none)}, the bundle's is built from $VERSION" >&2

rootfs_remove "$DIR"  # refuses while anything is mounted below DIR
mkdir -p "$DIR/dl"
dsc="openblas_$VERSION.dsc"
fetch() { curl -fsSL --retry 3 -o "$DIR/dl/$1" "$POOL/$1" || { echo "bundle-openblas: cannot download $POOL/$1" >&2; exit 1; }; }
fetch "$dsc"
echo "$DSC_SHA256  $DIR/dl/$dsc" | sha256sum -c --quiet - ||
  { echo "bundle-openblas: $dsc does not match its pinned SHA-256" >&2; exit 1; }
# The Checksums-Sha256 section of the .dsc: " SUM SIZE NAME" lines.
mapfile -t sums < <(awk '/^Checksums-Sha256:/{on=1; next} /^[^ ]/{on=0} on && NF==3{print $1 "  " $3}' "$DIR/dl/$dsc")
((${#sums[@]})) || { echo "bundle-openblas: no SHA-256 sums in $dsc" >&2; exit 1; }
for line in "${sums[@]}"; do
  fetch "${line##* }"
  (cd "$DIR/dl" && echo "$line" | sha256sum -c --quiet -) ||
    { echo "bundle-openblas: ${line##* } does not match $dsc" >&2; exit 1; }
done

# Unpack as dpkg-source does for a 3.0 (quilt) package: the upstream tarball, debian/ over it, the patch series.
SRC="$DIR/src"
mkdir -p "$SRC"
tar -C "$SRC" --strip-components=1 -xf "$DIR"/dl/openblas_"${VERSION%-*}".orig.tar.*
tar -C "$SRC" -xf "$DIR"/dl/openblas_"$VERSION".debian.tar.*
while read -r p _; do
  [[ -n "$p" && "$p" != \#* ]] || continue
  patch -d "$SRC" -p1 -s < "$SRC/debian/patches/$p"
done < "$SRC/debian/patches/series"

echo "bundle-openblas: building OpenBLAS $VERSION (${DYNAMIC_LIST// /, }; single precision only)" >&2
make -C "$SRC" -j "$(nproc)" MAKE_NB_JOBS="$(nproc)" "${OPTIONS[@]}" libs shared > "$DIR/build.log" 2>&1 ||
  { tail -30 "$DIR/build.log" >&2; echo "bundle-openblas: build failed, see $DIR/build.log" >&2; exit 1; }
cp -L "$SRC/libopenblas.so.0" "$LIB.tmp"
strip --strip-unneeded "$LIB.tmp"
[ "$(readelf -d "$LIB.tmp" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')" = libopenblas.so.0 ] ||
  { echo "bundle-openblas: $LIB.tmp lacks the soname libopenblas.so.0" >&2; exit 1; }
mv "$LIB.tmp" "$LIB"
rootfs_remove "$SRC" "$DIR/dl"
echo "$STAMP" > "$DIR/stamp"
echo "$LIB"
