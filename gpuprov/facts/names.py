"""Human names for PCI ids.

On a live host udev's hwdb (through pyudev, when installed) has the names the
distribution ships; reading a captured root, or with no udev, the pci.ids
file of hwdata/pciutils is used; with neither, callers show hex ids.
"""

from __future__ import annotations

import re

from .sysfs import Sysfs

# A vendor line: four hex digits at the start of a line (device lines start with a tab).
_VENDOR_LINE = re.compile(r"^[0-9a-fA-F]{4}  ", re.M)

PCI_IDS_PATHS = (
    "/usr/share/hwdata/pci.ids",
    "/usr/share/misc/pci.ids",
    "/usr/share/pci.ids",
    "/usr/local/share/pci.ids",
)


class PciIds:
    """Lookups in a pci.ids file (~1.5 MB): each vendor's section found once, each device line
    found in it with str.find (C speed: a module pays this on every run, on a slow target too),
    once per id pair (a host's thousands of VFs are a few ids)."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._vendors: dict[int, tuple[str | None, int, int]] = {}  # vendor -> (name, section start, end)
        self._names: dict[tuple[int, int | None], tuple[str | None, str | None]] = {}  # (vendor, device) -> names

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
        found = self._names.get((vendor, device))
        if found is None:
            found = self._names[vendor, device] = self._lookup(vendor, device)
        return found

    def _lookup(self, vendor: int, device: int | None) -> tuple[str | None, str | None]:
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
