"""What the host itself needs: disks in use, NICs carrying traffic, consoles,
open device files. Binding a device to vfio-pci takes it from the host, so
each of these makes its IOMMU group untouchable."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from .pci import PCI_ADDRESS_RE
from .sysfs import Sysfs

_DEV_FILES = ("/dev/nvidia", "/dev/dri/", "/dev/vfio/")


def pci_device_of(path: str) -> str | None:
    """The PCI device a sysfs device path hangs off (the last address in it)."""
    for part in reversed(path.split("/")):
        if PCI_ADDRESS_RE.match(part):
            return part
    return None


@dataclass
class BlockDevice:
    name: str
    pci_device: str | None
    partition_of: str | None = None  # the disk, for a partition
    uses: list[str] = field(default_factory=list)  # "mounted at /", "swap", ...

    @property
    def in_use(self) -> bool:
        return bool(self.uses)


@dataclass
class NetInterface:
    name: str
    pci_device: str | None
    addresses: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)  # "default via 10.0.2.2", "10.0.2.0/24"
    upper: list[str] = field(default_factory=list)  # bridge/bond it is enslaved to

    @property
    def carries_default_route(self) -> bool:
        return any(r.startswith("default") for r in self.routes)

    @property
    def in_use(self) -> bool:
        return bool(self.addresses or self.routes)


@dataclass
class OpenDeviceFile:
    path: str
    pid: int
    command: str | None


@dataclass
class HostUsage:
    block: dict[str, BlockDevice]
    net: dict[str, NetInterface]
    drm_cards: dict[str, str]  # card/render name -> PCI address
    console_devices: list[str]  # PCI addresses behind the framebuffer console
    open_files: list[OpenDeviceFile]
    open_files_complete: bool  # False when other users' fds could not be read
    nvidia_minors: dict[int, str]  # /dev/nvidiaN minor -> PCI address


# ---------------------------------------------------------------- block devices


def _block_devices(sysfs: Sysfs) -> tuple[dict[str, BlockDevice], dict[str, str]]:
    """Block devices by name, and partition -> its disk."""
    devices: dict[str, BlockDevice] = {}
    disk_of: dict[str, str] = {}
    for name in sysfs.listdir("sys/class/block"):
        real = sysfs.resolve(f"sys/class/block/{name}")
        devices[name] = BlockDevice(name=name, pci_device=pci_device_of(real))
        parts = real.split("/")
        if len(parts) >= 2 and sysfs.exists(f"{real}/partition"):
            disk_of[name] = devices[name].partition_of = parts[-2]
    return devices, disk_of


def _mount_source_name(sysfs: Sysfs, source: str, dm_names: dict[str, str]) -> str | None:
    if not source.startswith("/dev/"):
        return None
    rest = source[5:]
    if rest.startswith("mapper/"):
        return dm_names.get(rest[7:])
    if rest == "root":
        # The kernel names the boot root /dev/root; the cmdline says which it is.
        root_arg = next(
            (t[5:] for t in (sysfs.read("proc/cmdline") or "").split() if t.startswith("root=")),
            "",
        )
        return root_arg[5:] if root_arg.startswith("/dev/") else None
    return rest.rsplit("/", 1)[-1] if rest.startswith(("disk/", "block/")) else rest


def _mark_block_usage(sysfs: Sysfs, devices: dict[str, BlockDevice], disk_of: dict[str, str]) -> None:
    dm_names: dict[str, str] = {}
    for name in devices:
        if name.startswith("dm-"):
            dm = sysfs.read(f"sys/class/block/{name}/dm/name")
            if dm:
                dm_names[dm] = name

    for line in sysfs.read_lines("proc/mounts"):
        fields = line.split()
        if len(fields) < 3:
            continue
        name = _mount_source_name(sysfs, fields[0], dm_names)
        if name in devices:
            devices[name].uses.append(f"mounted at {fields[1]}")
    for line in sysfs.read_lines("proc/swaps")[1:]:
        fields = line.split()
        if fields and fields[0].startswith("/dev/"):
            name = _mount_source_name(sysfs, fields[0], dm_names)
            if name in devices:
                devices[name].uses.append("swap")
    for name, dev in devices.items():
        holders = sysfs.listdir(f"sys/class/block/{name}/holders")
        if holders:
            dev.uses.append("held by " + ", ".join(holders))

    # Use flows down: a dm/md device's slaves and a partition's disk are used by it.
    changed = True
    while changed:
        changed = False
        for name, dev in devices.items():
            if not dev.in_use:
                continue
            below = [disk_of[name]] if name in disk_of else []
            below += sysfs.listdir(f"sys/class/block/{name}/slaves") if name.startswith(("dm-", "md")) else []
            for lower in below:
                lower_dev = devices.get(lower)
                if lower_dev is not None and f"backs {name}" not in lower_dev.uses:
                    lower_dev.uses.append(f"backs {name}")
                    changed = True


# ---------------------------------------------------------------- network


def _hex_ipv4(text: str) -> str:
    # /proc/net/route prints the network-order u32 in host byte order.
    return socket.inet_ntoa(struct.pack("=I", int(text, 16)))


def _prefix_len(mask_hex: str) -> int:
    return bin(struct.unpack("!I", socket.inet_aton(_hex_ipv4(mask_hex)))[0]).count("1")


def _ipv4_routes(sysfs: Sysfs) -> list[tuple[str, str, str, int]]:
    """(iface, destination, gateway, prefix length) per route of the main table."""
    routes = []
    for line in sysfs.read_lines("proc/net/route")[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:
            routes.append((f[0], _hex_ipv4(f[1]), _hex_ipv4(f[2]), _prefix_len(f[7])))
        except (ValueError, OSError, struct.error):
            continue
    return routes


def _local_ipv4(sysfs: Sysfs) -> list[str]:
    """The host's own IPv4 addresses: '/32 host LOCAL' leaves of fib_trie."""
    found: list[str] = []
    last = None
    for line in sysfs.read_lines("proc/net/fib_trie"):
        text = line.strip()
        if text.startswith("|--"):
            last = text[3:].strip()
        elif "/32 host LOCAL" in text and last and last not in found:
            found.append(last)
    return [a for a in found if not a.startswith("127.")]


def _owner_of(address: str, routes: list[tuple[str, str, str, int]]) -> str | None:
    # The interface whose connected (gateway-less) route covers the address.
    addr = struct.unpack("!I", socket.inet_aton(address))[0]
    best: tuple[int, str] | None = None
    for iface, dest, gateway, plen in routes:
        if gateway != "0.0.0.0" or plen == 0:
            continue
        mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
        if addr & mask == struct.unpack("!I", socket.inet_aton(dest))[0] & mask:
            if best is None or plen > best[0]:
                best = (plen, iface)
    return best[1] if best else None


def _net_interfaces(sysfs: Sysfs) -> dict[str, NetInterface]:
    nets: dict[str, NetInterface] = {}
    for name in sysfs.listdir("sys/class/net"):
        real = sysfs.resolve(f"sys/class/net/{name}")
        nets[name] = NetInterface(name=name, pci_device=pci_device_of(real))

    routes = _ipv4_routes(sysfs)
    for iface, dest, gateway, plen in routes:
        if iface in nets:
            text = f"default via {gateway}" if plen == 0 else f"{dest}/{plen}"
            nets[iface].routes.append(text)
    for address in _local_ipv4(sysfs):
        owner = _owner_of(address, routes)
        if owner in nets:
            nets[owner].addresses.append(address)

    for line in sysfs.read_lines("proc/net/if_inet6"):
        f = line.split()
        # addr ifindex prefixlen scope flags name; scope 0x20 is link-local, 0x10 host
        if len(f) == 6 and f[5] in nets and int(f[3], 16) not in (0x10, 0x20):
            addr = ":".join(f[0][i : i + 4] for i in range(0, 32, 4))
            nets[f[5]].addresses.append(f"{addr}/{int(f[2], 16)}")
    for line in sysfs.read_lines("proc/net/ipv6_route"):
        f = line.split()
        if len(f) != 10 or f[9] not in nets or f[9] == "lo":
            continue
        flags = int(f[8], 16)
        if flags & 0x0200:  # RTF_REJECT: unreachable entries
            continue
        if int(f[1], 16) == 0:
            nets[f[9]].routes.append("default (IPv6)")

    for name, net in nets.items():
        seen = {name}
        upper = sysfs.link_name(f"sys/class/net/{name}/master")
        while upper and upper not in seen:
            net.upper.append(upper)
            seen.add(upper)
            upper = sysfs.link_name(f"sys/class/net/{upper}/master")
    return nets


# ---------------------------------------------------------------- consoles, open files


def _drm_cards(sysfs: Sysfs) -> dict[str, str]:
    cards: dict[str, str] = {}
    for name in sysfs.listdir("sys/class/drm"):
        if not name.startswith(("card", "renderD")) or "-" in name:
            continue  # card0-HDMI-A-1 connectors belong to their card
        addr = pci_device_of(sysfs.resolve(f"sys/class/drm/{name}/device"))
        if addr:
            cards[name] = addr
    return cards


def _console_devices(sysfs: Sysfs) -> list[str]:
    """PCI devices behind the framebuffer console.

    fbcon maps every console to fb0 unless ``fbcon=map:`` says otherwise; other
    framebuffers (one per GPU with DRM fbdev emulation) carry no console.
    """
    fbs = ["fb0"]
    for token in (sysfs.read("proc/cmdline") or "").split():
        if token.startswith("fbcon=map:"):
            fbs = sorted({f"fb{c}" for c in token[len("fbcon=map:") :] if c.isdigit()})
    found = []
    for name in fbs:
        addr = pci_device_of(sysfs.resolve(f"sys/class/graphics/{name}/device"))
        if addr and addr not in found:
            found.append(addr)
    return found


def _nvidia_minors(sysfs: Sysfs) -> dict[int, str]:
    minors: dict[int, str] = {}
    for addr in sysfs.listdir("proc/driver/nvidia/gpus"):
        for line in sysfs.read_lines(f"proc/driver/nvidia/gpus/{addr}/information"):
            if line.startswith("Device Minor:"):
                try:
                    minors[int(line.split(":", 1)[1])] = addr.lower()
                except ValueError:
                    pass
    return minors


def open_device_files(sysfs: Sysfs) -> tuple[list[OpenDeviceFile], bool]:
    """Processes holding GPU, DRM or VFIO device files open.

    Reads ``proc/<pid>/fd`` links; as a normal user other users' are not
    readable, so the scan says whether it is complete.
    """
    found: list[OpenDeviceFile] = []
    complete = True
    for pid in sysfs.listdir("proc"):
        if not pid.isdigit():
            continue
        fds = sysfs.try_listdir(f"proc/{pid}/fd")
        if fds is None:
            # Gone meanwhile, or another user's: only the latter leaves the scan partial.
            if sysfs.live and sysfs.exists(f"proc/{pid}"):
                complete = False
            continue
        command = None
        for fd in fds:
            target = sysfs.readlink(f"proc/{pid}/fd/{fd}")
            if target and target.startswith(_DEV_FILES):
                if command is None:
                    command = sysfs.read(f"proc/{pid}/comm")
                found.append(OpenDeviceFile(path=target, pid=int(pid), command=command))
    return found, complete


def read_usage(sysfs: Sysfs) -> HostUsage:
    block, disk_of = _block_devices(sysfs)
    _mark_block_usage(sysfs, block, disk_of)
    open_files, complete = open_device_files(sysfs)
    return HostUsage(
        block=block,
        net=_net_interfaces(sysfs),
        drm_cards=_drm_cards(sysfs),
        console_devices=_console_devices(sysfs),
        open_files=open_files,
        open_files_complete=complete,
        nvidia_minors=_nvidia_minors(sysfs),
    )


def devices_with_open_files(
    usage: HostUsage, groups: dict[str, list[str]], nvidia_bound: list[str]
) -> dict[str, list[str]]:
    """PCI address -> "comm (pid N) has /dev/..." for each device held open."""
    held: dict[str, list[str]] = {}
    for f in usage.open_files:
        who = f"{f.command or '?'} (pid {f.pid}) has {f.path} open"
        targets: list[str] = []
        name = f.path.rsplit("/", 1)[-1]
        if f.path.startswith("/dev/vfio/") and name in groups:
            targets = groups[name]
        elif f.path.startswith("/dev/dri/") and name in usage.drm_cards:
            targets = [usage.drm_cards[name]]
        elif f.path.startswith("/dev/nvidia"):
            minor = name[6:]
            if minor.isdigit() and int(minor) in usage.nvidia_minors:
                targets = [usage.nvidia_minors[int(minor)]]
            elif not minor.isdigit():
                # nvidiactl, nvidia-uvm: the driver is in use, every GPU it drives with it.
                targets = nvidia_bound
        for addr in targets:
            if PCI_ADDRESS_RE.match(addr):
                held.setdefault(addr, []).append(who)
    return held
