#!/usr/bin/env bash
# Build the molecule test images locally, from Debian packages only (no registry
# is reachable, nothing is pulled):
#
#   gpuprov-molecule-debian12      a debootstrap minbase of Debian 12 with python3
#                                  (for Ansible) and kmod (so the tests can parse the
#                                  modprobe.d files the roles write with the real
#                                  `modprobe --showconfig`). No initramfs-tools, no
#                                  grub: inside a container the roles must not run
#                                  update-initramfs or update-grub.
#   gpuprov-molecule-ubuntu-like   the same rootfs with Ubuntu 24.04 (noble)'s identity:
#                                  /etc/os-release, /etc/lsb-release, /etc/debian_version
#                                  and the stock deb822 /etc/apt/sources.list.d/ubuntu.sources,
#                                  so Ansible's facts say Ubuntu noble and the guest roles
#                                  take their Ubuntu path. Its packages are Debian's (only
#                                  PyPI and Debian's archive are reachable in CI).
#
# Each is tagged <name>:<key> (key = hash of this script, package lists included,
# and the image's name) and <name>:latest, which molecule/*/molecule.yml use.
#
#   scripts/molecule-image.sh                 both images
#   scripts/molecule-image.sh debian12        only gpuprov-molecule-debian12
#   scripts/molecule-image.sh ubuntu-like     only gpuprov-molecule-ubuntu-like
#
# Prints the <name>:<key> of each image built or found, one a line.
#
# Cache, cheapest first, per image:
#   1. the image <name>:<key> is already in the engine: only (re)tag :latest;
#   2. ${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/molecule/<name>-<key>.tar exists: docker import (seconds);
#   3. otherwise build that rootfs tarball (the Debian one with debootstrap, about a
#      minute; the Ubuntu-like one from the Debian tarball, seconds), then docker import.
# A change to this script (packages, suite, clean-up, identity files) changes the keys,
# so a stale image or tarball is never reused. Tarballs of older keys are removed.
#
# Environment: GPUPROV_CACHE, GPUPROV_DEBIAN_MIRROR (default http://deb.debian.org/debian).
# Needs root (debootstrap, tar with owners) only when a tarball is not cached; needs a
# Docker engine (scripts/dockerd.sh starts one).
set -euo pipefail

DEBIAN_NAME=gpuprov-molecule-debian12
UBUNTU_NAME=gpuprov-molecule-ubuntu-like
SUITE=bookworm
PACKAGES=(python3 kmod)
MIRROR=${GPUPROV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/molecule

self=$(readlink -f "${BASH_SOURCE[0]}")
lib=$(dirname "$self")/minbase.sh
# shellcheck source=scripts/minbase.sh
source "$lib"
key_of() {
  (
    cat "$self" "$lib"
    echo "$1 $SUITE ${PACKAGES[*]}"
  ) | sha256sum | cut -c1-12
}
debian_key=$(key_of "$DEBIAN_NAME")
ubuntu_key=$(key_of "$UBUNTU_NAME")
debian_tarball="$cache/$DEBIAN_NAME-$debian_key.tar"
ubuntu_tarball="$cache/$UBUNTU_NAME-$ubuntu_key.tar"

log() { echo "molecule-image.sh: $*" >&2; }

case ${1:-all} in
  all) wanted=(debian12 ubuntu-like) ;;
  debian12 | ubuntu-like) wanted=("$1") ;;
  *)
    log "unknown image '$1': give debian12, ubuntu-like or nothing (both)"
    exit 2
    ;;
esac

if ! docker info >/dev/null 2>&1; then
  log "no Docker engine answers; start one with scripts/dockerd.sh"
  exit 1
fi

need_root() {
  [[ $(id -u) -eq 0 ]] || {
    log "building $1 needs root; no cached tarball"
    exit 1
  }
}

work=""
cleanup() { [[ -z $work ]] || rm -rf "$work"; }
trap cleanup EXIT
workdir() {
  [[ -n $work ]] || work=$(mktemp -d "$cache/build.XXXXXX")
}

build_debian_tarball() {
  local start=$SECONDS rootfs includes
  need_root "$DEBIAN_NAME"
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap ||
      {
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
      }
  fi
  workdir
  rootfs="$work/debian-rootfs"
  log "debootstrap $SUITE minbase + ${PACKAGES[*]} from $MIRROR (about a minute)"
  minbase_debootstrap "$SUITE" "$MIRROR" "$rootfs" "$work/debootstrap.log" "${PACKAGES[@]}" || exit 1
  # Keep it small and deterministic enough: no docs, man pages, locales, apt caches.
  rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/debootstrap
  find "$rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
  echo gpuprov-molecule >"$rootfs/etc/hostname"
  tar --numeric-owner -C "$rootfs" -cf "$work/debian.tar" .
  mv "$work/debian.tar" "$debian_tarball"
  log "rootfs tarball $debian_tarball ($(du -h "$debian_tarball" | cut -f1)) in $((SECONDS - start))s"
}

# Ubuntu 24.04's identity over the Debian rootfs: the files Ansible's distribution
# facts and the roles read (os-release, lsb-release, debian_version, apt sources).
ubuntu_identity() {
  local rootfs=$1
  # /etc/os-release is a link to ../usr/lib/os-release on both; keep the link.
  cat >"$rootfs/usr/lib/os-release" <<'EOF'
PRETTY_NAME="Ubuntu 24.04.1 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.1 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
EOF
  cat >"$rootfs/etc/lsb-release" <<'EOF'
DISTRIB_ID=Ubuntu
DISTRIB_RELEASE=24.04
DISTRIB_CODENAME=noble
DISTRIB_DESCRIPTION="Ubuntu 24.04.1 LTS"
EOF
  echo "trixie/sid" >"$rootfs/etc/debian_version"
  # As Ubuntu 24.04 ships them: deb822 sources, a sources.list that only points there.
  cat >"$rootfs/etc/apt/sources.list" <<'EOF'
# Ubuntu sources have moved to /etc/apt/sources.list.d/ubuntu.sources
EOF
  mkdir -p "$rootfs/etc/apt/sources.list.d"
  cat >"$rootfs/etc/apt/sources.list.d/ubuntu.sources" <<'EOF'
Types: deb
URIs: http://archive.ubuntu.com/ubuntu/
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg

Types: deb
URIs: http://security.ubuntu.com/ubuntu/
Suites: noble-security
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
EOF
  echo gpuprov-molecule-ubuntu >"$rootfs/etc/hostname"
}

build_ubuntu_tarball() {
  local start=$SECONDS rootfs
  need_root "$UBUNTU_NAME"
  [[ -s $debian_tarball ]] || build_debian_tarball
  workdir
  rootfs="$work/ubuntu-rootfs"
  mkdir -p "$rootfs"
  tar --numeric-owner -xpf "$debian_tarball" -C "$rootfs"
  ubuntu_identity "$rootfs"
  tar --numeric-owner -C "$rootfs" -cf "$work/ubuntu.tar" .
  rm -rf "$rootfs"
  mv "$work/ubuntu.tar" "$ubuntu_tarball"
  log "rootfs tarball $ubuntu_tarball ($(du -h "$ubuntu_tarball" | cut -f1)) in $((SECONDS - start))s"
}

import_image() { # name key tarball
  local name=$1 key=$2 tarball=$3 start=$SECONDS
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL org.gpuprov.molecule-key=$key" \
    --message "gpuprov molecule image $key" \
    "$tarball" "$name:$key" >/dev/null
  docker tag "$name:$key" "$name:latest"
  log "imported $name:$key in $((SECONDS - start))s (tagged $name:latest)"
  # Older keys of this image are dead weight in the engine.
  docker image ls --format '{{.Repository}}:{{.Tag}}' "$name" |
    grep -v -e ":latest\$" -e ":$key\$" | xargs -r docker image rm >/dev/null 2>&1 || true
}

ensure() { # name key tarball builder
  local name=$1 key=$2 tarball=$3 builder=$4
  if docker image inspect "$name:$key" >/dev/null 2>&1; then
    docker tag "$name:$key" "$name:latest"
    log "$name:$key already built (tagged $name:latest)"
  else
    mkdir -p "$cache"
    if [[ -s $tarball ]]; then
      log "using cached rootfs $tarball"
    else
      "$builder"
    fi
    import_image "$name" "$key" "$tarball"
  fi
  echo "$name:$key"
}

for image in "${wanted[@]}"; do
  case $image in
    debian12) ensure "$DEBIAN_NAME" "$debian_key" "$debian_tarball" build_debian_tarball ;;
    ubuntu-like) ensure "$UBUNTU_NAME" "$ubuntu_key" "$ubuntu_tarball" build_ubuntu_tarball ;;
  esac
done

# Tarballs of other keys (an older script, or the single-image naming before) are stale.
if [[ -d $cache ]]; then
  find "$cache" -maxdepth 1 -name '*.tar' ! -name "$DEBIAN_NAME-$debian_key.tar" \
    ! -name "$UBUNTU_NAME-$ubuntu_key.tar" -delete
fi
