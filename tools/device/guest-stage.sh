#!/usr/bin/env bash
# The guest stage (playbooks/guests.yml: guest_nvidia_driver, guest_container_toolkit, gpu_verify)
# run through ansible-playbook against localhost on a GPU guest: check mode, apply, apply again.
# Made for the device machines (no package registry: ansible-core comes as wheels in .whl/, the
# collection as build/collections from tools/build_collection.py); every log goes to $OUT.
#   tools/device/guest-stage.sh [extra ansible-playbook args]
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
# The no-op stage is what converges here: the driver and verify (the toolkit cannot install
# without a registry, see above).
printf -- '- name: Facts only\n  hosts: gpu_guests\n  become: true\n  gather_facts: true\n  tasks: []\n' > "$OUT/facts.yml"
timed() {
  local log=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  python3 -m ansible.cli.playbook -i "$OUT/inventory.yml" "$@" > "$OUT/$log.log" 2>&1 || echo "== $log failed: $(tail -3 "$OUT/$log.log")"
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}
facts=() noop=()
for round in 1 2 3 4 5; do
  facts+=("$(timed "facts-$round" "$OUT/facts.yml")")
  noop+=("$(timed "noop-$round" playbooks/guests.yml --tags guest_driver,verify)")
  echo "round $round: facts-only ${facts[-1]} s, no-op guest stage ${noop[-1]} s ($(grep -E '^localhost +:' "$OUT/noop-$round.log" | tail -1))"
done
python3 - "${facts[*]}" "${noop[*]}" <<'PY' | tee "$OUT/noop-ratio.txt"
import statistics, sys
facts, noop = ([float(x) for x in arg.split()] for arg in sys.argv[1:3])
f, n = statistics.median(facts), statistics.median(noop)
print(f"facts-only play: {facts} s, median {f:.2f} s")
print(f"no-op guest stage (guest_driver, verify): {noop} s, median {n:.2f} s")
print(f"ratio no-op / facts-only: {n / f:.2f} (issue 14's goal: at most 2)")
PY
