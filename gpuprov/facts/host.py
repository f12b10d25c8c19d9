"""All facts about one host, gathered through one :class:`Sysfs`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .evidence import GROUPS, MissingEvidence, note
from .iommu import IommuState, read_iommu
from .mdev import MdevInstance, MdevParent, VgpuVf, read_mdev_instances, read_mdev_parents, read_vgpu_vfs
from .names import name_devices
from .numa import NumaNode, parse_cpulist, read_numa
from .pci import PciDevice, read_pci_devices
from .sysfs import Sysfs
from .usage import HostUsage, note_unmapped_open_files, read_usage, referenced_devices


@dataclass
class HostFacts:
    root: str
    kernel: str | None
    os_name: str | None
    pci: dict[str, PciDevice]
    iommu: IommuState
    mdev_parents: dict[str, MdevParent]
    mdevs: list[MdevInstance]
    vgpu_vfs: dict[str, VgpuVf]
    numa: list[NumaNode]
    usage: HostUsage
    names_from: str  # "udev" (its hwdb) | "pci.ids" | "none": gpuprov.facts.names.name_devices
    # Evidence the safety rules need that could not be read (docs/concepts/safety-rules.md).
    missing: MissingEvidence = field(default_factory=dict)

    def slot_functions(self) -> dict[str, list[str]]:
        """Slot (``0000:41:00``) -> its functions' addresses; built once."""
        index = self.__dict__.get("_slots")
        if index is None:
            index = {}
            for addr, dev in self.pci.items():
                index.setdefault(dev.slot, []).append(addr)
            self.__dict__["_slots"] = index
        return index

    def children(self, address: str) -> list[str]:
        """Devices on the bus below bridge or port ``address``; built once."""
        index = self.__dict__.get("_children")
        if index is None:
            index = {}
            for addr, dev in self.pci.items():
                if dev.parent is not None:
                    index.setdefault(dev.parent, []).append(addr)
            self.__dict__["_children"] = index
        return index.get(address, [])

    def group_members(self, address: str) -> list[str]:
        dev = self.pci.get(address)
        if dev is None or dev.iommu_group is None:
            return []
        group = self.iommu.groups.get(dev.iommu_group)
        return group.devices if group else [address]


def _os_name(sysfs: Sysfs) -> str | None:
    for path in ("etc/os-release", "usr/lib/os-release"):
        for line in sysfs.read_lines(path):
            if line.startswith("PRETTY_NAME="):
                return line.split("=", 1)[1].strip().strip('"')
    return None


def cpu_count(facts: HostFacts) -> int | None:
    """One past the host's highest CPU number (None: the host shows no NUMA CPU lists)."""
    cpus = [c for n in facts.numa for c in parse_cpulist(n.cpulist)]
    return max(cpus) + 1 if cpus else None


def gather(sysfs: Sysfs) -> HostFacts:
    """Read every fact inspect, plan and the modules use. Read-only."""
    missing: MissingEvidence = {}
    devices = read_pci_devices(sysfs, missing)
    version = sysfs.read("proc/version")
    groups: dict[str, list[str]] = {}
    for addr, dev in devices.items():
        if dev.iommu_group is not None:
            groups.setdefault(dev.iommu_group, []).append(addr)
    unplaced = [a for a, d in devices.items() if d.iommu_group is None]
    iommu = read_iommu(sysfs, groups, unplaced=unplaced, missing=missing)
    usage = read_usage(sysfs, missing)
    note_unmapped_open_files(sysfs, usage, set(iommu.groups), missing)
    for addr in sorted(referenced_devices(usage) - set(devices)):
        # A disk or NIC on a device the PCI listing lacks: which group holds it is unknown.
        note(missing, sysfs, f"PCI device {addr}", f"sys/bus/pci/devices/{addr}", rule=GROUPS)
    return HostFacts(
        root=sysfs.root,
        kernel=version.split()[2] if version and len(version.split()) > 2 else None,
        os_name=_os_name(sysfs),
        pci=devices,
        iommu=iommu,
        mdev_parents=read_mdev_parents(sysfs),
        mdevs=read_mdev_instances(sysfs),
        vgpu_vfs=read_vgpu_vfs(sysfs, devices),
        numa=read_numa(sysfs, missing),
        usage=usage,
        names_from=name_devices(sysfs, devices),
        missing=missing,
    )
