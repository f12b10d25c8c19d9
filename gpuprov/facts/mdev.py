"""Mediated devices (mdev) and NVIDIA SR-IOV vGPU types.

mdev: ``/sys/class/mdev_bus/<parent>/mdev_supported_types/<type>/`` and
instances under ``/sys/bus/mdev/devices/<uuid>``. NVIDIA vGPU on Ampere and
later (recent drivers) is SR-IOV instead: each VF of the GPU has
``nvidia/creatable_vgpu_types`` ("ID : name" lines) and
``nvidia/current_vgpu_type`` (an ID, 0 when none is set).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .pci import PCI_ADDRESS_RE, PciDevice
from .sysfs import Sysfs

_VGPU_TYPE_LINE = re.compile(r"^\s*(\d+)\s*:\s*(.+?)\s*$")


@dataclass
class MdevType:
    type_id: str  # the directory name, e.g. nvidia-474 or mtty-2
    name: str | None
    description: str | None
    available_instances: int | None
    device_api: str | None
    instances: list[str] = field(default_factory=list)  # UUIDs of existing mdevs


@dataclass
class MdevParent:
    parent: str  # PCI address, or the device name for non-PCI parents (mtty)
    types: dict[str, MdevType]


@dataclass
class MdevInstance:
    uuid: str
    parent: str | None
    type_id: str | None
    driver: str | None
    iommu_group: str | None


@dataclass
class VgpuVf:
    """One SR-IOV VF of an NVIDIA GPU, with the vGPU types it can take now."""

    address: str
    creatable: dict[int, str]  # type ID -> name
    current_type: int | None  # None: unreadable; 0: none set


def parse_vgpu_types(text: str | None) -> dict[int, str]:
    """``nvidia/creatable_vgpu_types``: a header line, then ``ID : name`` lines."""
    types: dict[int, str] = {}
    for line in (text or "").splitlines():
        m = _VGPU_TYPE_LINE.match(line)
        if m:
            types[int(m.group(1))] = m.group(2)
    return types


def _parent_name(sysfs: Sysfs, entry: str) -> str:
    # mdev_bus entries are links to the parent device; a PCI parent is named by
    # its address, others (the mtty sample) by their own name.
    real = sysfs.resolve(f"sys/class/mdev_bus/{entry}")
    last = real.rsplit("/", 1)[-1]
    return last if last else entry


def read_mdev_parents(sysfs: Sysfs) -> dict[str, MdevParent]:
    parents: dict[str, MdevParent] = {}
    for entry in sysfs.listdir("sys/class/mdev_bus"):
        base = f"sys/class/mdev_bus/{entry}/mdev_supported_types"
        types: dict[str, MdevType] = {}
        for type_id in sysfs.listdir(base):
            tbase = f"{base}/{type_id}"
            types[type_id] = MdevType(
                type_id=type_id,
                name=sysfs.read(f"{tbase}/name"),
                description=sysfs.read(f"{tbase}/description"),
                available_instances=sysfs.read_int(f"{tbase}/available_instances", 10),
                device_api=sysfs.read(f"{tbase}/device_api"),
                instances=sysfs.listdir(f"{tbase}/devices"),
            )
        name = _parent_name(sysfs, entry)
        parents[name] = MdevParent(parent=name, types=types)
    return parents


def read_mdev_instances(sysfs: Sysfs) -> list[MdevInstance]:
    instances: list[MdevInstance] = []
    for uuid in sysfs.listdir("sys/bus/mdev/devices"):
        real = sysfs.resolve(f"sys/bus/mdev/devices/{uuid}")
        parent_dir = real.rsplit("/", 2)[-2] if real.count("/") >= 1 else None
        instances.append(
            MdevInstance(
                uuid=uuid,
                parent=parent_dir,
                type_id=sysfs.link_name(f"{real}/mdev_type"),
                driver=sysfs.link_name(f"{real}/driver"),
                iommu_group=sysfs.link_name(f"{real}/iommu_group"),
            )
        )
    return instances


def read_vgpu_vfs(sysfs: Sysfs, devices: dict[str, PciDevice]) -> dict[str, VgpuVf]:
    """NVIDIA SR-IOV vGPU state of every VF (and PF) that exposes it."""
    vfs: dict[str, VgpuVf] = {}
    for address, dev in devices.items():
        if dev.vendor_id != 0x10DE or not PCI_ADDRESS_RE.match(address):
            continue
        base = f"{dev.sysfs_path}/nvidia"
        creatable = sysfs.read(f"{base}/creatable_vgpu_types")
        current = sysfs.read(f"{base}/current_vgpu_type")
        if creatable is None and current is None:
            continue
        current_id: int | None
        try:
            current_id = int(current) if current is not None else None
        except ValueError:
            current_id = None
        vfs[address] = VgpuVf(address=address, creatable=parse_vgpu_types(creatable), current_type=current_id)
    return vfs
