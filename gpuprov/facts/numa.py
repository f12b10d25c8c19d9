"""NUMA nodes: CPUs, memory and hugepages per node."""

from __future__ import annotations

from dataclasses import dataclass, field

from .evidence import RESOURCES, MissingEvidence, note
from .sysfs import Sysfs


@dataclass
class NumaNode:
    node: int
    cpulist: str | None
    memory_kib: int | None
    hugepages: dict[str, dict[str, int | None]] = field(default_factory=dict)
    # "2048kB" -> {"total": n, "free": n}


# No CPU number reaches this (Linux's largest NR_CPUS): a list naming more is garbage, not expanded.
MAX_CPUS = 8192


def parse_cpulist(text: str | None) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11]; malformed parts, and numbers from
    :data:`MAX_CPUS` on, are skipped (a hostile ``0-4000000000`` is never expanded)."""
    cpus: list[int] = []
    for part in (text or "").split(",")[:MAX_CPUS]:
        lo, _sep, hi = part.strip().partition("-")
        if len(lo) > 5 or len(hi) > 5:
            continue
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            continue
        if 0 <= first <= last < MAX_CPUS and len(cpus) < MAX_CPUS:
            cpus.extend(range(first, last + 1))
    return cpus


def _meminfo_kib(lines: list[str], key: str) -> int | None:
    # "MemTotal:  123 kB" and per-node "Node 0 MemTotal:  123 kB"
    for line in lines:
        head, _sep, value = line.partition(":")
        if head.split()[-1:] == [key]:
            try:
                return int(value.split()[0])
            except (ValueError, IndexError):
                return None
    return None


def _hugepages(sysfs: Sysfs, base: str) -> dict[str, dict[str, int | None]]:
    pages: dict[str, dict[str, int | None]] = {}
    for entry in sysfs.listdir(base):
        if entry.startswith("hugepages-"):
            size = entry[len("hugepages-") :]
            pages[size] = {
                "total": sysfs.read_int(f"{base}/{entry}/nr_hugepages", 10),
                "free": sysfs.read_int(f"{base}/{entry}/free_hugepages", 10),
            }
    return pages


def _node(
    sysfs: Sysfs, number: int, cpus: str, meminfo: str, hugepages: str, missing: MissingEvidence | None
) -> NumaNode:
    node = NumaNode(
        node=number,
        cpulist=sysfs.read(cpus),
        memory_kib=_meminfo_kib(sysfs.read_lines(meminfo), "MemTotal"),
        hugepages=_hugepages(sysfs, hugepages),
    )
    # The VM planner's memory and CPU checks need both.
    if node.cpulist is None or (node.cpulist and not parse_cpulist(node.cpulist)):
        # An empty list is a memory-only node; nothing or garbage is unknown.
        problem = None if node.cpulist is None else f"it reads {node.cpulist[:20]!r}, not a CPU list"
        note(missing, sysfs, "host CPUs", cpus, problem, rule=RESOURCES)
    if node.memory_kib is None:
        note(missing, sysfs, "host memory", meminfo, rule=RESOURCES)
    return node


def read_numa(sysfs: Sysfs, missing: MissingEvidence | None = None) -> list[NumaNode]:
    base = "sys/devices/system/node"
    nodes = []
    for entry in sysfs.listdir(base):
        if entry.startswith("node") and entry[4:].isdigit():
            nb = f"{base}/{entry}"
            nodes.append(_node(sysfs, int(entry[4:]), f"{nb}/cpulist", f"{nb}/meminfo", f"{nb}/hugepages", missing))
    if nodes:
        return sorted(nodes, key=lambda n: n.node)
    # Kernels built without NUMA show no node directory: one node holds all.
    return [_node(sysfs, 0, "sys/devices/system/cpu/online", "proc/meminfo", "sys/kernel/mm/hugepages", missing)]
