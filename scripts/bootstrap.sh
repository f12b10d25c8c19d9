#!/usr/bin/env bash
# Install what gpuprov needs on a Debian/Ubuntu machine, idempotently:
# Debian packages (only those missing), then a virtualenv at .venv with
# gpuprov and the extras named in $1 (e.g. "test"). Safe to run again.
#
# Environment: PYTHON (the interpreter the venv is made from, default python3 on
# PATH), VENV (where, default .venv). scripts/test.sh also makes
# PYTHON=/usr/bin/python3 VENV=.venv-system: Debian's own python3, the README's
# platform, when PATH's python3 is another build (e.g. pyenv's). GPUPROV_CACHE (uv's
# venv, below); GPUPROV_NO_UV=1 installs with pip only.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3 python3-venv python3-pip pciutils pci.ids)
# The test extra: libvirt-python builds against libvirt-dev (no wheel on PyPI);
# virt-xml-validate (libvirt-clients + xmllint) checks the domain XML; the module
# tests make overlays and seed ISOs; the real libvirt test runs libvirtd, QEMU
# (TCG), OVMF and dnsmasq on an isolated network in a network namespace of its
# own (iproute2), and builds its guest image with debootstrap (scripts/guest-image.sh);
# the guest_container_toolkit scenario makes a test key with gpg and fetches
# Debian packages for its offline directory (debian-archive-keyring); the vgpu module
# test checks its mdevctl definitions with the real mdevctl; the topology test draws the
# SVG/HTML picture in headless chromium and looks at the screenshot; the fleet bench's test checks
# its SSH members' sshd config with sshd -t (openssh-server).
if [[ ,${1:-}, == *,test,* || ,${1:-}, == *,dev,* ]]; then
  APT_PACKAGES+=(gcc pkg-config python3-dev libvirt-dev libvirt-clients libxml2-utils qemu-utils genisoimage
    libvirt-daemon-system qemu-system-x86 ovmf dnsmasq-base iptables iproute2 debootstrap openssh-client gpg debian-archive-keyring
    mdevctl chromium openssh-server)
fi
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "bootstrap: missing Debian packages: ${missing[*]}; run as root or: sudo apt-get install ${missing[*]}" >&2
    exit 2
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
command -v "$PY" >/dev/null 2>&1 || {
  echo "bootstrap: no Python interpreter $PY here" >&2
  exit 2
}
# A venv made from another interpreter (PYTHON changed, pyenv upgraded) is made again. The right
# side quoted: unquoted, [[ ]] reads it as a pattern, and sys.version's "[GCC 12.2.0]" is a bracket
# expression that never matches itself, so every venv was made again on every run (60-90 s each).
# A venv moved or copied from elsewhere (its scripts' #! lines name the old place) too.
base='import sys; print(sys.base_prefix, sys.version)'
made_here() {
  [[ -x $VENV/bin/python && -f $VENV/bin/pip ]] || return 1
  [[ $(head -n 1 "$VENV/bin/pip") == "#!$(cd "$VENV" && pwd -P)/bin/python"* ]] || return 1
  [[ $("$VENV/bin/python" -c "$base" 2>/dev/null) == "$("$PY" -c "$base")" ]]
}
if ! made_here; then
  "$PY" -m venv --clear "$VENV"
fi
extras=${1:-}
spec="."
[[ -n $extras ]] && spec=".[${extras}]"
# The packages go in with uv when it can be had (the same requirements and resolution rules as pip,
# its downloads and unpacking in parallel: a fresh test venv 96 s with pip, 19 s with uv, cache
# empty; docs/development/timings.md), pip otherwise. uv is pinned, in a venv of its own under the
# cache dir, installed there once by pip. uv reads no pip.conf: where pip's own index settings
# are needed (a mirror, a proxy uv cannot use) and uv fails, pip installs as before.
# No bytecode compiled at install (neither compiles by default with these flags): pip compiles every
# file of every package (ansible-core's thousands: 263 of a test venv's 651 MB), and Python compiles
# what is imported, when it is first imported (74 s with, 33 s without, pip).
UV_VERSION=0.13.9
uv_tool=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/uv-$UV_VERSION
uv() {
  if [[ ! -x $uv_tool/bin/uv ]]; then
    rm -rf "$uv_tool"
    "$PY" -m venv "$uv_tool" && "$uv_tool/bin/python" -m pip install -q --disable-pip-version-check \
      --no-compile "uv==$UV_VERSION" || {
      rm -rf "$uv_tool"
      return 1
    }
  fi
  "$uv_tool/bin/uv" "$@"
}
if [[ ${GPUPROV_NO_UV:-} != 1 ]] && uv pip install -q --python "$VENV/bin/python" -e "$spec"; then
  exit 0
fi
[[ ${GPUPROV_NO_UV:-} == 1 ]] || echo "bootstrap: uv could not install $spec; pip does" >&2
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile -e "$spec"
