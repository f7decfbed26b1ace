#!/usr/bin/env bash
# Builds a self-contained CUDA bundle for a GPU machine that has CUDA but none of this project's packages:
# piper, its unit tests and sgemm_peak for sm_90 (+PTX), every shared library they and Open MPI need except
# libc, libcuda and the CUDA runtime libraries, Open MPI's plugins and help files, an env.sh, configs, data,
# tools/gpu-check.sh and the CPU reference losses it compares the CUDA runs with (reference/, made here).
# Usage: tools/gpu-bundle.sh [OUT_DIR]   (default build-bundle/piper-gpu; also writes OUT_DIR.tar.xz)
#        env: REF_STEPS (steps of the CPU references, 50: gpu-check.sh's default STEPS)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-build-bundle/piper-gpu}
BUILD=${BUNDLE_BUILD:-build-bundle/build}
ARCH=${CUDA_ARCH:-90}

mkdir -p "$BUILD"
command -v nvcc >/dev/null || { echo "gpu-bundle: nvcc is not on PATH; the bundle needs the CUDA toolkit" >&2; exit 2; }
tools/install-deps.sh
tools/prepare-data.sh

# Portable CPU code (x86-64-v3: AVX2 and FMA, every recent server) and sm_90 SASS plus compute_90 PTX.
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DPIPER_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" \
  -DCMAKE_CUDA_ARCHITECTURES="${ARCH}-real;${ARCH}-virtual" > "$BUILD.configure.log" 2>&1 ||
  { cat "$BUILD.configure.log"; exit 1; }
grep -q "CUDA backend ON" "$BUILD.configure.log" || { cat "$BUILD.configure.log"; echo "gpu-bundle: CUDA backend off" >&2; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target piper piper_cuda piper_tests sgemm_peak
# Debian's libopenblas.so.0 (every precision, LAPACK, libgfortran) would be half the bundle: the bundle gets
# a single-precision BLAS built from the same source package instead (once; cached under build-bundle/).
BLAS=$(tools/bundle-openblas.sh "${BUNDLE_OPENBLAS:-build-bundle/openblas}")

# shellcheck source=tools/rootfs-lib.sh
. tools/rootfs-lib.sh
rootfs_remove "$OUT"  # refuses while anything is mounted below OUT (a chroot root left there, say)
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/configs" "$OUT/data" "$OUT/tools"
# piper loads its CUDA backend from its own folder (libpiper_cuda.so); the unit tests link it in.
cp "$BUILD/piper" "$BUILD/libpiper_cuda.so" "$BUILD/tests/piper_tests" "$BUILD/bench/sgemm_peak" "$OUT/bin/"
cp "$BLAS" "$OUT/lib/libopenblas.so.0"

# Open MPI as Debian lays it out, mirrored under the bundle so that OPAL_PREFIX relocates it.
OMPI_LIB=/usr/lib/x86_64-linux-gnu/openmpi/lib
PMIX_DIR=/usr/lib/x86_64-linux-gnu/pmix2
cp -L /usr/bin/orterun "$OUT/bin/orterun"
cp -L /usr/bin/orted "$OUT/bin/orted"
ln -sf orterun "$OUT/bin/mpirun"
mkdir -p "$OUT/lib/x86_64-linux-gnu/openmpi/lib/openmpi3" "$OUT/share/openmpi" "$OUT/lib/x86_64-linux-gnu/pmix2/lib/pmix" \
  "$OUT/lib/x86_64-linux-gnu/pmix2/share"
cp -r /usr/share/openmpi/. "$OUT/share/openmpi/"
cp -r "$PMIX_DIR/share/." "$OUT/lib/x86_64-linux-gnu/pmix2/share/"
cp "$PMIX_DIR"/lib/pmix/*.so "$OUT/lib/x86_64-linux-gnu/pmix2/lib/pmix/"
# Plugins for interconnects the GPU machine does not have (InfiniBand verbs, UCX, PSM, libfabric) are left out.
SKIP_DEPS='libuc[mpst]|libpsm|infinipath|libibverbs|libfabric|librdmacm|libefa|libnl-'
for so in "$OMPI_LIB"/openmpi3/*.so; do
  # grep without -q: it reads all of ldd's output, so no SIGPIPE fails the pipe (pipefail) and keeps the plugin.
  ldd "$so" | grep -E "$SKIP_DEPS" >/dev/null && continue
  cp "$so" "$OUT/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/"
done

# Every shared library of the binaries and plugins, but libc's own, the dynamic loader, libcuda and the
# CUDA runtime libraries (cudart, cuBLAS, NCCL: the GPU image has them).
SYSTEM='linux-vdso|ld-linux|/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|/libresolv|/libcuda\.so|libcudart|libcublas|libnccl'
# ldd resolves libopenblas.so.0 to the bundle's (its folder holds nothing else), so that the system one's
# libgfortran and libquadmath are not collected.
BLAS_DIR=$(cd "$(dirname "$BLAS")" && pwd)
collect() {
  LD_LIBRARY_PATH="$BLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$1" 2>/dev/null | awk '/=> \//{print $3}' | grep -vE "$SYSTEM" || true
}
mapfile -t objects < <(find "$OUT/bin" "$OUT/lib" -type f \( -name '*.so*' -o -perm -u+x \))
declare -A seen=()
queue=()
for o in "${objects[@]}"; do queue+=("$o"); done
while ((${#queue[@]})); do
  o=${queue[0]}
  queue=("${queue[@]:1}")
  while read -r lib; do
    [[ -n "$lib" && -z "${seen[$lib]:-}" && "${lib##*/}" != libopenblas.so.0 ]] || continue
    seen[$lib]=1
    cp -L "$lib" "$OUT/lib/"
    queue+=("$lib")
  done < <(collect "$o")
done
# Every OpenBLAS function a bundled object imports (from the system's library, as it was linked) must be in
# the bundle's.
SYS_BLAS=$(ldd "$BUILD/piper" | awk '$1 == "libopenblas.so.0" {print $3}')
[ -f "$SYS_BLAS" ] || { echo "gpu-bundle: piper is not linked with libopenblas.so.0" >&2; exit 1; }
defined() { nm -D --defined-only "$1" | awk '{print $3}' | sed 's/@.*//' | sort -u; }
missing=$(for f in "$OUT"/bin/* "$OUT"/lib/*.so* "$OUT"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
    [ -f "$f" ] && readelf -d "$f" 2>/dev/null | grep 'NEEDED.*\[libopenblas\.so\.0\]' >/dev/null || continue
    nm -D --undefined-only "$f" | awk '{print $2}' | sed 's/@.*//'
  done | sort -u | comm -12 - <(defined "$SYS_BLAS") | comm -23 - <(defined "$OUT/lib/libopenblas.so.0"))
[ -z "$missing" ] || { echo "gpu-bundle: the bundle's OpenBLAS lacks: $missing" >&2; exit 1; }
strip --strip-unneeded "$OUT"/bin/piper "$OUT"/bin/piper_tests "$OUT"/bin/sgemm_peak 2>/dev/null || true

cp configs/*.toml "$OUT/configs/"
cp data/fortunes.txt "$OUT/data/"
cp tools/gpu-check.sh "$OUT/tools/"

cat > "$OUT/env.sh" <<'ENV'
# Source this: paths for the bundle's binaries, libraries and Open MPI (relocated with OPAL_PREFIX), and the
# CUDA runtime libraries the machine has (the CUDA toolkit, or the NVIDIA wheels of a Python installation).
B=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX="$B" PMIX_PREFIX="$B/lib/x86_64-linux-gnu/pmix2"
export PMIX_MCA_mca_base_component_path="$B/lib/x86_64-linux-gnu/pmix2/lib/pmix"
export OMPI_MCA_mca_base_component_show_load_errors=0
export OMPI_MCA_plm_rsh_agent=${OMPI_MCA_plm_rsh_agent:-false}  # one node: no ssh needed
export PATH="$B/bin:$PATH"
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; p = nvidia.__path__[0]; print(" ".join(os.path.join(p, d, "lib") for d in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && cuda_libs="$cuda_libs:$d"
done
export LD_LIBRARY_PATH="$B/lib:$B/lib/x86_64-linux-gnu/openmpi/lib${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A processor newer than the bundled OpenBLAS gets its pre-AVX kernels (an Intel Xeon of model 207 ran sgemm at
# 1/4 speed as "Katmai"): unless OPENBLAS_CORETYPE is set, name the nearest core it knows, as piper's warning says.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  core=$(python3 -c 'import ctypes, sys
l = ctypes.CDLL(sys.argv[1]); l.openblas_get_corename.restype = ctypes.c_char_p
print(l.openblas_get_corename().decode().lower())' "$B/lib/libopenblas.so.0" 2>/dev/null)
  case $core in
    haswell | zen | skylakex | cooperlake | sapphirerapids | "") ;;
    *) if grep -qw avx512bw /proc/cpuinfo; then export OPENBLAS_CORETYPE=SKYLAKEX; else export OPENBLAS_CORETYPE=HASWELL; fi
       echo "env.sh: OpenBLAS does not know this processor ('$core' kernels): OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE" >&2 ;;
  esac
fi
ENV

# CPU reference losses for tools/gpu-check.sh, with the bundle's own piper and libraries, so that the GPU
# machine spends its time on the CUDA runs only (same configs, steps and settings as the check's runs).
echo "gpu-bundle: CPU reference losses (${REF_STEPS:-50} steps per config; a few minutes)"
ref=$OUT/reference piper_bin=$OUT/bin/piper
# shellcheck disable=SC1091
(. "$OUT/env.sh" && PIPER=$piper_bin OUT=$ref tools/gpu-check.sh --make-references "$ref" "${REF_STEPS:-50}") ||
  { echo "gpu-bundle: a CPU reference run failed (logs in $ref)" >&2; exit 1; }

size=$(du -sm "$OUT" | cut -f1)
tar -C "$(dirname "$OUT")" -cJf "$OUT.tar.xz" "$(basename "$OUT")"
echo "gpu-bundle: $OUT ($size MiB unpacked, $(du -m "$OUT.tar.xz" | cut -f1) MiB as $OUT.tar.xz)"
