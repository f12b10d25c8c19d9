"""Which DHCP leases of a VM's MAC are from before its current boot (facts/libvirt.py): a guest that
shut down cleanly released its own lease, so a domain started again by anything but gpu_vm (the
drain's restore, a host's autostart) has none until its guest asks again, while the MAC's older
leases are still held. tests/ansible/test_gpu_vms_libvirt.py shows it against a real libvirtd."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuprov.facts import libvirt as facts_libvirt
from gpuprov.facts.proc import process_started
from gpuprov.facts.sysfs import Sysfs

NETWORK = (
    "<network><name>n</name><ip address='192.168.1.1'><dhcp>"
    "<range start='192.168.1.2' end='192.168.1.9'>{}</range></dhcp></ip></network>"
)
MAC = "52:54:00:4f:ab:d6"
BTIME = 1_795_770_000
TICKS = os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(
    ("lease", "seconds"),
    [
        ("", facts_libvirt.DNSMASQ_LEASE_SECONDS),
        ("<lease expiry='30'/>", 1800),
        ("<lease expiry='2' unit='hours'/>", 7200),
        ("<lease expiry='90' unit='seconds'/>", 90),
        ("<lease expiry='0'/>", None),  # infinite: no lease tells its start
        ("<lease expiry='1' unit='days'/>", None),
        ("<lease expiry='-5'/>", None),
    ],
)
def test_lease_seconds_from_the_network_xml(lease: str, seconds: int | None) -> None:
    assert facts_libvirt.lease_seconds(NETWORK.format(lease)) == seconds


def test_lease_seconds_of_xml_that_does_not_parse_is_unknown() -> None:
    assert facts_libvirt.lease_seconds("<network><ip") is None


def stage(root: Path, name: str = "vm", pid: str = "4242", start_ticks: int = 120 * 100) -> None:
    (root / "run/libvirt/qemu").mkdir(parents=True)
    (root / f"run/libvirt/qemu/{name}.pid").write_text(pid)
    (root / f"proc/{pid}").mkdir(parents=True)
    # A comm with spaces and a parenthesis, as /proc shows it: fields after the last ')'.
    fields = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 30
    (root / f"proc/{pid}/stat").write_text(f"{pid} (qemu-system (x86)) {' '.join(fields)}\n")
    (root / "proc/stat").write_text(f"cpu  1 2 3\nbtime {BTIME}\nprocesses 9\n")


def test_a_process_started_at_boot_plus_its_ticks(tmp_path: Path) -> None:
    stage(tmp_path, start_ticks=120 * TICKS)
    assert process_started(Sysfs(str(tmp_path)), "4242") == BTIME + 120


@pytest.mark.parametrize("broken", ["pid not a number", "no stat", "no btime", "btime not a number", "short stat"])
def test_a_process_start_unreadable_is_unknown(tmp_path: Path, broken: str) -> None:
    stage(tmp_path)
    pid = "4242"
    if broken == "pid not a number":
        pid = "../../etc"
    elif broken == "no stat":
        (tmp_path / "proc/4242/stat").unlink()
    elif broken == "no btime":
        (tmp_path / "proc/stat").write_text("cpu 1 2 3\n")
    elif broken == "btime not a number":
        (tmp_path / "proc/stat").write_text("btime soon\n")
    else:
        (tmp_path / "proc/4242/stat").write_text("4242 (qemu) S 1 2\n")
    assert process_started(Sysfs(str(tmp_path)), pid) is None


class FakeNetwork:
    def __init__(self, xml: str, leases: list[dict]) -> None:
        self.xml, self.leases = xml, leases

    def XMLDesc(self, flags: int) -> str:
        return self.xml

    def DHCPLeases(self, mac: str) -> list[dict]:
        return [lease for lease in self.leases if lease["mac"] == mac]


class FakeConn:
    def __init__(self, network: FakeNetwork) -> None:
        self.network = network

    def networkLookupByName(self, name: str) -> FakeNetwork:
        return self.network


def lease(ip: str, expiry: int) -> dict:
    libvirt = facts_libvirt.bindings()
    return {"ipaddr": ip, "expirytime": expiry, "mac": MAC, "type": libvirt.VIR_IP_ADDR_TYPE_IPV4}


def test_the_leases_taken_before_the_boot_are_stale(tmp_path: Path) -> None:
    stage(tmp_path, start_ticks=600 * TICKS)  # booted at BTIME + 600
    booted = BTIME + 600
    held = [lease(".92", booted - 300 + 3600), lease(".93", booted - 1 + 3600), lease(".94", booted + 40 + 3600)]
    conn = FakeConn(FakeNetwork(NETWORK.format(""), held))
    stale = facts_libvirt.leases_before_boot(conn, Sysfs(str(tmp_path)), "vm", "n", MAC)
    assert sorted(ip for ip, _ in stale) == [".92", ".93"]  # .94 was taken in this boot
    # Unknown boot or lease time: nothing is stale (every lease counts, as before).
    assert facts_libvirt.leases_before_boot(conn, Sysfs(str(tmp_path)), "other", "n", MAC) == []  # no pid file
    (tmp_path / "run/libvirt/qemu/vm.pid").write_text("../../etc")
    assert facts_libvirt.leases_before_boot(conn, Sysfs(str(tmp_path)), "vm", "n", MAC) == []
    (tmp_path / "run/libvirt/qemu/vm.pid").write_text("4242")
    infinite = FakeConn(FakeNetwork(NETWORK.format("<lease expiry='0'/>"), held))
    assert facts_libvirt.leases_before_boot(infinite, Sysfs(str(tmp_path)), "vm", "n", MAC) == []


@pytest.mark.parametrize(
    "ticks", ["9" * 400, "1" * 5000, "\u00b2\u00b3", "-5"], ids=["400 digits", "5000", "sup", "neg"]
)
def test_a_hostile_start_time_is_unknown_never_an_exception(tmp_path: Path, ticks: str) -> None:
    """A 400-digit start time once raised OverflowError (issue 49): one bounded reader of host numbers."""
    stage(tmp_path, start_ticks=ticks)  # type: ignore[arg-type]
    assert process_started(Sysfs(str(tmp_path)), "4242") is None
