#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_vm_host: what a host needs to run gpu_vm's VMs, installed and running."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_vm_host
short_description: Install what a GPU host's VMs need (libvirt, QEMU, UEFI firmware...) and run libvirt
description:
  - Makes the host ready for M(gpuprov.kvm.gpu_vm) in one module run, reading rather than asking Ansible's
    C(setup), C(package) and C(service) modules - a converged host plans nothing.
  - The OS family comes from C(/etc/os-release) (Debian and Ubuntu, or the RHEL family); the packages are that
    family's list (libvirt's daemon with its QEMU driver, QEMU, UEFI firmware, qemu-img, an ISO tool, dnsmasq)
    or O(packages), plus C(python3-libvirt) when the module runs with the system Python.
  - Which are installed comes from dpkg's status file (read as a file) or C(rpm --query); only the missing ones
    are installed (C(apt-get install), C(dnf install)). Unknown (an RPM host's staged root) counts as missing.
  - Under systemd (C(/run/systemd/system)), the libvirt units (Debian C(libvirtd.service); EL the modular
    daemons' sockets) that are not active and enabled (one C(systemctl show)) get C(systemctl enable --now).
    Without systemd libvirt is the caller's.
  - Refuses, changing nothing, on a host of an unknown OS family without O(packages), or a package name apt or
    dnf would not take.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  packages:
    description: The packages to install instead of the OS family's list (empty - that list).
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
  - module: gpuprov.kvm.gpu_vm
"""

EXAMPLES = r"""
- name: Install libvirt, QEMU and what the VMs need where missing, and run libvirt
  gpuprov.kvm.gpu_vm_host:

- name: What a captured host lacks (check mode)
  gpuprov.kvm.gpu_vm_host:
    root: /srv/captures/node07
  check_mode: true
"""

RETURN = r"""
os_family:
  description: The host's OS family (debian or redhat), null when /etc/os-release names neither.
  returned: always
  type: str
packages:
  description: The packages the VMs need on this host.
  returned: success
  type: list
  elements: str
missing:
  description: Those not installed (all of them when the package manager could not say).
  returned: success
  type: list
  elements: str
services:
  description: The libvirt units not active and enabled (null without systemd).
  returned: success
  type: list
  elements: str
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
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_vm_host
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import finish, refuse_bad_root


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_vm_host.ARGUMENT_SPEC, supports_check_mode=True)
    refuse_bad_root(module, host=False)  # it reads the package and service state, not sys/
    plan = gpu_vm_host.plan(module.params)
    finish(module, plan, module.params["root"], **plan.result())


if __name__ == "__main__":
    main()
