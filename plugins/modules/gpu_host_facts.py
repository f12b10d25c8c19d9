#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_host_facts: gpuprov inspect as Ansible facts."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_host_facts
short_description: GPU, IOMMU and vfio facts of a host, with a passthrough verdict per GPU
description:
  - Reads the host's sysfs and procfs (read-only) and returns what C(gpuprov inspect --json) prints,
    as the fact C(gpuprov).
  - The fact holds PCI devices, IOMMU state, groups and kernel arguments, mdev and SR-IOV vGPU types,
    NUMA nodes, what the host itself needs (boot display, disks and NICs in use, open device files),
    and for each GPU a readiness verdict with every reason.
  - A O(root) that does not exist, is not a directory (a capture tarball included; unpack it first) or
    holds no C(sys/) is refused, as C(gpuprov inspect --root) refuses it; nothing read is not a host
    with no devices.
  - The target needs no gpuprov installed; the logic travels with the module.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  devices:
    description:
      - Full PCI addresses of devices to assess besides the display-class GPUs (stand-ins, accelerators).
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - gpuprov.kvm.root
attributes:
  check_mode:
    support: full
    details: Reads only; changes nothing, in check mode or not.
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
notes:
  - The fact follows the schema C(gpuprov.inspect/v1), documented in C(docs/reference/inspect-json.md).
seealso:
  - name: gpuprov inspect
    description: The same report on the command line.
    link: https://github.com/gpuprov/gpuprov
"""

EXAMPLES = r"""
- name: Read GPU facts
  gpuprov.kvm.gpu_host_facts:

- name: Stop when a GPU meant for guests is not ready
  vars:
    gpu: "{{ ansible_facts.gpuprov.gpus | selectattr('address', 'equalto', '0000:41:00.0') | first }}"
  ansible.builtin.assert:
    that: gpu.ready
    fail_msg: "{{ gpu.findings | selectattr('severity', 'equalto', 'blocker') | map(attribute='message') }}"

- name: Read a captured host
  gpuprov.kvm.gpu_host_facts:
    root: /srv/captures/gpu-node-07
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host's facts.
  returned: always
  type: dict
  contains:
    gpuprov:
      description: The inspect report (schema gpuprov.inspect/v1).
      returned: always
      type: dict
      contains:
        iommu:
          description: IOMMU state (enabled, units, vendor, args, groups, modules, interrupt remapping).
          type: dict
          returned: always
        pci_devices:
          description: Every PCI device with ids, driver, NUMA node, link, reset methods, group, SR-IOV.
          type: list
          elements: dict
          returned: always
        gpus:
          description: Per GPU (and per device in O(devices)) the verdict C(ready) and its C(findings).
          type: list
          elements: dict
          returned: always
        summary:
          description: Counts of GPUs, ready and not ready.
          type: dict
          returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_host_facts


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_host_facts.ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts={"gpuprov": gpu_host_facts.report(module)})


if __name__ == "__main__":
    main()
