#!/usr/bin/env bash
# Every test: installs what the tests need, then lint and the whole test suite:
#   ruff (check + format); the Docker engine and the local test image
#   (scripts/dockerd.sh, scripts/molecule-image.sh, cached under
#   ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}), started before pytest so that no test
#   skips for want of them; pytest in .venv (python3 on PATH); the unit tests
#   again (all but the `slow` ones) under Debian 12's own /usr/bin/python3, in
#   .venv-system; yamllint, ansible-lint (production profile), and the molecule
#   scenarios under molecule/ (docker driver).
# With CI=true a skipped test fails pytest unless tests/skip_policy.py allows its reason.
# Every step runs even when an earlier one failed; a summary closes the run and
# the exit status is non-zero when any step failed.
#
# Arguments go to both pytest runs. GPUPROV_SKIP_MOLECULE=1 skips the molecule scenarios
# (a developer's fast run; said loudly, and refused in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test,molecule
export PATH="$PWD/.venv/bin:$PATH"
# Logs without colour codes when they go to a file or CI.
if [[ ! -t 1 ]]; then
  export NO_COLOR=1 ANSIBLE_NOCOLOR=1 PY_COLORS=0
fi

results=()
molecule_rows=()
failed=0
# step NAME CMD...: run, time, record; never stops the run.
step() {
  local name=$1 start=$SECONDS rc=0
  shift
  echo "=== test.sh: $name: $*"
  "$@" || rc=$?
  results+=("$(printf '%-32s %-6s %4ss' "$name" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" $((SECONDS - start)))")
  [[ $rc -eq 0 ]] || failed=1
  return 0
}

# run_pytest PYTHON ARGS...: pytest exits 5 when it collected nothing: that is a
# failure here, not a pass.
run_pytest() {
  local python=$1 rc=0
  shift
  "$python" -m pytest "$@" || rc=$?
  if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests" >&2
    return 1
  fi
  return $rc
}

# The Docker engine and a local image for the real-engine test in pytest (molecule
# uses them too): scripts/dockerd.sh fails loudly when no engine can be had.
docker_engine() {
  scripts/dockerd.sh && scripts/molecule-image.sh >/dev/null
}

python_version() {
  "$1" -c 'import platform; print(platform.python_version())'
}
if [[ $(python_version python) != 3.11.* ]]; then
  echo "test.sh: NOTE: python3 here is $(python_version python); CI runs 3.11 (pyproject's requires-python)" >&2
fi

run_molecule() {
  scripts/dockerd.sh || return 1
  scripts/molecule-image.sh >/dev/null || return 1
  local scenario rc=0 start
  for scenario in molecule/*/molecule.yml; do
    scenario=$(basename "$(dirname "$scenario")")
    # molecule/lab boots the emulated lab host (QEMU TCG; python -m dev.lab): 8-10 min
    # with its image cached, a minute more when the image is (re)built, as root.
    start=$SECONDS
    if molecule test --no-command-borders -s "$scenario"; then
      molecule_rows+=("$(printf '  molecule %-23s %-6s %4ss' "$scenario" ok $((SECONDS - start)))")
    else
      molecule_rows+=("$(printf '  molecule %-23s %-6s %4ss' "$scenario" FAIL $((SECONDS - start)))")
      rc=1
    fi
  done
  return $rc
}

# The collection gpuprov.kvm as a user gets it: its tarball (scripts/build-collection.sh),
# installed into an empty collections path from outside the checkout; then ansible-test
# sanity on that installed copy (scripts/collection-sanity.sh; its venvs are cached).
# tests/ansible/test_collection.py plays the installed modules and roles from outside the repo.
collection_dir=
collection_build() {
  local tarball tmp
  tarball=$(scripts/build-collection.sh --quiet) || return 1
  tmp=$(mktemp -d)
  collection_dir=$tmp/ansible_collections/gpuprov/kvm
  (cd "$tmp" && env -u ANSIBLE_CONFIG ANSIBLE_COLLECTIONS_PATH="$tmp" \
    ansible-galaxy collection install "$tarball" -p "$tmp") || return 1
  ls "$collection_dir/MANIFEST.json"
}
collection_sanity() {
  [[ -n $collection_dir ]] || { echo "test.sh: no installed collection (collection build failed)" >&2; return 1; }
  local rc=0
  scripts/collection-sanity.sh "$collection_dir" || rc=$?
  rm -rf "${collection_dir%/ansible_collections/*}"
  return $rc
}

total=$SECONDS
step "ruff check" ruff check .
step "ruff format" ruff format --check .
step "collection build" collection_build
step "ansible-test sanity" collection_sanity
step "docker engine + image" docker_engine
step "pytest (python3 $(python_version python))" run_pytest python "$@"
# Again under Debian 12's own python3, the README's platform (PATH's python3 may be
# another build: pyenv's on the CI machine), all but the `slow` tests (real libvirt and
# Docker: services, not the interpreter, are what they test). Its venv has the test
# and ansible extras: the in-process module tests (tests/modrun.py) import ansible-core
# under this Python; the module tests through `ansible` drive .venv's (on PATH) with a
# target interpreter made from this Python.
system_python=/usr/bin/python3
if [[ -x $system_python ]]; then
  step "venv ($system_python)" env PYTHON=$system_python VENV=.venv-system scripts/bootstrap.sh test,ansible
  step "pytest ($system_python $(python_version $system_python))" \
    run_pytest .venv-system/bin/python -m "not slow" "$@"
elif [[ ${CI:-} == true ]]; then
  echo "test.sh: no $system_python (Debian's own python3): CI must run the unit tests under it" >&2
  results+=("$(printf '%-32s %-6s' "pytest ($system_python)" FAIL) (no $system_python)")
  failed=1
else
  cat >&2 <<EOF
######################################################################
##  test.sh: NO $system_python HERE: the unit tests did NOT run    ##
##  under Debian 12's own python3 (the README's platform). CI does. ##
######################################################################
EOF
  results+=("$(printf '%-32s %-6s' "pytest ($system_python)" SKIPPED) (no $system_python)")
fi
step "yamllint" yamllint --strict .
step "ansible-lint" ansible-lint
if [[ ${GPUPROV_SKIP_MOLECULE:-} == 1 ]]; then
  if [[ ${CI:-} == true ]]; then
    echo "test.sh: GPUPROV_SKIP_MOLECULE=1 is not allowed in CI: the molecule scenarios must run" >&2
    results+=("$(printf '%-32s %-6s' molecule FAIL) (GPUPROV_SKIP_MOLECULE=1 in CI)")
    failed=1
  else
    cat >&2 <<'EOF'
######################################################################
##  test.sh: MOLECULE SKIPPED (GPUPROV_SKIP_MOLECULE=1).            ##
##  The roles were NOT tested; CI runs them. Unset it to run them.  ##
######################################################################
EOF
    results+=("$(printf '%-32s %-6s' molecule SKIPPED) (GPUPROV_SKIP_MOLECULE=1)")
  fi
else
  step "molecule" run_molecule
fi

echo
echo "=== test.sh summary ($((SECONDS - total))s)"
printf '%s\n' "${results[@]}" ${molecule_rows[@]+"${molecule_rows[@]}"}
if ((failed)); then
  echo "test.sh: FAILED" >&2
  exit 1
fi
echo "test.sh: all passed"
