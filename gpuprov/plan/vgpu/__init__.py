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
:func:`read_host` gathers its inputs (gpuprov.facts.vgpu_inputs) and
gpuprov.apply.vgpu's ``converge`` runs it twice where VFs are enabled first.
Standard library only: ships with the module and runs at boot.

The package, one concern a module: config (the request, entries, derived UUIDs), state (the
saved layout), checks (in use, mixed types), mdev, sriov, mig, scheduler, persistence (saved
layout, boot unit, mdevctl rule), plan (plan_vgpu, plan_host). This file re-exports what the
module, the other planners and the tests use.
"""

from __future__ import annotations

from ...facts.vgpu_inputs import (
    BOOT_PYZ,
    BOOT_SERVICE,
    BOOT_UNIT,
    MDEVCTL_RULE,
    OLD_BOOT_LIB,
    SCHEDULER_CONF,
    STATE_FILE,
    HostInputs,
    read_inputs,
)
from .checks import mixed_types_refusal
from .config import SCHEDULERS, USES, Entry, VgpuPlan, VgpuRequest, derived_uuid, parse_gpus
from .mdev import declared_mdevs, mdev_uuids, mdevctl_definition
from .mig import fit
from .persistence import boot_unit, mdevctl_rule_fix
from .plan import plan_host, plan_vgpu, read_host
from .scheduler import registry_value, running_registry_value, scheduler_conf
from .state import STATE_SCHEMA, Managed, parse_state

__all__ = [
    "BOOT_PYZ",
    "BOOT_SERVICE",
    "BOOT_UNIT",
    "MDEVCTL_RULE",
    "OLD_BOOT_LIB",
    "SCHEDULERS",
    "SCHEDULER_CONF",
    "STATE_FILE",
    "STATE_SCHEMA",
    "USES",
    "Entry",
    "HostInputs",
    "Managed",
    "VgpuPlan",
    "VgpuRequest",
    "boot_unit",
    "declared_mdevs",
    "derived_uuid",
    "fit",
    "mdev_uuids",
    "mdevctl_definition",
    "mdevctl_rule_fix",
    "mixed_types_refusal",
    "parse_gpus",
    "parse_state",
    "plan_host",
    "plan_vgpu",
    "read_host",
    "read_inputs",
    "registry_value",
    "running_registry_value",
    "scheduler_conf",
]
