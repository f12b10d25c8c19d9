"""How a topology's nodes are named, one copy for the text tree (topology) and the picture
(topology_svg)."""

from __future__ import annotations

from typing import Any

RELATION_TEXT = {
    "companion": "companion (passed with the GPU)",
    "bridge": "port in the group (stays with the host)",
    "group member": "shares the IOMMU group",
}


def device_label(entry: dict[str, Any]) -> str:
    """``0000:41:00.0 NVIDIA H100 80GB HBM3 [10de:2330]``: the driver's product name, else the
    hwdb's (or pci.ids') vendor and device name; the id is added when the name is not already it."""
    name = entry.get("product_name") or entry["name"]
    return f"{entry['address']} {name}" + ("" if name == f"[{entry['id']}]" else f" [{entry['id']}]")


def gpu_details(entry: dict[str, Any]) -> str:
    group = "no IOMMU group" if entry["iommu_group"] is None else f"IOMMU group {entry['iommu_group']}"
    driver = f"driver {entry['driver']}" if entry["driver"] else "no driver"
    return f"{driver}, {group}"


def verdict_line(entry: dict[str, Any]) -> str:
    """``not ready: 0000:00:02.0 is the boot display (+1 more: gpuprov inspect)``: the verdict and
    the first reason for it that the GPU's own lines do not say already (its unknown group)."""
    verdict = entry.get("verdict") or "unknown"
    reasons = [r for r in entry.get("blockers") or entry.get("warnings") or [] if r not in entry.get("unknown", [])]
    if not reasons:
        return verdict
    more = f" (+{len(reasons) - 1} more: gpuprov inspect)" if len(reasons) > 1 else ""
    return f"{verdict}: {reasons[0]}{more}"


def node_title(node: dict[str, Any]) -> str:
    if node["node"] is None:
        return "NUMA node not reported (numa_node -1: one node, or firmware without SRAT)"
    cpus = f" (CPUs {node['cpulist']})" if node["cpulist"] else ""
    return f"NUMA node {node['node']}{cpus}"


def matrix_title(matrix: dict[str, Any]) -> str:
    """What the link matrix is and where its NVLinks came from."""
    source = matrix.get("nvlinks_from")
    known = f"NVLinks from {source}" if source else "NVLinks unknown: sysfs shows only the PCIe path"
    return f"GPU links in nvidia-smi topo -m's words ({known})"


def gpu_column(index: int) -> str:
    return f"GPU{index}"
