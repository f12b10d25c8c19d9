"""The host's PCI topology around its GPUs, as plain data (schema ``gpuprov.topology/v1``).

NUMA node -> root bus -> root port -> switch ports -> GPU, and with each GPU the other
devices of its IOMMU group and the functions of its slot (docs/guides/passthrough.md, "Topology"). Only the
GPUs, the bridges and ports on the way from the root complex to them, and the devices that
share a GPU's group are shown. Pure: reads nothing but the facts.

Each GPU carries its verdict (gpuprov.rules.assess, as ``gpuprov inspect`` gives it without a
declaration) and its blockers; the document ends with the GPUs' link matrix, in the words of
``nvidia-smi topo -m``: the PCIe path between each two GPUs from the facts, and NVLink where
it is known (:func:`link_matrix`).

The renderers (terminal tree, SVG, HTML) in gpuprov/cli/ work from this document, so every
view shows the same data.
"""

from __future__ import annotations

import re
from typing import Any

from .. import __version__
from ..facts.evidence import GROUPS
from ..facts.host import HostFacts
from ..facts.names import class_name
from ..facts.pci import PciDevice
from ..rules.assess import (
    BLOCKER,
    UNKNOWN,
    WARNING,
    GpuAssessment,
    assess,
    bridge_kind,
    companions_of,
    is_gpu,
    unknown_findings,
)

SCHEMA = "gpuprov.topology/v1"

ROOT_PORT, SWITCH_UP, SWITCH_DOWN, BRIDGE = "root port", "switch upstream port", "switch downstream port", "bridge"
# How a device shown with a GPU is tied to it.
COMPANION = "companion"  # a function of the GPU's slot: passed through with it
GROUP_BRIDGE = "bridge"  # a port or bridge in the GPU's group: stays with the host
GROUP_MEMBER = "group member"  # any other device in the GPU's IOMMU group
# A GPU's verdict, as inspect gives it: no blocker (and no warning), only blockers about
# evidence that could not be read, or a blocker the facts show.
READY, WARNINGS, UNKNOWN_VERDICT, NOT_READY = "ready", "ready, with warnings", "unknown", "not ready"
VERDICTS = (READY, WARNINGS, UNKNOWN_VERDICT, NOT_READY)
# The link between two GPUs, in nvidia-smi topo -m's words (NV# for # NVLinks).
LINKS = {
    "X": "the GPU itself",
    "NV#": "# NVLinks joined",
    "PIX": "through at most one PCIe switch (or bridge)",
    "PXB": "through several PCIe switches, not the host bridge",
    "PHB": "through a PCIe host bridge (the CPU's root complex)",
    "NODE": "between the PCIe host bridges of one NUMA node",
    "SYS": "between NUMA nodes (QPI/UPI, Infinity Fabric)",
}


def root_bus(dev: PciDevice) -> str:
    """The root bus (``0000:00``) the device hangs from: sysfs's ``pciDDDD:BB`` directory."""
    parts = dev.sysfs_path.split("/")
    for part in parts:
        if part.startswith("pci") and len(part) == len("pci0000:00"):
            return part[3:]
    return dev.address[:7]  # no such directory (a hand-made root): its own domain:bus


def path_to(facts: HostFacts, address: str) -> list[str]:
    """The bridges and ports from the root bus down to ``address`` (outermost first)."""
    path: list[str] = []
    seen = {address}
    parent = facts.pci[address].parent
    while parent is not None and parent in facts.pci and parent not in seen:  # a cycle in a hostile root ends
        path.append(parent)
        seen.add(parent)
        parent = facts.pci[parent].parent
    return path[::-1]


def port_role(facts: HostFacts, path: list[str], index: int) -> str:
    """What the bridge ``path[index]`` is, from where it sits.

    A PCIe port (driver pcieport) on a root bus is a root port; below a root port or a
    switch's downstream port, a port is a switch's upstream port, and below an upstream port
    a downstream port (switches cascade). A bridge without pcieport (a PCIe-to-PCI bridge,
    or a port whose driver is not shown) is a bridge.
    """
    if facts.pci[path[index]].driver != "pcieport":  # the kernel binds pcieport to every PCIe port
        return BRIDGE
    if index == 0:  # on a root bus, unless its own upstream device is missing from the listing
        return ROOT_PORT if facts.pci[path[0]].parent is None else BRIDGE
    above = port_role(facts, path, index - 1)
    if above in (ROOT_PORT, SWITCH_DOWN):
        return SWITCH_UP
    if above == SWITCH_UP:
        return SWITCH_DOWN
    return BRIDGE


def _device(dev: PciDevice) -> dict[str, Any]:
    return {
        "address": dev.address,
        "name": dev.name,
        "product_name": dev.product_name,
        "class_name": class_name(dev.class_code),
        "id": dev.id_pair,
        "driver": dev.driver,
        "iommu_group": dev.iommu_group,
    }


def verdict(a: GpuAssessment) -> str:
    """The GPU's verdict word (:data:`VERDICTS`)."""
    blockers = a.blockers
    if blockers:
        return UNKNOWN_VERDICT if all(f.code == UNKNOWN for f in blockers) else NOT_READY
    return WARNINGS if any(f.severity == WARNING for f in a.findings) else READY


def _members(facts: HostFacts, address: str) -> list[dict[str, Any]]:
    """The devices that go with the GPU: its slot's functions and its IOMMU group's members."""
    companions = set(companions_of(facts, address))
    others = (set(facts.group_members(address)) | companions) - {address}
    members = []
    for addr in sorted(others):
        dev = facts.pci.get(addr)
        if dev is None:  # a non-PCI group member (an mdev): not part of this picture
            continue
        if addr in companions:
            relation = COMPANION
        elif bridge_kind(facts, dev) is not None:
            relation = GROUP_BRIDGE
        else:
            relation = GROUP_MEMBER
        members.append({**_device(dev), "relation": relation})
    return members


def _gpu(facts: HostFacts, address: str, judged: GpuAssessment | None) -> dict[str, Any]:
    dev = facts.pci[address]
    members = _members(facts, address)
    # Group evidence that could not be read: the member list may be short (unknown, never "alone").
    unknown = [f.message for f in unknown_findings(facts, [address] + [m["address"] for m in members], rules=(GROUPS,))]
    return {
        "kind": "gpu",
        **_device(dev),
        "numa_node": dev.numa_node,
        "members": members,
        "unknown": unknown,
        "verdict": verdict(judged) if judged else UNKNOWN_VERDICT,
        "blockers": [f.message for f in judged.findings if f.severity == BLOCKER] if judged else [],
        "warnings": [f.message for f in judged.findings if f.severity == WARNING] if judged else [],
    }


def build_topology(
    facts: HostFacts,
    extra: list[str] | None = None,
    *,
    judged: list[GpuAssessment] | None = None,
    nvlinks: dict[frozenset[str], int] | None = None,
    nvlinks_from: str | None = None,
) -> dict[str, Any]:
    """The topology document: every GPU (and each device in ``extra``) under its NUMA node,
    root bus and the ports above it, with its verdict (``judged``: the assessments to show;
    by default :func:`gpuprov.rules.assess.assess` of the facts), and the GPUs' link matrix
    (``nvlinks``: NVLinks per pair of GPUs, known from ``nvlinks_from``)."""
    shown = sorted({a for a, d in facts.pci.items() if is_gpu(d)} | set(extra or ()))
    by_address = {a.address: a for a in (assess(facts, extra) if judged is None else judged)}
    nodes: dict[int | None, dict[str, dict[str, Any]]] = {}  # node -> root bus -> bus entry
    for address in shown:
        dev = facts.pci[address]
        bus = nodes.setdefault(dev.numa_node, {}).setdefault(root_bus(dev), {"bus": root_bus(dev), "children": []})
        level: list[dict[str, Any]] = bus["children"]
        path = path_to(facts, address)
        for index, port in enumerate(path):
            entry = next((e for e in level if e["kind"] == "port" and e["address"] == port), None)
            if entry is None:
                entry = {
                    "kind": "port",
                    **_device(facts.pci[port]),
                    "role": port_role(facts, path, index),
                    "children": [],
                }
                level.append(entry)
            level = entry["children"]
        level.append(_gpu(facts, address, by_address.get(address)))
    cpus = {n.node: n.cpulist for n in facts.numa}
    return {
        "schema": SCHEMA,
        "gpuprov_version": __version__,
        "root": facts.root,
        "gpu_count": len(shown),
        "numa_nodes": [
            {
                "node": node,
                "cpulist": cpus.get(node) if node is not None else None,
                "root_buses": [_sorted(buses[b]) for b in sorted(buses)],
            }
            for node, buses in sorted(nodes.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
        ],
        "link_matrix": link_matrix(facts, shown, nvlinks, nvlinks_from),
    }


def pcie_link(facts: HostFacts, a: str, b: str) -> str:
    """How the PCIe path between devices ``a`` and ``b`` runs, in nvidia-smi's words: PIX below
    one switch (their nearest common port has each at most one port further down), PXB below
    one root port through several switches, PHB through the root complex of one root bus, NODE
    between root buses of one NUMA node (or nodes not reported), SYS between NUMA nodes."""
    if a == b:
        return "X"
    da, db = facts.pci[a], facts.pci[b]
    if root_bus(da) != root_bus(db):
        nodes = (da.numa_node, db.numa_node)
        return "SYS" if None not in nodes and nodes[0] != nodes[1] else "NODE"
    pa, pb = path_to(facts, a), path_to(facts, b)
    common = 0
    while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
        common += 1
    if common == 0:
        return "PHB"
    return "PIX" if max(len(pa), len(pb)) - common <= 1 else "PXB"


def link_matrix(
    facts: HostFacts,
    gpus: list[str],
    nvlinks: dict[frozenset[str], int] | None = None,
    nvlinks_from: str | None = None,
) -> dict[str, Any]:
    """GPU-to-GPU links as ``nvidia-smi topo -m`` prints them: ``rows[i][j]`` is how GPU ``i``
    reaches GPU ``j`` (``NV18`` over 18 NVLinks, else the PCIe path: :func:`pcie_link`).
    NVLinks are not in sysfs: ``nvlinks_from`` says where their counts came from (NVML, a
    captured ``nvidia-smi topo -m``), ``None`` when they are not known (the PCIe path only)."""
    links = nvlinks or {}

    def cell(a: str, b: str) -> str:
        count = links.get(frozenset((a, b)), 0) if a != b else 0
        return f"NV{count}" if count else pcie_link(facts, a, b)

    return {
        "gpus": list(gpus),
        "rows": [[cell(a, b) for b in gpus] for a in gpus],
        "nvlinks_from": nvlinks_from,
    }


def parse_smi_topo(text: str, addresses: list[str]) -> dict[frozenset[str], int]:
    """NVLinks per pair of GPUs from ``nvidia-smi topo -m``'s matrix (``NV18``), its GPU ``i``
    being ``addresses[i]`` (nvidia-smi's index order); other cells are left to the facts."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    header: list[str] | None = None
    found: dict[frozenset[str], int] = {}
    for line in plain.splitlines():
        cells = [c.strip() for c in line.split("\t")]
        if header is None:
            if any(re.fullmatch(r"GPU\d+", c) for c in cells):
                header = [c for c in cells if c]  # the column names, past the rows' labels' empty one
            continue
        row = re.fullmatch(r"GPU(\d+)", cells[0]) if cells else None
        if row is None or int(row.group(1)) >= len(addresses):
            continue
        for column, value in zip(header, cells[1:]):
            col = re.fullmatch(r"GPU(\d+)", column)
            count = re.fullmatch(r"NV(\d+)", value)
            if col and count and int(col.group(1)) < len(addresses) and col.group(1) != row.group(1):
                pair = frozenset((addresses[int(row.group(1))], addresses[int(col.group(1))]))
                found[pair] = int(count.group(1))
    return found


def _sorted(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with its children (and theirs) in address order."""
    if "children" in entry:
        entry["children"] = sorted((_sorted(c) for c in entry["children"]), key=lambda c: c["address"])
    return entry


def gpus_in(document: dict[str, Any]) -> list[dict[str, Any]]:
    """Every GPU entry of a topology document, in drawing order."""
    found: list[dict[str, Any]] = []

    def walk(entries: list[dict[str, Any]]) -> None:
        for e in entries:
            if e["kind"] == "gpu":
                found.append(e)
            else:
                walk(e["children"])

    for node in document["numa_nodes"]:
        for bus in node["root_buses"]:
            walk(bus["children"])
    return found
