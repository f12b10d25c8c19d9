#!/usr/bin/env bash
# Build the Ansible collection gpuprov.kvm: assemble build/collections/ansible_collections/gpuprov/kvm
# from this checkout (dev/tools/build_collection.py) and make its tarball with `ansible-galaxy collection
# build`; prints the tarball's path (build/gpuprov-kvm-VERSION.tar.gz). Install it where you like:
#   ansible-galaxy collection install "$(scripts/build-collection.sh)" -p ~/.ansible/collections
# Arguments go to dev/tools/build_collection.py (e.g. --output DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || scripts/bootstrap.sh ansible >&2
export PATH="$PWD/.venv/bin:$PATH"
exec python dev/tools/build_collection.py --tarball "$@"
