#!/usr/bin/env bash
# Build the molecule test image locally, from Debian packages only (no registry
# is reachable, nothing is pulled): a debootstrap minbase of Debian 12 with
# python3 (for Ansible) and kmod (so the tests can parse the modprobe.d files the
# roles write with the real `modprobe --showconfig`). No initramfs-tools, no grub:
# inside a container the roles must not run update-initramfs or update-grub.
#
#   gpuprov-molecule-debian12:<key>    key = hash of this script (package list included)
#   gpuprov-molecule-debian12:latest   what molecule/*/molecule.yml use
#
# Cache, cheapest first:
#   1. the image <name>:<key> is already in the engine: only (re)tag :latest;
#   2. ${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/molecule/<key>.tar exists: docker import (seconds);
#   3. otherwise debootstrap (about a minute), write that tarball, docker import.
# A change to this script (packages, suite, clean-up) changes the key, so a stale
# image or tarball is never reused. Old tarballs are removed on a rebuild.
#
# Environment: GPUPROV_CACHE, GPUPROV_DEBIAN_MIRROR (default http://deb.debian.org/debian).
# Needs root (debootstrap) only when the tarball is not cached; needs a Docker engine
# (scripts/dockerd.sh starts one).
set -euo pipefail

NAME=gpuprov-molecule-debian12
SUITE=bookworm
PACKAGES=(python3 kmod)
MIRROR=${GPUPROV_DEBIAN_MIRROR:-http://deb.debian.org/debian}
cache=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/molecule

self=$(readlink -f "${BASH_SOURCE[0]}")
key=$( (
  cat "$self"
  echo "$SUITE ${PACKAGES[*]}"
) | sha256sum | cut -c1-12)
image="$NAME:$key"
tarball="$cache/$key.tar"

log() { echo "molecule-image.sh: $*" >&2; }

if ! docker info >/dev/null 2>&1; then
  log "no Docker engine answers; start one with scripts/dockerd.sh"
  exit 1
fi

if docker image inspect "$image" >/dev/null 2>&1; then
  docker tag "$image" "$NAME:latest"
  log "$image already built (tagged $NAME:latest)"
  echo "$image"
  exit 0
fi

start=$SECONDS
mkdir -p "$cache"
if [[ ! -s $tarball ]]; then
  [[ $(id -u) -eq 0 ]] || {
    log "building the image needs root (debootstrap); no cached $tarball"
    exit 1
  }
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap ||
      {
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
      }
  fi
  work=$(mktemp -d "$cache/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  rootfs="$work/rootfs"
  log "debootstrap $SUITE minbase + ${PACKAGES[*]} from $MIRROR (about a minute)"
  includes=$(
    IFS=,
    echo "${PACKAGES[*]}"
  )
  if ! debootstrap --variant=minbase --include="$includes" "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
    log "debootstrap failed; last lines of its log:"
    tail -n 30 "$work/debootstrap.log" >&2
    [[ -f $rootfs/debootstrap/debootstrap.log ]] && tail -n 30 "$rootfs/debootstrap/debootstrap.log" >&2
    exit 1
  fi
  # Keep it small and deterministic enough: no docs, man pages, locales, apt caches.
  rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/debootstrap
  find "$rootfs"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
  echo gpuprov-molecule >"$rootfs/etc/hostname"
  tar --numeric-owner -C "$rootfs" -cf "$work/rootfs.tar" .
  find "$cache" -maxdepth 1 -name '*.tar' ! -name "$key.tar" -delete
  mv "$work/rootfs.tar" "$tarball"
  log "rootfs tarball $tarball ($(du -h "$tarball" | cut -f1)) in $((SECONDS - start))s"
else
  log "using cached rootfs $tarball"
fi

import_start=$SECONDS
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --change "LABEL org.gpuprov.molecule-key=$key" \
  --message "gpuprov molecule image $key" \
  "$tarball" "$image" >/dev/null
docker tag "$image" "$NAME:latest"
log "imported $image in $((SECONDS - import_start))s (tagged $NAME:latest)"
# Older keys of this image are dead weight in the engine.
docker image ls --format '{{.Repository}}:{{.Tag}}' "$NAME" |
  grep -v -e ":latest\$" -e ":$key\$" | xargs -r docker image rm >/dev/null 2>&1 || true
echo "$image"
