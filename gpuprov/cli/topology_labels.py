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
    """``0000:41:00.0 NVIDIA ... [10de:2330]``: the id is added when the name is not already it."""
    name = entry["name"]
    return f"{entry['address']} {name}" + ("" if name == f"[{entry['id']}]" else f" [{entry['id']}]")


def gpu_details(entry: dict[str, Any]) -> str:
    group = "no IOMMU group" if entry["iommu_group"] is None else f"IOMMU group {entry['iommu_group']}"
    return f"driver {entry['driver'] or 'none'}, {group}"


def node_title(node: dict[str, Any]) -> str:
    if node["node"] is None:
        return "NUMA node not reported (numa_node -1: one node, or firmware without SRAT)"
    cpus = f" (CPUs {node['cpulist']})" if node["cpulist"] else ""
    return f"NUMA node {node['node']}{cpus}"
