#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module kernel_cmdline: kernel arguments in the bootloader config, by name."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: kernel_cmdline
short_description: Add or remove kernel arguments by name in the bootloader configuration
description:
  - GRUB (Debian, Ubuntu, SUSE, RHEL without grubby) edits one variable of C(/etc/default/grub) argument
    by argument, keeping every other argument, comment and line, then regenerates the menu with
    C(update-grub) or C(grub2-mkconfig). grubby (RHEL family) is given C(--args)/C(--remove-args).
  - Reports RV(reboot_required) by comparing the wanted arguments with C(/proc/cmdline).
  - One run at a time, with M(gpuprov.kvm.iommu_boot) too. The module holds C(/run/gpuprov/boot.lock) while
    it reads and changes the boot (up to 300 s of waiting for another run, then it fails with nothing
    changed).
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  arguments:
    description:
      - Arguments to be present, C(name) or C(name=value); an existing C(name=other) is replaced.
      - Each item is exactly one kernel argument of printable ASCII. A value with spaces or other special
        characters is written in double quotes, C(name="a b"). C($), backquote, backslash, single quote,
        control and non-ASCII characters are refused, and so is anything else that is not one argument
        (docs/reference/kernel-cmdline.md says what and why).
      - (Not C(args), which is a task keyword in Ansible.)
    type: list
    elements: str
    default: []
  remove:
    description: Argument names to be absent (C(name=value) counts by its name); quoted values are removed too.
    type: list
    elements: str
    default: []
  bootloader:
    description: C(auto) takes grubby where it is installed, else GRUB's defaults file.
    type: str
    choices: [auto, grub, grubby]
    default: auto
  variable:
    description:
      - The GRUB variable to edit, C(GRUB_CMDLINE_LINUX_DEFAULT) or C(GRUB_CMDLINE_LINUX) (which also covers
        recovery entries); any other name is refused.
      - The file must assign it once, as a plain quoted value alone on its line; otherwise the module refuses
        and changes nothing.
    type: str
    default: GRUB_CMDLINE_LINUX_DEFAULT
  update:
    description: Regenerate the GRUB menu after a change.
    type: bool
    default: true
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  platform:
    platforms: posix
seealso:
  - module: gpuprov.kvm.vfio_bind
"""

EXAMPLES = r"""
- name: Turn the IOMMU on (Intel) in passthrough mode
  gpuprov.kvm.kernel_cmdline:
    arguments: [intel_iommu=on, iommu=pt]
  register: cmdline

- name: Say when a reboot is owed
  ansible.builtin.debug:
    msg: "reboot required: {{ cmdline.reboot_required }}"

- name: Drop an argument
  gpuprov.kvm.kernel_cmdline:
    remove: [pcie_acs_override]

- name: A value with a space, in the kernel's double-quoted form
  gpuprov.kvm.kernel_cmdline:
    arguments: ['acpi_osi="Windows 2015"']
"""

RETURN = r"""
reboot_required:
  description: The running kernel was not booted with the wanted arguments.
  returned: success
  type: bool
args_before:
  description: The arguments before (the GRUB variable, or grubby's default entry).
  returned: success
  type: str
  sample: quiet splash
args_after:
  description: The arguments after.
  returned: success
  type: str
  sample: quiet splash intel_iommu=on iommu=pt
bootloader:
  description: grub or grubby.
  returned: success
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
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import kernel_cmdline
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import (
    finish,
    one_run_at_a_time,
    refuse_bad_root,
)


def main() -> None:
    module = AnsibleModule(argument_spec=kernel_cmdline.ARGUMENT_SPEC, supports_check_mode=True)
    refuse_bad_root(module, host=False)
    one_run_at_a_time(module, "boot")
    plan, extra = kernel_cmdline.plan(module.params)
    finish(module, plan, module.params["root"], **extra)


if __name__ == "__main__":
    main()
