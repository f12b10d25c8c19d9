"""The host declaration's commands (docs/reference/host-model.md):

    gpuprov init [--root ROOT]            # a starting gpuprov_host for this host, from its facts
    gpuprov init -i INVENTORY --host HOST # ... from what the inventory already declares for HOST
    gpuprov convert host_vars.yml         # the old variables (or a mig-parted / vgpu-device-manager
                                          # file) in the new form
    gpuprov schema                        # the declaration's JSON Schema

Read-only: each prints YAML or JSON on stdout for a person to check and keep.
"""

from __future__ import annotations

import argparse
import functools
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


def _gpu_lines(facts: Any, gpu: Any, name: str, use: str, why: str) -> list[str]:
    """One GPU entry of init's output: by address, with its id guard and the use with its reason."""
    from .textsafe import safe_text

    dev = facts.pci[gpu.address]
    ids = [dev.vendor_id, dev.device_id, dev.subsystem_vendor_id, dev.subsystem_device_id]
    expect = ":".join(f"{n:04x}" for n in ids) if None not in ids else None
    # Host text goes into comments only, escaped to one printable line.
    node = "-" if gpu.numa_node is None else gpu.numa_node
    lines = [f"    # {safe_text(gpu.name)}, IOMMU group {gpu.iommu_group or '-'}, NUMA {node}"]
    lines.append(f"    - name: {name}")
    lines.append(f'      address: "{gpu.address}"')
    if expect:
        lines.append(f'      expect: "{expect}"')
    lines.append(f"      use: {use}  # {safe_text(why)}")
    return lines


def _free_name(taken: set[str]) -> str:
    i = 0
    while f"gpu{i}" in taken:
        i += 1
    taken.add(f"gpu{i}")
    return f"gpu{i}"


def init_document(facts: Any, root: str, *, source: str | None = None, notes: list[str] | None = None) -> str:
    """A starting declaration: every GPU, by address with its id guard, a suggested use with its reason."""
    from ..inputs.declaration import VERSION
    from ..rules.assess import assess
    from .textsafe import safe_text

    lines = [HEADER.format(command="init", source=f" from {safe_text(root)}").rstrip("\n")]
    lines += [f"# {safe_text(note)}" for note in notes or []]
    lines += ["", "gpuprov_host:", f"  version: {VERSION}", "  gpus:"]
    gpus = assess(facts)
    if not gpus:
        lines[-1] = "  gpus: []  # this host shows no GPU"
    taken: set[str] = set()
    for a in gpus:
        use, why = _suggested_use(facts, a.address, a)
        lines += _gpu_lines(facts, a, _free_name(taken), use, why)
    lines += ["  vms: []", ""]
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def _dumper() -> Any:
    """PyYAML's safe dumper that writes a vaulted value back as the ``!vault`` value it was (its
    ciphertext, never its plaintext: gpuprov/cli/secrets.py)."""
    import yaml

    from .secrets import Vaulted

    class InitDumper(yaml.SafeDumper):
        pass

    def vaulted(dumper: yaml.SafeDumper, data: Vaulted) -> Any:
        return dumper.represent_scalar("!vault", data.ciphertext, style="|")

    InitDumper.add_representer(Vaulted, vaulted)
    return InitDumper


def inventory_document(facts: Any, root: str, source: str, doc: Any) -> str:
    """``init -i INVENTORY --host HOST``: a starting declaration from what the inventory already says
    of the host, as Ansible reads it (docs/reference/host-model.md, "Starting, converting").

    - Its ``gpuprov_host``, standing alone: the picked layout's entries (from group_vars) written
      into the host's own ``gpus``, each with the addresses it stands for on this host; then every
      GPU no entry covers, with init's suggested use; the rest (``vm_defaults``, ``vms``, the
      settings) as the inventory has it, so the VMs' names still resolve.
    - The old variables: converted first, as ``gpuprov convert`` does.
    - Nothing: init's start from the facts, naming the layouts the inventory offers.

    Input problems are exit 2, as plan's; what this host refuses of the declaration (a guard, a
    missing address) is told in comments and on stderr."""
    import yaml

    from ..inputs.declaration import VERSION
    from ..model.convert import CONVERTED, ConvertError, convert
    from ..model.resolve import declared_entries, is_declaration, resolve
    from ..rules.assess import assess
    from .plan import input_problems
    from .textsafe import safe_text

    if not isinstance(doc, dict):
        doc = {}
    notes: list[str] = []
    if not is_declaration(doc):
        old = [k for k in CONVERTED if k in doc]
        if not old:
            layouts = doc.get("gpuprov_layouts")
            offered = sorted(layouts) if isinstance(layouts, dict) else []
            notes = [f"{source} declares no gpuprov_host and none of the old variables for this host"]
            if offered:
                notes.append(f"layouts it offers (gpuprov_host.layout: NAME picks one): {', '.join(offered)}")
            return init_document(facts, root, notes=notes)
        try:
            converted, said = convert(doc, facts)
        except ConvertError as exc:
            raise UsageError(f"{source}: {exc}") from None
        notes = [f"{source} has the old variables {', '.join(old)}: converted as `gpuprov convert` does", *said]
        doc = {"gpuprov_host": converted["gpuprov_host"]}
    model = resolve(doc, facts)
    if model.problems:
        raise UsageError(input_problems(source, model.problems))
    host = doc["gpuprov_host"]
    addresses = {g.where: g.addresses for g in model.gpus}
    header = HEADER.format(command="init", source=f" from {safe_text(root)} and {safe_text(source)}")
    lines = [header.rstrip("\n"), *(f"# note: {safe_text(n)}" for n in notes)]
    if host.get("layout") is not None:
        lines.append(f"# layout {safe_text(host['layout'])}'s entries written into gpus: this host's file stands alone")
    for refusal in model.refusals:
        said = refusal.describe()
        print(f"gpuprov: {source}: {said}", file=sys.stderr)
        lines.append(f"# REFUSED on this host: {safe_text(said)}")
    lines += ["", "gpuprov_host:", f"  version: {VERSION}", "  gpus:"]
    taken: set[str] = set()
    for where, entry in declared_entries(doc):
        taken.add(entry["name"])
        found = ", ".join(addresses.get(where) or []) or "no device"
        lines.append(f"    # {safe_text(where)} in {safe_text(source)}; on this host: {found}")
        flow = yaml.dump(entry, Dumper=_dumper(), default_flow_style=True, sort_keys=False, width=10**6).strip()
        lines.append(f"    - {flow}")
    for a in assess(facts):
        if a.address not in model.declared:
            use, why = _suggested_use(facts, a.address, a)
            lines += _gpu_lines(facts, a, _free_name(taken), use, f"not declared in the inventory; {why}")
    if not taken:
        lines[-1] = "  gpus: []  # this host shows no GPU and the inventory declares none"
    rest = {k: v for k, v in host.items() if k not in ("version", "layout", "gpus")}
    rest.setdefault("vms", [])
    dumped = yaml.dump(rest, Dumper=_dumper(), sort_keys=False, default_flow_style=None, width=100)
    lines += ["  " + line if line else line for line in dumped.splitlines()]
    return "\n".join(lines) + "\n"


def cmd_init(args: argparse.Namespace) -> int:
    from ..facts.host import gather
    from ..facts.sysfs import Sysfs
    from .inventory import wanted

    given = wanted(args, None, "")
    with host_root(args.root) as root:
        facts = gather(Sysfs(root))
    if given is None:
        sys.stdout.write(init_document(facts, args.root))
    else:
        sys.stdout.write(inventory_document(facts, args.root, *given))
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
        "suggested use with the reason. Check each use, then keep it in the host's host_vars. Read-only. "
        "With -i INVENTORY --host HOST, start from what the inventory already declares for HOST, as Ansible "
        "reads it (group_vars, layouts, vaulted values): its gpuprov_host with the picked layout's entries "
        "written into its own gpus (each with the addresses it stands for here), then every GPU no entry "
        "covers with a suggested use, its VMs and settings as they are; the old variables converted as "
        "gpuprov convert does; a host with neither gets the start from its facts. A vaulted value stays "
        "vaulted: written back as its own !vault ciphertext (a value from a vault-encrypted file as <vaulted>: "
        "keep it in that file), never printed decrypted.",
    )
    p.add_argument("--root", default="/", help="read this root (an unpacked capture, or its .tar.gz) instead of /")
    from .inventory import add_arguments

    add_arguments(p)  # -i INVENTORY --host HOST: start from that host's variables as Ansible sees them
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
