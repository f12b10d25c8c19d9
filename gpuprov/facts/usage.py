"""What the host itself needs: disks in use, NICs carrying traffic, consoles,
open device files. Binding a device to vfio-pci takes it from the host, so
each of these makes its IOMMU group untouchable."""

from __future__ import annotations

import re
import stat
import struct

# socket's C half: socket.py's own functions are these, and importing socket.py (its enums,
# selectors) was a few ms of every inspect, which needs only the two conversions.
from _socket import inet_aton, inet_ntoa
from dataclasses import dataclass, field

from .evidence import DISPLAY, IN_USE, NETWORK, STORAGE, MissingEvidence, garbled, how_to_read, note
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
    guest: str | None = None  # the VM a QEMU runs (its -name guest=, or libvirt's pid file); None: unknown

    def describe(self) -> str:
        """Who holds it, for a message: ``qemu-system-x86 (pid 4242, guest vm1)``."""
        guest = "" if self.guest is None else f", guest {self.guest}"
        return f"{self.command or '?'} (pid {self.pid}{guest})"

    def runs(self, vm: str) -> bool:
        """Whether this holder is VM ``vm``'s QEMU: its guest name, or on a capture that name's digest."""
        return self.guest is not None and self.guest in (vm, guest_digest(vm))


MAX_GUEST_NAME = 256
GUEST_DIGEST = "sha256:"


def guest_digest(name: str) -> str:
    """How a capture keeps a holder's guest name (docs/concepts/capture-privacy.md): a digest that ties the
    holder to the VM a declaration names, and tells no name."""
    import hashlib  # here: OpenSSL's load is not for every inspect

    return GUEST_DIGEST + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def guest_of_cmdline(raw: bytes | None) -> str | None:
    """The guest name of a QEMU command line (``/proc/PID/cmdline``, NUL-separated): ``-name
    guest=NAME,...`` or ``-name NAME``; None when there is none or it is not a printable name.
    QEMU's option syntax: ``,,`` is a literal comma."""
    if not raw:
        return None
    argv = raw.split(b"\0")
    for i, arg in enumerate(argv[:-1]):
        if arg not in (b"-name", b"--name"):
            continue
        value = argv[i + 1].decode("utf-8", "replace").replace(",,", "\0")
        parts = [part.replace("\0", ",") for part in value.split(",")]
        name = parts[0] if "=" not in parts[0] else None
        for part in parts:
            if part.startswith("guest="):
                name = part[len("guest=") :]
        if name and len(name) <= MAX_GUEST_NAME and name.isprintable():
            return name
        return None
    return None


def _libvirt_pids(sysfs: Sysfs) -> dict[int, str]:
    """pid -> domain name, from libvirt's run/libvirt/qemu/NAME.pid files (a live host's)."""
    out: dict[int, str] = {}
    for name in sysfs.listdir("run/libvirt/qemu"):
        if name.endswith(".pid") and len(name) <= MAX_GUEST_NAME and name[:-4].isprintable():
            text = sysfs.read(f"run/libvirt/qemu/{name}") or ""
            if text.isdigit() and len(text) < 12:
                out[int(text)] = name[:-4]
    return out


@dataclass
class HostUsage:
    block: dict[str, BlockDevice]
    net: dict[str, NetInterface]
    drm_cards: dict[str, str]  # card/render name -> PCI address
    console_devices: list[str]  # PCI addresses behind the framebuffer console
    open_files: list[OpenDeviceFile]
    open_files_complete: bool  # False when some process's fds could not be read
    nvidia_minors: dict[int, str]  # /dev/nvidiaN minor -> PCI address
    non_pci_drm: list[str] = field(default_factory=list)  # DRM nodes on no PCI device (simpledrm...)
    vfio_cdevs: dict[str, str] = field(default_factory=dict)  # /dev/vfio/devices/vfioN name -> PCI address


# ---------------------------------------------------------------- block devices


def _device_path(sysfs: Sysfs, rel: str) -> str | None:
    """Where a class entry (sys/class/block/X, sys/class/net/X) leads: a real
    directory under sys/devices, or None when its link is broken or loops."""
    real = sysfs.resolve(rel)
    # Missing, or still a link after resolving (it loops): one lookup, by type.
    ok = real.startswith("sys/devices/") and sysfs.kind(real) not in (0, stat.S_IFLNK)
    return real if ok else None


def _block_devices(sysfs: Sysfs, missing: MissingEvidence | None) -> tuple[dict[str, BlockDevice], dict[str, str]]:
    """Block devices by name, and partition -> its disk."""
    devices: dict[str, BlockDevice] = {}
    disk_of: dict[str, str] = {}
    names = sysfs.try_listdir("sys/class/block")
    if names is None:
        note(missing, sysfs, "block devices", "sys/class/block", rule=STORAGE)
    for name in names or []:
        real = _device_path(sysfs, f"sys/class/block/{name}")
        if real is None:
            # Which controller it hangs off is unknown, so any could be holding it.
            note(
                missing,
                sysfs,
                f"block device {name}",
                f"sys/class/block/{name}",
                "its link is broken or loops",
                rule=STORAGE,
            )
            devices[name] = BlockDevice(name=name, pci_device=None)
            continue
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


def _source_device(sysfs: Sysfs, source: str, devices: dict[str, BlockDevice], dm_names: dict[str, str]) -> str | None:
    """The block device a mount or swap source names; None when it names none that is known."""
    name = _mount_source_name(sysfs, source, dm_names)
    if name in devices:
        return name
    # /dev/disk/by-uuid/..., /dev/md/NAME, /dev/VG/LV: udev's links to the node.
    real = sysfs.resolve(source.lstrip("/"))
    name = real.rsplit("/", 1)[-1]
    return name if real.startswith("dev/") and name in devices else None


def _unknown_source(sysfs: Sysfs, missing: MissingEvidence | None, source: str, use: str, table: str) -> None:
    note(
        missing,
        sysfs,
        f"the disk behind {source}",
        table,
        f"{source} ({use}) names no block device under /sys/class/block",
        fix=how_to_read(sysfs.live) + "; a /dev/root mount needs root=/dev/NAME on the kernel command line",
        rule=STORAGE,
    )


def _mounts(sysfs: Sysfs, missing: MissingEvidence | None) -> list[tuple[str, str]]:
    """(source, mount point) of every mount; a line that is not one makes the table unknown."""
    text = sysfs.read("proc/mounts")
    if text is None:
        note(missing, sysfs, "mount table", "proc/mounts", rule=STORAGE)
        return []
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        # "SOURCE MOUNTPOINT TYPE OPTIONS 0 0": the kernel escapes blanks inside fields.
        if len(fields) != 6 or not (fields[4].isdigit() and fields[5].isdigit()):
            note(missing, sysfs, "mount table", "proc/mounts", garbled(i, line, "a mount"), rule=STORAGE)
            continue
        found.append((fields[0], fields[1]))
    return found


def _swaps(sysfs: Sysfs, missing: MissingEvidence | None) -> list[str]:
    """Sources of the active swap areas."""
    text = sysfs.read("proc/swaps")
    lines = (text or "").splitlines()
    if text is None or not lines or lines[0].split() != ["Filename", "Type", "Size", "Used", "Priority"]:
        problem = None if text is None else garbled(1, lines[0] if lines else "", "the swaps header")
        note(missing, sysfs, "swap list", "proc/swaps", problem, rule=STORAGE)
        return []
    found = []
    for i, line in enumerate(lines[1:], 2):
        fields = line.split()
        if len(fields) != 5 or not all(f.lstrip("-").isdigit() for f in fields[2:]):
            note(missing, sysfs, "swap list", "proc/swaps", garbled(i, line, "a swap area"), rule=STORAGE)
            continue
        found.append(fields[0])
    return found


def _mark_block_usage(
    sysfs: Sysfs, devices: dict[str, BlockDevice], disk_of: dict[str, str], missing: MissingEvidence | None
) -> None:
    dm_names: dict[str, str] = {}
    for name in devices:
        if name.startswith("dm-"):
            dm = sysfs.read(f"sys/class/block/{name}/dm/name")
            if dm:
                dm_names[dm] = name
            else:
                note(missing, sysfs, f"device-mapper name of {name}", f"sys/class/block/{name}/dm/name", rule=STORAGE)

    for source, mountpoint in _mounts(sysfs, missing):
        if not source.startswith("/dev/"):
            continue
        name = _source_device(sysfs, source, devices, dm_names)
        if name is None:
            _unknown_source(sysfs, missing, source, f"mounted at {mountpoint}", "proc/mounts")
        else:
            devices[name].uses.append(f"mounted at {mountpoint}")
    for source in _swaps(sysfs, missing):
        if not source.startswith("/dev/"):
            continue  # a swap file: its filesystem's disk is mounted
        name = _source_device(sysfs, source, devices, dm_names)
        if name is None:
            _unknown_source(sysfs, missing, source, "swap", "proc/swaps")
        else:
            devices[name].uses.append("swap")
    for name, dev in devices.items():
        if f"block device {name}" in (missing or {}):
            continue  # its link is broken: nothing below it can be read
        holders = sysfs.try_listdir(f"sys/class/block/{name}/holders")
        if holders is None:
            # Every block device has holders/ (LVM, MD, dm-crypt hold from there).
            note(missing, sysfs, f"holders of {name}", f"sys/class/block/{name}/holders", rule=STORAGE)
        elif holders:
            dev.uses.append("held by " + ", ".join(holders))

    slaves: dict[str, list[str]] = {}

    def slaves_of(name: str) -> list[str]:
        if name not in slaves:
            listing = sysfs.try_listdir(f"sys/class/block/{name}/slaves")
            if listing is None:
                note(missing, sysfs, f"slaves of {name}", f"sys/class/block/{name}/slaves", rule=STORAGE)
            slaves[name] = listing or []
        return slaves[name]

    # Use flows down: a dm/md device's slaves and a partition's disk are used by it.
    changed = True
    while changed:
        changed = False
        for name, dev in devices.items():
            if not dev.in_use:
                continue
            below = [disk_of[name]] if name in disk_of else []
            below += slaves_of(name) if name.startswith(("dm-", "md")) else []
            for lower in below:
                lower_dev = devices.get(lower)
                if lower_dev is not None and f"backs {name}" not in lower_dev.uses:
                    lower_dev.uses.append(f"backs {name}")
                    changed = True


# ---------------------------------------------------------------- network


def _hex_ipv4(text: str) -> str:
    # /proc/net/route prints the network-order u32 in host byte order.
    return inet_ntoa(struct.pack("=I", int(text, 16)))


def _prefix_len(mask_hex: str) -> int:
    return bin(struct.unpack("!I", inet_aton(_hex_ipv4(mask_hex)))[0]).count("1")


_HEX8 = re.compile(r"^[0-9A-Fa-f]{8}$")
_ROUTE_HEADER = ["Iface", "Destination", "Gateway", "Flags", "RefCnt", "Use", "Metric", "Mask", "MTU", "Window", "IRTT"]
_TRIE_LINE = re.compile(
    r"^(?:(?:Main|Local|Id \d+):"  # a table
    r"|\+-- \d{1,3}(?:\.\d{1,3}){3}/\d+ \d+ \d+ \d+"  # an inner node
    r"|\|-- \d{1,3}(?:\.\d{1,3}){3}"  # a leaf: one address
    r"|/\d+ \w+ \w+(?: tos=\d+)?)$"  # an alias of the leaf: prefix length, scope, type
)
_INET6_LINE = re.compile(r"^[0-9a-f]{32} [0-9a-f]{2,8} [0-9a-f]{2} [0-9a-f]{2} [0-9a-f]{2,8} +\S+$")
_IPV6_ROUTE_LINE = re.compile(
    r"^[0-9a-f]{32} [0-9a-f]{2} [0-9a-f]{32} [0-9a-f]{2} [0-9a-f]{32}(?: [0-9a-f]{8}){4} +\S+$"
)


def _ipv4_routes(sysfs: Sysfs, missing: MissingEvidence | None) -> list[tuple[str, str, str, int]]:
    """(iface, destination, gateway, prefix length) per route of the main table."""
    text = sysfs.read("proc/net/route")
    if text is None:
        note(missing, sysfs, "IPv4 routes", "proc/net/route", rule=NETWORK)
        return []
    lines = text.splitlines()
    if not lines or lines[0].split() != _ROUTE_HEADER:
        note(
            missing,
            sysfs,
            "IPv4 routes",
            "proc/net/route",
            garbled(1, lines[0] if lines else "", "the header"),
            rule=NETWORK,
        )
        return []
    routes = []
    for i, line in enumerate(lines[1:], 2):
        f = line.split()
        try:
            if len(f) != 11 or not all(_HEX8.match(x) for x in (f[1], f[2], f[7])):
                raise ValueError(line)
            routes.append((f[0], _hex_ipv4(f[1]), _hex_ipv4(f[2]), _prefix_len(f[7])))
        except (ValueError, OSError, struct.error):
            note(missing, sysfs, "IPv4 routes", "proc/net/route", garbled(i, line, "a route"), rule=NETWORK)
    return routes


def _local_ipv4(sysfs: Sysfs, missing: MissingEvidence | None) -> list[str]:
    """The host's own IPv4 addresses: '/32 host LOCAL' leaves of fib_trie."""
    text = sysfs.read("proc/net/fib_trie")
    if text is None:
        note(missing, sysfs, "IPv4 addresses", "proc/net/fib_trie", rule=NETWORK)
        return []
    found: list[str] = []
    last = None
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            continue
        if not _TRIE_LINE.match(stripped):
            note(
                missing, sysfs, "IPv4 addresses", "proc/net/fib_trie", garbled(i, line, "a fib_trie line"), rule=NETWORK
            )
            continue
        if stripped.startswith("|--"):
            last = stripped[3:].strip()
            try:
                inet_aton(last)
            except OSError:  # 999.1.1.1
                note(
                    missing, sysfs, "IPv4 addresses", "proc/net/fib_trie", garbled(i, line, "an address"), rule=NETWORK
                )
                last = None
        elif stripped.startswith("/32 host LOCAL") and last and last not in found:
            found.append(last)
    return [a for a in found if not a.startswith("127.")]


def _owner_of(address: str, routes: list[tuple[str, str, str, int]]) -> str | None:
    # The interface whose connected (gateway-less) route covers the address.
    addr = struct.unpack("!I", inet_aton(address))[0]
    best: tuple[int, str] | None = None
    for iface, dest, gateway, plen in routes:
        if gateway != "0.0.0.0" or plen == 0:
            continue
        mask = (0xFFFFFFFF << (32 - plen)) & 0xFFFFFFFF
        if addr & mask == struct.unpack("!I", inet_aton(dest))[0] & mask:
            if best is None or plen > best[0]:
                best = (plen, iface)
    return best[1] if best else None


def _ipv6_off(sysfs: Sysfs) -> bool:
    """IPv6 disabled at boot: then the kernel has no if_inet6 or ipv6_route at all."""
    return "ipv6.disable=1" in (sysfs.read("proc/cmdline") or "").split()


_IPV6_FIX = " (a host without IPv6 says so with ipv6.disable=1 on the kernel command line)"


def _ipv6(
    sysfs: Sysfs, name: str, rel: str, pattern: re.Pattern[str], missing: MissingEvidence | None
) -> list[list[str]]:
    """The fields of each line of an IPv6 procfs table, each line checked against ``pattern``."""
    text = sysfs.read(rel)
    if text is None:
        if not (_ipv6_off(sysfs) and not sysfs.exists(rel)):
            note(missing, sysfs, name, rel, fix=how_to_read(sysfs.live) + _IPV6_FIX, rule=NETWORK)
        return []
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        if not pattern.match(line.strip()):
            note(missing, sysfs, name, rel, garbled(i, line, "an entry"), rule=NETWORK)
            continue
        rows.append(line.split())
    return rows


def _net_interfaces(sysfs: Sysfs, missing: MissingEvidence | None) -> dict[str, NetInterface]:
    nets: dict[str, NetInterface] = {}
    names = sysfs.try_listdir("sys/class/net")
    if names is None:
        note(missing, sysfs, "network interfaces", "sys/class/net", rule=NETWORK)
    for name in names or []:
        real = _device_path(sysfs, f"sys/class/net/{name}")
        if real is None:
            note(
                missing,
                sysfs,
                f"network interface {name}",
                f"sys/class/net/{name}",
                "its link is broken or loops",
                rule=NETWORK,
            )
        nets[name] = NetInterface(name=name, pci_device=pci_device_of(real or ""))

    def listed(iface: str, table: str) -> bool:
        # A route or address on an interface /sys/class/net does not list: whose it is is unknown.
        if iface in nets or iface in ("*", "lo") or names is None:
            return iface in nets
        note(
            missing,
            sysfs,
            f"network interface {iface}",
            f"sys/class/net/{iface}",
            f"/{table} names it, but /sys/class/net does not list it",
            rule=NETWORK,
        )
        return False

    routes = _ipv4_routes(sysfs, missing)
    for iface, dest, gateway, plen in routes:
        if listed(iface, "proc/net/route"):
            text = f"default via {gateway}" if plen == 0 else f"{dest}/{plen}"
            nets[iface].routes.append(text)
    for address in _local_ipv4(sysfs, missing):
        owner = _owner_of(address, routes)
        if owner in nets:
            nets[owner].addresses.append(address)
        else:
            note(
                missing,
                sysfs,
                f"the interface of {address}",
                "proc/net/route",
                f"no connected route there covers the host's address {address}",
                rule=NETWORK,
            )

    for f in _ipv6(sysfs, "IPv6 addresses", "proc/net/if_inet6", _INET6_LINE, missing):
        # addr ifindex prefixlen scope flags name; scope 0x20 is link-local, 0x10 host
        if listed(f[5], "proc/net/if_inet6") and int(f[3], 16) not in (0x10, 0x20):
            addr = ":".join(f[0][i : i + 4] for i in range(0, 32, 4))
            nets[f[5]].addresses.append(f"{addr}/{int(f[2], 16)}")
    for f in _ipv6(sysfs, "IPv6 routes", "proc/net/ipv6_route", _IPV6_ROUTE_LINE, missing):
        if not listed(f[9], "proc/net/ipv6_route") or f[9] == "lo":
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


def _drm_cards(sysfs: Sysfs) -> tuple[dict[str, str], list[str]]:
    """DRM card/render node -> its PCI device, and the nodes on no PCI device (simpledrm...)."""
    cards: dict[str, str] = {}
    other: list[str] = []
    for name in sysfs.listdir("sys/class/drm"):
        if not name.startswith(("card", "renderD")) or "-" in name:
            continue  # card0-HDMI-A-1 connectors belong to their card
        real = _device_path(sysfs, f"sys/class/drm/{name}/device")
        addr = pci_device_of(real or "")
        if addr:
            cards[name] = addr
        elif real is not None:
            other.append(name)
    return cards, other


def _console_devices(sysfs: Sysfs, missing: MissingEvidence | None) -> list[str]:
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
        rel = f"sys/class/graphics/{name}/device"
        if sysfs.readlink(rel) is None:
            if sysfs.exists(f"sys/class/graphics/{name}") and _device_path(sysfs, f"sys/class/graphics/{name}") is None:
                note(
                    missing,
                    sysfs,
                    f"framebuffer {name}",
                    f"sys/class/graphics/{name}",
                    "its link is broken or loops",
                    rule=DISPLAY,
                )
            continue  # no such framebuffer, or one on no device (a virtual one)
        real = _device_path(sysfs, rel)
        if real is None:
            note(missing, sysfs, f"the device of framebuffer {name}", rel, "its link is broken or loops", rule=DISPLAY)
            continue
        addr = pci_device_of(real)
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


def _vfio_cdevs(sysfs: Sysfs) -> dict[str, str]:
    """iommufd's per-device VFIO nodes (/dev/vfio/devices/vfioN) -> PCI address."""
    cdevs: dict[str, str] = {}
    for name in sysfs.listdir("sys/class/vfio-dev"):
        addr = pci_device_of(_device_path(sysfs, f"sys/class/vfio-dev/{name}/device") or "")
        if addr:
            cdevs[name] = addr
    return cdevs


def open_device_files(sysfs: Sysfs, missing: MissingEvidence | None = None) -> tuple[list[OpenDeviceFile], bool]:
    """Processes holding GPU, DRM or VFIO device files open.

    Reads ``proc/<pid>/fd`` links; as a normal user other users' are not
    readable, so the scan says whether it is complete (and ``missing`` says why not).
    """
    found: list[OpenDeviceFile] = []
    complete = True
    pids = sysfs.try_listdir("proc")
    own = sysfs.link_name("proc/self")
    if pids is None:
        note(missing, sysfs, "open device files", "proc", rule=IN_USE)
        complete = False
    for pid in pids or []:
        if not pid.isdigit():
            continue
        fds = sysfs.try_listdir(f"proc/{pid}/fd")
        if fds is None:
            # Gone meanwhile, or not ours to read: only the latter leaves the scan partial.
            # A capture keeps the capturing process (proc/self, for proc/mounts) but not its fds.
            if sysfs.exists(f"proc/{pid}") and pid != own:
                complete = False
                note(
                    missing,
                    sysfs,
                    "open device files",
                    f"proc/{pid}/fd",
                    fix=how_to_read(sysfs.live) + " (other users' open files are visible to root only)",
                    rule=IN_USE,
                )
            continue
        command = guest = None
        for fd in fds:
            target = sysfs.readlink(f"proc/{pid}/fd/{fd}")
            if target and target.startswith(_DEV_FILES):
                if command is None:
                    command = sysfs.read(f"proc/{pid}/comm")
                    guest = guest_of_cmdline(sysfs.read_bytes(f"proc/{pid}/cmdline"))
                found.append(OpenDeviceFile(path=target, pid=int(pid), command=command, guest=guest))
    if any(f.guest is None for f in found):
        pids = _libvirt_pids(sysfs)
        for f in found:
            if f.guest is None:
                f.guest = pids.get(f.pid)
    return found, complete


def read_usage(sysfs: Sysfs, missing: MissingEvidence | None = None) -> HostUsage:
    """What the host uses; evidence that cannot be read goes into ``missing``."""
    block, disk_of = _block_devices(sysfs, missing)
    _mark_block_usage(sysfs, block, disk_of, missing)
    open_files, complete = open_device_files(sysfs, missing)
    drm_cards, other_drm = _drm_cards(sysfs)
    usage = HostUsage(
        block=block,
        net=_net_interfaces(sysfs, missing),
        drm_cards=drm_cards,
        console_devices=_console_devices(sysfs, missing),
        open_files=open_files,
        open_files_complete=complete,
        nvidia_minors=_nvidia_minors(sysfs),
        non_pci_drm=other_drm,
    )
    if any(f.path.startswith("/dev/vfio/devices/") for f in open_files):
        usage.vfio_cdevs = _vfio_cdevs(sysfs)
    return usage


def open_file_targets(
    f: OpenDeviceFile, usage: HostUsage, groups: dict[str, list[str]], nvidia_bound: list[str]
) -> list[str] | None:
    """The PCI devices an open device file holds; None when which they are cannot be told."""
    name = f.path.rsplit("/", 1)[-1]
    if f.path.startswith("/dev/vfio/devices/"):
        return [usage.vfio_cdevs[name]] if name in usage.vfio_cdevs else None
    if f.path.startswith("/dev/vfio/"):
        if not name.isdigit():
            return []  # /dev/vfio/vfio, the container: holds no device by itself
        return groups.get(name)
    if f.path.startswith("/dev/dri/"):
        if name in usage.non_pci_drm:
            return []
        return [usage.drm_cards[name]] if name in usage.drm_cards else None
    if f.path.startswith("/dev/nvidia"):
        minor = name[6:]
        if not minor.isdigit():
            # nvidiactl, nvidia-uvm: the driver is in use, every GPU it drives with it.
            return nvidia_bound
        return [usage.nvidia_minors[int(minor)]] if int(minor) in usage.nvidia_minors else None
    return []


def referenced_devices(usage: HostUsage) -> set[str]:
    """PCI addresses the host's disks, NICs, displays and open files hang off."""
    found = {b.pci_device for b in usage.block.values()} | {n.pci_device for n in usage.net.values()}
    found |= set(usage.drm_cards.values()) | set(usage.console_devices)
    found |= set(usage.nvidia_minors.values()) | set(usage.vfio_cdevs.values())
    return {a for a in found if a}


def note_unmapped_open_files(
    sysfs: Sysfs, usage: HostUsage, group_numbers: set[str], missing: MissingEvidence | None
) -> None:
    """An open device file whose device cannot be told could be holding any device."""
    groups = {n: [] for n in group_numbers}
    for f in usage.open_files:
        if open_file_targets(f, usage, groups, []) is not None:
            continue
        name = f.path.rsplit("/", 1)[-1]
        where = {
            "/dev/vfio/devices/": f"sys/class/vfio-dev/{name}",
            "/dev/vfio/": f"sys/kernel/iommu_groups/{name}",
            "/dev/dri/": f"sys/class/drm/{name}",
        }
        rel = next((r for prefix, r in where.items() if f.path.startswith(prefix)), "proc/driver/nvidia/gpus")
        note(
            missing,
            sysfs,
            f"the device behind {f.path}",
            rel,
            f"{f.command or '?'} (pid {f.pid}) has {f.path} open, and which device that is cannot be read",
            rule=IN_USE,
        )


def holders_of_devices(
    usage: HostUsage, groups: dict[str, list[str]], nvidia_bound: list[str]
) -> dict[str, list[OpenDeviceFile]]:
    """PCI address -> the open device files that hold it."""
    held: dict[str, list[OpenDeviceFile]] = {}
    for f in usage.open_files:
        for addr in open_file_targets(f, usage, groups, nvidia_bound) or []:
            if PCI_ADDRESS_RE.match(addr):
                held.setdefault(addr, []).append(f)
    return held


def devices_with_open_files(
    usage: HostUsage, groups: dict[str, list[str]], nvidia_bound: list[str]
) -> dict[str, list[str]]:
    """PCI address -> "comm (pid N) has /dev/..." for each device held open."""
    return {
        addr: [f"{f.describe()} has {f.path} open" for f in files]
        for addr, files in holders_of_devices(usage, groups, nvidia_bound).items()
    }
