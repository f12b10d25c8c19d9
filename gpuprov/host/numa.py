"""NUMA nodes: CPUs, memory and hugepages per node."""

from __future__ import annotations

from dataclasses import dataclass, field

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
        lo, _, hi = part.strip().partition("-")
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
        head, _, value = line.partition(":")
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


def read_numa(sysfs: Sysfs) -> list[NumaNode]:
    base = "sys/devices/system/node"
    nodes = []
    for entry in sysfs.listdir(base):
        if entry.startswith("node") and entry[4:].isdigit():
            nb = f"{base}/{entry}"
            nodes.append(
                NumaNode(
                    node=int(entry[4:]),
                    cpulist=sysfs.read(f"{nb}/cpulist"),
                    memory_kib=_meminfo_kib(sysfs.read_lines(f"{nb}/meminfo"), "MemTotal"),
                    hugepages=_hugepages(sysfs, f"{nb}/hugepages"),
                )
            )
    if nodes:
        return sorted(nodes, key=lambda n: n.node)
    # Kernels built without NUMA show no node directory: one node holds all.
    return [
        NumaNode(
            node=0,
            cpulist=sysfs.read("sys/devices/system/cpu/online"),
            memory_kib=_meminfo_kib(sysfs.read_lines("proc/meminfo"), "MemTotal"),
            hugepages=_hugepages(sysfs, "sys/kernel/mm/hugepages"),
        )
    ]
