"""What libvirt holds: a domain's definition and state, the devices other domains
hold, a network's state, the DHCP leases of a MAC.

The ``libvirt`` Python bindings are imported lazily (:func:`bindings`): a host
without them gets a message naming the package. Reads only; what writes through
libvirt is :mod:`gpuprov.apply.libvirt`. Standard library otherwise (ships with
the modules).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from .domains import domain_devices, parse_devices
from .proc import process_started
from .sysfs import Sysfs

LIBVIRT_MISSING = (
    "the libvirt Python bindings are not installed for {python}: install python3-libvirt "
    "(Debian/Ubuntu: apt-get install python3-libvirt; EL: dnf install python3-libvirt) "
    "or `pip install libvirt-python` into that interpreter"
)


# Where the system's libvirt answers (the monolithic libvirtd's socket, the modular virtqemud's),
# running or socket-activated: a host with neither runs no libvirt VM (libvirt not installed yet,
# as on a bare host before the gpu_vms role).
SYSTEM_URI = "qemu:///system"
SYSTEM_SOCKETS = ("run/libvirt/libvirt-sock", "run/libvirt/virtqemud-sock")


def system_libvirt_absent(sysfs: Any, uri: str) -> bool:
    """True when ``uri`` is the system's libvirt and none of its sockets exists on the live root:
    no VM of it can be running. Any other URI, or any socket there: False (connect and read)."""
    return uri == SYSTEM_URI and sysfs.live and not any(sysfs.exists(s) for s in SYSTEM_SOCKETS)


class LibvirtMissing(RuntimeError):
    """The ``libvirt`` module cannot be imported; the message names the package."""


@dataclass
class LiveDomain:
    exists: bool = False
    active: bool = False
    xml: str | None = None  # the persistent (inactive) definition
    uuid: str | None = None
    autostart: bool = False


def bindings() -> Any:
    """The ``libvirt`` module, or :class:`LibvirtMissing` naming the package to install."""
    try:
        import libvirt
    except ImportError:
        import sys

        raise LibvirtMissing(LIBVIRT_MISSING.format(python=sys.executable)) from None
    return libvirt


def connect(uri: str) -> Any:
    libvirt = bindings()
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors are raised, not printed
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise RuntimeError(f"cannot connect to libvirt at {uri}: {exc}") from None


def read_live(conn: Any, name: str) -> LiveDomain:
    libvirt = bindings()
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        return LiveDomain()
    return LiveDomain(
        exists=True,
        active=bool(dom.isActive()),
        xml=dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
        uuid=dom.UUIDString(),
        autostart=bool(dom.autostart()),
    )


def other_assignments(conn: Any, name: str) -> dict[str, tuple[str, bool]]:
    """Device (PCI address or mdev UUID) -> (domain, running) for every other domain."""
    libvirt = bindings()
    out: dict[str, tuple[str, bool]] = {}
    for dom in conn.listAllDomains():
        if dom.name() == name:
            continue
        try:
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        except libvirt.libvirtError:
            continue
        for device in domain_devices(xml):
            out[device] = (dom.name(), bool(dom.isActive()))
    return out


def network_state(conn: Any, network: str | None) -> str | None:
    if not network:
        return "active"
    libvirt = bindings()
    try:
        net = conn.networkLookupByName(network)
    except libvirt.libvirtError:
        return None
    return "active" if net.isActive() else "inactive"


def leases(conn: Any, network: str | None, mac: str) -> list[tuple[str, int]]:
    """IPv4 leases the libvirt network's DHCP server holds for ``mac``: (address, expiry), newest first."""
    libvirt = bindings()
    if not network:
        return []
    try:
        found = conn.networkLookupByName(network).DHCPLeases(mac) or []
    except libvirt.libvirtError:
        return []
    out = [
        (lease["ipaddr"], int(lease.get("expirytime") or 0))
        for lease in found
        if lease.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and (lease.get("mac") or "").lower() == mac.lower()
    ]
    return sorted(out, key=lambda lease: lease[1], reverse=True)


# dnsmasq's lease time where the network's DHCP range names none (libvirt then passes none): an hour.
DNSMASQ_LEASE_SECONDS = 3600
# libvirt's <lease expiry='N' unit='...'/> (unit: minutes by default).
LEASE_UNITS = {"seconds": 1, "minutes": 60, "hours": 3600}


def lease_seconds(network_xml: str) -> int | None:
    """How long the network's DHCP leases last, from its XML (the longest range's; dnsmasq's hour where
    none is named); None for an infinite lease (expiry 0), an unknown unit or XML that does not parse."""
    try:
        root = ET.fromstring(network_xml)
    except ET.ParseError:
        return None
    times = []
    for lease in root.iterfind("ip/dhcp/range/lease"):
        expiry, unit = lease.get("expiry", ""), lease.get("unit") or "minutes"
        if not expiry.isdigit() or int(expiry) == 0 or unit not in LEASE_UNITS:
            return None
        times.append(int(expiry) * LEASE_UNITS[unit])
    return max(times, default=DNSMASQ_LEASE_SECONDS)


def leases_before_boot(conn: Any, sysfs: Sysfs, name: str, network: str | None, mac: str) -> list[tuple[str, int]]:
    """The MAC's leases taken before the running domain's current boot: not its address now. A guest
    that shut down cleanly released its lease, and a domain started again by anything but gpu_vm
    (the drain's restore, a host's autostart, virsh) has none until its guest asks again, while the
    MAC's older leases (an earlier guest's, under another DHCP client id) are still held. Empty when
    the boot or the lease time cannot be read (every lease then counts, as before)."""
    # libvirt's pid file of the running domain: its QEMU's start is the guest's boot.
    pid = (sysfs.read(f"run/libvirt/qemu/{name}.pid") or "").strip()
    started = process_started(sysfs, pid)
    if started is None or not network:
        return []
    libvirt = bindings()
    try:
        seconds = lease_seconds(conn.networkLookupByName(network).XMLDesc(0))
    except libvirt.libvirtError:
        return []
    if seconds is None:
        return []
    return [(ip, expiry) for ip, expiry in leases(conn, network, mac) if expiry - seconds < started]


# virDomainState, as the drain names them (docs/guides/rolling.md); any other number is "unknown".
DOMAIN_STATES = {
    0: "nostate",
    1: "running",
    2: "blocked",
    3: "paused",
    4: "shutdown",
    5: "shutoff",
    6: "crashed",
    7: "pmsuspended",
}


@dataclass
class DomainState:
    """One domain as the drain sees it: its state and what it holds now."""

    name: str
    uuid: str
    state: str  # a name of DOMAIN_STATES, or "unknown" (it could not be read)
    devices: list[str] | None  # PCI addresses and mdev UUIDs of its running definition; None: unreadable


def read_domains(conn: Any) -> list[DomainState]:
    """Every domain libvirt at ``conn`` knows, with its state and, unless shut off, the devices its
    running definition holds. A state or definition that cannot be read stays unknown (None), never
    empty: the drain refuses on it (fail closed)."""
    libvirt = bindings()
    out = []
    for dom in conn.listAllDomains():
        try:
            state = DOMAIN_STATES.get(int(dom.state()[0]), "unknown")
        except (libvirt.libvirtError, TypeError, ValueError, IndexError):
            state = "unknown"
        devices: list[str] | None = [] if state == "shutoff" else None
        if state != "shutoff":
            try:
                devices = parse_devices(dom.XMLDesc(0))
            except libvirt.libvirtError:
                devices = None
        out.append(DomainState(name=dom.name(), uuid=dom.UUIDString().lower(), state=state, devices=devices))
    return sorted(out, key=lambda d: d.name)  # libvirt lists them in no set order
