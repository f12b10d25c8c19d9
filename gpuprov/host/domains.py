"""libvirt's running domains, as the host shows them: which PCI devices and mdevs
each one holds. Read from libvirt's status XML (one file per running QEMU domain)
through ``Sysfs``, so it works on captured roots and needs no libvirt bindings
(the vGPU boot planner runs before libvirtd)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from .sysfs import Sysfs

RUNNING_DOMAINS = "run/libvirt/qemu"


def domain_devices(xml: str) -> list[str]:
    """mdev UUIDs and PCI addresses (``0000:41:00.0``) a domain's XML assigns."""
    out: list[str] = []
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return out
    for hostdev in root.iter("hostdev"):
        addr = hostdev.find("source/address")
        if addr is None:
            continue
        if addr.get("uuid"):
            out.append(addr.get("uuid", "").lower())
            continue
        try:
            d, b, s, f = (int(addr.get(a, "0"), 0) for a in ("domain", "bus", "slot", "function"))
        except ValueError:
            continue
        out.append(f"{d:04x}:{b:02x}:{s:02x}.{f:x}")
    return out


def read_running(sysfs: Sysfs) -> dict[str, str]:
    """Device -> running domain."""
    running: dict[str, str] = {}
    for name in sysfs.listdir(RUNNING_DOMAINS):
        if name.endswith(".xml"):
            for device in domain_devices(sysfs.read(f"{RUNNING_DOMAINS}/{name}") or ""):
                running[device] = name[: -len(".xml")]
    return running
