"""``gpuprov plan``: check a host's VM list against the host before anything changes.

    gpuprov plan host_vars/gpu-node-01.yml                 # this host
    gpuprov plan vms.yml --root capture.tar.gz --json      # a captured host, for machines
    gpuprov plan -i inventories/site --host gpu-node-01    # its variables as Ansible sees them

The file is the VM list the role gpu_vms takes: a YAML list of VMs, or a
mapping with ``gpu_vms_list`` (and optionally ``gpu_vms_defaults``,
``gpu_vms_reserved_memory_mib``, ``gpu_vms_reserved_cpus``,
``gpu_vms_mixed_vgpu_types``), such as the host's host_vars file. Every problem
is printed at once; the exit status is 3 when there is any. A file that breaks
the input rules (:mod:`gpuprov.inputs.boundary`, docs/reference/inputs.md) is exit 2,
with every problem named by its field.
Read-only. The rules live in :mod:`gpuprov.plan.vm.fit`; the module gpu_vm applies the
same ones.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def print_plan(report: dict[str, Any]) -> None:
    from rich.text import Text

    from .table import fitted, make_console
    from .textsafe import safe_data

    report = safe_data(report)  # every value escaped before it is laid out (docs/output.md)
    console = make_console()
    rows: list[list[Any]] = []
    for vm in report["vms"]:
        placement = vm["placement"] or {}
        slots = placement.get("pci_slots") or []
        devices = [" + ".join(slot) for slot in slots] + [f"mdev {m['type']}@{m['parent']}" for m in vm["mdevs"]]
        cpus = placement.get("cpus")
        hugepage = placement.get("hugepage_kib")
        node = placement.get("numa_node")
        cells = placement.get("numa_cells") or []
        rows.append(
            [
                vm["name"],
                vm["state"],
                f"{vm['memory_mib']} MiB",
                str(vm["vcpus"]),
                "cells" if cells else "-" if node is None else str(node),
                "not pinned" if cpus is None else "by cell" if cells else ",".join(map(str, cpus)),
                "no" if not hugepage else f"{hugepage} KiB",
                "by cell" if cells else "\n".join(devices) or "-",
            ]
        )
        rows += [list(row) for row in cell_rows(placement)]
    columns = ["VM", "state", "memory", "vCPUs", "node", "host CPUs", "hugepages", "devices"]
    for part in fitted(console, f"VM plan for {report['root']}", columns, rows, whole=("VM", "devices")):
        console.print(part)
    memory = report["resources"].get("memory") or {}
    cpus = report["resources"].get("cpus") or {}
    if memory:
        console.print(
            f"memory: VMs {memory['vms_mib']} MiB ({memory['vms_in_hugepages_mib']} in hugepages) of the host's "
            f"{memory['host_mib']} MiB, {memory['reserved_for_host_mib']} MiB kept for the host, "
            f"{memory['hugepages_reserved_mib']} MiB reserved as hugepages",
            highlight=False,
        )
    nodes = memory.get("nodes") or []
    for node in nodes if len(nodes) > 1 else []:  # one node: the line above says it all
        console.print(
            f"  NUMA node {node['node']}: {node['vms_bound_mib']} MiB bound to VMs in normal pages of its "
            f"{node['host_mib']} MiB, {node['reserved_for_host_mib']} MiB kept for the host, "
            f"{node['hugepages_reserved_mib']} MiB reserved as hugepages",
            highlight=False,
        )
    if cpus:
        console.print(
            f"CPUs: VMs {cpus['vcpus']} vCPUs of the host's {cpus['host']}, "
            f"{cpus['reserved_for_host']} kept for the host",
            highlight=False,
        )
    for warning in report["warnings"]:
        console.print(Text.assemble(("warning", "yellow"), f": {warning}"))
    for refusal in report["refusals"]:
        fix = f"\n    fix: {refusal['fix']}" if refusal["fix"] else ""
        console.print(Text.assemble(("REFUSED", "red"), f": {refusal['message']}{fix}"))
    if report["ok"]:
        console.print(Text.assemble(("OK", "green"), f": {len(report['vms'])} VMs fit this host"))
    else:
        console.print(
            Text.assemble((f"{len(report['refusals'])} problem(s)", "red"), ": nothing may change until they are fixed")
        )


def cell_rows(placement: dict[str, Any]) -> list[tuple[str, ...]]:
    """One row per guest NUMA cell of a VM split over its GPUs' host nodes: its host node, memory,
    vCPUs and their host CPUs (``cpus`` lists them in cell order), and the GPUs behind its
    expander bus."""
    cpus = placement.get("cpus")
    gpu_cells = placement.get("gpu_cells") or {}
    rows = []
    first = 0
    for i, cell in enumerate(placement.get("numa_cells") or []):
        mine = cpus[first : first + cell["vcpus"]] if cpus is not None else None
        first += cell["vcpus"]
        slots = [s for s in placement.get("pci_slots") or [] if any(gpu_cells.get(a) == i for a in s)]
        rows.append(
            (
                f"  cell {i}",
                "",
                f"{cell['memory_mib']} MiB",
                str(cell["vcpus"]),
                str(cell["node"]),
                "not pinned" if mine is None else ",".join(map(str, mine)),
                "",
                "\n".join(" + ".join(slot) for slot in slots) or "-",
            )
        )
    return rows


def input_problems(source: str, problems: list[Any]) -> str:
    """Every input problem, one per line with its fix, for the exit-2 message."""
    lines = [f"{source}: {len(problems)} problem(s) in the input; nothing was planned:"]
    for r in problems:
        lines.append(f"  {r.message}" + (f"\n    fix: {r.fix}" if r.fix else ""))
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    from ..core.plan import Refusal
    from ..core.vm_spec import ROM_DIR
    from ..facts.host import cpu_count, gather
    from ..facts.sysfs import Sysfs
    from ..facts.vm_storage import rom_problems
    from ..inputs.boundary import HOST_VARS_SETTINGS
    from ..inputs.host_settings import check_settings
    from ..inputs.validate import Problems
    from ..model.resolve import resolve
    from ..plan.vgpu import declared_mdevs
    from ..plan.vm.fit import check_declared_mdevs, plan_host
    from ..report import write_json
    from ..report.plan import plan_report
    from .common import EXIT_NOT_READY, EXIT_OK, UsageError, host_root, read_input
    from .inventory import wanted

    given = wanted(args, args.vms, "VMS.yml")
    if given is None and args.vms is None:
        raise UsageError("give the VM list (VMS.yml, a host_vars file) or -i INVENTORY --host HOST")
    source, doc = given or (args.vms, read_input(args.vms))
    with host_root(args.root) as root:
        facts = gather(Sysfs(root))
        model = resolve(doc, facts, cpu_limit=cpu_count(facts))
        problems = model.problems
        if not problems:
            settings, names = model.settings, dict(HOST_VARS_SETTINGS if model.legacy else {})
            if args.reserved_memory_mib is not None:
                settings.reserved_memory_mib = args.reserved_memory_mib
                names["reserved_memory_mib"] = "--reserved-memory-mib"
            if args.reserved_cpus is not None:
                settings.reserved_cpus = args.reserved_cpus
                names["reserved_cpus"] = "--reserved-cpus"
            if args.mixed_vgpu_types:
                settings.mixed_vgpu_types = True
            flags = Problems()
            check_settings(settings, flags, names)
            problems = flags.items
        if problems:
            raise UsageError(input_problems(source, problems))
        plan = plan_host(facts, model.vm_list, model.settings, path=model.vm_path, declared=model.checked_uses)
        plan.refusals[:0] = model.refusals
        plan.warnings[:0] = model.warnings
        for vm in plan.vms:
            for problem in rom_problems(vm, root) if vm.state != "absent" else []:
                plan.refusals.append(Refusal(f"VM {vm.name}: {problem}", f"put the ROM file in {ROM_DIR} on the host"))
    if model.legacy and model.layout:
        # The old variables: the VMs' mdevs must be the ones the layout makes (the new form names
        # them from the layout, so they are by construction).
        declared, refusals = declared_mdevs(facts, model.layout)
        plan.refusals.extend(refusals)
        check_declared_mdevs(plan, declared)
    report = plan_report(plan, args.root)
    if args.json:
        write_json(report, sys.stdout, compact=args.compact)
    else:
        print_plan(report)
    return EXIT_NOT_READY if plan.refused else EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov plan``."""
    from .common import add_json_arguments

    p = sub.add_parser(
        "plan",
        help="check a host's VM list (GPUs, vGPUs, CPUs, memory) against the host; exit 3 on any problem",
        description="Check the VMs planned for a host against its facts before anything changes: devices "
        "given twice or not vfio-ready, mdev types and available instances, mixed vGPU types, host memory, "
        "CPUs and hugepages oversubscribed (per NUMA node too). Prints every problem at once and where each VM "
        "would run (NUMA node or guest cells, pinned CPUs, hugepages). Read-only.",
    )
    p.add_argument(
        "vms",
        metavar="VMS.yml",
        nargs="?",
        help="a YAML list of VMs, or a host_vars file (gpuprov_host or gpu_vms_list)",
    )
    from .inventory import add_arguments

    add_arguments(p)
    p.add_argument("--root", default="/", help="read this root (an unpacked capture, or its .tar.gz) instead of /")
    add_json_arguments(p, "the plan", "gpuprov.plan/v1")
    p.add_argument(
        "--reserved-memory-mib",
        type=int,
        default=None,
        help="host memory kept for the host (default: the file's, else 10%% of RAM, at most 4 GiB)",
    )
    p.add_argument(
        "--reserved-cpus", default=None, help="host CPUs kept for the host, a cpulist (default: the file's, else 0)"
    )
    p.add_argument(
        "--mixed-vgpu-types", action="store_true", help="the GPUs run NVIDIA's mixed-size vGPU mode (expert)"
    )
    p.set_defaults(func=cmd_plan)
