"""The lab's (dev/lab/) pieces that need no emulator: the nested guest's initramfs and the
output of its /init against the checks inventories/lab makes, the image's cache
key, the package lists the lab image and role gpu_vms share, the -e overrides.

The whole lab, booted for real, is molecule/lab (its tests/test_lab.py)."""

from __future__ import annotations

import json
import lzma
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from dev.lab import boot, common, debpkg, image
from gpuprov.facts.host import gather
from gpuprov.facts.sysfs import Sysfs
from gpuprov.inputs.vm_list import parse_vm
from gpuprov.model.resolve import resolve
from gpuprov.plan.vm import host as vm_host
from tests.fakehost import FakeHost

REPO = Path(__file__).resolve().parents[1]
HOST_VARS = REPO / "inventories/lab/host_vars/lab-gpu-host.yml"
EDU = ("1234", "11e8", "0x00ff00")
MTTY = ("4348", "3253", "0x070002")  # samples/vfio-mdev/mtty.c: vconfig[0x0] = 0x32534348, class 07 00 02
TESTDEV = ("1b36", "0005", "0x00ff00")  # QEMU's pci-testdev: the lab's large-BAR devices


def read_newc(data: bytes) -> list[dict]:
    """Parse a newc cpio (what the kernel unpacks), entry by entry."""
    out, pos = [], 0
    while True:
        assert data[pos : pos + 6] == b"070701", f"bad magic at {pos}"
        f = [int(data[pos + 6 + 8 * i : pos + 14 + 8 * i], 16) for i in range(13)]
        namesize, filesize = f[11], f[6]
        name = data[pos + 110 : pos + 110 + namesize - 1].decode()
        pos += 110 + namesize
        pos += -pos % 4
        body = data[pos : pos + filesize]
        pos += filesize
        pos += -pos % 4
        if name == "TRAILER!!!":
            return out
        out.append({"name": name, "mode": f[1], "uid": f[2], "gid": f[3], "data": body, "rdev": (f[9], f[10])})


def host_vars() -> dict:
    return yaml.safe_load(HOST_VARS.read_text())


def console_check(vm: str) -> dict:
    return next(c for c in host_vars()["gpu_vms_console_checks"] if c["vm"] == vm)


def nested_vm(name: str = "lab-nested") -> dict:
    console_check(name)  # every VM these tests take is one the playbook checks
    return next(vm for vm in host_vars()["gpuprov_host"]["vms"] if vm["name"] == name)


# ---------------------------------------------------------------- the packages mtty is built from

# `apt-cache madison linux-kbuild-6.1` on 2026-11-29 (bookworm and bookworm-security).
KBUILD_MADISON = """\
linux-kbuild-6.1 |  6.1.192-3 | http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
linux-kbuild-6.1 |  6.1.176-1 | http://deb.debian.org/debian bookworm/main amd64 Packages
"""


def test_the_kernel_tools_come_from_the_headers_release_when_their_revision_moved_on() -> None:
    assert debpkg.same_release(KBUILD_MADISON, "linux-kbuild-6.1", "6.1.192-2") == "6.1.192-3"
    assert debpkg.same_release(KBUILD_MADISON, "linux-kbuild-6.1", "6.1.176-1") == "6.1.176-1"
    with pytest.raises(debpkg.CommandError, match=r"no linux-kbuild-6.1 of release 6.1.190 \(it has 6.1.192-3, 6"):
        debpkg.same_release(KBUILD_MADISON, "linux-kbuild-6.1", "6.1.190-1")
    with pytest.raises(debpkg.CommandError, match="it has none"):
        debpkg.same_release("", "linux-kbuild-6.1", "6.1.192-2")


# ---------------------------------------------------------------- the nested guest's initramfs


def test_cpio_is_what_the_kernel_and_cpio_read(tmp_path: Path) -> None:
    entries = [
        ("dev", stat.S_IFDIR | 0o755, b""),
        ("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)),
        ("init", stat.S_IFREG | 0o755, "#!/bin/sh\n"),
        ("odd", stat.S_IFREG | 0o644, b"12345"),  # a length that needs padding
        ("sh", stat.S_IFLNK | 0o777, "bin/busybox"),
    ]
    out = tmp_path / "x.cpio"
    debpkg.cpio(entries, out)
    data = out.read_bytes()
    assert len(data) % 512 == 0
    got = read_newc(data)
    assert [e["name"] for e in got] == [e[0] for e in entries]
    assert all(e["uid"] == 0 and e["gid"] == 0 for e in got)
    assert got[1]["rdev"] == (5, 1) and stat.S_ISCHR(got[1]["mode"])
    assert got[2]["data"] == b"#!/bin/sh\n" and got[3]["data"] == b"12345" and got[4]["data"] == b"bin/busybox"
    if shutil.which("cpio"):
        listing = subprocess.run(["cpio", "-itv"], input=data, capture_output=True, check=True).stdout.decode()
        console = next(line for line in listing.splitlines() if line.endswith(" dev/console"))
        assert console.startswith("crw-------") and " root " in console and "5,   1" in console, listing


def test_nested_initramfs_holds_init_busybox_console_and_the_power_button_modules() -> None:
    modules = {"evdev.ko": b"EVDEV", "button.ko": b"BUTTON"}
    cloud = {"evdev.ko": b"CLOUD-EVDEV", "button.ko": b"CLOUD-BUTTON"}
    releases = {"6.1.0-99-amd64": modules, "6.1.0-99-cloud-amd64": cloud}
    entries = {e[0]: e for e in image.nested_initramfs(b"BUSYBOX", releases)}
    names = list(entries)
    for name in names:  # parents before children: the kernel does not make directories
        parent = name.rpartition("/")[0]
        assert not parent or names.index(parent) < names.index(name), name
    assert entries["init"][1] == stat.S_IFREG | 0o755 and entries["init"][2].startswith("#!/bin/busybox sh\n")
    assert entries["bin/busybox"][1:3] == (stat.S_IFREG | 0o755, b"BUSYBOX")
    assert entries["dev/console"][1] == stat.S_IFCHR | 0o600 and entries["dev/console"][3] == (5, 1)
    # Each kernel's modules under its release, which /init reads from the running kernel.
    lab, cloud_dir = "lib/modules/6.1.0-99-amd64", "lib/modules/6.1.0-99-cloud-amd64"
    assert entries[f"{lab}/evdev.ko"][2] == b"EVDEV" and entries[f"{lab}/button.ko"][2] == b"BUTTON"
    assert entries[f"{cloud_dir}/evdev.ko"][2] == b"CLOUD-EVDEV" and entries[cloud_dir][1] == stat.S_IFDIR | 0o755
    assert "for m in /lib/modules/$release/*.ko" in image.NESTED_INIT
    assert "read -r release < /proc/sys/kernel/osrelease" in image.NESTED_INIT
    assert sorted(Path(m).name for m in image.NESTED_MODULES) == sorted(modules)


def test_the_cloud_kernel_is_a_nested_package_and_the_lab_kernel_is_not() -> None:
    assert image.is_nested_package("busybox-static") and image.is_nested_package("linux-image-cloud-amd64")
    assert image.is_nested_package("linux-image-6.1.0-99-cloud-amd64")
    assert not image.is_nested_package("linux-image-6.1.0-99-amd64") and not image.is_nested_package("qemu-utils")


def fake_pci(root: Path, devices: dict[str, tuple[str, str, str]]) -> Path:
    pci = root / "sys/bus/pci/devices"
    for addr, (vendor, device, cls) in devices.items():
        d = pci / addr
        d.mkdir(parents=True)
        for name, value in (("vendor", f"0x{vendor}"), ("device", f"0x{device}"), ("class", cls)):
            (d / name).write_text(value + "\n")
    return pci


def init_listing(pci: Path) -> str:
    """The part of the nested /init that lists the PCI devices, run with this machine's sh
    against a fake sysfs, as the serial console shows it (CR LF line ends)."""
    lines = image.NESTED_INIT.splitlines()
    begin = lines.index(f"echo {image.NESTED_BEGIN}")
    end = lines.index(f"echo {image.NESTED_END}")
    script = "\n".join(lines[begin : end + 1]).replace("/sys/bus/pci/devices", str(pci))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    return out.replace("\n", "\r\n")


def test_init_details_each_devices_node_and_bars_each_nodes_cpus_and_the_unplaced_bars(tmp_path: Path) -> None:
    """The part of the nested /init before the PCI list (what molecule/lab reads of the multi-GPU
    guest), run with this machine's sh against a fake sysfs and kernel log: shell builtins and
    busybox's applets only (/init forks as little as it can under TCG inside TCG)."""
    pci = tmp_path / "sys/bus/pci/devices"
    zero = "0x0000000000000000"
    for addr, node, resources in (
        ("0000:00:00.0", "-1", [f"{zero} {zero} {zero}"]),
        (
            "0000:81:00.0",
            "1",
            [
                "0x00000000c0000000 0x00000000c0000fff 0x0000000000040200",
                f"{zero} {zero} {zero}",
                f"{zero} {zero} 0x000000000014220c",
            ],
        ),
    ):
        (pci / addr).mkdir(parents=True)
        (pci / addr / "numa_node").write_text(node + "\n")
        (pci / addr / "resource").write_text("\n".join(resources) + "\n")
    for node, cpus in (("0", "0"), ("1", "1")):
        (tmp_path / f"sys/devices/system/node/node{node}").mkdir(parents=True)
        (tmp_path / f"sys/devices/system/node/node{node}/cpulist").write_text(cpus + "\n")
    kernel_log = tmp_path / "dmesg"
    kernel_log.write_text(
        "[    0.5] pci 0000:81:00.0: BAR 2: no space for [mem size 0x2000000000 64bit pref]\n"
        "[    0.6] pci 0000:81:00.0: BAR 2: failed to assign [mem size 0x2000000000 64bit pref]\n"
        "[    0.7] an unrelated line\n"
    )
    lines = image.NESTED_INIT.splitlines()
    script = "\n".join(lines[lines.index(f"echo {image.NESTED_DETAIL}") : lines.index(f"echo {image.NESTED_BEGIN}")])
    assert "$b dmesg > /klog" in script and "< /klog" in script
    script = script.replace("$b dmesg > /klog", f"cat {kernel_log} > {tmp_path}/klog").replace(
        "< /klog", f"< {tmp_path}/klog"
    )
    script = script.replace("/sys/", f"{tmp_path}/sys/").replace("$b cat", "cat")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        image.NESTED_DETAIL,
        "NUMA 0000:00:00.0 -1",
        "NUMA 0000:81:00.0 1",
        "BAR 0000:81:00.0 0 0x00000000c0000000 0x00000000c0000fff 0x0000000000040200",
        f"BAR 0000:81:00.0 2 {zero} {zero} 0x000000000014220c",
        "NODE 0 0",
        "NODE 1 1",
        "KLOG [    0.5] pci 0000:81:00.0: BAR 2: no space for [mem size 0x2000000000 64bit pref]",
        "KLOG [    0.6] pci 0000:81:00.0: BAR 2: failed to assign [mem size 0x2000000000 64bit pref]",
    ]


@pytest.fixture
def checks() -> dict:
    return console_check("lab-nested")


def test_the_multi_gpu_vms_check_wants_both_large_bar_devices(tmp_path: Path) -> None:
    check = console_check("lab-multi")
    both = {"0000:00:00.0": ("8086", "29c0", "0x060000"), "0000:81:00.0": TESTDEV, "0000:91:00.0": TESTDEV}
    console = init_listing(fake_pci(tmp_path / "both", both))
    assert re.search(check["wait_for"], console, re.M)
    assert all(re.search(p, console, re.M) for p in check["expect"])
    del both["0000:91:00.0"]
    one = init_listing(fake_pci(tmp_path / "one", both))
    assert not all(re.search(p, one, re.M) for p in check["expect"])


def test_the_lab_checks_pass_on_what_init_prints(tmp_path: Path, checks: dict) -> None:
    pci = fake_pci(
        tmp_path,
        {
            "0000:00:00.0": ("8086", "29c0", "0x060000"),
            "0000:00:01.0": ("1b36", "000c", "0x060400"),
            "0000:01:00.0": EDU,
            "0000:02:00.0": MTTY,
        },
    )
    console = "[    1.0] early kernel line\r\n" + init_listing(pci) + "GPUPROV-NESTED: power button: powering off\r\n"
    assert "PCI 0000:01:00.0 1234:11e8 class 0x00ff00\r\n" in console
    assert re.search(checks["wait_for"], console, re.M)
    for pattern in checks["expect"]:
        assert re.search(pattern, console, re.M), pattern


@pytest.mark.parametrize(("missing", "seen"), [("0000:01:00.0", MTTY), ("0000:02:00.0", EDU)])
def test_the_lab_checks_fail_without_the_edu_or_the_mdev(tmp_path: Path, checks: dict, missing: str, seen) -> None:
    devices = {"0000:00:00.0": ("8086", "29c0", "0x060000"), "0000:01:00.0": EDU, "0000:02:00.0": MTTY}
    del devices[missing]
    console = init_listing(fake_pci(tmp_path, devices))
    # Every check names one device: exactly the one that is there passes.
    passed = [p for p in checks["expect"] if re.search(p, console, re.M)]
    assert len(passed) == 1 and f"{seen[0]}:{seen[1]}" in passed[0], passed


def test_a_device_printed_outside_the_markers_does_not_count(checks: dict) -> None:
    console = "PCI 0000:01:00.0 1234:11e8 class 0x00ff00\r\nGPUPROV-NESTED-BEGIN\r\nGPUPROV-NESTED-END\r\n"
    assert not any(re.search(p, console, re.M) for p in checks["expect"])


# ---------------------------------------------------------------- inventories/lab and the image


def test_the_nested_kernel_is_the_elf_inside_the_bzimage() -> None:
    elf = b"\x7fELF" + bytes(range(256)) * 64
    setup = b"MZ" + b"\x00" * 500 + b"HdrS"  # the bzImage's real-mode setup, then its payload
    bzimage = setup + lzma.compress(elf, format=lzma.FORMAT_XZ) + b"\x00" * 16  # and padding after it
    assert image.vmlinux_of(bzimage) == elf
    for bad, why in [
        (setup + b"\x1f\x8b" + b"gzip payload", "not XZ-compressed"),
        (setup + image.XZ_MAGIC + b"garbage", "does not decompress"),
        (setup + lzma.compress(elf, format=lzma.FORMAT_XZ)[:-64], "cut short"),
        (setup + lzma.compress(b"not a kernel", format=lzma.FORMAT_XZ), "no ELF image"),
    ]:
        with pytest.raises(common.LabError, match=why):
            image.vmlinux_of(bad)


def test_the_nested_guest_boots_what_the_image_carries(tmp_path: Path) -> None:
    # The lab's declaration resolved on a stand-in of the lab host (edu A and C, the mtty parent).
    fake = FakeHost(tmp_path)
    for address, group in (("0000:01:00.0", 1), ("0000:02:00.0", 2), ("0000:04:01.0", 3)):
        fake.pci(address, cls=0x00FF00, vendor=0x1234, device=0x11E8, group=group)
    for address, group, node in (("0000:21:00.0", 4, 0), ("0000:31:00.0", 5, 1)):
        fake.pci(address, cls=0x00FF00, vendor=0x1B36, device=0x0005, group=group, numa_node=node)
    fake.paths["mtty"] = "sys/devices/virtual/mtty/mtty"  # a non-PCI mdev parent, as the kernel shows it
    fake.mdev_types("mtty", {"mtty-1": ("Single port serial", 24), "mtty-2": ("Dual port serial", 12)})
    model = resolve(host_vars(), gather(Sysfs(str(fake.finish()))))
    assert (model.problems, model.refusals) == ([], [])
    (vm,) = [v for v in model.vm_list if v["name"] == nested_vm()["name"]]
    spec, problems = parse_vm(vm)
    assert problems == [] and spec is not None
    assert spec.boot is not None
    assert spec.boot.kernel == "/" + image.NESTED_KERNEL  # the lab's own kernel, decompressed
    assert spec.boot.initrd == "/" + image.NESTED_INITRD
    assert "console=ttyS0" in (spec.boot.cmdline or "").split()
    assert spec.network is None and spec.disk is None and spec.cloud_init is None  # nothing to wait for
    assert [g.address for g in spec.gpus] == ["0000:01:00.0"]
    assert model.vfio_devices == ["0000:01:00.0", "0000:02:00.0", "0000:21:00.0", "0000:31:00.0"]
    # The mdev the vGPU role makes (and keeps) is the one the guest gets.
    assert [(m.parent, m.type, m.uuid) for m in spec.mdevs] == [
        ("mtty", "mtty-2", d["uuid"]) for d in model.layout["mtty"]["mdevs"]
    ]


def test_the_image_has_every_package_role_gpu_vms_installs_on_debian() -> None:
    wanted = vm_host.PACKAGES["debian"] + vm_host.PYTHON_PACKAGES["debian"]
    assert set(wanted) <= set(image.PACKAGES), set(wanted) - set(image.PACKAGES)
    assert "mdevctl" in image.PACKAGES  # vgpu_host persists mdevs with it
    assert "python3-apt" in image.PACKAGES  # Ansible's apt module, offline


def test_the_cache_key_covers_the_nested_guest_and_the_packages(monkeypatch, tmp_path: Path) -> None:
    recipe = image.recipe_text()
    for part in (
        "PACKAGES = [",
        "NESTED_PACKAGES",
        "NESTED_INIT = ",
        "def nested_initramfs",
        "def build_nested_initrd",
    ):
        assert part in recipe, part
    versions = {n: "1.0" for n in image.PACKAGES + image.NESTED_PACKAGES}
    versions["linux-image-6.1.0-99-amd64"] = versions.pop("linux-image-amd64")
    monkeypatch.setattr(image, "ensure_key", lambda _lab: _write_key(tmp_path))
    monkeypatch.setattr(debpkg, "resolve", lambda names: dict(versions))
    versions = {"linux-image-6.1.0-99-cloud-amd64": versions.pop("linux-image-cloud-amd64"), **versions}
    key, pkgs, kver, _pubkey = image.image_key(tmp_path)
    # The lab's kernel, whichever of the two images comes first.
    assert kver == "6.1.0-99-amd64" and "busybox-static" in pkgs
    versions["busybox-static"] = "1.1"
    assert image.image_key(tmp_path)[0] != key


def test_resolve_replaces_each_kernel_metapackage_by_the_image_it_pulls(monkeypatch) -> None:
    def stanza(name: str, depends: str = "") -> str:
        return f"Package: {name}\nVersion: 6.1.192-2\n" + (f"Depends: {depends} (= 6.1.192-2)\n" if depends else "")

    stanzas = {
        "linux-image-amd64": stanza("linux-image-amd64", "linux-image-6.1.0-56-amd64"),
        "linux-image-cloud-amd64": stanza("linux-image-cloud-amd64", "linux-image-6.1.0-56-cloud-amd64"),
        "linux-image-6.1.0-56-amd64": stanza("linux-image-6.1.0-56-amd64"),
        "linux-image-6.1.0-56-cloud-amd64": stanza("linux-image-6.1.0-56-cloud-amd64"),
        "busybox-static": stanza("busybox-static"),
    }
    monkeypatch.setattr(debpkg, "show", lambda *names: {n: stanzas[n] for n in names if n in stanzas})
    assert list(debpkg.resolve(["linux-image-amd64", "busybox-static", "linux-image-cloud-amd64"])) == [
        "linux-image-6.1.0-56-amd64",
        "busybox-static",
        "linux-image-6.1.0-56-cloud-amd64",
    ]
    del stanzas["linux-image-cloud-amd64"]
    with pytest.raises(debpkg.CommandError, match="linux-image-cloud-amd64"):
        debpkg.resolve(["linux-image-cloud-amd64"])


def _write_key(tmp: Path) -> Path:
    key = tmp / "id_ed25519"
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAA test\n")
    return key


def test_inventory_overrides_are_json_for_ansible_playbook(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".cache/gpuprov/lab"
    assert common.inventory_overrides(default, common.DEFAULT_PORT) is None
    extra = common.inventory_overrides(tmp_path / "elsewhere", 2600)
    assert extra is not None and extra["ansible_port"] == 2600
    assert extra["ansible_ssh_private_key_file"] == f"{tmp_path}/elsewhere/id_ed25519"
    option = shlex.split(common.overrides_option(extra))
    assert option[0] == "-e" and json.loads(option[1]) == extra


def test_down_adds_up_every_qemu_since_up(tmp_path: Path) -> None:
    """`down` reports the CPU of the lab host's QEMUs since `up` (each reset starts a new one): those
    the watchdog noted as they ended and the one still running; a line it cannot read is left out."""
    (tmp_path / "run").mkdir()
    boot.note_qemu_cpu(tmp_path, (100.4, 80.6))
    boot.note_qemu_cpu(tmp_path, None)  # unreadable at its end: nothing noted
    with (tmp_path / "run" / boot.QEMU_CPU).open("a") as log:
        log.write("garbage\n")
    boot.note_qemu_cpu(tmp_path, (50.0, 20.0))
    running = boot.qemu_cpu(os.getpid())
    assert running is not None and running[0] > 0 and running[1] > 0
    summary = boot.qemu_cpu_summary(tmp_path, os.getpid())
    ran, cpu = re.fullmatch(r"; 3 QEMU run\(s\) since up: (\d+) s, (\d+) CPU-s", summary).groups()
    assert int(ran) >= 150 and int(cpu) >= 101
    assert boot.qemu_cpu(2**22 + 1) is None  # above any pid_max: no such process
    assert boot.qemu_cpu_summary(tmp_path / "nowhere", 2**22 + 1) == ""
