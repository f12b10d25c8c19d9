"""``gpuprov lab``: an emulated GPU host to run the playbooks against for real.

    gpuprov lab up [--fresh]     build the disk image (cached) and boot the lab host
    gpuprov lab ssh [CMD...]     a shell or a command on it (root, key auth)
    gpuprov lab status           running or not, its SSH port, the image's cache key
    gpuprov lab down             power it off

The lab host is QEMU's q35 under TCG (no KVM needed) with an emulated Intel
IOMMU (``intel-iommu,intremap=on``), booting Debian 12 from its own disk through
its own bootloader: OVMF -> a standalone GRUB EFI on a FAT ESP -> the root
disk's ``/boot/grub/grub.cfg``, which ``update-grub`` inside the lab host writes
from its ``/etc/default/grub``. That file starts without ``intel_iommu=on``
(Debian 12's kernel leaves the Intel IOMMU off), so the IOMMU comes on only when
the iommu_host role adds it and the lab host reboots, as on a real host.

QEMU's ``edu`` device (1234:11e8) stands in for GPUs:

- edu A alone behind a pcie-root-port (its own IOMMU group);
- edu B (function 0) with an ich9-intel-hda companion (function 1) behind another;
- edu C and the e1000 management NIC (default route, SSH) behind one
  pcie-pci-bridge: one IOMMU group, which the vfio role must refuse.

The disk image is made only of Debian packages (debootstrap + apt, the build
machine's own apt sources) and cached under ``${GPUPROV_CACHE:-~/.cache/gpuprov}/lab/``,
keyed by the package versions and this file's image recipe; each boot runs on a
copy-on-write overlay (``run/root.qcow2``), so ``up --fresh`` is a brand-new host
in no time. It holds what a GPU host runs VMs with (libvirt, QEMU, OVMF,
python3-libvirt, mdevctl: role gpu_vms' package list, so its install step
changes nothing) and the kernel's ``mtty`` sample mdev driver, built for the lab
kernel and loaded at boot (it plays the GPU vendor's vGPU host driver). For the
nested guest (TCG inside TCG) of inventories/lab it carries a tiny initramfs
(busybox and an /init that lists the guest's PCI devices on its serial console);
the guest's kernel is the lab's own. Building needs root (debootstrap, chroot);
booting and SSH do not. QEMU's user network is ``restrict=on``: nothing leaves
the emulator but the forwarded SSH port on 127.0.0.1. Never shipped to targets
(uses subprocess).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from . import debpkg

HOSTNAME = "lab-gpu-host"
DEFAULT_PORT = 2522
PORT_ENV = "GPUPROV_LAB_PORT"
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")
BOOT_TIMEOUT = 900  # seconds for SSH to answer after QEMU starts (TCG on 2 cores: about 1 minute)


class LabError(RuntimeError):
    """Something the user can act on; the message names the fix."""


def lab_dir() -> Path:
    base = os.environ.get("GPUPROV_CACHE") or str(Path.home() / ".cache" / "gpuprov")
    return Path(base) / "lab"


def default_port() -> int:
    return int(os.environ.get(PORT_ENV) or DEFAULT_PORT)


def inventory_overrides(lab: Path, port: int) -> dict[str, object] | None:
    """The variables inventories/lab needs when the lab is not where it assumes (None when it is),
    for ``ansible-playbook -e JSON``."""
    if lab == Path.home() / ".cache/gpuprov/lab" and port == DEFAULT_PORT:
        return None
    return {
        "ansible_port": port,
        "ansible_ssh_private_key_file": f"{lab}/id_ed25519",
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={lab}/known_hosts -o IdentitiesOnly=yes",
    }


def overrides_option(extra: dict[str, object]) -> str:
    """``-e '{...}'`` for a shell."""
    return "-e " + shlex.quote(json.dumps(extra))


def say(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


# Host tools: the command (or file) and the Debian package that has it.
BUILD_TOOLS = {
    "debootstrap": "debootstrap",
    "mkfs.ext4": "e2fsprogs",
    "mkfs.vfat": "dosfstools",
    "mcopy": "mtools",
    "ssh-keygen": "openssh-client",
    "make": "make",
    "gcc-12": "gcc-12",
    "xz": "xz-utils",
}
RUN_TOOLS = {
    "qemu-system-x86_64": "qemu-system-x86",
    "qemu-img": "qemu-utils",
    "ssh": "openssh-client",
    str(OVMF_CODE): "ovmf",
}


def ensure_tools(tools: dict[str, str]) -> None:
    """Install the Debian packages of missing tools (as root), or say which are missing."""
    missing = sorted({pkg for tool, pkg in tools.items() if not (shutil.which(tool) or Path(tool).is_file())})
    if not missing:
        return
    if os.geteuid() != 0:
        raise LabError(f"missing tools: apt-get install {' '.join(missing)} (as root)")
    say(f"installing {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env, check=False)
    if r.returncode:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False)
        debpkg.sh(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], env=env)


def ensure_key(lab: Path) -> Path:
    """The lab's SSH key (root's authorized key in the image), made once per cache dir."""
    key = lab / "id_ed25519"
    if not key.exists():
        lab.mkdir(parents=True, exist_ok=True)
        ensure_tools({"ssh-keygen": "openssh-client"})
        debpkg.sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuprov-lab", "-f", str(key)])
    return key


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
    "grub2-common",
    "grub-efi-amd64-bin",
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
]
# Not installed: busybox-static goes into the nested guest's initramfs.
NESTED_PACKAGES = ["busybox-static"]
SUITE = "bookworm"
GRUB_CMDLINE_LINUX = "console=ttyS0 panic=-1"
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
REMOVED_FILES = ["etc/libvirt/qemu/networks/autostart/default.xml"]

# The nested guest (inventories/lab: TCG inside the lab host's TCG): the lab's own
# kernel (/vmlinuz; PCI and the 8250 serial console are built in) and this
# initramfs: busybox and an /init that prints every PCI device it sees on ttyS0
# between two markers (the playbook waits for them in the serial log), then stays
# up until the ACPI power button (evdev + button modules), so a shutdown is quick.
NESTED_INITRD = "var/lib/libvirt/boot/gpuprov-nested-initrd.img"
NESTED_MODULES = ["kernel/drivers/input/evdev.ko", "kernel/drivers/acpi/button.ko"]
NESTED_BEGIN, NESTED_END = "GPUPROV-NESTED-BEGIN", "GPUPROV-NESTED-END"
NESTED_INIT = f"""\
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo {NESTED_BEGIN}
for d in /sys/bus/pci/devices/*; do
  read -r v < "$d/vendor"; read -r p < "$d/device"; read -r c < "$d/class"
  echo "PCI ${{d##*/}} ${{v#0x}}:${{p#0x}} class $c"
done
echo {NESTED_END}
for m in /lib/modules/*.ko; do insmod "$m"; done
for i in 1 2 3 4 5 6 7 8 9 10; do
  for e in /sys/class/input/event*; do
    [ "$(cat "$e/device/name" 2>/dev/null)" = "Power Button" ] && button=/dev/input/${{e##*/}}
  done
  [ -n "$button" ] && [ -c "$button" ] && break
  sleep 1
done
if [ -n "$button" ]; then
  dd if="$button" of=/dev/null bs=64 count=1 2>/dev/null
  echo "GPUPROV-NESTED: power button: powering off"
  poweroff -f
fi
echo "GPUPROV-NESTED: no power button: staying up"
while :; do sleep 3600; done
"""


def nested_initramfs(busybox: bytes, modules: dict[str, bytes]) -> list[debpkg.CpioEntry]:
    """The nested guest's initramfs, as cpio entries (busybox, /init, the modules)."""
    entries: list[debpkg.CpioEntry] = [
        (d, stat.S_IFDIR | 0o755, b"") for d in ("bin", "dev", "lib", "lib/modules", "proc", "sys")
    ]
    entries += [
        ("dev/console", stat.S_IFCHR | 0o600, b"", (5, 1)),  # the kernel opens it for PID 1
        ("bin/busybox", stat.S_IFREG | 0o755, busybox),
        ("init", stat.S_IFREG | 0o755, NESTED_INIT),
    ]
    entries += [(f"lib/modules/{name}", stat.S_IFREG | 0o644, data) for name, data in sorted(modules.items())]
    return entries


def build_nested_initrd(root: Path, kver: str, busybox_deb: Path) -> None:
    busybox = debpkg.deb_member(busybox_deb, "bin/busybox")
    modules = {Path(m).name: (root / "lib/modules" / kver / m).read_bytes() for m in NESTED_MODULES}
    out = root / NESTED_INITRD
    out.parent.mkdir(parents=True, exist_ok=True)
    debpkg.cpio(nested_initramfs(busybox, modules), out)
    out.chmod(0o644)


EMBEDDED_GRUB_CFG = """\
# Standalone GRUB (the lab's ESP): hand over to the root disk's grub.cfg,
# which update-grub writes from /etc/default/grub, as on any Debian host.
# (By file system UUID: a search by file would find the memdisk's own grub.cfg.)
# GRUB's modules stay on the memdisk ($prefix): the root disk has none (no grub-install).
search --no-floppy --fs-uuid --set=root {fs_uuid}
configfile ($root)/boot/grub/grub.cfg
"""


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


def put(root: Path, rel: str, text: str, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
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


def build_rootfs(root: Path, pkgs: dict[str, str], kver: str, pubkey: str, mtty: Path, lab: Path, fs_uuid: str) -> None:
    mirror, security = debian_mirrors()
    cache = lab / "debs"
    nested = {n: v for n, v in pkgs.items() if n in NESTED_PACKAGES}
    pkgs = {n: v for n, v in pkgs.items() if n not in NESTED_PACKAGES}
    (busybox_deb,) = debpkg.download(nested, cache)
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
        build_nested_initrd(root, kver, busybox_deb)
        for rel in REMOVED_FILES:
            with suppress(FileNotFoundError):
                (root / rel).unlink()
        (root / "boot/grub").mkdir(exist_ok=True)  # grub-install would make it; update-grub writes into it
        grub = root / "etc/default/grub"
        if not grub.exists():  # written by grub-pc/grub-efi-amd64's postinst, which a lab does not need
            shutil.copy(root / "usr/share/grub/default/grub", grub)
        grub.write_text(edit_grub_default(grub.read_text()))
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
        put(root, "tmp/embedded.cfg", EMBEDDED_GRUB_CFG.format(fs_uuid=fs_uuid))
        put(root, "usr/local/sbin/gpuprov-lab-firstboot", FIRSTBOOT, 0o755)
        chroot(
            root,
            "grub-mkstandalone",
            "-O",
            "x86_64-efi",
            "-o",
            "/tmp/BOOTX64.EFI",
            "boot/grub/grub.cfg=/tmp/embedded.cfg",
        )
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


FIRSTBOOT = """\
#!/bin/sh
# The image's first boot (once, while it is built): update-grub on the lab host's
# own kernel and disk, so /boot/grub/grub.cfg comes from /etc/default/grub exactly
# as it will whenever the lab host runs update-grub itself.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
update-grub > /dev/console 2>&1 && echo "gpuprov-lab: firstboot ok" > /dev/console
rm -f /usr/local/sbin/gpuprov-lab-firstboot
mount -o remount,ro /
sync
echo o > /proc/sysrq-trigger
"""


def first_boot(img: Path, work: Path, fs_uuid: str) -> None:
    """Boot the image once (QEMU direct kernel boot) to run its own update-grub."""
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
        f"root=UUID={fs_uuid} rw console=ttyS0 panic=-1 quiet init=/usr/local/sbin/gpuprov-lab-firstboot",
        "-drive",
        f"file={img},format=raw,if=virtio",
        "-netdev",
        "user,id=n0,restrict=on",
        "-serial",
        f"file:{log}",
    ]
    try:
        subprocess.run(argv, capture_output=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        pass
    text = log.read_text(errors="replace") if log.exists() else ""
    if "gpuprov-lab: firstboot ok" not in text:
        raise LabError(f"the image's first boot (update-grub) failed; console:\n{text[-3000:]}")
    cfg = debpkg.sh(["debugfs", "-R", "cat /boot/grub/grub.cfg", str(img)])
    if f"root=UUID={fs_uuid}" not in cfg or GRUB_CMDLINE_LINUX not in cfg:
        raise LabError("update-grub wrote no entry booting root=UUID= with the lab's console arguments")


def make_esp(efi: Path, esp: Path) -> None:
    """A FAT ESP image with the standalone GRUB as the removable-media boot loader."""
    debpkg.sh(["mkfs.vfat", "-C", "-n", "LABESP", str(esp), str(16 * 1024)])
    debpkg.sh(["mmd", "-i", str(esp), "::/EFI", "::/EFI/BOOT"])
    debpkg.sh(["mcopy", "-i", str(esp), str(efi), "::/EFI/BOOT/BOOTX64.EFI"])


def build_image(lab: Path, key: str, pkgs: dict[str, str], kver: str, pubkey: str) -> Path:
    out = lab / "images" / key
    work = lab / "build.tmp"
    if work.exists():
        subprocess.run(["umount", "-R", "-l", str(work / "root")], capture_output=True, check=False)
        shutil.rmtree(work)
    work.mkdir(parents=True)
    mtty = debpkg.build_mtty(kver, lab / "mtty" / kver / "mtty.ko", lab / "debs")
    root = work / "root"
    fs_uuid = str(uuid.uuid4())
    build_rootfs(root, pkgs, kver, pubkey, mtty, lab, fs_uuid)
    put(root, "etc/fstab", f"UUID={fs_uuid} / ext4 errors=remount-ro 0 1\n")
    shutil.move(str(root / "tmp/BOOTX64.EFI"), work / "BOOTX64.EFI")
    (root / "tmp/embedded.cfg").unlink()
    host_key = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2]
    say("imaging (mkfs.ext4 -d, ESP)")
    for name in ("vmlinuz", "initrd.img"):
        shutil.copy(root / "boot" / f"{name}-{kver}", work / name)
    make_root_image(root, work / "root.img", fs_uuid)
    shutil.rmtree(root)
    say("first boot (update-grub)")
    first_boot(work / "root.img", work, fs_uuid)
    make_esp(work / "BOOTX64.EFI", work / "esp.img")
    info = {
        "key": key,
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


def image_key(lab: Path) -> tuple[str, dict[str, str], str, str]:
    """(cache key, package versions, kernel version, root's public key) from apt's view now."""
    pkgs = debpkg.resolve(PACKAGES + NESTED_PACKAGES)
    kver = next(n for n in pkgs if n.startswith("linux-image-"))[len("linux-image-") :]
    pubkey = (ensure_key(lab).with_suffix(".pub")).read_text()
    h = hashlib.sha256()
    for n, v in sorted(pkgs.items()):
        h.update(f"{n}={v}\n".encode())
    h.update(recipe_text().encode())
    h.update(Path(debpkg.__file__).read_bytes())  # the mtty build
    h.update(pubkey.encode())
    return h.hexdigest()[:16], pkgs, kver, pubkey


def ensure_image(lab: Path, rebuild: bool = False) -> Path:
    try:
        key, pkgs, kver, pubkey = image_key(lab)
    except debpkg.CommandError:
        if os.geteuid() != 0:
            raise
        say("apt-get update (apt knows none of the image's packages yet)")
        debpkg.sh(["apt-get", "update", "-q"], env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        key, pkgs, kver, pubkey = image_key(lab)
    out = lab / "images" / key
    if (out / "info.json").exists() and not rebuild:
        say(f"image {key}: cached")
        return out
    if os.geteuid() != 0:
        raise LabError("building the lab image needs root (debootstrap, chroot): run as root once")
    ensure_tools(BUILD_TOOLS)
    t = time.monotonic()
    say(f"image {key}: building (kernel {kver})")
    out = build_image(lab, key, pkgs, kver, pubkey)
    say(f"image {key}: built in {time.monotonic() - t:.0f} s")
    for old in (lab / "images").iterdir():  # images of older inputs: never booted again
        if old != out:
            shutil.rmtree(old)
    return out


# ---------------------------------------------------------------- the running lab host


def run_dir(lab: Path) -> Path:
    return lab / "run"


def read_state(lab: Path) -> dict:
    try:
        return json.loads((run_dir(lab) / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def qemu_pid(lab: Path) -> int | None:
    """The lab's QEMU process, if it runs."""
    try:
        pid = int((run_dir(lab) / "qemu.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"qemu-system" in cmdline and str(run_dir(lab)).encode() in cmdline else None


def qemu_argv(lab: Path, image: Path, port: int) -> list[str]:
    run = run_dir(lab)
    return [
        *debpkg.QEMU_HOST,
        "-name",
        HOSTNAME,
        "-m",
        "2048",
        "-nodefaults",
        "-display",
        "none",
        "-drive",
        f"if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}",
        "-drive",
        f"if=pflash,format=raw,unit=1,file={run / 'OVMF_VARS.fd'}",
        # The root disk (/dev/vda, the overlay) and the ESP (read-only, the cached image).
        "-drive",
        f"if=none,id=root,format=qcow2,file={run / 'root.qcow2'}",
        "-device",
        "virtio-blk-pci,drive=root,bus=pcie.0,addr=0x4,bootindex=1",
        "-drive",
        f"if=none,id=esp,format=raw,readonly=on,file={image / 'esp.img'}",
        "-device",
        "virtio-blk-pci,drive=esp,bus=pcie.0,addr=0x5,bootindex=0",
        # edu A: alone behind a root port.
        "-device",
        "pcie-root-port,id=rp1,bus=pcie.0,addr=0x1,chassis=1",
        "-device",
        "edu,bus=rp1",
        # edu B (function 0) with an HD-audio companion (function 1) behind a root port.
        "-device",
        "pcie-root-port,id=rp2,bus=pcie.0,addr=0x2,chassis=2",
        "-device",
        "edu,bus=rp2,addr=0x0.0,multifunction=on",
        "-device",
        "ich9-intel-hda,id=hda,bus=rp2,addr=0x0.1",
        "-audiodev",
        "none,id=snd0",
        "-device",
        "hda-output,bus=hda.0,audiodev=snd0",
        # edu C and the management NIC behind one PCIe-to-PCI bridge: one IOMMU group.
        "-device",
        "pcie-root-port,id=rp3,bus=pcie.0,addr=0x3,chassis=3",
        "-device",
        "pcie-pci-bridge,id=br1,bus=rp3",
        "-device",
        "edu,bus=br1,addr=0x1",
        "-device",
        "e1000,netdev=n0,mac=52:54:00:00:00:02,bus=br1,addr=0x2",
        "-netdev",
        f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-chardev",
        f"file,id=ser0,path={run / 'console.log'}",
        "-serial",
        "chardev:ser0",
        "-qmp",
        f"unix:{run / 'qmp.sock'},server=on,wait=off",
        "-pidfile",
        str(run / "qemu.pid"),
        "-daemonize",
    ]


def ssh_argv(lab: Path, port: int, tty: bool = False) -> list[str]:
    return [
        "ssh",
        "-i",
        str(lab / "id_ed25519"),
        "-p",
        str(port),
        "-o",
        f"UserKnownHostsFile={lab / 'known_hosts'}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=10",
        *(["-t"] if tty else []),
        "root@127.0.0.1",
    ]


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # As QEMU binds it: SO_REUSEADDR, so TIME_WAIT from earlier SSH sessions does not count.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_for_ssh(lab: Path, port: int, timeout: float) -> float:
    """Seconds until SSH runs a command; LabError (with the console's tail) if it never does."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if qemu_pid(lab) is None:
            raise LabError(f"QEMU exited while booting; console:\n{console_tail(lab)}")
        with suppress(subprocess.TimeoutExpired):
            r = subprocess.run([*ssh_argv(lab, port), "true"], capture_output=True, timeout=30, check=False)
            if r.returncode == 0:
                return time.monotonic() - t0
        time.sleep(2)
    raise LabError(f"no SSH on 127.0.0.1:{port} after {timeout:.0f} s; console:\n{console_tail(lab)}")


def console_tail(lab: Path, chars: int = 3000) -> str:
    try:
        return (run_dir(lab) / "console.log").read_text(errors="replace")[-chars:]
    except OSError:
        return "(no console log)"


def up(lab: Path, port: int, fresh: bool, rebuild: bool, timeout: float) -> int:
    run = run_dir(lab)
    state = read_state(lab)
    pid = qemu_pid(lab)
    if pid:
        if fresh or rebuild:
            raise LabError("the lab host is running: `gpuprov lab down` first")
        say(f"already running (pid {pid}), SSH on 127.0.0.1:{state.get('port')}")
        return 0
    ensure_tools(RUN_TOOLS)
    t0 = time.monotonic()
    image = ensure_image(lab, rebuild)
    t_image = time.monotonic() - t0
    if not port_free(port):
        raise LabError(
            f"127.0.0.1:{port} is in use: pick another port with --port or {PORT_ENV} "
            "(and give ansible-playbook the -e options `gpuprov lab status` prints)"
        )
    if state.get("key") not in (None, image.name) and not fresh:
        say(f"the image changed ({state.get('key')} -> {image.name}): the lab host starts fresh")
        fresh = True
    if fresh or not (run / "root.qcow2").exists():
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        debpkg.sh(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                str((image / "root.img").resolve()),
                str(run / "root.qcow2"),
            ]
        )
        shutil.copy(OVMF_VARS, run / "OVMF_VARS.fd")
    info = json.loads((image / "info.json").read_text())
    (lab / "known_hosts").write_text(f"[127.0.0.1]:{port} {info['host_key']}\n")
    for stale in ("qemu.pid", "qmp.sock"):
        with suppress(FileNotFoundError):
            (run / stale).unlink()
    argv = qemu_argv(lab, image, port)
    (run / "qemu.argv").write_text(json.dumps(argv) + "\n")
    r = subprocess.run(argv, capture_output=True, text=True, cwd=run, check=False)
    if r.returncode:
        raise LabError(f"QEMU did not start: {r.stderr.strip()}")
    state = {"key": image.name, "port": port, "started": time.time(), "image": str(image)}
    (run / "state.json").write_text(json.dumps(state, indent=2) + "\n")
    pid = qemu_pid(lab)
    if pid:
        start_watchdog(lab, pid)
    say(f"booting (console: {run / 'console.log'})")
    boot = wait_for_ssh(lab, port, timeout)
    say(f"up: SSH on 127.0.0.1:{port} after {boot:.0f} s of boot (image step {t_image:.0f} s)")
    extra = inventory_overrides(lab, port)
    if extra:
        say(f"inventories/lab assumes ~/.cache/gpuprov/lab and port {DEFAULT_PORT}: add {overrides_option(extra)}")
    return 0


def qmp(lab: Path, *commands: str) -> None:
    """Send QMP commands (after the capabilities handshake); errors are ignored."""
    with suppress(OSError, ValueError), socket.socket(socket.AF_UNIX) as s:
        s.settimeout(5)
        s.connect(str(run_dir(lab) / "qmp.sock"))
        f = s.makefile("rw")
        f.readline()
        for cmd in ("qmp_capabilities", *commands):
            f.write(json.dumps({"execute": cmd}) + "\n")
            f.flush()
            while not {"return", "error"} & json.loads(f.readline() or "{}").keys():
                pass  # an event (RESET, POWERDOWN...) came first


# The console lines that start a boot (the firmware handing over to GRUB, or the
# kernel restarting the machine) and the one that ends it (getty on ttyS0).
BOOT_STARTS = ("BdsDxe: starting", "reboot: Restarting system")
BOOT_DONE = f"{HOSTNAME} login:"
WATCHDOG_LIMIT = 240  # seconds from a boot's start to its login prompt (about 30 s normally)
WATCHDOG_TRIES = 3  # resets in a row without a finished boot before the watchdog gives up


def watchdog(lab: Path, pid: int, limit: float = WATCHDOG_LIMIT) -> None:
    """The lab's BMC: reset the machine when a boot does not reach its login prompt in time.

    Debian's kernel under TCG now and then hangs early in boot (both vCPUs spinning
    with interrupts off, around the switch to the TSC clocksource, about one boot in
    thirty); a real host's BMC watchdog would reset it, and so does this. Each
    reset is logged in run/watchdog.log (``gpuprov lab status`` shows them). Runs
    until QEMU exits."""
    console, log = run_dir(lab) / "console.log", run_dir(lab) / "watchdog.log"
    offset, started, tries = 0, time.monotonic(), 0
    while not wait_gone(pid, 2):
        try:
            with open(console, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
                offset = f.tell()
        except OSError:
            text = ""
        last_start = max(text.rfind(m) for m in BOOT_STARTS)
        last_done = text.rfind(BOOT_DONE)
        if last_done > last_start:
            started, tries = None, 0
        elif last_start >= 0:
            started = time.monotonic()
        if started is not None and time.monotonic() - started > limit:
            tries += 1
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            with open(log, "a") as f:
                if tries > WATCHDOG_TRIES:
                    f.write(f"{stamp} boot stuck again after {WATCHDOG_TRIES} resets: giving up\n")
                    return
                f.write(f"{stamp} no login prompt {limit:.0f} s after the boot started: system_reset\n")
            qmp(lab, "system_reset")
            started = time.monotonic()


def start_watchdog(lab: Path, pid: int) -> None:
    """Run :func:`watchdog` in a detached process (it outlives this command, ends with QEMU)."""
    code = f"from gpuprov.lab import watchdog; from pathlib import Path; watchdog(Path({str(lab)!r}), {pid})"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    with open(run_dir(lab) / "watchdog.err", "ab") as err:
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )


def wait_gone(pid: int, timeout: float) -> bool:
    """True once ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    t0 = time.monotonic()
    while True:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (OSError, IndexError):
            return True
        if time.monotonic() - t0 >= timeout:
            return False
        time.sleep(0.5)


def down(lab: Path, force: bool, timeout: float) -> int:
    pid = qemu_pid(lab)
    if pid is None:
        say("not running")
        return 0
    port = read_state(lab).get("port", default_port())
    t0 = time.monotonic()
    if not force:
        # A clean shutdown from inside (disks synced); ACPI power button as the fallback.
        with suppress(subprocess.TimeoutExpired):
            subprocess.run([*ssh_argv(lab, port), "systemctl poweroff"], capture_output=True, timeout=30, check=False)
        if not wait_gone(pid, timeout):
            qmp(lab, "system_powerdown")
    if not wait_gone(pid, 0 if force else 30):
        qmp(lab, "quit")
        if not wait_gone(pid, 10):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, 10)
    say(f"down ({time.monotonic() - t0:.0f} s)")
    return 0


def status(lab: Path, as_json: bool) -> int:
    state = read_state(lab)
    pid = qemu_pid(lab)
    try:
        key = image_key(lab)[0]
    except debpkg.CommandError as exc:
        key = f"unknown ({str(exc).splitlines()[0]})"
    out = {
        "running": pid is not None,
        "pid": pid,
        "ssh_port": state.get("port") if pid else None,
        "image_key": key,
        "image_cached": (lab / "images" / key / "info.json").exists(),
        "running_image_key": state.get("key") if pid else None,
        "lab_dir": str(lab),
        "console": str(run_dir(lab) / "console.log"),
        "ssh_key": str(lab / "id_ed25519"),
        # What `ansible-playbook -i inventories/lab` needs as -e (JSON) here; null: nothing.
        "inventory_overrides": inventory_overrides(lab, (state.get("port") if pid else None) or default_port()),
    }
    try:
        out["watchdog_resets"] = (run_dir(lab) / "watchdog.log").read_text().splitlines()
    except OSError:
        out["watchdog_resets"] = []
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    if pid:
        print(f"running: pid {pid}, SSH on 127.0.0.1:{out['ssh_port']} (gpuprov lab ssh)")
        if state.get("key") != key:
            print(f"  runs image {state.get('key')}; the inputs now give {key} (`down` and `up` to rebuild)")
    else:
        print("not running (gpuprov lab up)")
    for line in out["watchdog_resets"]:
        print(f"  watchdog: {line}")
    print(f"image key: {key} ({'cached' if out['image_cached'] else 'not built yet'})")
    print(f"lab dir: {lab}")
    extra = out["inventory_overrides"]
    if extra:
        print(f"ansible-playbook -i inventories/lab needs: {overrides_option(extra)}")
    return 0


def ssh(lab: Path, command: list[str]) -> int:
    if qemu_pid(lab) is None:
        raise LabError("the lab host is not running: gpuprov lab up")
    port = read_state(lab).get("port", default_port())
    if command and command[0] == "--":
        command = command[1:]
    argv = ssh_argv(lab, port, tty=not command and sys.stdin.isatty())
    return subprocess.run([*argv, *command], check=False).returncode


# ---------------------------------------------------------------- CLI


def cmd_lab(args: argparse.Namespace) -> int:
    lab = lab_dir()
    try:
        if args.lab_command == "up":
            return up(lab, args.port, args.fresh, args.rebuild, args.timeout)
        if args.lab_command == "down":
            return down(lab, args.force, args.timeout)
        if args.lab_command == "status":
            return status(lab, args.json)
        return ssh(lab, args.cmd)
    except LabError as exc:
        print(f"gpuprov lab: error: {exc}", file=sys.stderr)
        return 2
    except debpkg.CommandError as exc:
        print(f"gpuprov lab: {exc}", file=sys.stderr)
        return 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov lab`` and its subcommands."""
    p = sub.add_parser(
        "lab",
        help="an emulated GPU host (QEMU TCG, real kernel/IOMMU/vfio/GRUB) to run the playbooks against",
        description="Build (cached) and run the lab host: Debian 12 on q35 with an emulated Intel IOMMU and "
        "QEMU edu devices standing in for GPUs, booting through OVMF and its own GRUB. State and images under "
        "${GPUPROV_CACHE:-~/.cache/gpuprov}/lab/. inventories/lab targets it.",
    )
    lab_sub = p.add_subparsers(dest="lab_command", metavar="ACTION", required=True, help="up, down, ssh or status")
    q = lab_sub.add_parser("up", help="build the image if needed, boot the lab host, wait for SSH")
    q.add_argument(
        "--port",
        type=int,
        default=default_port(),
        help=f"SSH port on 127.0.0.1 (default ${PORT_ENV} or {DEFAULT_PORT})",
    )
    q.add_argument("--fresh", action="store_true", help="start from the pristine image (drop the lab host's changes)")
    q.add_argument("--rebuild", action="store_true", help="rebuild the image even if it is cached")
    q.add_argument("--timeout", type=float, default=BOOT_TIMEOUT, help="seconds to wait for SSH")
    q = lab_sub.add_parser("down", help="power the lab host off (its disk is kept; up --fresh drops it)")
    q.add_argument("--force", action="store_true", help="stop QEMU at once instead of a clean poweroff")
    q.add_argument("--timeout", type=float, default=120, help="seconds to wait for a clean poweroff")
    q = lab_sub.add_parser("ssh", help="run a command on the lab host as root (a shell without one)")
    q.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    q = lab_sub.add_parser("status", help="whether it runs, its SSH port, the image's cache key")
    q.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_lab)
