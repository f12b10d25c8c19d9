#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module iommu_boot: the IOMMU's boot change (arguments, vfio, initramfs), tried once first."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: iommu_boot
short_description: Turn the IOMMU on at boot, trying the new kernel arguments once before they become the default
description:
  - One call for the whole concern, the kernel arguments the IOMMU needs on this CPU (C(intel_iommu=on) on
    Intel, C(iommu=pt) when O(passthrough)), vfio loaded at boot (C(/etc/modules-load.d)) and put into the
    initramfs (initramfs-tools or dracut), the initramfs rebuilt when it predates what it is built from.
  - A change of the kernel arguments is tried once before it becomes the default (docs/reference/boot-trial.md).
    The bootloader is detected from the host (systemd-boot by its EFI loader variables, GRUB with BLS entries
    where grubby is installed, else GRUB's menu). The module arms a trial entry (the default entry with the
    new arguments, C(panic=N), a watchdog armed from the initramfs, a trial initramfs when the initramfs
    changes) as the next boot, once (C(grub-reboot), C(bootctl set-oneshot), C(grub2-reboot)), and returns
    RV(reboot) C(trial). The play reboots and calls the module again; on the trial boot it runs the checks
    (IOMMU on, vfio loaded, O(expect_vfio) on vfio-pci, O(trial_check)) and commits the default
    (C(/etc/default/grub) by argument + C(update-grub), C(grubby --args), or C(/etc/kernel/cmdline) +
    C(kernel-install) / C(proxmox-boot-tool refresh)). A trial boot that panics, hangs or fails its checks
    leaves the default byte for byte as it was; the module records the failure and refuses the same
    arguments in later runs unless O(retry_failed).
  - What is owed comes from the host (the default's arguments, the initramfs's age against its inputs, the
    trial record in C(/var/lib/gpuprov/boot-trial.json) and the boot id), so a run killed anywhere is
    finished by the next one.
  - One run at a time. The module holds an exclusive lock on C(/run/gpuprov/boot.lock) from before it reads
    the host until it ends (a run whose play was killed goes on on the host). A second run waits up to 300 s,
    then reads what the first left; past that it fails, naming the holder, with nothing changed. Check mode
    takes no lock.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  passthrough:
    description: Add C(iommu=pt) (only devices given to VMs are translated).
    type: bool
    default: true
  extra_args:
    description: More kernel arguments, each one argument as M(gpuprov.kvm.kernel_cmdline) takes them.
    type: list
    elements: str
    default: []
  vfio_modules:
    description: Modules loaded at boot and put into the initramfs.
    type: list
    elements: str
    default: [vfio, vfio_iommu_type1, vfio_pci]
  variable:
    description: The GRUB variable edited on commit (GRUB hosts).
    type: str
    default: GRUB_CMDLINE_LINUX_DEFAULT
  trial:
    description:
      - Try a change of the kernel arguments once before it becomes the default.
      - C(false) changes the default directly (a bad argument then needs the console).
    type: bool
    default: true
  reboot_allowed:
    description:
      - The play reboots into the trial. When C(false), nothing that boots is changed (the files that load vfio
        are written) and RV(reboot) says what is owed.
    type: bool
    default: false
  panic_seconds:
    description: The trial boot's C(panic=) (seconds before a panicking trial boot reboots onto the default).
    type: int
    default: 10
  watchdog_seconds:
    description:
      - Seconds from the trial boot's initramfs until its watchdog resets the machine unless the module, on the
        trial boot, stopped it. Must cover the boot, SSH and the checks.
    type: int
    default: 600
  watchdog_module:
    description: The watchdog driver to arm (for example C(iTCO_wdt), C(ipmi_watchdog)); default the host's first.
    type: str
  retry_failed:
    description: Try arguments again whose trial boot failed before.
    type: bool
    default: false
  expect_vfio:
    description: PCI addresses that must be on vfio-pci in the trial boot before it is committed.
    type: list
    elements: str
    default: []
  trial_check:
    description:
      - A command (argv, no shell) run on the trial boot; the trial is committed only when it exits 0.
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
  - module: gpuprov.kvm.kernel_cmdline
  - module: gpuprov.kvm.vfio_bind
"""

EXAMPLES = r"""
- name: Arm the trial boot (or commit it, on the trial boot)
  gpuprov.kvm.iommu_boot:
    reboot_allowed: true
  register: iommu

- name: Boot the trial once
  ansible.builtin.reboot:
  when: iommu.reboot == 'trial'

- name: Check and commit (fails naming the arguments when the trial did not come up)
  gpuprov.kvm.iommu_boot:
    reboot_allowed: true
  when: iommu.reboot == 'trial'
"""

RETURN = r"""
stage:
  description:
    - C(converged) (the default has the arguments), C(owed) (a trial is owed, reboots not allowed), C(armed)
      (the trial boots next), C(committed) (the trial passed; the default has them now), C(failed), C(refused).
  returned: always
  type: str
reboot:
  description: C(none), C(trial) (boot the armed trial), C(plain) (the default has them, the kernel not), C(fallback).
  returned: always
  type: str
reboot_required:
  description: The running kernel was not booted with the wanted arguments.
  returned: always
  type: bool
trial_id:
  description: The trial's name (the same arguments are the same trial).
  returned: always
  type: str
trial_args:
  description: The trial entry's whole kernel line.
  returned: always
  type: str
added:
  description: The arguments the default gains.
  returned: always
  type: list
  elements: str
args_before:
  description: The default's arguments before.
  returned: always
  type: str
args_after:
  description: The default's arguments after.
  returned: always
  type: str
bootloader:
  description: grub, bls or systemd-boot, and how it was told.
  returned: always
  type: str
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
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
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import iommu_boot
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import (
    finish,
    finish_failed,
    one_run_at_a_time,
)


def main() -> None:
    module = AnsibleModule(argument_spec=iommu_boot.ARGUMENT_SPEC, supports_check_mode=True, **iommu_boot.RULES)
    p = module.params
    one_run_at_a_time(module, "boot")
    plan, extra = iommu_boot.plan(p)
    if plan.failure:
        finish_failed(module, plan, p["root"], plan.failure, **extra)
    finish(module, plan, p["root"], **extra)


if __name__ == "__main__":
    main()
