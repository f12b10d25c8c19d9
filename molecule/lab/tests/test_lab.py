"""The lab host after converge and idempotence: the IOMMU on through its own GRUB,
edu A and edu B (+ its HD-audio function) on vfio-pci with /dev/vfio groups,
edu C refused (its IOMMU group holds the NIC with the default route), and the
binding back from boot after another reboot.

Addresses (inventories/lab/host_vars/lab-gpu-host.yml, QEMU topology in
gpuprov/lab.py): edu A 0000:01:00.0 alone behind a root port; edu B 0000:02:00.0
with HD audio 0000:02:00.1 behind another; edu C 0000:04:01.0 and the e1000
0000:04:02.0 behind the PCIe-to-PCI bridge 0000:03:00.0. The tests run in file
order: the refusal and the reboot come last.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EDU_A, EDU_B, AUDIO_B = "0000:01:00.0", "0000:02:00.0", "0000:02:00.1"
EDU_C, NIC, BRIDGE = "0000:04:01.0", "0000:04:02.0", "0000:03:00.0"
BOUND = [EDU_A, EDU_B, AUDIO_B]
HOST_DRIVERS = {EDU_C: None, NIC: "e1000"}
MANAGED = [
    "/etc/udev/rules.d/61-gpuprov-vfio.rules",
    "/etc/modprobe.d/gpuprov-vfio.conf",
    "/etc/initramfs-tools/hooks/gpuprov-vfio",
    "/etc/modules-load.d/gpuprov-vfio.conf",
    "/etc/default/grub",
    "/boot/grub/grub.cfg",
]


def driver(host, addr: str) -> str | None:
    out = host.run("readlink /sys/bus/pci/devices/%s/driver", addr)
    return os.path.basename(out.stdout.strip()) if out.rc == 0 else None


def char_device(host, path: str) -> bool:
    return host.run("test -c %s", path).rc == 0


def group(host, addr: str) -> str:
    return os.path.basename(host.check_output("readlink /sys/bus/pci/devices/%s/iommu_group", addr))


def members(host, addr: str) -> list[str]:
    return sorted(host.check_output("ls /sys/kernel/iommu_groups/%s/devices", group(host, addr)).split())


def snapshot(host) -> str:
    """Drivers, overrides, routes and the managed files' hashes: what a refusal must not touch."""
    return host.check_output(
        "for d in /sys/bus/pci/devices/*; do echo $d $(readlink $d/driver) $(cat $d/driver_override); done; "
        f"ip route; sha256sum {' '.join(MANAGED)} /boot/initrd.img-*"
    )


def adhoc(*args: str) -> subprocess.CompletedProcess:
    """`ansible gpu_hosts ...` with this scenario's inventory (inventories/lab, linked) and ansible.cfg."""
    inventory = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    ansible = Path(sys.executable).with_name("ansible")
    cmd = [str(ansible if ansible.exists() else "ansible"), "-i", inventory, "gpu_hosts", *args]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, check=False)


def test_iommu_came_on_through_the_hosts_own_grub(host):
    cmdline = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" in cmdline and "iommu=pt" in cmdline, cmdline
    assert "intel_iommu=off" not in cmdline, cmdline
    # The role edited GRUB's defaults by argument (quiet kept), update-grub wrote the menu, GRUB booted it.
    grub = host.file("/etc/default/grub").content_string
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"' in grub, grub
    assert 'GRUB_CMDLINE_LINUX="console=ttyS0 panic=-1"' in grub, grub
    assert "intel_iommu=on iommu=pt" in host.file("/boot/grub/grub.cfg").content_string
    assert host.file("/sys/class/iommu/dmar0").exists
    assert int(host.check_output("ls /sys/kernel/iommu_groups | wc -l")) >= 8


def test_iommu_groups_are_the_topologys(host):
    assert members(host, EDU_A) == [EDU_A]
    assert members(host, EDU_B) == [EDU_B, AUDIO_B]
    assert members(host, EDU_C) == [BRIDGE, EDU_C, NIC]


@pytest.mark.parametrize("addr", BOUND)
def test_chosen_devices_are_on_vfio_pci(host, addr):
    assert driver(host, addr) == "vfio-pci"
    assert host.file(f"/sys/bus/pci/devices/{addr}/driver_override").content_string.strip() == "vfio-pci"


@pytest.mark.parametrize("addr", sorted(HOST_DRIVERS))
def test_the_nic_group_stays_with_the_host(host, addr):
    assert driver(host, addr) == HOST_DRIVERS[addr]
    assert host.run("ip route show default").stdout.split()[:5] == ["default", "via", "10.0.2.2", "dev", "ens2"]


def test_dev_vfio_has_the_bound_groups_only(host):
    for addr in (EDU_A, EDU_B):
        assert char_device(host, f"/dev/vfio/{group(host, addr)}"), addr
    assert not host.file(f"/dev/vfio/{group(host, EDU_C)}").exists


def test_binding_from_boot_is_configured(host):
    rules = host.file("/etc/udev/rules.d/61-gpuprov-vfio.rules").content_string
    for addr in BOUND:
        assert f'KERNEL=="{addr}", ATTR{{driver_override}}="vfio-pci"' in rules, rules
    assert EDU_C not in rules
    assert "softdep snd_hda_intel pre: vfio-pci" in host.file("/etc/modprobe.d/gpuprov-vfio.conf").content_string
    initramfs = host.check_output("lsinitramfs /boot/initrd.img-$(uname -r)").split()
    assert "etc/udev/rules.d/61-gpuprov-vfio.rules" in initramfs
    assert any(p.endswith("/vfio-pci.ko") for p in initramfs)


def test_edu_sharing_a_group_with_the_default_route_nic_is_refused(host):
    before = snapshot(host)
    run = adhoc("-m", "vfio_bind", "-a", f"devices={EDU_C}")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "refused, nothing changed" in out, out
    assert f"{NIC} is NIC ens2, which carries the default route" in out, out
    assert snapshot(host) == before


def test_binding_persists_across_a_reboot(host):
    boot_id = host.file("/proc/sys/kernel/random/boot_id").content_string
    run = adhoc("-m", "ansible.builtin.reboot", "-a", "reboot_timeout=600")
    assert run.returncode == 0, run.stdout + run.stderr
    # The first look after boot, before any Ansible run: udev's rule (from the initramfs on)
    # gave the devices to vfio-pci.
    assert host.file("/proc/sys/kernel/random/boot_id").content_string != boot_id
    assert {a: driver(host, a) for a in [*BOUND, *HOST_DRIVERS]} == {
        **dict.fromkeys(BOUND, "vfio-pci"),
        **HOST_DRIVERS,
    }
    for addr in (EDU_A, EDU_B):
        assert char_device(host, f"/dev/vfio/{group(host, addr)}"), addr
