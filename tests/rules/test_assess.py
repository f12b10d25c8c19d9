"""Each safety rule of docs/concepts/safety-rules.md, one fake host each: the finding and its text."""

from __future__ import annotations

from gpuprov.facts.host import gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.rules.assess import assess, assess_gpu
from tests.fakehost import FakeHost

GPU = "0000:41:00.0"
AUDIO = "0000:41:00.1"


def findings(fake: FakeHost, address: str = GPU) -> dict[str, list[str]]:
    facts = gather(Sysfs(str(fake.finish())))
    out: dict[str, list[str]] = {}
    for f in assess_gpu(facts, address).findings:
        out.setdefault(f.code, []).append(f"{f.severity}: {f.message}")
    return out


def gpu_on_root_port(fake: FakeHost, *, group: int = 5, driver: str | None = "nvidia", **kw) -> None:
    fake.pci("0000:40:01.0", cls=0x060400, vendor=0x8086, device=0x1234, driver="pcieport", group=group)
    fake.pci(GPU, cls=0x030000, driver=driver, group=group, parent="0000:40:01.0", **kw)


def test_gpu_alone_in_its_group_is_ready(fake) -> None:
    gpu_on_root_port(fake)
    found = findings(fake)
    assert not any(m.startswith("blocker") for ms in found.values() for m in ms), found
    assert "host-driver" in found  # bound to nvidia: informs, does not block


def test_iommu_off_blocks_with_vendor_specific_fix(tmp_path) -> None:
    fake = FakeHost(tmp_path, iommu=False, cpu_vendor="AuthenticAMD")
    fake.pci(GPU, cls=0x030000)
    facts = gather(Sysfs(str(fake.finish())))
    (gpu,) = assess(facts)
    (off,) = [f for f in gpu.findings if f.code == "iommu-off"]
    assert off.severity == "blocker" and "AMD-Vi" in (off.fix or "")
    assert not gpu.ready


def test_iommu_off_on_intel_bare_metal_names_the_kernel_args(tmp_path) -> None:
    fake = FakeHost(tmp_path, iommu=False)
    fake.pci(GPU, cls=0x030000)
    (gpu,) = assess(gather(Sysfs(str(fake.finish()))))
    assert "add intel_iommu=on iommu=pt to the kernel command line" in (gpu.findings[0].fix or "")


def test_iommu_on_but_device_has_no_group(fake) -> None:
    fake.pci(GPU, cls=0x030000)
    fake.pci("0000:00:00.0", cls=0x060000, group=0)
    assert "no-iommu-group" in findings(fake)


def test_boot_vga_is_refused(fake) -> None:
    gpu_on_root_port(fake, boot_vga=True)
    (msg,) = findings(fake)["host-critical"]
    assert msg == f"blocker: {GPU} is the boot display (boot_vga=1); binding it to vfio-pci takes it from the host"


def test_framebuffer_console_is_refused(fake) -> None:
    gpu_on_root_port(fake)
    fake.framebuffer(GPU)
    assert "drives the framebuffer console" in findings(fake)["host-critical"][0]


def test_nic_with_default_route_in_group_is_refused(fake) -> None:
    fake.pci("0000:00:1e.0", cls=0x060401, vendor=0x8086, group=7)  # PCIe-to-PCI bridge
    fake.pci(GPU, cls=0x030000, group=7, parent="0000:00:1e.0", link=None)
    fake.pci("0000:41:01.0", cls=0x020000, vendor=0x8086, driver="e1000", group=7, parent="0000:00:1e.0")
    fake.net("eth0", "0000:41:01.0", ipv4="10.0.2.15", gateway="10.0.2.2")
    msgs = findings(fake)["host-critical"]
    assert any("0000:41:01.0 is NIC eth0, which carries the default route" in m for m in msgs), msgs


def test_nic_with_address_through_a_bridge_is_refused(fake) -> None:
    gpu_on_root_port(fake)
    fake.pci("0000:41:00.2", cls=0x020000, vendor=0x8086, driver="igb", group=5, parent="0000:40:01.0")
    fake.net("br0", None, ipv4="192.168.10.5")
    fake.net("enp65s0f2", "0000:41:00.2", master="br0")
    msgs = findings(fake)["host-critical"]
    assert any("is NIC enp65s0f2, with address/route 192.168.10.5, 192.168.10.0/24 through br0" in m for m in msgs)


def test_nic_without_address_is_only_a_shared_group(fake) -> None:
    gpu_on_root_port(fake)
    fake.pci("0000:42:00.0", cls=0x020000, vendor=0x8086, driver="igb", group=5, parent="0000:40:01.0")
    fake.net("enp66s0", "0000:42:00.0")
    found = findings(fake)
    assert "host-critical" not in found
    assert "shares IOMMU group 5 with 0000:42:00.0" in found["group-shared"][0]


def test_storage_with_mount_or_swap_is_refused(fake) -> None:
    gpu_on_root_port(fake)
    fake.pci("0000:42:00.0", cls=0x010802, vendor=0x144D, driver="nvme", group=5, parent="0000:40:01.0")
    fake.block("nvme0n1", "0000:42:00.0", partitions=("nvme0n1p1", "nvme0n1p2"))
    fake.swap("/dev/nvme0n1p1")
    fake.mount("/dev/nvme0n1p2", "/")
    (msg,) = findings(fake)["host-critical"]
    assert msg.startswith(
        "blocker: 0000:42:00.0 controls block device nvme0n1 (nvme0n1p1 swap; nvme0n1p2 mounted at /)"
    )


def test_root_mounted_as_dev_root_resolves_through_cmdline(fake) -> None:
    gpu_on_root_port(fake)
    fake.pci("0000:42:00.0", cls=0x010802, vendor=0x144D, driver="nvme", group=5, parent="0000:40:01.0")
    fake.block("nvme0n1", "0000:42:00.0", partitions=("nvme0n1p2",))
    fake.mount("/dev/root", "/")  # cmdline says root=/dev/nvme0n1p2
    assert any("(nvme0n1p2 mounted at /)" in m for m in findings(fake)["host-critical"])


def test_chipset_devices_are_refused(fake) -> None:
    fake.pci("0000:00:1f.0", cls=0x060100, vendor=0x8086, group=9)  # ISA bridge
    fake.pci("0000:00:1f.4", cls=0x0C0500, vendor=0x8086, driver="i801_smbus", group=9)
    fake.pci("0000:00:1f.5", cls=0x030000, group=9)
    msgs = findings(fake, "0000:00:1f.5")["host-critical"]
    assert any("is a chipset device (ISA bridge)" in m for m in msgs)
    assert any("is a chipset device (SMBus controller)" in m for m in msgs)


def test_device_held_open_is_refused(fake) -> None:
    gpu_on_root_port(fake, driver="vfio-pci")
    fake.open_file(4242, "qemu-system-x86", "/dev/vfio/5")
    (msg,) = findings(fake)["in-use"]
    assert msg == f"blocker: {GPU} is in use: qemu-system-x86 (pid 4242) has /dev/vfio/5 open"


def test_nvidiactl_open_marks_every_nvidia_gpu(fake) -> None:
    gpu_on_root_port(fake)
    fake.open_file(77, "nvidia-persiste", "/dev/nvidiactl")
    assert "in use: nvidia-persiste (pid 77) has /dev/nvidiactl open" in findings(fake)["in-use"][0]


def test_companion_audio_goes_with_the_gpu(fake) -> None:
    gpu_on_root_port(fake)
    fake.pci(AUDIO, cls=0x040300, driver="snd_hda_intel", group=5, parent="0000:40:01.0")
    facts = gather(Sysfs(str(fake.finish())))
    gpu = assess_gpu(facts, GPU)
    assert gpu.ready and gpu.companions == [AUDIO]
    (comp,) = [f for f in gpu.findings if f.code == "companion"]
    assert comp.message == f"companion HD audio {AUDIO} (driver snd_hda_intel) must be passed through with it"


def test_no_reset_and_degraded_link_warn_but_do_not_block(fake) -> None:
    gpu_on_root_port(fake, reset="", link=(2.5, 8, 16.0, 16))
    found = findings(fake)
    assert found["no-reset"][0].startswith("warning: no FLR, PM or bus reset")
    assert found["link-degraded"][0].startswith("warning: PCIe link 2.5 GT/s x8 (max 16 GT/s x16)")
    assert not any(m.startswith("blocker") for ms in found.values() for m in ms)


def test_missing_interrupt_remapping_warns(fake) -> None:
    fake.write("sys/class/iommu/dmar0/intel-iommu/ecap", "f020d0\n")  # IR bit clear
    gpu_on_root_port(fake)
    assert "no-interrupt-remapping" in findings(fake)


def test_vfs_are_listed_under_their_pf_with_vgpu_types(fake) -> None:
    gpu_on_root_port(fake, sriov_totalvfs=16)
    for i in range(2):
        vf = f"0000:41:00.{4 + i}"
        fake.pci(vf, cls=0x030200, driver="nvidia", group=10 + i, parent="0000:40:01.0", physfn=GPU, link=None)
        fake.vgpu_vf(vf, {557: "NVIDIA H100-1-10C", 558: "NVIDIA H100-2-20C"}, current=557 if i == 0 else 0)
    facts = gather(Sysfs(str(fake.finish())))
    (gpu,) = assess(facts)  # VFs are not GPUs of their own
    assert gpu.vgpu["sriov"] == {"total_vfs": 16, "enabled_vfs": 2}
    assert gpu.vgpu["sriov_vgpu"] == {
        "vfs": 2,
        "vfs_in_use": 1,
        "creatable_types": {"557": "NVIDIA H100-1-10C", "558": "NVIDIA H100-2-20C"},
    }


def test_mdev_types_and_instances(fake) -> None:
    gpu_on_root_port(fake)
    fake.mdev_types(GPU, {"nvidia-474": ("GRID V100-8Q", 3), "nvidia-475": ("GRID V100-16Q", 0)})
    fake.mdev(GPU, "nvidia-474", "4b20d080-1b54-4048-85b3-a6a62d165c01")
    facts = gather(Sysfs(str(fake.finish())))
    (inst,) = facts.mdevs
    assert (inst.parent, inst.type_id) == (GPU, "nvidia-474")
    types = {t["type"]: t for t in assess_gpu(facts, GPU).vgpu["mdev_types"]}
    assert types["nvidia-474"]["available_instances"] == 3
    assert types["nvidia-474"]["instances"] == ["4b20d080-1b54-4048-85b3-a6a62d165c01"]
    assert types["nvidia-475"]["name"] == "GRID V100-16Q"


def test_named_non_gpu_device_is_assessed(fake) -> None:
    fake.pci("0000:00:04.0", cls=0x00FF, vendor=0x1234, device=0x11E8, group=3, link=None)
    facts = gather(Sysfs(str(fake.finish())))
    assert assess(facts) == []
    (edu,) = assess(facts, extra=["0000:00:04.0"])
    assert edu.ready and edu.vendor_device == "1234:11e8"
