#!/usr/bin/env bash
# Download Debian packages and everything they need into a directory, for an
# air-gapped install (guest_container_toolkit_offline_dir) or a test instance
# with no network. Prints the directory.
#
#   scripts/offline-debs.sh [--image IMAGE | --status FILE] [--os-release FILE]
#                           [--capture FILE] [--suite S] [--mirror URL] [--components "C..."] [--keyring FILE]
#                           PACKAGE...
#
# What the guest lacks, nothing more: apt resolves against the guest's own dpkg status, exactly as
# `apt-get install PACKAGE...` on that guest would:
#   --image IMAGE: the status of a local Docker image (read with `docker run`);
#   --capture FILE: the guest's `gpuprov capture` tarball (its dpkg status, fields that name no one,
#     and its os-release: a Debian guest's release picks the suite, VERSION_CODENAME);
#   --status FILE: a guest's /var/lib/dpkg/status, copied from it (`scp guest:/var/lib/dpkg/status .`),
#     with --os-release FILE (the guest's /etc/os-release) as --capture reads them.
# Without either, the whole closure down to libc6 is downloaded.
#
# The packages come from $GPUPROV_DEBIAN_MIRROR (--mirror; default http://deb.debian.org/debian),
# suite bookworm (--suite, or the Debian guest's codename), component main (--components), signed by
# debian-archive-keyring (--keyring: e.g. Ubuntu's archive keyring with --mirror
# http://archive.ubuntu.com/ubuntu --suite noble --components "main universe"). An Ubuntu guest
# takes Debian's bookworm packages by default (Debian 12's docker.io runs on Ubuntu 24.04 with
# what its status lacks added: dev/device/ does exactly that), through a private apt
# configuration (its own sources, lists and caches): the machine's own apt sources and state are
# neither read nor changed, and it needs apt and a keyring only (any Debian or Ubuntu controller).
# Needs root (apt's download sandbox) unless the directory is cached.
#
# Cache: ${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/offline-debs/<key>/, key =
# hash of this script, the sources, the package list and the guest's dpkg status. A complete
# directory holds the .debs and a SHA256SUMS; when it is there nothing is fetched.
# Directories of other keys are removed after a download.
set -euo pipefail

SUITE=bookworm
MIRROR=${GPUPROV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
COMPONENTS=main
cache=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/offline-debs

log() { echo "offline-debs.sh: $*" >&2; }
die() {
  log "$*"
  exit 1
}

image="" status_file="" os_release="" suite="" capture="" from_capture=""
while [[ $# -gt 0 && $1 == --* ]]; do
  [[ $# -ge 2 ]] || die "$1 needs a value"
  case $1 in
    --image) image=$2 ;;
    --status) status_file=$2 ;;
    --os-release) os_release=$2 ;;
    --capture) capture=$2 ;;
    --suite) suite=$2 ;;
    --mirror) MIRROR=$2 ;;
    --components) COMPONENTS=$2 ;;
    --keyring) KEYRING=$2 ;;
    *) die "unknown option $1" ;;
  esac
  shift 2
done
[[ -z $image || -z $status_file ]] || die "--image and --status are two ways to say the same: give one"
if [[ -n $capture ]]; then
  [[ -z $image && -z $status_file && -z $os_release ]] || die "--capture gives the status and os-release: give it alone"
  [[ -f $capture ]] || die "--capture $capture is not a file (the .tar.gz that gpuprov capture wrote)"
  from_capture=$(mktemp -d)
  # Only these two members, to standard output (nothing of the tarball is written where it says), capped.
  tar -xzOf "$capture" var/lib/dpkg/status 2>/dev/null | head -c 67108864 >"$from_capture/status" ||
    die "$capture holds no var/lib/dpkg/status (captured by gpuprov before 2026-11-25, or not a Debian family host)"
  [[ -s $from_capture/status ]] || die "$capture holds no var/lib/dpkg/status"
  tar -xzOf "$capture" etc/os-release 2>/dev/null | head -c 65536 >"$from_capture/os-release" || true
  status_file=$from_capture/status os_release=$from_capture/os-release
fi
if [[ -z $suite && -n $os_release ]]; then
  [[ -f $os_release ]] || die "no such file: $os_release"
  # Read as data (never sourced): ID and VERSION_CODENAME of a Debian guest name its suite.
  id=$(sed -n 's/^ID=["]\{0,1\}\([a-z0-9._-]*\)["]\{0,1\}$/\1/p' "$os_release" | head -1)
  codename=$(sed -n 's/^VERSION_CODENAME=["]\{0,1\}\([a-z0-9._-]*\)["]\{0,1\}$/\1/p' "$os_release" | head -1)
  if [[ $id == debian && -n $codename ]]; then
    suite=$codename
  else
    log "the guest is ${id:-unknown} ${codename}: taking Debian's $SUITE packages (--suite/--mirror/--keyring for another archive)"
  fi
fi
SUITE=${suite:-$SUITE}
[[ $SUITE =~ ^[a-z0-9._/-]+$ ]] || die "--suite $SUITE: letters, digits, . _ / - only"
[[ $MIRROR =~ ^(https?|file):[A-Za-z0-9._~:/?@%+=-]+$ ]] || die "--mirror $MIRROR is not a plain URL"
[[ $COMPONENTS =~ ^[a-z0-9-]+( [a-z0-9-]+)*$ ]] || die "--components: words of letters, digits and - only"
[[ $# -ge 1 ]] || die "usage: $0 [--image IMAGE] PACKAGE..."
packages=("$@")

mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.tmp.XXXXXX")
trap 'rm -rf "$tmp" ${from_capture:+"$from_capture"}' EXIT

status=$tmp/status
if [[ -n $image ]]; then
  docker run --rm --network none "$image" cat /var/lib/dpkg/status >"$status" ||
    die "cannot read /var/lib/dpkg/status from image $image (build it first: scripts/molecule-image.sh)"
elif [[ -n $status_file ]]; then
  [[ -f $status_file ]] || die "--status $status_file is not a file (copy the guest's /var/lib/dpkg/status)"
  cp -- "$status_file" "$status"
else
  : >"$status"
fi

self=$(readlink -f "${BASH_SOURCE[0]}")
key=$( (
  cat "$self"
  printf '%s\n' "$SUITE" "$MIRROR" "$COMPONENTS" "$KEYRING" "${packages[@]}" | sort
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
apt_dir=$cache/apt-$(printf '%s\n' "$MIRROR" "$SUITE" "$COMPONENTS" "$KEYRING" | sha256sum | cut -c1-8)
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache" "$tmp/archives/partial"
echo "deb [signed-by=$KEYRING] $MIRROR $SUITE $COMPONENTS" >"$apt_dir/sources.list"
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
  log "apt-get update ($MIRROR $SUITE $COMPONENTS)"
  apt-get "${opts[@]}" -q update >&2 || die "apt-get update from $MIRROR failed"
fi
log "downloading ${packages[*]} and what they need"
apt-get "${opts[@]}" -q -y --download-only install "${packages[@]}" >&2 ||
  die "apt-get could not download ${packages[*]}"
rm -rf "$tmp/archives/partial" "$tmp/archives/lock"
count=$(find "$tmp/archives" -name '*.deb' | wc -l)
[[ $count -gt 0 ]] || die "nothing to download: ${packages[*]} are already in ${image:-${status_file:-the empty status}}"
(cd "$tmp/archives" && sha256sum ./*.deb >SHA256SUMS)
rm -rf "$dest"
mv "$tmp/archives" "$dest"
find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name 'apt*' ! -name "$key" ! -name '.tmp.*' -exec rm -rf {} +
log "$count packages ($(du -sh "$dest" | cut -f1)) in $dest in $((SECONDS - start))s"
echo "$dest"
