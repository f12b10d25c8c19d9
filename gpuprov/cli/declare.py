"""The host declaration's commands (docs/reference/host-model.md):

    gpuprov init [--root ROOT]            # a starting gpuprov_host for this host, from its facts
    gpuprov convert host_vars.yml         # the old variables (or a mig-parted / vgpu-device-manager
                                          # file) in the new form
    gpuprov schema                        # the declaration's JSON Schema

Read-only: each prints YAML or JSON on stdout for a person to check and keep.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .common import EXIT_OK, UsageError, host_root, read_input

HEADER = "# Written by `gpuprov {command}`{source}: check each use, then keep it in the host's host_vars.\n"


# ---------------------------------------------------------------- init


def _suggested_use(facts: Any, address: str, assessment: Any) -> tuple[str, str]:
    """A first guess at a GPU's use, and why, from what the host shows now."""
    from ..rules.assess import VFIO_DRIVERS

    dev = facts.pci[address]
    if dev.boot_vga or address in facts.usage.console_devices:
        return "host", "drives the host's display"
    if dev.driver in VFIO_DRIVERS:
        return "passthrough", f"bound to {dev.driver} now"
    parent = facts.mdev_parents.get(address)
    if parent is not None and parent.types:
        return "mdev", f"offers {len(parent.types)} mdev types"
    if any(vf in facts.vgpu_vfs for vf in dev.virtfns):
        return "sriov_vgpu", "its VFs offer vGPU types"
    if assessment.ready:
        return "passthrough", "ready for passthrough"
    blocker = assessment.blockers[0].message if assessment.blockers else "not ready"
    return "host", f"not ready for passthrough: {blocker}"


def init_document(facts: Any, root: str) -> str:
    """A starting declaration: every GPU, by address with its id guard, a suggested use with its reason."""
    from ..inputs.declaration import VERSION
    from ..rules.assess import assess
    from .textsafe import safe_text

    lines = [
        HEADER.format(command="init", source=f" from {safe_text(root)}"),
        "gpuprov_host:",
        f"  version: {VERSION}",
        "  gpus:",
    ]
    gpus = assess(facts)
    if not gpus:
        lines[-1] = "  gpus: []  # this host shows no GPU"
    for i, a in enumerate(gpus):
        dev = facts.pci[a.address]
        ids = [dev.vendor_id, dev.device_id, dev.subsystem_vendor_id, dev.subsystem_device_id]
        expect = ":".join(f"{n:04x}" for n in ids) if None not in ids else None
        use, why = _suggested_use(facts, a.address, a)
        # Host text goes into comments only, escaped to one printable line.
        node = "-" if a.numa_node is None else a.numa_node
        lines.append(f"    # {safe_text(a.name)}, IOMMU group {a.iommu_group or '-'}, NUMA {node}")
        lines.append(f"    - name: gpu{i}")
        lines.append(f'      address: "{a.address}"')
        if expect:
            lines.append(f'      expect: "{expect}"')
        lines.append(f"      use: {use}  # {safe_text(why)}")
    lines += ["  vms: []", ""]
    return "\n".join(lines)


def cmd_init(args: argparse.Namespace) -> int:
    from ..facts.host import gather
    from ..facts.sysfs import Sysfs

    with host_root(args.root) as root:
        facts = gather(Sysfs(root))
    sys.stdout.write(init_document(facts, args.root))
    return EXIT_OK


# ---------------------------------------------------------------- convert


def cmd_convert(args: argparse.Namespace) -> int:
    import yaml

    from ..facts.host import gather
    from ..facts.sysfs import Sysfs
    from ..model.convert import ConvertError, convert

    doc = read_input(args.file)
    with host_root(args.root) as root:
        facts = gather(Sysfs(root))
    try:
        out, notes = convert(doc, facts, use=args.vgpu_use)
    except ConvertError as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    sys.stdout.write(
        HEADER.format(command="convert", source=f" from {args.file}").replace("check each use", "check it")
    )
    for note in notes:
        sys.stdout.write(f"# note: {note}\n")
    sys.stdout.write(yaml.safe_dump(out, sort_keys=False, default_flow_style=None, width=100))
    return EXIT_OK


# ---------------------------------------------------------------- schema


def cmd_schema(_args: argparse.Namespace) -> int:
    from ..inputs.declaration import SCHEMA

    json.dump(SCHEMA, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov init``, ``convert`` and ``schema``."""
    p = sub.add_parser(
        "init",
        help="print a starting host declaration (gpuprov_host) from this host's facts",
        description="Print a gpuprov_host for this host: every GPU by address with its id guard (expect) and a "
        "suggested use with the reason. Check each use, then keep it in the host's host_vars. Read-only.",
    )
    p.add_argument("--root", default="/", help="read this root (an unpacked capture, or its .tar.gz) instead of /")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser(
        "convert",
        help="print the new form (gpuprov_host / gpuprov_layouts) of old variables or a mig-parted file",
        description="Read a host_vars file with the old variables (gpuprov_gpus, gpu_vms_list, vfio_host_devices) "
        "and print the same host as gpuprov_host; or read a mig-parted (mig-configs) or vgpu-device-manager "
        "(vgpu-configs) file and print its configs as gpuprov_layouts. Read-only.",
    )
    p.add_argument("file", metavar="FILE.yml", help="the host_vars file, or the mig-parted/vgpu-device-manager file")
    p.add_argument(
        "--root", default="/", help="the host's root (its facts name the PF of each VF), or a capture's .tar.gz"
    )
    p.add_argument(
        "--vgpu-use",
        choices=("mdev", "sriov_vgpu"),
        default="mdev",
        help="for a vgpu-device-manager file: mdev (before Ampere) or sriov_vgpu (Ampere and later)",
    )
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser(
        "schema",
        help="print the host declaration's JSON Schema",
        description="Print the JSON Schema (2020-12) of gpuprov_host and gpuprov_layouts.",
    )
    p.set_defaults(func=cmd_schema)
