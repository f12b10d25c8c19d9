"""``gpuprov topology``: where each GPU sits (NUMA node, root port, switch) and what goes with it.

    gpuprov topology                              # this host, as a tree
    gpuprov topology --root host.tar.gz --html topology.html
    gpuprov topology --json                       # schema gpuprov.topology/v1

The document is :mod:`gpuprov.report.topology`; the SVG and HTML pictures are
:mod:`gpuprov.cli.topology_svg`. Read-only. docs/guides/passthrough.md, "Topology".
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# What each relation of a device to its GPU means, for people.
from .topology_labels import RELATION_TEXT, device_label, gpu_details, node_title


def print_topology(document: dict[str, Any], console: Any = None) -> None:
    from rich.text import Text
    from rich.tree import Tree

    from .table import make_console
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
            gpu = branch.add(Text.assemble(("GPU", "bold green"), f" {device_label(e)}, {gpu_details(e)}"))
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
    console.print(top)


def cmd_topology(args: argparse.Namespace) -> int:
    from ..facts.host import gather
    from ..facts.sysfs import Sysfs
    from ..report import write_json
    from ..report.topology import build_topology
    from .common import EXIT_OK, UsageError, addresses, host_root

    extra = addresses(args.device, "--device")
    with host_root(args.root) as root:
        facts = gather(Sysfs(root))
    missing = [a for a in extra if a not in facts.pci]
    if missing:
        raise UsageError(
            f"--device: no PCI device {', '.join(missing)} on this host: check the address with `lspci -D` "
            f"(this host has {len(facts.pci)} PCI devices)"
        )
    document = build_topology(facts, extra)
    document["root"] = args.root
    picture = args.svg or args.html
    if picture:
        from .textsafe import safe_text
        from .topology_svg import render_html, render_svg

        text = render_svg(document) if args.svg else render_html(document)
        try:
            with open(picture, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            raise UsageError(f"cannot write {picture}: {exc.strerror}; give a path in a writable directory") from None
    if args.json:
        write_json(document, sys.stdout)
    elif picture:
        count = document["gpu_count"]
        print(f"wrote {safe_text(picture)}: {count} GPU{'s' * (count != 1)}")
    else:
        print_topology(document)
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov topology``."""
    p = sub.add_parser(
        "topology",
        help="show where each GPU sits: NUMA node, root port, switch, IOMMU group and companions (read-only)",
        description="Draw the host's PCI topology around its GPUs: NUMA node -> root bus -> root port -> "
        "switch ports -> GPU, with each GPU's driver, IOMMU group and the devices that go with it (the "
        "functions of its slot and the other members of its group). A tree on the terminal, or an SVG or "
        "HTML picture. Read-only; runs as a normal user.",
    )
    p.add_argument("--root", default="/", help="read this root (an unpacked capture, or its .tar.gz) instead of /")
    picture = p.add_mutually_exclusive_group()
    picture.add_argument("--svg", metavar="FILE", help="write the picture as SVG to FILE")
    picture.add_argument("--html", metavar="FILE", help="write the picture as a small HTML page to FILE")
    p.add_argument("--json", action="store_true", help="print the topology as JSON (schema gpuprov.topology/v1)")
    p.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="ADDR",
        help="show this PCI device as a GPU too, whatever its class (repeatable)",
    )
    p.set_defaults(func=cmd_topology)
