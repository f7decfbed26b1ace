# Safe handling of a chroot root for the tools that build one (tools/gpu-bundle-check.sh): ends what runs in
# it, unmounts everything below it, deletes it only when nothing is mounted there, picks the debootstrap mirror.
#
# shellcheck shell=bash
# Source it, or run it: bash tools/rootfs-lib.sh release|remove|mirror ARG...
#   rootfs_release DIR...  ends every process whose root or working directory is in DIR (TERM, then KILL
#                          after ROOTFS_TERM_WAIT seconds, 3), unmounts every mount at or below DIR, deepest
#                          first (umount, then umount -l unless ROOTFS_NO_LAZY=1), then fails, naming them,
#                          while any is left
#   rootfs_remove DIR...   deletes DIR with rm -rf --one-file-system, only when nothing is mounted at or below
#                          it (fails and deletes nothing otherwise); it ends and unmounts nothing itself
#   rootfs_mirror [SUITE]  the first `deb` URI of the machine's apt sources that serves SUITE (bookworm) with
#                          its main component, http://deb.debian.org/debian when none does
#                          (env ROOTFS_APT_ETC, /etc/apt, and ROOTFS_APT_LISTS, /var/lib/apt/lists)

rootfs_log() { echo "rootfs: $*" >&2; }
rootfs_list() { local m; while IFS= read -r m; do echo "  $m"; done <<< "$1" >&2; }

# DIR as /proc shows it: absolute, symbolic links resolved (DIR need not exist).
rootfs_canon() { readlink -m -- "$1"; }

# Mount points at or below DIR (canonical), deepest first, one a line, as /proc/mounts lists them now.
# Fails when /proc/mounts cannot be read: then nothing counts as unmounted.
rootfs_mounts() {
  local root=$1 _dev mnt _rest
  [ -r /proc/mounts ] || { rootfs_log "cannot read /proc/mounts"; return 1; }
  while read -r _dev mnt _rest; do
    # /proc/mounts writes a space as \040, a backslash as \134: always 3 octal digits, and %b reads them
    # as such only after \0 (\0401 would be one character).
    mnt=$(printf '%b' "${mnt//\\/\\0}")
    case $mnt in "$root" | "$root"/*) printf '%s %s\n' "${#mnt}" "$mnt" ;; esac
  done < /proc/mounts | sort -rn | cut -d' ' -f2-
}

# PIDs of this shell and its ancestors: never ended, even when they sit in DIR.
rootfs_self_pids() {
  local pid=$BASHPID ppid
  echo "$$"
  while [ "$pid" -gt 1 ] 2>/dev/null; do
    echo "$pid"
    ppid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || break
    pid=${ppid:-0}
  done
}

# Processes whose root or working directory is DIR (canonical) or below it, one PID a line.
rootfs_procs() {
  local root=$1
  find /proc -mindepth 2 -maxdepth 2 -regex '/proc/[0-9]+/\(root\|cwd\)' -type l -printf '%h %l\n' 2>/dev/null |
    awk -v root="$root" -v self=" $(rootfs_self_pids | tr '\n' ' ') " '
      { pid = substr($1, 7); t = substr($0, length($1) + 2) }
      index(self, " " pid " ") { next }
      (t == root || index(t, root "/") == 1) && !(pid in seen) { seen[pid]; print pid }'
}

# Sends SIG to the processes in DIR, then waits up to SECONDS for them to be gone; fails if some are left.
rootfs_signal_wait() {
  local root=$1 sig=$2 tenths pids i
  tenths=$(awk -v s="$3" 'BEGIN {printf "%d", s * 10}')
  pids=$(rootfs_procs "$root")
  [ -n "$pids" ] || return 0
  rootfs_log "ending the processes in $root (SIG$sig): ${pids//$'\n'/ }"
  # shellcheck disable=SC2086
  kill -s "$sig" $pids 2>/dev/null || true
  for ((i = 0; i < tenths; ++i)); do
    [ -z "$(rootfs_procs "$root")" ] && return 0
    sleep 0.1
  done
  [ -z "$(rootfs_procs "$root")" ]
}

# A subshell that works from /, so that neither it nor its helpers hold the caller's folder, which may be in DIR.
rootfs_release() (
  local dir root status=0 pass m before after left roots=()
  for dir in "$@"; do roots+=("$(rootfs_canon "$dir")"); done
  cd / || exit 1
  for root in "${roots[@]}"; do
    [ "$root" != / ] || { rootfs_log "refusing to release /"; return 1; }
    rootfs_signal_wait "$root" TERM "${ROOTFS_TERM_WAIT:-3}" || rootfs_signal_wait "$root" KILL 2 ||
      rootfs_log "processes still in $root: $(rootfs_procs "$root" | tr '\n' ' ')"
    # Stacked mounts come off one a pass: repeat while the list shrinks.
    after=$(rootfs_mounts "$root")
    for ((pass = 0; pass < 16 && ${#after} > 0; ++pass)); do
      before=$after
      while IFS= read -r m; do
        umount -- "$m" 2>/dev/null && continue
        [ "${ROOTFS_NO_LAZY:-0}" = 1 ] || umount -l -- "$m" 2>/dev/null || true
      done <<< "$before"
      after=$(rootfs_mounts "$root")
      [ "$after" != "$before" ] || break
    done
    left=$(rootfs_mounts "$root") || return 1
    if [ -n "$left" ]; then
      rootfs_log "still mounted below $root (nothing there is deleted until they are unmounted):"
      rootfs_list "$left"
      status=1
    fi
  done
  return $status
)

rootfs_remove() {
  local dir root left
  for dir in "$@"; do
    [ -n "$dir" ] || continue
    [ -e "$dir" ] || [ -L "$dir" ] || continue
    root=$(rootfs_canon "$dir")
    [ "$root" != / ] || { rootfs_log "refusing to delete /"; return 1; }
    left=$(rootfs_mounts "$root") || { rootfs_log "refusing to delete $dir"; return 1; }
    if [ -n "$left" ]; then
      rootfs_log "refusing to delete $dir: still mounted below it:"
      rootfs_list "$left"
      return 1
    fi
    rm -rf --one-file-system -- "$dir" || { rootfs_log "could not delete all of $dir"; return 1; }
  done
}

# The configured `deb` sources, in the order apt reads them: "URI SUITE COMPONENT..." one a line.
rootfs_apt_sources() {
  local etc=${ROOTFS_APT_ETC:-/etc/apt} f
  for f in "$etc/sources.list" "$etc"/sources.list.d/*; do
    [ -f "$f" ] || continue
    case $f in
      *.list)  # one-line style: deb [options] URI SUITE COMPONENT...
        sed -e 's/#.*//' -e 's/\[[^]]*\]//' "$f" | awk '$1 == "deb" && NF >= 4 {$1 = ""; print substr($0, 2)}' ;;
      *.sources)  # deb822 style: stanzas of Types, URIs, Suites, Components (and Enabled)
        awk '
          function flush(   u, s, nu, ns, i, j, us, ss) {
            if (f["types"] ~ /(^| )deb( |$)/ && f["enabled"] !~ /^(no|false|0)$/) {
              nu = split(f["uris"], us, " "); ns = split(f["suites"], ss, " ")
              for (i = 1; i <= nu; ++i) for (j = 1; j <= ns; ++j) print us[i], ss[j], f["components"]
            }
            delete f; key = ""
          }
          /^#/ { next }
          /^[ \t]*$/ { flush(); next }
          /^[ \t]/ { if (key != "") f[key] = f[key] " " $0; next }
          { key = tolower(substr($0, 1, index($0, ":") - 1)); v = substr($0, index($0, ":") + 1); gsub(/^[ \t]+|[ \t]+$/, "", v); f[key] = v }
          END { flush() }
        ' "$f" | sed -e 's/[ \t][ \t]*/ /g' -e 's/^ //' ;;
    esac
  done
}

rootfs_mirror() {
  local suite=${1:-bookworm} lists=${ROOTFS_APT_LISTS:-/var/lib/apt/lists} uri s comps name rel
  while read -r uri s comps; do
    [[ $s == "$suite" && " $comps " == *" main "* ]] || continue
    [[ $uri =~ ^(https?|ftp|file):/ ]] || continue
    # apt's own copy of that source's Release file, when it has one, must say the archive is Debian's.
    name=$(sed -e 's|^[a-z]*:/*||' -e 's|/*$||' -e 's|/|_|g' <<< "$uri")_dists_${suite}
    for rel in "$lists/${name}_InRelease" "$lists/${name}_Release"; do
      [ -f "$rel" ] && break
    done
    if [ -f "$rel" ] && ! grep -q '^Origin: Debian$' "$rel"; then continue; fi
    echo "${uri%/}"
    return 0
  done < <(rootfs_apt_sources)
  echo http://deb.debian.org/debian
}

if ! (return 0 2>/dev/null); then  # run, not sourced
  set -uo pipefail
  case ${1:-} in
    release | remove | mirror) cmd=$1; shift; "rootfs_$cmd" "$@" ;;
    *) echo "usage: bash $0 release|remove DIR... | mirror [SUITE]" >&2; exit 2 ;;
  esac
fi
