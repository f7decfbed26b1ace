#!/usr/bin/env bash
# Installs the Debian packages Piper needs to build, test and run, only those missing.
# Called by `make`; safe to run again (does nothing when everything is present). Arguments are more packages
# to install: `make fuzz` asks for clang-14, libclang-rt-14-dev (libFuzzer) and libomp-14-dev this way.
set -euo pipefail

PKGS=(g++ cmake make pkg-config
      openmpi-bin libopenmpi-dev
      libhdf5-dev hdf5-tools
      libboost-program-options-dev
      libtomlplusplus-dev
      libxxhash-dev   # XXH64, the checkpoints' block hashes
      nlohmann-json3-dev   # JSON read from files (safetensors headers)
      catch2
      libopenblas-dev
      libdnnl2   # oneDNN, loaded at run time: job.precision = "bf16" matmuls on processors with bf16 instructions
      libdnnl-dev   # oneDNN's headers: the types of its matmul primitive's C API, called through libdnnl2
      fortunes-min fortunes
      strace    # the watchdog test holds a rank inside a checkpoint write (syscall delay injection)
      python3-matplotlib)   # tools/plot-metrics.py draws with it
PKGS+=("$@")

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 2; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
