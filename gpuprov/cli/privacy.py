"""What ``gpuprov capture`` keeps of each file it copies: what inspect and verify
read, and nothing that identifies the machine or its users
(docs/concepts/capture-privacy.md says what and why).

Each rewrite keeps the facts the readers in :mod:`gpuprov.facts` take from the
file, so ``gpuprov inspect`` gives the same verdicts on the capture as on the
machine; only names and numbers that identify it change. Standard library only.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator

from ..facts.gpus import SMI_GPU_FIELDS, SMI_LOG_FIELDS
from ..facts.iommu import IOMMU_ARGS

Member = tuple[str, "bytes | str | None"]  # (kind, payload): ("file", data), ("link", target), ("dir", None)

# Files never copied, whatever reads them: serial numbers, hardware and boot ids, MACs.
# (Under /proc/<pid> only comm and the device fds are: gpuprov/capture.py _PID_FILES.)
PRIVATE_NAMES = frozenset(
    {
        "serial_number",
        "serial",
        "vpd",
        "wwid",
        "wwn",
        "eui",
        "nguid",
        "uuid",
        "address",
        "perm_addr",
        "phys_port_id",
        "phys_switch_id",
        "vpd_pg80",
        "vpd_pg83",
        "product_serial",
        "product_uuid",
        "board_serial",
        "chassis_serial",
        "board_asset_tag",
        "chassis_asset_tag",
        "machine-id",
        "boot_id",
        "hostname",
    }
)

# Ids that command outputs and /proc/driver files print: zeroed, their shape kept.
_ID_PATTERNS = (
    (re.compile(r"(Device Serial Number) [0-9a-fA-F-]+"), r"\1 00-00-00-00-00-00-00-00"),
    (re.compile(r"<serial>[^<]*</serial>"), "<serial>0000000000000</serial>"),
    (re.compile(r"GPU-[0-9a-fA-F-]{36}"), "GPU-00000000-0000-0000-0000-000000000000"),
    (re.compile(r"MIG-[0-9a-fA-F-]{36}"), "MIG-00000000-0000-0000-0000-000000000000"),
)


def zero_ids(text: str) -> str:
    """Device serial numbers and GPU/MIG UUIDs zeroed."""
    for pattern, repl in _ID_PATTERNS:
        text = pattern.sub(repl, text)
    return text


def zero_dsn(config: bytes) -> bytes:
    """Zero the Device Serial Number extended capability (id 0x0003) in PCI config space."""
    data = bytearray(config)
    pos, hops = 0x100, 0
    while 0x100 <= pos <= len(data) - 12 and hops < 64:
        header = int.from_bytes(data[pos : pos + 4], "little")
        if header in (0, 0xFFFFFFFF):
            break
        if header & 0xFFFF == 0x0003:
            data[pos + 4 : pos + 12] = bytes(8)
        pos, hops = (header >> 20) & 0xFFC, hops + 1
    return bytes(data)


# ---------------------------------------------------------------- small /proc and /etc files

# Kernel arguments kept with their values: the ones gpuprov reads (IOMMU_ARGS, fbcon for the
# console, root= below) and those that shape a GPU host. Every other argument is dropped,
# name and all (a bare word can be a secret; what follows `--` is init's, not the kernel's).
KEPT_ARGS = frozenset(
    {
        *IOMMU_ARGS,
        "fbcon",
        "console",
        "nomodeset",
        "pci",
        "pcie_aspm",
        "pcie_ports",
        "hugepages",
        "hugepagesz",
        "default_hugepagesz",
        "transparent_hugepage",
        "isolcpus",
        "nohz_full",
        "rcu_nocbs",
        "mitigations",
        "module_blacklist",
        "initcall_blacklist",
    }
)
KEPT_ARG_PREFIXES = ("vfio", "iommu", "intel_iommu", "amd_iommu", "kvm", "nvidia", "nouveau", "rd.driver.")
_DEV_NAME = re.compile(r"/dev/[A-Za-z0-9_.:+-]+")


def kernel_cmdline(text: str) -> str:
    """/proc/cmdline with only the kept arguments; ``root=`` only as a /dev/<kernel name>
    (what the block reader resolves /dev/root with: a UUID or LVM path resolves nothing)."""
    kept = []
    for token in text.split():
        if token == "--":
            break
        key, _sep, value = token.partition("=")
        if key == "root":
            if _DEV_NAME.fullmatch(value):
                kept.append(token)
        elif key in KEPT_ARGS or key.startswith(KEPT_ARG_PREFIXES):
            kept.append(token)
    return " ".join(kept) + "\n"


_BUILD = re.compile(r"^.*\s(#\d+\s.*)$")


def kernel_version(text: str) -> str:
    """/proc/version: the release and build line, without the builder's user@host."""
    first = text.splitlines()[0] if text else ""
    words = first.split()
    if len(words) < 3 or words[:2] != ["Linux", "version"]:
        return ""
    build = _BUILD.match(first)
    return f"Linux version {words[2]}{' ' + build.group(1) if build else ''}\n"


_CPU_KEYS = frozenset(
    {
        "processor",
        "vendor_id",
        "cpu family",
        "model",
        "model name",
        "stepping",
        "flags",
        "CPU implementer",
        "CPU architecture",
        "CPU variant",
        "CPU part",
        "CPU revision",
        "Features",
    }
)


def cpuinfo(text: str) -> str:
    """/proc/cpuinfo: the vendor, model and flags lines (an ARM board's Serial is dropped)."""
    lines = [ln for ln in text.splitlines() if not ln.strip() or ln.partition(":")[0].strip() in _CPU_KEYS]
    return "\n".join(lines) + "\n"


_OS_RELEASE_KEYS = ("PRETTY_NAME=", "NAME=", "ID=", "ID_LIKE=", "VERSION_ID=", "VERSION_CODENAME=")


def os_release(text: str) -> str:
    return "".join(f"{ln}\n" for ln in text.splitlines() if ln.startswith(_OS_RELEASE_KEYS))


# What an offline directory for this host needs to know (scripts/offline-debs.sh --capture): which
# packages are installed, their versions and what they provide. Descriptions, maintainers and the
# hashes of configuration files are left out.
_DPKG_FIELDS = (
    "Package",
    "Status",
    "Architecture",
    "Multi-Arch",
    "Essential",
    "Version",
    "Provides",
    "Depends",
    "Pre-Depends",
    "Breaks",
    "Conflicts",
    "Replaces",
)


def dpkg_status(text: str) -> str:
    out, keep = [], False
    for line in text.splitlines():
        if not line.strip():
            out.append("")
            keep = False
        elif line[0] in " \t":
            if keep:
                out.append(line)
        else:
            keep = line.split(":", 1)[0] in _DPKG_FIELDS
            if keep:
                out.append(line)
    return "\n".join(out).strip("\n") + "\n"


REMOVED_SOURCE = "/dev/gpuprov-removed"


def _mount_source(source: str, fstype: str, dm_names: dict[str, str], block_names: set[str]) -> str:
    """The source as the block reader can still resolve it, or a placeholder it resolves to nothing.

    /dev/<kernel name>, /dev/root and /dev/disk|block/.../<kernel name> are kept;
    /dev/mapper/<name> takes the device-mapper name's placeholder; anything else
    (UUIDs, labels, serials in by-id names, LVM paths holding the host name) cannot
    name a block device and is replaced; a source outside /dev (a server, a share)
    becomes its filesystem type.
    """
    if not source.startswith("/dev/"):
        return fstype
    rest = source[5:]
    if rest.startswith("mapper/"):
        new = dm_names.get(rest[7:])
        return f"/dev/mapper/{new}" if new else REMOVED_SOURCE
    if rest.startswith(("disk/", "block/")):
        return source if rest.rsplit("/", 1)[-1] in block_names else REMOVED_SOURCE
    return source if rest == "root" or rest in block_names else REMOVED_SOURCE


def mounts(text: str, dm_names: dict[str, str], block_names: set[str]) -> str:
    """/proc/mounts: every mount point and type; sources as :func:`_mount_source`, options rw/ro."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 3:
            continue
        mode = "ro" if len(f) > 3 and f[3].split(",")[0] == "ro" else "rw"
        out.append(f"{_mount_source(f[0], f[2], dm_names, block_names)} {f[1]} {f[2]} {mode} 0 0\n")
    return "".join(out)


def swaps(text: str, dm_names: dict[str, str], block_names: set[str]) -> str:
    """/proc/swaps: devices as :func:`_mount_source`; a swap file's path dropped."""
    lines = text.splitlines()
    out = lines[:1]
    for line in lines[1:]:
        f = line.split()
        if f:
            source = _mount_source(f[0], "file", dm_names, block_names)
            out.append("\t".join([source, *f[1:]]))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- command outputs


def lspci_verbose(text: str) -> str:
    """``lspci -vvv`` without Vital Product Data (board serial, part numbers), ids zeroed."""
    out: list[str] = []
    vpd_indent: int | None = None
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        if vpd_indent is not None:
            if line.strip() and indent > vpd_indent:
                continue
            vpd_indent = None
        if "Vital Product Data" in line:
            vpd_indent = indent
            out.append(line[:indent] + line.strip().split("]", 1)[0] + "] Vital Product Data (left out)")
            continue
        if re.search(r"\[(SN|PN|EC|MN|V[0-9A-Z]|Y[0-9A-Z]|RV|RW)\]", line):
            continue
        out.append(line)
    return zero_ids("\n".join(out) + "\n")


def smi_xml(text: str) -> str | None:
    """``nvidia-smi -q -x`` with only the elements :func:`gpuprov.facts.gpus.parse_smi_xml`
    reads (VM names, vGPU instance UUIDs, serials and part numbers are left out);
    ``None`` when it is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return None
    if root.tag != "nvidia_smi_log":
        return None
    kept = ET.Element("nvidia_smi_log")
    _copy_paths(root, kept, SMI_LOG_FIELDS)
    for gpu in root.findall("gpu"):
        new = ET.SubElement(kept, "gpu")
        if gpu.get("id") is not None:
            new.set("id", gpu.get("id") or "")
        _copy_paths(gpu, new, SMI_GPU_FIELDS)
    ET.indent(kept, space="\t")
    return zero_ids('<?xml version="1.0" ?>\n' + ET.tostring(kept, encoding="unicode") + "\n")


def _copy_paths(src: ET.Element, dst: ET.Element, paths: Iterable[str]) -> None:
    """Copy each ``a/b/c`` path's elements (text only, no attributes or other children)."""
    for path in paths:
        parts = path.split("/")
        for node in _walk(src, parts):
            here = dst
            for depth, name in enumerate(parts):
                found = here.find(name) if depth < len(parts) - 1 else None
                here = found if found is not None else ET.SubElement(here, name)
            here.text = node.text if len(node) == 0 else None


def _walk(node: ET.Element, parts: list[str]) -> Iterator[ET.Element]:
    if not parts:
        yield node
        return
    for child in node.findall(parts[0]):
        yield from _walk(child, parts[1:])


# ---------------------------------------------------------------- addresses


def _slots(pool: list[tuple[int, int]], top: int, width: int, kept: Callable[[int], bool]) -> Iterator[int]:
    """Distinct values for a ``top``-bit leading field: the placeholder blocks first, then any
    whose block holds no ``kept`` address (never loopback or 0.0.0.0: the readers treat those apart)."""
    seen: set[int] = set()
    for net, plen in pool:
        if plen <= top:
            count = 1 << (top - plen)
            first = 1 if count > 2 else 0  # not the block's network address
            for k in range(first, count):
                seen.add((net >> (width - top)) + k)
                yield (net >> (width - top)) + k
    yield from (v for v in range(1, 1 << top) if v not in seen and not kept(v << (width - top)))


class Renumber:
    """Placeholders for addresses that keep which ones share a prefix.

    For every prefix length in ``levels`` (the routes' and the addresses'), two
    placeholders share that prefix exactly when the addresses did: a route still
    covers the same addresses, with the same longest match, and each address keeps
    its interface and prefix length. The leading field comes from the
    documentation blocks in ``pool``; each following field is renumbered 1, 2, ...
    among its siblings (0 stays 0, so a network address stays one).
    """

    def __init__(
        self,
        values: Iterable[int],
        levels: Iterable[int],
        width: int,
        pool: list[tuple[int, int]],
        kept: Callable[[int], bool],
    ) -> None:
        self.width = width
        self.levels = sorted({n for n in levels if 0 < n < width} | {width})
        values = sorted(set(values))
        top = self.levels[0]
        tops = sorted({v >> (width - top) for v in values})
        slots = _slots(pool, top, width, kept)
        # A leading field of 4 bits or fewer (a route like 0.0.0.0/1) names nothing: kept.
        self.top = {t: t if top <= 4 else next(slots) for t in tops}
        self.fields: dict[tuple[int, int, int], int] = {}
        counters: dict[tuple[int, int], int] = {}
        for v in values:
            for i in range(1, len(self.levels)):
                key = self._key(v, i)
                if key not in self.fields:
                    if key[2] == 0:
                        self.fields[key] = 0
                    else:
                        counters[key[:2]] = counters.get(key[:2], 0) + 1
                        self.fields[key] = counters[key[:2]]

    def _key(self, v: int, i: int) -> tuple[int, int, int]:
        lo, hi = self.levels[i - 1], self.levels[i]
        return i, v >> (self.width - lo), (v >> (self.width - hi)) & ((1 << (hi - lo)) - 1)

    def __call__(self, v: int) -> int:
        new = self.top[v >> (self.width - self.levels[0])]
        for i in range(1, len(self.levels)):
            new = (new << (self.levels[i] - self.levels[i - 1])) | self.fields[self._key(v, i)]
        return new


_V4_POOL = [(0xC0000200, 24), (0xC6336400, 24), (0xCB007100, 24), (0xC6120000, 15), (0xF0000000, 4)]
_V6_POOL = [(0x20010DB8 << 96, 32), (0x3FFF << 112, 20)]


def _v4_kept(v: int) -> bool:
    """0.0.0.0, loopback, multicast and broadcast: they name no machine."""
    return v == 0 or v >> 24 == 127 or v >> 28 >= 0xE


def _v6_class(v: int) -> str:
    if v in (0, 1):
        return "kept"
    if v >> 118 == 0x3FA:  # fe80::/10
        return "link"
    if v >> 120 == 0xFF:
        return "multicast"
    return "global"


def _hex4(text: str) -> int:
    """/proc/net/route's hex field (the network-order u32 in host byte order) as an int."""
    return struct.unpack("!I", struct.pack("=I", int(text, 16)))[0]


def _to_hex4(v: int) -> str:
    return f"{struct.unpack('=I', struct.pack('!I', v))[0]:08X}"


def _plen4(mask: int) -> int:
    return bin(mask).count("1")


class NetRewrite:
    """One set of placeholders for a capture's /proc/net files, so routes still
    match addresses (docs/concepts/capture-privacy.md)."""

    def __init__(self, files: dict[str, str]) -> None:
        v4: set[int] = set()
        v4_levels: set[int] = set()
        v6: set[int] = set()
        v6_levels: set[int] = set()
        for name, text in files.items():
            if name == "route":
                for f in _rows(text, "route"):
                    dest, gw, plen = _hex4(f[1]), _hex4(f[2]), _plen4(_hex4(f[7]))
                    v4.update(v for v in (dest, gw) if not _v4_kept(v))
                    if gw == 0 and not _v4_kept(dest):  # the connected routes decide who owns an address
                        v4_levels.add(plen)
            elif name == "fib_trie":
                v4.update(v for v in _local_ipv4(text) if not _v4_kept(v))
            elif name == "if_inet6":
                for f in _rows(text, "if_inet6"):
                    addr = int(f[0], 16)
                    if _v6_class(addr) == "global":
                        v6.add(addr)
                        v6_levels.add(int(f[2], 16))
            elif name == "ipv6_route":
                for f in _rows(text, "ipv6_route"):
                    for value, plen in ((f[0], f[1]), (f[2], f[3]), (f[4], "80")):
                        addr = int(value, 16)
                        if _v6_class(addr) == "global":
                            v6.add(addr)
                            v6_levels.add(int(plen, 16))
        self.v4 = Renumber(v4, v4_levels, 32, _V4_POOL, _v4_kept)
        self.v6 = Renumber(v6, v6_levels, 128, _V6_POOL, lambda v: _v6_class(v) != "global")
        self.v6_low: dict[tuple[str, int], int] = {}  # link-local and multicast low bits

    def ipv4(self, v: int) -> int:
        return v if _v4_kept(v) else self.v4(v)

    def ipv6(self, v: int) -> int:
        kind = _v6_class(v)
        if kind == "kept":
            return v
        if kind == "global":
            return self.v6(v)
        keep = 64 if kind == "link" else 16  # fe80::/64, ffXY::
        low = v & ((1 << (128 - keep)) - 1)
        if low:
            low = self.v6_low.setdefault((kind, low), len(self.v6_low) + 1)
        return (v >> (128 - keep) << (128 - keep)) | low

    def route(self, text: str, rename: Callable[[str], str]) -> str:
        out = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
        for f in _rows(text, "route"):
            dest, gw, mask = _hex4(f[1]), _hex4(f[2]), _hex4(f[7])
            f[0], f[1], f[2] = rename(f[0]), _to_hex4(self.ipv4(dest) & mask), _to_hex4(self.ipv4(gw))
            out.append("\t".join(f))
        return "\n".join(out) + "\n"

    def fib_trie(self, text: str) -> str:
        """Only the host's own addresses, the leaves the reader takes ('/32 host LOCAL')."""
        leaves = "".join(
            f"     |-- {socket.inet_ntoa(struct.pack('!I', self.ipv4(v)))}\n        /32 host LOCAL\n"
            for v in _local_ipv4(text)
        )
        return "Local:\n  +-- 0.0.0.0/0 3 0 5\n" + leaves

    def if_inet6(self, text: str, rename: Callable[[str], str]) -> str:
        rows = [[f"{self.ipv6(int(f[0], 16)):032x}", *f[1:5], rename(f[5])] for f in _rows(text, "if_inet6")]
        return "".join(" ".join(f) + "\n" for f in rows)

    def ipv6_route(self, text: str, rename: Callable[[str], str]) -> str:
        out = []
        for f in _rows(text, "ipv6_route"):
            for i in (0, 2, 4):
                f[i] = f"{self.ipv6(int(f[i], 16)):032x}"
            f[9] = rename(f[9])
            out.append(" ".join(f) + "\n")
        return "".join(out)


# Per /proc/net file: fields a row needs, its hex fields and their digits (route has a header).
_LAYOUT = {
    "route": (8, {1: 8, 2: 8, 7: 8}),
    "if_inet6": (6, {0: 32, 2: 2}),
    "ipv6_route": (10, {0: 32, 1: 2, 2: 32, 3: 2, 4: 32}),
}
_HEX = re.compile(r"[0-9A-Fa-f]+")


def _rows(text: str, which: str) -> Iterator[list[str]]:
    """The rows of a /proc/net file whose fields parse as the reader parses them; others are dropped."""
    count, hex_fields = _LAYOUT[which]
    for line in text.splitlines()[1 if which == "route" else 0 :]:
        f = line.split()
        size_ok = len(f) >= count if which == "route" else len(f) == count  # as the readers check
        if size_ok and all(_HEX.fullmatch(f[i]) and len(f[i]) <= n for i, n in hex_fields.items()):
            yield f


def _local_ipv4(text: str) -> list[int]:
    """The '/32 host LOCAL' leaves of fib_trie, in order, as the usage reader takes them."""
    found: list[int] = []
    last = None
    for line in text.splitlines():
        item = line.strip()
        if item.startswith("|--"):
            last = item[3:].strip()
        elif "/32 host LOCAL" in item and last:
            try:
                value = int(ipaddress.IPv4Address(last))
            except ValueError:
                continue
            if value not in found:
                found.append(value)
    return found


# ---------------------------------------------------------------- the whole capture

# Interface names made from a MAC (systemd's enx<MAC> for USB NICs, wlx<MAC>).
_MAC_NAME = re.compile(r"^(en|wl|ww|sl|ib)x[0-9a-fA-F]{12}$")
_NET_FILE = re.compile(r"^proc/(?:\d+/)?net/(route|fib_trie|if_inet6|ipv6_route)$")
_MOUNTS = re.compile(r"^proc/(?:\d+/)?mounts$")
_DM_NAME = re.compile(r"^sys/.*/(dm-\d+)/dm/name$")
_GRUB_LINE = re.compile(r'^(GRUB_[A-Z0-9_]+)=(["\']?)(.*)\2\s*$')
_GRUB_DEFAULTS = re.compile(r"^etc/default/grub(\.d/[^/]+\.cfg)?$")


def grub_defaults(text: str) -> str:
    """/etc/default/grub (and its grub.d drop-ins) with only GRUB_ settings, comments left out, no
    setting named for a password, and each kernel command line scrubbed as /proc/cmdline is (its
    ``$GRUB_...`` references kept): what the kernel-argument planner and the drift check read."""
    out = []
    for line in text.splitlines():
        m = _GRUB_LINE.match(line.strip())
        if m is None or "PASSWORD" in m.group(1):
            continue
        key, quote, value = m.groups()
        if key.startswith("GRUB_CMDLINE_"):
            refs = [t for t in value.split() if t.startswith("$")]
            value = " ".join([*refs, *kernel_cmdline(value).split()])
        mark = quote or '"'
        out.append(f"{key}={mark}{value}{mark}")
    return "\n".join(out) + ("\n" if out else "")


_FILES: dict[str, Callable[[str], str]] = {
    "etc/kernel/cmdline": kernel_cmdline,
    "proc/cmdline": kernel_cmdline,
    "proc/version": kernel_version,
    "proc/cpuinfo": cpuinfo,
    "etc/os-release": os_release,
    "usr/lib/os-release": os_release,
    "var/lib/dpkg/status": dpkg_status,
}


def _text(payload: bytes | str | None) -> str:
    if isinstance(payload, bytes):
        return payload.decode("utf-8", "replace")
    return payload or ""


def scrub_members(members: dict[str, Member], block_names: set[str]) -> dict[str, Member]:
    """The capture's members with every rewrite of docs/concepts/capture-privacy.md applied."""
    dm_names = {
        _text(payload).strip(): m.group(1)
        for rel, (kind, payload) in members.items()
        if kind == "file" and (m := _DM_NAME.match(rel))
    }
    ifnames: dict[str, str] = {}
    for rel, (kind, payload) in members.items():
        for part in [*rel.split("/"), *(_text(payload).split("/") if kind == "link" else [])]:
            if _MAC_NAME.match(part) and part not in ifnames:
                ifnames[part] = f"{part[:3]}{len(ifnames) + 1:012x}"

    def rename(name: str) -> str:
        return ifnames.get(name, name)

    def rename_path(path: str) -> str:
        return "/".join(rename(p) for p in path.split("/")) if ifnames else path

    net_files = {m.group(1): _text(p) for rel, (k, p) in members.items() if k == "file" and (m := _NET_FILE.match(rel))}
    net = NetRewrite(net_files)
    out: dict[str, Member] = {}
    for rel, (kind, payload) in members.items():
        if kind == "file":
            payload = _rewrite_file(rel, payload, net, rename, dm_names, block_names)
        elif kind == "link":
            payload = rename_path(_text(payload))
        out[rename_path(rel)] = (kind, payload)
    return out


def _rewrite_file(
    rel: str,
    payload: bytes | str | None,
    net: NetRewrite,
    rename: Callable[[str], str],
    dm_names: dict[str, str],
    block_names: set[str],
) -> bytes | str | None:
    if rel in _FILES:
        return _FILES[rel](_text(payload)).encode()
    if _GRUB_DEFAULTS.match(rel):
        return grub_defaults(_text(payload)).encode()
    if m := _NET_FILE.match(rel):
        which, text = m.group(1), _text(payload)
        if which == "fib_trie":
            return net.fib_trie(text).encode()
        rewrite = {"route": net.route, "if_inet6": net.if_inet6, "ipv6_route": net.ipv6_route}[which]
        return rewrite(text, rename).encode()
    if _MOUNTS.match(rel):
        return mounts(_text(payload), dm_names, block_names).encode()
    if rel == "proc/swaps":
        return swaps(_text(payload), dm_names, block_names).encode()
    if m := _DM_NAME.match(rel):
        return f"{m.group(1)}\n".encode()
    return payload
