"""Human names for PCI ids.

On a live host udev's hwdb (through pyudev, when installed) has the names the
distribution ships; reading a captured root, or with no udev, the pci.ids
file of hwdata/pciutils is used; with neither, callers show hex ids.
"""

from __future__ import annotations

from .sysfs import Sysfs

PCI_IDS_PATHS = (
    "/usr/share/hwdata/pci.ids",
    "/usr/share/misc/pci.ids",
    "/usr/share/pci.ids",
    "/usr/local/share/pci.ids",
)


class PciIds:
    """Lookups in a pci.ids file, indexed lazily per vendor (the file is ~1.5 MB)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._vendors: dict[int, tuple[str | None, dict[int, str]]] = {}

    @classmethod
    def load(cls, paths: tuple[str, ...] = PCI_IDS_PATHS) -> PciIds | None:
        for path in paths:
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    return cls(f.read())
            except OSError:
                continue
        return None

    def _vendor(self, vendor: int) -> tuple[str | None, dict[int, str]]:
        if vendor in self._vendors:
            return self._vendors[vendor]
        text = self._text
        key = f"\n{vendor:04x}  "
        start = text.find(key)
        name: str | None = None
        devices: dict[int, str] = {}
        if start >= 0:
            end = text.find("\n", start + 1)
            name = text[start + len(key) : end].strip()
            # Device lines follow, one tab deep; subsystems two tabs; comments '#'.
            pos = end + 1
            while pos < len(text):
                nl = text.find("\n", pos)
                nl = len(text) if nl < 0 else nl
                line = text[pos:nl]
                pos = nl + 1
                if not line or line.startswith("#"):
                    continue
                if not line.startswith("\t"):
                    break
                if line.startswith("\t\t"):
                    continue
                dev_id, _sep, dev_name = line[1:].partition("  ")
                try:
                    devices[int(dev_id, 16)] = dev_name.strip()
                except ValueError:
                    continue
        self._vendors[vendor] = (name, devices)
        return self._vendors[vendor]

    def lookup(self, vendor: int | None, device: int | None) -> tuple[str | None, str | None]:
        if vendor is None:
            return None, None
        name, devices = self._vendor(vendor)
        return name, devices.get(device) if device is not None else None


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
