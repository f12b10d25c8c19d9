#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module vfio_bind: give PCI devices to vfio-pci, safely, now and from boot."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vfio_bind
short_description: Bind PCI devices (and the functions their group requires) to vfio-pci
description:
  - Binds the devices named by full PCI address to vfio-pci at runtime (driver_override, unbind,
    drivers_probe) and, with O(persistent), from boot (a udev rule setting driver_override, softdeps so
    vfio-pci loads before GPU drivers, both in the initramfs, which is rebuilt).
  - Companion functions of the same slot (HD audio, USB, UCSI) are bound too; PCIe bridges and ports
    in the group stay with their driver.
  - Refuses, changing nothing, when the device or a member of its IOMMU group is the boot display, drives
    the console, is a chipset device, a storage controller with mounted/swap/held disks, a NIC with an
    address or route, is held open by a process or VM, shares the group with a device that is not being
    bound, when the IOMMU is off, or when an address is malformed or absent.
  - Runtime sysfs writes and commands run only when O(root) is C(/); against another root the files are
    written below it and the rest is reported in RV(not_run).
  - One run at a time, with M(gpuprov.kvm.iommu_boot) (both rebuild the initramfs). The module holds
    C(/run/gpuprov/boot.lock) while it reads and changes the host, waiting up to 300 s for another run; past that it
    fails, naming the holder, with nothing changed. Check mode takes no lock.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  devices:
    description:
      - Full PCI addresses (C(0000:41:00.0)); never vendor:device ids, two identical GPUs are common.
      - One of O(devices) and O(host) is required.
    type: list
    elements: str
  host:
    description:
      - The host's declaration, C(gpuprov_host) (docs/reference/host-model.md), instead of O(devices) - its
        C(use) C(passthrough) GPUs are bound. It is resolved in this module run from the facts the module
        reads anyway, exactly as M(gpuprov.kvm.gpu_host_model) resolves it (refused the same way), and
        returned as the fact C(gpuprov_model) for the roles after this one (role vfio_host does this
        when the run has not resolved the declaration yet, one module run instead of two).
      - A declaration with no passthrough GPU binds nothing and leaves vfio's files as they are.
    type: dict
  layouts:
    description: With O(host), the named vGPU layouts, C(gpuprov_layouts) (docs/reference/formats.md).
    type: dict
  state:
    description:
      - C(bound) gives the devices to vfio-pci; C(unbound) gives them back to their host drivers and drops
        them from the boot-time binding.
    type: str
    choices: [bound, unbound]
    default: bound
  persistent:
    description: Also bind from boot (udev rule, softdeps, initramfs).
    type: bool
    default: true
  allow_unsafe:
    description:
      - Expert override. Devices listed here are bound even where the safety rules refuse (evidence that
        could not be read included); every overridden refusal is reported as a warning. Losing the host's
        disk, network or console is on you.
      - It never lifts the bridge refusal - bridges, root and switch ports and host bridges are never bound.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  platform:
    platforms: posix
seealso:
  - module: gpuprov.kvm.gpu_host_facts
"""

EXAMPLES = r"""
- name: Give the second GPU and its audio function to vfio-pci, now and from boot
  gpuprov.kvm.vfio_bind:
    devices: ["0000:41:00.0"]

- name: Give it back to the host
  gpuprov.kvm.vfio_bind:
    devices: ["0000:41:00.0"]
    state: unbound

- name: Dry run against a captured host
  gpuprov.kvm.vfio_bind:
    devices: ["0000:01:00.0"]
    root: /srv/captures/node07
  check_mode: true
"""

RETURN = r"""
ansible_facts:
  description: With O(host), the resolved model (M(gpuprov.kvm.gpu_host_model)'s fact).
  returned: when O(host) is given and the declaration fits the host
  type: dict
  contains:
    gpuprov_model:
      description: What every stage derives from the declaration (vfio_devices, gpus, vms, declared, settings...).
      type: dict
      returned: always
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
  sample:
    - write 'vfio-pci' to /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/driver_override (only vfio-pci may bind it)
devices:
  description: The devices bound or released, companions included.
  returned: success
  type: list
  elements: str
  sample: ["0000:01:00.0", "0000:01:00.1"]
previous_drivers:
  description: The driver each device had before (null for none).
  returned: success
  type: dict
  sample: {"0000:01:00.0": "nvidia", "0000:01:00.1": "snd_hda_intel"}
not_run:
  description: Live actions (sysfs writes, commands) not run because O(root) is not C(/).
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
      description: The PCI address the problem concerns (null for none).
      type: str
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import vfio_bind
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import finish, one_run_at_a_time
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.gpu_host_model import resolve_or_refuse


def main() -> None:
    module = AnsibleModule(argument_spec=vfio_bind.ARGUMENT_SPEC, supports_check_mode=True, **vfio_bind.RULES)
    p = module.params
    one_run_at_a_time(module, "boot")
    plan, model = vfio_bind.plan(p, lambda doc, facts: resolve_or_refuse(module, doc, facts))
    extra = {} if model is None else {"ansible_facts": {"gpuprov_model": model.derived()}}
    finish(module, plan, p["root"], devices=plan.bind_set, previous_drivers=plan.previous_drivers, **extra)


if __name__ == "__main__":
    main()
