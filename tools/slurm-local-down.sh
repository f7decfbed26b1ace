#!/usr/bin/env bash
# Stops the one-node Slurm cluster started by tools/slurm-local-up.sh: cancels leftover jobs, then stops
# slurmd, slurmctld and (only if the up script started it) munged, each by the PID in its PID file.
# Safe to run at any time, also when nothing is running; always exits 0 when the daemons are gone.
set -uo pipefail

log() { echo "[slurm-local-down] $*" >&2; }

# shellcheck source=tools/slurm-local-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/slurm-local-lib.sh"

if [ "$(id -u)" -ne 0 ]; then log "error: must run as root (try: sudo $0)"; exit 1; fi

# Cancel jobs first, so that no slurmstepd (and no rank it started) outlives slurmd.
if alive /run/slurmctld.pid slurmctld; then
  jobs=$(squeue -h -o %i 2>/dev/null)
  if [ -n "$jobs" ]; then
    log "cancelling jobs: ${jobs//$'\n'/ }"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null
    for _ in $(seq 150); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.1; done
  fi
fi

status=0
stop /run/slurmd.pid slurmd || status=1
stop /run/slurmctld.pid slurmctld || status=1
if [ -e /run/slurm-local.munged-started ]; then    # a munged that was already running is left alone
  stop /run/munge/munged.pid munged || status=1
  rm -f /run/slurm-local.munged-started
fi
if [ -e /run/slurm-local.mounts ]; then             # what slurm-local-up.sh mounted for slurmd, innermost last
  for m in $(tac /run/slurm-local.mounts); do umount "$m" 2>/dev/null || status=1; done
  rm -f /run/slurm-local.mounts
fi
exit $status
