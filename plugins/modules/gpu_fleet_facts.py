#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_fleet_facts: one host's part of the fleet report, in one module run."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_fleet_facts
short_description: A host against its declaration, for the fleet report - verdicts, drift and GPU health
description:
  - Reads the host (read-only) once and returns its part of the fleet report (C(gpuprov fleet),
    playbook C(gpuprov.kvm.fleet_report)) as RV(fleet) - its status (C(converged), C(drifted),
    C(unknown) or C(not ready)), per GPU its declared use, its verdict for that use and its health, the drift from the
    declaration and every reason a declared use is not ready.
  - Drift is read from the host each time, never from a cache - a declared GPU moved or changed (the id
    guard), its driver binding, the mdev, SR-IOV vGPU and MIG layout, each declared VM's state and
    devices, the kernel arguments booted against those configured, the CDI spec against the GPUs present.
  - Health is a GPU off the bus (its config space reads all ones), AER error counts, Xid events, failed
    resets and the driver's own failures from the kernel log, and ECC errors and remapped rows through
    NVML (or a captured C(nvidia-smi -q -x) below a staged root).
  - A declaration that breaks its schema or does not fit the host does not fail the task; the host is
    C(not ready) and RV(fleet.not_ready) says why. A O(root) that is not a host root fails it.
  - The target needs no gpuprov installed; the logic travels with the module.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  host:
    description:
      - The host's declaration, C(gpuprov_host) (docs/reference/host-model.md). Without it (and without the old
        variables) nothing is declared - the GPUs' health is read, nothing drifts.
    type: dict
  layouts:
    description:
      - Named layouts, C(gpuprov_layouts), that O(host) picks by name.
    type: dict
  gpus:
    description:
      - Deprecated, the old C(gpuprov_gpus); read when O(host) is not given.
    type: raw
  vms:
    description:
      - Deprecated, the old C(gpu_vms_list); read when O(host) is not given.
    type: raw
  vfio_devices:
    description:
      - Deprecated, the old C(vfio_host_devices); read when O(host) is not given.
    type: raw
  nvml:
    description:
      - C(auto) reads ECC errors and remapped rows through NVML on a live host whose NVIDIA driver is loaded
        and that has the C(pynvml) module (nvidia-ml-py); C(never) does not ask NVML (they are then unknown).
    type: str
    choices: [auto, never]
    default: auto
  kernel_log:
    description:
      - Read the kernel log (C(/dev/kmsg), else C(/var/log/kern.log) or C(/var/log/messages) below O(root))
        for Xid events, failed resets and the driver's failures.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.root
attributes:
  check_mode:
    support: full
    details: Reads only; changes nothing, in check mode or not.
  diff_mode:
    support: none
  platform:
    platforms: posix
notes:
  - The record follows the host part of the schema C(gpuprov.fleet/v1) (gpuprov/schemas/fleet.v1.json).
  - Reading C(/dev/kmsg), libvirt's domain folders and C(/etc/default/grub) takes root - run it with C(become).
seealso:
  - name: The fleet report
    description: docs/guides/fleet.md in the gpuprov repository.
    link: https://github.com/gpuprov/gpuprov
"""

EXAMPLES = r"""
- name: Read each host against its declaration
  gpuprov.kvm.gpu_fleet_facts:
    host: "{{ gpuprov_host | default(omit) }}"
    layouts: "{{ gpuprov_layouts | default(omit) }}"
  register: fleet

- name: Stop on a host that drifted
  ansible.builtin.assert:
    that: fleet.fleet.status == 'converged'
    fail_msg: "{{ fleet.fleet.drift | map(attribute='message') }}"
"""

RETURN = r"""
fleet:
  description: The host's record in the fleet report.
  returned: success
  type: dict
  contains:
    status:
      description: C(not ready), C(drifted), C(unknown) (something the status rests on could not be read,
        listed in RV(fleet.unknown); never converged) or C(converged).
      type: str
      returned: success
    gpus:
      description:
        - Per GPU its address, declared use and entry, verdict, findings and health (status, findings, raw values).
      type: list
      elements: dict
      returned: success
    drift:
      description:
        - Each difference from the declaration - code, the declared entry (or configuration file), device, message,
          fix.
      type: list
      elements: dict
      returned: success
    not_ready:
      description: Each reason a declared use is not ready - code, device, entry, message, fix.
      type: list
      elements: dict
      returned: success
    unknown:
      description: What could not be compared, and why.
      type: list
      elements: dict
      returned: success
    health:
      description: Where the kernel log and the ECC counts were read, or why they could not be.
      type: dict
      returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_fleet_facts


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_fleet_facts.ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(changed=False, fleet=gpu_fleet_facts.record(module))


if __name__ == "__main__":
    main()
