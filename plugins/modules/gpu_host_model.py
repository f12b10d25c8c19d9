#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_host_model: the host's declaration resolved against its facts, for the roles."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_host_model
short_description: Resolve a host's declaration (gpuprov_host) against its facts, once, for every role
description:
  - Validates the host's declaration (O(host), with the named layouts O(layouts)) against its one JSON
    Schema, resolves it against the host's facts (addresses, selectors, id guards, vGPU instances with
    their UUIDs) and returns what every stage derives from it as the fact C(gpuprov_model).
  - The roles vfio_host, vgpu_host and gpu_vms take their lists from that fact (the role host_model runs
    this module first), so a host is declared once and no inventory glues roles together with Jinja.
  - Refuses, naming the entry and the fix, a declaration that breaks the schema or does not fit this host
    (an address it lacks, an id guard that does not match, a VM given a GPU not declared for passthrough,
    an instance that is not declared, a vGPU type the host does not offer).
  - The old variables (O(gpus) for gpuprov_gpus, O(vms) for gpu_vms_list, O(vfio_devices) for
    vfio_host_devices) are read into the same model with a deprecation warning. Given beside O(host)
    (or named in O(old_variables)), they are refused; plan would read O(host) alone while the roles take
    the old variables; C(gpuprov convert) writes them in the new form.
  - The target needs no gpuprov installed; the logic travels with the module.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  host:
    description:
      - The host's declaration, C(gpuprov_host) (docs/reference/host-model.md); its schema is
        docs/reference/gpuprov-host.schema.json.
    type: dict
  layouts:
    description:
      - Named layouts, C(gpuprov_layouts), that O(host) picks by name; a mig-parted (C(mig-configs)) or
        vgpu-device-manager (C(vgpu-configs)) file is taken as layouts too.
    type: dict
  gpus:
    description:
      - Deprecated, the old C(gpuprov_gpus) (a mapping keyed by PCI address); used when O(host) is not given.
    type: raw
  vms:
    description:
      - Deprecated, the old C(gpu_vms_list); used when O(host) is not given.
    type: raw
  vfio_devices:
    description:
      - Deprecated, the old C(vfio_host_devices); used when O(host) is not given.
    type: raw
  old_variables:
    description:
      - The names of the old variables (C(gpuprov_gpus), C(gpu_vms_list), C(vfio_host_devices),
        C(gpu_vms_defaults), C(gpu_vms_reserved_memory_mib), C(gpu_vms_reserved_cpus),
        C(gpu_vms_mixed_vgpu_types)) the inventory sets; with O(host), any of them is refused, naming both.
        The role host_model passes the ones it finds in the host's variables.
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
seealso:
  - name: The host model
    description: docs/reference/host-model.md in the gpuprov repository.
    link: https://github.com/gpuprov/gpuprov
"""

EXAMPLES = r"""
- name: Resolve the declaration (the role host_model does this for the other roles)
  gpuprov.kvm.gpu_host_model:
    host: "{{ gpuprov_host }}"
    layouts: "{{ gpuprov_layouts | default({}) }}"

- name: Show what the vfio stage will bind
  ansible.builtin.debug:
    msg: "{{ ansible_facts.gpuprov_model.vfio_devices }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to the host's facts.
  returned: success
  type: dict
  contains:
    gpuprov_model:
      description: What the stages derive from the declaration.
      returned: success
      type: dict
      contains:
        vfio_devices:
          description: The GPUs declared C(use=passthrough), by full PCI address (role vfio_host).
          type: list
          elements: str
          returned: success
        gpus:
          description: The vGPU layout, keyed by address, every mdev with its UUID (role vgpu_host).
          type: dict
          returned: success
        vms:
          description: The VMs with the addresses, mdevs and VFs their names stand for (role gpu_vms).
          type: list
          elements: dict
          returned: success
        declared:
          description: Address -> its C(use) and the C(entry) that declares it (module gpu_vm checks VMs against it).
          type: dict
          returned: success
        settings:
          description: The host settings (reserved memory and CPUs, mixed vGPU types).
          type: dict
          returned: success
        names:
          description: Each GPU entry's name -> its addresses.
          type: dict
          returned: success
        instances:
          description: Each vGPU instance's name -> its GPU, parent, type, UUID or VF.
          type: dict
          returned: success
        legacy:
          description: Whether the old variables were read.
          type: bool
          returned: success
        warnings:
          description: Deprecations and other warnings (also given as the task's warnings).
          type: list
          elements: str
          returned: success
refusals:
  description: Why the declaration was refused, one entry per problem.
  returned: failed
  type: list
  elements: dict
  contains:
    message:
      description: The problem, naming the entry or field.
      type: str
      returned: always
    fix:
      description: How to fix it (null when the message says it).
      type: str
      returned: always
    device:
      description: The PCI address the problem concerns (null for none).
      type: str
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_host_model


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_host_model.ARGUMENT_SPEC, supports_check_mode=True)
    model = gpu_host_model.model(module)
    module.exit_json(changed=False, ansible_facts={"gpuprov_model": model.derived()})


if __name__ == "__main__":
    main()
