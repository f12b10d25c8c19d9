"""Generate a large synthetic host root (sysfs + procfs) for benchmarks.

The tree mirrors a real capture (``shared/fixtures/*.tar.gz``): ``sys/devices``
holds the PCI hierarchy, every other view (``sys/bus/pci/devices``,
``sys/class/*``, ``sys/kernel/iommu_groups``, driver directories) is a relative
symlink into it, and ``config`` is a binary config space that agrees with the
text attributes, so ``lspci -A linux-sysfs -O sysfs.path=ROOT/sys/bus/pci``
reads the same host that gpuprov does.

The default host is an 8-GPU HGX-style box: two sockets, one PCIe switch per
two GPUs, each switch also carrying NICs (dual-port, SR-IOV) and NVMe drives,
GPU PFs split into 32 vGPU VFs, plus the usual chipset devices, a BMC VGA
behind a PCIe-to-PCI bridge (the boot VGA) and an on-board NIC that carries the
default route. It has >= 2,000 PCI functions; ``--scale`` multiplies the
number of GPUs, NICs and NVMe drives to check that cost is linear.

Where the kernel and the brief could differ, the kernel wins: VFs read
``0xffff`` as vendor/device in ``config`` (the IDs come from the text
attributes), their link attributes read ``Unknown``/``0``, and ``boot_vga``
exists only on VGA-class functions.

    python dev/bench/synth_host.py /tmp/host --scale 0.5
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# PCIe port types in the PCIe capability flags (bits 7:4).
PT_EP, PT_RP, PT_USP, PT_DSP, PT_PCIE_PCI, PT_RCIEP = 0, 4, 5, 6, 7, 9

# Link speed code (PCIe capability encoding) -> sysfs text.
SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}

# Resource flags as the kernel prints them in ``resource``.
IORESOURCE_MEM = 0x200
IORESOURCE_PREFETCH = 0x2000
IORESOURCE_MEM_64 = 0x100000
IORESOURCE_SIZEALIGN = 0x40000

# H100 80GB vGPU types as the vGPU host driver lists them (ID, name).
VGPU_TYPES = [
    (557, "NVIDIA H100-1-10C"),
    (558, "NVIDIA H100-1-20C"),
    (559, "NVIDIA H100-2-20C"),
    (560, "NVIDIA H100-3-40C"),
    (561, "NVIDIA H100-4-40C"),
    (562, "NVIDIA H100-7-80C"),
    (563, "NVIDIA H100-4C"),
    (564, "NVIDIA H100-5C"),
    (565, "NVIDIA H100-8C"),
    (566, "NVIDIA H100-10C"),
    (567, "NVIDIA H100-16C"),
    (568, "NVIDIA H100-20C"),
    (569, "NVIDIA H100-40C"),
    (570, "NVIDIA H100-80C"),
]

KERNEL = "6.8.0-49-generic"
NVIDIA_VERSION = "550.127.06"


@dataclass
class Bar:
    index: int  # 0-5 BARs, 6 ROM, 7-12 SR-IOV VF BARs (the kernel's numbering)
    size: int
    is64: bool = True
    pref: bool = True
    base: int = 0


@dataclass
class VfSpec:
    total: int
    offset: int
    stride: int
    device: int
    driver: str | None
    bars: list[Bar]  # one VF's BARs (index 0-5)
    extra: str | None = None  # "vgpu" or "net"


@dataclass(eq=False)
class Fn:
    """One PCI function, before and after bus numbering."""

    vendor: int
    device: int
    cls: int
    slot: int
    func: int
    sub: tuple[int, int] = (0, 0)
    rev: int = 0
    ptype: int | None = PT_EP  # None: conventional PCI (no PCIe capability)
    link: tuple[int, int, int, int] | None = None  # cur gen, cur width, max gen, max width
    driver: str | None = None
    reset: str | None = None
    bars: list[Bar] = field(default_factory=list)
    children: list[Fn] = field(default_factory=list)  # functions on the secondary bus
    vf: VfSpec | None = None
    extra: str | None = None  # "nvme", "net", "vgpu" (set per function)
    multifunction: bool = False
    slot_no: int = 0
    # Filled in by numbering and layout.
    domain: int = 0
    bus: int = 0
    secondary: int = 0
    subordinate: int = 0
    numa: int = 0
    irq: int = 0
    group: int = 0
    dmar: int = 0
    sysdir: str = ""
    physfn: Fn | None = None
    vfs: list[Fn] = field(default_factory=list)
    port: int = 0  # NIC port number, for interface names

    @property
    def devfn(self) -> int:
        return (self.slot << 3) | self.func

    @property
    def addr(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.func}"

    @property
    def is_bridge(self) -> bool:
        return (self.cls >> 8) == 0x0604

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None


@dataclass
class HostSpec:
    gpus: int = 8
    vfs_per_gpu: int = 32
    gpus_per_switch: int = 2
    nvmes: int = 9  # nvme0 is the boot/swap drive on a chipset port; the rest sit on switches
    nics: int = 8  # dual-port ConnectX cards, two PFs each
    nic_ports: int = 2
    nic_vfs: int = 112  # per PF
    sockets: int = 2
    cores_per_socket: int = 56


def _gen(speed: int, width: int) -> tuple[int, int, int, int]:
    return (speed, width, speed, width)


# --------------------------------------------------------------------------- topology


def _vf_last_bus_offset(pf: Fn) -> int:
    """How many buses past the PF's own bus its VFs reach (routing ID arithmetic)."""
    if pf.vf is None or pf.vf.total == 0:
        return 0
    last = pf.devfn + pf.vf.offset + (pf.vf.total - 1) * pf.vf.stride
    return last >> 8


BOARD_SUB = (0x15D9, 0x1C48)  # a Supermicro board


def _chip(
    device: int,
    cls: int,
    slot: int,
    func: int,
    *,
    driver: str | None = None,
    bars: list[Bar] | None = None,
    reset: str | None = None,
    rev: int = 9,
    mf: bool = False,
    pcie: bool = True,
) -> Fn:
    """A chipset function: an Intel root-complex integrated endpoint or a legacy PCI one."""
    return Fn(
        0x8086,
        device,
        cls,
        slot,
        func,
        sub=BOARD_SUB,
        rev=rev,
        ptype=PT_RCIEP if pcie else None,
        link=(0, 0, 0, 0) if pcie else None,
        driver=driver,
        reset=reset,
        bars=bars or [],
        multifunction=mf,
    )


def _platform(boot_nvme: bool) -> list[Fn]:
    """Chipset functions on bus 00, the boot VGA and the on-board NIC."""
    fns = [
        _chip(0x09A2, 0x088000, 0x00, 0, rev=4, mf=True),
        _chip(0x09A4, 0x088000, 0x00, 1, rev=4, mf=True),
        _chip(0x09A3, 0x088000, 0x00, 2, rev=4, mf=True),
        _chip(0x0998, 0x060000, 0x00, 4, rev=4, mf=True),
        _chip(0xA1AF, 0x0C0330, 0x14, 0, mf=True, driver="xhci_hcd", reset="pm", bars=[Bar(0, 0x10000, True, False)]),
        _chip(0xA1B1, 0x118000, 0x14, 2, mf=True, driver="intel_pch_thermal", bars=[Bar(0, 0x1000, True, False)]),
        _chip(0xA1BA, 0x078000, 0x16, 0, driver="mei_me", reset="pm", bars=[Bar(0, 0x1000, True, False)]),
        _chip(0xA182, 0x010601, 0x17, 0, driver="ahci", reset="pm", bars=[Bar(5, 0x800, False, False)]),
    ]
    # Root port 1c.0 -> Intel I210, the management NIC with the default route.
    i210 = Fn(
        0x8086,
        0x1533,
        0x020000,
        0,
        0,
        sub=BOARD_SUB,
        rev=3,
        link=_gen(1, 1),
        driver="igb",
        reset="flr bus",
        bars=[Bar(0, 0x100000, False, False), Bar(3, 0x4000, False, False)],
        extra="net",
    )
    fns.append(
        Fn(
            0x8086,
            0xA190,
            0x060400,
            0x1C,
            0,
            multifunction=True,
            rev=0xF9,
            ptype=PT_RP,
            link=_gen(1, 1),
            driver="pcieport",
            children=[i210],
            slot_no=1,
        )
    )
    # Root port 1c.4 -> AST1150 PCIe-to-PCI bridge -> AST2500 VGA (boot VGA, conventional PCI).
    vga = Fn(
        0x1A03,
        0x2000,
        0x030000,
        0,
        0,
        sub=BOARD_SUB,
        rev=0x41,
        ptype=None,
        driver="ast",
        reset="bus",
        bars=[Bar(0, 0x1000000, False, False), Bar(1, 0x40000, False, False)],
    )
    ast_br = Fn(0x1A03, 0x1150, 0x060400, 0, 0, rev=4, ptype=PT_PCIE_PCI, link=_gen(2, 1), children=[vga])
    fns.append(
        Fn(
            0x8086,
            0xA194,
            0x060400,
            0x1C,
            4,
            multifunction=True,
            rev=0xF9,
            ptype=PT_RP,
            link=_gen(2, 1),
            driver="pcieport",
            children=[ast_br],
            slot_no=5,
        )
    )
    if boot_nvme:
        fns.append(
            Fn(
                0x8086,
                0xA198,
                0x060400,
                0x1D,
                0,
                rev=0xF9,
                ptype=PT_RP,
                link=_gen(4, 4),
                driver="pcieport",
                children=[_nvme()],
                slot_no=9,
            )
        )
    fns += [
        _chip(0xA1C2, 0x060100, 0x1F, 0, mf=True, pcie=False),
        _chip(0xA1A3, 0x0C0500, 0x1F, 4, mf=True, pcie=False, driver="i801_smbus", bars=[Bar(0, 0x100, True, False)]),
        _chip(0xA1A4, 0x0C8000, 0x1F, 5, mf=True, pcie=False, driver="intel-spi", bars=[Bar(0, 0x1000, False, False)]),
    ]
    return fns


def _nvme() -> Fn:
    return Fn(
        0x144D,
        0xA824,
        0x010802,
        0,
        0,
        sub=(0x144D, 0xA801),
        rev=0,
        link=_gen(4, 4),
        driver="nvme",
        reset="flr bus",
        bars=[Bar(0, 0x8000, True, False)],
        extra="nvme",
    )


def _gpu() -> Fn:
    vfs = VfSpec(
        total=0,
        offset=4,
        stride=1,
        device=0x2330,
        driver="nvidia",
        extra="vgpu",
        bars=[Bar(0, 0x40000, False, False), Bar(1, 0x100000000), Bar(3, 0x2000000)],
    )
    return Fn(
        0x10DE,
        0x2330,
        0x030200,
        0,
        0,
        sub=(0x10DE, 0x16C1),
        rev=0xA1,
        link=_gen(5, 16),
        driver="nvidia",
        reset="flr bus",
        bars=[Bar(0, 0x1000000, False, False), Bar(1, 0x2000000000), Bar(3, 0x2000000)],
        vf=vfs,
    )


def _nic_card(ports: int, vfs: int) -> list[Fn]:
    """A ConnectX-6 Dx: ``ports`` PFs, each with ``vfs`` VFs placed after all PFs (ARI)."""
    pfs = []
    for p in range(ports):
        spec = VfSpec(
            total=vfs,
            offset=ports - p + p * vfs,
            stride=1,
            device=0x101E,
            driver="mlx5_core",
            extra="net",
            bars=[Bar(0, 0x100000)],
        )
        pfs.append(
            Fn(
                0x15B3,
                0x101D,
                0x020000,
                0,
                p,
                sub=(0x15B3, 0x0016),
                rev=0,
                link=_gen(4, 16),
                driver="mlx5_core",
                reset="flr bus",
                bars=[Bar(0, 0x2000000)],
                vf=spec,
                extra="net",
                multifunction=ports > 1,
                port=p,
            )
        )
    return pfs


def _stack(gpus: int, nics: int, nvmes: int, spec: HostSpec) -> list[Fn]:
    """One root complex stack: VT-d unit, root port, PCIe switch and what hangs off it."""
    intel, brcm = 0x8086, 0x1000
    endpoints: list[list[Fn]] = []
    for _ in range(gpus):
        gpu = _gpu()
        assert gpu.vf is not None
        gpu.vf.total = spec.vfs_per_gpu
        endpoints.append([gpu])
    endpoints += [_nic_card(spec.nic_ports, spec.nic_vfs) for _ in range(nics)]
    endpoints += [[_nvme()] for _ in range(nvmes)]
    dsps = []
    for i, eps in enumerate(endpoints):
        w = max(fn.link[3] for fn in eps if fn.link)
        dsps.append(
            Fn(
                brcm,
                0xC030,
                0x060400,
                i,
                0,
                sub=(brcm, 0xA064),
                rev=0xB0,
                ptype=PT_DSP,
                link=(5, w, 5, 16) if w == 16 else (4, w, 5, 16),
                driver="pcieport",
                children=eps,
                slot_no=i + 1,
            )
        )
    usp = Fn(
        brcm,
        0xC030,
        0x060400,
        0,
        0,
        sub=(brcm, 0xA064),
        rev=0xB0,
        ptype=PT_USP,
        link=_gen(5, 16),
        driver="pcieport",
        children=dsps,
        bars=[Bar(0, 0x40000, False, False)],
    )
    return [
        Fn(intel, 0x09A2, 0x088000, 0, 0, rev=4, ptype=PT_RCIEP, link=(0, 0, 0, 0)),
        Fn(
            intel,
            0x347A,
            0x060400,
            2,
            0,
            rev=4,
            ptype=PT_RP,
            link=_gen(5, 16),
            driver="pcieport",
            children=[usp],
            slot_no=0,
        ),
    ]


def _walk(fns: list[Fn]) -> Iterator[Fn]:
    """Depth-first, in the order the kernel enumerates (function, then its VFs, then below)."""
    for fn in sorted(fns, key=lambda f: f.devfn):
        yield fn
        yield from fn.vfs
        yield from _walk(fn.children)


def _buses_needed(fns: list[Fn]) -> int:
    need = 1 + max([_vf_last_bus_offset(f) for f in fns] + [0])
    return need + sum(_buses_needed(f.children) for f in fns if f.is_bridge)


class _Numberer:
    """Hands out bus numbers depth-first, like firmware; a new PCI domain when one fills."""

    def __init__(self) -> None:
        self.domain = 0
        self.next_bus = 0

    def root(self, fns: list[Fn]) -> int:
        if self.next_bus + _buses_needed(fns) > 256:
            self.domain += 1
            self.next_bus = 0
        bus = self._bus(fns)
        return bus

    def _bus(self, fns: list[Fn]) -> int:
        bus = self.next_bus
        for fn in fns:
            fn.domain, fn.bus = self.domain, bus
        self.next_bus = bus + 1 + max([_vf_last_bus_offset(f) for f in fns] + [0])
        for fn in sorted(fns, key=lambda f: f.devfn):
            self._make_vfs(fn)
            if fn.is_bridge:
                fn.secondary = self._bus(fn.children)
                fn.subordinate = self.next_bus - 1
        return bus

    def _make_vfs(self, pf: Fn) -> None:
        if pf.vf is None:
            return
        spec = pf.vf
        for i in range(spec.total):
            rid = (pf.bus << 8) + pf.devfn + spec.offset + i * spec.stride
            devfn = rid & 0xFF
            vf = Fn(
                pf.vendor,
                spec.device,
                pf.cls,
                devfn >> 3,
                devfn & 7,
                sub=pf.sub,
                rev=pf.rev,
                link=(0, 0, 0, 0),
                driver=spec.driver,
                reset="flr",
                bars=[Bar(b.index, b.size, b.is64, b.pref) for b in spec.bars],
                extra=spec.extra,
                physfn=pf,
                port=pf.port,
            )
            vf.domain, vf.bus = pf.domain, rid >> 8
            pf.vfs.append(vf)
        # The PF's SR-IOV BARs (7-12) span all of its VFs' BARs.
        pf.bars += [Bar(7 + b.index, b.size * spec.total, b.is64, b.pref) for b in spec.bars]


class _Mmio:
    """Bump allocator with natural alignment; 32-bit non-prefetchable and 64-bit windows."""

    def __init__(self) -> None:
        self.low = 0x9000_0000
        self.high = 0x2000_0000_0000

    def take(self, bar: Bar) -> int:
        low = not bar.pref and self.low + bar.size <= 0xFB00_0000
        cur = self.low if low else self.high
        base = (cur + bar.size - 1) // bar.size * bar.size
        if low:
            self.low = base + bar.size
        else:
            self.high = base + bar.size
        return base


def _place(fns: list[Fn], mmio: _Mmio) -> None:
    """Give every BAR an address; VF BARs are slices of their PF's SR-IOV BARs."""
    for fn in sorted(fns, key=lambda f: f.devfn):
        for bar in fn.bars:
            bar.base = mmio.take(bar)
        for i, vf in enumerate(fn.vfs):
            for bar in vf.bars:
                iov = next(b for b in fn.bars if b.index == 7 + bar.index)
                bar.base = iov.base + i * bar.size
        _place(fn.children, mmio)


def _windows(fn: Fn) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(non-prefetchable, prefetchable) [start, end] a bridge must forward, 1 MiB granular."""
    lo: list[tuple[int, int]] = []
    hi: list[tuple[int, int]] = []
    for child in _walk(fn.children):
        for bar in child.bars:
            if bar.index == 6 or bar.base == 0:
                continue
            (hi if bar.pref else lo).append((bar.base, bar.base + bar.size - 1))

    def span(rs: list[tuple[int, int]]) -> tuple[int, int] | None:
        if not rs:
            return None
        return (min(r[0] for r in rs) & ~0xFFFFF, max(r[1] for r in rs) | 0xFFFFF)

    return span(lo), span(hi)


# --------------------------------------------------------------------------- config space


def _config(fn: Fn) -> bytes:
    """Config space as the kernel's ``config`` file returns it (4 KiB for PCIe)."""
    c = bytearray(4096 if fn.ptype is not None else 256)

    def w8(o: int, v: int) -> None:
        c[o] = v & 0xFF

    def w16(o: int, v: int) -> None:
        struct.pack_into("<H", c, o, v & 0xFFFF)

    def w32(o: int, v: int) -> None:
        struct.pack_into("<I", c, o, v & 0xFFFFFFFF)

    vf = fn.is_vf
    # VFs read all-ones IDs; the kernel's text attributes carry the real ones.
    w16(0x00, 0xFFFF if vf else fn.vendor)
    w16(0x02, 0xFFFF if vf else fn.device)
    w16(0x04, 0x0000 if vf else (0x0407 if fn.is_bridge else 0x0406))
    w16(0x06, 0x0010)  # capability list present
    w32(0x08, (fn.cls << 8) | fn.rev)
    w8(0x0C, 0x10)
    hdr = 0x01 if fn.is_bridge else 0x00
    w8(0x0E, hdr | (0x80 if fn.multifunction else 0))
    if not vf:
        for bar in fn.bars:
            if bar.index > 5 or (fn.is_bridge and bar.index > 1):
                continue
            lowbits = (0x4 if bar.is64 else 0) | (0x8 if bar.pref else 0)
            w32(0x10 + 4 * bar.index, (bar.base & 0xFFFFFFF0) | lowbits)
            if bar.is64:
                w32(0x14 + 4 * bar.index, bar.base >> 32)
    if fn.is_bridge:
        w8(0x18, fn.bus)
        w8(0x19, fn.secondary)
        w8(0x1A, fn.subordinate)
        w16(0x1C, 0x00F0)  # I/O window closed
        lo, hi = _windows(fn)
        if lo:
            w16(0x20, (lo[0] >> 16) & 0xFFF0)
            w16(0x22, (lo[1] >> 16) & 0xFFF0)
        else:
            w16(0x20, 0xFFF0)
        if hi:
            w16(0x24, ((hi[0] >> 16) & 0xFFF0) | 1)
            w16(0x26, ((hi[1] >> 16) & 0xFFF0) | 1)
            w32(0x28, hi[0] >> 32)
            w32(0x2C, hi[1] >> 32)
        else:
            w16(0x24, 0xFFF1)
            w16(0x26, 0x0001)
        w16(0x3E, 0x0012)  # SERR# enable, VGA enable off
    else:
        w16(0x2C, fn.sub[0])
        w16(0x2E, fn.sub[1])
    w8(0x3C, 0 if vf else fn.irq & 0xFF)
    w8(0x3D, 0 if vf else 1)

    # Capability chain: PM -> MSI-X (endpoints) / MSI (bridges) -> PCIe -> SSVID (bridges).
    caps: list[tuple[int, bytes]] = []
    if not vf:
        caps.append((0x40, struct.pack("<BBHH", 0x01, 0, 0x0003, 0x0008)))
    if fn.is_bridge:
        caps.append((0x48, struct.pack("<BBHIIH", 0x05, 0, 0x0080, 0, 0, 0)))
    else:
        caps.append((0x50, struct.pack("<BBHII", 0x11, 0, 0x8000 | 63, 0x0000_0000, 0x0000_8000)))
    if fn.ptype is not None:
        caps.append((0x60, _pcie_cap(fn)))
    if fn.is_bridge:
        caps.append((0xA0, struct.pack("<BBHHH", 0x0D, 0, 0, fn.sub[0], fn.sub[1])))
    w8(0x34, caps[0][0])
    for i, (off, body) in enumerate(caps):
        c[off : off + len(body)] = body
        w8(off + 1, caps[i + 1][0] if i + 1 < len(caps) else 0)

    if fn.ptype is not None:
        _ext_caps(fn, c)
    return bytes(c)


def _pcie_cap(fn: Fn) -> bytes:
    assert fn.ptype is not None
    cur_gen, cur_w, max_gen, max_w = fn.link or (0, 0, 0, 0)
    port = fn.ptype in (PT_RP, PT_DSP)
    flags = 0x0002 | (fn.ptype << 4) | (0x0100 if port else 0)
    devcap = 0x2 | (0x8000 if fn.is_bridge else 0) | (0x10000000 if "flr" in (fn.reset or "") else 0)
    devctl = 0x2930
    linkcap = max_gen | (max_w << 4) | (0x00100000 if port else 0) | ((fn.slot_no & 0xFF) << 24)
    linksta = cur_gen | (cur_w << 4) | (0x2000 if port and cur_w else 0)
    slotcap = (fn.slot_no << 19) if port else 0
    devcap2 = 0x1F | (0x20 if port else 0)
    devctl2 = 0x20 if port else 0
    linkcap2 = (((1 << max_gen) - 1) << 1) if max_gen else 0
    return struct.pack(
        "<BBHIHHIHHIHHHHIIHHIHH",
        0x10,
        0,
        flags,
        devcap,
        devctl,
        0,
        linkcap,
        0x0040 if max_gen else 0,
        linksta,
        slotcap,
        0,
        0,
        0,
        0,
        0,
        devcap2,
        devctl2,
        0,
        linkcap2,
        max_gen,
        0,
    )


def _ext_caps(fn: Fn, c: bytearray) -> None:
    """AER on every non-VF, ACS on downstream/root ports, ARI + SR-IOV on SR-IOV devices."""
    chain: list[tuple[int, bytes]] = []
    off = 0x100
    if not fn.is_vf and fn.ptype != PT_RCIEP:
        chain.append((0x0001, bytes(0x44)))  # AER: all counters clear
    if fn.ptype in (PT_RP, PT_DSP):
        chain.append((0x000D, struct.pack("<HH", 0x005F, 0x001D)))
    if fn.is_vf or fn.vf is not None:
        chain.append((0x000E, struct.pack("<HH", 0x0000, 0x0000)))
    if fn.vf is not None and fn.vf.total:
        spec = fn.vf
        vf_bars = [0] * 6
        for bar in fn.bars:
            if 7 <= bar.index <= 12:
                i = bar.index - 7
                vf_bars[i] = (bar.base & 0xFFFFFFF0) | (0x4 if bar.is64 else 0) | (0x8 if bar.pref else 0)
                if bar.is64 and i + 1 < 6:
                    vf_bars[i + 1] = bar.base >> 32
        chain.append(
            (
                0x0010,
                struct.pack(
                    "<IHHHHHBBHHHHII6II",
                    0,
                    0x0019,
                    0,
                    spec.total,
                    spec.total,
                    spec.total,
                    fn.func,
                    0,
                    spec.offset,
                    spec.stride,
                    0,
                    spec.device,
                    0x553,
                    0x1,
                    *vf_bars,
                    0,
                ),
            )
        )
    for i, (cap_id, body) in enumerate(chain):
        nxt = off + 4 + len(body)
        nxt = (nxt + 0xF) & ~0xF
        header = cap_id | (1 << 16) | ((nxt if i + 1 < len(chain) else 0) << 20)
        struct.pack_into("<I", c, off, header)
        c[off + 4 : off + 4 + len(body)] = body
        off = nxt


# --------------------------------------------------------------------------- writer


class _Tree:
    """Writes files and relative symlinks below ``root``; paths are root-relative."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self._dirs: set[str] = set()

    def _mkdir(self, rel_dir: str) -> None:
        if rel_dir not in self._dirs:
            os.makedirs(f"{self.root}/{rel_dir}", exist_ok=True)
            self._dirs.add(rel_dir)

    def write(self, rel: str, text: str | bytes) -> None:
        self._mkdir(rel.rsplit("/", 1)[0])
        data = text if isinstance(text, bytes) else text.encode()
        with open(f"{self.root}/{rel}", "wb") as f:
            f.write(data)

    def attrs(self, rel_dir: str, items: dict[str, str]) -> None:
        self._mkdir(rel_dir)
        for name, value in items.items():
            with open(f"{self.root}/{rel_dir}/{name}", "w") as f:
                f.write(value + "\n")

    def link(self, rel: str, target_rel: str) -> None:
        """A symlink at ``rel`` pointing at root-relative ``target_rel``, stored relative."""
        parent = rel.rsplit("/", 1)[0]
        self._mkdir(parent)
        os.symlink(os.path.relpath(f"/{target_rel}", f"/{parent}"), f"{self.root}/{rel}")

    def mkdir(self, rel_dir: str) -> None:
        self._mkdir(rel_dir)


def _cpulists(spec: HostSpec) -> list[list[int]]:
    """Logical CPUs per socket, numbered the way Linux does on SMT Intel boxes."""
    n, c = spec.sockets, spec.cores_per_socket
    return [list(range(s * c, (s + 1) * c)) + list(range((n + s) * c, (n + s + 1) * c)) for s in range(n)]


def _fmt_cpulist(cpus: list[int]) -> str:
    out: list[str] = []
    for cpu in sorted(cpus):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == cpu - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        elif out and "-" not in out[-1] and int(out[-1]) == cpu - 1:
            out[-1] = f"{out[-1]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def _fmt_cpumask(cpus: list[int], total: int) -> str:
    mask = sum(1 << c for c in cpus)
    words = [(mask >> (32 * i)) & 0xFFFFFFFF for i in range((total + 31) // 32)]
    return ",".join(f"{w:08x}" for w in reversed(words))


class _Writer:
    def __init__(self, root: Path, spec: HostSpec) -> None:
        self.t = _Tree(root)
        self.spec = spec
        self.cpus = _cpulists(spec)
        self.ncpu = spec.sockets * spec.cores_per_socket * 2
        self.ifindex = 2  # 1 is lo
        self.nvme = 0
        self.drivers: dict[str, list[Fn]] = {}
        self.groups: dict[int, list[Fn]] = {}
        self.netdevs: list[tuple[str, Fn]] = []
        self.root_nvme: str = ""

    # --- PCI functions

    def function(self, fn: Fn, parent_dir: str) -> None:
        fn.sysdir = f"{parent_dir}/{fn.addr}"
        d = fn.sysdir
        cls = fn.cls
        modalias = (
            f"pci:v{fn.vendor:08X}d{fn.device:08X}sv{fn.sub[0]:08X}sd{fn.sub[1]:08X}"
            f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}"
        )
        uevent = [
            f"PCI_CLASS={cls:X}",
            f"PCI_ID={fn.vendor:04X}:{fn.device:04X}",
            f"PCI_SUBSYS_ID={fn.sub[0]:04X}:{fn.sub[1]:04X}",
            f"PCI_SLOT_NAME={fn.addr}",
            f"MODALIAS={modalias}",
        ]
        if fn.driver:
            uevent.insert(0, f"DRIVER={fn.driver}")
        cpus = self.cpus[fn.numa]
        attrs = {
            "vendor": f"0x{fn.vendor:04x}",
            "device": f"0x{fn.device:04x}",
            "subsystem_vendor": f"0x{fn.sub[0]:04x}",
            "subsystem_device": f"0x{fn.sub[1]:04x}",
            "class": f"0x{cls:06x}",
            "revision": f"0x{fn.rev:02x}",
            "irq": str(fn.irq),
            "numa_node": str(fn.numa),
            "local_cpulist": _fmt_cpulist(cpus),
            "local_cpus": _fmt_cpumask(cpus, self.ncpu),
            "driver_override": "(null)",
            "enable": "1" if fn.driver else "0",
            "power_state": "D0",
            "d3cold_allowed": "1",
            "msi_bus": "1",
            "broken_parity_status": "0",
            "consistent_dma_mask_bits": "64" if fn.driver else "32",
            "dma_mask_bits": "64" if fn.driver else "32",
            "ari_enabled": "1" if fn.is_bridge and fn.ptype in (PT_RP, PT_DSP) else "0",
            "modalias": modalias,
            "uevent": "\n".join(uevent),
            "resource": self._resource(fn),
        }
        if fn.ptype is not None:
            cur_gen, cur_w, max_gen, max_w = fn.link or (0, 0, 0, 0)
            attrs |= {
                "current_link_speed": SPEED.get(cur_gen, "Unknown"),
                "current_link_width": str(cur_w),
                "max_link_speed": SPEED.get(max_gen, "Unknown"),
                "max_link_width": str(max_w),
            }
        if fn.reset:
            attrs["reset_method"] = fn.reset
        if fn.is_bridge:
            attrs["secondary_bus_number"] = str(fn.secondary)
            attrs["subordinate_bus_number"] = str(fn.subordinate)
        if (cls >> 8) == 0x0300:  # the kernel shows boot_vga on VGA-class functions only
            attrs["boot_vga"] = "1"
        if fn.vf is not None:
            attrs |= {
                "sriov_totalvfs": str(fn.vf.total),
                "sriov_numvfs": str(len(fn.vfs)),
                "sriov_offset": str(fn.vf.offset),
                "sriov_stride": str(fn.vf.stride),
                "sriov_vf_device": f"{fn.vf.device:x}",
                "sriov_drivers_autoprobe": "1",
            }
        self.t.attrs(d, attrs)
        self.t.write(f"{d}/config", _config(fn))
        self.t.link(f"{d}/subsystem", "sys/bus/pci")
        self.t.link(f"sys/bus/pci/devices/{fn.addr}", d)
        self.t.link(f"{d}/iommu_group", f"sys/kernel/iommu_groups/{fn.group}")
        self.t.link(f"{d}/iommu", f"sys/devices/virtual/iommu/dmar{fn.dmar}")
        self.groups.setdefault(fn.group, []).append(fn)
        if fn.driver:
            self.t.link(f"{d}/driver", f"sys/bus/pci/drivers/{fn.driver}")
            self.drivers.setdefault(fn.driver, []).append(fn)
        if fn.physfn is not None:
            self.t.link(f"{d}/physfn", fn.physfn.sysdir)
        for i, vf in enumerate(fn.vfs):
            self.t.link(f"{d}/virtfn{i}", f"{parent_dir}/{vf.addr}")
        if fn.is_bridge:
            bus = f"{fn.domain:04x}:{fn.secondary:02x}"
            self.t.attrs(
                f"{d}/pci_bus/{bus}",
                {"cpulistaffinity": _fmt_cpulist(cpus), "cpuaffinity": _fmt_cpumask(cpus, self.ncpu)},
            )
        if fn.extra == "nvme":
            self._nvme(fn)
        elif fn.extra == "net":
            self._net(fn)
        elif fn.extra == "vgpu":
            self._vgpu(fn)

    def _resource(self, fn: Fn) -> str:
        rows = [(0, 0, 0)] * (17 if fn.is_bridge else 13)
        for bar in fn.bars:
            flags = IORESOURCE_MEM | IORESOURCE_SIZEALIGN
            flags |= (IORESOURCE_PREFETCH if bar.pref else 0) | (IORESOURCE_MEM_64 if bar.is64 else 0)
            flags |= (0x4 if bar.is64 else 0) | (0x8 if bar.pref else 0)
            rows[bar.index] = (bar.base, bar.base + bar.size - 1, flags)
        if fn.is_bridge:
            lo, hi = _windows(fn)
            if lo:
                rows[14] = (lo[0], lo[1], 0x200)
            if hi:
                rows[15] = (hi[0], hi[1], 0x102201)
        return "\n".join(f"0x{a:016x} 0x{b:016x} 0x{f:016x}" for a, b, f in rows)

    def _nvme(self, fn: Fn) -> None:
        n = self.nvme
        self.nvme += 1
        ctrl = f"{fn.sysdir}/nvme/nvme{n}"
        self.t.attrs(
            ctrl,
            {
                "model": "SAMSUNG MZWLJ3T8HBLS-00007",
                "serial": f"S4WMNA0R{n:06d}",
                "firmware_rev": "EPK9GB5Q",
                "transport": "pcie",
                "state": "live",
                "dev": f"240:{n}",
                "uevent": f"MAJOR=240\nMINOR={n}\nDEVNAME=nvme{n}",
            },
        )
        self.t.link(f"{ctrl}/device", fn.sysdir)
        self.t.link(f"{ctrl}/subsystem", "sys/class/nvme")
        self.t.link(f"sys/class/nvme/nvme{n}", ctrl)
        disk = f"{ctrl}/nvme{n}n1"
        self._block(disk, f"nvme{n}n1", 259, n * 4, 7501476528, ctrl)
        if n == 0:  # the boot drive: EFI, root and swap partitions
            self.root_nvme = f"nvme{n}n1"
            for i, size in enumerate((2201600, 7365154816, 134217728), 1):
                name = f"nvme{n}n1p{i}"
                self._block(f"{disk}/{name}", name, 259, n * 4 + i, size, None, partition=i)

    def _block(
        self, d: str, name: str, major: int, minor: int, sectors: int, device: str | None, partition: int = 0
    ) -> None:
        attrs = {
            "size": str(sectors),
            "dev": f"{major}:{minor}",
            "ro": "0",
            "removable": "0",
            "uevent": f"MAJOR={major}\nMINOR={minor}\nDEVNAME={name}\nDEVTYPE="
            + ("partition" if partition else "disk"),
        }
        if partition:
            attrs["partition"] = str(partition)
            attrs["start"] = str(2048 * partition)
        self.t.attrs(d, attrs)
        if not partition:
            self.t.attrs(f"{d}/queue", {"rotational": "0", "logical_block_size": "512"})
        self.t.mkdir(f"{d}/holders")  # present and empty on a real disk that nothing stacks on
        self.t.mkdir(f"{d}/slaves")
        if device:
            self.t.link(f"{d}/device", device)
        self.t.link(f"{d}/subsystem", "sys/class/block")
        self.t.link(f"sys/class/block/{name}", d)

    def _ifname(self, fn: Fn) -> str:
        if fn.driver == "igb":
            return "eno1"
        pf = fn.physfn or fn
        dom = f"P{pf.domain}" if pf.domain else ""
        base = f"en{dom}p{pf.bus}s{pf.slot}f{pf.func}"
        if fn.physfn is not None:
            return f"{base}v{pf.vfs.index(fn)}"
        return f"{base}np{fn.port}"

    def _net(self, fn: Fn) -> None:
        name = self._ifname(fn)
        idx = self.ifindex
        self.ifindex += 1
        d = f"{fn.sysdir}/net/{name}"
        mac = f"0c:42:a1:{(idx >> 16) & 0xFF:02x}:{(idx >> 8) & 0xFF:02x}:{idx & 0xFF:02x}"
        up = fn.physfn is None
        self.t.attrs(
            d,
            {
                "address": mac,
                "addr_len": "6",
                "broadcast": "ff:ff:ff:ff:ff:ff",
                "operstate": "up" if up else "down",
                "carrier": "1" if up else "0",
                "speed": ("1000" if fn.driver == "igb" else "100000") if up else "-1",
                "duplex": "full" if up else "unknown",
                "mtu": "1500" if fn.driver == "igb" else "9000",
                "ifindex": str(idx),
                "iflink": str(idx),
                "type": "1",
                "uevent": f"INTERFACE={name}\nIFINDEX={idx}",
            },
        )
        self.t.link(f"{d}/device", fn.sysdir)
        self.t.link(f"{d}/subsystem", "sys/class/net")
        self.t.link(f"sys/class/net/{name}", d)
        self.netdevs.append((name, fn))

    def _vgpu(self, fn: Fn) -> None:
        body = "ID    : vGPU Name\n" + "\n".join(f"{i:<6}: {n}" for i, n in VGPU_TYPES)
        self.t.attrs(f"{fn.sysdir}/nvidia", {"creatable_vgpu_types": body, "current_vgpu_type": "0"})

    # --- everything that is not a PCI function

    def host_bridge(self, domain: int, bus: int, numa: int) -> str:
        d = f"sys/devices/pci{domain:04x}:{bus:02x}"
        cpus = self.cpus[numa]
        self.t.attrs(
            f"{d}/pci_bus/{domain:04x}:{bus:02x}",
            {"cpulistaffinity": _fmt_cpulist(cpus), "cpuaffinity": _fmt_cpumask(cpus, self.ncpu)},
        )
        self.t.attrs(d, {"uevent": ""})
        return d

    def finish(self, dmars: int) -> None:
        t = self.t
        for name, fns in sorted(self.drivers.items()):
            dd = f"sys/bus/pci/drivers/{name}"
            t.attrs(dd, {"bind": "", "unbind": "", "new_id": "", "remove_id": "", "uevent": ""})
            t.link(f"{dd}/module", f"sys/module/{name.replace('-', '_')}")
            for fn in fns:
                t.link(f"{dd}/{fn.addr}", fn.sysdir)
        for name in ("vfio-pci", "pcieport"):
            t.attrs(f"sys/bus/pci/drivers/{name}", {"bind": "", "unbind": "", "new_id": "", "remove_id": ""})
        t.attrs("sys/bus/pci", {"drivers_autoprobe": "1", "rescan": ""})
        t.mkdir("sys/bus/pci/slots")
        for g, fns in sorted(self.groups.items()):
            gd = f"sys/kernel/iommu_groups/{g}"
            t.attrs(gd, {"type": "identity", "reserved_regions": "0x00000000fee00000 0x00000000feefffff msi"})
            for fn in fns:
                t.link(f"{gd}/devices/{fn.addr}", fn.sysdir)
        by_dmar: dict[int, list[Fn]] = {}
        for fns in self.groups.values():
            for fn in fns:
                by_dmar.setdefault(fn.dmar, []).append(fn)
        for i in range(dmars):
            dd = f"sys/devices/virtual/iommu/dmar{i}"
            t.attrs(
                f"{dd}/intel-iommu",
                {
                    "version": "1:0",
                    "cap": "d2008c40660462",
                    "ecap": "f050da",
                    "address": f"{0xC5FFC000 + i * 0x1000:x}",
                },
            )
            t.link(f"sys/class/iommu/dmar{i}", dd)
            for fn in by_dmar.get(i, []):
                t.link(f"{dd}/devices/{fn.addr}", fn.sysdir)
        t.attrs(
            "sys/devices/virtual/net/lo",
            {"address": "00:00:00:00:00:00", "operstate": "unknown", "mtu": "65536", "ifindex": "1", "type": "772"},
        )
        t.link("sys/class/net/lo", "sys/devices/virtual/net/lo")
        self._nodes()
        self._modules()
        self._proc()
        t.write("etc/os-release", OS_RELEASE)

    def _nodes(self) -> None:
        t, spec = self.t, self.spec
        mem_kb = 1056 * 1024 * 1024  # ~1 TiB per socket
        node_base = "sys/devices/system/node"
        n = spec.sockets
        t.attrs(
            node_base,
            {
                "online": f"0-{n - 1}",
                "possible": f"0-{n - 1}",
                "has_cpu": f"0-{n - 1}",
                "has_memory": f"0-{n - 1}",
                "has_normal_memory": f"0-{n - 1}",
            },
        )
        for i, cpus in enumerate(self.cpus):
            nd = f"{node_base}/node{i}"
            free = mem_kb - 12 * 1024 * 1024
            meminfo = "\n".join(
                f"Node {i} {k:<16}{v:>12} kB"
                for k, v in [
                    ("MemTotal:", mem_kb),
                    ("MemFree:", free),
                    ("MemUsed:", mem_kb - free),
                    ("HugePages_Total:", 0),
                    ("HugePages_Free:", 0),
                ]
            )
            t.attrs(
                nd,
                {
                    "cpulist": _fmt_cpulist(cpus),
                    "cpumap": _fmt_cpumask(cpus, self.ncpu),
                    "meminfo": meminfo,
                    "distance": " ".join("10" if j == i else "21" for j in range(n)),
                },
            )
            for size, nr in (("2048kB", 4096), ("1048576kB", 0)):
                t.attrs(
                    f"{nd}/hugepages/hugepages-{size}",
                    {"nr_hugepages": str(nr), "free_hugepages": str(nr), "surplus_hugepages": "0"},
                )
        allc = f"0-{self.ncpu - 1}"
        t.attrs(
            "sys/devices/system/cpu", {"online": allc, "possible": allc, "present": allc, "isolated": "", "offline": ""}
        )
        for size, nr in (("2048kB", 4096 * n), ("1048576kB", 0)):
            t.attrs(
                f"sys/kernel/mm/hugepages/hugepages-{size}",
                {
                    "nr_hugepages": str(nr),
                    "free_hugepages": str(nr),
                    "resv_hugepages": "0",
                    "surplus_hugepages": "0",
                    "nr_overcommit_hugepages": "0",
                },
            )
        t.attrs("sys/kernel/mm/transparent_hugepage", {"enabled": "always [madvise] never"})

    def _modules(self) -> None:
        params = {
            "kvm": {"ignore_msrs": "N", "halt_poll_ns": "200000", "tdp_mmu": "Y", "nx_huge_pages": "N"},
            "kvm_intel": {"nested": "Y", "ept": "Y", "enable_apicv": "Y"},
            "vfio_iommu_type1": {"allow_unsafe_interrupts": "N", "dma_entry_limit": "65535"},
            "vfio_pci": {"disable_vga": "N", "enable_sriov": "N", "disable_idle_d3": "N"},
            "nvidia": {"NVreg_EnableMSI": "1"},
            "mlx5_core": {"prof_sel": "2"},
            "nvme": {"io_queue_depth": "1024"},
        }
        for mod, ps in params.items():
            self.t.attrs(f"sys/module/{mod}/parameters", ps)
            self.t.attrs(f"sys/module/{mod}", {"initstate": "live", "refcnt": "0"})
        self.t.attrs("sys/module/nvidia", {"version": NVIDIA_VERSION})
        for mod in (
            "igb",
            "ast",
            "ahci",
            "xhci_hcd",
            "mei_me",
            "i801_smbus",
            "intel_spi",
            "intel_pch_thermal",
            "pcieport",
            "nvidia_vgpu_vfio",
            "mlx5_ib",
        ):
            self.t.attrs(f"sys/module/{mod}", {"initstate": "live"})

    def _proc(self) -> None:
        t, spec = self.t, self.spec
        t.write(
            "proc/cmdline",
            f"BOOT_IMAGE=/vmlinuz-{KERNEL} root=/dev/{self.root_nvme}p2 ro "
            "intel_iommu=on iommu=pt default_hugepagesz=2M hugepagesz=2M "
            "hugepages=8192 quiet splash\n",
        )
        t.write(
            "proc/version",
            f"Linux version {KERNEL} (buildd@lcy02-amd64-051) (x86_64-linux-gnu-gcc-12 "
            "(Ubuntu 12.3.0-1ubuntu1~22.04) 12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) "
            "#49~22.04.1-Ubuntu SMP PREEMPT_DYNAMIC Wed Nov  6 17:42:15 UTC 2\n",
        )
        t.write(
            "proc/modules",
            "".join(
                f"{name} {size} {refs} {deps} Live 0xffffffffc{i:07x}000{' (POE)' if 'nvidia' in name else ''}\n"
                for i, (name, size, refs, deps) in enumerate(MODULES)
            ),
        )
        total = 1056 * 1024 * 1024 * spec.sockets
        t.write(
            "proc/meminfo",
            "".join(
                f"{k:<16}{v:>10} kB\n" if unit else f"{k:<16}{v:>10}\n"
                for k, v, unit in [
                    ("MemTotal:", total, True),
                    ("MemFree:", total - 30 * 1024 * 1024, True),
                    ("MemAvailable:", total - 20 * 1024 * 1024, True),
                    ("Buffers:", 912344, True),
                    ("Cached:", 9823436, True),
                    ("SwapCached:", 0, True),
                    ("SwapTotal:", 67108860, True),
                    ("SwapFree:", 67108860, True),
                    ("HugePages_Total:", 8192, False),
                    ("HugePages_Free:", 8192, False),
                    ("HugePages_Rsvd:", 0, False),
                    ("HugePages_Surp:", 0, False),
                    ("Hugepagesize:", 2048, True),
                    ("Hugetlb:", 16777216, True),
                ]
            ),
        )
        nv = self.root_nvme
        t.write(
            "proc/mounts",
            "\n".join(
                [
                    "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0",
                    "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0",
                    "udev /dev devtmpfs rw,nosuid,relatime,size=1056000000k,nr_inodes=264000000,mode=755 0 0",
                    f"/dev/{nv}p2 / ext4 rw,relatime 0 0",
                    f"/dev/{nv}p1 /boot/efi vfat rw,relatime,fmask=0077,dmask=0077 0 0",
                    "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0",
                    "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0",
                    "tmpfs /run tmpfs rw,nosuid,nodev,noexec,relatime,size=211000000k,mode=755 0 0",
                ]
            )
            + "\n",
        )
        t.write(
            "proc/swaps",
            "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
            f"/dev/{nv}p3                          partition\t67108860\t0\t\t-2\n",
        )
        t.write(
            "proc/net/route",
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
            "eno1\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
            "eno1\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n",
        )
        t.write("proc/cpuinfo", self._cpuinfo())

    def _cpuinfo(self) -> str:
        spec = self.spec
        flags = (
            "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
            "dts acpi mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc "
            "pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm "
            "pcid dca sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm abm "
            "avx2 avx512f avx512dq avx512bw avx512vl tpr_shadow flexpriority ept vpid ept_ad"
        )
        out = []
        for cpu in range(self.ncpu):
            sock = next(i for i, cs in enumerate(self.cpus) if cpu in cs)
            core = cpu % spec.cores_per_socket
            out.append(
                f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 106\n"
                f"model name\t: Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz\nstepping\t: 6\n"
                f"physical id\t: {sock}\nsiblings\t: {2 * spec.cores_per_socket}\ncore id\t\t: {core}\n"
                f"cpu cores\t: {spec.cores_per_socket}\nflags\t\t: {flags}\n"
                "address sizes\t: 46 bits physical, 57 bits virtual\n"
            )
        return "\n".join(out) + "\n"


OS_RELEASE = """PRETTY_NAME="Ubuntu 22.04.5 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.5 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
UBUNTU_CODENAME=jammy
"""

# (name, size, refcount, "deps," or "-") as /proc/modules lists them.
MODULES = [
    ("nvidia_vgpu_vfio", 94208, 0, "-"),
    ("nvidia", 8556544, 1, "nvidia_vgpu_vfio,"),
    ("vfio_pci", 16384, 0, "-"),
    ("vfio_pci_core", 94208, 2, "nvidia_vgpu_vfio,vfio_pci,"),
    ("vfio_iommu_type1", 49152, 0, "-"),
    ("vfio", 69632, 4, "nvidia_vgpu_vfio,vfio_pci_core,vfio_iommu_type1,vfio_pci,"),
    ("iommufd", 98304, 1, "vfio,"),
    ("mlx5_ib", 483328, 0, "-"),
    ("ib_uverbs", 196608, 1, "mlx5_ib,"),
    ("ib_core", 495616, 2, "mlx5_ib,ib_uverbs,"),
    ("mlx5_core", 2125824, 1, "mlx5_ib,"),
    ("mlxfw", 36864, 1, "mlx5_core,"),
    ("nvme", 61440, 3, "-"),
    ("nvme_core", 208896, 4, "nvme,"),
    ("kvm_intel", 487424, 0, "-"),
    ("kvm", 1404928, 1, "kvm_intel,"),
    ("igb", 294912, 0, "-"),
    ("ast", 102400, 0, "-"),
    ("ahci", 49152, 0, "-"),
    ("intel_pch_thermal", 20480, 0, "-"),
    ("i2c_i801", 36864, 0, "-"),
    ("mei_me", 53248, 0, "-"),
]


# --------------------------------------------------------------------------- entry points


def _scaled(spec: HostSpec, scale: float) -> HostSpec:
    if scale == 1.0:
        return spec

    def s(n: int) -> int:
        return max(1, round(n * scale)) if n else 0

    # nvme0 (boot) stays; the switch-attached drives scale with the GPUs.
    return HostSpec(
        **{
            **spec.__dict__,
            "gpus": s(spec.gpus),
            "nics": s(spec.nics),
            "nvmes": 1 + s(spec.nvmes - 1) if spec.nvmes else 0,
        }
    )


def build(spec: HostSpec) -> tuple[list[tuple[int, int, list[Fn], int]], int]:
    """The numbered topology: [(domain, root bus, functions, numa node)], dmar count."""
    switches = max(math.ceil(spec.gpus / spec.gpus_per_switch), 1 if (spec.nics or spec.nvmes > 1) else 0)
    roots: list[tuple[list[Fn], int]] = [(_platform(spec.nvmes > 0), 0)]
    fabric_nvmes = max(spec.nvmes - 1, 0)
    for s in range(switches):

        def share(n: int, s: int = s) -> int:  # round-robin share of n for switch s
            return n // switches + (1 if s < n % switches else 0)

        gpus = min(spec.gpus_per_switch, spec.gpus - s * spec.gpus_per_switch)
        numa = s * spec.sockets // switches
        roots.append((_stack(max(gpus, 0), share(spec.nics), share(fabric_nvmes), spec), numa))
    numberer = _Numberer()
    out = []
    for fns, numa in roots:
        bus = numberer.root(fns)
        out.append((numberer.domain, bus, fns, numa))
    mmio = _Mmio()
    for _, _, fns, _ in out:
        _place(fns, mmio)
    return out, len(out)


def make_host_root(
    dest: Path,
    *,
    gpus: int = 8,
    vfs_per_gpu: int = 32,
    nvmes: int = 9,
    nics: int = 8,
    nic_ports: int = 2,
    nic_vfs: int = 112,
    gpus_per_switch: int = 2,
    sockets: int = 2,
    cores_per_socket: int = 56,
    scale: float = 1.0,
) -> int:
    """Write a synthetic host under ``dest`` (absent or empty); return its number of PCI functions."""
    spec = _scaled(
        HostSpec(
            gpus=gpus,
            vfs_per_gpu=vfs_per_gpu,
            gpus_per_switch=gpus_per_switch,
            nvmes=nvmes,
            nics=nics,
            nic_ports=nic_ports,
            nic_vfs=nic_vfs,
            sockets=sockets,
            cores_per_socket=cores_per_socket,
        ),
        scale,
    )
    roots, dmars = build(spec)
    dest.mkdir(parents=True, exist_ok=True)
    w = _Writer(dest, spec)
    irq = 16
    group = 0
    count = 0
    for dmar, (domain, bus, fns, numa) in enumerate(roots):
        hd = w.host_bridge(domain, bus, numa)
        shared: dict[tuple[int, ...], int] = {}
        for fn in _walk(fns):
            fn.numa, fn.dmar = numa, dmar
            if not fn.is_vf:
                fn.irq = irq
                irq += 1
            # Functions without ACS isolation share a group: multifunction chipset
            # devices on one slot, and everything behind a PCIe-to-PCI bridge.
            key: tuple[int, ...]
            if fn.bus == bus and fn.ptype != PT_RP and fn.multifunction:
                key = (fn.domain, fn.bus, fn.slot)
            elif fn.ptype is None and fn.bus != bus:  # conventional PCI behind a bridge
                key = (fn.domain, fn.bus, -1)
            elif fn.ptype == PT_PCIE_PCI:  # ... grouped with that bridge
                key = (fn.domain, fn.secondary, -1)
            else:
                key = (id(fn),)
            if key not in shared:
                shared[key] = group
                group += 1
            fn.group = shared[key]
        # Second pass writes: VFs need their PF's sysdir, children their parent's.
        _write_tree(w, fns, hd)
        count += sum(1 for _ in _walk(fns))
    w.finish(dmars)
    return count


def _write_tree(w: _Writer, fns: list[Fn], parent_dir: str) -> None:
    for fn in sorted(fns, key=lambda f: f.devfn):
        w.function(fn, parent_dir)
        for vf in fn.vfs:
            w.function(vf, parent_dir)
        if fn.is_bridge:
            _write_tree(w, fn.children, fn.sysdir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("dest", type=Path, help="directory to create the root in")
    p.add_argument("--scale", type=float, default=1.0, help="multiply GPUs, NICs and NVMe drives")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--vfs-per-gpu", type=int, default=32)
    p.add_argument("--nvmes", type=int, default=9)
    p.add_argument("--nics", type=int, default=8)
    p.add_argument("--nic-ports", type=int, default=2)
    p.add_argument("--nic-vfs", type=int, default=112)
    p.add_argument("--force", action="store_true", help="replace dest if it exists")
    a = p.parse_args(argv)
    if a.dest.exists():
        if not a.force:
            p.error(f"{a.dest} exists (use --force)")
        shutil.rmtree(a.dest)
    n = make_host_root(
        a.dest,
        gpus=a.gpus,
        vfs_per_gpu=a.vfs_per_gpu,
        nvmes=a.nvmes,
        nics=a.nics,
        nic_ports=a.nic_ports,
        nic_vfs=a.nic_vfs,
        scale=a.scale,
    )
    print(f"{n} PCI functions under {a.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
