"""libvirt's running domains, as the host shows them: which PCI devices and mdevs
each one holds. Read from libvirt's status XML (one file per running QEMU domain)
through ``Sysfs``, so it works on captured roots and needs no libvirt bindings
(the vGPU boot planner runs before libvirtd)."""

from __future__ import annotations

from .evidence import IN_USE, MissingEvidence, note
from .sysfs import Sysfs

RUNNING_DOMAINS = "run/libvirt/qemu"


def parse_devices(xml: str) -> list[str] | None:
    """mdev UUIDs and PCI addresses a domain's XML assigns; None when it is not XML."""
    import xml.etree.ElementTree as ET  # here: only a host running domains has XML to parse

    out: list[str] = []
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
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


def domain_devices(xml: str) -> list[str]:
    """mdev UUIDs and PCI addresses (``0000:41:00.0``) a domain's XML assigns."""
    return parse_devices(xml) or []


def read_running(sysfs: Sysfs, missing: MissingEvidence | None = None) -> dict[str, str]:
    """Device -> running domain. No directory: libvirt runs no QEMU domain. One that
    cannot be listed, or a status file that cannot be read, goes into ``missing``."""
    running: dict[str, str] = {}
    names = sysfs.try_listdir(RUNNING_DOMAINS)
    if names is None:
        if sysfs.exists(RUNNING_DOMAINS):
            note(missing, sysfs, "running libvirt domains", RUNNING_DOMAINS, rule=IN_USE)
        return running
    for name in names:
        if name.endswith(".xml"):
            rel = f"{RUNNING_DOMAINS}/{name}"
            text = sysfs.read(rel)
            devices = None if text is None else parse_devices(text)
            if devices is None:
                note(missing, sysfs, "running libvirt domains", rel, None if text is None else "not XML", rule=IN_USE)
                continue
            for device in devices:
                running[device] = name[: -len(".xml")]
    return running
