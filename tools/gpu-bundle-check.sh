#!/usr/bin/env bash
# Proves the GPU bundle self-contained without a GPU: unpacks it into a minimal Debian root that has none of
# this project's packages (debootstrap minbase; the CUDA toolkit's libraries bound in read-only, as the GPU
# image has them) and runs piper --version, the unit tests and a 2-rank CPU job with the bundled mpirun.
# Usage: tools/gpu-bundle-check.sh [BUNDLE.tar.xz]   (default build-bundle/piper-gpu.tar.xz; needs root)
#        env: BUNDLE_ROOTFS (the root, build-bundle/rootfs). On exit it ends what still runs in the root and
#        unmounts it (tools/rootfs-lib.sh); it fails, naming them, when mounts are left there.
set -euo pipefail
cd "$(dirname "$0")/.."
TARBALL=$(realpath "${1:-build-bundle/piper-gpu.tar.xz}")
ROOTFS=${BUNDLE_ROOTFS:-$(pwd)/build-bundle/rootfs}
CUDA_DIR=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
[ -f "$TARBALL" ] || { echo "gpu-bundle-check: no bundle at $TARBALL; run tools/gpu-bundle.sh first" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "gpu-bundle-check: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }

# shellcheck source=tools/rootfs-lib.sh
. tools/rootfs-lib.sh
# Whatever an earlier run left running or mounted in the root goes first; nothing in it is deleted while
# anything is still mounted there (rootfs_remove refuses).
release() {
  rootfs_release "$ROOTFS" ||
    { echo "gpu-bundle-check: $ROOTFS still has mounts (above); unmount them before deleting it" >&2; exit 1; }
}
release
trap release EXIT
trap 'exit 130' INT TERM HUP
if [ ! -x "$ROOTFS/bin/bash" ]; then
  command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap >/dev/null
  rootfs_remove "$ROOTFS"
  MIRROR=$(rootfs_mirror bookworm)  # the machine's configured Debian mirror
  echo "gpu-bundle-check: debootstrap bookworm from $MIRROR into $ROOTFS"
  mkdir -p "$(dirname "$ROOTFS")"
  debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 ||
    { tail -20 "$ROOTFS.log"; exit 1; }
fi
rootfs_remove "$ROOTFS/opt/piper-gpu"
tar -C "$ROOTFS/opt" -xJf "$TARBALL"
mkdir -p "$ROOTFS$CUDA_DIR" "$ROOTFS/dev" "$ROOTFS/proc" "$ROOTFS/sys"
# A failed mount ends the script (set -e); the EXIT trap takes down whatever is mounted by then.
mount --bind /dev "$ROOTFS/dev"
mount -t proc proc "$ROOTFS/proc"
mount --bind /sys "$ROOTFS/sys"  # hwloc reads the CPU topology there
mount --bind -o ro "$CUDA_DIR" "$ROOTFS$CUDA_DIR"
[ "$CUDA_DIR" = /usr/local/cuda ] || { mkdir -p "$ROOTFS/usr/local"; ln -sfn "$CUDA_DIR" "$ROOTFS/usr/local/cuda"; }

chroot "$ROOTFS" /bin/bash -c '
set -euo pipefail
cd /opt/piper-gpu
. ./env.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
echo "== piper --version"
piper --version
echo "== unit tests (CUDA ones skip: no GPU here)"
piper_tests "~[slow]" | tail -n 3
echo "== 2-rank CPU job with the bundled mpirun"
mpirun -np 2 --mca btl self,vader piper --config configs/quickstart.toml --steps 3 --set mesh.dp=2 \
  --set job.threads=1 --set "checkpoint.dir=\"\"" | grep -E "^(step|quickstart)"
echo "== missing libraries"
missing=$(for f in bin/* lib/*.so* lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
  ldd "$f" 2>/dev/null | { grep "not found" || true; } | sed "s|^|$f: |"; done | sort -u)
if [ -n "$missing" ]; then echo "$missing"; exit 1; fi
echo "none"
'
echo "gpu-bundle-check: the bundle runs in a root without the project's packages"
