#!/usr/bin/env bash
# Make a Docker engine answer on this machine, idempotently:
#   - installs Debian's docker.io when dockerd is missing (root only);
#   - starts dockerd in the background when `docker info` fails, logging to
#     ${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/dockerd.log, and waits until it answers.
# Exits non-zero with a clear message when no engine can be had: the molecule
# tests need one, and skipping them silently is not an option.
#
# Environment: GPUPROV_DOCKERD_TIMEOUT (seconds to wait for the engine, default 60).
set -euo pipefail

cache=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}
timeout=${GPUPROV_DOCKERD_TIMEOUT:-60}

die() {
  echo "dockerd.sh: $*" >&2
  exit 1
}

if docker info >/dev/null 2>&1; then
  exit 0
fi

if ! command -v dockerd >/dev/null 2>&1; then
  [[ $(id -u) -eq 0 ]] || die "no dockerd here; run as root or: sudo apt-get install docker.io"
  echo "dockerd.sh: installing docker.io" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # iptables, containerd, runc and tini come as Depends of docker.io.
  apt-get install -y -q --no-install-recommends docker.io
fi

# The client may be another build (e.g. /usr/local/bin/docker); it negotiates
# the API version with Debian's engine, so either works.
command -v docker >/dev/null 2>&1 || die "dockerd is installed but no docker client is on PATH"

if ! docker info >/dev/null 2>&1; then
  [[ $(id -u) -eq 0 ]] || die "the Docker engine is not running and starting it needs root"
  mkdir -p "$cache"
  log="$cache/dockerd.log"
  if pgrep -x dockerd >/dev/null 2>&1; then
    echo "dockerd.sh: dockerd is running but does not answer yet; waiting" >&2
  else
    # A stale pid file from a killed engine stops a new one from starting.
    if [[ -f /var/run/docker.pid ]] && ! kill -0 "$(cat /var/run/docker.pid)" 2>/dev/null; then
      rm -f /var/run/docker.pid
    fi
    echo "dockerd.sh: starting dockerd (log: $log)" >&2
    # setsid + nohup: the engine outlives this script and ignores the test run's
    # terminal; no stdin (CI has none).
    setsid nohup dockerd >"$log" 2>&1 </dev/null &
  fi
  deadline=$((SECONDS + timeout))
  until docker info >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "dockerd.sh: the Docker engine did not answer within ${timeout}s; last lines of $log:" >&2
      tail -n 30 "$log" >&2 2>/dev/null || true
      exit 1
    fi
    sleep 1
  done
fi

echo "dockerd.sh: Docker engine $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '?')" \
  "storage $(docker info --format '{{.Driver}}' 2>/dev/null || echo '?')" >&2
