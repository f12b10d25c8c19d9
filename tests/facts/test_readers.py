"""The readers on odd input: what real kernels show beyond the fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuprov.facts.iommu import parse_cmdline, read_iommu
from gpuprov.facts.mdev import parse_vgpu_types
from gpuprov.facts.names import PciIds
from gpuprov.facts.numa import parse_cpulist, read_numa
from gpuprov.facts.pci import PciAddressError, normalize_address, read_pci_devices
from gpuprov.facts.sysfs import Sysfs


def test_resolve_follows_relative_and_absolute_links_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/pci0000:00/0000:00:01.0").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    os.symlink("../../../devices/pci0000:00/0000:00:01.0", tmp_path / "sys/bus/pci/devices/0000:00:01.0")
    os.symlink("/sys/devices/pci0000:00", tmp_path / "sys/abs")  # absolute: stays in the root
    s = Sysfs(str(tmp_path), trace=True)
    assert s.resolve("sys/bus/pci/devices/0000:00:01.0") == "sys/devices/pci0000:00/0000:00:01.0"
    assert s.resolve("sys/abs/0000:00:01.0") == "sys/devices/pci0000:00/0000:00:01.0"
    assert ("readlink", "sys/bus/pci/devices/0000:00:01.0") in (s.trace or [])


def test_link_loop_terminates(tmp_path: Path) -> None:
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    assert Sysfs(str(tmp_path)).resolve("a/x").endswith("x")


def test_missing_and_unreadable_are_none(tmp_path: Path) -> None:
    s = Sysfs(str(tmp_path))
    (tmp_path / "dir").mkdir()
    assert s.read("nope") is None and s.read("dir") is None
    assert s.listdir("nope") == [] and s.try_listdir("nope") is None
    (tmp_path / "n").write_text("zz\n")
    assert s.read_int("n") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [("41:00.0", "0000:41:00.0"), ("0000:41:00.0", "0000:41:00.0"), ("10000:E1:00.1", "10000:e1:00.1")],
)
def test_addresses_normalized(text: str, expected: str) -> None:
    assert normalize_address(text) == expected


@pytest.mark.parametrize("text", ["", "41:00", "10de:2330", "0000:41:00.8", "0000:41:20.0", "0000:41:00.0.1"])
def test_bad_addresses_say_the_form(text: str) -> None:
    with pytest.raises(PciAddressError, match=r"DOMAIN:BUS:SLOT\.FUNCTION"):
        normalize_address(text)


def test_odd_pci_attributes(fake) -> None:
    # VMD domain, Unknown link speed, width 255, no reset_method (hidden: no reset), garbage class
    fake.pci("10000:e1:00.0", cls=0x010802, link=None, reset=None)
    base = fake.root / fake.paths["10000:e1:00.0"]
    (base / "current_link_speed").write_text("Unknown\n")
    (base / "max_link_width").write_text("255\n")
    (base / "class").write_text("garbage\n")
    (base / "unknown_new_attribute").write_text("42\n")
    dev = read_pci_devices(Sysfs(str(fake.finish())))["10000:e1:00.0"]
    assert dev.link.current_speed is None and dev.link.max_width is None
    assert dev.reset_methods == [] and dev.class_code is None and dev.base_class is None
    assert dev.name == "[10de:2330]" or dev.vendor_name


def test_cmdline_and_iommu_args(fake) -> None:
    assert parse_cmdline("a=b c  d=e=f") == {"a": "b", "c": None, "d": "e=f"}
    fake.cmdline += " vfio-pci.ids=10de:2330 pcie_acs_override=downstream"
    fake.write("proc/modules", "vfio_pci 16384 0 - Live 0x0\nkvm_intel 1 0 - Live 0x0\n")
    fake.write("sys/module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n")
    state = read_iommu(Sysfs(str(fake.finish())))
    assert state.args == {
        "intel_iommu": "on",
        "iommu": "pt",
        "vfio-pci.ids": "10de:2330",
        "pcie_acs_override": "downstream",
    }
    assert state.passthrough is True and state.vendor == "intel"
    assert state.modules == {"vfio": "builtin", "vfio_pci": "loaded"}
    assert state.interrupt_remapping == "supported"


def test_vgpu_type_lines() -> None:
    text = "ID    : vGPU Name\n557   : NVIDIA A100-1-5C\n 558 : NVIDIA A100-2-10C \nnonsense\n"
    assert parse_vgpu_types(text) == {557: "NVIDIA A100-1-5C", 558: "NVIDIA A100-2-10C"}
    assert parse_vgpu_types(None) == {}


def test_numa_nodes_and_hugepages(fake) -> None:
    for n, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        nb = f"sys/devices/system/node/node{n}"
        fake.write(f"{nb}/cpulist", cpus + "\n")
        fake.write(f"{nb}/meminfo", f"Node {n} MemTotal:       65536000 kB\nNode {n} MemFree: 1 kB\n")
        fake.write(f"{nb}/hugepages/hugepages-1048576kB/nr_hugepages", "16\n")
        fake.write(f"{nb}/hugepages/hugepages-1048576kB/free_hugepages", "8\n")
    nodes = read_numa(Sysfs(str(fake.finish())))
    assert [n.node for n in nodes] == [0, 1]
    assert nodes[1].memory_kib == 65536000
    assert nodes[0].hugepages == {"1048576kB": {"total": 16, "free": 8}}
    assert parse_cpulist(nodes[0].cpulist) == [0, 1, 2, 3, 8, 9, 10, 11]


def test_no_numa_directory_means_one_node(fake) -> None:
    fake.write("proc/meminfo", "MemTotal:       24000000 kB\n")
    fake.write("sys/devices/system/cpu/online", "0-1\n")
    (node,) = read_numa(Sysfs(str(fake.finish())))
    assert (node.node, node.cpulist, node.memory_kib) == (0, "0-1", 24000000)


def test_pci_ids_lookup() -> None:
    ids = PciIds(
        "# comment\n10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n"
        "\t\t10de 16c1  H100 SXM5 80GB\n\t2331  GH100 [H100 PCIe]\n1234  Other\n\t2330  Not NVIDIA\n"
    )
    assert ids.lookup(0x10DE, 0x2330) == ("NVIDIA Corporation", "GH100 [H100 SXM5 80GB]")
    assert ids.lookup(0x10DE, 0x9999) == ("NVIDIA Corporation", None)
    assert ids.lookup(0xFFFF, 1) == (None, None)


def test_reset_method_absent_on_old_kernel_is_unknown(fake) -> None:
    fake.write("proc/version", "Linux version 5.4.0-150-generic (buildd@lcy02) #167\n")
    fake.pci("0000:41:00.0", cls=0x030000, reset=None)
    dev = read_pci_devices(Sysfs(str(fake.finish())))["0000:41:00.0"]
    assert dev.reset_methods is None


def _pci_dir(root: Path, rel: str, attrs: dict[str, str], links: dict[str, str] | None = None) -> None:
    d = root / rel
    d.mkdir(parents=True)
    for name, text in attrs.items():
        (d / name).write_text(text + "\n")
    for name, target in (links or {}).items():
        os.symlink(target, d / name)
    bus = root / "sys/bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(f"../../../{rel.removeprefix('sys/')}", bus / rel.rsplit("/", 1)[1])


@pytest.mark.parametrize("openat2", [True, False])
def test_devices_placed_by_listings_and_vfs_of_every_pf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openat2: bool
) -> None:
    # Two PFs on one bus, each with a VF after the other PF in address order; a device on a bus no
    # device's listing shows (behind VMD here) is still read, through its sys/bus/pci/devices link.
    if not openat2:
        monkeypatch.setenv("GPUPROV_NO_OPENAT2", "1")
        monkeypatch.setattr("gpuprov.facts.openat2._state", {})
    port = "sys/devices/pci0000:00/0000:00:01.0"
    _pci_dir(tmp_path, port, {"uevent": "PCI_CLASS=60400\nPCI_ID=8086:1234"})
    for fn, speed in (("0", "16.0 GT/s PCIe"), ("1", "8.0 GT/s PCIe")):
        pf = {"sriov_totalvfs": "2", "current_link_speed": speed, "max_link_speed": speed, "numa_node": "1"}
        _pci_dir(tmp_path, f"{port}/0000:01:00.{fn}", {"uevent": "PCI_CLASS=20000\nPCI_ID=15b3:101d", **pf})
    reserved = {"current_link_speed": "Unknown", "max_link_speed": "Unknown", "numa_node": "-1"}
    for vf, pf_fn in (("0000:01:00.2", "0"), ("0000:01:00.3", "1")):
        attrs = {"uevent": "PCI_CLASS=20000\nPCI_ID=15b3:101e", **reserved}
        _pci_dir(tmp_path, f"{port}/{vf}", attrs, {"physfn": f"../0000:01:00.{pf_fn}"})
    vmd = "sys/devices/pci0000:00/0000:00:0e.0/pci10000:e0/10000:e0:00.0"
    _pci_dir(tmp_path, vmd, {"uevent": "PCI_CLASS=10802\nPCI_ID=144d:a80a"})
    s = Sysfs(str(tmp_path), trace=True)
    devices = read_pci_devices(s)
    assert list(devices) == [
        "0000:00:01.0",
        "0000:01:00.0",
        "0000:01:00.1",
        "0000:01:00.2",
        "0000:01:00.3",
        "10000:e0:00.0",
    ]
    assert devices["10000:e0:00.0"].sysfs_path == vmd and devices["0000:01:00.3"].parent == "0000:00:01.0"
    for vf, pf_addr in (("0000:01:00.2", "0000:01:00.0"), ("0000:01:00.3", "0000:01:00.1")):
        assert devices[vf].link == devices[pf_addr].link and devices[vf].numa_node == 1
    assert devices["0000:01:00.0"].virtfns == ["0000:01:00.2"]
    links = {rel for op, rel in s.trace or [] if op == "readlink" and rel.startswith("sys/bus/pci/devices/")}
    assert links == {"sys/bus/pci/devices/0000:00:01.0", "sys/bus/pci/devices/10000:e0:00.0"}
