"""The lab host after converge and idempotence: the IOMMU on through its own GRUB,
edu A and edu B (+ its HD-audio function) on vfio-pci with /dev/vfio groups,
edu C refused (its IOMMU group holds the NIC with the default route), the mtty
mdev made and defined for boot by the vGPU role, and the nested guest (TCG in
TCG) running with edu A and that mdev: it lists both on its serial console, and
libvirt and QEMU hold both. Then the mdev's lifecycle: removing it while the
running guest uses it is refused, it and the bindings come back after a reboot,
and once the guest is off the vGPU role removes it (and then changes nothing).

Addresses (inventories/lab/host_vars/lab-gpu-host.yml, QEMU topology in
dev/lab/boot.py): edu A 0000:01:00.0 alone behind a root port; edu B 0000:02:00.0
with HD audio 0000:02:00.1 behind another; edu C 0000:04:01.0 and the e1000
0000:04:02.0 behind the PCIe-to-PCI bridge 0000:03:00.0. The tests run in file
order: a run killed during the vfio bind and then during the VM's creation (rerun: the
state of the uninterrupted run), the refusals, the reboot and the removal come last.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# molecule/conftest.py's runners (the folder's name is the molecule package's: loaded by path).
_spec = importlib.util.spec_from_file_location(
    "gpuprov_molecule_conftest", Path(__file__).resolve().parents[2] / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_conftest = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
if not hasattr(_conftest, "run_converge"):
    _spec.loader.exec_module(_conftest)
run_converge = _conftest.run_converge
converge_killed_in = _conftest.converge_killed_in

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from dev.lab.boot import POWER_CYCLE, RESET_BY_LAB  # noqa: E402
from dev.lab.common import lab_dir  # noqa: E402

EDU_A, EDU_B, AUDIO_B = "0000:01:00.0", "0000:02:00.0", "0000:02:00.1"
EDU_C, NIC, BRIDGE = "0000:04:01.0", "0000:04:02.0", "0000:03:00.0"
VM = "lab-nested"
MDEV = "5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01"
SERIAL_LOG = f"/var/log/libvirt/qemu/{VM}-serial.log"
# samples/vfio-mdev/mtty.c: vendor 0x4348, device 0x3253, class 07 00 02 (a 16550 serial port).
MTTY_IDS = "4348:3253"
EDU_IDS = "1234:11e8"
# The vGPU role alone, with the mdev dropped (-e replaces the layout the host model derives).
VGPU_PLAY = Path(__file__).resolve().parents[1] / "vgpu.yml"
NO_MDEV = {"vgpu_host_gpus": {"mtty": {"use": "mdev", "mdevs": []}}}
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


def _ansible(tool: str, *args: str) -> subprocess.CompletedProcess:
    """An Ansible command with this scenario's inventory (inventories/lab, linked) and ansible.cfg."""
    inventory = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    path = Path(sys.executable).with_name(tool)
    cmd = [str(path if path.exists() else tool), "-i", inventory, *args]
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, check=False)


def adhoc(*args: str) -> subprocess.CompletedProcess:
    """`ansible gpu_hosts ...`."""
    return _ansible("ansible", "gpu_hosts", *args)


def vgpu_role(extra_vars: dict) -> tuple[int, int, str]:
    """The vGPU role alone (molecule/lab/vgpu.yml) with extra variables: (rc, changed, output)."""
    run = _ansible("ansible-playbook", str(VGPU_PLAY), "-e", json.dumps(extra_vars))
    out = run.stdout + run.stderr
    recap = re.search(r"lab-gpu-host\s+:.*changed=(\d+)", out)
    return run.returncode, int(recap.group(1)) if recap else -1, out


def nested_pci(host) -> list[str]:
    """The nested guest's PCI list from its serial log: the lines between its /init's markers."""
    log = host.file(SERIAL_LOG).content_string.replace("\r\n", "\n")
    block = re.search(r"^GPUPROV-NESTED-BEGIN\n(.*?)^GPUPROV-NESTED-END$", log, re.M | re.S)
    assert block, log
    return block.group(1).splitlines()


def mdev_state(host) -> str:
    """The mdevs, their mdevctl definitions and the vGPU role's saved layout."""
    return host.check_output(
        "ls /sys/bus/mdev/devices; for f in /etc/mdevctl.d/*/*; do echo $f; cat $f; done 2>/dev/null; "
        "cat /etc/gpuprov/vgpu.json 2>/dev/null; true"
    )


def domstate(host) -> str:
    return host.check_output("virsh -c qemu:///system domstate %s", VM).strip()


def test_iommu_came_on_through_the_hosts_own_grub(host):
    cmdline = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" in cmdline and "iommu=pt" in cmdline, cmdline
    assert "intel_iommu=off" not in cmdline, cmdline
    # The host still runs the trial boot the role armed, checked and committed
    # (docs/reference/boot-trial.md); nothing of the trial is left.
    assert any(a.startswith("gpuprov.trial=") for a in cmdline), cmdline
    assert not host.file("/var/lib/gpuprov/boot-trial.json").exists
    assert not host.file("/boot/grub/custom.cfg").exists
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


def test_the_nested_guest_lists_edu_a_and_the_mdev_on_its_console(host):
    lines = nested_pci(host)
    assert all(
        re.fullmatch(r"PCI [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] [0-9a-f]{4}:[0-9a-f]{4} class 0x[0-9a-f]{6}", x)
        for x in lines
    ), lines
    ids = [x.split()[2] for x in lines]
    assert ids.count(EDU_IDS) == 1, lines  # edu A only: B and C stay on the lab host
    assert any(x.split()[2:] == [MTTY_IDS, "class", "0x070002"] for x in lines), lines


def test_libvirt_and_qemu_hold_edu_a_and_the_mdev(host):
    assert domstate(host) == "running"
    xml = host.check_output("virsh -c qemu:///system dumpxml %s", VM)
    assert re.search(
        r"<hostdev mode='subsystem' type='pci' managed='yes'>\s*<driver name='vfio'/>\s*<source>\s*"
        r"<address domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>",
        xml,
    ), xml
    assert re.search(
        rf"<hostdev mode='subsystem' type='mdev'[^>]*model='vfio-pci'[^>]*>\s*<source>\s*"
        rf"<address uuid='{MDEV}'/>",
        xml,
    ), xml
    argv = host.check_output("ps -o args= -C qemu-system-x86_64")
    assert f'"host":"{EDU_A}"' in argv and f'"sysfsdev":"/sys/bus/mdev/devices/{MDEV}"' in argv, argv
    # QEMU has both IOMMU groups open: edu A's (vfio-pci) and the mdev's.
    assert driver(host, EDU_A) == "vfio-pci"
    fds = host.check_output("ls -l /proc/$(pgrep -o -f 'guest=%s')/fd", VM)
    mdev_group = os.path.basename(host.check_output("readlink /sys/bus/mdev/devices/%s/iommu_group", MDEV))
    for vfio_group in (group(host, EDU_A), mdev_group):
        assert f"/dev/vfio/{vfio_group}" in fds.split(), fds


def test_the_mdev_exists_and_is_defined_for_boot(host):
    assert os.path.basename(host.check_output("readlink /sys/bus/mdev/devices/%s/mdev_type", MDEV)) == "mtty-2"
    # mtty's own mdev driver: a vfio device, its own IOMMU group, /dev/vfio/N for QEMU.
    assert os.path.basename(host.check_output("readlink /sys/bus/mdev/devices/%s/driver", MDEV)) == "mtty"
    mdev_group = os.path.basename(host.check_output("readlink /sys/bus/mdev/devices/%s/iommu_group", MDEV))
    assert char_device(host, f"/dev/vfio/{mdev_group}")
    definition = json.loads(host.file(f"/etc/mdevctl.d/mtty/{MDEV}").content_string)
    assert definition["mdev_type"] == "mtty-2" and definition["start"] == "auto", definition
    assert f"{MDEV} mtty mtty-2 auto" in host.check_output("mdevctl list --defined")


def converged_state(host) -> str:
    """What the whole playbook leaves and a rerun must restore: drivers, overrides and the managed
    files (snapshot), the mdev and its definition, the guest's state and its definition (less the
    UUID libvirt picks when it defines the domain)."""
    xml = host.check_output("virsh -c qemu:///system dumpxml --inactive %s", VM)
    xml = re.sub(r"<uuid>[^<]*</uuid>", "", xml)
    return "\n".join([snapshot(host), mdev_state(host), domstate(host), xml])


def leftovers_finish(host, timeout: int = 600) -> None:
    """Wait (at most ``timeout`` s) until the killed run's module, which the host runs on after the
    controller died (its AnsiballZ payload folder), is done: the rerun comes after it, as a user's does."""
    # The wrapper's folder is named after the module's FQCN: ansible_gpuprov.kvm.vfio_bind_payload_XXXX.
    payloads = " ".join(f"/tmp/ansible_gpuprov.kvm.{m}_payload_*" for m in ("vfio_bind", "gpu_vm"))
    host.run(f"for i in $(seq {int(timeout)}); do ls -d {payloads} >/dev/null 2>&1 || break; sleep 1; done")


def test_a_run_killed_during_the_vfio_bind_then_during_the_vms_creation_converges_on_rerun(host, hostname):
    """issue #14: the controller's whole process group SIGKILLed 3 s into the vfio bind, then 3 s
    into the VM's creation (iommu_host's kill is molecule/lab_boot's), after undoing what those two
    steps do at runtime (edu B and its audio function given back, the guest destroyed and undefined);
    the rerun leaves the state of the uninterrupted run, and the run after it changes nothing."""
    inventory = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    expected = converged_state(host)
    host.run("virsh -c qemu:///system destroy %s; virsh -c qemu:///system undefine %s", VM, VM)
    for addr in (EDU_B, AUDIO_B):
        host.run("echo %s > /sys/bus/pci/drivers/vfio-pci/unbind", addr)
    assert driver(host, EDU_B) is None and "failed to get domain" in host.run("virsh domstate %s", VM).stderr
    assert converge_killed_in("Bind the devices to vfio-pci"), "the run ended before the vfio bind"
    leftovers_finish(host)
    assert converge_killed_in("Bring each VM to its state"), "the run ended before the VMs"
    leftovers_finish(host)
    rerun = run_converge(hostname, inventory=inventory, timeout=1800)
    assert rerun.failures == 0, rerun.output
    again = run_converge(hostname, inventory=inventory, timeout=1800)
    assert again.failures == 0 and again.changed == 0, again.output
    assert converged_state(host) == expected


def test_edu_sharing_a_group_with_the_default_route_nic_is_refused(host):
    before = snapshot(host)
    run = adhoc("-m", "gpuprov.kvm.vfio_bind", "-a", f"devices={EDU_C}")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "refused, nothing changed" in out, out
    assert f"{NIC} is NIC ens2, which carries the default route" in out, out
    assert snapshot(host) == before


def test_removing_the_mdev_the_running_guest_uses_is_refused(host):
    before = mdev_state(host)
    rc, changed, out = vgpu_role(NO_MDEV)
    assert rc != 0 and changed == 0, out
    assert "refused" in out and f"running domain {VM}" in out and MDEV in out, out
    assert mdev_state(host) == before
    assert domstate(host) == "running"


def test_binding_persists_across_a_reboot(host):
    boot_id = host.file("/proc/sys/kernel/random/boot_id").content_string
    run = adhoc("-m", "ansible.builtin.reboot", "-a", "reboot_timeout=600")
    assert run.returncode == 0, run.stdout + run.stderr
    # The first look after boot, before any Ansible run: udev's rule (from the initramfs on)
    # gave the devices to vfio-pci.
    assert host.file("/proc/sys/kernel/random/boot_id").content_string != boot_id
    # The committed default: the IOMMU's arguments, no trial.
    cmdline = host.file("/proc/cmdline").content_string.split()
    assert "intel_iommu=on" in cmdline and not any(a.startswith("gpuprov.trial=") for a in cmdline), cmdline
    assert {a: driver(host, a) for a in [*BOUND, *HOST_DRIVERS]} == {
        **dict.fromkeys(BOUND, "vfio-pci"),
        **HOST_DRIVERS,
    }
    for addr in (EDU_A, EDU_B):
        assert char_device(host, f"/dev/vfio/{group(host, addr)}"), addr
    # The mdev too (mdevctl starts its definition when mtty appears at boot); the guest,
    # shut down with the host (libvirt-guests, ACPI), stays off (no autostart).
    assert os.path.basename(host.check_output("readlink /sys/bus/mdev/devices/%s/mdev_type", MDEV)) == "mtty-2"
    assert domstate(host) == "shut off"


def test_the_committed_host_comes_back_from_every_reboot_by_itself(host):
    """Issue #26 item 8: a committed host that stopped at "Welcome to GRUB!" on three boots in a row.
    Two more reboots after the one above: each comes back (SSH, a new boot id) through GRUB's default entry,
    and neither the lab's BMC (a boot with no login prompt) nor its power cycle (a reset the
    firmware never answered) had to step in (run/watchdog.log, dev/lab/boot.py)."""
    log = lab_dir() / "run" / "watchdog.log"
    console = lab_dir() / "run" / "console.log"

    def interventions() -> list[str]:
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if line.split(" ", 1)[-1].startswith((RESET_BY_LAB, POWER_CYCLE))]

    before = interventions()
    for _ in range(2):
        offset = console.stat().st_size
        boot_id = host.file("/proc/sys/kernel/random/boot_id").content_string
        run = adhoc("-m", "ansible.builtin.reboot", "-a", "reboot_timeout=600")
        assert run.returncode == 0, run.stdout + run.stderr
        assert host.file("/proc/sys/kernel/random/boot_id").content_string != boot_id
        with open(console, "rb") as f:
            f.seek(offset)
            boot = f.read().decode("utf-8", "replace")
        assert "Welcome to GRUB!" in boot and "Booting `Debian GNU/Linux'" in boot, boot[-3000:]
        assert interventions() == before, interventions()


def test_the_dropped_mdev_is_removed_once_the_guest_is_off(host):
    assert domstate(host) == "shut off"
    rc, changed, out = vgpu_role(NO_MDEV)
    assert rc == 0 and changed >= 1, out
    assert not host.file(f"/sys/bus/mdev/devices/{MDEV}").exists
    assert not host.file(f"/etc/mdevctl.d/mtty/{MDEV}").exists
    assert MDEV not in host.check_output("mdevctl list --defined; mdevctl list")
    rc, changed, out = vgpu_role(NO_MDEV)
    assert rc == 0 and changed == 0, out
