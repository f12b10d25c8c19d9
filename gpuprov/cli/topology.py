"""``gpuprov topology``: where each GPU sits (NUMA node, root port, switch), what goes with it,
its verdict, and how the GPUs reach each other.

    gpuprov topology                              # this host, as a tree
    gpuprov topology --root host.tar.gz --html topology.html
    gpuprov topology --html - > topology.html     # "-": the picture on stdout
    gpuprov topology --json                       # schema gpuprov.topology/v1

The document is :mod:`gpuprov.report.topology`; the SVG and HTML pictures are
:mod:`gpuprov.cli.topology_svg`. Each GPU is judged as ``gpuprov inspect`` judges it (no
declaration); the link matrix takes NVLinks from NVML on a live host (when the pynvml module is
there) or a capture's ``nvidia-smi topo -m``. Read-only. docs/guides/passthrough.md, "Topology".
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# What each relation of a device to its GPU means, for people.
from .topology_labels import (
    RELATION_TEXT,
    device_label,
    gpu_column,
    gpu_details,
    matrix_title,
    node_title,
    verdict_line,
)

STDOUT = "-"
# The captured `nvidia-smi topo -m` (older captures hold it; tests/fixtures/hosts/README.md).
SMI_TOPO_CAPTURE = "capture/nvidia-smi-topo"
# The tree's style for each verdict (the picture's colours: topology_svg.VERDICT_COLOURS).
VERDICT_STYLE = {
    "ready": "bold green",
    "ready, with warnings": "bold yellow",
    "unknown": "bold magenta",
    "not ready": "bold red",
}


def print_topology(document: dict[str, Any], console: Any = None) -> None:
    from rich.text import Text
    from rich.tree import Tree

    from .table import Hanging, make_console, print_trimmed
    from .textsafe import safe_data

    doc = safe_data(document)  # every value escaped before it is laid out (docs/output.md)
    console = console or make_console()
    count = doc["gpu_count"]
    top = Tree(Text(f"PCI topology of {doc['root']}: {count} GPU{'s' * (count != 1)}", "bold"))

    def add(branch: Tree, entries: list[dict[str, Any]]) -> None:
        for e in entries:
            if e["kind"] == "port":
                group = "" if e["iommu_group"] is None else f", group {e['iommu_group']}"
                label = Text.assemble((e["role"], "cyan"), f" {device_label(e)} ({e['driver'] or 'no driver'}{group})")
                add(branch.add(label), e["children"])
                continue
            style = VERDICT_STYLE.get(e.get("verdict") or "unknown", "bold")
            gpu = branch.add(Text.assemble(("GPU", style), f" {device_label(e)}, {gpu_details(e)}"))
            gpu.add(Text(verdict_line(e), style))
            for m in e["members"]:
                style = (
                    "yellow" if m["relation"] == "companion" else "red" if m["relation"] == "group member" else "dim"
                )
                gpu.add(
                    Text.assemble(
                        (RELATION_TEXT[m["relation"]], style), f" {device_label(m)} ({m['driver'] or 'no driver'})"
                    )
                )
            for message in e["unknown"]:
                gpu.add(Text(message, "bold red"))

    for node in doc["numa_nodes"]:
        branch = top.add(Text(node_title(node), "bold"))
        for bus in node["root_buses"]:
            add(branch.add(Text(f"root bus {bus['bus']}")), bus["children"])
    if not doc["numa_nodes"]:
        top.add(Text("no GPU found (display class 0x03); --device ADDR shows another device as one", "dim"))
    out: list[Any] = [top]
    matrix = doc.get("link_matrix") or {}
    if len(matrix.get("gpus", [])) > 1:
        out += ["", Hanging(Text(matrix_title(matrix), "bold")), matrix_table(matrix)]
        used = {c for row in matrix["rows"] for c in row}
        out += [Hanging(Text(f"  {word:<4} {meaning}")) for word, meaning in _legend(used)]
    print_trimmed(console, out)


def _legend(used: set[str]) -> list[tuple[str, str]]:
    """The words of the matrix that it uses, with what each means."""
    from ..report.topology import LINKS

    return [
        (word, meaning)
        for word, meaning in LINKS.items()
        if word in used or (word == "NV#" and any(c.startswith("NV") for c in used))
    ]


def matrix_table(matrix: dict[str, Any]) -> Any:
    """The link matrix as a table: a row per GPU (its index and address), a column per GPU."""
    from .table import compact_table

    table = compact_table("")
    table.title = None
    table.add_column("", no_wrap=True)
    for i in range(len(matrix["gpus"])):
        table.add_column(gpu_column(i), no_wrap=True)
    for i, (address, row) in enumerate(zip(matrix["gpus"], matrix["rows"])):
        table.add_row(f"{gpu_column(i)} {address}", *row)
    return table


def _nvlinks(root: str, facts: Any) -> tuple[dict[frozenset[str], int] | None, str | None]:
    """NVLinks per pair of GPUs, and where they came from: NVML on the live host, else a
    captured ``nvidia-smi topo -m``; ``(None, None)`` when neither is there."""
    from ..facts.sysfs import Sysfs

    sysfs = Sysfs(root)
    if sysfs.live:
        return _nvml_links()
    text = sysfs.read(SMI_TOPO_CAPTURE)
    if not text:
        return None, None
    from ..facts.gpus import SMI_CAPTURE, GpuQueryError, parse_smi_xml
    from ..report.topology import parse_smi_topo

    order = sorted(a for a, d in facts.pci.items() if d.vendor_id == 0x10DE and d.base_class == 0x03)
    xml = sysfs.read(SMI_CAPTURE)
    try:  # nvidia-smi's own index order, where its XML was captured too
        listed = [g.address for g in parse_smi_xml(xml).gpus] if xml else []
    except (GpuQueryError, ValueError, RecursionError):
        listed = []
    if listed and all(listed):
        order = [a for a in listed if a]
    return parse_smi_topo(text, order), f"the captured nvidia-smi topo -m ({SMI_TOPO_CAPTURE})"


def _nvml_links() -> tuple[dict[frozenset[str], int] | None, str | None]:
    """Active NVLinks per pair of GPUs from NVML (the pynvml module), when it is importable."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: nvidia-ml-py
    except ImportError:
        return None, None
    from ..facts.gpus import GpuQueryError, from_nvml
    from ..facts.multigpu import read_nvml_probe

    try:
        gpus = from_nvml(pynvml).gpus
        probe, _pairs, error = read_nvml_probe(pynvml, len(gpus))
    except (GpuQueryError, OSError):
        return None, None
    if error is not None:
        return None, None
    direct: dict[tuple[str, str], int] = {}  # (GPU, the GPU its links reach) -> active links
    switched: dict[str, int] = {}  # GPU -> active links to an NVSwitch
    for gpu in gpus:
        for link in (probe.get(gpu.index) or {}).get("nvlinks", []):
            remote = link.get("remote_address")
            if not (link.get("active") and gpu.address):
                continue
            if link.get("remote_type") == "gpu" and remote:
                direct[(gpu.address, remote)] = direct.get((gpu.address, remote), 0) + 1
            elif link.get("remote_type") == "switch":
                switched[gpu.address] = switched.get(gpu.address, 0) + 1
    links: dict[frozenset[str], int] = {}
    for (a, b), count in direct.items():  # each link is seen from both of its ends
        links[frozenset((a, b))] = max(count, direct.get((b, a), 0))
    for a in switched:  # through NVSwitches every GPU reaches every other (nvidia-smi: NV18 on an HGX)
        for b in switched:
            if a < b:
                pair = frozenset((a, b))
                links[pair] = links.get(pair, 0) + min(switched[a], switched[b])
    return links, "NVML"


def cmd_topology(args: argparse.Namespace) -> int:
    from ..facts.domains import read_running
    from ..facts.host import gather
    from ..facts.sysfs import Sysfs
    from ..report import write_json
    from ..report.topology import build_topology
    from ..rules.assess import assess
    from ..rules.intent import in_use_by_vm
    from .common import EXIT_OK, UsageError, addresses, host_root

    extra = addresses(args.device, "--device")
    picture = args.svg or args.html
    if args.json and picture == STDOUT:
        raise UsageError(f"--json and --{'svg' if args.svg else 'html'} - both write to stdout: name a FILE for one")
    with host_root(args.root) as root:
        sysfs = Sysfs(root)
        facts = gather(sysfs)
        running = read_running(sysfs)
        nvlinks, nvlinks_from = _nvlinks(root, facts)
    missing = [a for a in extra if a not in facts.pci]
    if missing:
        raise UsageError(
            f"--device: no PCI device {', '.join(missing)} on this host: check the address with `lspci -D` "
            f"(this host has {len(facts.pci)} PCI devices)"
        )
    judged = assess(facts, extra)
    for gpu in judged:  # as inspect judges them without a declaration
        in_use_by_vm(gpu, running)
    document = build_topology(facts, extra, judged=judged, nvlinks=nvlinks, nvlinks_from=nvlinks_from)
    document["root"] = args.root
    if picture:
        from .textsafe import safe_text
        from .topology_svg import render_html, render_svg

        text = render_svg(document) if args.svg else render_html(document)
        if picture == STDOUT:
            sys.stdout.write(text)
            sys.stdout.flush()
            return EXIT_OK
        try:
            with open(picture, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {picture}: {exc.strerror}; give a path in a writable directory") from None
    if args.json:
        write_json(document, sys.stdout, compact=args.compact)
    elif picture:
        count = document["gpu_count"]
        print(f"wrote {safe_text(picture)}: {count} GPU{'s' * (count != 1)}")
    else:
        print_topology(document)
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov topology``."""
    from .common import add_json_arguments

    p = sub.add_parser(
        "topology",
        help="show where each GPU sits: NUMA node, root port, switch, IOMMU group, companions, verdict "
        "and GPU-to-GPU links (read-only)",
        description="Draw the host's PCI topology around its GPUs: NUMA node -> root bus -> root port -> "
        "switch ports -> GPU, with each GPU's driver, IOMMU group, the devices that go with it (the "
        "functions of its slot and the other members of its group) and its verdict as inspect gives it, "
        "then the GPUs' link matrix as nvidia-smi topo -m prints it. A tree on the terminal, or an SVG or "
        "HTML picture. Read-only; runs as a normal user.",
    )
    p.add_argument("--root", default="/", help="read this root (an unpacked capture, or its .tar.gz) instead of /")
    picture = p.add_mutually_exclusive_group()
    picture.add_argument("--svg", metavar="FILE", help="write the picture as SVG to FILE ('-': to stdout)")
    picture.add_argument(
        "--html", metavar="FILE", help="write the picture as a small HTML page to FILE ('-': to stdout)"
    )
    add_json_arguments(p, "the topology", "gpuprov.topology/v1")
    p.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="ADDR",
        help="show this PCI device as a GPU too, whatever its class (repeatable)",
    )
    p.set_defaults(func=cmd_topology)
