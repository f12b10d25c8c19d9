"""Human names for PCI ids and classes.

A device is named from the most specific source there is (docs/output.md, "Names"):

1. the driver's own name for the product: NVIDIA's (``Model:`` in
   ``/proc/driver/nvidia/gpus/ADDR/information``, the ``product_name`` nvidia-smi shows; in a
   capture also its ``capture/nvidia-smi-q-x``), kept apart as :attr:`PciDevice.product_name`;
2. the system's hwdb, as udev and lspci name devices: through pyudev on a live host, else
   from udev's own source file for PCI (``20-pci-vendor-model.hwdb``; a captured root is
   named by the hwdb of the machine reading it);
3. the pci.ids file of hwdata/pciutils, for what the hwdb lacks;

and with none of them, callers show hex ids. Class names (``3D controller``) come from a
small table of the PCI classes (:func:`class_name`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .sysfs import Sysfs

if TYPE_CHECKING:
    from .pci import PciDevice

# A vendor line: four hex digits at the start of a line (device lines start with a tab).
_VENDOR_LINE = re.compile(r"^[0-9a-fA-F]{4}  ", re.M)

PCI_IDS_PATHS = (
    "/usr/share/hwdata/pci.ids",
    "/usr/share/misc/pci.ids",
    "/usr/share/pci.ids",
    "/usr/local/share/pci.ids",
)
# udev's hwdb source for PCI ids; one in /etc replaces the shipped one of the same name.
HWDB_PATHS = (
    "/etc/udev/hwdb.d/20-pci-vendor-model.hwdb",
    "/usr/lib/udev/hwdb.d/20-pci-vendor-model.hwdb",
    "/lib/udev/hwdb.d/20-pci-vendor-model.hwdb",
)
# NVIDIA's driver: one directory per GPU it drives, its product name on the "Model:" line.
NVIDIA_GPUS = "proc/driver/nvidia/gpus"
SMI_CAPTURE = "capture/nvidia-smi-q-x"  # as gpuprov.facts.gpus.SMI_CAPTURE


class PciIds:
    """Lookups in a pci.ids file (~1.5 MB): each vendor's section found once, each device line
    found in it with str.find (C speed: a module pays this on every run, on a slow target too)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._vendors: dict[int, tuple[str | None, int, int]] = {}  # vendor -> (name, section start, end)

    @classmethod
    def load(cls, paths: tuple[str, ...] = PCI_IDS_PATHS) -> PciIds | None:
        for path in paths:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    return cls(f.read())
            except OSError:
                continue
        return None

    def _vendor(self, vendor: int) -> tuple[str | None, int, int]:
        if vendor in self._vendors:
            return self._vendors[vendor]
        text = self._text
        key = f"\n{vendor:04x}  "
        start = text.find(key)
        found: tuple[str | None, int, int] = (None, 0, 0)
        if start >= 0:
            end = text.find("\n", start + 1)
            end = len(text) if end < 0 else end
            name = text[start + len(key) : end].strip()
            # Its device lines run to the next vendor line (or a class list, "C xx", past the vendors).
            after = _VENDOR_LINE.search(text, end + 1)
            classes = text.find("\nC ", end)
            stop = min(x for x in (after.start() - 1 if after else len(text), classes) if x >= 0)
            found = (name, end, stop)
        self._vendors[vendor] = found
        return found

    def lookup(self, vendor: int | None, device: int | None) -> tuple[str | None, str | None]:
        if vendor is None:
            return None, None
        name, start, stop = self._vendor(vendor)
        if device is None or name is None:
            return name, None
        text = self._text
        # One tab, the id, two spaces: a device line (subsystem lines have two tabs).
        at = text.find(f"\n\t{device:04x}  ", start, stop)
        if at < 0:
            return name, None
        line_end = text.find("\n", at + 1)
        return name, text[at + 7 : len(text) if line_end < 0 else line_end].strip()


class HwdbIds:
    """Lookups in udev's hwdb source for PCI (``20-pci-vendor-model.hwdb``, ~4 MB): the names
    udev (``ID_MODEL_FROM_DATABASE``) and lspci show, read without libudev.

    Its entries are a match line and property lines::

        pci:v000010DE*
         ID_VENDOR_FROM_DATABASE=NVIDIA Corporation

        pci:v000010DEd00002335*
         ID_MODEL_FROM_DATABASE=GH100 [H200 SXM 141GB]

    Each vendor's entries are found once (bytes.find of its first match line, then of the
    next vendor's name), each device's among them: milliseconds for a host's devices.
    """

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._vendors: dict[int, tuple[str | None, int, int]] = {}

    @classmethod
    def load(cls, paths: tuple[str, ...] = HWDB_PATHS) -> HwdbIds | None:
        for path in paths:
            try:
                with open(path, "rb") as f:
                    return cls(f.read())
            except OSError:
                continue
        return None

    def _value(self, at: int, stop: int, key: bytes) -> str | None:
        """The value of property ``key`` of the entry whose match line starts at ``at``."""
        end = self._data.find(b"\n\n", at + 1, stop)
        entry = self._data[at : stop if end < 0 else end]
        found = entry.find(b"\n " + key + b"=")
        if found < 0:
            return None
        line_end = entry.find(b"\n", found + 1)
        value = entry[found + len(key) + 3 : len(entry) if line_end < 0 else line_end]
        return value.decode("utf-8", "replace").strip() or None

    def _vendor(self, vendor: int) -> tuple[str | None, int, int]:
        if vendor in self._vendors:
            return self._vendors[vendor]
        data = self._data
        prefix = b"\npci:v%08X" % vendor
        start = data.find(prefix)
        found: tuple[str | None, int, int] = (None, 0, 0)
        if start >= 0:
            # Its entries run to the next vendor's (systemd writes them grouped, vendors in order).
            after = data.find(b"\n ID_VENDOR_FROM_DATABASE=", data.find(b"\n", start + 1) + 1)
            stop = len(data) if after < 0 else data.rfind(b"\n\n", start, after) + 1
            line = data.find(prefix + b"*\n", start, stop)
            name = None if line < 0 else self._value(line, stop, b"ID_VENDOR_FROM_DATABASE")
            found = (name, start, stop)
        self._vendors[vendor] = found
        return found

    def lookup(self, vendor: int | None, device: int | None) -> tuple[str | None, str | None]:
        if vendor is None:
            return None, None
        name, start, stop = self._vendor(vendor)
        if device is None or stop == 0:
            return name, None
        at = self._data.find(b"\npci:v%08Xd%08X*\n" % (vendor, device), start, stop)
        return name, None if at < 0 else self._value(at, stop, b"ID_MODEL_FROM_DATABASE")


class UdevNames:
    """Names from udev's database (ID_VENDOR/MODEL_FROM_DATABASE) via pyudev."""

    def __init__(self) -> None:
        import pyudev  # optional: only on a live host with pyudev installed

        self._pyudev = pyudev
        self._context = pyudev.Context()

    def lookup(self, sysfs_path: str) -> tuple[str | None, str | None]:
        try:
            dev = self._pyudev.Devices.from_sys_path(self._context, sysfs_path)
            props = dev.properties
            return props.get("ID_VENDOR_FROM_DATABASE"), props.get("ID_MODEL_FROM_DATABASE")
        except Exception:  # noqa: BLE001 - udev may lack the device or its db entry
            return None, None


def name_source(sysfs: Sysfs) -> UdevNames | None:
    """udev names on a live host with pyudev; ``None`` otherwise."""
    if not sysfs.live:
        return None
    try:
        return UdevNames()
    except Exception:  # noqa: BLE001 - no pyudev, or no libudev on this host
        return None


def name_devices(sysfs: Sysfs, devices: dict[str, PciDevice]) -> str:
    """Give each device its vendor and device name, and the driver's product name where the
    driver names it; returns where the names came from: ``udev`` (its hwdb, through pyudev
    or its source file), ``pci.ids``, or ``none``.

    Each source is asked only for what the ones before it left unnamed, and loaded only then.
    """
    sources: set[str] = set()
    udev = name_source(sysfs)
    if udev is not None:
        for dev in devices.values():
            dev.vendor_name, dev.device_name = udev.lookup(sysfs.path(dev.sysfs_path))
            if dev.vendor_name:
                sources.add("udev")
    for name, load in (("udev", HwdbIds.load), ("pci.ids", PciIds.load)):
        unnamed = [d for d in devices.values() if d.vendor_name is None or d.device_name is None]
        table = load() if unnamed else None
        if table is None:
            continue
        found: dict[tuple[int | None, int | None], tuple[str | None, str | None]] = {}
        for dev in unnamed:
            # A host's thousands of VFs share a few ids: each pair is looked up once.
            ids = (dev.vendor_id, dev.device_id)
            names = found.get(ids)
            if names is None:
                names = found[ids] = table.lookup(*ids)
            vendor, device = names
            if vendor and (dev.vendor_name is None or device):
                dev.vendor_name, dev.device_name = vendor, device
                sources.add(name)
    for address, product in product_names(sysfs, devices).items():
        devices[address].product_name = product
    return next((s for s in ("udev", "pci.ids") if s in sources), "none")


def product_names(sysfs: Sysfs, addresses: Iterable[str]) -> dict[str, str]:
    """Address -> the product name the NVIDIA driver gives the GPU (``NVIDIA H200``): from its
    ``/proc/driver/nvidia/gpus/ADDR/information``, and under a captured root from the captured
    ``nvidia-smi -q -x`` for GPUs that file lacks. Only for the ``addresses`` given."""
    wanted = {a.lower() for a in addresses}
    found: dict[str, str] = {}
    for entry in sysfs.listdir(NVIDIA_GPUS):
        address = entry.lower()
        if address not in wanted:
            continue
        for line in sysfs.read_lines(f"{NVIDIA_GPUS}/{entry}/information"):
            key, colon, value = line.partition(":")
            if colon and key.strip() == "Model" and value.strip():
                found[address] = value.strip()
                break
    text = sysfs.read(SMI_CAPTURE) if not sysfs.live and wanted - set(found) else None
    if text:
        from .gpus import GpuQueryError, parse_smi_xml  # only then: it imports subprocess and XML

        try:
            gpus = parse_smi_xml(text).gpus
        except (GpuQueryError, ValueError, RecursionError):  # not nvidia-smi's XML: no names from it
            gpus = []
        for gpu in gpus:
            if gpu.address in wanted and gpu.name and gpu.address not in found:
                found[gpu.address] = gpu.name
    return found


# The PCI classes (PCI Code and ID Assignment Specification; the names as pci.ids writes them):
# "BB name" a base class, "BBSS name" a subclass.
_CLASS_TABLE = """
00 Unclassified device|0000 Non-VGA unclassified device|0001 VGA compatible unclassified device
0005 Image coprocessor|01 Mass storage controller|0100 SCSI storage controller|0101 IDE interface
0104 RAID bus controller|0105 ATA controller|0106 SATA controller|0107 Serial Attached SCSI controller
0108 Non-Volatile memory controller|0109 Universal Flash Storage controller|02 Network controller
0200 Ethernet controller|0207 Infiniband controller|0208 Fabric controller|03 Display controller
0300 VGA compatible controller|0301 XGA compatible controller|0302 3D controller|04 Multimedia controller
0400 Multimedia video controller|0401 Multimedia audio controller|0403 Audio device|05 Memory controller
0500 RAM memory|0501 FLASH memory|0502 CXL|06 Bridge|0600 Host bridge|0601 ISA bridge|0604 PCI bridge
0607 CardBus bridge|0609 Semi-transparent PCI-to-PCI bridge|0680 Bridge|07 Communication controller
0700 Serial controller|0701 Parallel controller|0780 Communication controller
08 Generic system peripheral|0800 PIC|0801 DMA controller|0802 Timer|0803 RTC
0804 PCI Hot-plug controller|0805 SD Host controller|0806 IOMMU|0880 System peripheral
09 Input device controller|0a Docking station|0b Processor|0c Serial bus controller
0c00 FireWire (IEEE 1394)|0c03 USB controller|0c04 Fibre Channel|0c05 SMBus|0c06 InfiniBand
0c07 IPMI Interface|0c80 Serial bus controller|0d Wireless controller|0d11 Bluetooth
0e Intelligent controller|0f Satellite communications controller|10 Encryption controller
11 Signal processing controller|1101 Performance counters|12 Processing accelerators
13 Non-Essential Instrumentation|40 Coprocessor|ff Unassigned class
"""
_ENTRIES = [entry.split(" ", 1) for entry in _CLASS_TABLE.replace("\n", "|").split("|") if entry]
BASE_CLASSES = {int(code, 16): name for code, name in _ENTRIES if len(code) == 2}
SUBCLASSES = {int(code, 16): name for code, name in _ENTRIES if len(code) == 4}


def class_name(class_code: int | None) -> str | None:
    """``3D controller`` for class 0x030200: the subclass's name, else its base class's."""
    if class_code is None:
        return None
    return SUBCLASSES.get(class_code >> 8) or BASE_CLASSES.get(class_code >> 16)
