#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module guest_sharing: how a GPU guest's GPUs are shared among tenants (exclusive, shared, MPS)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_sharing
short_description: Share a GPU guest's GPUs among tenants - MPS daemons with enforced limits, or none
description:
  - Reads the guest (the GPUs from C(nvidia-smi --query-gpu), NVIDIA's MPS binaries, whether PID 1 is systemd, the
    MPS daemons gpuprov keeps and their limits from the control daemon's read-only C(get_*) commands, the CDI spec)
    and plans from the declaration O(declaration) (C(gpuprov_guest)); a converged guest costs the reads and one plan.
  - C(sharing=mps) - one C(nvidia-cuda-mps-control) per GPU entry, kept running by a supervisor script
    (C(/usr/local/libexec/gpuprov/gpuprov-mps-NAME)) under a systemd unit, or started with C(setsid) where PID 1 is
    not systemd; restarted after a crash; its limits (C(set_default_active_thread_percentage),
    C(set_default_device_pinned_mem_limit)) applied after every start and whenever they drift; its C(/dev/shm) a
    folder of its own that the tenants' containers mount too.
  - The CDI spec O(cdi_output) is made from C(nvidia-ctk cdi generate --format=json) with every device of an MPS GPU
    made an MPS client (the pipe folder, the shared memory folder, C(CUDA_MPS_PIPE_DIRECTORY)) and one device per named
    tenant (C(nvidia.com/gpu=ENTRY-TENANT)); CDI's environment is applied after Docker's C(-e), so a container's own
    variables do not take it past MPS. With O(cdi=false) the spec is left alone.
  - C(sharing=exclusive) or C(shared) - no daemon; one gpuprov kept is stopped and its folder, script and unit removed,
    and a compute mode it set is put back to Default.
  - Writes C(/etc/gpuprov/guest-sharing.json), what C(gpuprov verify) checks the guest against.
  - Refusals come before anything changes and name the fix - a declaration that does not validate, MPS without its
    binaries, a GPU the guest does not show, compute capability below 7.0 or unknown, memory shares above the GPU's
    memory less its reserve, unequal shares without C(advisory_shares), the CDI spec owed without C(nvidia-ctk).
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  declaration:
    description:
      - The guest's declaration, C(gpuprov_guest) (docs/guides/sharing.md; the schema C(gpuprov schema) prints) -
        C({version, gpus, mps_root}); each GPU entry C({name, address or uuid, sharing, tenants, memory_reserve_mib,
        compute_mode, advisory_shares}). Unset - no GPU is shared (every daemon gpuprov kept is removed).
    type: raw
  cdi:
    description: Keep the CDI spec's MPS client settings in step with the declaration.
    type: bool
    default: true
  cdi_output:
    description: The CDI spec's path (the one the role guest_container_toolkit writes).
    type: path
    default: /etc/cdi/nvidia.yaml
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  platform:
    platforms: posix
seealso:
  - module: gpuprov.kvm.guest_toolkit
  - module: gpuprov.kvm.gpu_verify
"""

EXAMPLES = r"""
- name: Four equal tenants on the guest's GPU, the compute mode left as it is
  gpuprov.kvm.guest_sharing:
    declaration:
      version: 1
      gpus:
        - {name: gpu0, address: "0000:00:06.0", sharing: mps, tenants: 4, compute_mode: leave}

- name: What it would do
  gpuprov.kvm.guest_sharing:
    declaration: "{{ gpuprov_guest }}"
  check_mode: true
"""

RETURN = r"""
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
not_run:
  description: Live actions (commands) not run because O(root) is not C(/).
  returned: always
  type: list
  elements: str
refusals:
  description: Why the module refused, one entry per problem; nothing was changed.
  returned: failed
  type: list
  elements: dict
  contains:
    message:
      description: The problem.
      type: str
      returned: always
    fix:
      description: How to fix it (null when the message says it).
      type: str
      returned: always
    device:
      description: The GPU's PCI address, or null.
      type: str
      returned: always
gpus:
  description:
    - Per GPU entry - its mode, the GPU it resolved to, and under MPS the server's limits and each tenant's share,
      with C(enforced) true only where MPS holds the tenant to it (false - advice, set in its container's environment).
  returned: always
  type: list
  elements: dict
  sample:
    - name: gpu0
      sharing: mps
      uuid: GPU-00000000-0000-0000-0000-000000000000
      server_limits: {sm_percent: 25, memory_mib: 35430}
      tenants: [{name: tenant-0, sm_percent: 25, memory_mib: 35430, enforced: true}]
      enforced: true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import guest_sharing
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import (
    one_run_at_a_time,
    refuse_bad_root,
)


def main() -> None:
    module = AnsibleModule(argument_spec=guest_sharing.ARGUMENT_SPEC, supports_check_mode=True)
    refuse_bad_root(module, host=False)
    one_run_at_a_time(module, "sharing")
    guest_sharing.run(module)


if __name__ == "__main__":
    main()
