"""The ``gpuprov inspect`` report as plain data (JSON schema v1, see docs/reference/inspect-json.md)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .. import __version__
from ..facts.host import HostFacts
from ..facts.names import class_name
from ..facts.pci import PciDevice
from ..rules.assess import GpuAssessment

SCHEMA = "gpuprov.inspect/v1"
SCHEMA_VERSION = 1


def _hex(value: int | None, width: int) -> str | None:
    return None if value is None else f"{value:0{width}x}"


def pci_device_dict(dev: PciDevice) -> dict[str, Any]:
    return {
        "address": dev.address,
        "vendor_id": _hex(dev.vendor_id, 4),
        "device_id": _hex(dev.device_id, 4),
        "subsystem_vendor_id": _hex(dev.subsystem_vendor_id, 4),
        "subsystem_device_id": _hex(dev.subsystem_device_id, 4),
        "class": _hex(dev.class_code, 6),
        "class_name": class_name(dev.class_code),
        "revision": _hex(dev.revision, 2),
        "vendor_name": dev.vendor_name,
        "device_name": dev.device_name,
        "product_name": dev.product_name,
        "driver": dev.driver,
        "driver_override": dev.driver_override,
        "numa_node": dev.numa_node,
        "local_cpulist": dev.local_cpulist,
        "link": {
            "current_speed": dev.link.current_speed,
            "current_width": dev.link.current_width,
            "max_speed": dev.link.max_speed,
            "max_width": dev.link.max_width,
        },
        "reset_methods": dev.reset_methods,
        "boot_vga": dev.boot_vga,
        "iommu_group": dev.iommu_group,
        "parent": dev.parent,
        "sriov": {
            "total_vfs": dev.sriov_totalvfs,
            "num_vfs": dev.sriov_numvfs,
            "physfn": dev.physfn,
            "virtfns": dev.virtfns,
        },
    }


def gpu_dict(a: GpuAssessment) -> dict[str, Any]:
    return {
        "address": a.address,
        "name": a.name,
        "vendor_device": a.vendor_device,
        "driver": a.driver,
        "iommu_group": a.iommu_group,
        "numa_node": a.numa_node,
        "link": a.link,
        "reset_methods": a.reset_methods,
        "group_members": a.group_members,
        "companions": a.companions,
        "ready": a.ready,
        "intended_use": a.intended_use,
        "declared_as": a.declared_as,
        "state": a.state,
        "findings": [asdict(f) for f in a.findings],
        "vgpu": a.vgpu,
    }


def _instances(facts: HostFacts, gpu: dict[str, Any]) -> dict[str, Any]:
    """The GPU's names and vGPU instances and free capacity, added to what the assessment offers."""
    dev = facts.pci.get(gpu["address"])
    gpu["product_name"] = dev.product_name if dev else None
    gpu["class_name"] = class_name(dev.class_code) if dev else None
    vgpu = gpu["vgpu"]
    if "sriov_vgpu" in vgpu:
        vfs = [facts.vgpu_vfs[v] for v in (dev.virtfns if dev else []) if v in facts.vgpu_vfs]
        names: dict[int, str] = {}
        for vf in vfs:
            names.update(vf.creatable)
        vgpu["sriov_vgpu"]["instances"] = [
            {"vf": vf.address, "type": vf.current_type, "name": names.get(vf.current_type or 0)}
            for vf in sorted(vfs, key=lambda v: v.address)
            if vf.current_type
        ]
        vgpu["sriov_vgpu"]["vfs_free"] = sum(1 for vf in vfs if vf.current_type == 0)
    return gpu


def _mdev_parent(facts: HostFacts, parent: Any) -> dict[str, Any]:
    return {
        "parent": parent.parent,
        "is_pci": parent.parent in facts.pci,
        "types": [asdict(t) for t in parent.types.values()],
        "instances": sum(len(t.instances) for t in parent.types.values()),
    }


def build_report(facts: HostFacts, gpus: list[GpuAssessment]) -> dict[str, Any]:
    iommu = facts.iommu
    usage = facts.usage
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "gpuprov_version": __version__,
        "host": {
            "root": facts.root,
            "kernel": facts.kernel,
            "os": facts.os_name,
            "names_from": facts.names_from,
        },
        "iommu": {
            "enabled": iommu.enabled,
            "units": iommu.units,
            "vendor": iommu.vendor,
            "cpu_vendor": iommu.cpu_vendor,
            "hypervisor": iommu.hypervisor,
            "cmdline": iommu.cmdline,
            "args": iommu.args,
            "passthrough": iommu.passthrough,
            "interrupt_remapping": iommu.interrupt_remapping,
            "allow_unsafe_interrupts": iommu.allow_unsafe_interrupts,
            "modules": iommu.modules,
            "groups": [{"number": g.number, "devices": g.devices, "type": g.type} for g in iommu.groups.values()],
        },
        "pci_devices": [pci_device_dict(d) for d in facts.pci.values()],
        "mdev": {
            "parents": [_mdev_parent(facts, p) for p in facts.mdev_parents.values()],
            "instances": [asdict(m) for m in facts.mdevs],
        },
        "sriov_vgpu": [
            {
                "address": vf.address,
                "current_type": vf.current_type,
                "creatable": {str(k): v for k, v in vf.creatable.items()},
            }
            for vf in facts.vgpu_vfs.values()
        ],
        "numa": [asdict(n) for n in facts.numa],
        "host_needs": {
            "boot_vga": [a for a, d in facts.pci.items() if d.boot_vga],
            "console": usage.console_devices,
            "drm_cards": usage.drm_cards,
            "block": [
                {"name": b.name, "pci_device": b.pci_device, "partition_of": b.partition_of, "uses": b.uses}
                for b in usage.block.values()
            ],
            "net": [
                {
                    "name": n.name,
                    "pci_device": n.pci_device,
                    "addresses": n.addresses,
                    "routes": n.routes,
                    "upper": n.upper,
                }
                for n in usage.net.values()
            ],
            "open_device_files": [asdict(f) for f in usage.open_files],
            "open_files_complete": usage.open_files_complete,
            "missing_evidence": [
                {"evidence": name, "rule": m.rule, "path": m.path, "problem": m.problem, "fix": m.fix}
                for name, m in facts.missing.items()
            ],
        },
        "gpus": [_instances(facts, gpu_dict(a)) for a in gpus],
        "summary": {
            "gpus": len(gpus),
            "ready": sum(1 for a in gpus if a.ready),
            "not_ready": sum(1 for a in gpus if not a.ready),
        },
    }
