"""Whether a domain's libvirt definition already means what gpuprov would define.

Idempotence: the generated domain XML is compared
with the domain's persistent XML *projected* onto what the builder
(:mod:`gpuprov.plan.vm.domain`) sets (:func:`compare_domain_xml`): attributes and
elements libvirt adds (PCI addresses of its own controllers, ``<alias>``, the
``pc-q35-7.2`` expansion of ``q35``, loader paths, input devices, the console twin
of the serial port...) and whitespace do not count; a managed device (disk, NIC,
hostdev...) that the builder no longer makes does. Only a difference in meaning
redefines the domain. :func:`diff_text` shows the difference.

Pure: no I/O. Standard library only.
"""

from __future__ import annotations

import difflib
import xml.etree.ElementTree as ET
from typing import Any

from ...facts.numa import parse_cpulist
from .domain import QEMU_NS, to_xml

# Children whose presence in the live XML counts even when the builder makes none
# (a hostdev removed from the spec must leave the domain); elsewhere what libvirt
# adds is ignored.
_COUNTED = {
    # QEMU options in libvirt's qemu namespace (the MMIO window, NVLink cliques): dropped ones count.
    "domain": {"memoryBacking", "cputune", "numatune", f"{{{QEMU_NS}}}commandline", f"{{{QEMU_NS}}}override"},
    "devices": {
        "disk",
        "interface",
        "hostdev",
        "serial",
        "rng",
        "memballoon",
        "graphics",
        "video",
        "filesystem",
        "tpm",
        "sound",
        "redirdev",
        "smartcard",
        "shmem",
    },
    "cputune": {"vcpupin", "emulatorpin"},
    "os": {"kernel", "initrd", "cmdline"},
    "features": {"kvm", "hyperv"},
    "hugepages": {"page"},
}
_ADDRESS_ATTRS = ("domain", "bus", "slot", "function")


def _norm_value(tag: str, name: str, value: str) -> str:
    if tag == "address" and name in _ADDRESS_ATTRS:
        try:
            return hex(int(value, 0))
        except ValueError:
            return value
    if name in ("cpuset", "nodeset") or (tag == "cell" and name == "cpus"):
        return ",".join(str(c) for c in sorted(set(parse_cpulist(value))))
    if tag == "type" and name == "machine":
        if value.startswith("pc-q35-"):
            return "q35"
        if value.startswith("pc-i440fx-"):
            return "pc"
    if tag == "mac" and name == "address":
        return value.lower()
    return value


def _key(el: ET.Element) -> Any:
    tag = el.tag
    if tag == "disk":
        target = el.find("target")
        return target.get("dev") if target is not None else None
    if tag == "interface":
        mac = el.find("mac")
        return (mac.get("address") or "").lower() if mac is not None else None
    if tag == "hostdev":
        addr = el.find("source/address")
        if addr is None:
            return None
        if addr.get("uuid"):
            return addr.get("uuid")
        return tuple(_norm_value("address", a, addr.get(a, "0")) for a in _ADDRESS_ATTRS)
    if tag == "controller":
        return (el.get("type"), el.get("index"))
    if tag == "vcpupin":
        return el.get("vcpu")
    if tag in ("timer", "feature"):
        return el.get("name")
    return None


def _normalized(el: ET.Element) -> ET.Element:
    out = ET.Element(el.tag, {k: _norm_value(el.tag, k, v) for k, v in sorted(el.attrib.items())})
    text = (el.text or "").strip()
    if text:
        out.text = text
    # Siblings of different kinds in one order (libvirt groups devices by kind); same-kind order kept.
    for child in sorted(el, key=lambda c: c.tag):
        out.append(_normalized(child))
    return out


def _match(desired: list[ET.Element], live: list[ET.Element]) -> list[ET.Element | None]:
    """For each desired child, its live counterpart (by key, else by position), or None."""
    left = list(live)
    out: list[ET.Element | None] = []
    keyed = all(_key(d) is not None for d in desired)
    for i, d in enumerate(desired):
        found = None
        if keyed:
            found = next((lv for lv in left if _key(lv) == _key(d)), None)
        elif i < len(live) and live[i] in left:
            found = live[i]
        if found is not None:
            left.remove(found)
        out.append(found)
    return out


def _project(desired: ET.Element, live: ET.Element) -> ET.Element:
    """``live`` reduced to the attributes and children ``desired`` has (plus counted extras)."""
    out = ET.Element(live.tag)
    for name in desired.attrib:
        if name in live.attrib:
            out.set(name, live.attrib[name])
    if (desired.text or "").strip():
        out.text = (live.text or "").strip()
    tags: list[str] = []
    for child in desired:
        if child.tag not in tags:
            tags.append(child.tag)
    counted = _COUNTED.get(desired.tag, set())
    for tag in tags:
        wanted = [c for c in desired if c.tag == tag]
        have = [c for c in live if c.tag == tag]
        matched = _match(wanted, have)  # one per wanted (_match)
        for d, lv in zip(wanted, matched):
            if lv is not None:
                out.append(_project(d, lv))
        if tag in counted:
            for lv in have:
                if lv not in matched:
                    out.append(lv)
    for tag in sorted(counted - set(tags)):
        for lv in live:
            if lv.tag == tag:
                out.append(lv)
    return out


def _strip_uuid(root: ET.Element) -> ET.Element:
    copy = ET.fromstring(ET.tostring(root))
    for el in copy.findall("uuid"):
        copy.remove(el)
    return copy


def compare_domain_xml(desired_xml: str, live_xml: str | None) -> tuple[bool, str, str]:
    """(same in meaning?, live projected, desired), both as normalized indented XML."""
    desired = _strip_uuid(ET.fromstring(desired_xml))
    after = to_xml(_normalized(desired))
    if not live_xml:
        return False, "", after
    live = _strip_uuid(ET.fromstring(live_xml))
    before = to_xml(_normalized(_project(desired, live)))
    return before == after, before, after


def diff_text(before: str, after: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"domain {name} (libvirt)",
            f"domain {name} (gpuprov)",
        )
    )
