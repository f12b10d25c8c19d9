"""The IOMMU's boot change tried once (gpuprov.plan.host.boot_trial, module iommu_boot): arm, trial boot,
commit; a trial that does not come back is recorded and not tried again; refusals change nothing.

The hosts are staged roots shaped like the lab host (Debian 12, GRUB from /etc/default/grub, the
grub.cfg update-grub wrote there) and a systemd-boot host. A reboot is played by rewriting the
root's /proc (a new boot id and kernel command line). The lab runs the same flow on a real kernel
(molecule/lab_boot)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gpuprov.apply.actions import apply
from gpuprov.core.plan import COMMAND, WRITE_SYSFS
from gpuprov.facts.bootloader import (
    GRUB_CUSTOM,
    INITRAMFS_MODULES,
    MODULES_LOAD,
    TRIAL_HOOK,
    TRIAL_SCRIPT,
    TRIAL_STATE,
    TRIAL_UNIT,
    TRIAL_UP,
    TRIAL_WANTS,
    efi_string,
    gather_boot_inputs,
)
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.host.boot_trial import BootPlan, BootRequest, custom_cfg, plan_boot, trial_initrd_of
from tests.conftest import tree_digest
from tests.fakehost import FakeHost
from tests.modrun import run_in_process

KVER = "6.1.0-56-amd64"
UUID = "800ac2bd-9143-418a-bf58-61ace256f6c9"
LINE = f"root=UUID={UUID} ro console=ttyS0 panic=-1 quiet intel_iommu=off"
GRUB_DEFAULT = (
    "GRUB_DEFAULT=0\nGRUB_TIMEOUT=0\nGRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=off"\nGRUB_CMDLINE_LINUX="console=ttyS0 panic=-1"\n'
)
GRUB_CFG = f"""\
### BEGIN /etc/grub.d/00_header ###
if [ -s $prefix/grubenv ]; then
  load_env
fi
### END /etc/grub.d/00_header ###
menuentry 'Debian GNU/Linux' --class debian --class os $menuentry_id_option 'gnulinux-simple-{UUID}' {{
\tload_video
\tinsmod ext2
\tsearch --no-floppy --fs-uuid --set=root {UUID}
\techo\t'Loading Linux {KVER} ...'
\tlinux\t/boot/vmlinuz-{KVER} {LINE}
\techo\t'Loading initial ramdisk ...'
\tinitrd\t/boot/initrd.img-{KVER}
}}
submenu 'Advanced options for Debian GNU/Linux' $menuentry_id_option 'gnulinux-advanced-{UUID}' {{
\tmenuentry 'Debian GNU/Linux, with Linux {KVER}' --class debian $menuentry_id_option 'x' {{
\t\tlinux\t/boot/vmlinuz-{KVER} {LINE}
\t}}
}}
"""
GRUBENV = "# GRUB Environment Block\n" + "#" * 990 + "\n"
BOOT_IDS = iter(f"00000000-0000-0000-0000-{n:012d}" for n in range(1, 1000))


def debian(root: Path, *, cmdline: str = f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {LINE}", fs: str = "ext4") -> FakeHost:
    fake = FakeHost(root, iommu=False)
    fake.cmdline = cmdline
    fake.write("etc/os-release", 'ID=debian\nVERSION_ID="12"\n')
    fake.write("proc/sys/kernel/osrelease", KVER + "\n")
    fake.write("proc/sys/kernel/random/boot_id", next(BOOT_IDS) + "\n")
    for tool in ("usr/sbin/update-grub", "usr/sbin/grub-reboot", "usr/sbin/update-initramfs", "usr/sbin/mkinitramfs"):
        fake.write(tool, "#!/bin/sh\n")
    fake.write(f"boot/vmlinuz-{KVER}", "kernel")
    fake.write(f"boot/initrd.img-{KVER}", "initrd")
    os.utime(root / f"boot/initrd.img-{KVER}", (1_000_000, 1_000_000))
    fake.write("sys/bus/pci/devices/0000:00:06.0/vendor", "0x8086\n")
    fake.link("sys/class/watchdog/watchdog0/device", "sys/bus/pci/devices/0000:00:06.0")
    fake.link("sys/bus/pci/devices/0000:00:06.0/driver", "sys/bus/pci/drivers/i6300esb")
    fake.link("sys/bus/pci/drivers/i6300esb/module", "sys/module/i6300esb")
    (root / "sys/module/i6300esb").mkdir(parents=True, exist_ok=True)
    fake.finish()
    fake.write("proc/mounts", f"/dev/vda / {fs} rw 0 0\n")
    fake.write("etc/default/grub", GRUB_DEFAULT)
    fake.write("boot/grub/grub.cfg", GRUB_CFG)
    fake.write("boot/grub/grubenv", GRUBENV)
    return fake


def reboot(root: Path, cmdline: str, *, iommu: bool = True, next_entry_spent: bool = True) -> None:
    """A new boot of the staged host: its id, its kernel line, its IOMMU and vfio (as they came up)."""
    (root / "proc/sys/kernel/random/boot_id").write_text(next(BOOT_IDS) + "\n")
    (root / "proc/cmdline").write_text(cmdline + "\n")
    if iommu:
        (root / "sys/class/iommu/dmar0").mkdir(parents=True, exist_ok=True)
        (root / "sys/kernel/iommu_groups/0/devices").mkdir(parents=True, exist_ok=True)
        for module in ("vfio", "vfio_iommu_type1", "vfio_pci"):
            (root / f"sys/module/{module}").mkdir(parents=True, exist_ok=True)
        (root / "proc/modules").write_text(
            "".join(f"{m} 16384 0 - Live 0x0\n" for m in ("vfio", "vfio_iommu_type1", "vfio_pci"))
        )
    if next_entry_spent:
        (root / "boot/grub/grubenv").write_text(GRUBENV)


def plan(root: Path, **options: object) -> BootPlan:
    request = BootRequest(reboot_allowed=True, **options)  # type: ignore[arg-type]
    return plan_boot(gather_boot_inputs(Sysfs(str(root)), request.expect_vfio, []), request)


def commands(p: BootPlan) -> list[list[str]]:
    return [a.argv or [] for a in p.actions if a.kind == COMMAND]


def paths(p: BootPlan) -> list[str]:
    return [a.path or "" for a in p.actions if a.kind != COMMAND]


def applied(root: Path, p: BootPlan) -> None:
    """Apply on the staged root (its files), then play the live commands the flow depends on."""
    apply(p, str(root))
    for argv in commands(p):
        here = [root / a.lstrip("/") for a in argv[1:]]
        if argv[0] == "grub-reboot":
            (root / "boot/grub/grubenv").write_text(GRUBENV.replace("#" * 30, f"next_entry={argv[1]}\n", 1))
        elif argv[0] == "mkinitramfs":
            here[1].parent.mkdir(parents=True, exist_ok=True)
            here[1].write_text("trial initrd")
        elif argv[0] == "cp":
            here[2].write_bytes(here[1].read_bytes())
        elif argv[0] == "mv":
            os.replace(here[1], here[2])
        elif argv[0] == "rm":
            here[1].unlink(missing_ok=True)


def trial_line(root: Path) -> str:
    """The kernel line of the trial entry gpuprov wrote (what /proc/cmdline shows on the trial boot)."""
    text = (root / GRUB_CUSTOM).read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("linux"))
    return "BOOT_IMAGE=" + line.split(None, 1)[1]


def test_arm_writes_a_trial_entry_and_a_one_shot_and_leaves_the_default_alone(tmp_path: Path) -> None:
    fake = debian(tmp_path)
    default_before = (tmp_path / "etc/default/grub").read_bytes()
    p = plan(tmp_path, watchdog_seconds=300)
    assert (p.stage, p.reboot, p.refusals) == ("armed", "trial", [])
    assert p.added == ["intel_iommu=on", "iommu=pt"]
    assert "etc/default/grub" not in paths(p)
    assert paths(p) == [
        MODULES_LOAD,
        INITRAMFS_MODULES,
        TRIAL_HOOK,
        TRIAL_SCRIPT,
        GRUB_CUSTOM,
        TRIAL_UNIT,
        TRIAL_WANTS,
        TRIAL_STATE,
    ]
    assert commands(p) == [
        ["mkinitramfs", "-o", f"/boot/initrd.img-{KVER}.gpuprov-trial.new", KVER],
        ["mv", "-f", f"/boot/initrd.img-{KVER}.gpuprov-trial.new", f"/boot/initrd.img-{KVER}.gpuprov-trial"],
        ["grub-reboot", "gpuprov-trial"],
    ]
    # The trial line: the default entry's, its IOMMU argument replaced, the trial's own added.
    assert p.trial_args == (
        f"root=UUID={UUID} ro console=ttyS0 panic=10 quiet intel_iommu=on iommu=pt "
        f"gpuprov.trial={p.trial_id} i6300esb.heartbeat=300"
    )
    applied(tmp_path, p)
    assert (tmp_path / "etc/default/grub").read_bytes() == default_before
    custom = (tmp_path / GRUB_CUSTOM).read_text()
    assert "menuentry 'gpuprov trial: intel_iommu=on iommu=pt' --id gpuprov-trial {" in custom
    assert f"initrd\t/boot/initrd.img-{KVER}.gpuprov-trial" in custom
    assert "search --no-floppy --fs-uuid --set=root" in custom
    assert "modprobe i6300esb" in (tmp_path / TRIAL_SCRIPT).read_text()
    assert json.loads((tmp_path / TRIAL_STATE).read_text())["status"] == "armed"
    # A run killed before its reboot and run again in the same boot: nothing more to do but the reboot.
    again = plan(tmp_path, watchdog_seconds=300)
    assert (again.stage, again.reboot, again.actions) == ("armed", "trial", [])
    del fake


def test_a_trial_boot_that_passes_its_checks_is_committed_and_then_converged(tmp_path: Path) -> None:
    debian(tmp_path)
    applied(tmp_path, plan(tmp_path))
    reboot(tmp_path, trial_line(tmp_path))
    p = plan(tmp_path)
    assert (p.stage, p.reboot, p.failure) == ("committed", "none", None)
    assert p.actions[0].kind == WRITE_SYSFS and p.actions[0].path == "dev/watchdog" and p.actions[0].content == "V"
    assert commands(p) == [
        ["update-grub"],
        ["mv", "-f", f"/boot/initrd.img-{KVER}.gpuprov-trial", f"/boot/initrd.img-{KVER}"],
    ]
    applied(tmp_path, p)
    grub = (tmp_path / "etc/default/grub").read_text()
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet intel_iommu=on iommu=pt"' in grub
    assert not (tmp_path / GRUB_CUSTOM).exists() and not (tmp_path / TRIAL_STATE).exists()
    # Still on the trial boot, and after the next plain reboot: nothing owed.
    assert plan(tmp_path).actions == []
    reboot(
        tmp_path,
        f"BOOT_IMAGE=/boot/vmlinuz-{KVER} root=UUID={UUID} ro console=ttyS0 panic=-1 quiet intel_iommu=on iommu=pt",
    )
    p = plan(tmp_path)
    assert (p.stage, p.reboot, p.actions) == ("converged", "none", [])


@pytest.mark.parametrize("why", ["panic", "hang"])
def test_a_trial_that_did_not_come_up_is_recorded_and_not_tried_again(tmp_path: Path, why: str) -> None:
    debian(tmp_path)
    default_before = (tmp_path / "etc/default/grub").read_bytes()
    applied(tmp_path, plan(tmp_path, extra_args=["init=/bin/false" if why == "panic" else "init=/bin/sh"]))
    # The trial panicked (panic=10) or hung (the watchdog): the host is back on its default line.
    reboot(tmp_path, f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {LINE}", iommu=False)
    p = plan(tmp_path, extra_args=["init=/bin/false" if why == "panic" else "init=/bin/sh"])
    assert p.stage == "failed" and p.failure
    assert "init=/bin/" in p.failure and "did not come up" in p.failure and "default is unchanged" in p.failure
    applied(tmp_path, p)
    assert (tmp_path / "etc/default/grub").read_bytes() == default_before
    assert not (tmp_path / GRUB_CUSTOM).exists()
    assert not (tmp_path / f"boot/initrd.img-{KVER}.gpuprov-trial").exists()
    assert json.loads((tmp_path / TRIAL_STATE).read_text())["status"] == "failed"
    # The next run refuses the same arguments, naming them; told to, it tries them once more.
    again = plan(tmp_path, extra_args=["init=/bin/false" if why == "panic" else "init=/bin/sh"])
    assert again.stage == "refused" and "init=/bin/" in again.refusals[0].message
    assert "retry_failed" in (again.refusals[0].fix or "")
    retry = plan(tmp_path, extra_args=["init=/bin/false" if why == "panic" else "init=/bin/sh"], retry_failed=True)
    assert retry.stage == "armed"
    # Other arguments are another trial: not refused.
    assert plan(tmp_path).stage == "armed"


def test_a_trial_boot_that_fails_its_checks_falls_back(tmp_path: Path) -> None:
    debian(tmp_path)
    applied(tmp_path, plan(tmp_path, expect_vfio=["0000:01:00.0"]))
    reboot(tmp_path, trial_line(tmp_path), iommu=False)
    p = plan(tmp_path, expect_vfio=["0000:01:00.0"])
    assert (p.stage, p.reboot) == ("failed", "fallback")
    assert "no IOMMU came up" in (p.failure or "") and "0000:01:00.0 is on no driver" in (p.failure or "")
    assert "etc/default/grub" not in paths(p)


def test_initramfs_owed_from_the_host_not_a_handler(tmp_path: Path) -> None:
    """The default has the arguments and the modules file its block, but the initramfs predates the
    file (a rebuild killed with the controller): the rebuild is owed; once newer, it is not."""
    debian(
        tmp_path,
        cmdline=f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {LINE.replace('intel_iommu=off', 'intel_iommu=on iommu=pt')}",
    )
    grub = tmp_path / "etc/default/grub"
    grub.write_text(GRUB_DEFAULT.replace("quiet intel_iommu=off", "quiet intel_iommu=on iommu=pt"))
    first = plan(tmp_path)
    apply(first, str(tmp_path))  # files written; the rebuild command is not run on a staged root
    p = plan(tmp_path)
    assert [a.argv for a in p.actions] == [["update-initramfs", "-u", "-k", "all"]]
    assert "predates /etc/initramfs-tools/modules" in p.actions[0].why
    os.utime(tmp_path / f"boot/initrd.img-{KVER}")  # rebuilt now
    assert plan(tmp_path).actions == []


def test_check_mode_and_diff_show_the_trial_commit_and_fallback(tmp_path: Path) -> None:
    debian(tmp_path)
    before = tree_digest(tmp_path)
    result = run_in_process("iommu_boot", {"root": str(tmp_path), "reboot_allowed": True}, check=True)
    assert result["changed"] and result["stage"] == "armed" and not result["failed"]
    text = "\n".join(result["plan"])
    assert "would run grub-reboot gpuprov-trial (boot the trial entry once" in text
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize(
    ("fs", "source", "expect"),
    [("btrfs", "/dev/vda", "btrfs"), ("ext4", "/dev/mapper/vg-root", "RAID or LVM"), ("zfs", "rpool/ROOT", "zfs")],
)
def test_no_trial_where_grub_cannot_spend_a_one_shot(tmp_path: Path, fs: str, source: str, expect: str) -> None:
    debian(tmp_path)
    (tmp_path / "proc/mounts").write_text(f"{source} / {fs} rw 0 0\n")
    before = tree_digest(tmp_path)
    result = run_in_process("iommu_boot", {"root": str(tmp_path), "reboot_allowed": True})
    assert result["failed"] and expect in result["msg"] and "trial: false" in result["msg"]
    assert tree_digest(tmp_path) == before


def test_reboot_not_allowed_touches_nothing_that_boots(tmp_path: Path) -> None:
    debian(tmp_path)
    inputs = gather_boot_inputs(Sysfs(str(tmp_path)), [], [])
    inputs.boot.live = True  # as on the running host
    p = plan_boot(inputs, BootRequest(reboot_allowed=False))
    assert (p.stage, p.reboot) == ("owed", "trial")
    assert commands(p) == [] and set(paths(p)) <= {MODULES_LOAD, INITRAMFS_MODULES, TRIAL_HOOK, TRIAL_SCRIPT}
    # A staged or image root boots nothing here: its default is edited directly (no trial, no reboot).
    inputs.boot.live = False
    staged = plan_boot(inputs, BootRequest(reboot_allowed=False))
    assert (staged.stage, staged.reboot) == ("converged", "plain") and "etc/default/grub" in paths(staged)


def test_hostile_trial_records_and_custom_entries(tmp_path: Path) -> None:
    """The trial record is read from the host: a path in it outside gpuprov's trial files is never
    moved or removed; the user's own custom.cfg entries stay."""
    for bad in ("../../etc/shadow.gpuprov-trial", "etc/shadow", "boot/../etc/x.gpuprov-trial", 7, None):
        assert trial_initrd_of({"trial_initrd": bad}) is None
    assert trial_initrd_of({"trial_initrd": f"boot/initrd.img-{KVER}.gpuprov-trial"})
    mine = "menuentry 'rescue' {\n\tlinux /vmlinuz single\n}\n"
    with_trial = custom_cfg(mine, "menuentry 'gpuprov trial' --id gpuprov-trial {\n}\n")
    assert with_trial is not None and with_trial.startswith(mine)
    assert custom_cfg(with_trial, None) == mine
    assert custom_cfg(custom_cfg(None, "menuentry x {\n}\n"), None) is None
    debian(tmp_path)
    (tmp_path / TRIAL_STATE).parent.mkdir(parents=True)
    (tmp_path / TRIAL_STATE).write_text("[not a record")
    p = plan(tmp_path)
    assert p.stage == "armed" and any("not a trial record" in w for w in p.warnings)


SD_ENTRY = (
    f"title Debian GNU/Linux 12\nversion {KVER}\nmachine-id abc\nsort-key debian\n"
    f"options root=UUID={UUID} ro console=ttyS0 panic=-1 quiet intel_iommu=off\n"
    f"linux /abc/{KVER}/linux\ninitrd /abc/{KVER}/initrd.img-{KVER}\n"
)


def efivar(text: str) -> bytes:
    return b"\x06\x00\x00\x00" + (text + "\0").encode("utf-16-le")


def test_systemd_boot_trial_uses_a_bls_entry_and_bootctl(tmp_path: Path) -> None:
    fake = debian(tmp_path)
    for rel in ("boot/grub/grub.cfg", "boot/grub/grubenv", "usr/sbin/grub-reboot"):
        (tmp_path / rel).unlink()
    fake.write("usr/bin/bootctl", "#!/bin/sh\n")
    fake.write("usr/bin/kernel-install", "#!/bin/sh\n")
    guid = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
    fake.write(f"sys/firmware/efi/efivars/LoaderInfo-{guid}", efivar("systemd-boot 252.39-1~deb12u1"))
    fake.write(f"sys/firmware/efi/efivars/LoaderEntrySelected-{guid}", efivar(f"abc-{KVER}.conf"))
    fake.write(f"boot/efi/loader/entries/abc-{KVER}.conf", SD_ENTRY)
    fake.write("etc/kernel/cmdline", f"root=UUID={UUID} ro console=ttyS0 panic=-1 quiet intel_iommu=off\n")
    assert efi_string(efivar("x")) == "x"
    p = plan(tmp_path)
    assert (p.stage, p.refusals) == ("armed", [])
    assert "boot/efi/loader/entries/gpuprov-trial.conf" in paths(p)
    assert ["bootctl", "set-oneshot", "gpuprov-trial.conf"] in commands(p)
    assert ["mkinitramfs", "-o", f"/boot/efi/abc/{KVER}/initrd.img-{KVER}.gpuprov-trial.new", KVER] in commands(p)
    entry = next(a.content for a in p.actions if a.path == "boot/efi/loader/entries/gpuprov-trial.conf")
    assert isinstance(entry, str) and "title gpuprov trial: intel_iommu=on iommu=pt" in entry
    assert "intel_iommu=on iommu=pt gpuprov.trial=" in entry and "panic=10" in entry and "version" not in entry
    applied(tmp_path, p)
    reboot(tmp_path, next(x for x in entry.splitlines() if x.startswith("options")).split(" ", 1)[1])
    commit = plan(tmp_path)
    assert commit.stage == "committed"
    trial_initrd = f"/boot/efi/abc/{KVER}/initrd.img-{KVER}.gpuprov-trial"
    assert commands(commit) == [  # the tried initramfs to /boot, which kernel-install copies to the ESP
        ["cp", "-f", trial_initrd, f"/boot/initrd.img-{KVER}"],
        ["kernel-install", "add", KVER, f"/boot/vmlinuz-{KVER}", f"/boot/initrd.img-{KVER}"],
        ["rm", "-f", trial_initrd],
    ]
    apply(commit, str(tmp_path))
    assert (tmp_path / "etc/kernel/cmdline").read_text().endswith("quiet intel_iommu=on iommu=pt\n")
    assert not (tmp_path / "boot/efi/loader/entries/gpuprov-trial.conf").exists()


def test_a_trial_that_came_up_unchecked_is_tried_again_not_failed(tmp_path: Path) -> None:
    """The controller died (or was slower than the watchdog) after the trial boot reached
    multi-user: its unit noted it, so the arguments are not blamed; armed again, twice at most."""
    debian(tmp_path)
    for attempt in (1, 2):
        applied(tmp_path, plan(tmp_path))
        trial = trial_line(tmp_path)
        marker = next(a for a in trial.split() if a.startswith("gpuprov.trial="))
        (tmp_path / TRIAL_UP).write_text(marker + "\n")  # what the unit writes on the trial boot
        reboot(tmp_path, f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {LINE}", iommu=False)  # reset, back on the default
        p = plan(tmp_path)
        assert (p.stage, p.failure) == ("armed", None), p.failure
        assert any("tried again" in w for w in p.warnings)
        assert TRIAL_UP in [a.path for a in p.actions]  # the note goes: the next trial writes its own
        assert json.loads(next(a.content for a in p.actions if a.path == TRIAL_STATE))["unconfirmed"] == attempt
        applied(tmp_path, p)
    applied(tmp_path, plan(tmp_path))
    (tmp_path / TRIAL_UP).write_text(marker + "\n")
    reboot(tmp_path, f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {LINE}", iommu=False)
    assert plan(tmp_path).stage == "failed"  # a third time counts


def test_a_stale_trial_initramfs_never_replaces_the_default(tmp_path: Path) -> None:
    """After a failed trial, arguments the default already has: the trial's initramfs (never tried
    to the end) is removed, not moved over the default's."""
    debian(tmp_path)
    applied(tmp_path, plan(tmp_path, extra_args=["init=/bin/false"]))
    reboot(tmp_path, f"BOOT_IMAGE=/boot/vmlinuz-{KVER} {LINE}", iommu=False)
    (tmp_path / f"boot/initrd.img-{KVER}.gpuprov-trial").write_text("left over")
    p = plan(tmp_path, extra_args=["init=/bin/false"])
    assert p.stage == "failed"
    (tmp_path / f"boot/initrd.img-{KVER}.gpuprov-trial").write_text("left over")  # as if rm had failed
    default = (tmp_path / "etc/default/grub").read_text()
    (tmp_path / "etc/default/grub").write_text(default.replace("quiet intel_iommu=off", "quiet"))
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n\n")
    p = plan(tmp_path, passthrough=False)
    assert p.stage == "converged"
    assert ["rm", "-f", f"/boot/initrd.img-{KVER}.gpuprov-trial"] in commands(p)
    assert not any(argv[0] == "mv" for argv in commands(p))


def test_a_menu_left_behind_its_configuration_is_regenerated(tmp_path: Path) -> None:
    """Killed between editing /etc/default/grub and update-grub: the configuration has the
    arguments, the menu GRUB boots does not; the next run regenerates it (from the host's state)."""
    debian(tmp_path)
    (tmp_path / "etc/default/grub").write_text(
        GRUB_DEFAULT.replace("quiet intel_iommu=off", "quiet intel_iommu=on iommu=pt")
    )
    inputs = gather_boot_inputs(Sysfs(str(tmp_path)), [], [])
    inputs.boot.live = True
    p = plan_boot(inputs, BootRequest(reboot_allowed=True))
    assert p.stage == "converged" and ["update-grub"] in commands(p)
    assert any("lacks the arguments" in a.why for a in p.actions)
    cfg = (tmp_path / "boot/grub/grub.cfg").read_text().replace("intel_iommu=off", "intel_iommu=on iommu=pt")
    (tmp_path / "boot/grub/grub.cfg").write_text(cfg)
    inputs = gather_boot_inputs(Sysfs(str(tmp_path)), [], [])
    inputs.boot.live = True
    assert ["update-grub"] not in commands(plan_boot(inputs, BootRequest(reboot_allowed=True)))


def test_values_read_from_the_host_or_options_never_reach_a_script_or_path_unchecked(tmp_path: Path) -> None:
    """A watchdog module name from a broken host's sysfs is not written into the initramfs script;
    an expect_vfio item that is no PCI address is refused; a trial initramfs is built in /boot only."""
    fake = debian(tmp_path)
    (tmp_path / "sys/bus/pci/drivers/i6300esb/module").unlink()
    fake.link("sys/bus/pci/drivers/i6300esb/module", "sys/module/x;reboot")
    (tmp_path / "sys/module/x;reboot").mkdir(parents=True)
    p = plan(tmp_path)
    assert p.stage == "armed" and not any("reboot" in str(a.content) for a in p.actions if a.path == TRIAL_SCRIPT)
    assert any("no hardware watchdog" in w for w in p.warnings)
    bad = plan(tmp_path, expect_vfio=["../../etc"])
    # The one rule for a PCI address (gpuprov.inputs.validate.pci_address), its words as every input's.
    assert bad.stage == "refused" and "expect_vfio[0]: '../../etc' is not a PCI address" in bad.refusals[0].message
    cfg = (
        (tmp_path / "boot/grub/grub.cfg")
        .read_text()
        .replace(f"initrd\t/boot/initrd.img-{KVER}", "initrd\t/../../etc/x", 1)
    )
    (tmp_path / "boot/grub/grub.cfg").write_text(cfg)
    # GRUB: the trial initramfs is built in /boot whatever the entry names (its file name only).
    built = [argv for argv in commands(plan(tmp_path)) if argv[0] == "mkinitramfs"]
    assert built and all(argv[2].startswith("/boot/") and ".." not in argv[2] for argv in built)
