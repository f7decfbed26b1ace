# shellcheck shell=bash
# Process helpers shared by tools/slurm-local-up.sh and tools/slurm-local-down.sh (sourced, not run):
# they find and stop the local cluster's daemons by the PID in their PID files, never by name alone.

# running PID NAME: true when PID is a live (not zombie) process whose command is NAME.
# Zombies count as gone: some init processes reap orphans only every few seconds.
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  [[ $stat =~ ^[0-9]+\ \((.*)\)\ ([A-Za-z]) ]] || return 1
  [ "${BASH_REMATCH[2]}" != Z ] && [ "${BASH_REMATCH[1]}" = "$2" ]
}

# alive PIDFILE NAME: the daemon recorded in PIDFILE is running.
alive() { [ -s "$1" ] && running "$(cat "$1")" "$2"; }

# stop PIDFILE NAME: SIGTERM, wait up to 10 s, then SIGKILL and up to 5 s more; only ever the recorded PID.
# Fails when the process is still there afterwards. Uses the caller's log function.
stop() {
  local pid
  if ! alive "$1" "$2"; then rm -f "$1"; return 0; fi
  pid=$(cat "$1")
  log "stopping $2 (pid $pid)"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 100); do running "$pid" "$2" || { rm -f "$1"; return 0; }; sleep 0.1; done
  log "$2 (pid $pid) ignored SIGTERM; sending SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 50); do running "$pid" "$2" || { rm -f "$1"; return 0; }; sleep 0.1; done
  log "error: $2 (pid $pid) is still running"
  return 1
}
