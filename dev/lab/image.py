"""The lab image: its recipe (packages, files, nested initramfs) and its cached build
(debootstrap, chroot, first boot under QEMU, ESP). See dev/lab/__init__.py."""

from __future__ import annotations

import fcntl
import hashlib
import json
import lzma
import os
import re
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from . import debpkg
from .common import BUILD_TOOLS, HOSTNAME, LabError, ensure_key, ensure_tools, say

# ---- image recipe: everything from here to the end marker is hashed into the cache key ----

# Installed with apt (no recommends) on a debootstrap --variant=minbase bookworm.
PACKAGES = [
    "linux-image-amd64",
    "initramfs-tools",
    "udev",
    "kmod",
    "systemd-sysv",
    "openssh-server",
    "python3",
    "iproute2",
    "pciutils",
    "sudo",  # the playbook has become: true
    "dbus",  # logind: `shutdown -r 0 MSG` (Ansible's reboot module) needs it
    "python3-apt",  # Ansible's apt module: vgpu_host's mdevctl step finds it installed, offline
    # What a GPU host runs its VMs with: role gpu_vms' Debian package list
    # (roles/gpu_vms/vars/main.yml; tests/test_lab.py keeps the two in step), so its
    # install step finds everything here and changes nothing.
    "libvirt-daemon-system",
    "libvirt-daemon-driver-qemu",
    "qemu-system-x86",
    "qemu-utils",
    "ovmf",
    "genisoimage",
    "dnsmasq-base",
    "python3-libvirt",
    "mdevctl",  # the vGPU role persists mdevs as mdevctl definitions
    # initramfs-tools compresses with zstd (its default, COMPRESS=zstd) and without it falls back to
    # gzip: about 5 s of each update-initramfs under TCG.
    "zstd",
]
# The boot loader (``up --loader``): GRUB (the default, as grub-install would set it up,
# its modules and environment block on the root disk) or systemd-boot on a writable
# GPT ESP mounted at /boot/efi (Debian's bootctl install and kernel-install).
LOADERS = ("grub", "systemd-boot")
DEFAULT_LOADER = "grub"
LOADER_PACKAGES = {
    "grub": ["grub2-common", "grub-efi-amd64-bin"],
    "systemd-boot": ["systemd-boot", "systemd-boot-efi", "dosfstools"],
}
ESP_MOUNT = "/boot/efi"  # systemd-boot's ESP in the lab host (Debian's fstab line, kernel-install's search)
# Not installed: busybox-static goes into the nested guests' initramfs, Debian's cloud kernel boots
# the nested guest on OVMF (NESTED_EFI_KERNEL).
NESTED_PACKAGES = ["busybox-static", "linux-image-cloud-amd64"]
CLOUD_FLAVOUR = "-cloud-amd64"  # the end of the cloud kernel's version (and of its image's package name)
SUITE = "bookworm"
# no_timer_check: under TCG on a busy machine QEMU's device timers can miss the kernel's early check
# that the timer interrupt works through the interrupt-remapped IO-APIC (the lab's IOMMU has
# intremap=on), and the kernel panics at 0.05 s ("timer doesn't work through Interrupt-remapped
# IO-APIC"): seen here at a load of 5-30, on plain boots and on trial boots alike, each one a boot
# lost, and a good trial boot counted as failed. The nested guests carry it for the same reason.
# mitigations=off: the emulated CPU (no PCID) would have the kernel turn on page-table isolation, and
# under TCG each of its page-table switches (two a system call, interrupt or fault) flushes QEMU's
# software TLB; in an emulator the mitigations protect nothing. Measured on the idle lab host,
# 2026-11-27, on and off: its boot 36.7 s and 25.3 s, `python3 -c ...` 1.69 s and 1.13 s,
# mkinitramfs (1,159 processes) 95 s and 75 s (docs/development/timings.md).
GRUB_CMDLINE_LINUX = "console=ttyS0 panic=-1 no_timer_check mitigations=off"
# Debian 12's kernel (CONFIG_INTEL_IOMMU_DEFAULT_ON_INTGPU_OFF=y) turns the Intel
# IOMMU on by itself; the lab starts as a host with it off, the way the firmware
# or an older kernel leaves many hosts: the iommu_host role replaces the argument.
GRUB_CMDLINE_LINUX_DEFAULT = "quiet intel_iommu=off"
# Modules the lab's small initramfs holds (MODULES=list): the root disk and its
# file system. initramfs-tools' own and gpuprov's hooks add theirs.
INITRAMFS_MODULES = ["virtio_pci", "virtio_blk", "ext4", "crc32c_generic"]
# Units that only slow a TCG boot down or do nothing here.
MASKED_UNITS = [
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "systemd-networkd-wait-online.service",
    "getty@tty1.service",
]
# Kernel modules no lab host loads (radios, cameras, other vendors' GPUs...):
# dropping them halves the image.
PRUNED_MODULES = [
    "kernel/drivers/net/wireless",
    "kernel/drivers/media",
    "kernel/drivers/infiniband",
    "kernel/drivers/gpu/drm/amd",
    "kernel/drivers/gpu/drm/nouveau",
    "kernel/drivers/gpu/drm/i915",
    "kernel/drivers/gpu/drm/radeon",
    "kernel/drivers/staging",
    "kernel/drivers/bluetooth",
    "kernel/drivers/isdn",
    "kernel/sound/soc",
    "kernel/net/wireless",
    "kernel/net/mac80211",
    "kernel/net/bluetooth",
]
FILES = {
    "etc/hostname": f"{HOSTNAME}\n",
    "etc/hosts": f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n",
    # The management NIC (e1000 behind the bridge): QEMU user networking's
    # addresses, static (no DHCP wait), no IPv6 chatter.
    "etc/systemd/network/10-mgmt.network": (
        "[Match]\nType=ether\n\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\nDNS=10.0.2.3\n"
        "LinkLocalAddressing=no\nIPv6AcceptRA=no\n"
    ),
    "etc/resolv.conf": "nameserver 10.0.2.3\n",
    "etc/ssh/sshd_config.d/gpuprov-lab.conf": "PermitRootLogin prohibit-password\nPasswordAuthentication no\n",
    "etc/initramfs-tools/conf.d/gpuprov-lab.conf": (
        "# The lab's initramfs holds what /etc/initramfs-tools/modules lists, not every driver:\n"
        "# update-initramfs under TCG takes seconds instead of minutes.\nMODULES=list\n"
    ),
    "etc/dpkg/dpkg.cfg.d/gpuprov-lab-nodoc": (
        "path-exclude=/usr/share/doc/*\npath-include=/usr/share/doc/*/copyright\n"
        "path-exclude=/usr/share/man/*\npath-exclude=/usr/share/info/*\npath-exclude=/usr/share/locale/*\n"
    ),
    "usr/sbin/policy-rc.d": "#!/bin/sh\nexit 101\n",  # no daemons start in the build chroot (removed after)
    # mtty plays the GPU vendor's host driver: loaded at boot, it offers the mdev types.
    "etc/modules-load.d/gpuprov-lab-mtty.conf": "# the lab's mdev parent (samples/vfio-mdev)\nmtty\n",
}
# libvirt's default NAT network would start dnsmasq on every boot: the lab's VMs have no NIC.
# Two initramfs hooks the lab's boot never uses: fsck's (fsck, logsave, e2fsck and their libraries
# copied in; the root is checked by systemd-fsck-root after the switch) and dmsetup's (no device
# mapper here). Each update-initramfs (the trial module's, the vfio bind's: about eight in a CI run)
# spends 9-10 s and 4-5 s of TCG on them: 69 s with both, 56 s without, measured on the idle lab
# host 2026-11-28 (docs/development/timings.md).
REMOVED_FILES = [
    "etc/libvirt/qemu/networks/autostart/default.xml",
    "usr/share/initramfs-tools/hooks/fsck",
    "usr/share/initramfs-tools/hooks/dmsetup",
]

# The nested guest (inventories/lab: TCG inside the lab host's TCG): the lab's own
# kernel (PCI and the 8250 serial console are built in), decompressed (NESTED_KERNEL), and
# this initramfs: busybox and an /init that prints every PCI device it sees on ttyS0
# between two markers (the playbook waits for them in the serial log), then stays
# up until the ACPI power button (evdev + button modules), so a shutdown is quick.
NESTED_INITRD = "var/lib/libvirt/boot/gpuprov-nested-initrd.img"
# The kernel as an ELF vmlinux, not Debian's XZ-compressed bzImage: QEMU boots it straight
# through its PVH entry (CONFIG_PVH), and TCG inside TCG no longer spends about a minute
# of every nested boot decompressing 66 MB (measured on the lab, 2026-11-23: about 240 s to the
# PCI list from /vmlinuz in a converge, 185 s from the vmlinux; the boot arguments in
# inventories/lab take it to 136 s).
NESTED_KERNEL = "var/lib/libvirt/boot/gpuprov-nested-vmlinux"
# A nested guest on OVMF (inventories/lab's multi-GPU VM, whose 64-bit MMIO window only OVMF sizes)
# boots no bare ELF, only a bzImage with its EFI stub, which then decompresses itself: Debian's cloud
# kernel, LZ4-compressed, where the lab's own is XZ (the same source and version, PCI, ACPI, NUMA, PVH
# and the EFI stub built in). Measured on the idle lab host, 2026-11-27, OVMF, one vCPU: 287 s to
# the PCI list from the lab's kernel, 222 s from the cloud kernel (through SeaBIOS its vmlinux
# boots no faster than the lab's: 140 s and 143 s, so the other nested guest keeps the lab's).
NESTED_EFI_KERNEL = "var/lib/libvirt/boot/gpuprov-nested-vmlinuz"
XZ_MAGIC = b"\xfd7zXZ\x00"
NESTED_MODULES = ["kernel/drivers/input/evdev.ko", "kernel/drivers/acpi/button.ko"]
NESTED_BEGIN, NESTED_END = "GPUPROV-NESTED-BEGIN", "GPUPROV-NESTED-END"
NESTED_DETAIL = "GPUPROV-NESTED-DETAIL"
# Every command a shell builtin or busybox's applet called by name: in TCG inside TCG a process
# costs seconds (measured on the lab, 2026-11-27: `busybox --install`'s symlinks 4.7 s, a
# `dmesg | grep | sed` pipeline 13.4 s of a 32 s /init), so /init forks as little as it can.
NESTED_INIT = f"""\
#!/bin/busybox sh
b=/bin/busybox
$b mount -t proc proc /proc
$b mount -t sysfs sysfs /sys
$b mount -t devtmpfs devtmpfs /dev
# What a multi-GPU guest is checked on (issue #29), before the PCI list: each device's NUMA node
# and assigned BARs (sysfs resource: start end flags, unassigned ones all zero), each node's CPUs,
# and the kernel's complaints about BARs it could not place.
echo {NESTED_DETAIL}
for d in /sys/bus/pci/devices/*; do
  read -r n < "$d/numa_node"; echo "NUMA ${{d##*/}} $n"
  i=0
  while read -r start end flags; do
    [ "$flags" = 0x0000000000000000 ] || echo "BAR ${{d##*/}} $i $start $end $flags"
    i=$((i + 1))
  done < "$d/resource"
done
# (cpulist is a binary attribute: `read`'s one-byte reads get nothing from it, cat does)
for n in /sys/devices/system/node/node*; do echo "NODE ${{n##*/node}} $($b cat "$n/cpulist")"; done
$b dmesg > /klog
while read -r line; do
  case "$line" in *"can't assign"* | *"no space for"* | *"failed to assign"*) echo "KLOG $line" ;; esac
done < /klog
echo {NESTED_BEGIN}
for d in /sys/bus/pci/devices/*; do
  read -r v < "$d/vendor"; read -r p < "$d/device"; read -r c < "$d/class"
  echo "PCI ${{d##*/}} ${{v#0x}}:${{p#0x}} class $c"
done
echo {NESTED_END}
read -r release < /proc/sys/kernel/osrelease
for m in /lib/modules/$release/*.ko; do $b insmod "$m"; done
for i in 1 2 3 4 5 6 7 8 9 10; do
  for e in /sys/class/input/event*; do
    name=
    read -r name 2>/dev/null < "$e/device/name"
    [ "$name" = "Power Button" ] && button=/dev/input/${{e##*/}}
  done
  [ -n "$button" ] && [ -c "$button" ] && break
  $b sleep 1
done
if [ -n "$button" ]; then
  $b dd if="$button" of=/dev/null bs=64 count=1 2>/dev/null
  echo "GPUPROV-NESTED: power button: powering off"
  $b poweroff -f
fi
echo "GPUPROV-NESTED: no power button: staying up"
while :; do $b sleep 3600; done
"""


def nested_initramfs(busybox: bytes, modules: dict[str, dict[str, bytes]]) -> list[debpkg.CpioEntry]:
    """The nested guests' initramfs, as cpio entries (busybox, /init, the modules of each kernel
    release under lib/modules/RELEASE/: /init loads the running kernel's)."""
    entries: list[debpkg.CpioEntry] = [
        (d, stat.S_IFDIR | 0o755, b"") for d in ("bin", "dev", "lib", "lib/modules", "proc", "sys")
    ]
    entries += [
        ("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)),  # the kernel opens it for PID 1
        ("bin/busybox", stat.S_IFREG | 0o755, busybox),
        ("init", stat.S_IFREG | 0o755, NESTED_INIT),
    ]
    for release, files in sorted(modules.items()):
        entries.append((f"lib/modules/{release}", stat.S_IFDIR | 0o755, b""))
        entries += [(f"lib/modules/{release}/{n}", stat.S_IFREG | 0o644, data) for n, data in sorted(files.items())]
    return entries


def vmlinux_of(bzimage: bytes) -> bytes:
    """The ELF kernel inside an XZ-compressed bzImage (the payload's stream: what the kernel's
    own scripts/extract-vmlinux finds); LabError when there is none."""
    start = bzimage.find(XZ_MAGIC)
    if start < 0:
        raise LabError("the lab's kernel is not XZ-compressed: no vmlinux for the nested guest")
    xz = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        elf = xz.decompress(bzimage[start:])
    except lzma.LZMAError as exc:
        raise LabError(f"the lab's kernel: its XZ payload does not decompress ({exc})") from exc
    if not xz.eof:
        raise LabError("the lab's kernel: its XZ payload does not decompress (it is cut short)")
    if not elf.startswith(b"\x7fELF"):
        raise LabError("the lab's kernel: its XZ payload is no ELF image")
    return elf


def is_nested_package(name: str) -> bool:
    """A package for the nested guests (NESTED_PACKAGES, the cloud kernel's image as resolved), not
    installed in the lab host."""
    return name in NESTED_PACKAGES or (name.startswith("linux-image-") and name.endswith(CLOUD_FLAVOUR))


def cloud_kernel(deb: Path) -> tuple[str, bytes, dict[str, bytes]]:
    """(release, bzImage, NESTED_MODULES by name) from the cloud kernel's image package."""
    release = deb.name.split("_")[0][len("linux-image-") :]
    files = debpkg.deb_members(deb, f"boot/vmlinuz-{release}", *(f"lib/modules/{release}/{m}" for m in NESTED_MODULES))
    modules = {Path(m).name: files[f"lib/modules/{release}/{m}"] for m in NESTED_MODULES}
    return release, files[f"boot/vmlinuz-{release}"], modules


def build_nested_kernels(root: Path, kver: str, cloud_bzimage: bytes) -> None:
    put(root, NESTED_KERNEL, vmlinux_of((root / "boot" / f"vmlinuz-{kver}").read_bytes()))
    put(root, NESTED_EFI_KERNEL, cloud_bzimage)


def build_nested_initrd(root: Path, modules: dict[str, dict[str, bytes]], busybox_deb: Path) -> None:
    busybox = debpkg.deb_member(busybox_deb, "bin/busybox")
    out = root / NESTED_INITRD
    out.parent.mkdir(parents=True, exist_ok=True)
    debpkg.cpio(nested_initramfs(busybox, modules), out)
    out.chmod(0o644)


EMBEDDED_GRUB_CFG = """\
# Standalone GRUB (the lab's ESP): hand over to the root disk's /boot/grub, as a
# grub-install'ed GRUB would: $prefix there (its modules, grubenv: load_env/save_env
# and so grub-reboot's next_entry reach the root disk), then the grub.cfg that
# update-grub writes from /etc/default/grub, as on any Debian host.
# (By file system UUID: a search by file would find the memdisk's own grub.cfg.)
search --no-floppy --fs-uuid --set=root {fs_uuid}
set prefix=($root)/boot/grub
configfile $prefix/grub.cfg
"""


def kernel_cmdline(fs_uuid: str) -> str:
    """/etc/kernel/cmdline (systemd-boot's kernel-install): the arguments update-grub gives the
    GRUB image's entries (root, ro, GRUB_CMDLINE_LINUX, GRUB_CMDLINE_LINUX_DEFAULT)."""
    return f"root=UUID={fs_uuid} ro {GRUB_CMDLINE_LINUX} {GRUB_CMDLINE_LINUX_DEFAULT}\n"


def fstab(fs_uuid: str, loader: str, esp_volid: str) -> str:
    """The root file system; with systemd-boot also the ESP at ESP_MOUNT (the line Debian's
    installer writes), which bootctl and kernel-install find there."""
    text = f"UUID={fs_uuid} / ext4 errors=remount-ro 0 1\n"
    if loader == "systemd-boot":
        text += f"UUID={esp_volid[:4]}-{esp_volid[4:]} {ESP_MOUNT} vfat umask=0077 0 1\n"
    return text


@contextmanager
def chroot_mounts(root: Path) -> Iterator[None]:
    """/proc, /sys, /dev and /dev/pts inside ``root`` for the duration; always unmounted."""
    done: list[Path] = []
    try:
        for fstype, src, dst in (("proc", "proc", "proc"), ("sysfs", "sys", "sys"), (None, "/dev", "dev")):
            target = root / dst
            target.mkdir(exist_ok=True)
            if fstype:
                debpkg.sh(["mount", "-t", fstype, src, str(target)])
            else:
                debpkg.sh(["mount", "--rbind", src, str(target)])
                debpkg.sh(["mount", "--make-rslave", str(target)])
            done.append(target)
        yield
    finally:
        for target in reversed(done):
            subprocess.run(["umount", "-R", "-l", str(target)], check=False)


def chroot(root: Path, *argv: str, env: dict[str, str] | None = None) -> str:
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    return debpkg.sh(["chroot", str(root), *argv], env={**base, **(env or {})})


def put(root: Path, rel: str, content: str | bytes, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    path.chmod(mode)


def debian_mirrors() -> tuple[str, str]:
    """The Debian and Debian security mirrors the build machine's apt uses."""
    text = ""
    for f in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if f.is_file() and f.suffix in ("", ".list", ".sources"):
            text += f.read_text(errors="replace") + "\n"
    uris = re.findall(r"(?:^deb\s+(?:\[[^]]*\]\s+)?|^URIs:\s*)(\S+)", text, re.M)
    main = next((u for u in uris if "security" not in u and "debian" in u), "http://deb.debian.org/debian")
    sec = next((u for u in uris if "security" in u), "http://deb.debian.org/debian-security")
    return main.rstrip("/"), sec.rstrip("/")


def copy_apt_lists(root: Path, mirror: str, security: str) -> None:
    """The build machine's package lists for exactly these sources: the chroot's apt sees the
    versions the cache key was computed from, with no second download of the indexes."""
    put(
        root,
        "etc/apt/sources.list",
        f"deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\ndeb {security} {SUITE}-security main\n",
    )
    prefixes = [re.sub(r"^\w+://", "", u).replace("/", "_") + "_dists_" for u in (mirror, security)]
    lists = root / "var/lib/apt/lists"
    for f in Path("/var/lib/apt/lists").iterdir():
        if f.is_file() and any(f.name.startswith(p) for p in prefixes):
            shutil.copy(f, lists / f.name)


def edit_grub_default(text: str) -> str:
    """Debian's /etc/default/grub with the lab's changes: no menu wait, the serial console,
    the IOMMU off."""
    changes = [
        (r"^GRUB_TIMEOUT=.*$", "GRUB_TIMEOUT=0"),
        (r"^GRUB_CMDLINE_LINUX_DEFAULT=.*$", f'GRUB_CMDLINE_LINUX_DEFAULT="{GRUB_CMDLINE_LINUX_DEFAULT}"'),
        (r"^GRUB_CMDLINE_LINUX=.*$", f'GRUB_CMDLINE_LINUX="{GRUB_CMDLINE_LINUX}"'),
        (r"^#?GRUB_TERMINAL=.*$", "GRUB_TERMINAL=console"),
    ]
    for pattern, line in changes:
        text, n = re.subn(pattern, line, text, count=1, flags=re.M)
        if n != 1:
            raise LabError(f"/etc/default/grub has no line matching {pattern}: Debian's template changed")
    if "intel_iommu=on" in text:
        raise LabError("/etc/default/grub already turns the IOMMU on: the lab must start with it off")
    return text


def setup_grub(root: Path, fs_uuid: str) -> None:
    """GRUB as grub-install leaves it on the root disk (its x86_64-efi modules and an
    environment block under /boot/grub), /etc/default/grub, and the standalone GRUB
    for the ESP (/tmp/BOOTX64.EFI) that hands over to it. In the build chroot."""
    grub_dir = root / "boot/grub"
    grub_dir.mkdir(exist_ok=True)  # update-grub writes into it
    modules = grub_dir / "x86_64-efi"
    modules.mkdir(exist_ok=True)
    for f in (root / "usr/lib/grub/x86_64-efi").iterdir():
        if f.suffix in (".mod", ".lst"):  # what grub-install copies for a platform
            shutil.copy(f, modules / f.name)
    chroot(root, "grub-editenv", "/boot/grub/grubenv", "create")
    grub = root / "etc/default/grub"
    if not grub.exists():  # written by grub-pc/grub-efi-amd64's postinst, which a lab does not need
        shutil.copy(root / "usr/share/grub/default/grub", grub)
    grub.write_text(edit_grub_default(grub.read_text()))
    put(root, "tmp/embedded.cfg", EMBEDDED_GRUB_CFG.format(fs_uuid=fs_uuid))
    chroot(
        root,
        "grub-mkstandalone",
        "-O",
        "x86_64-efi",
        "-o",
        "/tmp/BOOTX64.EFI",
        "boot/grub/grub.cfg=/tmp/embedded.cfg",
    )
    (root / "tmp/embedded.cfg").unlink()


def setup_systemd_boot(root: Path, fs_uuid: str) -> None:
    """What systemd-boot needs before the first boot installs it: the kernel's arguments in
    /etc/kernel/cmdline and the ESP's mount point. (Installed in the chroot, systemd-boot's
    postinst found no ESP mounted and left it for first_boot.)"""
    put(root, "etc/kernel/cmdline", kernel_cmdline(fs_uuid))
    (root / ESP_MOUNT.lstrip("/")).mkdir(parents=True, exist_ok=True)


def build_rootfs(
    root: Path, pkgs: dict[str, str], kver: str, pubkey: str, mtty: Path, lab: Path, fs_uuid: str, loader: str
) -> None:
    mirror, security = debian_mirrors()
    cache = lab / "debs"
    nested = {n: v for n, v in pkgs.items() if is_nested_package(n)}
    pkgs = {n: v for n, v in pkgs.items() if not is_nested_package(n)}
    (busybox_deb,) = debpkg.download({"busybox-static": nested.pop("busybox-static")}, cache)
    (cloud_deb,) = debpkg.download(nested, cache)
    (cache / "debootstrap").mkdir(parents=True, exist_ok=True)
    say(f"debootstrap --variant=minbase {SUITE} ({mirror})")
    debpkg.sh(
        [
            "debootstrap",
            "--variant=minbase",
            f"--cache-dir={(cache / 'debootstrap').resolve()}",
            SUITE,
            str(root),
            mirror,
        ]
    )
    for rel, text in FILES.items():
        put(root, rel, text, 0o755 if rel.endswith("policy-rc.d") else 0o644)
    copy_apt_lists(root, mirror, security)
    apt_cache = root / "var/cache/apt/archives"
    (cache / "apt/partial").mkdir(parents=True, exist_ok=True)
    with chroot_mounts(root):
        debpkg.sh(["mount", "--bind", str((cache / "apt").resolve()), str(apt_cache)])
        try:
            say(f"apt-get install {' '.join(pkgs)}")
            # INITRD=No: no initramfs per package; one is made below, once configured.
            chroot(
                root,
                "apt-get",
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "-o",
                "Dpkg::Options::=--force-confold",
                *(f"{n}={v}" for n, v in pkgs.items()),
                env={"DEBIAN_FRONTEND": "noninteractive", "INITRD": "No"},
            )
        finally:
            subprocess.run(["umount", str(apt_cache)], check=False)
        say("configuring")
        for rel in PRUNED_MODULES:
            shutil.rmtree(root / "lib/modules" / kver / rel, ignore_errors=True)
        extra = root / "lib/modules" / kver / "extra"
        extra.mkdir(parents=True, exist_ok=True)
        shutil.copy(mtty, extra / "mtty.ko")  # loaded at boot (modules-load.d, FILES)
        chroot(root, "depmod", "-a", kver)
        cloud_release, cloud_bzimage, cloud_modules = cloud_kernel(cloud_deb)
        lab_modules = {Path(m).name: (root / "lib/modules" / kver / m).read_bytes() for m in NESTED_MODULES}
        build_nested_initrd(root, {kver: lab_modules, cloud_release: cloud_modules}, busybox_deb)
        build_nested_kernels(root, kver, cloud_bzimage)
        for rel in REMOVED_FILES:
            with suppress(FileNotFoundError):
                (root / rel).unlink()
        modules = root / "etc/initramfs-tools/modules"
        modules.write_text(modules.read_text() + "".join(f"{m}\n" for m in INITRAMFS_MODULES))
        put(root, "etc/machine-id", uuid.uuid4().hex + "\n", 0o444)
        ssh = root / "root/.ssh"
        ssh.mkdir(mode=0o700, exist_ok=True)
        put(root, "root/.ssh/authorized_keys", pubkey, 0o600)
        chroot(root, "systemctl", "enable", "systemd-networkd.service", "ssh.service")
        chroot(root, "systemctl", "mask", *MASKED_UNITS)
        with suppress(FileNotFoundError):
            (root / "boot" / f"initrd.img-{kver}").unlink()
        chroot(root, "update-initramfs", "-c", "-k", kver)
        put(root, "usr/local/sbin/gpuprov-lab-firstboot", firstboot_script(loader), 0o755)
        if loader == "grub":
            setup_grub(root, fs_uuid)
        else:
            setup_systemd_boot(root, fs_uuid)
    (root / "usr/sbin/policy-rc.d").unlink()
    # The lab host has no network to fetch packages with: no indexes, no caches.
    for p in [*(root / "var/lib/apt/lists").glob("*_*"), *(root / "var/cache/apt").glob("*.bin")]:
        p.unlink()


def make_root_image(root: Path, img: Path, fs_uuid: str) -> None:
    """root/ into an ext4 image (whole disk, no partitions: the lab's /dev/vda)."""
    mounted = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    if any(m == str(root) or m.startswith(f"{root}/") for m in mounted):
        raise LabError(f"something is still mounted under {root}: not imaging it")
    used = int(debpkg.sh(["du", "-s", "--block-size=1M", str(root)]).split()[0])
    size = used + used // 4 + 768  # room for initramfs rebuilds, logs, the vGPU role's packages
    debpkg.sh(["mkfs.ext4", "-q", "-F", "-L", "labroot", "-U", fs_uuid, "-d", str(root), str(img), f"{size}M"])


FIRSTBOOT_LOADER = {
    # update-grub on the lab host's own kernel and disk, so /boot/grub/grub.cfg comes from
    # /etc/default/grub exactly as it will whenever the lab host runs update-grub itself.
    "grub": "update-grub && ok=1\n",
    # What systemd-boot's postinst does where an ESP is mounted (/var/lib/dpkg/info/
    # systemd-boot.postinst): bootctl install, then kernel-install add for each kernel (its
    # entry's options from /etc/kernel/cmdline). udev first, as on a booted host: bootctl finds
    # and checks the ESP (GPT partition type) through udev's device database and links.
    "systemd-boot": f"""\
/lib/systemd/systemd-udevd --daemon && udevadm trigger && udevadm settle
if mount {ESP_MOUNT} && bootctl install --make-machine-id-directory=auto; then
  ok=1
  for k in /boot/vmlinuz-*; do kernel-install add "${{k#/boot/vmlinuz-}}" "$k" || ok=
  done
  printf 'timeout 0\\n' > {ESP_MOUNT}/loader/loader.conf || ok=
fi
umount {ESP_MOUNT}
udevadm control --exit
""",
}


def firstboot_script(loader: str) -> str:
    """/usr/local/sbin/gpuprov-lab-firstboot: init of the image's one boot while it is built,
    which sets the boot loader up on the lab host's own kernel and disks, then powers off."""
    return (
        "#!/bin/sh\n"
        f"# The image's first boot (once, while it is built): the boot loader ({loader}).\n"
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
        "mount -t proc proc /proc\n"
        "mount -t sysfs sysfs /sys\n"
        "exec > /dev/console 2>&1\n"
        "ok=\n"
        f"{FIRSTBOOT_LOADER[loader]}"
        '[ -n "$ok" ] && echo "gpuprov-lab: firstboot ok"\n'
        "rm -f /usr/local/sbin/gpuprov-lab-firstboot\n"
        "for i in 1 2 3 4 5; do mount -o remount,ro / && break; sleep 1; done\n"  # udevd's workers may linger
        "sync\n"
        "echo o > /proc/sysrq-trigger\n"
    )


def first_boot(img: Path, work: Path, fs_uuid: str, loader: str) -> None:
    """Boot the image once (QEMU direct kernel boot) to set its boot loader up
    (firstboot_script), and check what that wrote."""
    log = work / "firstboot.log"
    argv = [
        "qemu-system-x86_64",
        "-machine",
        "q35",
        "-accel",
        "tcg",
        "-m",
        "1024",
        "-smp",
        "2",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-kernel",
        str(work / "vmlinuz"),
        "-initrd",
        str(work / "initrd.img"),
        "-append",
        f"root=UUID={fs_uuid} rw console=ttyS0 panic=-1 mitigations=off quiet "
        "init=/usr/local/sbin/gpuprov-lab-firstboot",
        "-drive",
        f"file={img},format=raw,if=virtio",
        *(["-drive", f"file={work / 'esp.img'},format=raw,if=virtio"] if loader == "systemd-boot" else []),
        "-netdev",
        "user,id=n0,restrict=on",
        "-serial",
        f"file:{log}",
    ]
    try:
        # About 1-2 min idle; scripts/test.sh runs the systemd-boot image's at nice 10 beside the
        # lab scenario: at a load of 30 it stalled past 600 s (RCU stalls), and a failed build is
        # built again by molecule/lab_boot, on the lab lane's critical path.
        subprocess.run(argv, capture_output=True, timeout=1500, check=False)
    except subprocess.TimeoutExpired:
        pass
    text = log.read_text(errors="replace") if log.exists() else ""
    if "gpuprov-lab: firstboot ok" not in text:
        raise LabError(f"the image's first boot ({loader}) failed; console:\n{text[-3000:]}")
    if loader == "grub":
        cfg = debpkg.sh(["debugfs", "-R", "cat /boot/grub/grub.cfg", str(img)])
        if f"root=UUID={fs_uuid}" not in cfg or GRUB_CMDLINE_LINUX not in cfg:
            raise LabError("update-grub wrote no entry booting root=UUID= with the lab's console arguments")
        return
    esp = f"{work / 'esp.img'}@@{ESP_OFFSET}"
    entries = debpkg.sh(["mdir", "-b", "-i", esp, "::/loader/entries"]).split()
    options = [entry_options(debpkg.sh(["mtype", "-i", esp, e])) for e in entries if e.endswith(".conf")]
    if not any(o.startswith(kernel_cmdline(fs_uuid).strip()) for o in options):
        raise LabError(f"kernel-install wrote no entry with /etc/kernel/cmdline's options: {entries}")
    debpkg.sh(["mdir", "-i", esp, "::/EFI/BOOT/BOOTX64.EFI"])  # systemd-boot as the removable-media loader


def make_esp(efi: Path, esp: Path) -> None:
    """A FAT ESP image with the standalone GRUB as the removable-media boot loader."""
    debpkg.sh(["mkfs.vfat", "-C", "-n", "LABESP", str(esp), str(16 * 1024)])
    debpkg.sh(["mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT"])
    debpkg.sh(["mcopy", "-i", str(esp), str(efi), "::/EFI/BOOT/BOOTX64.EFI"])


def entry_options(entry: str) -> str:
    """A Boot Loader Specification entry's ``options`` (kernel-install aligns its values with
    spaces and appends systemd.machine_id=), "" without one."""
    for line in entry.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "options":
            return value.strip()
    return ""


# systemd-boot's ESP: a GPT disk of ESP_DISK_MIB whose one partition, from ESP_OFFSET to
# 1 MiB before the end, is an EFI System Partition (bootctl checks the partition type).
ESP_DISK_MIB = 64
ESP_OFFSET = 1024 * 1024


def make_gpt_esp(esp: Path, volid: str) -> None:
    """An empty FAT ESP on a GPT disk (sgdisk, mkfs.vfat into the partition's extent): its
    contents come from bootctl install and kernel-install at the first boot."""
    part_kib = (ESP_DISK_MIB - 2) * 1024
    with open(esp, "wb") as f:
        f.truncate(ESP_DISK_MIB * 1024 * 1024)
    debpkg.sh(["sgdisk", "-n", f"1:{ESP_OFFSET // 512}:+{part_kib}K", "-t", "1:ef00", "-c", "1:EFI System", str(esp)])
    part = esp.with_suffix(".part")
    debpkg.sh(["mkfs.vfat", "-C", "-i", volid, "-n", "LABESP", str(part), str(part_kib)])
    with open(esp, "r+b") as f:
        f.seek(ESP_OFFSET)
        f.write(part.read_bytes())
    part.unlink()


def build_image(lab: Path, key: str, pkgs: dict[str, str], kver: str, pubkey: str, loader: str) -> Path:
    out = lab / "images" / key
    work = lab / "build.tmp"
    if work.exists():
        subprocess.run(["umount", "-R", "-l", str(work / "root")], capture_output=True, check=False)
        shutil.rmtree(work)
    work.mkdir(parents=True)
    mtty = debpkg.build_mtty(kver, lab / "mtty" / kver / "mtty.ko", lab / "debs")
    root = work / "root"
    fs_uuid = str(uuid.uuid4())
    esp_volid = uuid.uuid4().hex[:8].upper()
    build_rootfs(root, pkgs, kver, pubkey, mtty, lab, fs_uuid, loader)
    put(root, "etc/fstab", fstab(fs_uuid, loader, esp_volid))
    if loader == "grub":
        shutil.move(str(root / "tmp/BOOTX64.EFI"), work / "BOOTX64.EFI")
    host_key = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    say("imaging (mkfs.ext4 -d, ESP)")
    for name in ("vmlinuz", "initrd.img"):
        shutil.copy(root / "boot" / f"{name}-{kver}", work / name)
    make_root_image(root, work / "root.img", fs_uuid)
    shutil.rmtree(root)
    if loader == "grub":
        make_esp(work / "BOOTX64.EFI", work / "esp.img")
    else:
        make_gpt_esp(work / "esp.img", esp_volid)
    say(f"first boot ({loader})")
    first_boot(work / "root.img", work, fs_uuid, loader)
    info = {
        "key": key,
        "loader": loader,
        "kernel": kver,
        "packages": pkgs,
        "root_uuid": fs_uuid,
        "host_key": " ".join(host_key),
        "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (work / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name in ("root.img", "esp.img", "info.json"):  # info.json last: it marks a finished image
        (work / name).rename(out / name)
    shutil.rmtree(work)
    return out


# ---- end of the image recipe ----


def recipe_text() -> str:
    src = Path(__file__).read_text()
    start = src.index("# ---- image recipe:")
    return src[start : src.index("# ---- end of the image recipe", start)]


def image_key(lab: Path, loader: str = DEFAULT_LOADER) -> tuple[str, dict[str, str], str, str]:
    """(cache key, package versions, kernel version, root's public key) from apt's view now."""
    pkgs = debpkg.resolve(PACKAGES + LOADER_PACKAGES[loader] + NESTED_PACKAGES)
    kver = next(n for n in pkgs if n.startswith("linux-image-") and not is_nested_package(n))[len("linux-image-") :]
    pubkey = (ensure_key(lab).with_suffix(".pub")).read_text()
    h = hashlib.sha256(f"loader={loader}\n".encode())
    for n, v in sorted(pkgs.items()):
        h.update(f"{n}={v}\n".encode())
    h.update(recipe_text().encode())
    h.update(Path(debpkg.__file__).read_bytes())  # the mtty build
    h.update(pubkey.encode())
    return h.hexdigest()[:16], pkgs, kver, pubkey


def image_loader(image: Path) -> str | None:
    """The boot loader of a finished image (images from before the loader was chosen: GRUB's);
    None for an unfinished one."""
    try:
        return str(json.loads((image / "info.json").read_text()).get("loader", "grub"))
    except (OSError, ValueError):
        return None


@contextmanager
def build_lock(lab: Path) -> Iterator[None]:
    """One image build at a time per cache dir (builds share build.tmp, the .deb cache and mtty):
    scripts/test.sh builds the systemd-boot image while molecule/lab runs, and molecule/lab_boot's
    `up --loader systemd-boot` then waits for that build instead of starting its own."""
    try:
        lab.mkdir(parents=True, exist_ok=True)
        lock = open(lab / "build.lock", "a")  # held for the with block below
    except PermissionError:  # another user's cache dir: nothing can be built in it anyway
        yield
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another image build runs in this cache dir: waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure_image(lab: Path, rebuild: bool = False, loader: str = DEFAULT_LOADER) -> Path:
    """The image of today's inputs for ``loader``, built under the build lock when not cached. A
    cached one is taken without the lock: a build of the other loader holds it for minutes
    (scripts/test.sh builds systemd-boot's while molecule/lab boots GRUB's, which waited for that
    whole build each time both images were rebuilt), and a build removes only its own loader's
    older images."""
    cached = None if rebuild else cached_image(lab, loader)
    if cached is not None:
        return cached
    with build_lock(lab):
        return _ensure_image(lab, rebuild, loader)


def cached_image(lab: Path, loader: str) -> Path | None:
    """The finished image of today's inputs, or None: not built, no lab key yet (made under the
    lock, by the build), or apt knows none of its packages (its update runs under the lock)."""
    if not (lab / "id_ed25519.pub").exists():
        return None
    try:
        key = image_key(lab, loader)[0]
    except debpkg.CommandError:
        return None
    return _finished(lab, key)


def _finished(lab: Path, key: str) -> Path | None:
    """The image of ``key`` when its build finished (its info.json is written last), else None."""
    out = lab / "images" / key
    if not (out / "info.json").exists():
        return None
    say(f"image {key}: cached")
    return out


def _ensure_image(lab: Path, rebuild: bool, loader: str) -> Path:
    try:
        key, pkgs, kver, pubkey = image_key(lab, loader)
    except debpkg.CommandError:
        if os.geteuid() != 0:
            raise
        say("apt-get update (apt knows none of the image's packages yet)")
        debpkg.sh(["apt-get", "update", "-q"], env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        key, pkgs, kver, pubkey = image_key(lab, loader)
    cached = None if rebuild else _finished(lab, key)
    if cached is not None:
        return cached
    if os.geteuid() != 0:
        raise LabError("building the lab image needs root (debootstrap, chroot): run as root once")
    ensure_tools(BUILD_TOOLS)
    t = time.monotonic()
    say(f"image {key}: building ({loader}, kernel {kver})")
    out = build_image(lab, key, pkgs, kver, pubkey, loader)
    say(f"image {key}: built in {time.monotonic() - t:.0f} s")
    for old in (lab / "images").iterdir():  # images of older inputs (this loader's): never booted again
        if old != out and image_loader(old) in (None, loader):
            shutil.rmtree(old)
    return out
