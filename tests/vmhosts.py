"""Fake GPU hosts for the VM planner and domain builder tests: NUMA nodes with
CPUs, memory and hugepages, GPUs with companions, NVIDIA mdev parents and
SR-IOV vGPU VFs. Built with tests/fakehost.py; captured hosts cover the rest."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

from gpuprov.facts.host import HostFacts, gather
from gpuprov.facts.sysfs import Sysfs
from tests.fakehost import FakeHost

GIB_KIB = 1048576


def ssh_public_key(comment: str = "admin@example", key_type: str = "ssh-ed25519") -> str:
    """A well-formed public key line (its blob names its type; the key bits are a hash of the comment)."""
    name = key_type.encode()
    bits = hashlib.sha256(comment.encode()).digest()
    blob = len(name).to_bytes(4, "big") + name + len(bits).to_bytes(4, "big") + bits
    return f"{key_type} {base64.b64encode(blob).decode()} {comment}"


def add_numa(fake: FakeHost, nodes: list[tuple[str, int, dict[int, int]]]) -> None:
    """nodes: (cpulist, memory KiB, {hugepage size KiB: pages reserved}) per node."""
    for i, (cpulist, mem_kib, pages) in enumerate(nodes):
        base = f"sys/devices/system/node/node{i}"
        fake.write(f"{base}/cpulist", cpulist + "\n")
        fake.write(f"{base}/meminfo", f"Node {i} MemTotal:       {mem_kib} kB\nNode {i} MemFree: {mem_kib // 2} kB\n")
        for size in (2048, 1048576):
            count = pages.get(size, 0)
            fake.write(f"{base}/hugepages/hugepages-{size}kB/nr_hugepages", f"{count}\n")
            fake.write(f"{base}/hugepages/hugepages-{size}kB/free_hugepages", f"{count}\n")


def two_node_host(
    root: Path, *, pages: dict[int, int] | None = None, memory_gib: int = 512, pages0: dict[int, int] | None = None
) -> HostFacts:
    """Two NUMA nodes of 16 CPUs each; GPU 0000:41:00.0 (+ audio .1) on node 0, 0000:c1:00.0 on node 1,
    each in its own IOMMU group; hugepages may be reserved on node 1 (``pages``) and node 0 (``pages0``)."""
    fake = FakeHost(root)
    fake.pci("0000:00:00.0", cls=0x060000, vendor=0x8086, device=0x1234, group=0, numa_node=0)
    fake.pci("0000:40:01.0", cls=0x060400, vendor=0x8086, device=0x2345, group=10, numa_node=0, driver="pcieport")
    fake.pci("0000:41:00.0", cls=0x030200, parent="0000:40:01.0", group=11, numa_node=0)
    fake.pci("0000:41:00.1", cls=0x040300, parent="0000:40:01.0", group=11, numa_node=0, driver="snd_hda_intel")
    fake.pci("0000:c0:01.0", cls=0x060400, vendor=0x8086, device=0x2345, group=20, numa_node=1, driver="pcieport")
    fake.pci("0000:c1:00.0", cls=0x030200, parent="0000:c0:01.0", group=21, numa_node=1, driver="vfio-pci")
    add_numa(
        fake, [("0-15", memory_gib * GIB_KIB // 2, pages0 or {}), ("16-31", memory_gib * GIB_KIB // 2, pages or {})]
    )
    return gather(Sysfs(str(fake.finish())))


def nvidia_vgpu_host(root: Path, *, existing: str | None = None) -> HostFacts:
    """An NVIDIA GPU 0000:41:00.0 offering mdev types nvidia-474 (4 left) and nvidia-475 (2 left);
    ``existing``: a type that already has one instance."""
    fake = FakeHost(root)
    fake.pci("0000:41:00.0", cls=0x030200, group=11, numa_node=0, driver="nvidia")
    fake.mdev_types("0000:41:00.0", {"nvidia-474": ("GRID A100-4C", 4), "nvidia-475": ("GRID A100-8C", 2)})
    if existing:
        fake.mdev("0000:41:00.0", existing, "11111111-2222-3333-4444-555555555555")
    add_numa(fake, [("0-31", 256 * GIB_KIB, {})])
    return gather(Sysfs(str(fake.finish())))


def sriov_vgpu_host(root: Path, *, current: dict[str, int] | None = None) -> HostFacts:
    """An NVIDIA PF 0000:41:00.0 with three VFs (41:00.4-.6), each its own group; creatable types 557, 558."""
    current = current or {}
    fake = FakeHost(root)
    fake.pci("0000:41:00.0", cls=0x030200, group=11, numa_node=1, driver="nvidia", sriov_totalvfs=16)
    for i, fn in enumerate((4, 5, 6)):
        addr = f"0000:41:00.{fn}"
        fake.pci(addr, cls=0x030200, group=12 + i, numa_node=1, physfn="0000:41:00.0", driver="nvidia")
        fake.vgpu_vf(addr, {557: "NVIDIA A100-4C", 558: "NVIDIA A100-8C"}, current.get(addr, 0))
    add_numa(fake, [("0-7", 64 * GIB_KIB, {}), ("8-15", 64 * GIB_KIB, {})])
    return gather(Sysfs(str(fake.finish())))


H100_BAR1_BYTES = 128 << 30


def _resource_text(bars: dict[int, tuple[int, int, int]]) -> str:
    """A ``resource`` file as the kernel writes it: 13 lines (BARs 0-5, ROM, 6 VF BARs)."""
    lines = []
    for i in range(13):
        start, size, flags = bars.get(i, (0, 0, 0))
        end = start + size - 1 if size else 0
        lines.append(f"0x{start:016x} 0x{end:016x} 0x{flags:016x}")
    return "\n".join(lines) + "\n"


def h100_resource(index: int, bar1_bytes: int = H100_BAR1_BYTES) -> str:
    """An H100's BARs: BAR0 16 MiB (32-bit), BAR1 (VRAM, 64-bit prefetchable), BAR3 32 MiB (64-bit prefetchable)."""
    mem32, mem64_pref = 0x00040200, 0x0014220C
    high = (0x200 + index * 0x40) << 30
    return _resource_text(
        {
            0: (0xE0000000 + index * (16 << 20), 16 << 20, mem32),
            1: (high, bar1_bytes, mem64_pref),
            3: (high + bar1_bytes, 32 << 20, mem64_pref),
        }
    )


HGX_GPUS = ("0000:18:00.0", "0000:2a:00.0", "0000:9a:00.0", "0000:ab:00.0")


def hgx_two_node_host(
    root: Path, *, pages: dict[int, int] | None = None, bar1_bytes: int = H100_BAR1_BYTES
) -> HostFacts:
    """Two NUMA nodes of 32 CPUs each; four H100s (128 GiB BAR1), 18:00.0 and 2a:00.0 on node 0,
    9a:00.0 and ab:00.0 on node 1, each behind its own port and in its own IOMMU group, bound to vfio-pci."""
    fake = FakeHost(root)
    for i, address in enumerate(HGX_GPUS):
        node = 0 if i < 2 else 1
        port = f"{address[:5]}{int(address[5:7], 16) - 1:02x}:01.0"
        fake.pci(port, cls=0x060400, vendor=0x8086, device=0x2345, group=10 + 2 * i, numa_node=node, driver="pcieport")
        fake.pci(address, cls=0x030200, parent=port, group=11 + 2 * i, numa_node=node, driver="vfio-pci")
        fake.write(f"{fake.paths[address]}/resource", h100_resource(i, bar1_bytes))
    add_numa(fake, [("0-31", 512 * GIB_KIB, pages or {}), ("32-63", 512 * GIB_KIB, pages or {})])
    return gather(Sysfs(str(fake.finish())))
