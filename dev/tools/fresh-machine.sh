#!/usr/bin/env bash
# Run one of the README's commands as on a fresh Debian 12 machine, and time it:
#
#   dev/tools/fresh-machine.sh                     # scripts/main.sh
#   dev/tools/fresh-machine.sh 'scripts/main.sh --check'   # any command line, run in the copy
#
# (scripts/test.sh, not tried here, would also have to start a Docker engine inside the container.)
#
# The "machine" is a new container of gpuprov-molecule-debian12 (scripts/molecule-image.sh: a
# debootstrap minbase of Debian 12 with python3, less than a fresh install has), holding a copy of
# this checkout's HEAD (git clone: what CI gets, nothing untracked) and nothing else: no apt
# packages beyond minbase, no uv or pip cache, no ~/.cache/gpuprov. So every install and every
# image the command needs is made in the run, from the package registries (issue #27's "main.sh
# on a fresh machine"). Each line of its output is stamped with the seconds since the start, and the
# last line gives its exit status and wall time; the container is removed at the end.
#
# The container gets every capability the engine may give (debootstrap mounts, QEMU), less
# CAP_SYS_RESOURCE where this machine's own bounding set lacks it (a sandbox), and this machine's
# CA bundle, so that a TLS-intercepting egress proxy (as on the development machines) is trusted
# there as here. Needs root and a Docker engine (scripts/dockerd.sh starts one).
set -euo pipefail
cd "$(dirname "$0")/../.."

image=gpuprov-molecule-debian12
scripts/dockerd.sh
scripts/molecule-image.sh debian12 >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git clone -q . "$work/src"

caps=(--cap-add ALL)
# Bit 24 of CapBnd is CAP_SYS_RESOURCE: a container asking for a capability this machine lacks fails.
if ! (($(printf '%d' "0x$(awk '/^CapBnd:/ {print $2}' /proc/self/status)") & (1 << 24))); then
  caps+=(--cap-drop SYS_RESOURCE)
fi
tls=()
if [[ -r /etc/ssl/certs/ca-certificates.crt ]]; then
  tls=(-v /etc/ssl/certs/ca-certificates.crt:/etc/host-ca.crt:ro
    -e SSL_CERT_FILE=/etc/host-ca.crt -e PIP_CERT=/etc/host-ca.crt -e REQUESTS_CA_BUNDLE=/etc/host-ca.crt)
fi

command=${*:-scripts/main.sh}
docker run --rm "${caps[@]}" --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  "${tls[@]}" -v "$work/src:/src:ro" "$image" \
  bash -c 'cp -a /src /root/gpuprov && cd /root/gpuprov && start=$SECONDS
    bash -c "$1" </dev/null 2>&1 | while IFS= read -r line; do printf "%5d %s\n" $((SECONDS - start)) "$line"; done
    rc=${PIPESTATUS[0]}
    echo "fresh-machine: $1 exited $rc after $((SECONDS - start)) s"
    exit "$rc"' fresh "$command"
