"""IOMMU state, kernel command line and loaded modules."""

from __future__ import annotations

from dataclasses import dataclass, field

from .evidence import DISPLAY, GROUPS, MissingEvidence, how_to_read, note
from .pci import group_link_evidence
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
IOMMU_GROUPS = "IOMMU groups"  # the evidence: /sys/kernel/iommu_groups
VFIO_MODULES = ("vfio", "vfio_pci", "vfio_pci_core", "vfio_iommu_type1", "mdev", "kvm")


# What the kernel's isspace() is true for (lib/ctype.c: ASCII whitespace and Latin-1 NBSP).
_KERNEL_SPACE = " \t\n\v\f\r\xa0"


def kernel_split(text: str) -> list[str]:
    """A command line split into arguments as the kernel splits it (lib/cmdline.c next_arg),
    each as written: on spaces, except inside double quotes (``a="b c"`` and ``"a=b c"`` are one)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _KERNEL_SPACE:
            i += 1
        if i == n:
            break
        start, in_quote = i, text[i] == '"'
        i += 1
        while i < n and (in_quote or text[i] not in _KERNEL_SPACE):
            if text[i] == '"':
                in_quote = not in_quote
            i += 1
        out.append(text[start:i])
    return out


def kernel_param(token: str) -> tuple[str, str | None]:
    """(name, value) the kernel makes of one argument of :func:`kernel_split` (next_arg's quote
    stripping, step by step): ``a="b c"`` and ``"a=b c"`` -> ``("a", "b c")``; ``quiet`` -> ``("quiet", None)``."""
    buf = list(token)
    base = 1 if buf[:1] == ['"'] else 0  # a leading quote is skipped
    n = len(buf)

    def cstr(start: int) -> str:
        end = start
        while end < n and buf[end] != "\0":
            end += 1
        return "".join(buf[start:end])

    # The first '=' after the name's first character splits name from value.
    equals = next((k for k in range(base + 1, n) if buf[k] == "="), None)
    value: int | None = None
    if equals is not None:
        buf[equals] = "\0"
        value = equals + 1
        if value < n and buf[value] == '"':
            value += 1
            if buf[n - 1] == '"':
                buf[n - 1] = "\0"
    if base and n > base and buf[n - 1] == '"':
        buf[n - 1] = "\0"
    return cstr(base), None if value is None else cstr(value)


def parse_cmdline(text: str) -> dict[str, str | None]:
    """``a=b c`` -> ``{"a": "b", "c": None}``; the last of a repeated arg wins, as in the kernel."""
    return dict(kernel_param(token) for token in kernel_split(text))


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


def _few(items: list[str], most: int = 4) -> str:
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def read_iommu_groups(
    sysfs: Sysfs,
    known: dict[str, list[str]] | None = None,
    *,
    unplaced: list[str] | None = None,
    missing: MissingEvidence | None = None,
) -> dict[str, IommuGroup]:
    """Groups and members. ``known`` (group -> PCI addresses, from each device's
    iommu_group link) saves listing every group; groups no PCI device names
    (mdevs, platform devices) are still listed. ``unplaced``: PCI devices whose
    group is not known from their link; they could be in any group, so then every
    group's own ``devices/`` listing is needed, and one that cannot be read leaves
    that group's membership unknown."""
    known = known or {}
    groups: dict[str, IommuGroup] = {}
    names = sysfs.try_listdir("sys/kernel/iommu_groups")
    if names is None:
        note(
            missing,
            sysfs,
            IOMMU_GROUPS,
            "sys/kernel/iommu_groups",
            fix=how_to_read(sysfs.live)
            + "; a kernel without IOMMU support shows none: enable the IOMMU (intel_iommu=on, or amd_iommu on AMD)",
            rule=GROUPS,
        )
        return groups
    unplaced = list(unplaced or [])
    listed = set(names)  # a host with thousands of VFs has thousands of groups
    for number, addrs in known.items():
        if number not in listed:
            for addr in addrs:
                note(
                    missing,
                    sysfs,
                    group_link_evidence(addr),
                    f"sys/bus/pci/devices/{addr}/iommu_group",
                    f"its link names group {number}, which /sys/kernel/iommu_groups does not list",
                    devices=(addr,),
                    rule=GROUPS,
                )
                unplaced.append(addr)
    for number in sorted(names, key=lambda n: (len(n), n)):
        base = f"sys/kernel/iommu_groups/{number}"
        members = sorted(known.get(number, []))
        if number not in known or unplaced:
            listing = sysfs.try_listdir(f"{base}/devices")
            if listing is not None:
                members = sorted(set(members) | set(listing))
            elif unplaced:
                note(
                    missing,
                    sysfs,
                    f"members of IOMMU group {number}",
                    f"{base}/devices",
                    f"{_few(sorted(unplaced))} have no readable iommu_group link, and this group's devices/ "
                    f"listing is {'unreadable' if sysfs.exists(f'{base}/devices') else 'absent'}",
                    devices=tuple(members),
                    rule=GROUPS,
                )
        groups[number] = IommuGroup(number=number, devices=members, type=sysfs.read(f"{base}/type"))
    return groups


def read_iommu(
    sysfs: Sysfs,
    known_groups: dict[str, list[str]] | None = None,
    *,
    unplaced: list[str] | None = None,
    missing: MissingEvidence | None = None,
) -> IommuState:
    units = sysfs.listdir("sys/class/iommu")
    groups = read_iommu_groups(sysfs, known_groups, unplaced=unplaced, missing=missing)
    text = sysfs.read("proc/cmdline")
    if text is None:
        # It says which framebuffer carries the console and which disk /dev/root is.
        note(missing, sysfs, "kernel command line", "proc/cmdline", rule=DISPLAY)
    cmdline = text or ""
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
