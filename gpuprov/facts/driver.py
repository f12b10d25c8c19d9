"""The NVIDIA kernel driver: loaded or not, its version, nouveau in the way."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .sysfs import Sysfs

PROC_VERSION = "proc/driver/nvidia/version"
MODULE_VERSION = "sys/module/nvidia/version"

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023"
_NVRM = re.compile(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)?)(?:\s|$)")


@dataclass
class DriverInfo:
    loaded: bool
    version: str | None
    source: str | None  # the file the version came from
    open_kernel_module: bool | None  # NVIDIA's open GPU kernel modules (None: not said)
    nouveau: bool  # nouveau is loaded (it claims NVIDIA GPUs before nvidia can)


def _modules(sysfs: Sysfs) -> set[str]:
    return {line.split(" ", 1)[0] for line in sysfs.read_lines("proc/modules")}


def read_driver(sysfs: Sysfs) -> DriverInfo:
    """Read the driver's state under the root. Never raises."""
    modules = _modules(sysfs)
    version = source = None
    open_km = None
    text = sysfs.read(PROC_VERSION)
    if text:
        first = text.splitlines()[0]
        m = _NVRM.search(first)
        if m:
            version, source = m.group(1), "/" + PROC_VERSION
        open_km = "Open Kernel Module" in first
    if version is None:
        value = sysfs.read(MODULE_VERSION)
        if value and re.fullmatch(r"\d+\.\d+(\.\d+)?", value):
            version, source = value, "/" + MODULE_VERSION
    loaded = bool(text) or version is not None or "nvidia" in modules or sysfs.exists("sys/module/nvidia/initstate")
    if not loaded and sysfs.exists("sys/module/nvidia"):
        # A capture keeps the module's directory only when it was loaded.
        loaded = bool(sysfs.listdir("sys/module/nvidia"))
    nouveau = "nouveau" in modules or sysfs.exists("sys/module/nouveau/initstate")
    return DriverInfo(loaded=loaded, version=version, source=source, open_kernel_module=open_km, nouveau=nouveau)
