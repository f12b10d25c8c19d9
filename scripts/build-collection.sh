#!/usr/bin/env bash
# Build the Ansible collection gpuprov.kvm: assemble build/collections/ansible_collections/gpuprov/kvm
# from this checkout (dev/tools/build_collection.py) and make its tarball with `ansible-galaxy collection
# build`; prints the tarball's path (build/gpuprov-kvm-VERSION.tar.gz). Install it where you like:
#   ansible-galaxy collection install "$(scripts/build-collection.sh)" -p ~/.ansible/collections
# Arguments go to dev/tools/build_collection.py (e.g. --output DIR).
#
# It needs Python 3.9+ and ansible-core, nothing else (no gpuprov install, no apt package): the
# ansible-galaxy of the checkout's .venv when it has one, else the one on PATH, else a virtualenv
# of ansible-core alone (pyproject's pin, about 70 MB, made once in ~10 s) under
# ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/ansible-core-2.19-2.20 (the pin's versions).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -x .venv/bin/ansible-galaxy ]]; then
  python=.venv/bin/python
elif command -v ansible-galaxy >/dev/null 2>&1; then
  python=python3
else
  # The ansible-core of pyproject's ansible extra (the release the collection is tested with).
  # "ansible-core>=2.19,<2.20" -> its venv ansible-core-2.19-2.20
  # (A regex, not tomllib: the Python 3.9 and 3.10 of RHEL 9 and Ubuntu 22.04 have no tomllib.)
  read -r spec key < <(python3 -c 'import re
text = open("pyproject.toml", encoding="utf-8").read()
spec = re.search(r"\"(ansible-core[^\"]*)\"", text).group(1)
print(spec, "-".join(re.findall(r"[0-9][0-9.]*", spec)))')
  venv=${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/ansible-core-$key
  if [[ ! -x $venv/bin/ansible-galaxy ]]; then
    python3 -m venv --clear "$venv" >&2 || {
      echo "build-collection: python3 cannot make a virtualenv: install python3-venv (apt-get install python3-venv)" >&2
      exit 2
    }
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$spec" >&2
  fi
  python=$venv/bin/python
fi
exec "$python" dev/tools/build_collection.py --tarball "$@"
