"""IOMMU state, kernel command line and loaded modules."""

from __future__ import annotations

from dataclasses import dataclass, field

from .sysfs import Sysfs

# Kernel args that decide IOMMU and vfio behaviour; shown even when absent.
IOMMU_ARGS = (
    "intel_iommu",
    "amd_iommu",
    "iommu",
    "iommu.passthrough",
    "iommu.strict",
    "vfio-pci.ids",
    "vfio_pci.ids",
    "pcie_acs_override",
    "modprobe.blacklist",
    "rd.driver.pre",
    "video",
)
VFIO_MODULES = ("vfio", "vfio_pci", "vfio_pci_core", "vfio_iommu_type1", "mdev", "kvm")


def parse_cmdline(text: str) -> dict[str, str | None]:
    """``a=b c`` -> ``{"a": "b", "c": None}``; the last of a repeated arg wins, as in the kernel."""
    args: dict[str, str | None] = {}
    for token in text.split():
        key, sep, value = token.partition("=")
        args[key] = value if sep else None
    return args


@dataclass
class IommuGroup:
    number: str
    devices: list[str]
    type: str | None  # "DMA", "DMA-FQ", "identity" (iommu=pt), "blocked"...


@dataclass
class IommuState:
    enabled: bool
    units: list[str]  # dmar0, ivhd0, smmu3.0x..., virtio-iommu...
    vendor: str | None  # intel | amd | arm | virtio | None
    cpu_vendor: str | None  # GenuineIntel | AuthenticAMD | ...
    hypervisor: bool  # this host is itself a VM (cpuinfo's hypervisor flag)
    cmdline: str
    args: dict[str, str | None]  # the IOMMU-relevant args present in cmdline
    passthrough: bool | None  # iommu=pt / identity default domain
    interrupt_remapping: str  # supported | unsupported | unknown
    allow_unsafe_interrupts: bool | None
    modules: dict[str, str]  # module -> "loaded" | "builtin"
    groups: dict[str, IommuGroup] = field(default_factory=dict)


def _unit_vendor(units: list[str]) -> str | None:
    for unit in units:
        if unit.startswith("dmar"):
            return "intel"
        if unit.startswith("ivhd"):
            return "amd"
        if "smmu" in unit:
            return "arm"
        if "virtio" in unit:
            return "virtio"
    return None


def _cpu_info(sysfs: Sysfs) -> tuple[str | None, bool]:
    """CPU vendor and whether the hypervisor flag is set, from the first processor."""
    vendor, hypervisor = None, False
    for line in sysfs.read_lines("proc/cpuinfo"):
        key, _sep, value = line.partition(":")
        key = key.strip()
        if key in ("vendor_id", "CPU implementer") and vendor is None:
            vendor = value.strip()
        elif key == "flags":
            hypervisor = "hypervisor" in value.split()
        elif not line.strip() and vendor is not None:
            break  # one processor's block is enough; cpuinfo is long on big hosts
    return vendor, hypervisor


def _interrupt_remapping(sysfs: Sysfs, units: list[str]) -> str:
    # Intel VT-d: extended capability register bit 3 (IR). AMD IOMMUs support it
    # throughout; other units do not expose it in sysfs.
    for unit in units:
        if unit.startswith("dmar"):
            ecap = sysfs.read_int(f"sys/class/iommu/{unit}/intel-iommu/ecap", 16)
            if ecap is not None:
                return "supported" if ecap & 0x8 else "unsupported"
        if unit.startswith("ivhd"):
            return "supported"
    return "unknown"


def _modules(sysfs: Sysfs) -> dict[str, str]:
    loaded = {line.split(" ", 1)[0] for line in sysfs.read_lines("proc/modules")}
    found: dict[str, str] = {}
    for name in VFIO_MODULES:
        if name in loaded:
            found[name] = "loaded"
        elif sysfs.exists(f"sys/module/{name}"):
            # In sys/module but not /proc/modules: built into the kernel, where
            # modprobe.d options do nothing and kernel args are needed instead.
            found[name] = "builtin"
    return found


def read_iommu_groups(sysfs: Sysfs, known: dict[str, list[str]] | None = None) -> dict[str, IommuGroup]:
    """Groups and members. ``known`` (group -> PCI addresses, from each device's
    iommu_group link) saves listing every group; groups no PCI device names
    (mdevs, platform devices) are still listed."""
    known = known or {}
    groups: dict[str, IommuGroup] = {}
    names = sysfs.listdir("sys/kernel/iommu_groups")
    for number in sorted(names, key=lambda n: (len(n), n)):
        base = f"sys/kernel/iommu_groups/{number}"
        members = sorted(known[number]) if number in known else sysfs.listdir(f"{base}/devices")
        groups[number] = IommuGroup(number=number, devices=members, type=sysfs.read(f"{base}/type"))
    return groups


def read_iommu(sysfs: Sysfs, known_groups: dict[str, list[str]] | None = None) -> IommuState:
    units = sysfs.listdir("sys/class/iommu")
    groups = read_iommu_groups(sysfs, known_groups)
    cmdline = sysfs.read("proc/cmdline") or ""
    args = parse_cmdline(cmdline)
    relevant = {k: v for k, v in args.items() if k in IOMMU_ARGS}

    passthrough: bool | None = None
    if args.get("iommu") == "pt" or args.get("iommu.passthrough") in ("1", "y", "on"):
        passthrough = True
    elif groups:
        types = {g.type for g in groups.values() if g.type}
        if types:
            passthrough = types == {"identity"}

    cpu_vendor, hypervisor = _cpu_info(sysfs)
    unsafe = sysfs.read("sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts")
    return IommuState(
        enabled=bool(units) or bool(groups),
        units=units,
        vendor=_unit_vendor(units),
        cpu_vendor=cpu_vendor,
        hypervisor=hypervisor,
        cmdline=cmdline,
        args=relevant,
        passthrough=passthrough,
        interrupt_remapping=_interrupt_remapping(sysfs, units),
        allow_unsafe_interrupts=None if unsafe is None else unsafe in ("Y", "1"),
        modules=_modules(sysfs),
        groups=groups,
    )
