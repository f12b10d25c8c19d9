"""The domain XML builder: every combination it supports passes libvirt's own
schema check (virt-xml-validate), and the XML means what it should: functions
of a GPU together on one multifunction guest slot behind a pcie-root-port, vCPUs
on the GPU's NUMA node, hugepages, mdev and VF vGPUs, UEFI without Secure Boot."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gpuprov.core.vm_spec import ROM_DIR, HostSettings
from gpuprov.facts.numa import parse_cpulist
from gpuprov.plan.vm.domain import DomainConfig, PciPassthrough, build_domain, domain_xml
from gpuprov.plan.vm.fit import plan_host
from gpuprov.plan.vm.plan import domain_config, vm_paths
from tests.vmhosts import GIB_KIB, nvidia_vgpu_host, sriov_vgpu_host, two_node_host

VALIDATE = shutil.which("virt-xml-validate")
MDEV = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"

DEVICES = {
    "none": {},
    "gpu+audio": {"pci": [PciPassthrough(["0000:41:00.0", "0000:41:00.1"])]},
    "two-gpus": {"pci": [PciPassthrough(["0000:41:00.0", "0000:41:00.1"]), PciPassthrough(["0000:c1:00.0"])]},
    "mdev": {"mdevs": [MDEV]},
    "sriov-vf": {"pci": [PciPassthrough(["0000:41:00.4"])]},
    "all": {
        "pci": [PciPassthrough(["0000:41:00.0", "0000:41:00.1"]), PciPassthrough(["0000:41:00.4"])],
        "mdevs": [MDEV],
    },
}
ROMS = {"default": None, "on": "on", "off": "off", "file": f"{ROM_DIR}/vbios.rom"}
TUNING = {
    "unpinned": {},
    "pinned": {"cpus": [16, 17], "numa_node": 1},
    "pinned+hugepages-2M": {"cpus": [16, 17], "numa_node": 1, "hugepage_kib": 2048},
    "pinned+hugepages-1G": {"cpus": [16, 17], "numa_node": 1, "hugepage_kib": GIB_KIB},
}
GUEST = {
    "bare": {},
    "cloud": {
        "disk": "/var/lib/libvirt/images/gpuprov/vm.qcow2",
        "seed": "/var/lib/libvirt/images/gpuprov/vm-seed.iso",
        "network": "default",
        "mac": "52:54:00:12:34:56",
        "serial_log": "/var/log/libvirt/qemu/vm-serial.log",
    },
    "kernel-boot": {
        "disk": "/srv/vm.qcow2",
        "kernel": "/srv/vmlinuz",
        "initrd": "/srv/initrd.img",
        "cmdline": "root=/dev/vda console=ttyS0",
        "network": "default",
    },
}


def config(**kw) -> DomainConfig:
    base = {"name": "vm", "memory_kib": 4 * GIB_KIB, "vcpus": 2}
    return DomainConfig(**{**base, **kw})


def validate(xml: str, tmp_path: Path) -> None:
    assert VALIDATE, "virt-xml-validate is missing: scripts/bootstrap.sh test installs libvirt-clients"
    path = tmp_path / "domain.xml"
    path.write_text(xml)
    out = subprocess.run([VALIDATE, str(path), "domain"], capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"{out.stdout}{out.stderr}\n{xml}"


COMBOS = list(itertools.product(("efi", "bios"), ("kvm", "qemu"), DEVICES, (False, True)))


@pytest.mark.parametrize(("firmware", "domain_type", "devices", "hide_kvm"), COMBOS)
def test_every_firmware_accel_and_device_combination_validates(
    firmware, domain_type, devices, hide_kvm, tmp_path
) -> None:
    cfg = config(firmware=firmware, domain_type=domain_type, hide_kvm=hide_kvm, **DEVICES[devices], **GUEST["cloud"])
    validate(domain_xml(cfg), tmp_path)


@pytest.mark.parametrize(("rom", "tuning", "guest"), list(itertools.product(ROMS, TUNING, GUEST)))
def test_every_rom_tuning_and_guest_combination_validates(rom, tuning, guest, tmp_path) -> None:
    pci = [PciPassthrough(["0000:41:00.0", "0000:41:00.1"], rom=ROMS[rom]), PciPassthrough(["0000:41:00.4"])]
    cfg = config(pci=pci, mdevs=[MDEV], vendor_id="abc123", hide_kvm=True, **TUNING[tuning], **GUEST[guest])
    validate(domain_xml(cfg), tmp_path)


def hostdevs(root: ET.Element) -> list[ET.Element]:
    return root.findall("devices/hostdev")


def guest_address(hostdev: ET.Element) -> tuple[int, int, int]:
    a = hostdev.find("address")
    assert a is not None
    return int(a.get("bus", ""), 16), int(a.get("slot", ""), 16), int(a.get("function", ""), 16)


def test_functions_of_a_gpu_share_one_multifunction_guest_slot_behind_a_root_port() -> None:
    root = build_domain(
        config(pci=[PciPassthrough(["0000:41:00.0", "0000:41:00.1"]), PciPassthrough(["0000:c1:00.0"])])
    )
    ports = [c for c in root.findall("devices/controller") if c.get("model") == "pcie-root-port"]
    assert [p.get("index") for p in ports] == ["1", "2"]
    gpu, audio, other = hostdevs(root)
    assert guest_address(gpu) == (1, 0, 0) and guest_address(audio) == (1, 0, 1)
    assert gpu.find("address").get("multifunction") == "on"  # function 0 carries it
    assert audio.find("address").get("multifunction") is None
    assert guest_address(other) == (2, 0, 0) and other.find("address").get("multifunction") is None
    assert all(h.get("managed") == "yes" and h.get("type") == "pci" for h in (gpu, audio, other))
    sources = [h.find("source/address").attrib for h in (gpu, audio)]
    assert sources == [
        {"domain": "0x0000", "bus": "0x41", "slot": "0x00", "function": "0x0"},
        {"domain": "0x0000", "bus": "0x41", "slot": "0x00", "function": "0x1"},
    ]


@pytest.mark.parametrize(
    ("rom", "attrs"), [("on", {"bar": "on"}), ("off", {"bar": "off"}), ("/r.rom", {"file": "/r.rom"})]
)
def test_rom_goes_on_function_0_only(rom, attrs) -> None:
    gpu, audio = hostdevs(build_domain(config(pci=[PciPassthrough(["0000:41:00.0", "0000:41:00.1"], rom=rom)])))
    assert gpu.find("rom").attrib == attrs and audio.find("rom") is None


def test_mdev_and_sriov_vf_vgpus() -> None:
    root = build_domain(config(pci=[PciPassthrough(["0000:41:00.4"])], mdevs=[MDEV]))
    vf, mdev = hostdevs(root)
    assert vf.get("type") == "pci" and vf.find("source/address").get("function") == "0x4"
    assert (mdev.get("mode"), mdev.get("type"), mdev.get("model")) == ("subsystem", "mdev", "vfio-pci")
    assert mdev.find("source/address").get("uuid") == MDEV
    assert guest_address(vf) == (1, 0, 0) and guest_address(mdev) == (2, 0, 0)  # each on its own root port
    assert root.find("devices/memballoon").get("model") == "none"  # VFIO pins all guest memory


def test_consumer_gpu_features_and_interrupts() -> None:
    root = build_domain(config(hide_kvm=True, vendor_id="abc123"))
    assert root.find("features/kvm/hidden").get("state") == "on"
    assert root.find("features/hyperv/vendor_id").attrib == {"state": "on", "value": "abc123"}
    assert root.find("features/ioapic").get("driver") == "kvm"
    assert root.find("features/apic") is not None
    assert root.find("cpu").get("mode") == "host-passthrough"
    plain = build_domain(config())
    assert plain.find("features/kvm") is None and plain.find("features/hyperv") is None


def test_tcg_domain_has_no_kvm_only_settings() -> None:
    root = build_domain(config(domain_type="qemu"))
    assert root.get("type") == "qemu"
    assert root.find("features/ioapic").get("driver") == "qemu"
    assert root.find("cpu").get("mode") is None


def test_uefi_without_secure_boot_and_bios() -> None:
    efi = build_domain(config(firmware="efi"))
    assert efi.find("os").get("firmware") == "efi"
    assert efi.find("os/firmware/feature").attrib == {"enabled": "no", "name": "secure-boot"}
    assert efi.find("os/type").get("machine") == "q35"
    bios = build_domain(config(firmware="bios"))
    assert bios.find("os").get("firmware") is None and bios.find("os/firmware") is None


def test_storage_seed_nic_and_serial_log() -> None:
    root = build_domain(config(**GUEST["cloud"]))
    disk, cdrom = root.findall("devices/disk")
    assert disk.find("driver").get("type") == "qcow2" and disk.find("target").get("bus") == "virtio"
    assert cdrom.get("device") == "cdrom" and cdrom.find("readonly") is not None
    assert cdrom.find("source").get("file").endswith("vm-seed.iso")
    nic = root.find("devices/interface")
    assert nic.find("source").get("network") == "default" and nic.find("model").get("type") == "virtio"
    assert nic.find("mac").get("address") == "52:54:00:12:34:56"
    assert root.find("devices/serial/log").get("file") == "/var/log/libvirt/qemu/vm-serial.log"


# ---------------------------------------------------------------- from host facts


def test_pinning_and_memory_on_the_gpus_numa_node(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root")
    vms = [
        {"name": "a", "vcpus": 4, "memory_mib": 8192, "gpus": ["0000:c1:00.0"]},
        {"name": "b", "vcpus": 4, "memory_mib": 8192, "gpus": ["0000:41:00.0"]},
        {"name": "c", "vcpus": 2, "memory_mib": 4096, "numa_node": 1},
    ]
    plan = plan_host(facts, vms, HostSettings(reserved_cpus="0,16"))
    assert not plan.refusals, plan.refusals
    node1 = set(parse_cpulist("16-31"))
    a, b, c = (plan.placements[n] for n in "abc")
    assert (a.node, a.cpus) == (1, [17, 18, 19, 20])  # GPU c1:00.0 is on node 1; CPU 16 kept for the host
    assert (b.node, b.cpus) == (0, [1, 2, 3, 4])
    assert (c.node, c.cpus) == (1, [21, 22])  # after a's CPUs: pinned VMs never share
    root = build_domain(domain_config(plan.vm("a"), a, vm_paths(plan.vm("a"), "/srv")))
    pins = [int(p.get("cpuset")) for p in root.findall("cputune/vcpupin")]
    assert pins == a.cpus and set(pins) <= node1
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "1"}


def test_placement_is_overridable(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root")
    vms = [{"name": "a", "vcpus": 2, "gpus": ["0000:c1:00.0"], "numa_node": 0, "cpuset": "8-9"}]
    plan = plan_host(facts, vms, HostSettings())
    assert (plan.placements["a"].node, plan.placements["a"].cpus) == (0, [8, 9])
    assert any("while its GPU is on node 1" in w for w in plan.warnings)
    unpinned = plan_host(facts, [{"name": "a", "pin": False, "gpus": ["0000:c1:00.0"]}], HostSettings())
    root = build_domain(domain_config(unpinned.vm("a"), unpinned.placements["a"], {}))
    assert root.find("cputune") is None and root.find("numatune/memory").get("nodeset") == "1"


def test_hugepages_back_memory_when_reserved_on_the_node(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root", pages={GIB_KIB: 16})
    vms = [
        {"name": "big", "memory_mib": 16384, "gpus": ["0000:c1:00.0"]},
        {"name": "more", "memory_mib": 1024, "numa_node": 1},  # node 1's 1G pages are all taken
        {"name": "node0", "memory_mib": 1024, "gpus": ["0000:41:00.0"]},  # none reserved on node 0
    ]
    plan = plan_host(facts, vms, HostSettings())
    assert not plan.refusals, plan.refusals
    assert [plan.placements[n].hugepage_kib for n in ("big", "more", "node0")] == [GIB_KIB, None, None]
    root = build_domain(domain_config(plan.vm("big"), plan.placements["big"], {}))
    assert root.find("memoryBacking/hugepages/page").attrib == {"size": "1048576", "unit": "KiB"}
    assert plan.resources["memory"]["vms_in_hugepages_mib"] == 16384


def test_companions_join_the_gpu_from_host_facts(host_root) -> None:
    from gpuprov.facts.host import gather
    from gpuprov.facts.sysfs import Sysfs

    facts = gather(Sysfs(str(host_root("gpu-audio"))))
    vm = {"name": "a", "memory_mib": 256, "gpus": ["0000:01:00.0"]}
    plan = plan_host(facts, [vm], HostSettings(reserved_memory_mib=0))
    assert not plan.refusals, plan.refusals
    assert plan.placements["a"].pci_slots == [["0000:01:00.0", "0000:01:00.1"]]
    gpu, audio = hostdevs(build_domain(domain_config(plan.vm("a"), plan.placements["a"], {})))
    assert guest_address(gpu)[:2] == guest_address(audio)[:2] and gpu.find("address").get("multifunction") == "on"


def test_consumer_nvidia_gpu_gets_hidden_kvm(tmp_path) -> None:
    facts = two_node_host(tmp_path / "root")
    facts.pci["0000:41:00.0"].device_name = "AD102 [GeForce RTX 4090]"
    plan = plan_host(facts, [{"name": "a", "gpus": ["0000:41:00.0"]}, {"name": "b", "gpus": ["0000:c1:00.0"]}])
    assert plan.placements["a"].hide_kvm is True and plan.placements["b"].hide_kvm is False


def test_vgpu_vms_from_host_facts(tmp_path) -> None:
    facts = nvidia_vgpu_host(tmp_path / "mdev")
    plan = plan_host(facts, [{"name": "a", "mdevs": [{"parent": "0000:41:00.0", "type": "nvidia-474"}]}])
    assert not plan.refusals, plan.refusals
    (mdev,) = hostdevs(build_domain(domain_config(plan.vm("a"), plan.placements["a"], {})))
    assert mdev.find("source/address").get("uuid") == plan.vm("a").mdevs[0].uuid
    facts = sriov_vgpu_host(tmp_path / "sriov")
    plan = plan_host(facts, [{"name": "v", "vfs": [{"address": "0000:41:00.5", "vgpu_type": 557}]}])
    assert not plan.refusals, plan.refusals
    assert plan.placements["v"].node == 1  # the PF's node
    (vf,) = hostdevs(build_domain(domain_config(plan.vm("v"), plan.placements["v"], {})))
    assert vf.get("type") == "pci" and vf.find("source/address").get("function") == "0x5"
