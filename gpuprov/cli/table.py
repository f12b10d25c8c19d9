"""The inspect report as tables for people (rich). Works from the JSON report
so both views show the same data.

Also the output helpers every table printer (inspect, verify, plan) uses, so
that no value from a host or a file is ever parsed as Rich markup or reaches
the terminal with its control characters (docs/output.md): the printers render
from :func:`gpuprov.cli.textsafe.safe_data` of their report, on :func:`make_console`,
into :class:`ValueTable`.

The layout fits 80 columns (docs/output.md, "Width"): an address or a verdict is never
split, a line that wraps goes on indented under its start (:class:`Hanging`, the findings'
grid), and a blocker that holds for every GPU (the IOMMU is off) is said once, before the
GPUs' own findings.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.padding import Padding
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from .textsafe import safe_data, safe_text

PIPE_WIDTH = 160  # piped with no COLUMNS: logs do not wrap at 80
MIN_WIDTH = 40  # below this nothing is readable; COLUMNS=10 gets 40


def _columns() -> int | None:
    """``COLUMNS`` when it is a positive number."""
    value = os.environ.get("COLUMNS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def no_color() -> bool:
    """``NO_COLOR`` set and not empty (no-color.org): no colour, nor any other style."""
    return bool(os.environ.get("NO_COLOR"))


def make_console() -> Console:
    """The console for tables: markup and emoji codes off (a ``[red]`` or ``:x:``
    in a value is shown as written); ``COLUMNS`` wide when set, on a terminal or piped
    (piped without it: 160, so logs do not wrap at 80); with ``NO_COLOR`` no styles at all."""
    plain = {"color_system": None, "no_color": True} if no_color() else {}
    console = Console(markup=False, emoji=False, **plain)  # type: ignore[arg-type]
    columns = _columns()
    width = columns if columns is not None else console.width if console.is_terminal else PIPE_WIDTH
    if width != console.width or width < MIN_WIDTH:
        console = Console(width=max(width, MIN_WIDTH), markup=False, emoji=False, **plain)  # type: ignore[arg-type]
    return console


# Spaces at the end of a line, before any colour codes that close it.
_TRAILING = re.compile(r"[ ]+((?:\x1b\[[0-9;]*m)*)$", re.M)


def print_trimmed(console: Console, renderables: Iterable[RenderableType]) -> None:
    """Print each renderable without the spaces Rich pads lines with to its column widths
    (a log or a diff of the output has no trailing blanks)."""
    with console.capture() as captured:
        for renderable in renderables:
            console.print(renderable)
    console.file.write(_TRAILING.sub(r"\1", captured.get()))
    console.file.flush()


def _literal(value: RenderableType | None) -> RenderableType | None:
    """A ``str`` as literal text (control characters escaped); a Text or other renderable as is."""
    return Text(safe_text(value, keep_newlines=True)) if isinstance(value, str) else value


class ValueTable(Table):
    """A Table whose string title and cells are literal text: never Rich markup,
    never a raw control character, whatever console renders it."""

    def __init__(self, *headers: Any, title: str | Text | None = None, **kwargs: Any) -> None:
        super().__init__(*headers, title=_literal(title), **kwargs)  # type: ignore[arg-type]

    def add_row(self, *renderables: RenderableType | None, **kwargs: Any) -> None:
        super().add_row(*(_literal(r) for r in renderables), **kwargs)


def compact_table(title: str) -> ValueTable:
    """A table for 80 columns: a rule under the header, one space between columns, no frame."""
    return ValueTable(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )


def fitted(
    console: Console, title: str, columns: list[str], rows: list[list[Any]], *, whole: tuple[str, ...] = ()
) -> list[RenderableType]:
    """A table of ``rows`` when it fits the console with the ``whole`` columns (addresses, names, ids)
    and every word unbroken; else one record per row, stacked (``column: value`` under the row's
    first value), so at 60 or 80 columns nothing is split mid-word (docs/output.md, "Width")."""
    from rich.measure import Measurement

    table = ValueTable(title=title, title_justify="left")
    for column in columns:
        table.add_column(column, no_wrap=column in whole, overflow="fold")
    for row in rows:
        table.add_row(*row)
    wide = console.options.update(max_width=100_000)  # Rich clamps a measure to the width it is given
    if Measurement.get(console, wide, table).minimum <= console.options.max_width:
        return [table]
    out: list[RenderableType] = [Text(safe_text(title), style="bold")]
    for row in rows:
        for i, (column, cell) in enumerate(zip(columns, row)):
            text = cell if isinstance(cell, Text) else Text(safe_text("" if cell is None else cell))
            if i and not text.plain.strip():
                continue
            joined = Text("; ").join(text.split("\n"))  # a cell's own lines: one record line each
            lead = f"  {column}: " if i else (f"{column} " if column else "")
            out.append(Hanging(Text(lead) + joined, 4))
    return out


class Hanging:
    """Text wrapped to the width it is drawn at, each line after the first indented ``indent``
    cells past the first line's own indent (a fix under its finding, never from column 0)."""

    def __init__(self, text: Text | str, indent: int = 4) -> None:
        self.text = Text(safe_text(text)) if isinstance(text, str) else text
        self.indent = indent

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        plain = self.text.plain
        hang = len(plain) - len(plain.lstrip(" ")) + self.indent
        lines = self.text.wrap(console, max(options.max_width - hang, 8), overflow="fold")
        for i, line in enumerate(lines):
            line.rstrip()
            if i:
                line = Text(" " * hang) + line
            yield from line.render(console)
            yield Segment.line()


_MARK = {"blocker": ("✗", "bold red"), "warning": ("!", "yellow"), "info": ("·", "dim")}
# Findings about the host, not a GPU: when every GPU has the same one it is said once.
HOST_WIDE_CODES = ("iommu-off", "no-interrupt-remapping")


def _host_lines(report: dict[str, Any]) -> list[Text]:
    host, iommu = report["host"], report["iommu"]
    lines = [Text(f"Host: {host['os'] or 'unknown OS'}, kernel {host['kernel'] or '?'} (root {host['root']})")]
    if iommu["enabled"]:
        detail = ", ".join(iommu["units"]) or "units not shown"
        mode = {True: "passthrough (iommu=pt)", False: "translated", None: "mode unknown"}[iommu["passthrough"]]
        lines.append(
            Text.assemble(
                ("IOMMU: on", "green"),
                f" ({iommu['vendor'] or '?'}: {detail}; {len(iommu['groups'])} groups; {mode}; "
                f"interrupt remapping {iommu['interrupt_remapping']})",
            )
        )
    else:
        lines.append(Text.assemble(("IOMMU: off", "bold red"), " (no /sys/class/iommu units, no groups)"))
    args = " ".join(k if v is None else f"{k}={v}" for k, v in iommu["args"].items()) or "none"
    lines.append(Text(f"Kernel IOMMU/vfio args: {args}"))
    mods = ", ".join(f"{k} ({v})" for k, v in iommu["modules"].items()) or "none loaded"
    lines.append(Text(f"vfio/kvm modules: {mods}"))
    return lines


def shown_name(entry: dict[str, Any]) -> str:
    """What people call the device: its driver's product name (nvidia-smi's), else the hwdb's
    or pci.ids' vendor and device name, else its ids (gpuprov.facts.names)."""
    return entry.get("product_name") or entry["name"]


def _verdict(gpu: dict[str, Any]) -> Text:
    """``ready`` / ``not ready``, after the declared use on a line of its own, the state below."""
    verdict = Text("ready", "green") if gpu["ready"] else Text("not ready", "bold red")
    if gpu.get("intended_use"):  # with a declaration: the verdict is for the declared use
        verdict = Text.assemble(f"{gpu['intended_use']}:\n", verdict)
    if gpu.get("state"):
        verdict.append(f"\n{gpu['state']}", "cyan")
    return verdict


def _gpu_table(report: dict[str, Any]) -> ValueTable:
    """One row per GPU: its address, name and facts (driver, group, node, link, reset) and verdict."""
    table = compact_table("GPUs")
    table.add_column("Address", no_wrap=True)
    table.add_column("Device", overflow="fold")
    # Its longest line fits unbroken: "not ready", "not declared:", "in use by VM" and a word.
    longest = max((len(w) for g in report["gpus"] for w in _verdict(g).plain.split("\n")), default=9)
    table.add_column("Verdict", overflow="fold", min_width=min(max(longest, 9), 24))
    for gpu in report["gpus"]:
        reset = "unknown" if gpu["reset_methods"] is None else " ".join(gpu["reset_methods"]) or "none"
        numa = "NUMA ?" if gpu["numa_node"] is None else f"NUMA node {gpu['numa_node']}"
        group = "no IOMMU group" if gpu["iommu_group"] is None else f"group {gpu['iommu_group']}"
        link = gpu["link"] if gpu["link"].startswith("no ") else f"link {gpu['link']}"
        ids = f"[{gpu['vendor_device']}]"
        name = shown_name(gpu)
        device = Text(name if name == ids else f"{name} {ids}")
        device.append(f"\n{gpu['driver'] or 'no driver'}, {group}, {numa}, {link}, reset {reset}", "dim")
        table.add_row(gpu["address"], device, _verdict(gpu))
    return table


def _finding_key(f: dict[str, Any]) -> tuple[Any, ...]:
    return (f["code"], f["severity"], f["message"], f.get("fix"), f.get("device"))


def host_wide(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings every GPU has that are about the host (the IOMMU off, no interrupt
    remapping; with two GPUs or more, the same unreadable evidence): said once."""
    if not gpus:
        return []
    common = set.intersection(*({_finding_key(f) for f in g["findings"]} for g in gpus))
    return [
        f
        for f in gpus[0]["findings"]
        if _finding_key(f) in common
        and (f["code"] in HOST_WIDE_CODES or (len(gpus) > 1 and f["code"] == "unknown" and not f.get("device")))
    ]


def _findings_grid(findings: Iterable[dict[str, Any]]) -> Table | None:
    """Each finding on a row of its own: mark, severity, message; its fix on the row below.
    Text wraps inside its column, so a continuation line starts under the text above it."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    listed = list(findings)
    for i, f in enumerate(listed):
        mark, style = _MARK.get(f["severity"], ("?", ""))
        grid.add_row(Text(mark, style), Text(f"{f['severity']}:", style), Text(f["message"]))
        after = listed[i + 1] if i + 1 < len(listed) else None
        # One fix for a run of findings that share it (each unreadable file of a short capture).
        if f.get("fix") and not (after and (after["severity"], after.get("fix")) == (f["severity"], f["fix"])):
            shared = i > 0 and (listed[i - 1]["severity"], listed[i - 1].get("fix")) == (f["severity"], f["fix"])
            grid.add_row("", Text("fix:", "cyan"), Text(("(each above) " if shared else "") + f["fix"], "cyan"))
    return grid if listed else None


def _gpu_lines(gpu: dict[str, Any], skip: list[dict[str, Any]]) -> list[RenderableType]:
    """The GPU's own findings (those said for the host already left out) and its vGPU state."""
    own = [f for f in gpu["findings"] if _finding_key(f) not in {_finding_key(s) for s in skip}]
    title = Text(f"{gpu['address']} {shown_name(gpu)}", "bold")
    if gpu.get("product_name") and gpu["name"] != f"[{gpu['vendor_device']}]":
        title.append(f" ({gpu['name']})")  # the hwdb's name beside the driver's: the board (SXM, PCIe)
    if gpu.get("class_name"):
        title.append(f", {gpu['class_name']}")
    lines: list[RenderableType] = []
    if gpu.get("declared_as"):
        lines.append(Hanging(Text(f"  declared by {gpu['declared_as']}, use: {gpu['intended_use']}")))
    grid = _findings_grid(own)
    if grid is not None:
        lines.append(Padding(grid, (0, 0, 0, 2)))
    vgpu = gpu.get("vgpu") or {}
    for mtype in vgpu.get("mdev_types", []):
        lines += _mdev_type_lines(mtype, "  vGPU mdev type")
    if "sriov" in vgpu:
        s = vgpu["sriov"]
        lines.append(Hanging(Text(f"  SR-IOV: {s['enabled_vfs']}/{s['total_vfs']} VFs enabled")))
    if "sriov_vgpu" in vgpu:
        v = vgpu["sriov_vgpu"]
        types = ", ".join(v["creatable_types"].values()) or "none creatable now"
        free = f", {v['vfs_free']} free" if "vfs_free" in v else ""
        lines.append(
            Hanging(Text(f"  SR-IOV vGPU: {v['vfs_in_use']}/{v['vfs']} VFs have a type{free}; creatable: {types}"))
        )
        for inst in v.get("instances", []):
            name = inst["name"] or "name not shown"
            lines.append(Hanging(Text(f"    VF {inst['vf']}: type {inst['type']} ({name})")))
    return [Hanging(title), *lines] if lines else []


def _mdev_type_lines(mtype: dict[str, Any], label: str) -> list[RenderableType]:
    """One line per mdev type (free capacity, instances), then one per instance."""
    type_id = mtype.get("type") or mtype.get("type_id")
    lines: list[RenderableType] = [
        Hanging(
            Text(
                f"{label} {type_id} '{mtype['name']}': "
                f"{mtype['available_instances']} available, {len(mtype['instances'])} created"
            )
        )
    ]
    lines += [Text(f"{' ' * (len(label) - len(label.lstrip()) + 2)}mdev {uuid}") for uuid in mtype["instances"]]
    return lines


def _other_mdev_parents(report: dict[str, Any]) -> list[RenderableType]:
    """mdev parents that are not GPUs (the kernel's mtty sample, other vendors' devices)."""
    gpus = {g["address"] for g in report["gpus"]}
    lines: list[RenderableType] = []
    for parent in report["mdev"]["parents"]:
        if parent["parent"] in gpus:
            continue
        lines.append(Hanging(Text(f"mdev parent {parent['parent']}:", "bold")))
        for mtype in parent["types"]:
            lines += _mdev_type_lines(mtype, "  mdev type")
    return lines


def _all_devices(report: dict[str, Any]) -> list[ValueTable]:
    """Every PCI device, as lspci names it (class: vendor device [ids]), and every IOMMU group."""
    devices = compact_table("PCI devices")
    devices.add_column("Address", no_wrap=True)
    devices.add_column("Device", overflow="fold")
    devices.add_column("Driver", overflow="fold")
    devices.add_column("Group", overflow="fold")
    devices.add_column("Link", overflow="fold")
    for d in report["pci_devices"]:
        link = d["link"]
        speed = "-" if link["current_speed"] is None else f"{link['current_speed']:g} GT/s x{link['current_width']}"
        ids = f"{d['vendor_id']}:{d['device_id']}"
        name = " ".join(n for n in (d["vendor_name"], d["device_name"]) if n)
        if d["vendor_name"] and not d["device_name"]:
            name += f" Device {d['device_id']}"  # never the vendor's name alone (as lspci)
        if d.get("product_name"):
            name = f"{d['product_name']} ({name})" if name else d["product_name"]
        kind = d.get("class_name") or (f"class {d['class']}" if d["class"] else "class ?")
        devices.add_row(
            d["address"],
            f"{kind}: {name} [{ids}]" if name else f"{kind} [{ids}]",
            d["driver"] or "-",
            d["iommu_group"] or "-",
            speed,
        )
    groups = compact_table("IOMMU groups")
    groups.add_column("Group", no_wrap=True)
    groups.add_column("Type", overflow="fold")
    groups.add_column("Devices", overflow="fold")
    for g in report["iommu"]["groups"]:
        groups.add_row(g["number"], g["type"] or "-", " ".join(g["devices"]))
    return [devices, groups]


def print_report(report: dict[str, Any], *, show_all: bool = False, console: Console | None = None) -> None:
    print_trimmed(console or make_console(), report_lines(report, show_all=show_all))


def report_lines(report: dict[str, Any], *, show_all: bool = False) -> list[RenderableType]:
    """The inspect report for people, as what to print one after the other."""
    report = safe_data(report)
    out: list[RenderableType] = [Hanging(line) for line in _host_lines(report)]
    out.append("")
    if report["gpus"]:
        out.append(_gpu_table(report))
        shared = host_wide(report["gpus"])
        grid = _findings_grid(shared)
        if grid is not None:
            every = "the GPU" if len(report["gpus"]) == 1 else f"all {len(report['gpus'])} GPUs"
            out += ["", Hanging(Text(f"Host-wide, for {every}:", "bold")), Padding(grid, (0, 0, 0, 2))]
        for gpu in report["gpus"]:
            lines = _gpu_lines(gpu, shared)
            out += ["", *lines] if lines else []
    else:
        out.append(
            Hanging(
                Text(
                    "No GPUs here: no display-class (0x03xx) PCI devices. "
                    "Name a device with --device ADDR to assess it anyway."
                )
            )
        )
    other = _other_mdev_parents(report)
    if other:
        out += ["", *other]
    if show_all:
        for table in _all_devices(report):
            out += ["", table]
    s = report["summary"]
    out.append(Text(f"\n{s['gpus']} GPU(s): {s['ready']} ready, {s['not_ready']} not ready"))
    return out
