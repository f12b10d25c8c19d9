"""``gpuprov verify`` on the command line: the options, and the report as tables.

The checks are :mod:`gpuprov.verify.checks`; the report is plain data from
:mod:`gpuprov.report.verify` (schema ``gpuprov.verify/v1``, docs/reference/verify-json.md).
Exit 0 when no check fails, 1 when one does, 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..facts.pci import PciLink

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

_STYLE = {"ok": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "bold red"), "skip": ("-", "dim")}


def print_report(report: dict[str, Any], console: Any = None) -> None:
    from rich.text import Text

    from .table import ValueTable, fitted, make_console
    from .textsafe import safe_data

    report = safe_data(report)  # every value escaped before it is laid out (docs/output.md)
    console = console or make_console()
    host, drv = report["host"], report["driver"]
    console.print(Text(f"Host: {host['os'] or 'unknown OS'}, kernel {host['kernel'] or '?'} (root {host['root']})"))
    version = drv["version"] or drv["library_version"]
    cuda = f", CUDA {drv['cuda_version']}" if drv["cuda_version"] else ""
    source = f"; GPUs from {report['gpus_from']}" if report["gpus_from"] else ""
    console.print(Text(f"NVIDIA driver: {version or 'none'}{cuda}{source}"))
    if report["gpus"]:
        rows = []
        for g in report["gpus"]:
            link = g["link"]
            own = (
                f"gen{link['current_gen']} x{link['current_width']} (max gen{link['max_gen']} x{link['max_width']})"
                if link["current_gen"]
                else "-"
            )
            pl = g["pci_link"]
            if pl is None:
                sys_link = "-"
            elif pl["max_speed"] is None and pl["current_speed"] is None:
                sys_link = "none (plain PCI)"
            else:
                sys_link = PciLink(**pl).describe()
            virt = g["virtualization_mode"] or "-"
            if g["vgpu"] and g["vgpu"]["profile"]:
                virt += f" {g['vgpu']['profile']}"
            mem = "-" if g["memory_total_mib"] is None else f"{g['memory_total_mib']} MiB"
            rows.append(
                [
                    str(g["index"]),
                    g["address"] or "-",
                    g["name"] or "-",
                    mem,
                    own,
                    sys_link,
                    virt,
                    g["mig"]["current"] or "-",
                ]
            )
        columns = ["GPU", "Address", "Name", "Memory", "PCIe link (GPU)", "PCIe link (sysfs)", "Virtualization", "MIG"]
        for part in fitted(console, "GPUs", columns, rows, whole=("GPU", "Address")):
            console.print(part)
    rows = []
    for c in report["checks"]:
        mark, style = _STYLE[c["status"]]
        result = Text(c["message"])
        if c["fix"] and c["status"] != "ok":
            result.append(f"\nfix: {c['fix']}", "cyan")
        rows.append([Text(f"{mark} {c['status']}", style), c["id"], "-" if c["gpu"] is None else str(c["gpu"]), result])
    for part in fitted(console, "Checks", ["", "Check", "GPU", "Result"], rows, whole=("", "Check", "GPU")):
        console.print(part)
    bench = report["bench"]
    if bench and bench["results"]:
        table = ValueTable(title=f"Bench ({bench['backend']})", title_justify="left")
        for col in ("Device", "Name", "H2D GB/s", "D2H GB/s", "Link peak", "Matmul TFLOP/s", "GPU peak"):
            table.add_column(col, overflow="fold")

        def pct(value: float | None, frac: float | None, digits: int = 1) -> str:
            if value is None:
                return "-"
            return f"{value:.{digits}f}" + ("" if frac is None else f" ({frac:.0%})")

        for r in bench["results"]:
            table.add_row(
                f"cuda:{r['device']}",
                r["name"] or "-",
                pct(r["h2d_gbps"], r["h2d_fraction"]),
                pct(r["d2h_gbps"], r["d2h_fraction"]),
                "-" if r["link_peak_gbps"] is None else f"{r['link_peak_gbps']:.1f}",
                pct(r["matmul_tflops"], r["matmul_fraction"], 0),
                "-" if r["gpu_peak_tflops"] is None else f"{r['gpu_peak_tflops']:.0f} ({r['gpu_peak_label']})",
            )
        console.print(table)
    s = report["summary"]
    if s["passed"]:
        verdict = Text("PASSED", "bold green")
    elif s.get("incomplete"):
        verdict = Text(f"INCOMPLETE: could not judge {', '.join(s['not_run'])} (skipped above)", "bold yellow")
    else:
        verdict = Text("FAILED", "bold red")
    console.print(Text.assemble(f"{s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skip']} skip: ", verdict))


# ---------------------------------------------------------------- command line


def cmd_verify(args: argparse.Namespace) -> int:
    from ..facts.sysfs import Sysfs
    from ..report import write_json
    from ..report.verify import build_report
    from ..verify.checks import evaluate
    from ..verify.gather import gather
    from ..verify.options import nvml_for, option_error
    from .common import UsageError, host_root

    live = Sysfs(args.root).live  # its rule: "/." is the live root too
    error = option_error(live, bench=args.bench, image=args.image, gpu_source=args.gpu_source)
    if error:
        raise UsageError(error)
    nvml = nvml_for(args.gpu_source)
    if nvml is None:
        raise UsageError("--gpu-source nvml: pynvml is not importable here; pip install nvidia-ml-py")
    with host_root(args.root) as root:
        facts = gather(
            Sysfs(root),
            nvml=nvml,
            gpu_source=args.gpu_source,
            run_container=not args.no_container,
            image=args.image,
            bench=args.bench,
        )
    checks = evaluate(facts)
    report = build_report(facts, checks)
    report["host"]["root"] = args.root
    if args.json:
        write_json(report, sys.stdout, compact=args.compact)
    else:
        print_report(report)
    return EXIT_OK if report["summary"]["passed"] else EXIT_FAILED


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov verify``."""
    from .common import add_json_arguments

    p = sub.add_parser(
        "verify",
        help="check that the GPUs work here: driver, GPUs, PCIe link, vGPU memory, container runtime (--bench: speed)",
        description="Run inside a guest, or on any GPU machine: checks the NVIDIA driver, the GPUs it shows, "
        "each GPU's PCIe link, a vGPU's memory against its profile, Docker/containerd/CDI configuration and "
        "(with a Docker engine) a container that asks for every GPU, CDI first (with --bench: the same bench "
        "inside it). Each check says ok/warn/fail/skip and the fix. "
        "Exit 0 when nothing fails, 1 when a check fails or one that judges the GPUs could not run (a capture: "
        "INCOMPLETE), 2 on bad input.",
    )
    p.add_argument(
        "--root",
        default="/",
        help="read this root (an unpacked capture, or its .tar.gz) instead of /; runs no NVML, container or bench",
    )
    add_json_arguments(p, "the report", "gpuprov.verify/v1")
    p.add_argument(
        "--bench",
        action="store_true",
        help="also measure pinned host<->device bandwidth and a bf16 matmul (needs torch or cupy; uses the GPU "
        "for a few seconds and about 2 GiB of host and GPU memory)",
    )
    p.add_argument(
        "--image",
        metavar="IMAGE",
        help="local Docker image to run nvidia-smi in (default: a local nvidia/cuda or distribution image; "
        "nothing is pulled)",
    )
    p.add_argument("--no-container", action="store_true", help="do not start a container")
    p.add_argument(
        "--gpu-source",
        choices=("auto", "nvml", "nvidia-smi"),
        default="auto",
        help="how to ask the driver for its GPUs: NVML (pynvml) when importable, else nvidia-smi -q -x (default auto)",
    )
    p.set_defaults(func=cmd_verify)
