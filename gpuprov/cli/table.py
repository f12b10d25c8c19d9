"""The inspect report as tables for people (rich). Works from the JSON report
so both views show the same data.

Also the output helpers every table printer (inspect, verify, plan) uses, so
that no value from a host or a file is ever parsed as Rich markup or reaches
the terminal with its control characters (docs/output.md): the printers render
from :func:`gpuprov.cli.textsafe.safe_data` of their report, on :func:`make_console`,
into :class:`ValueTable`.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from .textsafe import safe_data, safe_text


def make_console() -> Console:
    """The console for tables: markup and emoji codes off (a ``[red]`` or ``:x:``
    in a value is shown as written); wide when piped, so logs do not wrap at 80."""
    console = Console(markup=False, emoji=False)
    if not console.is_terminal:
        console = Console(width=max(console.width, 160), markup=False, emoji=False)
    return console


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


_MARK = {"blocker": ("✗", "bold red"), "warning": ("!", "yellow"), "info": ("·", "dim")}


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


def _gpu_table(report: dict[str, Any]) -> ValueTable:
    table = ValueTable(title="GPUs", title_justify="left", expand=False)
    for col in ("Address", "Device", "Driver", "Group", "NUMA", "Link", "Reset", "Verdict"):
        table.add_column(col, overflow="fold")
    for gpu in report["gpus"]:
        verdict = Text("ready", "green") if gpu["ready"] else Text("not ready", "bold red")
        if gpu.get("intended_use"):  # with a declaration: the verdict is for the declared use
            verdict = Text.assemble(f"{gpu['intended_use']}: ", verdict)
        if gpu.get("state"):
            verdict.append(f"\n{gpu['state']}", "cyan")
        reset = "unknown" if gpu["reset_methods"] is None else " ".join(gpu["reset_methods"]) or "none"
        ids = f"[{gpu['vendor_device']}]"
        table.add_row(
            gpu["address"],
            gpu["name"] if gpu["name"] == ids else f"{gpu['name']} {ids}",
            gpu["driver"] or "-",
            gpu["iommu_group"] or "-",
            "-" if gpu["numa_node"] is None else str(gpu["numa_node"]),
            gpu["link"],
            reset,
            verdict,
        )
    return table


def _findings(gpu: dict[str, Any]) -> list[Text]:
    lines = [Text(f"{gpu['address']} {gpu['name']}:", "bold")]
    if gpu.get("declared_as"):
        lines.append(Text(f"  declared by {gpu['declared_as']}, use: {gpu['intended_use']}"))
    for f in gpu["findings"]:
        mark, style = _MARK.get(f["severity"], ("?", ""))
        line = Text.assemble(f"  {mark} ", (f["severity"], style), f": {f['message']}")
        if f.get("fix"):
            line.append(f"\n      fix: {f['fix']}", "cyan")
        lines.append(line)
    vgpu = gpu.get("vgpu") or {}
    for mtype in vgpu.get("mdev_types", []):
        lines += _mdev_type_lines(mtype, "  vGPU mdev type")
    if "sriov" in vgpu:
        s = vgpu["sriov"]
        lines.append(Text(f"  SR-IOV: {s['enabled_vfs']}/{s['total_vfs']} VFs enabled"))
    if "sriov_vgpu" in vgpu:
        v = vgpu["sriov_vgpu"]
        types = ", ".join(v["creatable_types"].values()) or "none creatable now"
        free = f", {v['vfs_free']} free" if "vfs_free" in v else ""
        lines.append(Text(f"  SR-IOV vGPU: {v['vfs_in_use']}/{v['vfs']} VFs have a type{free}; creatable: {types}"))
        for inst in v.get("instances", []):
            lines.append(Text(f"    VF {inst['vf']}: type {inst['type']} ({inst['name'] or 'name not shown'})"))
    return lines


def _mdev_type_lines(mtype: dict[str, Any], label: str) -> list[Text]:
    """One line per mdev type (free capacity, instances), then one per instance."""
    type_id = mtype.get("type") or mtype.get("type_id")
    lines = [
        Text(
            f"{label} {type_id} '{mtype['name']}': "
            f"{mtype['available_instances']} available, {len(mtype['instances'])} created"
        )
    ]
    lines += [Text(f"{' ' * (len(label) - len(label.lstrip()) + 2)}mdev {uuid}") for uuid in mtype["instances"]]
    return lines


def _other_mdev_parents(report: dict[str, Any]) -> list[Text]:
    """mdev parents that are not GPUs (the kernel's mtty sample, other vendors' devices)."""
    gpus = {g["address"] for g in report["gpus"]}
    lines: list[Text] = []
    for parent in report["mdev"]["parents"]:
        if parent["parent"] in gpus:
            continue
        lines.append(Text(f"mdev parent {parent['parent']}:", "bold"))
        for mtype in parent["types"]:
            lines += _mdev_type_lines(mtype, "  mdev type")
    return lines


def _all_devices(report: dict[str, Any]) -> list[ValueTable]:
    devices = ValueTable(title="PCI devices", title_justify="left")
    for col in ("Address", "Class", "Ids", "Name", "Driver", "Group", "Link"):
        devices.add_column(col, overflow="fold")
    for d in report["pci_devices"]:
        link = d["link"]
        speed = "-" if link["current_speed"] is None else f"{link['current_speed']:g} GT/s x{link['current_width']}"
        name = " ".join(n for n in (d["vendor_name"], d["device_name"]) if n) or "-"
        devices.add_row(
            d["address"],
            d["class"] or "?",
            f"{d['vendor_id']}:{d['device_id']}",
            name,
            d["driver"] or "-",
            d["iommu_group"] or "-",
            speed,
        )
    groups = ValueTable(title="IOMMU groups", title_justify="left")
    groups.add_column("Group")
    groups.add_column("Type")
    groups.add_column("Devices", overflow="fold")
    for g in report["iommu"]["groups"]:
        groups.add_row(g["number"], g["type"] or "-", " ".join(g["devices"]))
    return [devices, groups]


def print_report(report: dict[str, Any], *, show_all: bool = False, console: Console | None = None) -> None:
    report = safe_data(report)
    if console is None:
        console = make_console()
    for line in _host_lines(report):
        console.print(line)
    console.print()
    if report["gpus"]:
        console.print(_gpu_table(report))
        for gpu in report["gpus"]:
            for line in _findings(gpu):
                console.print(line)
    else:
        console.print(
            Text(
                "No GPUs here: no display-class (0x03xx) PCI devices. "
                "Name a device with --device ADDR to assess it anyway."
            )
        )
    other = _other_mdev_parents(report)
    if other:
        console.print()
        for line in other:
            console.print(line)
    if show_all:
        console.print()
        for table in _all_devices(report):
            console.print(table)
    s = report["summary"]
    console.print(Text(f"\n{s['gpus']} GPU(s): {s['ready']} ready, {s['not_ready']} not ready"))
