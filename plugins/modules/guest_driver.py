#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module guest_driver: the NVIDIA driver of a GPU guest; a working one is left alone."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_driver
short_description: The NVIDIA driver in a GPU guest - leave a working one alone, install a missing one
description:
  - Reads the driver's state (the loaded module's version, the user-space libraries' version from their file
    names, dpkg's status file read as a file, NVIDIA's C(.run) installer's traces, the distribution) and plans.
  - A working driver - the module loaded, the libraries of the same version, the branch asked for (if any)
    loaded - is left alone whatever installed it (distribution packages, NVIDIA's C(.run), a vendor image);
    the task changes nothing.
  - The module and the libraries at different versions (an update since boot) is a pending reboot
    (RV(reboot_reasons)), never a reinstall.
  - A driver of another branch, or a loaded module whose libraries cannot be found, is refused, naming what is
    installed; with O(replace_other_driver) the plan removes it first (its packages, or NVIDIA's uninstaller)
    and RV(removes) says what; a driver installed neither way is refused even then.
  - A missing driver is installed as the distribution does it - Ubuntu C(ubuntu-drivers install --gpgpu) or
    C(nvidia-driver-BRANCH-server(-open)), Debian's non-free C(nvidia-driver), the RHEL family's from NVIDIA's
    CUDA repository - with the running kernel's headers (DKMS), nouveau blacklisted (and the initramfs rebuilt
    when that file changes), then C(modprobe nvidia).
  - Package managers run as commands; check mode needs no python3-apt.
  - One run at a time, with M(gpuprov.kvm.guest_toolkit) (both run the package manager). The module holds
    C(/run/gpuprov/packages.lock) while it reads and changes the guest, waiting up to 300 s for another run (one
    whose play was killed goes on on the guest); past that it fails, naming the holder, with nothing changed.
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  branch:
    description: The driver branch (C(580)); empty for the distribution's choice. Debian refuses one.
    type: str
    default: ""
  flavor:
    description: NVIDIA's open GPU kernel modules or the proprietary ones, for a driver this installs.
    type: str
    choices: [open, proprietary]
    default: open
  replace_other_driver:
    description: Remove a working driver of another branch (or one without libraries) and install this one.
    type: bool
    default: false
  blacklist_nouveau:
    description: Blacklist nouveau (modprobe.d and the initramfs) when a driver is installed or loaded here.
    type: bool
    default: true
  vgpu:
    description:
      - C(auto) (a vGPU when O(vgpu_package) is given or the running driver reports one), C(true) or C(false).
      - For a vGPU only the prerequisites are installed (headers, DKMS, compilers); NVIDIA's vGPU guest driver
        comes from a file the role C(gpuprov.kvm.guest_nvidia_driver) installs.
    type: str
    choices: [auto, "true", "false"]
    default: auto
  vgpu_package:
    description:
      - The vGPU guest driver's file name; only whether it is given counts (O(vgpu=auto) takes the guest as a vGPU
        guest; O(vgpu=true) without it and without a running vGPU driver is refused).
    type: str
    default: ""
  rhel_repo_name:
    description: The id of NVIDIA's CUDA repository on the RHEL family.
    type: str
    default: cuda-rhel
  rhel_repo_url:
    description: NVIDIA's CUDA repository for this release and architecture (RHEL family).
    type: str
    default: ""
  rhel_repo_gpgkey:
    description: The repository's signing key URL (RHEL family).
    type: str
    default: ""
  rhel_epel:
    description: Install EPEL first (DKMS comes from there) on the RHEL family.
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
  - module: gpuprov.kvm.gpu_verify
"""

EXAMPLES = r"""
- name: The distribution's driver, unless a working one is there
  gpuprov.kvm.guest_driver:

- name: Branch 580, replacing another branch if one is installed
  gpuprov.kvm.guest_driver:
    branch: "580"
    replace_other_driver: true

- name: What it would do on a captured guest
  gpuprov.kvm.guest_driver:
    root: /srv/captures/guest07
  check_mode: true
"""

RETURN = r"""
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
  sample:
    - run env DEBIAN_FRONTEND=noninteractive apt-get update (refresh apt's lists)
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
verdict:
  description: C(working), C(reboot) (module and libraries differ), C(other), C(installed) (not loaded) or C(missing).
  returned: always
  type: str
  sample: working
installed:
  description: What is installed, in words.
  returned: always
  type: str
  sample: NVIDIA driver 580.159.04 (loaded), installed by NVIDIA's .run installer (/usr/bin/nvidia-installer)
reboot_reasons:
  description: Why a reboot is pending (empty when none is).
  returned: always
  type: list
  elements: str
removes:
  description: What the plan removes first (O(replace_other_driver)).
  returned: always
  type: list
  elements: str
vgpu:
  description: Whether this guest is taken as a vGPU guest.
  returned: always
  type: bool
driver:
  description: The facts the plan came from.
  returned: always
  type: dict
  sample:
    loaded: true
    version: 580.159.04
    library_version: 580.159.04
    source: unknown
    packages: []
    run_installer: null
    nouveau: false
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import guest_driver
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import (
    finish,
    one_run_at_a_time,
    refuse_bad_root,
)


def main() -> None:
    module = AnsibleModule(argument_spec=guest_driver.ARGUMENT_SPEC, supports_check_mode=True)
    refuse_bad_root(module)
    one_run_at_a_time(module, "packages")
    plan, extra = guest_driver.plan(module)
    finish(module, plan, module.params["root"], **extra)


if __name__ == "__main__":
    main()
