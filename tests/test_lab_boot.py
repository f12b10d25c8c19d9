"""The lab's boot pieces that need no emulator (issue 16's lab side): QEMU's command line
(the i6300esb watchdog, the ESP per boot loader, PCI addresses unchanged), the image's
cache key per boot loader, GRUB's embedded config, systemd-boot's kernel arguments, fstab
and first boot, and how run/watchdog.log tells the lab's resets from the guest's.

The proofs on the booted lab host are dev/tools/lab-boot-proof.sh (docs/development/lab.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dev.lab import __main__ as cli
from dev.lab import boot, debpkg, image

UUID = "0b5c3a7e-1111-4222-8333-444455556666"


def devices(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-device"]


def option(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


@pytest.mark.parametrize("loader", image.LOADERS)
def test_qemu_has_the_i6300esb_watchdog_resetting_and_keeps_every_pci_address(tmp_path: Path, loader: str) -> None:
    argv = boot.qemu_argv(tmp_path / "lab", tmp_path / "img", 2622, loader)
    devs = devices(argv)
    assert "i6300esb,bus=pcie.0,addr=0x6" in devs
    # The i6300esb resets the machine, and every reset ends QEMU: the lab's watchdog starts a new
    # one (a cold start; a warm reset under TCG stalls OVMF and GRUB, issue #26 item 8).
    assert option(argv, "-action") == ["watchdog=reset", "reboot=shutdown"]
    # What molecule/lab's tests and inventories/lab rely on, as before.
    for dev in (
        "pcie-root-port,id=rp1,bus=pcie.0,addr=0x1,chassis=1",
        "pcie-root-port,id=rp2,bus=pcie.0,addr=0x2,chassis=2",
        "pcie-root-port,id=rp3,bus=pcie.0,addr=0x3,chassis=3",
        "virtio-blk-pci,drive=root,bus=pcie.0,addr=0x4,bootindex=1",
        "virtio-blk-pci,drive=esp,bus=pcie.0,addr=0x5,bootindex=0",
        "edu,bus=rp1",
        "edu,bus=br1,addr=0x1",
        "e1000,netdev=n0,mac=52:54:00:00:00:02,bus=br1,addr=0x2",
    ):
        assert dev in devs, dev
    addrs = [d.split("addr=")[1].split(",")[0] for d in devs if "bus=pcie.0" in d]
    assert len(addrs) == len(set(addrs)), addrs
    # Two QMP monitors: commands (down, the lab's resets) and the events the watchdog logs.
    qmps = option(argv, "-qmp")
    assert any(q.startswith(f"unix:{tmp_path}/lab/run/qmp.sock,") for q in qmps)
    assert any(q.startswith(f"unix:{tmp_path}/lab/run/{boot.QMP_EVENTS},") for q in qmps)


def test_the_lab_host_has_two_numa_nodes_each_with_a_large_bar_device_on_its_expander(tmp_path: Path) -> None:
    """Issue #29's lab shape: what inventories/lab declares (the large-BAR devices by address) and
    what the OVMFs must place (BARs together over OVMF's default 64-bit window) follow from it."""
    import yaml

    from gpuprov.plan.vm.domain import OVMF_DEFAULT_MMIO64_MIB

    argv = boot.qemu_argv(tmp_path, tmp_path / "img", 2622)
    assert option(argv, "-smp") == ["4"]
    assert option(argv, "-numa") == ["node,nodeid=0,cpus=0-1,memdev=ram0", "node,nodeid=1,cpus=2-3,memdev=ram1"]
    assert option(argv, "-m") == [str(sum(boot.NODE_MEMORY_MIB))]
    devs = devices(argv)
    for node, bus in enumerate(boot.LARGE_BAR_BUS):
        assert f"pxb-pcie,id=pxb{node},bus_nr={bus},numa_node={node},bus=pcie.0,addr={0x8 + node:#x}" in devs
        assert f"pci-testdev,membar={boot.LARGE_BAR_GIB}G,bus=rpn{node}" in devs
    # Over OVMF's fixed default and over its dynamic window at QEMU's 40 physical address bits.
    assert len(boot.LARGE_BAR_BUS) * boot.LARGE_BAR_GIB * 1024 > max(OVMF_DEFAULT_MMIO64_MIB, (1 << 37) >> 20)
    assert boot.HOST_MMIO64_MIB >= 2 * len(boot.LARGE_BAR_BUS) * boot.LARGE_BAR_GIB * 1024
    host_vars = yaml.safe_load((Path(__file__).parents[1] / "inventories/lab/host_vars/lab-gpu-host.yml").read_text())
    declared = {g["address"] for g in host_vars["gpuprov_host"]["gpus"] if g.get("expect") == "1b36:0005"}
    assert declared == {f"0000:{bus + 1:02x}:00.0" for bus in boot.LARGE_BAR_BUS}


def test_one_node_is_the_lab_host_without_the_second_node_and_the_large_bars(tmp_path: Path) -> None:
    argv = boot.qemu_argv(tmp_path, tmp_path / "img", 2622, one_node=True)
    assert option(argv, "-smp") == ["2"] and option(argv, "-m") == ["2048"] and not option(argv, "-numa")
    assert not any(d.startswith(("pxb-pcie", "pci-testdev")) for d in devices(argv))
    assert not option(argv, "-fw_cfg")
    numa_only = ("pxb-pcie", "pci-testdev", "pcie-root-port,id=rpn")
    two_nodes = devices(boot.qemu_argv(tmp_path, tmp_path / "img", 2622))
    assert set(devices(argv)) == {d for d in two_nodes if not d.startswith(numa_only)}


def test_grubs_esp_stays_read_only_and_systemd_boots_is_a_writable_overlay(tmp_path: Path) -> None:
    grub = option(boot.qemu_argv(tmp_path, tmp_path / "img", 2622, "grub"), "-drive")
    sdboot = option(boot.qemu_argv(tmp_path, tmp_path / "img", 2622, "systemd-boot"), "-drive")
    assert f"if=none,id=esp,format=raw,readonly=on,file={tmp_path}/img/esp.img" in grub
    esp = next(d for d in sdboot if "id=esp" in d)
    assert "readonly" not in esp and f"file={tmp_path}/run/esp.qcow2" in esp and "format=qcow2" in esp


def test_the_cache_key_includes_the_loader_and_its_packages(monkeypatch, tmp_path: Path) -> None:
    asked: list[list[str]] = []

    def resolve(names):
        asked.append(list(names))
        return {("linux-image-6.1.0-99-amd64" if n == "linux-image-amd64" else n): "1.0" for n in names}

    (tmp_path / "id_ed25519.pub").write_text("ssh-ed25519 AAAA test\n")
    monkeypatch.setattr(image, "ensure_key", lambda lab: lab / "id_ed25519")
    monkeypatch.setattr(debpkg, "resolve", resolve)
    grub_key, grub_pkgs, _, _ = image.image_key(tmp_path, "grub")
    sd_key, sd_pkgs, _, _ = image.image_key(tmp_path, "systemd-boot")
    assert grub_key != sd_key
    assert image.image_key(tmp_path)[0] == grub_key  # GRUB is the default
    assert {"grub2-common", "grub-efi-amd64-bin"} <= grub_pkgs.keys()
    assert not {"systemd-boot", "systemd-boot-efi"} & grub_pkgs.keys()
    assert {"systemd-boot", "systemd-boot-efi"} <= sd_pkgs.keys()
    assert not {"grub2-common", "grub-efi-amd64-bin"} & sd_pkgs.keys()
    # Everything else is the same recipe.
    assert grub_pkgs.keys() - set(image.LOADER_PACKAGES["grub"]) == sd_pkgs.keys() - set(
        image.LOADER_PACKAGES["systemd-boot"]
    )
    for part in ("LOADER_PACKAGES", "EMBEDDED_GRUB_CFG", "def firstboot_script", "def make_gpt_esp", "def fstab"):
        assert part in image.recipe_text(), part


def test_a_cached_image_is_taken_while_another_build_holds_the_lock(monkeypatch, tmp_path: Path) -> None:
    """scripts/test.sh builds the systemd-boot image while molecule/lab boots the GRUB one: the boot
    must not wait for that build when its own image is cached; an image still to build waits for it."""
    import fcntl
    import threading

    (tmp_path / "id_ed25519.pub").write_text("ssh-ed25519 AAAA test\n")
    monkeypatch.setattr(image, "ensure_key", lambda lab: lab / "id_ed25519")
    monkeypatch.setattr(
        debpkg,
        "resolve",
        lambda names: {("linux-image-6.1.0-99-amd64" if n == "linux-image-amd64" else n): "1.0" for n in names},
    )
    grub = tmp_path / "images" / image.image_key(tmp_path, "grub")[0]
    grub.mkdir(parents=True)
    (grub / "info.json").write_text('{"loader": "grub"}')
    built: list[str] = []
    monkeypatch.setattr(image, "_ensure_image", lambda lab, rebuild, loader: built.append(loader) or grub)
    with open(tmp_path / "build.lock", "a") as other:  # the other loader's build
        fcntl.flock(other, fcntl.LOCK_EX)
        assert image.ensure_image(tmp_path, loader="grub") == grub and built == []
        waiting = threading.Thread(target=image.ensure_image, args=(tmp_path, False, "systemd-boot"))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and built == []  # not cached: waits for the lock
    waiting.join(10)
    assert built == ["systemd-boot"]


def test_an_image_of_another_loader_is_kept(tmp_path: Path) -> None:
    for name, info in (("a", {"loader": "systemd-boot"}), ("b", {}), ("c", None)):
        (tmp_path / name).mkdir()
        if info is not None:
            (tmp_path / name / "info.json").write_text(json.dumps(info))
    assert image.image_loader(tmp_path / "a") == "systemd-boot"
    assert image.image_loader(tmp_path / "b") == "grub"  # built before the loader was chosen
    assert image.image_loader(tmp_path / "c") is None  # unfinished


def test_the_embedded_grub_cfg_moves_prefix_to_the_root_disk_before_its_grub_cfg() -> None:
    lines = [ln for ln in image.EMBEDDED_GRUB_CFG.format(fs_uuid=UUID).splitlines() if not ln.startswith("#")]
    assert lines == [
        f"search --no-floppy --fs-uuid --set=root {UUID}",
        "set prefix=($root)/boot/grub",  # load_env/save_env (grub-reboot's next_entry) and insmod: the root disk
        "configfile $prefix/grub.cfg",
    ]


def test_systemd_boots_kernel_arguments_are_grubs() -> None:
    cmdline = image.kernel_cmdline(UUID)
    args = "console=ttyS0 panic=-1 no_timer_check mitigations=off quiet intel_iommu=off"
    assert cmdline == f"root=UUID={UUID} ro {args}\n"
    assert image.GRUB_CMDLINE_LINUX in cmdline and image.GRUB_CMDLINE_LINUX_DEFAULT in cmdline


def test_fstab_mounts_the_esp_only_for_systemd_boot() -> None:
    assert image.fstab(UUID, "grub", "ABCD1234") == f"UUID={UUID} / ext4 errors=remount-ro 0 1\n"
    lines = image.fstab(UUID, "systemd-boot", "ABCD1234").splitlines()
    assert lines[1].split() == ["UUID=ABCD-1234", image.ESP_MOUNT, "vfat", "umask=0077", "0", "1"]


def test_first_boot_sets_each_loader_up_and_says_ok_only_when_it_worked() -> None:
    grub = image.firstboot_script("grub")
    assert "update-grub && ok=1" in grub and "bootctl" not in grub
    sd = image.firstboot_script("systemd-boot")
    assert "update-grub" not in sd
    order = [
        f"mount {image.ESP_MOUNT}",
        "bootctl install --make-machine-id-directory=auto",  # systemd-boot's postinst
        'kernel-install add "${k#/boot/vmlinuz-}" "$k"',
        f"printf 'timeout 0\\n' > {image.ESP_MOUNT}/loader/loader.conf",
        f"umount {image.ESP_MOUNT}",
    ]
    at = [sd.index(step) for step in order]
    assert at == sorted(at)
    for script in (grub, sd):
        assert script.index('[ -n "$ok" ] && echo "gpuprov-lab: firstboot ok"') < script.index("echo o >")


def test_a_boot_is_stuck_past_the_limit_or_once_its_kernel_lost_its_timer_twice() -> None:
    # RCU's stall warning as the lab host's kernel printed it, every 21 s, on the boot that hung
    # with every vCPU halted (2026-11-27, docs/development/timings.md).
    report = "[   23.794323] rcu: rcu_preempt kthread timer wakeup didn't happen for 5248 jiffies! g-1047 f0x0"
    assert boot.LOST_TIMER in report
    assert boot.boot_stuck(100, 0) is None
    assert boot.boot_stuck(100, boot.LOST_TIMER_REPORTS - 1) is None
    late = boot.boot_stuck(boot.WATCHDOG_LIMIT + 1, 0)
    assert late == f"no login prompt {boot.WATCHDOG_LIMIT} s after the boot started"
    stuck = boot.boot_stuck(45, (report + "\n" + report).count(boot.LOST_TIMER))
    assert stuck is not None and stuck.startswith("the kernel lost its timer (2 reports") and "45 s" in stuck


def test_qmp_events_keep_events_and_the_unfinished_line() -> None:
    buf = (
        b'{"QMP": {"version": {}}}\n{"return": {}}\n'
        b'{"timestamp": {"seconds": 1}, "event": "WATCHDOG", "data": {"action": "reset"}}\n'
        b'{"event": "RESET", "data": {"guest": true}}\nnot json\n{"event": "STO'
    )
    events, rest = boot.qmp_events(buf)
    assert [e["event"] for e in events] == ["WATCHDOG", "RESET"]
    assert rest == b'{"event": "STO'


def test_the_guests_watchdog_and_the_labs_are_told_apart_in_the_log() -> None:
    line = boot.guest_watchdog_line({"event": "WATCHDOG", "data": {"action": "reset"}})
    assert line is not None and line.startswith(boot.RESET_BY_GUEST) and line.endswith("reset")
    assert boot.guest_watchdog_line({"event": "RESET", "data": {"guest": True}}) is None
    assert boot.RESET_BY_LAB != boot.RESET_BY_GUEST
    assert not line.startswith(boot.RESET_BY_LAB)


def test_up_takes_the_loader(capsys) -> None:
    assert cli.parser().parse_args(["up", "--loader", "systemd-boot"]).loader == "systemd-boot"
    assert cli.parser().parse_args(["up"]).loader == "grub"
    with pytest.raises(SystemExit) as exc:
        cli.parser().parse_args(["up", "--loader", "lilo"])
    assert exc.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_entry_options_reads_kernel_installs_aligned_entry() -> None:
    entry = (
        "title      Debian GNU/Linux 12 (bookworm)\nversion    6.1.0-56-amd64\nsort-key   debian\n"
        f"options    {image.kernel_cmdline(UUID).strip()} systemd.machine_id=ea47\n"
        "linux      /ea47/6.1.0-56-amd64/linux\n"
    )
    assert image.entry_options(entry).startswith(image.kernel_cmdline(UUID).strip())
    assert image.entry_options(entry).endswith("systemd.machine_id=ea47")
    assert image.entry_options("title x\nlinux /vmlinuz\n") == ""


def test_a_reset_is_told_from_a_poweroff_and_a_quit() -> None:
    """QEMU's SHUTDOWN events: a reset of the machine (the guest's, its watchdog's, the lab BMC's
    system_reset) gets a new QEMU; a poweroff, a quit (down, a power cycle) or a signal does not."""

    def event(reason: str) -> dict:
        return {"event": "SHUTDOWN", "data": {"guest": reason.startswith("guest"), "reason": reason}}

    assert boot.reset_reason(event("guest-reset")) == "guest-reset"
    assert boot.reset_reason(event("host-qmp-system-reset")) == "host-qmp-system-reset"
    for reason in ("guest-shutdown", "host-qmp-quit", "host-signal", "guest-panic", "host-error"):
        assert boot.reset_reason(event(reason)) is None, reason
    assert boot.reset_reason({"event": "RESET", "data": {"guest": True, "reason": "guest-reset"}}) is None
    assert boot.reset_reason({"event": "SHUTDOWN"}) is None
