# shellcheck shell=bash
# Sourced by scripts/guest-image.sh and scripts/molecule-image.sh (both hash this
# file into their image keys): one debootstrap of a Debian minbase, and on failure
# the tail of both its logs, so a broken mirror or package list says why.
#
#   minbase_debootstrap SUITE MIRROR ROOTFS LOG PACKAGE...
minbase_debootstrap() {
  local suite=$1 mirror=$2 rootfs=$3 logfile=$4 includes
  shift 4
  includes=$(
    IFS=,
    echo "$*"
  )
  if ! debootstrap --variant=minbase --include="$includes" "$suite" "$rootfs" "$mirror" >"$logfile" 2>&1; then
    echo "debootstrap failed; last lines of its log:" >&2
    tail -n 30 "$logfile" >&2
    [[ -f $rootfs/debootstrap/debootstrap.log ]] && tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
    return 1
  fi
}
