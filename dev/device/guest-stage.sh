#!/usr/bin/env bash
# The guest stage (playbooks/guests.yml: guest_nvidia_driver, guest_container_toolkit, gpu_verify)
# run through ansible-playbook against localhost on a GPU guest: check mode, apply, apply again.
# Made for the device machines (no package registry: ansible-core comes as wheels in .whl/, the
# collection as build/collections from dev/tools/build_collection.py); every log goes to $OUT.
#   dev/device/guest-stage.sh [extra ansible-playbook args]
set -uo pipefail
OUT=${OUT:-/tmp/guest-stage}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$PWD/build/collections
printf '[defaults]\n' > "$OUT/ansible.cfg"  # none of a checkout's settings: the collection as a user has it
export ANSIBLE_CONFIG=$OUT/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0
PY=$(command -v python3)
cat > "$OUT/inventory.yml" <<INV
gpu_guests:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $PY
INV
snapshot() { find /etc /var/lib/dpkg/status -xdev -type f 2>/dev/null | sort | xargs -r sha256sum 2>/dev/null | sha256sum; }
play() {
  local name=$1; shift
  local start=$SECONDS
  python3 -m ansible.cli.playbook -i "$OUT/inventory.yml" playbooks/guests.yml "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc $((SECONDS - start))s: $(grep -E '^localhost +:' "$OUT/$name.log" | tail -1)"
}
echo "etc before: $(snapshot)" | tee "$OUT/snapshots.txt"
play check --check --diff "$@"
echo "etc after check: $(snapshot)" | tee -a "$OUT/snapshots.txt"
play driver-verify --tags guest_driver,verify "$@"
play driver-verify-again --tags guest_driver,verify "$@"
echo "etc after driver+verify: $(snapshot)" | tee -a "$OUT/snapshots.txt"
play toolkit --tags containers "$@"
echo "etc after toolkit: $(snapshot)" | tee -a "$OUT/snapshots.txt"
grep -hE "FAILED|fatal|msg" "$OUT"/toolkit.log | head -20

# Issue 14: the guest stage with nothing to do against a facts-only play on the same guest, in the
# same run, interleaved (rounds of facts-only then no-op): each time, the medians and the ratio.
# The no-op stage is what converges here: the driver and verify (the toolkit from an offline
# directory, and its no-op figure: dev/device/container-stage.sh).
source dev/device/noop-ratio.sh
noop_ratio 5 "guest stage (guest_driver, verify)" playbooks/guests.yml --tags guest_driver,verify
