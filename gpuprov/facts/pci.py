"""PCI devices as the kernel shows them under /sys/bus/pci/devices."""

from __future__ import annotations

import re
import stat
from collections.abc import Collection
from dataclasses import dataclass, field

from .evidence import CHIPSET, DISPLAY, GROUPS, MissingEvidence, note
from .sysfs import Sysfs, parse_int

PCI_DEVICES = "sys/bus/pci/devices"

# Full address: domain:bus:slot.function, as the kernel names devices. Domains
# are 4 hex digits, or more behind Intel VMD (10000:e1:00.0).
PCI_ADDRESS_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
_SHORT_ADDRESS_RE = re.compile(r"^[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")
# A device's iommu_group link, as the kernel writes it: .../kernel/iommu_groups/N
_GROUP_LINK_RE = re.compile(r"(?:^|/)kernel/iommu_groups/([0-9]+)/?$")
# Classes whose devices have a boot_vga attribute (the kernel's pci_is_vga()).
VGA_CLASSES = (0x0300, 0x0001)


# struct resource flags the kernel writes in a PCI device's `resource` file (include/linux/ioport.h).
IORESOURCE_MEM = 0x00000200
IORESOURCE_PREFETCH = 0x00002000
IORESOURCE_MEM_64 = 0x00100000
# The ``resource`` file's first lines are the standard BARs 0-5 (then the ROM, the
# SR-IOV VF BARs and bridge windows: not what a guest maps for this function).
PCI_STD_BARS = 6
# A BAR the kernel did not assign, as it writes it (64-bit: "0x%016llx 0x%016llx 0x%016llx").
_UNASSIGNED = " ".join(["0x0000000000000000"] * 3)


@dataclass(frozen=True)
class PciBar:
    """One standard BAR the kernel assigned: its index, size in bytes and resource flags."""

    index: int
    size: int
    flags: int

    @property
    def memory(self) -> bool:
        return bool(self.flags & IORESOURCE_MEM)

    @property
    def mem64_prefetchable(self) -> bool:
        """A 64-bit prefetchable memory BAR: what firmware maps above 4 GiB (a GPU's VRAM/BAR1)."""
        want = IORESOURCE_MEM | IORESOURCE_PREFETCH | IORESOURCE_MEM_64
        return self.flags & want == want


def bar_lines(text: str | None) -> list[PciBar | None]:
    """The standard BAR lines of a ``resource`` file ("start end flags" in hex): a
    :class:`PciBar` per assigned BAR, None per line that does not read; unassigned
    BARs (all zero) are left out."""
    out: list[PciBar | None] = []
    for index, line in enumerate((text or "").splitlines()[:PCI_STD_BARS]):
        if line == _UNASSIGNED:
            continue  # most of them, on thousands of devices: no parsing
        parts = line.split()
        values = [parse_int(p, 16) for p in parts] if len(parts) == 3 else []
        if len(values) != 3 or None in values:
            out.append(None)
            continue
        start, end, flags = values  # type: ignore[misc]
        if start == end == 0:
            continue
        out.append(PciBar(index=index, size=end - start + 1, flags=flags) if end > start else None)
    return out


def parse_bars(text: str | None) -> list[PciBar] | None:
    """A device's standard BARs, or None (unknown) when the file is missing, short or any
    BAR line does not read: a window sized from half the BARs is too small (fail closed)."""
    if text is None or len(text.splitlines()) < PCI_STD_BARS:
        return None
    lines = bar_lines(text)
    if any(region is None for region in lines):
        return None
    return [region for region in lines if region is not None]


class PciAddressError(ValueError):
    """A PCI address that is malformed; the message says what is expected."""


def normalize_address(text: str) -> str:
    """``0000:41:00.0`` from ``41:00.0`` or ``0000:41:00.0`` (any case).

    Raises :class:`PciAddressError` with a message naming the expected form.
    """
    value = text.strip().lower()
    if _SHORT_ADDRESS_RE.match(value):
        value = "0000:" + value
    if not PCI_ADDRESS_RE.match(value):
        raise PciAddressError(
            f"'{text}' is not a PCI address: use the full form DOMAIN:BUS:SLOT.FUNCTION, "
            "e.g. 0000:41:00.0 (see `lspci -D`)"
        )
    return value


@dataclass
class PciLink:
    """PCIe link state; speeds in GT/s. ``None`` where the kernel shows none."""

    current_speed: float | None = None
    current_width: int | None = None
    max_speed: float | None = None
    max_width: int | None = None

    @property
    def known(self) -> bool:
        return self.max_speed is not None or self.max_width is not None

    @property
    def degraded(self) -> bool:
        """Running below its maximum speed or width."""
        speed_low = (
            self.current_speed is not None and self.max_speed is not None and self.current_speed < self.max_speed
        )
        width_low = (
            self.current_width is not None and self.max_width is not None and self.current_width < self.max_width
        )
        return speed_low or width_low

    def describe(self) -> str:
        if not self.known:
            return "no PCIe link"

        def one(speed: float | None, width: int | None) -> str:
            s = "?" if speed is None else f"{speed:g} GT/s"
            w = "?" if width is None else f"x{width}"
            return f"{s} {w}"

        current = one(self.current_speed, self.current_width)
        top = one(self.max_speed, self.max_width)
        return f"{current} (= max)" if current == top else f"{current} (max {top})"


@dataclass
class PciDevice:
    address: str
    vendor_id: int | None
    device_id: int | None
    subsystem_vendor_id: int | None
    subsystem_device_id: int | None
    class_code: int | None  # 24 bits: base class, subclass, prog-if
    revision: int | None
    driver: str | None
    driver_override: str | None
    numa_node: int | None
    local_cpulist: str | None
    link: PciLink
    reset_methods: list[str] | None  # None: the kernel does not say (no reset_method file)
    boot_vga: bool
    iommu_group: str | None
    parent: str | None  # the upstream PCI device (bridge/port), None at a root bus
    sysfs_path: str  # root-relative canonical path
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    physfn: str | None = None
    virtfns: list[str] = field(default_factory=list)
    vendor_name: str | None = None
    device_name: str | None = None
    product_name: str | None = None  # the driver's own name for it (NVIDIA's: nvidia-smi's), gpuprov.facts.names
    bars: list[PciBar] | None = None  # None: unknown (no readable resource file)

    @property
    def base_class(self) -> int | None:
        return None if self.class_code is None else self.class_code >> 16

    @property
    def class_prefix(self) -> int | None:
        """Base class + subclass, e.g. 0x0403 for an HD audio function."""
        return None if self.class_code is None else self.class_code >> 8

    @property
    def is_bridge(self) -> bool:
        return self.base_class == 0x06

    @property
    def is_pci_bridge(self) -> bool:
        """A PCI-to-PCI bridge or PCIe port (0x0604); stays with pcieport."""
        return self.class_prefix in (0x0604, 0x0609)

    @property
    def slot(self) -> str:
        """Address without the function: functions of one slot move together."""
        return self.address.rsplit(".", 1)[0]

    @property
    def id_pair(self) -> str:
        def hex4(v: int | None) -> str:
            return "????" if v is None else f"{v:04x}"

        return f"{hex4(self.vendor_id)}:{hex4(self.device_id)}"

    @property
    def name(self) -> str:
        """Vendor and device name (``Device 2335`` where only the vendor is named, as lspci), or the ids."""
        if self.vendor_name or self.device_name:
            device = self.device_name or (None if self.device_id is None else f"Device {self.device_id:04x}")
            return " ".join(n for n in (self.vendor_name, device) if n)
        return f"[{self.id_pair}]"


def _link_speed(text: str | None) -> float | None:
    # "32.0 GT/s PCIe", "8.0 GT/s", "2.5 GT/s PCIe"; "Unknown" on links the kernel cannot read
    if not text:
        return None
    head = text.split(" ", 1)[0]
    try:
        return float(head)
    except ValueError:
        return None


def _parent_address(sysfs_path: str, address: str) -> str | None:
    # sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0: the component before
    # the device's own is its upstream bridge, when that is a PCI address.
    parts = sysfs_path.split("/")
    try:
        idx = parts.index(address)
    except ValueError:
        return None
    if idx > 0 and PCI_ADDRESS_RE.match(parts[idx - 1]):
        return parts[idx - 1]
    return None


def kernel_shows_reset_method(sysfs: Sysfs) -> bool:
    """Kernels from 5.15 have ``reset_method``, and hide it on devices that have
    no reset at all; older ones never show it."""
    version = (sysfs.read("proc/version") or "").split()
    m = re.match(r"(\d+)\.(\d+)", version[2]) if len(version) > 2 else None
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (5, 15)


def _uevent_ids(text: str | None) -> dict[str, int | str]:
    """Ids, class and driver from a PCI device's ``uevent``: one read for six
    attributes, all from the kernel's copy (config space would wake a GPU
    sleeping in D3cold)."""
    out: dict[str, int | str] = {}
    for line in (text or "").splitlines():
        key, _sep, value = line.partition("=")
        try:
            if key == "PCI_ID":
                vendor, device = value.split(":")
                out["vendor"], out["device"] = int(vendor, 16), int(device, 16)
            elif key == "PCI_SUBSYS_ID":
                vendor, device = value.split(":")
                out["subsystem_vendor"], out["subsystem_device"] = int(vendor, 16), int(device, 16)
            elif key == "PCI_CLASS":
                out["class"] = int(value, 16)
            elif key == "DRIVER":
                out["driver"] = value
        except ValueError:
            continue
    return out


# A device's own link attributes, read together; a conventional PCI device has none.
_LINK_ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


def _read_link(attrs: dict[str, str]) -> PciLink:
    """The link from a device's attributes (read when it has any: :data:`_LINK_ATTRS`)."""
    link = PciLink(
        current_speed=_link_speed(attrs.get("current_link_speed")),
        current_width=parse_int(attrs.get("current_link_width")),
        max_speed=_link_speed(attrs.get("max_link_speed")),
        max_width=parse_int(attrs.get("max_link_width")),
    )
    # Width 0 or 255 shows a function with no link of its own (integrated, VFs).
    if link.max_width in (0, 255):
        link.max_width = None
    if link.current_width in (0, 255):
        link.current_width = None
    return link


def group_link_evidence(address: str) -> str:
    """The name of the evidence "which IOMMU group ``address`` is in"."""
    return f"IOMMU group of {address}"


def group_of_link(target: str | None) -> str | None:
    """The group number an ``iommu_group`` link names; None for anything else (a loop, garbage)."""
    m = _GROUP_LINK_RE.search(target or "")
    return m.group(1) if m else None


def _iommu_group(sysfs: Sysfs, base: str, address: str, missing: MissingEvidence | None) -> str | None:
    rel = f"{PCI_DEVICES}/{address}/iommu_group"
    target = sysfs.readlink(f"{base}/iommu_group")
    group = group_of_link(target)
    if group is None:
        problem = "not a readable link" if target is None else f"it points at {target!r}, not at a group"
        note(missing, sysfs, group_link_evidence(address), rel, problem, devices=(address,), rule=GROUPS)
    return group


def _boot_vga(sysfs: Sysfs, address: str, text: str | None, missing: MissingEvidence | None) -> bool:
    """boot_vga (``text``, None when the device has none); the kernel shows it on every VGA-class
    device, so its absence there is unknown."""
    if text not in ("0", "1"):
        problem = None if text is None else f"it reads {text[:20]!r}, not 0 or 1"
        note(
            missing,
            sysfs,
            f"boot_vga of {address}",
            f"{PCI_DEVICES}/{address}/boot_vga",
            problem,
            devices=(address,),
            rule=DISPLAY,
        )
    return text == "1"


def read_pci_device(
    sysfs: Sysfs,
    address: str,
    *,
    reset_method_shown: bool = True,
    missing: MissingEvidence | None = None,
) -> PciDevice:
    """One device's facts; every attribute a kernel may lack is optional.
    What the safety rules need and cannot be read goes into ``missing``."""
    base = sysfs.resolve(f"{PCI_DEVICES}/{address}")
    return _read_device(sysfs, address, base, sysfs.names(base), reset_method_shown, {}, missing)


# Attributes a device may have, read together when its directory lists them (read_in); every
# device has driver_override and revision (read whether listed or not, as the kernel shows them).
_LISTED_ATTRS = ("uevent", "reset_method", "boot_vga", "sriov_totalvfs", "sriov_numvfs", "resource")
_ALWAYS_ATTRS = ("driver_override", "revision")
# What a VF takes from its PF (read_pci_devices): read only for a device without one read.
_OWN_ATTRS = ("numa_node", "local_cpulist")


def _read_device(
    sysfs: Sysfs,
    address: str,
    base: str,
    entries: Collection[str],
    reset_method_shown: bool,
    pfs: dict[str, PciDevice],
    missing: MissingEvidence | None,
) -> PciDevice:
    """The device at ``base`` (root-relative, canonical), whose directory lists ``entries``.

    A VF whose PF was read already (in ``pfs``) takes the PF's link, NUMA node and
    local CPUs: they are the PF's in the kernel too (a VF's own link fields are
    reserved), and a host with thousands of VFs is read in a third of the time.
    """
    physfn = sysfs.link_name(f"{base}/physfn") if "physfn" in entries else None
    pf = pfs.get(physfn) if physfn else None
    wanted = [n for n in _LISTED_ATTRS if n in entries]
    wanted += _ALWAYS_ATTRS
    # Conventional PCI shows no link attributes at all.
    has_link = "max_link_speed" in entries or "current_link_speed" in entries
    if pf is None:
        wanted += _OWN_ATTRS
        if has_link:
            wanted += _LINK_ATTRS
    attrs = sysfs.read_in(base, wanted)
    get = attrs.get
    ids = _uevent_ids(get("uevent"))

    def hex_attr(name: str) -> int | None:
        value = ids.get(name)
        return value if isinstance(value, int) else parse_int(sysfs.read(f"{base}/{name}"), 16)

    if "driver" in ids:
        driver: str | None = str(ids["driver"])
    else:
        driver = sysfs.link_name(f"{base}/driver") if "driver" in entries else None

    driver_override = get("driver_override")
    if driver_override in ("(null)", ""):
        driver_override = None

    reset_methods: list[str] | None = None
    if "reset_method" in entries:
        reset_methods = get("reset_method", "").split()
    elif reset_method_shown:
        reset_methods = []  # hidden by the kernel: the device has no reset method

    if pf is not None:
        numa_node, local_cpulist, link = pf.numa_node, pf.local_cpulist, pf.link
    else:
        numa = parse_int(get("numa_node"))
        numa_node = None if numa is None or numa < 0 else numa
        local_cpulist = get("local_cpulist")
        link = _read_link(attrs) if has_link else PciLink()

    class_code = hex_attr("class")
    if class_code is None:
        # The class decides the chipset and bridge rules.
        unread = "neither uevent's PCI_CLASS nor the class file reads as a class code"
        note(
            missing,
            sysfs,
            f"class of {address}",
            f"{PCI_DEVICES}/{address}/class",
            unread,
            devices=(address,),
            rule=CHIPSET,
        )
    if class_code is not None and class_code >> 8 in VGA_CLASSES:
        boot_vga = _boot_vga(sysfs, address, get("boot_vga"), missing)
    else:
        boot_vga = get("boot_vga") == "1"

    return PciDevice(
        address=address,
        vendor_id=hex_attr("vendor"),
        device_id=hex_attr("device"),
        subsystem_vendor_id=hex_attr("subsystem_vendor"),
        subsystem_device_id=hex_attr("subsystem_device"),
        class_code=class_code,
        revision=parse_int(get("revision"), 16),
        driver=driver,
        driver_override=driver_override,
        numa_node=numa_node,
        local_cpulist=local_cpulist,
        link=link,
        reset_methods=reset_methods,
        boot_vga=boot_vga,
        iommu_group=_iommu_group(sysfs, base, address, missing) if "iommu_group" in entries else None,
        parent=_parent_address(base, address),
        sysfs_path=base,
        sriov_totalvfs=parse_int(get("sriov_totalvfs")),
        sriov_numvfs=parse_int(get("sriov_numvfs")),
        physfn=physfn,
        bars=parse_bars(get("resource")) if "resource" in entries else None,
    )


def read_pci_devices(sysfs: Sysfs, missing: MissingEvidence | None = None) -> dict[str, PciDevice]:
    """Every PCI device the kernel lists, by full address, in address order."""
    devices: dict[str, PciDevice] = {}
    shown = kernel_shows_reset_method(sysfs)
    pfs: dict[str, PciDevice] = {}  # a VF's PF has a lower address: read before it
    # A device's directory, as its parent's listing shows it (a bridge's devices, a PF's VFs, are
    # in the bridge's directory): no readlink of its sys/bus/pci/devices link. Every device the bus
    # lists is still read, those no listing placed (on a root bus, behind VMD) through their link.
    placed: dict[str, tuple[str, str]] = {}  # address -> (its directory, its parent's)
    pending: dict[str, int] = {}  # a parent's directory -> its devices not read yet
    listed = [a for a in sysfs.listdir(PCI_DEVICES) if PCI_ADDRESS_RE.match(a)]
    addresses = set(listed)
    try:
        for address in listed:
            where = placed.pop(address, None)
            if where is None:
                base = sysfs.resolve(f"{PCI_DEVICES}/{address}")
            else:
                base, parent = where
                pending[parent] -= 1
                if not pending[parent]:
                    sysfs.release(parent)
            entries = sysfs.names(base)
            dev = _read_device(sysfs, address, base, entries, shown, pfs, missing)
            devices[address] = dev
            if dev.sriov_totalvfs:
                pfs[address] = dev
            children = 0
            for name in addresses.intersection(entries):
                # A real directory named as a device (never a link): the kernel's own layout.
                if sysfs.kind(f"{base}/{name}") == stat.S_IFDIR:
                    placed[name] = (f"{base}/{name}", base)
                    children += 1
            if children:
                # Its devices come after those of the bridges before it (address order): kept open
                # for them, they are opened by name in it, not resolved from the root each.
                pending[base] = children
                sysfs.hold(base)
    finally:
        for parent in pending:
            sysfs.release(parent)
    # A PF's VFs, from each VF's physfn link (one readlink per VF, not two).
    for address, dev in devices.items():
        if dev.physfn in devices:
            devices[dev.physfn].virtfns.append(address)
    return devices
