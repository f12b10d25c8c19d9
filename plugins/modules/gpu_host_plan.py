#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_host_plan: plan every host-side concern in one module run, so a converged host
runs no other module (issue #14; docs/concepts/plan-gate.md)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_host_plan
short_description: Plan the host-side concerns ahead in one module run and say which have nothing to do
description:
  - Runs the read-and-plan step of M(gpuprov.kvm.iommu_boot), M(gpuprov.kvm.vfio_bind) and
    M(gpuprov.kvm.gpu_vgpu) (the same code those modules run) for the options each role would give them,
    from one read of the host, and changes nothing.
  - A concern is converged when its module would change nothing, reboot nothing, install nothing,
    refuse nothing and warn of nothing; its digest (O(concerns.iommu_boot.digest) and the like) is then
    in RV(converged) and the role may skip its module. Anything else, an option the module would reject
    or a read that failed included, leaves the concern pending, and its module runs as it would without
    this one (fail closed).
  - A verdict holds only for the options planned (the role gives their digest) and until something
    changes the host; the roles forget every verdict when one of their modules changed something. The
    role host_plan runs this module first in playbooks/hosts.yml.
  - With a declaration (C(host) in the options of O(concerns.vfio_bind)), the resolved model is returned as the fact
    C(gpuprov_model), as M(gpuprov.kvm.gpu_host_model) returns it, so no other module resolves it again.
  - The target needs no gpuprov installed; the logic travels with the module.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  concerns:
    description: The concerns to plan, by module name; a concern left out is not planned.
    type: dict
    required: true
    suboptions:
      iommu_boot:
        description: The call of M(gpuprov.kvm.iommu_boot) to plan.
        type: dict
        suboptions: &concern
          options:
            description: The module's options, as the role passes them.
            type: dict
            required: true
          digest:
            description: What RV(converged) holds when the call has nothing to do (the role's digest of its options).
            type: str
            required: true
      vfio_bind:
        description: The call of M(gpuprov.kvm.vfio_bind) to plan.
        type: dict
        suboptions: *concern
      gpu_vgpu:
        description: The call of M(gpuprov.kvm.gpu_vgpu) to plan.
        type: dict
        suboptions: *concern
  record_root:
    description:
      - The root below which M(gpuprov.kvm.gpu_host_drain) keeps its record; RV(disruption.recorded) says
        whether one is there (a restore is owed). Left out, it is not looked at.
    type: path
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
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
  - name: Planning ahead
    description: docs/concepts/plan-gate.md in the gpuprov repository.
    link: https://github.com/gpuprov/gpuprov
"""

EXAMPLES = r"""
# The role host_plan does this for the roles iommu_host, vfio_host and vgpu_host, with the options
# each keeps in its vars/main.yml; a role then runs its module only when its digest is not converged.
- name: Plan the vfio binding of the declared host ahead
  gpuprov.kvm.gpu_host_plan:
    concerns:
      vfio_bind:
        options: "{{ vfio_options }}"
        digest: "{{ vfio_options | string | hash('sha1') }}"
  vars:
    vfio_options: {host: "{{ gpuprov_host }}", state: bound}
  register: ahead

- name: Say what is left to do
  ansible.builtin.debug:
    msg: "{{ ahead.pending }}"
"""

RETURN = r"""
converged:
  description: The keys of the concerns whose module would do and say nothing.
  returned: success
  type: list
  elements: str
pending:
  description: Each concern planned that is not converged, by module name, with why its module must run.
  returned: success
  type: dict
ansible_facts:
  description: Facts to add to the host's facts.
  returned: when a declaration resolved
  type: dict
  contains:
    gpuprov_model:
      description: What the stages derive from the declaration, as M(gpuprov.kvm.gpu_host_model) returns it.
      returned: when a declaration resolved
      type: dict
disruption:
  description:
    - What the pending concerns' changes take from running VMs, for M(gpuprov.kvm.gpu_host_drain)
      (docs/guides/rolling.md). A concern refused for any reason but a device in use changes nothing and
      disrupts nothing.
  returned: success
  type: dict
  contains:
    reboot:
      description: The play reboots the host (iommu_boot, with the reboot allowed, on C(/)).
      type: bool
    devices:
      description:
        - PCI addresses and mdev UUIDs whose holders must stop first; a VM holding an mdev or a VF of one
          is held by it too. Only on C(/), where the runtime changes run.
      type: list
      elements: str
    why:
      description: What each concern changes, as text.
      type: list
      elements: str
    unknown:
      description: Concerns that could not be planned, and why (the drain refuses on them).
      type: list
      elements: str
    recorded:
      description: A drain record is below O(record_root).
      type: bool
model_root:
  description: The root the declaration was resolved on (role host_model's marker).
  returned: when a declaration resolved
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_host_plan


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_host_plan.ARGUMENT_SPEC, supports_check_mode=True)
    ahead = gpu_host_plan.plan_ahead(module.params["concerns"], module.params["record_root"])
    gpu_host_plan.finish_ahead(module, ahead)


if __name__ == "__main__":
    main()
