#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_host_drain: shut down the VMs a reboot or a rebind would take down, and start
exactly those again after it (docs/guides/rolling.md)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_host_drain
short_description: Drain a GPU host's VMs before a reboot or a rebind, and restore them after
description:
  - With O(state=drained), lists libvirt's domains and shuts down, cleanly (ACPI, all at once, each
    waited for up to O(timeout) seconds), the running ones the change in O(disruption) would take down,
    that is every one for a reboot, and for a rebind those holding one of O(disruption.devices), an mdev
    on one or a VF of one. It records them in C(/var/lib/gpuprov/drain.json) below O(root) before it stops any.
  - With O(state=restored), starts exactly the domains the record lists (by UUID) that are shut off,
    then removes the record. A record that is not one gpuprov wrote (too large, not JSON, another form)
    is refused, changing nothing.
  - Each VM's C(drain) in O(vms) (the declaration's C(gpuprov_host.vms[].drain)) says what it may get,
    C(shutdown) by default; C(force) powers it off after the wait; C(keep) makes the module refuse the host,
    naming the VM and the fix, and nothing is stopped. A domain that is not declared gets O(undeclared).
  - It refuses, stopping nothing, when any VM it would touch is kept, not declared (with
    O(undeclared=refuse)), paused, crashed, suspended or in a state it cannot read, or holds devices it
    cannot read, or when what the change disrupts could not be planned (O(disruption.unknown)), since unknown is
    never safe to drain. A VM that does not stop in time is left running (unless C(force)) and the module
    fails, naming it.
  - Nothing disrupted, nothing is read from libvirt. The role host_drain runs it in playbooks/hosts.yml, on
    the disruption M(gpuprov.kvm.gpu_host_plan) planned, first in check mode on every host of the batch.
  - The target needs no gpuprov installed; the logic travels with the module. It needs the libvirt Python
    bindings where it has something to drain or restore.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  state:
    description: C(drained) before the change, C(restored) after it.
    type: str
    choices: [drained, restored]
    default: drained
  disruption:
    description:
      - What the change takes from running VMs, as M(gpuprov.kvm.gpu_host_plan) returns it
        (RV(gpuprov.kvm.gpu_host_plan#module:disruption)).
    type: dict
    default: {}
    suboptions:
      reboot:
        description: The host reboots; every running VM is drained.
        type: bool
        default: false
      devices:
        description:
          - Full PCI addresses and mdev UUIDs the change takes; the VMs holding them (or an mdev or VF below
            one) are drained.
        type: list
        elements: str
        default: []
      why:
        description: What changes, as text (kept in the record).
        type: list
        elements: str
        default: []
      unknown:
        description: Concerns whose disruption could not be planned; any makes the module refuse.
        type: list
        elements: str
        default: []
      recorded:
        description:
          - Whether a drain record waits, as M(gpuprov.kvm.gpu_host_plan) says; the module reads the record
            itself (O(state=restored)), so this changes nothing.
        type: bool
        default: false
  vms:
    description:
      - The VMs the host declares (C(gpuprov_model.vms), or C(gpu_vms_list)); only each one's C(name) and
        C(drain) are read.
    type: list
    elements: dict
    default: []
  defaults:
    description: The keys every VM gets unless it sets them (C(gpuprov_host.vm_defaults)); only C(drain) is read.
    type: dict
    default: {}
  undeclared:
    description: What a running domain that is not in O(vms) gets when the change would take it down.
    type: str
    choices: [refuse, shutdown, force]
    default: refuse
  timeout:
    description: Seconds each VM is given to shut down (1 to 86400).
    type: int
    default: 300
  uri:
    description: The libvirt connection.
    type: str
    default: qemu:///system
  root:
    description:
      - The record is kept below it. With a root other than C(/) libvirt here is not that host's, and the
        module refuses when it has something to drain (unless O(uri) is libvirt's test driver).
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.root
attributes:
  check_mode:
    support: full
    details:
      - Reports what it would stop or start and changes nothing; the role runs it so first on every host of
        the batch.
  diff_mode:
    support: none
  platform:
    platforms: posix
seealso:
  - name: Rolling changes
    description: docs/guides/rolling.md in the gpuprov repository.
    link: https://github.com/gpuprov/gpuprov
"""

EXAMPLES = r"""
# The role host_drain does this around the roles iommu_host, vfio_host and vgpu_host.
- name: Shut down the VMs the planned change would take down
  gpuprov.kvm.gpu_host_drain:
    state: drained
    disruption: "{{ ahead.disruption }}"
    vms: "{{ gpuprov_model.vms | default([]) }}"

- name: Start them again
  gpuprov.kvm.gpu_host_drain:
    state: restored
"""

RETURN = r"""
stopped:
  description: The domains shut down (check mode, each as "would ...").
  returned: state is drained
  type: list
  elements: str
forced:
  description: The domains of RV(stopped) that may be powered off after the wait (C(drain=force)).
  returned: state is drained
  type: list
  elements: str
reasons:
  description: Each domain stopped, and what takes it down.
  returned: state is drained
  type: dict
libvirt:
  description: Set when the system's libvirt has no socket on this host (not installed yet, as on a bare host) and so no
    VM can be running; nothing was stopped.
  returned: state is drained and no socket of qemu:///system exists
  type: str
still_running:
  description: Domains that did not shut down in time and were left running (the module failed).
  returned: failure
  type: list
  elements: str
started:
  description: The recorded domains started again (check mode, each as "would ...").
  returned: state is restored
  type: list
  elements: str
already_running:
  description: Recorded domains that were running already.
  returned: state is restored
  type: list
  elements: str
record:
  description: The record's path, below O(root).
  returned: always
  type: str
plan:
  description: The record's file actions, as text.
  returned: when something is drained or restored
  type: list
  elements: str
done:
  description: What was done, in order.
  returned: when something was done
  type: list
  elements: str
refusals:
  description: Each refusal, with its fix.
  returned: failure
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_host_drain


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_host_drain.ARGUMENT_SPEC, supports_check_mode=True)
    gpu_host_drain.run(module)


if __name__ == "__main__":
    main()
