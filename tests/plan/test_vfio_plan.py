"""vfio planning and applying over real captured hosts and fake trees: every
safety refusal with its text and nothing changed; binds, files, idempotence."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpuprov.apply.actions import ApplyError, apply
from gpuprov.facts.files import read_text
from gpuprov.facts.host import gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.host.vfio import INITRAMFS_HOOK, MANAGED_FILES, MODPROBE_CONF, UDEV_RULES, VfioRequest, plan_vfio
from tests.conftest import tree_digest


@pytest.fixture
def staged(host_root, tmp_path):
    """A writable copy of a captured host."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(host_root(name), dest, symlinks=True)
        return dest

    return copy


def plan_for(root: Path, devices: list[str], **kw):
    sysfs = Sysfs(str(root))
    files = {p: read_text(sysfs, p) for p in MANAGED_FILES}
    return plan_vfio(gather(sysfs), VfioRequest(devices=devices, **kw), files, kw.pop("initramfs", None))


# ------------------------------------------------------------------ refusals, per safety rule


@pytest.mark.parametrize(
    ("host", "devices", "kw", "text"),
    [
        ("boot-vga", ["0000:00:02.0"], {}, "0000:00:02.0: 0000:00:02.0 is the boot display (boot_vga=1)"),
        ("boot-vga", ["0000:00:02.0"], {}, "0000:00:02.0 drives the framebuffer console"),
        ("nvme-swap", ["0000:03:00.0"], {}, "0000:04:00.0 controls block device nvme1n1 (nvme1n1p1 mounted at"),
        ("gpu-bridge-nic", ["0000:02:01.0"], {}, "0000:02:02.0 is NIC eth0, which carries the default route"),
        ("gpu-alone", ["0000:00:1f.3"], {}, "0000:00:1f.0 is a chipset device (ISA bridge)"),
        ("gpu-alone", ["0000:00:1f.3"], {}, "0000:00:1f.3 is a chipset device (SMBus controller)"),
        ("vfio-bound", ["0000:01:00.0"], {"state": "unbound"}, "0000:01:00.0 is in use: sleep (pid"),
        ("h100-passthrough-guest", ["0000:00:06.0"], {}, "the IOMMU is off"),
        ("gpu-alone", ["41:00"], {}, "'41:00' is not a PCI address"),
        ("gpu-alone", ["0000:41:00.0"], {}, "no PCI device 0000:41:00.0 on this host"),
        ("gpu-alone", [], {}, "no devices given"),
    ],
)
def test_refusal_names_the_problem_and_changes_nothing(staged, host, devices, kw, text) -> None:
    root = staged(host)
    before = tree_digest(root)
    plan = plan_for(root, devices, **kw)
    assert plan.refused and not plan.actions
    assert text in plan.refusal_text()
    assert all(r.fix or "PCI address" in r.message or "devices given" in r.message for r in plan.refusals)
    with pytest.raises(ApplyError, match="refused, nothing changed"):
        apply(plan, str(root))
    assert tree_digest(root) == before


def test_gpu_held_by_the_nvidia_driver_is_refused(fake) -> None:
    fake.pci("0000:40:01.0", cls=0x060400, vendor=0x8086, driver="pcieport", group=5)
    fake.pci("0000:41:00.0", cls=0x030200, driver="nvidia", group=5, parent="0000:40:01.0")
    fake.write("proc/driver/nvidia/gpus/0000:41:00.0/information", "Model: H100\nDevice Minor: 0\n")
    fake.open_file(321, "python3", "/dev/nvidia0")
    root = fake.finish()
    plan = plan_for(root, ["0000:41:00.0"])
    assert "0000:41:00.0 is in use: python3 (pid 321) has /dev/nvidia0 open" in plan.refusal_text()


def test_group_shared_with_a_device_not_being_bound(fake) -> None:
    fake.pci("0000:40:01.0", cls=0x060400, vendor=0x8086, driver="pcieport", group=5)
    fake.pci("0000:41:00.0", cls=0x030000, driver="nouveau", group=5, parent="0000:40:01.0")
    fake.pci("0000:42:00.0", cls=0x0C0330, vendor=0x1912, driver="xhci_hcd", group=5, parent="0000:40:01.0")
    root = fake.finish()
    assert "shares IOMMU group 5 with 0000:42:00.0" in plan_for(root, ["0000:41:00.0"]).refusal_text()
    # Naming the other device too makes the group whole: no refusal.
    assert not plan_for(root, ["0000:41:00.0", "0000:42:00.0"]).refused


def test_expert_override_binds_with_a_loud_warning(staged) -> None:
    root = staged("gpu-bridge-nic")
    plan = plan_for(root, ["0000:02:01.0"], allow_unsafe=["0000:02:01.0"])
    assert not plan.refused
    assert any("OVERRIDDEN by allow_unsafe" in w and "default route" in w for w in plan.warnings)


def test_devices_and_allow_unsafe_pass_the_one_address_rule_and_are_compared_normalised(staged) -> None:
    """Both options go through gpuprov.inputs.validate.pci_address: the short or upper-case form of
    an address is the address (the override used to be compared as written, so it missed), and a
    malformed override is refused, naming the item, instead of overriding nothing."""
    root = staged("gpu-bridge-nic")
    plan = plan_for(root, ["02:01.0"], allow_unsafe=["0000:02:01.0".upper()])
    assert not plan.refused and plan.bind_set[0] == "0000:02:01.0"
    assert any("OVERRIDDEN by allow_unsafe" in w for w in plan.warnings)
    bad = plan_for(root, ["0000:02:01.0"], allow_unsafe=["02:01"])
    assert bad.refused and not bad.actions
    assert bad.refusals[0].message.startswith("allow_unsafe[0]: '02:01' is not a PCI address")
    assert plan_for(root, ["0000:02:01.0\n"]).refusals[0].message.startswith("devices[0]: '0000:02:01.0\\n' holds")


# ------------------------------------------------------------------ binding


def test_bind_plan_takes_the_companion_and_leaves_the_root_port(staged) -> None:
    root = staged("gpu-audio")
    plan = plan_for(root, ["0000:01:00.0"])
    assert plan.bind_set == ["0000:01:00.0", "0000:01:00.1"]
    assert plan.previous_drivers == {"0000:01:00.0": None, "0000:01:00.1": "snd_hda_intel"}
    text = "\n".join(plan.describe())
    assert "write '0000:01:00.1' to /sys/bus/pci/drivers/snd_hda_intel/unbind" in text
    assert "'0000:00:01.0'" not in text and "0000:00:01.0/driver_override" not in text  # port stays
    assert text.index("driver_override") < text.index("unbind") < text.index("drivers_probe")


def test_apply_on_a_staged_root_writes_files_only_and_is_idempotent(staged) -> None:
    root = staged("gpu-audio")
    sys_before = tree_digest(root / "sys")
    applied = apply(plan_for(root, ["0000:01:00.0"]), str(root))
    assert applied.changed and applied.not_run  # sysfs writes are for the live root only
    assert tree_digest(root / "sys") == sys_before
    rules = (root / UDEV_RULES).read_text()
    assert 'KERNEL=="0000:01:00.0", ATTR{driver_override}="vfio-pci"' in rules
    assert 'KERNEL=="0000:01:00.1", ATTR{driver_override}="vfio-pci"' in rules
    assert "softdep nvidia pre: vfio-pci" in (root / MODPROBE_CONF).read_text()
    assert os.access(root / INITRAMFS_HOOK, os.X_OK)
    again = plan_for(root, ["0000:01:00.0"])
    assert [a for a in again.actions if not a.live_only] == []


def test_two_identical_gpus_only_the_named_one_is_bound(fake) -> None:
    for bus, group in ((0x01, 1), (0x41, 2)):
        fake.pci(f"0000:{bus:02x}:00.0", cls=0x030000, device=0x2204, driver="nvidia", group=group)
    plan = plan_for(fake.finish(), ["0000:41:00.0"])
    assert plan.bind_set == ["0000:41:00.0"]
    assert "0000:01:00.0" not in "\n".join(plan.describe())


def test_unbind_releases_and_drops_the_boot_binding(staged) -> None:
    root = staged("gpu-audio")
    apply(plan_for(root, ["0000:01:00.0"]), str(root))
    plan = plan_for(root, ["0000:01:00.0"], state="unbound")
    assert not plan.refused
    apply(plan, str(root))
    for path in (UDEV_RULES, MODPROBE_CONF, INITRAMFS_HOOK):
        assert not (root / path).exists()


def test_already_bound_device_in_use_by_its_vm_plans_nothing(staged) -> None:
    root = staged("vfio-bound")
    plan = plan_for(root, ["0000:01:00.0"], persistent=False)
    assert not plan.refused and plan.actions == []


def test_dracut_host_gets_dracut_config_and_rebuild(staged) -> None:
    root = staged("gpu-alone")
    sysfs = Sysfs(str(root))
    files = {p: read_text(sysfs, p) for p in MANAGED_FILES}
    plan = plan_vfio(gather(sysfs), VfioRequest(devices=["0000:01:00.0"]), files, ["dracut"])
    text = "\n".join(plan.describe())
    assert "create /etc/dracut.conf.d/gpuprov-vfio.conf" in text and "run dracut -f --regenerate-all" in text
    assert INITRAMFS_HOOK not in text


def test_unbind_is_not_blocked_by_the_rules_for_binding(staged) -> None:
    # The IOMMU is off in this guest: binding is refused, giving back is not.
    root = staged("h100-passthrough-guest")
    assert plan_for(root, ["0000:00:06.0"]).refused
    assert not plan_for(root, ["0000:00:06.0"], state="unbound").refused
