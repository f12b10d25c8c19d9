#!/usr/bin/env bash
# Download Debian packages and everything they need into a directory, for an
# air-gapped install (guest_container_toolkit_offline_dir) or a test instance
# with no network. Prints the directory.
#
#   scripts/offline-debs.sh [--image IMAGE] PACKAGE...
#
# --image IMAGE: only what IMAGE does not have yet: apt resolves against that
#   image's /var/lib/dpkg/status (read with `docker run`), exactly as `apt-get
#   install PACKAGE...` inside it would. Without it, the whole closure down to
#   libc6 is downloaded.
#
# The packages come from Debian's archive ($GPUPROV_DEBIAN_MIRROR, default
# http://deb.debian.org/debian), suite bookworm, component main, through a private
# apt configuration (its own sources, lists and caches): the machine's own apt
# sources and state are neither read nor changed, and it needs apt and
# debian-archive-keyring only (any Debian or Ubuntu controller). Needs root (apt's
# download sandbox) unless the directory is cached.
#
# Cache: ${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/offline-debs/<key>/, key =
# hash of this script, the package list and the image's dpkg status. A complete
# directory holds the .debs and a SHA256SUMS; when it is there nothing is fetched.
# Directories of other keys are removed after a download.
set -euo pipefail

SUITE=bookworm
MIRROR=${GPUPROV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
cache=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/offline-debs

log() { echo "offline-debs.sh: $*" >&2; }
die() {
  log "$*"
  exit 1
}

image=""
if [[ ${1:-} == --image ]]; then
  [[ $# -ge 2 ]] || die "--image needs an image name"
  image=$2
  shift 2
fi
[[ $# -ge 1 ]] || die "usage: $0 [--image IMAGE] PACKAGE..."
packages=("$@")

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

status=$tmp/status
if [[ -n $image ]]; then
  docker run --rm --network none "$image" cat /var/lib/dpkg/status >"$status" ||
    die "cannot read /var/lib/dpkg/status from image $image (build it first: scripts/molecule-image.sh)"
else
  : >"$status"
fi

self=$(readlink -f "${BASH_SOURCE[0]}")
key=$( (
  cat "$self"
  printf '%s\n' "$SUITE" "$MIRROR" "${packages[@]}" | sort
  sha256sum <"$status"
) | sha256sum | cut -c1-12)
dest=$cache/$key

if [[ -s $dest/SHA256SUMS ]] && (cd "$dest" && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1); then
  log "cached: $dest ($(find "$dest" -name '*.deb' | wc -l) packages)"
  echo "$dest"
  exit 0
fi

[[ $(id -u) -eq 0 ]] || die "downloading needs root (apt's sandbox); nothing cached at $dest"
[[ -r $KEYRING ]] || die "no $KEYRING: apt-get install debian-archive-keyring"

# A private apt: its own sources, lists and caches; the image's dpkg status.
apt_dir=$cache/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache" "$tmp/archives/partial"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" >"$apt_dir/sources.list"
opts=(
  -o "Dir::Etc::sourcelist=$apt_dir/sources.list"
  -o "Dir::Etc::sourceparts=-"
  -o "Dir::State::lists=$apt_dir/lists"
  -o "Dir::Cache=$apt_dir/cache"
  -o "Dir::State::status=$status"
  -o "Dir::Cache::archives=$tmp/archives"
  -o "Dir::State::extended_states=$tmp/extended_states"
  -o "Debug::NoLocking=1"
  -o "APT::Sandbox::User=root"
  -o "APT::Install-Recommends=false"
)
start=$SECONDS
# Lists younger than a day are reused; otherwise fetch them (a few MB).
if [[ -z $(find "$apt_dir/lists" -name '*_Packages' -mmin -1440 2>/dev/null) ]]; then
  log "apt-get update ($MIRROR $SUITE main)"
  apt-get "${opts[@]}" -q update >&2 || die "apt-get update from $MIRROR failed"
fi
log "downloading ${packages[*]} and what they need"
apt-get "${opts[@]}" -q -y --download-only install "${packages[@]}" >&2 ||
  die "apt-get could not download ${packages[*]}"
rm -rf "$tmp/archives/partial" "$tmp/archives/lock"
count=$(find "$tmp/archives" -name '*.deb' | wc -l)
[[ $count -gt 0 ]] || die "nothing to download: ${packages[*]} are already in ${image:-the empty status}"
(cd "$tmp/archives" && sha256sum ./*.deb >SHA256SUMS)
rm -rf "$dest"
mv "$tmp/archives" "$dest"
find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name apt ! -name "$key" ! -name '.tmp.*' -exec rm -rf {} +
log "$count packages ($(du -sh "$dest" | cut -f1)) in $dest in $((SECONDS - start))s"
echo "$dest"
