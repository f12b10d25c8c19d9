#!/usr/bin/env bash
# The unit tests under a real Python 3.9: Debian 11 (bullseye)'s own python3.9 (3.9.2), the
# oldest Python gpuprov claims (pyproject's requires-python; RHEL 9's python3; the floor the
# modules have on a target), in a chroot of a Debian 11 minbase built here from Debian's archive.
#
#   scripts/py39.sh [PYTEST ARGS...]      # as root; arguments go to pytest after the selection
#   scripts/py39.sh tests/cli/test_x.py   # paths (tests/...) replace the selection
#
# What runs: tests/{cli,facts,rules,inputs,plan,model,verify,modules} but the `slow` tests (real
# libvirt, Docker, QEMU: services, not the interpreter) and DESELECT below, each with its reason
# (an Ansible controller, which needs Python 3.11; a browser; Debian 12's python3 itself). That
# is the CLI and every layer beneath it, which is also the code the modules carry to targets,
# and the modules' entry points run in process (tests/modrun.py) on ansible-core's module_utils,
# as AnsiballZ runs them on a 3.9 target. The `interpreter_independent` tests run here too: 3.9
# is another language version (no `X | Y` of types at run time, no zip(strict=)), not another
# patch level. tests/house and tests/ansible test the checkout and the controller, not this
# interpreter; tests/house/test_python_versions.py checks the source for 3.10+ constructs.
#
# With CI=true a skip fails the run unless tests/skip_policy.py allows it; pytest collecting
# nothing (exit 5) fails it too.
#
# Cache, under ${GPUPROV_CACHE:-$HOME/.cache/gpuprov}/py39, each level keyed by its inputs (older
# keys are removed):
#   bullseye-<key>.tar  the debootstrap minbase (key: SUITE, PACKAGES, how it is built,
#                       scripts/minbase.sh); built when missing: 2-3 minutes.
#   root-<key>/         that rootfs unpacked with a venv at /opt/venv: pip upgraded, gpuprov's
#                       dependencies and test extra, gpuprov editable from /src/main (key: the
#                       tarball's, how it is made, those requirements and the entry points);
#                       made when missing: 1-2 minutes, pip's downloads cached in pip/ beside them.
# A change to DESELECT or the selection rebuilds nothing.
# A run copies the checkout (git's tracked and untracked files, not the ignored ones) into a tmpfs
# at /src/main of the chroot (../shared, when the checkout has one, at /src/shared read-only),
# mounts /proc, /sys (read-only), /dev and a tmpfs at /tmp, the cached root itself read-only,
# and runs pytest there, in mount and PID namespaces of its own: when pytest ends, its mounts and
# any process it left (a gpg-agent) go with it, and the cache is as it was.
#
# Environment: GPUPROV_CACHE; GPUPROV_BULLSEYE_MIRROR (default http://deb.debian.org/debian;
# http://archive.debian.org/debian once bullseye moves there); CI. Needs root, debootstrap
# (installed when missing), unshare (util-linux) and, for a build, network (Debian's archive,
# PyPI: pip in the chroot gets the host's CA bundle and proxy variables), and python3 >= 3.11
# on PATH (tomllib reads pyproject.toml).
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$PWD

SUITE=bullseye
# python3 is 3.9 in bullseye, python3-venv makes the venv. The tools the selected tests run:
# gpg, gpg-agent and debian-archive-keyring (the apt keyring planner on real keys), pciutils and
# pci.ids (capture runs lspci), udev (its hwdb names devices), libvirt-clients and libxml2-utils
# (virt-xml-validate checks the domain XML built under this Python), and python3-libvirt (the
# gpu_vm module's libvirt side, in process on test:///default: the bindings a Debian 11 target
# has; the venv sees Debian's dist-packages for it, and they hold nothing else). setpriv
# (util-linux) is in minbase.
PACKAGES=(python3 python3-venv python3-libvirt gpg gpg-agent debian-archive-keyring pciutils pci.ids udev
  libvirt-clients libxml2-utils)
MIRROR=${GPUPROV_BULLSEYE_MIRROR:-http://deb.debian.org/debian}
# ansible-core's module_utils for the in-process module tests (tests/modrun.py), at the version
# pyproject's ansible extra pins: its controller needs Python 3.11 (pip refuses it here), its
# module_utils run on 3.8+ targets and are all these tests import. So: --no-deps
# --ignore-requires-python, and its commands removed (a test that reaches for the controller
# fails, never runs it on 3.9).
ANSIBLE_CORE='ansible-core>=2.19,<2.20'
# Data the tests expect as recent as the host's run has it, mounted (read-only) over bullseye's
# when the host has it: libvirt's schemas (bullseye's 7.0 predate elements gpuprov writes) and
# udev's hwdb (bullseye's predates the H100). The code that reads them is what runs on 3.9.
HOST_DATA=(/usr/share/libvirt/schemas /usr/lib/udev/hwdb.d)
SELECTION=(tests/cli tests/facts tests/rules tests/inputs tests/plan tests/model tests/verify tests/modules)
DESELECT=(
  # Modules run by the `ansible` controller (ansible-core 2.19 needs Python 3.11); the same
  # modules run in process here (tests/modrun.py: test_adapters, test_modsupport,
  # test_gpu_vm_staged_root, and the run_in_process tests of inputs/, model/ and plan/).
  tests/modules/test_modules.py
  tests/modules/test_gpu_verify_module.py
  tests/modules/test_gpu_vm_module.py
  tests/modules/test_host_plan.py
  tests/modules/test_vgpu_module.py
  tests/modules/test_module_docs.py
  tests/plan/test_guest_aptsources.py::test_the_module_check_mode_diff_apply_idempotent
  tests/plan/test_guest_aptsources.py::test_the_module_refuses_and_changes_nothing
  tests/plan/test_guest_keyring.py::test_the_module_from_a_url_check_apply_idempotent
  tests/plan/test_guest_keyring.py::test_the_module_from_data_and_a_wrong_fingerprint
  tests/plan/test_guest_keyring.py::test_the_module_refuses_a_page_that_is_no_key
  # Roles played by ansible-playbook (the controller again).
  tests/inputs/test_intent_hostile.py::test_role_host_model_refuses_an_inventory_gpu_vms_list_beside_gpuprov_host
  tests/plan/test_guest_driver.py::test_role_leaves_the_device_machines_driver_alone
  tests/plan/test_guest_driver.py::test_role_installs_on_a_guest_without_a_driver_then_changes_nothing
  # `gpuprov fleet` runs ansible-playbook; `gpuprov plan -i INVENTORY` reads through Ansible's
  # controller code. The fleet document, its page and metrics are tested here without it.
  tests/cli/test_inventory.py
  tests/cli/test_inventory_secrets.py
  tests/cli/test_inventory_hostile.py::test_a_good_inventory_still_reads
  tests/cli/test_inventory_hostile.py::test_a_dry_run_runs_no_lookup_the_inventory_holds
  tests/cli/test_inventory_hostile.py::test_trust_inventory_templates_as_the_play_does
  tests/cli/test_inventory_hostile.py::test_a_pure_lookup_is_evaluated
  tests/cli/test_inventory_hostile.py::test_an_inventory_script_is_not_run_without_trust
  tests/cli/test_inventory_hostile.py::test_ansible_reading_past_its_time_limit_is_stopped
  tests/cli/test_inventory_hostile.py::test_the_fleet_play_is_stopped_at_its_time_limit
  tests/cli/test_fleet.py::test_every_host_is_listed_and_matches_the_schema
  tests/cli/test_fleet.py::test_each_change_is_reported_on_its_host_and_nothing_else
  tests/cli/test_fleet.py::test_the_moved_gpu_names_its_entry_and_where_it_went
  tests/cli/test_fleet.py::test_the_unbound_driver_and_the_missing_mdev_name_their_entries
  tests/cli/test_fleet.py::test_a_gpu_off_the_bus_and_a_bad_kernel_log_are_its_health
  tests/cli/test_fleet.py::test_the_unreachable_host_says_why
  tests/cli/test_fleet.py::test_the_metrics_are_prometheus_text_of_the_same
  tests/cli/test_fleet.py::test_the_page_lists_every_host_with_its_status
  tests/cli/test_fleet.py::test_the_summary_names_each_host_and_why
  tests/cli/test_fleet.py::test_require_converged_exits_3_naming_the_hosts
  # Debian 12's own python3 (3.11.2) as /usr/bin/python3: scripts/test.sh's run on the host.
  tests/cli/test_hostile_captures.py::test_every_capture_reads_under_debians_own_python
  tests/cli/test_hostile_captures.py::test_hostile_captures_under_debians_own_python
  # A headless chromium (300 MB) draws the topology picture and the fleet page: their SVG and
  # HTML are checked here, how a browser shows them on the host.
  tests/cli/test_fleet_html.py::test_the_page_in_a_browser_shows_one_badge_per_host_in_its_status_colour
  tests/cli/test_topology.py::test_the_picture_in_a_browser_shows_each_gpu_in_its_node_column
  tests/cli/test_topology.py::test_an_svg_file_opens_in_the_browser_too
  tests/cli/test_topology.py::test_a_picture_to_stdout_in_the_browser
)

cache=${GPUPROV_CACHE:-${HOME:-/root}/.cache/gpuprov}/py39
self=$(readlink -f "${BASH_SOURCE[0]}")
lib=$(dirname "$self")/minbase.sh
# shellcheck source=scripts/minbase.sh
source "$lib"

log() { echo "py39.sh: $*" >&2; }
if [[ $(id -u) -ne 0 ]]; then
  log "needs root (debootstrap, chroot, mounts)"
  exit 2
fi
command -v unshare >/dev/null 2>&1 || {
  log "no unshare here (util-linux)"
  exit 2
}
mkdir -p "$cache/pip"

work=""
# shellcheck disable=SC2329 # the EXIT trap's
cleanup() { [[ -z $work ]] || rm -rf "$work"; }
trap cleanup EXIT

build_tarball() {
  local start=$SECONDS rootfs
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap ||
      {
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap
      }
  fi
  work=$(mktemp -d "$cache/build.XXXXXX")
  rootfs=$work/rootfs
  log "debootstrap $SUITE minbase + ${PACKAGES[*]} from $MIRROR"
  minbase_debootstrap "$SUITE" "$MIRROR" "$rootfs" "$work/debootstrap.log" "${PACKAGES[@]}" || exit 1
  rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/debootstrap
  mkdir -p "$rootfs/src" "$rootfs/pipcache"
  tar --numeric-owner -C "$rootfs" -cf "$work/rootfs.tar" .
  rm -f "$cache/$SUITE"-*.tar
  mv "$work/rootfs.tar" "$tarball"
  rm -rf "$work"
  work=""
  log "rootfs tarball $tarball ($(du -h "$tarball" | cut -f1)) in $((SECONDS - start))s"
}

# copy_checkout DEST: the files git shows (tracked, and untracked but not ignored) as they are in
# the working tree; without git, the tree less its venvs, builds and caches. Run inside in_chroot's
# namespaces (COPY_CHECKOUT below).
# shellcheck disable=SC2329
copy_checkout() {
  if git -C "$checkout" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$checkout" && git ls-files -z --cached --others --exclude-standard |
      tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -C "$1" -xf -
  else
    tar -C "$checkout" --exclude=./.git --exclude='./.venv*' --exclude=./build --exclude=./.cache \
      --exclude=__pycache__ -cf - . | tar -C "$1" -xf -
  fi
}

# in_chroot DIR MODE SCRIPT [VAR=VALUE...] [-- ARG...]: bash SCRIPT (with ARGs) as root in a chroot
# of DIR, in mount and PID namespaces of its own (everything below goes when SCRIPT ends): /proc,
# /sys (ro), /dev, a tmpfs at /tmp, the checkout copied into a tmpfs at /src/main, ../shared at
# /src/shared (ro). MODE "test": DIR itself read-only, HOST_DATA over bullseye's; "build": DIR
# writable, pip's cache at /pipcache. The environment inside: VARs, CI, GPUPROV_* (such as
# GPUPROV_HYPOTHESIS_EXAMPLES), proxies, a few of pip's.
in_chroot() {
  local dir=$1 mode=$2 script=$3 shared="" name
  shift 3
  [[ -d $checkout/../shared ]] && shared=$(readlink -f "$checkout/../shared")
  local -a env=(PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    HOME=/tmp/home LANG=C.UTF-8 TMPDIR=/tmp PYTHONDONTWRITEBYTECODE=1 "CI=${CI:-}")
  for name in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY PIP_INDEX_URL \
    PIP_EXTRA_INDEX_URL PIP_TRUSTED_HOST PIP_DEFAULT_TIMEOUT NO_COLOR PY_COLORS \
    $(compgen -e | grep '^GPUPROV_' | grep -v '^GPUPROV_CACHE$' || true); do
    [[ -z ${!name:-} ]] || env+=("$name=${!name}")
  done
  while (($#)) && [[ $1 != -- ]]; do
    env+=("$1")
    shift
  done
  (($#)) && shift
  # shellcheck disable=SC2016 # expanded by that bash
  HOST_DATA="${HOST_DATA[*]}" unshare --mount --pid --fork --propagation private bash -euo pipefail -c '
    dir=$1 mode=$2 checkout=$3 shared=$4 pipcache=$5 script=$6 nenv=$7
    shift 7
    env=("${@:1:nenv}")
    shift "$nenv"
    eval "$COPY_CHECKOUT"
    if [[ $mode == test ]]; then
      mount --bind "$dir" "$dir"
      mount -o remount,bind,ro "$dir"
      for data in $HOST_DATA; do
        if [[ -d $data && -d $dir$data ]]; then
          mount --bind -o ro "$data" "$dir$data"
        fi
      done
    else
      mount --bind "$pipcache" "$dir/pipcache"
    fi
    mount -t proc proc "$dir/proc"
    mount --rbind /sys "$dir/sys"
    mount -o remount,bind,ro "$dir/sys"
    mount --rbind /dev "$dir/dev"
    mount -t tmpfs -o mode=1777 tmpfs "$dir/tmp"
    mkdir "$dir/tmp/home"
    mount -t tmpfs -o mode=755 tmpfs "$dir/src"
    mkdir "$dir/src/main"
    copy_checkout "$dir/src/main"
    if [[ -n $shared ]]; then
      mkdir "$dir/src/shared"
      mount --bind -o ro "$shared" "$dir/src/shared"
    fi
    chroot "$dir" /usr/bin/env -i "${env[@]}" /bin/bash -euo pipefail -c "$script" py39.sh "$@"
  ' in_chroot "$dir" "$mode" "$checkout" "$shared" "$cache/pip" "$script" "${#env[@]}" "${env[@]}" "$@"
}
COPY_CHECKOUT="checkout=$(printf %q "$checkout"); $(declare -f copy_checkout)"
export COPY_CHECKOUT

# What the venv installs from pyproject.toml: the package's dependencies and its test extra, less
# libvirt-python (no wheel: it builds against libvirt-dev, a compiler and 150 MB more here;
# Debian's python3-libvirt stands in). Read with tomllib: python3 on PATH >= 3.11.
requirements() {
  python3 - <<'EOF'
import re
import sys

try:
    import tomllib
except ImportError:
    sys.exit("py39.sh: python3 on PATH has no tomllib (3.11+): it reads pyproject.toml")
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for req in project["dependencies"] + project["optional-dependencies"]["test"]:
    if not re.match(r"libvirt-python\b", req):
        print(req)
EOF
}

# The cached root: the tarball unpacked, the venv made in it.
make_root() {
  local start=$SECONDS tmp cert old
  local -a certenv=()
  [[ -f $tarball ]] || build_tarball
  work=$(mktemp -d "$cache/root.XXXXXX")
  tmp=$work
  tar --numeric-owner -C "$tmp" -xf "$tarball"
  cp -L /etc/resolv.conf "$tmp/etc/resolv.conf"
  # pip in the chroot trusts what the host trusts (a site's proxy CA too).
  cert=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}
  if [[ -f $cert ]]; then
    cp -L "$cert" "$tmp/etc/py39-ca.pem"
    certenv=(PIP_CERT=/etc/py39-ca.pem)
  fi
  requirements >"$tmp/requirements.txt"
  log "venv: $(tr '\n' ' ' <"$tmp/requirements.txt")gpuprov editable, $ANSIBLE_CORE (module_utils)"
  # shellcheck disable=SC2016 # expanded in the chroot
  in_chroot "$tmp" build '
    export PIP_CACHE_DIR=/pipcache PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
    python3 -m venv --system-site-packages /opt/venv
    python -m pip install -q -U pip
    python -m pip install -q -r /requirements.txt
    python -m pip install -q --no-deps -e /src/main
    python -m pip install -q --no-deps --ignore-requires-python "$ANSIBLE_CORE"
    rm -f /opt/venv/bin/ansible /opt/venv/bin/ansible-*
    # tests/modrun.py aliases the collection under ansible_collections, which on a target
    # AnsiballZ provides: an empty namespace package here (the `ansible` bundle that ships one
    # needs Python 3.11).
    mkdir "$(python -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])")/ansible_collections"
    python -c "import ansible.module_utils.basic, gpuprov.cli.main"
  ' "${certenv[@]}" "ANSIBLE_CORE=$ANSIBLE_CORE"
  rm -f "$tmp/etc/py39-ca.pem"
  for old in "$cache"/root-*; do
    [[ ! -d $old ]] || rm -rf "$old"
  done
  mv "$tmp" "$root"
  work=""
  log "root with its venv: $root in $((SECONDS - start))s"
}

# Each key hashes what its level is made of, not this whole script.
root_key=$( (
  cat "$lib"
  declare -f build_tarball
  echo "$SUITE ${PACKAGES[*]}"
) | sha256sum | cut -c1-12)
tarball=$cache/$SUITE-$root_key.tar
root_dir_key=$( (
  echo "$root_key $ANSIBLE_CORE"
  declare -f make_root
  requirements
  sed -n '/^\[project.scripts\]/,/^$/p' pyproject.toml
) | sha256sum | cut -c1-12)
root=$cache/root-$root_dir_key

start=$SECONDS
[[ -d $root ]] || make_root
for data in "${HOST_DATA[@]}"; do
  [[ -d $data ]] || log "WARNING: no $data here (scripts/bootstrap.sh test installs it): bullseye's, older, is used"
done
args=(-m "not slow" -p no:cacheprovider)
for test in "${DESELECT[@]}"; do
  args+=(--deselect "$test")
done
# Paths among the arguments (tests/...) replace the selection; the deselected stay out.
selection=("${SELECTION[@]}")
for arg in "$@"; do
  [[ $arg != tests/* ]] || selection=()
done
rc=0
# shellcheck disable=SC2016 # expanded in the chroot
in_chroot "$root" test '
  cd /src/main
  echo "py39.sh: pytest under $(python -c "import sys; print(sys.version.split()[0])") ($(readlink -f "$(command -v python)"))"
  rc=0
  python -m pytest "$@" || rc=$?
  if [[ $rc -eq 5 ]]; then
    echo "py39.sh: pytest collected no tests" >&2
    exit 1
  fi
  exit "$rc"
' -- "${args[@]}" ${selection[@]+"${selection[@]}"} "$@" || rc=$?
log "exit $rc in $((SECONDS - start))s"
exit "$rc"
