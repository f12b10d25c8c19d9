#!/usr/bin/env bash
# The main job: install gpuprov and inspect this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/gpuprov inspect "$@"
