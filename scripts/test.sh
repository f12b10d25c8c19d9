#!/usr/bin/env bash
# Every test: installs what the tests need, then lint and the whole test suite:
#   ruff (check + format); the collection built and ansible-test sanity on it; the Docker
#   engine and the local test images (scripts/dockerd.sh, scripts/molecule-image.sh, cached
#   under ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}), started before pytest so that no test
#   skips for want of them; yamllint, ansible-lint (production profile); pytest in .venv
#   (python3 on PATH) on two workers (pytest-xdist, a file's tests on one); the unit tests that
#   can differ between interpreters again under Debian 12's own /usr/bin/python3, in
#   .venv-system, and the modules played on a target interpreter there only (tests/conftest.py
#   says which and why); the CLI's and the package's under Debian 11's python3.9
#   (scripts/py39.sh), each pass with its temporary files on a tmpfs (scratch_tmp, below); and
#   the molecule scenarios under molecule/.
#
# Two lanes share the machine (CI's 2 cores; docs/development/timings.md has the figures):
#   - the lab lane: the scenarios on the emulated lab host (molecule/lab, molecule/lab_boot:
#     QEMU TCG, python -m dev.lab), the longest chain, much of it boots and watchdog waits.
#     It starts as soon as the Debian packages and the Docker engine are in, in the
#     background; its output goes to a log, printed when the rest is done, and its milestones
#     close the run;
#   - everything else, beside it, at nice 10: it takes the CPU the emulated host leaves, so
#     the lab lane's Ansible and tests are not slowed by it. Nice ranks this session's
#     processes only: the lab host's QEMU daemonizes into a session of its own, and the kernel's
#     autogroups share the CPUs between sessions whatever their nice values, so QEMU gets about
#     half the machine beside this lane. Given more (its group's nice lowered, tried 2026-11-27)
#     it burnt more CPU, not less time, and this lane starved; held to one core (its vCPUs on one
#     TCG thread, tried the same day) this lane sped up and the lab's nested guests slowed down
#     past their console timeouts (docs/development/timings.md).
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
# children_cpu: sets cpu_seconds to the CPU seconds (user + system) of this shell's ended
# children so far (bash's `times`, second line; run in this shell, not in a $(...)), to the second.
# Where a step's time went on a full machine: its wall time says how long it waited, this how much
# it worked (the lab host's QEMU, a daemon, is in neither).
cpu_seconds=0
children_cpu() {
  times >"$logs/times"
  cpu_seconds=$(tail -n 1 "$logs/times" | tr 'ms' '  ' | awk '{printf "%d\n", $1 * 60 + $2 + $3 * 60 + $4}')
}

# step NAME CMD...: run, time, record; never stops the run.
step() {
  local name=$1 start=$SECONDS rc=0 cpu
  shift
  children_cpu
  cpu=$cpu_seconds
  echo "=== test.sh: $name: $*"
  "$@" || rc=$?
  children_cpu
  results+=("$(printf '%-32s %-6s %4ss  CPU %4ss' "$name" "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    $((SECONDS - start)) $((cpu_seconds - cpu)))")
  [[ $rc -eq 0 ]] || failed=1
  return 0
}

# with_failures LABEL CMD...: runs CMD (a pytest run), its output also kept, and its FAILED and
# ERROR lines (pytest's short summary) added to failed-tests under LABEL, for the end of the run:
# CI shows a run's tail, where the summary is.
with_failures() {
  local label=$1 rc=0 out
  shift
  out=$(mktemp -p "$logs" pytest.XXXXXX)
  "$@" 2>&1 | tee "$out" || rc=${PIPESTATUS[0]}
  # pytest's `FAILED tests/x.py::test - ...`, `ERROR tests/x.py - ...`; not Ansible's `FAILED - RETRYING`.
  grep -aE '^(FAILED|ERROR) [^ ]*(::|\.py)' "$out" | sed "s#^#  ($label) #" >>"$logs/failed-tests" || true
  return $rc
}

# run_pytest PYTHON ARGS...: pytest exits 5 when it collected nothing: that is a
# failure here, not a pass.
run_pytest() {
  local python=$1 rc=0
  shift
  with_failures "python $(python_version "$python")" "$python" -m pytest "$@" || rc=$?
  if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests" >&2
    return 1
  fi
  return $rc
}

# The Docker engine (scripts/dockerd.sh fails loudly when no engine can be had) and the local
# images for the real-engine test in pytest and the molecule scenarios. The engine comes before
# the lab lane starts (installing docker.io takes apt's lock, which the lab's tools may need)
# and at nice 10, which its containers inherit.
docker_images() {
  scripts/molecule-image.sh >/dev/null
}

python_version() {
  "$1" -c 'import platform; print(platform.python_version())'
}
if [[ $(python_version python) != 3.11.* ]]; then
  echo "test.sh: NOTE: python3 here is $(python_version python); CI runs 3.11 (pyproject's requires-python)" >&2
fi

# The scenarios on the emulated lab host (default driver, python -m dev.lab): the lab lane's.
# The others run in Docker containers, in the foreground (run_molecule_docker, below).
LAB_SCENARIOS=(lab lab_boot)

# molecule_test SCENARIO ROWS: one scenario; its summary row is appended to the file ROWS.
molecule_test() {
  local scenario=$1 rows=$2 start=$SECONDS status=ok
  echo "=== test.sh: molecule test -s $scenario"
  with_failures "molecule $scenario" molecule test --no-command-borders -s "$scenario" </dev/null || status=FAIL
  printf '  molecule %-23s %-6s %4ss\n' "$scenario" $status $((SECONDS - start)) >>"$rows"
  [[ $status == ok ]]
}

# with_status FILE CMD...: CMD, then its exit status written to FILE. For what runs in the background:
# its status is read from FILE (status_of, below), never from `wait PID`. Bash forgets a reaped
# child's status once a later child of the same shell is given its PID, and then `wait PID` fails
# ("not a child of this shell", 127): pid_max is 32,768 on the CI machine and a run starts far
# more processes than that (a local CI run, 2026-11-29: every scenario passed and the step failed).
with_status() {
  local file=$1 rc=0
  shift
  "$@" || rc=$?
  echo $rc >"$file"
  return $rc
}
# status_of FILE: the status with_status wrote there; 1 when it wrote none (stopped before its end).
status_of() {
  local rc
  rc=$(cat "$1" 2>/dev/null) && [[ $rc =~ ^[0-9]+$ ]] && return "$rc"
  return 1
}

# The Docker scenarios share nothing but the image and the built collection (built under a lock,
# unchanged during a run) and name their containers apart, so two run at once once the lab lane has
# ended: they are this lane's tail, and after the lab lane a core is otherwise idle (CI, stop 38:
# the lab lane ended 16 minutes before this one). While the lab lane runs, one at a time: a second
# scenario's containers (an autogroup each) would take the lab host's QEMU's share. Each writes its
# own log, printed in scenario order when all are done. A subshell: its jobs are these only.
run_molecule_docker() (
  local scenario rc=0 slots
  local -a order=()
  for scenario in molecule/*/molecule.yml; do
    scenario=$(basename "$(dirname "$scenario")")
    [[ " ${LAB_SCENARIOS[*]} " == *" $scenario "* ]] || order+=("$scenario")
  done
  for scenario in "${order[@]}"; do
    while :; do
      slots=2
      # Ended: lab_lane wrote lab.seconds as it ended, or its process is gone (stopped before that).
      [[ -n $lab_pid && ! -e $logs/lab.seconds ]] && kill -0 "$lab_pid" 2>/dev/null && slots=1
      (($(jobs -rp | wc -l) < slots)) && break
      sleep 2
    done
    echo "=== test.sh: molecule test -s $scenario (its log is printed below once all are done)"
    with_status "$logs/molecule-$scenario.status" molecule_test "$scenario" "$logs/docker.rows" \
      >"$logs/molecule-$scenario.log" 2>&1 &
  done
  wait
  for scenario in "${order[@]}"; do
    cat "$logs/molecule-$scenario.log"
    status_of "$logs/molecule-$scenario.status" || rc=1
  done
  return $rc
)

# The lab lane (above). molecule/lab boots the GRUB image (built when its inputs changed);
# molecule/lab_boot boots the systemd-boot image, which is built at nice 10
# while molecule/lab runs (its `up --loader systemd-boot` finds it cached, or waits for the
# build: dev/lab's build lock). Its output is stamped as it comes (stamp, below).
lab_lane() {
  local rc=0 start=$SECONDS
  # Each verifier test named as it ends (the stamps time it: the whole log) and the slowest
  # listed (the milestones).
  export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -v --durations=10"
  echo "=== test.sh (lab lane): python -m dev.lab image"
  python -m dev.lab image || rc=1
  with_status "$logs/lab-image-systemd-boot.status" nice -n 10 python -m dev.lab image --loader systemd-boot \
    >"$logs/lab-image-systemd-boot.log" 2>&1 &
  molecule_test lab "$logs/lab.rows" || rc=1
  echo "=== test.sh (lab lane): python -m dev.lab image --loader systemd-boot (built beside molecule/lab)"
  wait # that build, the one job of this shell
  status_of "$logs/lab-image-systemd-boot.status" ||
    echo "test.sh (lab lane): that build failed; molecule/lab_boot builds it again" >&2
  cat "$logs/lab-image-systemd-boot.log"
  molecule_test lab_boot "$logs/lab.rows" || rc=1
  echo $((SECONDS - start)) >"$logs/lab.seconds"
  return $rc
}

# stamp: each line of standard input prefixed with the seconds since test.sh began and the
# load average then (builtins only: no process per line).
stamp() {
  local line load _
  while IFS= read -r line; do
    read -r load _ </proc/loadavg
    printf '%5ds load %5s  %s\n' $((SECONDS - total)) "$load" "$line"
  done
}

# The lab lane's milestones from its stamped log, for the end of the run (what CI shows of a
# run is its tail): where its time went, how loaded the machine was, and the CPU the lab host's QEMUs
# used (`python -m dev.lab down` says, at each scenario's destroy).
lab_milestones() {
  echo "=== test.sh: the lab lane's milestones (seconds since the start, load average)"
  grep -aE '=== test.sh|\] Executing$|Executed: Failed|::test_.* (FAILED|ERROR)|boot-trial timing:|QEMU run\(s\) since up|[0-9.]+s (call|setup|teardown) ' \
    "$logs/lab.log" | sed -E 's#(molecule/[a-z_]+/)?tests/[a-z_]+\.py::##; s#ansible://lab-gpu-host-?##' | cut -c1-160 || true
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

# machine_busy: the CPU seconds the whole machine has spent busy since it booted (/proc/stat's cpu
# line: user, nice, system, irq, softirq, steal), every process counted: the lab host's QEMUs, the
# Docker containers and the libvirt test's guest are none of this script's children. Against the
# run's wall time it says whether the run waited on the CPU (2 cores: 2 CPU-s a second at most).
machine_busy() {
  local _ user nice system irq softirq steal
  read -r _ user nice system _ _ irq softirq steal _ </proc/stat
  echo $(((user + nice + system + irq + softirq + steal) / $(getconf CLK_TCK)))
}
busy_start=$(machine_busy)
total=$SECONDS
logs=$(mktemp -d -t gpuprov-test.XXXXXX)
molecule=yes
if [[ ${GPUPROV_SKIP_MOLECULE:-} == 1 ]]; then
  molecule=no
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
fi

step "ruff check" ruff check .
step "ruff format" ruff format --check .
step "collection build" collection_build
step "docker engine" nice -n 10 scripts/dockerd.sh

# The lab lane, in a process group of its own: stopped with all it started if this script stops.
lab_pid=
stop_lab_lane() {
  if [[ -n $lab_pid ]]; then
    kill -- -"$lab_pid" 2>/dev/null || true
    python -m dev.lab down --force >/dev/null 2>&1 || true
  fi
}
# The lab lane stopped (if it runs) and the pytest passes' tmpfs scratch (below) removed, however this ends.
scratch=
on_exit() {
  stop_lab_lane
  [[ -z $scratch ]] || rm -rf "$scratch"
}
trap on_exit EXIT
if [[ $molecule == yes ]]; then
  set -m
  # A subshell, so that $! is the process group; it writes lab_lane's status (not stamp's) to
  # lab.status (with_status: not wait's).
  (
    set +m
    rc=0
    lab_lane </dev/null 2>&1 | stamp >"$logs/lab.log" || rc=${PIPESTATUS[0]}
    echo "$rc" >"$logs/lab.status"
    exit "$rc"
  ) &
  lab_pid=$!
  set +m
  echo "=== test.sh: the lab lane (molecule ${LAB_SCENARIOS[*]}) runs in the background: $logs/lab.log"
  renice -n 10 -p $$ >/dev/null # this shell and all it starts from here on
fi

step "ansible-test sanity" collection_sanity
step "docker images" docker_images
# The linters (one process each) before the pytest passes: what runs after the lab lane has ended
# should be what uses both cores (pytest's two workers, the Docker scenarios two at once).
step "yamllint" yamllint --strict .
step "ansible-lint" ansible-lint
# The pytest passes' temporary files (TMPDIR) on a tmpfs: the tests unpack captures and build fake
# sysfs trees, thousands of files each. A directory and a file made take about 0.8 ms on this kind
# of machine's ext4 root and 22 us on tmpfs; cli/test_capture_mutations.py alone took 206 s and 42 s
# (docs/development/timings.md). The 3.9 pass's chroot has had a tmpfs /tmp all along (py39.sh).
# /dev/shm is Debian's tmpfs; where it is not one, or small, or noexec (tests run scripts they
# write), TMPDIR stays as it was. Removed when the run ends.
scratch_tmp() {
  local dir
  [[ $(stat -f -c %T /dev/shm 2>/dev/null) == tmpfs ]] || return 1
  (($(df --output=avail -k /dev/shm | tail -n 1) > 4 * 1024 * 1024)) || return 1
  dir=$(mktemp -d /dev/shm/gpuprov-tmp.XXXXXX) || return 1
  # Open like /tmp (mktemp makes it root's alone): the real-libvirt test runs its daemon as nobody
  # in a folder under it (tests/ansible/test_domain_multigpu_libvirt.py).
  chmod 1777 "$dir" || return 1
  printf '#!/bin/sh\n' >"$dir/x" && chmod +x "$dir/x" && "$dir/x" && rm "$dir/x" && scratch=$dir && return 0
  rm -rf "$dir"
  return 1
}
if scratch_tmp; then
  echo "=== test.sh: the pytest passes' TMPDIR: $scratch (tmpfs)"
else
  echo "test.sh: NOTE: no usable tmpfs at /dev/shm: the pytest passes' temporary files stay in ${TMPDIR:-/tmp}" >&2
fi
# in_scratch CMD...: CMD with TMPDIR on the tmpfs (as it was where there is none).
in_scratch() {
  if [[ -n $scratch ]]; then TMPDIR=$scratch "$@"; else "$@"; fi
}
# The modules played on a target interpreter run in the pass under Debian's python3 only, when it runs
# (tests/conftest.py, target_python: the target a Debian 12 host has, not PATH's build).
system_python=/usr/bin/python3
first_pass_marks=()
[[ -x $system_python ]] && first_pass_marks=(-m "not target_python")
step "pytest (python3 $(python_version python))" in_scratch run_pytest python -n 2 --dist loadfile ${first_pass_marks[@]+"${first_pass_marks[@]}"} "$@"
# Again under Debian 12's own python3, the README's platform (PATH's python3 may be another
# build: pyenv's on the CI machine): the tests of what can differ between two builds of
# CPython 3.11 (tests/conftest.py, INTERPRETER_INDEPENDENT: the standard library's patch level,
# the C libraries, the module runtime on a target), not the `slow` ones (real libvirt and Docker:
# services, not the interpreter, are what they test). The properties (hypothesis) run 15
# examples each here, 60 in the first pass: the breadth of input is the first pass's and the
# same on any interpreter; this pass checks the same code paths under another one. Its venv has
# the test and ansible extras: the in-process module tests (tests/modrun.py) import ansible-core
# under this Python; the module tests through `ansible` drive its ansible with a target
# interpreter made from this Python (those run here only: target_python, above).
if [[ -x $system_python ]]; then
  step "venv ($system_python)" env PYTHON=$system_python VENV=.venv-system scripts/bootstrap.sh test,ansible
  GPUPROV_HYPOTHESIS_EXAMPLES=15 step "pytest ($system_python $(python_version $system_python))" \
    in_scratch run_pytest .venv-system/bin/python -n 2 --dist loadfile -m "not slow and not interpreter_independent" "$@"
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
# And under a real Python 3.9, the oldest gpuprov claims (pyproject's requires-python): Debian 11's
# own python3.9 in a chroot of a bullseye minbase (scripts/py39.sh: built and cached by its inputs
# under ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/py39; the CLI's and the package's tests, not the
# controller's), the properties at 15 examples as in the pass above.
GPUPROV_HYPOTHESIS_EXAMPLES=15 step "pytest (Debian 11 python3.9)" with_failures "python 3.9" scripts/py39.sh -n 2 --dist loadfile "$@"
if [[ $molecule == yes ]]; then
  step "molecule (Docker)" run_molecule_docker
  echo "=== test.sh: the lab lane's output ($logs/lab.log), to its end"
  tail -n +1 -f --pid="$lab_pid" "$logs/lab.log" || true
  wait "$lab_pid" 2>/dev/null || true # reaped; its status is lab.status's
  lab_rc=0
  status_of "$logs/lab.status" || lab_rc=$?
  lab_pid=
  results+=("$(printf '%-32s %-6s %4ss' "molecule (lab lane)" "$([[ $lab_rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$(cat "$logs/lab.seconds" 2>/dev/null || echo '?')")")
  [[ $lab_rc -eq 0 ]] || failed=1
  for rows in "$logs/docker.rows" "$logs/lab.rows"; do
    [[ -f $rows ]] && mapfile -t -O ${#molecule_rows[@]} molecule_rows <"$rows"
  done
  echo
  lab_milestones
fi

echo
# The machine's CPU beside the time: CI's landings took 1,870-2,769 s on 2026-11-26 and 5,051-5,221 s
# the next day, and TCG's speed follows the CPU, so a run's figures say which CPU gave them.
cpu_model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1 || true)
echo "=== test.sh summary ($((SECONDS - total))s; $(nproc) CPUs: ${cpu_model:-model unknown};" \
  "the machine busy $(($(machine_busy) - busy_start)) CPU-s of $((SECONDS - total)) x $(nproc))"
printf '%s\n' "${results[@]}" ${molecule_rows[@]+"${molecule_rows[@]}"}
if [[ -s $logs/failed-tests ]]; then
  echo "=== test.sh: the tests that failed (pytest's short summary, per run)"
  cut -c1-300 "$logs/failed-tests"
fi
if ((failed)); then
  echo "test.sh: FAILED" >&2
  exit 1
fi
echo "test.sh: all passed"
