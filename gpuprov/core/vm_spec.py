"""The VM list's data: what each entry asks for (:class:`VmSpec` and its parts), what the
host keeps (:class:`HostSettings`), and what the host plan says (:class:`Placement`,
:class:`HostPlan`).

Entries become these through :func:`gpuprov.inputs.vm_list.parse_vm` (the input
rules, docs/reference/inputs.md); :func:`gpuprov.plan.vm.fit.plan_host` fills the
host plan. Pure data; standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .plan import Refusal

STATES = ("running", "shutdown", "defined", "absent")
FIRMWARES = ("efi", "bios")
ACCELS = ("kvm", "tcg")
DEFAULT_USER = "gpuadmin"
ROM_DIR = "/var/lib/libvirt/roms"  # where a GPU's ROM file must be on the host
# QEMU's x-nv-gpudirect-clique is 4 bits wide (hw/vfio/pci-quirks.c).
MAX_CLIQUE = 15
# What a drain (docs/guides/rolling.md) may do to a running VM whose host must reboot or rebind its
# GPUs: shut it down (ACPI, waiting; the drain fails if it does not stop), shut it down and power it
# off after the wait, or leave it alone (the drain then refuses the host, naming the VM).
DRAINS = ("shutdown", "force", "keep")

VM_KEYS = (
    "name",
    "state",
    "memory_mib",
    "vcpus",
    "firmware",
    "accel",
    "machine",
    "gpus",
    "vfs",
    "mdevs",
    "numa_node",
    "cpuset",
    "pin",
    "hugepages",
    "hide_kvm",
    "vendor_id",
    "network",
    "mac",
    "disk",
    "cloud_init",
    "boot",
    "autostart",
    "nvlink_clique",
    "drain",
)


@dataclass
class GpuSpec:
    address: str  # full PCI address of the GPU (its other functions join it)
    rom: str | None = None  # "on" | "off" | an absolute path to a ROM file | None: libvirt's default


@dataclass
class VfSpec:
    address: str  # an SR-IOV VF (NVIDIA SR-IOV vGPU on Ampere and later)
    vgpu_type: int | None = None  # NVIDIA vGPU type ID for nvidia/current_vgpu_type


@dataclass
class MdevSpec:
    parent: str  # PCI address, or the parent's name for non-PCI parents (mtty)
    type: str  # mdev_supported_types entry, e.g. nvidia-474
    uuid: str


@dataclass
class DiskSpec:
    base: str | None = None  # the base image the overlay is backed by
    size_gib: int | None = None  # the overlay's virtual size (None: the base's)
    path: str | None = None  # the overlay (None: <storage_dir>/<name>.qcow2)


@dataclass
class CloudInitSpec:
    user: str = DEFAULT_USER
    ssh_authorized_keys: list[str] = field(default_factory=list)
    hostname: str | None = None  # None: the VM's name
    packages: list[str] = field(default_factory=list)


@dataclass
class BootSpec:
    """Direct kernel boot (a kernel and initrd on the host)."""

    kernel: str
    initrd: str | None = None
    cmdline: str | None = None


@dataclass
class VmSpec:
    name: str
    state: str | None = None  # None: the caller's default
    memory_mib: int = 1024
    vcpus: int = 1
    firmware: str = "efi"
    accel: str = "kvm"
    machine: str = "q35"
    gpus: list[GpuSpec] = field(default_factory=list)
    vfs: list[VfSpec] = field(default_factory=list)
    mdevs: list[MdevSpec] = field(default_factory=list)
    numa_node: int | None = None
    cpuset: list[int] | None = None
    pin: bool = True
    hugepages: str = "auto"  # auto | yes | no
    hide_kvm: bool | None = None  # None: on for consumer NVIDIA GPUs
    vendor_id: str | None = None
    network: str | None = "default"
    mac: str | None = None
    disk: DiskSpec | None = None
    cloud_init: CloudInitSpec | None = None
    boot: BootSpec | None = None
    autostart: bool = False
    drain: str = "shutdown"  # one of DRAINS
    nvlink_cliques: list[list[str]] = field(default_factory=list)  # GPU addresses joined by NVLink, per clique

    @property
    def guest_mac(self) -> str:
        """The NIC's MAC: given, or derived from the name (stable across runs)."""
        if self.mac:
            return self.mac
        import hashlib  # here, not at import: OpenSSL's load is a few ms of every run

        digest = hashlib.sha256(self.name.encode()).digest()
        return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


@dataclass
class HostSettings:
    """What the host keeps for itself, and the expert switches."""

    reserved_memory_mib: int | None = None  # None: 10% of RAM, at most 4 GiB
    reserved_cpus: str = "0"  # cpulist kept for the host (and QEMU's own threads); "" keeps none
    mixed_vgpu_types: bool = False  # the GPUs run NVIDIA's mixed-size vGPU mode


@dataclass
class GuestCell:
    """A guest NUMA cell of a VM whose GPUs sit on several host nodes."""

    node: int  # the host node its vCPUs and memory are on
    vcpus: int
    memory_mib: int


@dataclass
class Placement:
    node: int | None  # NUMA node of memory and vCPUs; None: not bound (or split: cells)
    cpus: list[int] | None  # host CPU of each vCPU; None: not pinned
    hugepage_kib: int | None  # page size backing the memory; None: normal pages
    pci_slots: list[list[str]] = field(default_factory=list)  # each GPU: its functions, function 0 first
    hide_kvm: bool = False
    cells: list[GuestCell] = field(default_factory=list)  # guest NUMA cells, vCPUs in cell order; empty: none
    gpu_cells: dict[str, int] = field(default_factory=dict)  # GPU address -> its guest cell
    mmio64_mib: int | None = None  # the guest's 64-bit MMIO window from the BARs; None: none to size

    def as_dict(self) -> dict[str, Any]:
        return {
            "numa_node": self.node,
            "cpus": self.cpus,
            "hugepage_kib": self.hugepage_kib,
            "pci_slots": self.pci_slots,
            "hide_kvm": self.hide_kvm,
            "numa_cells": [{"node": c.node, "vcpus": c.vcpus, "memory_mib": c.memory_mib} for c in self.cells],
            "gpu_cells": dict(self.gpu_cells),
            "mmio64_mib": self.mmio64_mib,
        }


@dataclass
class HostPlan:
    vms: list[VmSpec] = field(default_factory=list)
    placements: dict[str, Placement] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def vm(self, name: str) -> VmSpec | None:
        return next((v for v in self.vms if v.name == name), None)

    def refusal_text(self) -> str:
        return "refused, nothing changed: " + "; ".join(r.describe() for r in self.refusals)


@dataclass(frozen=True)
class ConsoleCheck:
    """A VM's serial console check (gpu_vm's console_checks, run by gpuprov.verify.console): wait until
    ``wait_for`` matches the log (at most ``timeout`` s), then every ``expect``."""

    wait_for: re.Pattern[str]
    timeout: int
    expect: tuple[re.Pattern[str], ...] = ()
