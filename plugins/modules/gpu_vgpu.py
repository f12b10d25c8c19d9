#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module gpu_vgpu: the vGPU instances each GPU offers (mdev, SR-IOV vGPU, MIG), now and from boot."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_vgpu
short_description: Give each GPU its vGPU instances (mdevs, NVIDIA SR-IOV vGPU types, MIG layouts), now and from boot
description:
  - Takes the inventory's C(gpuprov_gpus) mapping, keyed by GPU PCI address (or, for a non-PCI mdev parent such
    as the kernel's C(mtty) sample, the parent's name), and makes each GPU offer what its entry declares.
    Entries with C(use) C(passthrough) or C(host) are left to other roles.
  - C(use=mdev) with C(mdevs), a list of C(type) (the type directory name, C(nvidia-259), or its name,
    C(GRID V100-8Q)) and an optional C(uuid) creates the mdevs through sysfs and persists each as an mdevctl
    definition C(/etc/mdevctl.d/PARENT/UUID) that mdevctl starts when the parent appears at boot. A missing
    C(uuid) is derived from parent, type and rank, the same on every run.
  - C(use=sriov_vgpu) with C(vgpus), a list of C(type) (name or numeric ID) and an optional C(vf) (a VF address)
    enables the GPU's SR-IOV VFs (C(sriov-manage -e)), then writes each type ID to its VF's
    C(nvidia/current_vgpu_type). Entry N takes VF number N unless pinned.
  - C(use=mig) with C(mig), a list of MIG profiles (C(3g.40gb)) or a mapping of profile to count, creates the GPU
    instances with a default compute instance each (C(nvidia-smi mig -cgi IDS -C)), destroying those that do not
    fit the layout. MIG mode itself is only switched on with O(allow_mig_mode_change).
  - VF types and MIG instances do not survive a reboot; the layout is saved in C(/etc/gpuprov/vgpu.json) and the
    boot unit C(gpuprov-vgpu.service) re-applies it with the same planner, installed as
    C(/usr/lib/gpuprov/gpuprov-vgpu.pyz) (the role C(gpuprov.kvm.vgpu_host) copies it there when RV(runner) says
    it is missing or differs). Where SR-IOV or MIG entries need that unit and the file is missing, the module
    warns (O(persistent=false) skips it).
    A planner copy earlier versions wrote under C(/usr/lib/gpuprov/gpuprov) is removed.
  - Refuses, changing nothing, on a malformed address, UUID or entry, an unknown C(use) or key, an absent parent or
    GPU, a type the parent or VF does not offer, more mdevs than C(available_instances), mixed vGPU types on an
    NVIDIA GPU (unless O(mixed_vgpu_types)), SR-IOV on a GPU without VFs, an unknown MIG profile or a layout that
    does not fit, MIG mode off, and removing or changing an instance a running domain or process uses.
  - Every option and every value in O(gpus) is checked first (real booleans and numbers, quoted PCI addresses,
    canonical UUIDs, type names without C(/), at most 7 instances of a MIG profile); every problem is reported
    at once in RV(refusals), before anything is read or changed. See docs/reference/inputs.md.
  - Only instances this module made (recorded in the saved layout) are removed when the config drops them; with
    O(prune), any instance on a declared GPU the config does not name goes too.
  - Runtime sysfs writes and commands run only when O(root) is C(/); against another root the files are written
    below it and the rest is reported in RV(not_run).
version_added: "0.1.0"
author: gpuprov contributors (@gpuprov)
options:
  gpus:
    description:
      - The C(gpuprov_gpus) mapping, keyed by full PCI address (C(0000:41:00.0)) or mdev parent name.
      - Each value has C(use) (C(passthrough), C(host), C(mdev), C(sriov_vgpu) or C(mig)) and the key that use takes
        (C(mdevs), C(vgpus) or C(mig)).
      - Neither O(gpus) nor O(host) is the empty mapping.
    type: dict
  host:
    description:
      - The host's declaration, C(gpuprov_host) (docs/reference/host-model.md), instead of O(gpus). It is resolved in
        this module run from the facts the module reads anyway, exactly as M(gpuprov.kvm.gpu_host_model) resolves it
        (refused the same way), and its GPUs' layout is what the module brings about (role vgpu_host passes the
        declaration whenever there is one, so M(gpuprov.kvm.gpu_host_plan) can plan the same call ahead).
    type: dict
  layouts:
    description: With O(host), the named vGPU layouts, C(gpuprov_layouts) (docs/reference/formats.md).
    type: dict
  scheduler:
    description:
      - NVIDIA vGPU scheduler for time-sliced vGPUs, written to C(/etc/modprobe.d/gpuprov-vgpu-scheduler.conf)
        as C(options nvidia NVreg_RegistryDwords="RmPVMRL=...") (0x00, 0x01 or 0x11). Read when the nvidia module
        loads; RV(reboot_required) says when the loaded module runs another policy.
      - Unset leaves the file alone.
    type: str
    choices: [best_effort, equal_share, fixed_share]
  scheduler_timeslice_ms:
    description: Time slice of equal_share or fixed_share, 1 to 30 ms (RmPVMRL=0x00TT0001 or 0x00TT0011).
    type: int
  mixed_vgpu_types:
    description:
      - The GPUs run NVIDIA's mixed-size vGPU mode, so one GPU may hold time-sliced vGPUs of several types.
      - Unset, the declaration's setting with O(host), else false.
    type: bool
  persistent:
    description: Write the mdevctl definitions, the saved layout and the boot unit.
    type: bool
    default: true
  prune:
    description: Also remove instances on the declared GPUs that the config does not name, whoever made them.
    type: bool
    default: false
  allow_mig_mode_change:
    description:
      - May switch MIG mode on (C(nvidia-smi -i N -mig 1)) for a C(use=mig) GPU where it is off. It takes effect
        after a GPU reset or a reboot, run again afterwards to create the instances.
    type: bool
    default: false
  install_mdevctl:
    description:
      - Where an C(mdev) entry is declared and mdevctl is missing (neither its binary nor the package manager's
        status shows it), install it first (C(apt-get install mdevctl), C(dnf install mdevctl)), a command of the
        plan run before the rest, which is then planned again. Installed, nothing runs (no package module call).
    type: bool
    default: false
  runner_sha256:
    description:
      - The sha256 of the boot runner the caller would install as C(/usr/lib/gpuprov/gpuprov-vgpu.pyz) (the role
        C(gpuprov.kvm.vgpu_host) gives its C(files/gpuprov-vgpu.pyz.sha256)). RV(runner) then says whether the
        installed one is it, so the caller copies it only when it is not.
    type: str
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  platform:
    platforms: posix
notes:
  - Where the VFs of a GPU are not enabled yet, their types are checked and set in a second pass once the VFs exist.
seealso:
  - module: gpuprov.kvm.vfio_bind
  - module: gpuprov.kvm.gpu_host_facts
"""

EXAMPLES = r"""
- name: Two mtty mdevs (the kernel's sample parent), one with a fixed UUID
  gpuprov.kvm.gpu_vgpu:
    gpus:
      mtty:
        use: mdev
        mdevs:
          - {type: mtty-2, uuid: 5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01}
          - {type: "Single port serial"}

- name: Everything from the inventory, with the equal-share scheduler
  gpuprov.kvm.gpu_vgpu:
    gpus: "{{ gpuprov_gpus }}"
    scheduler: equal_share

- name: What would change on a captured host
  gpuprov.kvm.gpu_vgpu:
    gpus:
      "0000:c1:00.0": {use: sriov_vgpu, vgpus: [{type: "NVIDIA A100-4C"}, {type: "NVIDIA A100-4C"}]}
      "0000:e1:00.0": {use: mig, mig: {"1g.10gb": 7}}
    root: /srv/captures/node07
  check_mode: true
"""

RETURN = r"""
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
  sample:
    - write '5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01' to /sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create (...)
mdevs:
  description: Each declared mdev with its UUID and what happens to it (created, present).
  returned: success
  type: list
  elements: dict
  sample: [{"parent": "mtty", "type": "mtty-2", "name": "Dual port serial", "uuid": "5e2bb1d2-...", "state": "created"}]
created:
  description: UUIDs of the mdevs created.
  returned: success
  type: list
  elements: str
removed:
  description: UUIDs of the mdevs removed (made by gpuprov and no longer declared, or pruned).
  returned: success
  type: list
  elements: str
vgpus:
  description: Each declared SR-IOV vGPU with its VF and type ID (state set, present, or pending until the VFs exist).
  returned: success
  type: list
  elements: dict
  sample: [{"pf": "0000:c1:00.0", "vf": "0000:c1:00.4", "type": 557, "name": "NVIDIA A100-4C", "state": "set"}]
cleared_vfs:
  description: VFs whose vGPU type was cleared (set by gpuprov and no longer declared, or pruned).
  returned: success
  type: list
  elements: dict
mig:
  description: Per MIG GPU, its nvidia-smi index, the layout, the profiles created and the GPU instances destroyed.
  returned: success
  type: dict
  sample: {"0000:e1:00.0": {"index": 3, "profiles": ["3g.40gb"], "created": ["3g.40gb"], "destroyed": []}}
reboot_required:
  description: The loaded nvidia module runs another scheduler than the one written, or MIG mode was switched on.
  returned: success
  type: bool
scheduler:
  description: The scheduling policy written (policy, RmPVMRL value, file), or null when not managed.
  returned: success
  type: dict
runner:
  description:
    - C(current) when the installed boot runner has O(runner_sha256), C(install) when it is missing or differs,
      null when no entry needs the boot unit or O(runner_sha256) is not given.
  returned: success
  type: str
first_pass:
  description: What the first pass did where mdevctl was installed or VFs had to be enabled before their types could
    be set.
  returned: when mdevctl was installed or VFs were enabled
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
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules import gpu_vgpu
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import finish
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.gpu_host_model import resolve_or_refuse


def main() -> None:
    module = AnsibleModule(argument_spec=gpu_vgpu.ARGUMENT_SPEC, supports_check_mode=True, **gpu_vgpu.RULES)
    gpu_vgpu.refuse_options(module)
    plan, request = gpu_vgpu.plan(module.params, lambda doc, facts: resolve_or_refuse(module, doc, facts))
    plan, extra = gpu_vgpu.carry_first_pass(module, plan, request)
    finish(module, plan, module.params["root"], **extra)


if __name__ == "__main__":
    main()
