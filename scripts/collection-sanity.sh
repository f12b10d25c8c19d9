#!/usr/bin/env bash
# ansible-test sanity on the collection gpuprov.kvm, on Python 3.11 (Debian 12's).
#   scripts/collection-sanity.sh [DIR] [ansible-test sanity options...]
# DIR is an installed collection (.../ansible_collections/gpuprov/kvm); without it the
# collection is built (dev/tools/build_collection.py --tarball) and installed from its
# tarball into an empty temporary collections path first, as a user would get it.
#
# ansible-test keeps one virtualenv per sanity test (pylint, yamllint,
# validate-modules... at the versions it pins) under ~/.ansible/test: HOME points
# at ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/ansible-test for this run, so they are
# made once and reused. Each new venv gets pip from a bootstrap script that
# ansible-test downloads from ci-files.testing.ansible.com; a stand-in in its cache
# runs that pip version from its wheel instead (fetched once with `pip download`
# from the package index), so only the package index must be reachable.
#
# GPUPROV_ANSIBLE_CORE=X.Y runs the ansible-test of that ansible-core release instead of .venv's:
# from a virtualenv of it alone, ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/ansible-core-X.Y (the one
# tests/ansible/test_collection.py makes for the oldest release requires_ansible admits; made
# here when missing). E.g. GPUPROV_ANSIBLE_CORE=2.18: 3-4 minutes, as long as the CI step on 2.19
# (its own sanity venvs are made the first time); not a CI step: scripts/test.sh runs .venv's.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] && export PATH="$PWD/.venv/bin:$PATH"
if [[ -n ${GPUPROV_ANSIBLE_CORE:-} ]]; then
  release=$GPUPROV_ANSIBLE_CORE
  [[ $release =~ ^([0-9]+)\.([0-9]+)$ ]] || {
    echo "collection-sanity: GPUPROV_ANSIBLE_CORE=$release: want X.Y (e.g. 2.18)" >&2
    exit 2
  }
  venv=${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/ansible-core-$release
  if [[ ! -f $venv/.gpuprov-complete ]]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      "ansible-core>=$release,<${BASH_REMATCH[1]}.$((BASH_REMATCH[2] + 1))"
    echo "$release" >"$venv/.gpuprov-complete"
  fi
  export PATH="$venv/bin:$PATH"
fi
python=$(command -v python)

tmp=
trap '[[ -n $tmp ]] && rm -rf "$tmp"' EXIT
if [[ $# -gt 0 && $1 != -* ]]; then
  dir=$(cd "$1" && pwd)
  shift
else
  tmp=$(mktemp -d)
  tarball=$("$python" dev/tools/build_collection.py --tarball --quiet)
  # From an empty directory: the checkout's ansible.cfg (collections_path) must not count.
  (cd "$tmp" && env -u ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH="$tmp/collections" \
    ansible-galaxy collection install "$tarball" -p "$tmp/collections" >/dev/null)
  dir=$tmp/collections/ansible_collections/gpuprov/kvm
fi
[[ -f $dir/MANIFEST.json || -f $dir/galaxy.yml ]] || {
  echo "collection-sanity: $dir is not a collection (no MANIFEST.json or galaxy.yml)" >&2
  exit 2
}

home=${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/ansible-test
pip_version=$("$python" -c 'import types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version="3.11"))["pip"])')
bootstrap=$home/.ansible/test/cache/get_pip_${pip_version//./_}.py
if [[ ! -f $bootstrap ]]; then
  mkdir -p "$home/wheels" "$(dirname "$bootstrap")"
  "$python" -m pip download -q --no-deps -d "$home/wheels" "pip==$pip_version"
  wheel=$(ls "$home/wheels/pip-$pip_version-"*.whl)
  cat >"$bootstrap.tmp" <<EOF
# Stand-in for get-pip.py (written by scripts/collection-sanity.sh): pip $pip_version run
# from its wheel installs what ansible-test asks for into the new venv.
import sys

sys.path.insert(0, "$wheel")
from pip._internal.cli.main import main

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--upgrade", "--force-reinstall", *args]))
EOF
  mv "$bootstrap.tmp" "$bootstrap"
fi

cd "$dir"
HOME=$home ansible-test sanity --python 3.11 --color no "$@"
