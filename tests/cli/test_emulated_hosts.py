"""inspect over hosts captured from real boots of emulated q35 + Intel IOMMU
machines (dev/emuhost): real kernel groups, drivers, mounts, swap, routes.
tests/fixtures/hosts/README.md describes each topology."""

from __future__ import annotations

import pytest

from gpuprov.facts.host import HostFacts, gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.rules.assess import GpuAssessment, assess

EDU = "1234:11e8"


def load(host_root, name: str) -> tuple[HostFacts, dict[str, GpuAssessment]]:
    facts = gather(Sysfs(str(host_root(name))))
    edus = [a for a, d in facts.pci.items() if d.id_pair == EDU]
    return facts, {a.address: a for a in assess(facts, extra=edus)}


def blockers(a: GpuAssessment) -> list[str]:
    return [f.message for f in a.blockers]


def test_iommu_is_really_on(host_root) -> None:
    facts, _ = load(host_root, "gpu-alone")
    assert facts.iommu.enabled and facts.iommu.units == ["dmar0"] and facts.iommu.vendor == "intel"
    assert facts.iommu.args == {"intel_iommu": "on", "iommu": "pt"}
    assert facts.iommu.passthrough is True and facts.iommu.interrupt_remapping == "supported"
    assert facts.iommu.modules["vfio_pci"] == "loaded"


def test_gpu_alone_is_ready(host_root) -> None:
    facts, gpus = load(host_root, "gpu-alone")
    edu = gpus["0000:01:00.0"]
    assert edu.ready and edu.group_members == ["0000:01:00.0"] and edu.companions == []
    assert facts.pci["0000:01:00.0"].parent == "0000:00:01.0"


def test_gpu_with_audio_companion(host_root) -> None:
    _, gpus = load(host_root, "gpu-audio")
    edu = gpus["0000:01:00.0"]
    assert edu.ready
    assert edu.group_members == ["0000:01:00.0", "0000:01:00.1"]
    assert edu.companions == ["0000:01:00.1"]
    assert any(
        f.code == "companion" and "HD audio 0000:01:00.1 (driver snd_hda_intel)" in f.message for f in edu.findings
    )


def test_gpu_sharing_a_group_with_the_default_route_nic(host_root) -> None:
    facts, gpus = load(host_root, "gpu-bridge-nic")
    edu = gpus["0000:02:01.0"]
    assert set(edu.group_members) == {"0000:01:00.0", "0000:02:01.0", "0000:02:02.0"}
    assert not edu.ready
    assert any("0000:02:02.0 is NIC eth0, which carries the default route" in m for m in blockers(edu))
    assert facts.usage.net["eth0"].addresses == ["10.0.2.15"]


def test_boot_vga_and_console(host_root) -> None:
    _, gpus = load(host_root, "boot-vga")
    boot, second = gpus["0000:00:02.0"], gpus["0000:02:00.0"]
    assert any("is the boot display (boot_vga=1)" in m for m in blockers(boot))
    assert any("drives the framebuffer console" in m for m in blockers(boot))
    assert any(f.code == "no-reset" for f in boot.findings)
    # The second display has its own fbdev but no console: it may be passed through.
    assert second.ready, blockers(second)
    assert gpus["0000:01:00.0"].ready


def test_gpu_sharing_a_group_with_nvme_in_use(host_root) -> None:
    _, gpus = load(host_root, "nvme-swap")
    edu = gpus["0000:03:00.0"]
    assert not edu.ready
    (msg,) = [m for m in blockers(edu) if "controls block device" in m]
    assert "0000:04:00.0 controls block device nvme1n1" in msg
    assert "nvme1n1p1 mounted at /var/lib/libvirt/images" in msg and "nvme1n1p2 swap" in msg


def test_gpu_behind_a_switch_without_acs(host_root) -> None:
    _, gpus = load(host_root, "gpu-switch")
    edu = gpus["0000:03:00.0"]
    assert edu.group_members == ["0000:02:00.0", "0000:03:00.0"]  # downstream port stays with pcieport
    assert edu.ready


def test_vfio_bound_device_held_by_a_process(host_root) -> None:
    facts, gpus = load(host_root, "vfio-bound")
    edu = gpus["0000:01:00.0"]
    assert facts.pci["0000:01:00.0"].driver == "vfio-pci"
    assert [f.code for f in edu.blockers] == ["in-use"]
    assert "has /dev/vfio/6 open" in edu.blockers[0].message


def test_mtty_mdev_parent_and_instance(host_root) -> None:
    facts, _ = load(host_root, "mtty-mdev")
    types = facts.mdev_parents["mtty"].types
    assert types["mtty-2"].name == "Dual port serial" and types["mtty-2"].device_api == "vfio-pci"
    assert types["mtty-2"].instances == ["83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"]
    (mdev,) = facts.mdevs
    assert (mdev.parent, mdev.type_id, mdev.driver) == ("mtty", "mtty-2", "mtty")


@pytest.mark.parametrize("name", ["gpu-alone", "gpu-audio", "gpu-bridge-nic", "nvme-swap", "vfio-bound"])
def test_system_disk_and_nic_are_host_critical(name, host_root) -> None:
    facts, _ = load(host_root, name)
    assert any(b.in_use and "mounted at /srv" in b.uses for b in facts.usage.block.values())
    assert facts.usage.net["eth0"].carries_default_route
