"""Plan the vGPU instances each GPU offers: mdevs, NVIDIA SR-IOV vGPU types, MIG layouts.

The config is the inventory's ``gpuprov_gpus``, keyed by GPU PCI address (or,
for a non-PCI mdev parent such as the kernel's ``mtty`` sample, the parent's
name in ``/sys/class/mdev_bus``)::

    "0000:81:00.0": {use: mdev, mdevs: [{type: nvidia-259, uuid: ...}, {type: "GRID V100-8Q"}]}
    "0000:c1:00.0": {use: sriov_vgpu, vgpus: [{type: "NVIDIA A100-4C"}, {type: 557, vf: "0000:c1:00.5"}]}
    "0000:e1:00.0": {use: mig, mig: ["3g.40gb", "2g.20gb"]}      # or {"1g.10gb": 7}

``use: passthrough`` and ``use: host`` entries belong to other roles and are
skipped. Three mechanisms:

- **mdev** (pre-Ampere NVIDIA vGPU, any mdev parent): an instance is created by
  writing its UUID to ``mdev_supported_types/<type>/create`` and removed by
  writing 1 to ``/sys/bus/mdev/devices/<uuid>/remove``; it persists as an
  mdevctl definition ``/etc/mdevctl.d/<parent>/<uuid>``, which mdevctl's udev
  rule starts when the parent appears at boot. A UUID not given is derived
  (uuid5 of parent, type and the entry's rank among that type's entries), the
  same on every run, so a VM keeps its vGPU.
- **SR-IOV vGPU** (NVIDIA Ampere and later): the VFs are enabled
  (``/usr/lib/nvidia/sriov-manage -e``, else ``sriov_numvfs``), then each VF gets
  its type ID in ``nvidia/current_vgpu_type`` (0 clears it). Entry *i* takes VF
  number *i* unless pinned with ``vf``.
- **MIG**: GPU instances with a default compute instance each
  (``nvidia-smi mig -cgi IDS -C``), destroyed with ``-dci``/``-dgi``; MIG mode itself
  is only switched with an explicit ``allow_mig_mode_change``.

VF types and MIG instances do not survive a reboot: the layout is saved in
``/etc/gpuprov/vgpu.json`` and the boot unit ``gpuprov-vgpu.service`` re-applies
it with this same planner, installed as the zipapp ``/usr/lib/gpuprov/gpuprov-vgpu.pyz``
(gpuprov.apply.vgpu's entry point; the role vgpu_host installs it). The same file records
what gpuprov made: an instance is removed only when gpuprov made it and the
config no longer names it, or, with ``prune``, when it sits on a declared GPU
the config does not name. Removing or changing an instance a running domain
uses (its ``/dev/vfio`` group held open, or named by a running domain's XML
under ``/run/libvirt/qemu``) is refused.

:func:`plan_vgpu` is pure (facts and file texts in, a :class:`VgpuPlan` out);
gpuprov.apply.vgpu's ``read_host`` gathers its inputs (gpuprov.facts.vgpu_inputs) and its
``converge`` runs it twice where VFs are enabled first.
Standard library only: ships with the module and runs at boot.

The package, one concern a module (the request, its entries and derived UUIDs are
gpuprov.inputs.vgpu_request): state (the saved layout), checks (in use, mixed types), mdev,
sriov, mig, scheduler, persistence (saved layout, boot unit, mdevctl rule), plan (plan_vgpu). This file offers what the
command line and the tests use, each imported from its submodule on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

# What the package offers the command line and the tests, and the submodule each comes from:
# imported on first use (PEP 562). Package code imports the submodules themselves, so that a
# module needing one part (model.resolve: the mdev UUIDs) does not import every vGPU planner: an
# Ansible module run compiles and runs all it imports (issue #14).
EXPORTS = {
    "BOOT_PYZ": "...facts.vgpu_inputs",
    "BOOT_SERVICE": "...facts.vgpu_inputs",
    "BOOT_UNIT": "...facts.vgpu_inputs",
    "MDEVCTL_RULE": "...facts.vgpu_inputs",
    "OLD_BOOT_LIB": "...facts.vgpu_inputs",
    "SCHEDULER_CONF": "...facts.vgpu_inputs",
    "STATE_FILE": "...facts.vgpu_inputs",
    "HostInputs": "...facts.vgpu_inputs",
    "read_inputs": "...facts.vgpu_inputs",
    "mixed_types_refusal": ".checks",
    "SCHEDULERS": "...inputs.vgpu_request",
    "USES": "...inputs.vgpu_request",
    "Entry": "...inputs.vgpu_request",
    "VgpuPlan": "...inputs.vgpu_request",
    "VgpuRequest": "...inputs.vgpu_request",
    "derived_uuid": "...inputs.vgpu_request",
    "parse_gpus": "...inputs.vgpu_request",
    "declared_mdevs": ".mdev",
    "mdev_uuids": ".mdev",
    "mdevctl_definition": ".mdev",
    "fit": ".mig",
    "boot_unit": ".persistence",
    "mdevctl_rule_fix": ".persistence",
    "plan_vgpu": ".plan",
    "registry_value": ".scheduler",
    "running_registry_value": ".scheduler",
    "scheduler_conf": ".scheduler",
    "STATE_SCHEMA": ".state",
    "Managed": ".state",
    "parse_state": ".state",
}
__all__ = sorted(EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(EXPORTS[name], __name__), name)
    globals()[name] = value
    return value
