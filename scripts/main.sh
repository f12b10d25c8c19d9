#!/usr/bin/env bash
# The main job: the whole playbook, for real, on an emulated GPU host (the lab).
#   1. install gpuprov and Ansible into .venv, and inspect this machine (seconds);
#   2. `python -m dev.lab up` (the lab: dev/lab/, run from this checkout, not in
#      the wheel): install what the lab needs where it is missing (QEMU, OVMF, debootstrap, mtools...), build the lab image (cached: once per set
#      of inputs) and boot the lab host (QEMU TCG, no KVM needed);
#   3. ansible-playbook -i inventories/lab playbooks/gpu_passthrough.yml: IOMMU on
#      (the lab host reboots through its own GRUB), edus to vfio-pci, an mtty
#      mdev, and a nested guest that lists both on its serial console.
# The lab host stays up afterwards: `python -m dev.lab ssh`, `python -m dev.lab down`.
# As root (apt, debootstrap). Arguments go to ansible-playbook (e.g. --check --diff).
set -euo pipefail
cd "$(dirname "$0")/.."
# The ansible extra: the ansible-core the roles are tested with (no test tools).
scripts/bootstrap.sh ansible
export PATH="$PWD/.venv/bin:$PATH"

echo "=== main.sh: gpuprov inspect (this machine)"
gpuprov inspect # a machine without GPUs or IOMMU gets "No GPUs here": the lab brings both

echo "=== main.sh: python -m dev.lab up"
python -m dev.lab up

# The inventory assumes ~/.cache/gpuprov/lab and port 2522; elsewhere (GPUPROV_CACHE,
# GPUPROV_LAB_PORT) `python -m dev.lab status --json` gives the variables to pass.
extra=$(python -m dev.lab status --json | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["inventory_overrides"] or {}))')
# The roles and modules run as the collection gpuprov.kvm, assembled from this checkout
# into build/collections (ansible.cfg's collections_path; skipped when nothing changed).
python dev/tools/build_collection.py
echo "=== main.sh: ansible-playbook -i inventories/lab playbooks/gpu_passthrough.yml"
ansible-playbook -i inventories/lab playbooks/gpu_passthrough.yml -e "$extra" "$@"
echo "main.sh: done; the lab host is still up (python -m dev.lab ssh, python -m dev.lab down)"
