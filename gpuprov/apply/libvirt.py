"""Carrying out a VM plan's libvirt steps (:class:`~gpuprov.plan.vm.plan.DomainOp`): start a
network, define, set autostart, start, shut down (ACPI, then power off), destroy,
undefine; then wait for the guest's address.

The only layer that writes through libvirt; the reads are :mod:`gpuprov.facts.libvirt`
(whose :func:`~gpuprov.facts.libvirt.bindings` imports the bindings lazily).
Standard library otherwise (ships with the modules).
"""

from __future__ import annotations

import time
from typing import Any

from ..facts.libvirt import bindings, leases
from ..plan.vm.plan import AUTOSTART, DEFINE, DESTROY, SHUTDOWN, START, START_NETWORK, UNDEFINE, VmPlan


def _shutdown(dom: Any, timeout: float, libvirt: Any, force: bool = True) -> str:
    """ACPI shutdown, waiting ``timeout`` seconds; then power off (``force``), or not. Returns how it
    stopped, or "still running" (not ``force``)."""
    try:
        dom.shutdown()
    except libvirt.libvirtError:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not dom.isActive():
            return "shut down"
        time.sleep(1)
    if dom.isActive():
        if not force:
            return "still running"
        dom.destroy()
        return f"did not shut down in {timeout:.0f}s: powered off"
    return "shut down"


def drain(conn: Any, domains: list[tuple[str, str]], forced: list[str], timeout: float) -> tuple[list[str], list[str]]:
    """Shut down ``domains`` ((name, UUID) each, looked up by UUID), all asked at once, each given up to
    ``timeout`` seconds; those named in ``forced`` are then powered off, the rest left running. Returns
    what was done, as text, and the names of those still running."""
    libvirt = bindings()
    doms = [(name, conn.lookupByUUIDString(uuid)) for name, uuid in domains]
    for _name, dom in doms:
        try:
            dom.shutdown()  # all at once: the wait is the slowest guest's, not their sum
        except libvirt.libvirtError:
            pass
    done, left = [], []
    for name, dom in doms:
        how = _shutdown(dom, timeout, libvirt, force=name in forced)
        if how == "still running":
            left.append(name)
        else:
            done.append(f"shut down domain {name}: {how}")
    return done, left


def start(conn: Any, domains: list[tuple[str, str]]) -> list[str]:
    """Start the shut-off ``domains`` ((name, UUID) each, looked up by UUID); returns what was done."""
    done = []
    for name, uuid in domains:
        conn.lookupByUUIDString(uuid).create()
        done.append(f"start domain {name}")
    return done


def execute(conn: Any, plan: VmPlan, shutdown_timeout: float = 180) -> list[str]:
    """Carry out the libvirt ops of ``plan``; returns what was done, as text."""
    libvirt = bindings()
    done = []
    for op in plan.ops:
        text = op.describe()
        if op.kind == START_NETWORK:
            conn.networkLookupByName(op.target).create()
        elif op.kind == DEFINE:
            conn.defineXML(op.xml)
        elif op.kind == AUTOSTART:
            conn.lookupByName(op.target).setAutostart(1 if op.value else 0)
        elif op.kind == START:
            plan.stale_leases = leases(conn, plan.network, plan.mac) if plan.mac else []
            conn.lookupByName(op.target).create()
        elif op.kind == SHUTDOWN:
            how = _shutdown(conn.lookupByName(op.target), shutdown_timeout, libvirt)
            text += f": {how}"
        elif op.kind == DESTROY:
            dom = conn.lookupByName(op.target)
            if dom.isActive():
                dom.destroy()
        elif op.kind == UNDEFINE:
            dom = conn.lookupByName(op.target)
            flags = libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            try:
                dom.undefineFlags(flags)
            except libvirt.libvirtError:
                dom.undefine()  # drivers without NVRAM support (test:///)
        done.append(text)
    return done


def wait_for_address(
    conn: Any, network: str | None, mac: str, timeout: float, stale: list[tuple[str, int]] | None = None
) -> list[str]:
    """The guest's IPv4 addresses, newest lease first, waiting up to ``timeout`` seconds.

    ``stale``: the leases the MAC had before the domain was started here. A guest
    made anew (a fresh overlay, a new DHCP client id) under an old name and MAC
    gets a new address while dnsmasq still holds the old one, so only a lease that
    is new, or renewed since, counts.
    """
    old = set(stale or [])
    deadline = time.monotonic() + timeout
    while True:
        fresh = [ip for ip, expiry in leases(conn, network, mac) if (ip, expiry) not in old]
        if fresh or time.monotonic() >= deadline:
            return fresh
        time.sleep(2)
