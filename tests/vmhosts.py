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


def two_node_host(root: Path, *, pages: dict[int, int] | None = None, memory_gib: int = 512) -> HostFacts:
    """Two NUMA nodes of 16 CPUs each; GPU 0000:41:00.0 (+ audio .1) on node 0, 0000:c1:00.0 on node 1,
    each in its own IOMMU group; node 1 may have hugepages reserved."""
    fake = FakeHost(root)
    fake.pci("0000:00:00.0", cls=0x060000, vendor=0x8086, device=0x1234, group=0, numa_node=0)
    fake.pci("0000:40:01.0", cls=0x060400, vendor=0x8086, device=0x2345, group=10, numa_node=0, driver="pcieport")
    fake.pci("0000:41:00.0", cls=0x030200, parent="0000:40:01.0", group=11, numa_node=0)
    fake.pci("0000:41:00.1", cls=0x040300, parent="0000:40:01.0", group=11, numa_node=0, driver="snd_hda_intel")
    fake.pci("0000:c0:01.0", cls=0x060400, vendor=0x8086, device=0x2345, group=20, numa_node=1, driver="pcieport")
    fake.pci("0000:c1:00.0", cls=0x030200, parent="0000:c0:01.0", group=21, numa_node=1, driver="vfio-pci")
    add_numa(fake, [("0-15", memory_gib * GIB_KIB // 2, {}), ("16-31", memory_gib * GIB_KIB // 2, pages or {})])
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
