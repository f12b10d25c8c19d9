"""One model of a host: its declaration (``gpuprov_host``, ``gpuprov_layouts``) resolved against its facts.

:func:`resolve` is the one boundary every reader goes through: ``gpuprov plan``, ``gpuprov
inspect --declaration``, the module ``gpu_host_model`` (whose result the roles take). From one
declaration it derives everything the stages need (docs/reference/host-model.md):

- each GPU entry's PCI addresses (by address, or a selector resolved against the facts), checked
  against its id guard (``expect``), each address claimed by one entry only;
- ``vfio_devices``: the ``use: passthrough`` GPUs (role vfio_host);
- ``layout``: the vGPU layout in gpuprov_gpus form (role vgpu_host, module gpu_vgpu), every mdev
  with its UUID (one scheme: :func:`gpuprov.plan.vgpu.mdev_uuids`, the one vgpu_host makes);
- ``vm_list``: each VM with the addresses, mdevs and VFs its names stand for (role gpu_vms);
- ``declared``: address -> its use and entry, which :func:`gpuprov.plan.vm.fit.plan_host` checks
  every VM's devices against (a VM gets a whole GPU only with ``use: passthrough``).

The old variables (``gpuprov_gpus``, ``gpu_vms_list``, ``vfio_host_devices``) are read by
:func:`gpuprov.model.legacy.from_legacy` into the same model, with a deprecation warning.

``problems`` are input errors (``gpuprov plan`` exits 2): a version this gpuprov does not read
(the one problem told), the schema (:func:`gpuprov.inputs.declaration.check`: every rule of one
value), then what a schema cannot say (docs/reference/host-model.md, "What the schema cannot
say"): a name used twice, a layout not declared, a layout file's entries together, a VM's values
merged with vm_defaults; ``refusals`` are the declaration against this host (exit 3). A
declaration without a version is read as version 1, with a warning. Pure; standard library only
(ships to targets with the modules).
"""

from __future__ import annotations

from typing import Any

from ..core.plan import Refusal
from ..core.vm_spec import HostSettings
from ..facts.host import HostFacts
from ..facts.pci import PciAddressError, normalize_address
from ..inputs.declaration import NO_VERSION, OLD_FORM, ROOT, VGPU_USES, check, check_version, has_version
from ..inputs.validate import shown
from .host_model import DeclaredGpu, HostModel, Instance

NVIDIA = 0x10DE
HOST_SETTINGS = ("reserved_memory_mib", "reserved_cpus", "mixed_vgpu_types")


def is_declaration(doc: Any) -> bool:
    return isinstance(doc, dict) and "gpuprov_host" in doc


def resolve(doc: Any, facts: HostFacts, *, cpu_limit: int | None = None) -> HostModel:
    """A host's variables (a host_vars file, or the module's options) -> its model on ``facts``."""
    if not is_declaration(doc):
        from .legacy import from_legacy

        return from_legacy(doc, facts, cpu_limit=cpu_limit)
    model = HostModel()
    version = check_version(doc)
    if version:  # a form this gpuprov does not read: nothing else is checked against it
        model.problems.extend(version.items)
        return model
    if not has_version(doc):
        model.warnings.append(NO_VERSION)
    old = [k for k in OLD_FORM if k in doc]  # the schema's rule too, told here naming them all at once
    if old:
        # plan would read gpuprov_host alone while the roles take the old variables (an inventory's
        # gpu_vms_list beats the role's default, the model's VMs): one host, two answers. Refused,
        # never merged.
        model.problems.append(
            Refusal(
                f"gpuprov_host and the old variables {', '.join(old)} are set together: gpuprov plan and the "
                f"modules read gpuprov_host, while the roles would take {', '.join(old)}",
                "declare the host once: `gpuprov convert FILE` writes the old variables in the new form; merge "
                f"that into gpuprov_host and remove {', '.join(old)}",
            )
        )  # and the declaration checked all the same: every problem of the file at once
    doc = {k: v for k, v in doc.items() if k in ("gpuprov_host", "gpuprov_layouts")}
    model.problems.extend(check(doc, ROOT).items)  # the schema says every rule of one value
    if model.problems:
        return model
    doc = _convert_layouts(doc, model)  # and what it cannot say follows, as the file is resolved
    if model.problems:
        return model
    host = doc["gpuprov_host"] or {}
    entries = _entries(host, doc.get("gpuprov_layouts") or {}, model)
    if model.problems:
        return model
    _claim(facts, entries, model)
    _instances(facts, model, {entry["name"]: entry for _where, entry in entries})
    model.vfio_devices = [a for g in model.gpus if g.use == "passthrough" for a in g.addresses]
    model.settings = host_settings(host, {k: f"gpuprov_host.{k}" for k in HOST_SETTINGS}, model)
    _vms(host, model, cpu_limit)
    return model


def host_settings(values: dict[str, Any], names: dict[str, str], model: HostModel) -> HostSettings:
    """The host settings from ``values`` (keys of HOST_SETTINGS), checked; ``names``: how messages name them."""
    from ..inputs.host_settings import check_settings
    from ..inputs.validate import Problems

    reserved = values.get("reserved_cpus", "0")
    settings = HostSettings(
        reserved_memory_mib=values.get("reserved_memory_mib"),
        reserved_cpus="" if reserved is None else reserved,
        mixed_vgpu_types=values.get("mixed_vgpu_types", False),
    )
    p = Problems()
    check_settings(settings, p, names)
    model.problems.extend(p.items)
    return settings


# ---------------------------------------------------------------- GPU entries


def _convert_layouts(doc: dict[str, Any], model: HostModel) -> dict[str, Any]:
    """gpuprov_layouts given as a mig-parted or vgpu-device-manager file: its configs become layouts."""
    layouts = doc.get("gpuprov_layouts")
    if not layouts:  # none given (most hosts): the formats' parsers are not imported
        return doc
    from . import formats

    if formats.is_mig_parted(layouts):
        converted, problems = formats.layouts_from_mig_parted(layouts)
    elif formats.is_vgpu_device_manager(layouts):
        converted, problems = formats.layouts_from_vgpu_device_manager(layouts)
    else:
        return doc
    model.problems.extend(problems)
    return {**doc, "gpuprov_layouts": converted}


def _entries(host: dict[str, Any], layouts: dict[str, Any], model: HostModel) -> list[tuple[str, dict[str, Any]]]:
    """(where, entry): the picked layout's GPUs, then the host's own (a same name replaces)."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    name = host.get("layout")
    if name is not None:
        if name not in layouts:
            known = ", ".join(sorted(layouts)) or "none"
            model.problems.append(
                Refusal(f"gpuprov_host.layout: no layout {name!r} in gpuprov_layouts", f"layouts: {known}")
            )
            return []
        for i, entry in enumerate(layouts[name]["gpus"]):
            out[entry["name"]] = (f"gpuprov_layouts.{name}.gpus[{i}] {entry['name']!r}", entry)
    own: set[str] = set()
    for i, entry in enumerate(host.get("gpus") or []):
        where = f"gpuprov_host.gpus[{i}] {entry['name']!r}"
        if entry["name"] in own:
            model.problems.append(Refusal(f"{where}: the name is used twice", "give each GPU entry its own name"))
        own.add(entry["name"])
        out[entry["name"]] = (where, entry)
    return list(out.values())


def declared_entries(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, entry) of every GPU entry a declaration gives its host, as :func:`resolve` reads them:
    the picked layout's (a mig-parted or vgpu-device-manager file converted), then the host's own
    (a same name replaces). For a declaration :func:`resolve` found no problem in."""
    model = HostModel()
    doc = _convert_layouts(doc, model)
    return _entries(doc.get("gpuprov_host") or {}, doc.get("gpuprov_layouts") or {}, model)


def _nvidia_gpus(facts: HostFacts) -> list[str]:
    """NVIDIA display-class physical functions, in PCI address order (nvidia-smi's index order)."""
    return sorted(
        a for a, d in facts.pci.items() if d.vendor_id == NVIDIA and d.base_class == 0x03 and d.physfn is None
    )


def _matches(facts: HostFacts, select: Any) -> tuple[list[str], bool]:
    """The addresses a selector picks, and whether it picks regardless of other entries (an index)."""
    gpus = _nvidia_gpus(facts)
    if select == "all":
        return gpus, False
    if isinstance(select, str):  # vendor:device: any endpoint with that id (the lab's stand-ins too)
        return sorted(
            a for a, d in facts.pci.items() if d.id_pair == select and d.physfn is None and not d.is_bridge
        ), False
    if "index" in select:
        return ([gpus[select["index"]]] if select["index"] < len(gpus) else []), True
    text = select["model"].lower()
    return [a for a in gpus if text in (facts.pci[a].name or "").lower()], False


def _id_text(facts: HostFacts, address: str, full: bool) -> str:
    d = facts.pci[address]
    ids = [d.vendor_id, d.device_id] + ([d.subsystem_vendor_id, d.subsystem_device_id] if full else [])
    return ":".join("????" if i is None else f"{i:04x}" for i in ids)


def _guard(facts: HostFacts, gpu: DeclaredGpu, expect: str | None, model: HostModel) -> None:
    """The id guard: the hardware at each address is what the declaration expects."""
    if expect is None:
        return
    for address in gpu.addresses:
        if address not in facts.pci:
            continue
        found = _id_text(facts, address, full=expect.count(":") == 3)
        if found != expect:
            model.refusals.append(
                Refusal(
                    f"{gpu.where}: {address} is {found}, but expect says {expect}: the hardware changed or the "
                    "bus was renumbered",
                    "check the host (`gpuprov inspect --all`), then fix the entry's address or expect",
                    address,
                )
            )


def _claim(facts: HostFacts, entries: list[tuple[str, dict[str, Any]]], model: HostModel) -> None:
    """Addresses first, then selectors in order over what is left; an address claimed twice is refused."""
    claimed: dict[str, str] = {}
    gpus: dict[str, DeclaredGpu] = {}

    def take(gpu: DeclaredGpu, address: str) -> None:
        if address in claimed:
            model.refusals.append(
                Refusal(
                    f"{gpu.where}: {address} is already {claimed[address]}'s",
                    "declare each GPU in one entry",
                    address,
                )
            )
            return
        claimed[address] = gpu.where
        gpu.addresses.append(address)

    for where, entry in entries:
        gpu = DeclaredGpu(entry["name"], entry["use"], where, mig=entry.get("mig"))
        gpus[entry["name"]] = gpu
        if "address" not in entry:
            continue
        raw = entry["address"]
        if ":" not in raw:  # a non-PCI mdev parent
            if raw not in facts.mdev_parents:
                _no_device(gpu, raw, facts, model)
            else:
                take(gpu, raw)
            continue
        try:
            address = normalize_address(raw)
        except PciAddressError as exc:
            model.problems.append(Refusal(f"{where}: address: {exc}", 'e.g. "0000:41:00.0"'))
            continue
        if address not in facts.pci:
            _no_device(gpu, address, facts, model)
            continue
        take(gpu, address)
    selected: dict[str, str] = {}  # address -> the selector entry that matched it first
    for where, entry in entries:
        if "select" not in entry:
            continue
        gpu = gpus[entry["name"]]
        found, fixed = _matches(facts, entry["select"])
        clashes: dict[str, list[str]] = {}  # the earlier selector -> the GPUs both match
        for address in found:
            if address in selected:
                clashes.setdefault(selected[address], []).append(address)
                continue
            selected[address] = where
            if fixed or address not in claimed:
                take(gpu, address)
        for other, addresses in clashes.items():
            # Two selectors over one GPU: whichever came first would win silently.
            model.refusals.append(
                Refusal(
                    f"{where} and {other} both match {', '.join(addresses)}: a GPU belongs to one entry",
                    "narrow one of the two selectors ({index: N}, a vendor:device), or name the GPU by "
                    "address in the entry that should have it",
                    addresses[0],
                )
            )
        if found and not gpu.addresses and not fixed and not clashes:
            model.warnings.append(
                f"{where}: select {shown(entry['select'])} stands for no GPU on this host: every GPU it matches "
                "is another entry's"
            )
        if not found:
            here = ", ".join(f"{a} ({_id_text(facts, a, False)})" for a in _nvidia_gpus(facts)) or "none"
            model.refusals.append(
                Refusal(
                    f"{where}: select {shown(entry['select'])} matches no GPU on this host (NVIDIA GPUs: {here})",
                    "fix the selector, or give this host another layout",
                )
            )
    for where, entry in entries:
        gpu = gpus[entry["name"]]
        _guard(facts, gpu, entry.get("expect"), model)
        for address in gpu.addresses:
            model.declared[address] = {"use": gpu.use, "entry": where}
        model.gpus.append(gpu)


def _no_device(gpu: DeclaredGpu, address: str, facts: HostFacts, model: HostModel) -> None:
    model.refusals.append(
        Refusal(
            f"{gpu.where}: no device {address} on this host ({len(facts.pci)} PCI devices)",
            "check the address with `gpuprov inspect --all` or `lspci -D`: the bus may have been renumbered",
            address,
        )
    )


# ---------------------------------------------------------------- instances


def _wanted(entry: dict[str, Any] | None, gpu: DeclaredGpu, model: HostModel) -> list[dict[str, Any]]:
    """One GPU's instances as a list of {type, name?, uuid?, vf?} (counts expanded)."""
    raw = (entry or {}).get("instances") or []
    if isinstance(raw, dict):
        return [{"type": t} for t, n in raw.items() for _k in range(n)]
    if len(gpu.addresses) > 1 and any("name" in i or "uuid" in i or "vf" in i for i in raw):
        model.refusals.append(
            Refusal(
                f"{gpu.where}: named, UUID'd or VF-pinned instances need an entry of one GPU "
                f"({len(gpu.addresses)} selected)",
                "give the instances as counts, or split the entry by address",
            )
        )
        return []
    return [dict(i) for i in raw]


def _instances(facts: HostFacts, model: HostModel, entries: dict[str, dict[str, Any]]) -> None:
    """Each vGPU GPU's instances, named, with their UUIDs (mdev) or VFs (sriov_vgpu); the layout."""
    names = {g.name for g in model.gpus}
    for gpu in model.gpus:
        wants = _wanted(entries.get(gpu.name), gpu, model) if gpu.use in VGPU_USES else []  # each GPU's
        count = 0
        for address in gpu.addresses:
            layout: dict[str, Any] = {"use": gpu.use}
            vfs = sorted(facts.pci[address].virtfns) if address in facts.pci else []
            for k, want in enumerate(wants):
                name = want.get("name") or f"{gpu.name}.{count}"
                count += 1
                if name in names:
                    model.refusals.append(
                        Refusal(f"{gpu.where}: instance name {name!r} is taken", "give each instance its own name")
                    )
                    continue
                names.add(name)
                vf = want.get("vf") or (vfs[k] if gpu.use == "sriov_vgpu" and k < len(vfs) else None)
                gpu.instances.append(Instance(name, gpu.name, address, want["type"], want.get("uuid"), vf=vf))
            mine = [i for i in gpu.instances if i.parent == address]
            if gpu.use == "mdev":
                layout["mdevs"] = [{"type": i.type} | ({"uuid": i.uuid} if i.uuid else {}) for i in mine]
            elif gpu.use == "sriov_vgpu":
                layout["vgpus"] = [{"type": i.type} | ({"vf": i.vf} if i.vf else {}) for i in mine]
            elif gpu.use == "mig":
                layout["mig"] = gpu.mig if gpu.mig is not None else []
            model.layout[address] = layout
    _mdev_uuids(facts, model)
    _vgpu_types(facts, model)


def _mdev_uuids(facts: HostFacts, model: HostModel) -> None:
    """The layout's UUIDs (given or derived as vgpu_host derives them), written into the layout and
    the instances alike: the VM's mdev and the layout's are one."""
    mdev_layout = {a: e for a, e in model.layout.items() if e["use"] == "mdev" and e["mdevs"]}
    if not mdev_layout:
        return
    # vgpu_host's UUID scheme and its parsers, imported only where a GPU is declared use: mdev (the
    # fleet report and the planners read every host; most declare no vGPU).
    from ..plan.vgpu.mdev import mdev_uuids

    uuids, refusals = mdev_uuids(facts, mdev_layout)
    for r in refusals:  # named by the entry that declared the parent
        entry = model.declared.get(r.device or "", {}).get("entry")
        model.refusals.append(Refusal(f"{entry}: {r.message}" if entry else r.message, r.fix, r.device))
    for gpu in (g for g in model.gpus if g.use == "mdev"):
        on: dict[str, int] = {}
        for inst in gpu.instances:
            k = on.get(inst.parent, 0)
            on[inst.parent] = k + 1
            found = (uuids.get(inst.parent) or [])[k : k + 1]
            if found and found[0] is not None:
                inst.uuid, inst.type_id = found[0]
                model.layout[inst.parent]["mdevs"][k]["uuid"] = inst.uuid


def _vgpu_types(facts: HostFacts, model: HostModel) -> None:
    """sriov_vgpu instances: the numeric type (given, or its name among the PF's VFs' types, as
    gpu_vgpu resolves it)."""
    for gpu in model.gpus:
        if gpu.use != "sriov_vgpu":
            continue
        from ..plan.vgpu.sriov import resolve_vgpu_type, vgpu_type_names  # only where a GPU is declared so

        offered_on = {a: vgpu_type_names(facts, a) for a in gpu.addresses}
        for inst in gpu.instances:
            offered = offered_on[inst.parent]
            inst.type_id = resolve_vgpu_type(inst.type, offered)
            if inst.type_id is None and offered:  # VFs not enabled yet: their types are the vgpu stage's to read
                names = ", ".join(f"{t} ({n})" for t, n in sorted(offered.items())[:8])
                model.refusals.append(
                    Refusal(
                        f"{gpu.where}: vGPU type {inst.type!r} is not offered by {inst.parent} (offered: {names})",
                        "use one of the offered types (`gpuprov inspect` lists them)",
                        inst.parent,
                    )
                )


# ---------------------------------------------------------------- VMs


def _vms(host: dict[str, Any], model: HostModel, cpu_limit: int | None) -> None:
    if not host.get("vms") and host.get("vm_defaults") is None:
        return  # no VMs: the VM list's checks have nothing to say (the fleet report reads many such hosts)
    from ..inputs.boundary import vm_list_problems

    by_gpu = {g.name: g for g in model.gpus}
    by_instance = {i.name: (g, i) for g in model.gpus for i in g.instances}
    vms = []
    for i, vm in enumerate(host.get("vms") or []):
        where = f"gpuprov_host.vms[{i}] {vm.get('name')!r}"
        out = {k: v for k, v in vm.items() if k != "gpus"}
        gpus: list[Any] = []
        mdevs: list[dict[str, Any]] = []
        vfs: list[dict[str, Any]] = []
        for j, ref in enumerate(vm.get("gpus") or []):
            name, rom = (ref["name"], ref.get("rom")) if isinstance(ref, dict) else (ref, None)
            before = (len(gpus), len(mdevs), len(vfs), len(model.refusals))
            for address in _gpu_ref(model, by_gpu, by_instance, f"{where}: gpus[{j}]", name, mdevs, vfs):
                gpus.append(address if rom is None else {"address": address, "rom": rom})
            if (len(gpus), len(mdevs), len(vfs), len(model.refusals)) == before:
                # Every name a VM gives stands for a device, or the VM is refused: never a VM that
                # quietly starts without the GPU it was declared with.
                model.refusals.append(
                    Refusal(
                        f"{where}: gpus[{j}] {name!r} stands for no device on this host",
                        "give the VM a GPU or instance that resolves here (`gpuprov inspect --declaration`)",
                    )
                )
        if "gpus" in vm:
            out["gpus"] = gpus
        if mdevs:
            out["mdevs"] = mdevs
        if vfs:
            out["vfs"] = vfs
        vms.append(out)
    model.vm_list, problems = vm_list_problems(
        vms, host.get("vm_defaults"), "gpuprov_host.vms", "gpuprov_host.vm_defaults", cpu_limit
    )
    model.problems.extend(problems)


def _gpu_ref(
    model: HostModel,
    by_gpu: dict[str, DeclaredGpu],
    by_instance: dict[str, tuple[DeclaredGpu, Instance]],
    where: str,
    ref: str,
    mdevs: list[dict[str, Any]],
    vfs: list[dict[str, Any]],
) -> list[str]:
    """A VM's reference -> the whole GPUs' addresses it stands for; instances go to ``mdevs``/``vfs``."""
    name, _bracket, index = ref.partition("[")
    if name in by_gpu and (index or "." not in ref):
        gpu = by_gpu[name]
        if gpu.use != "passthrough":
            hint = (
                "name one of its instances (" + ", ".join(i.name for i in gpu.instances[:4]) + ")"
                if gpu.instances
                else "declare it use: passthrough, or give the VM another GPU"
            )
            model.refusals.append(
                Refusal(
                    f"{where}: {ref!r} is {gpu.where}, declared use: {gpu.use}; a VM gets a whole GPU only with "
                    "use: passthrough",
                    hint,
                )
            )
            return []
        if not index:
            if not gpu.addresses:
                model.refusals.append(
                    Refusal(
                        f"{where}: {ref!r} is {gpu.where}, which stands for no GPU on this host (its selector "
                        "matched none, or only GPUs other entries have)",
                        "fix the entry's selector or address, or give the VM another GPU",
                    )
                )
            return list(gpu.addresses)
        j = int(index.rstrip("]"))
        if j >= len(gpu.addresses):
            name = ref.split("[", 1)[0]
            there = ", ".join(f"{name}[{i}] = {a}" for i, a in enumerate(gpu.addresses[:8])) or "none"
            more = " ..." if len(gpu.addresses) > 8 else ""
            model.refusals.append(
                Refusal(
                    f"{where}: {ref!r}: {gpu.where} selects {len(gpu.addresses)} GPU(s) on this host ({there}{more})",
                    (
                        f"count from 0: use {name}[0]"
                        if len(gpu.addresses) == 1
                        else f"count from 0: use one of {name}[0] to {name}[{len(gpu.addresses) - 1}]"
                    )
                    if gpu.addresses
                    else "fix the entry's selector or address, or give the VM another GPU",
                )
            )
            return []
        return [gpu.addresses[j]]
    if ref in by_instance:
        gpu, inst = by_instance[ref]
        if gpu.use == "mdev":
            if inst.uuid is None or inst.type_id is None:
                return []  # the layout's refusal names the type the host does not offer
            mdevs.append({"parent": inst.parent, "type": inst.type_id, "uuid": inst.uuid})
        elif inst.vf is None or inst.type_id is None:
            model.refusals.append(
                Refusal(
                    f"{where}: instance {ref!r} of {gpu.where} has no VF or vGPU type known yet "
                    f"(type {inst.type!r}; {inst.parent} shows no VF offering it)",
                    "run the vgpu stage first (it enables the VFs), or pin the instance's vf and give the type's ID",
                )
            )
        else:
            vfs.append({"address": inst.vf, "vgpu_type": inst.type_id})
        return []
    owner = by_gpu.get(ref.partition(".")[0])
    if owner is not None and not owner.addresses:
        model.refusals.append(
            Refusal(f"{where}: {ref!r}: {owner.where} stands for no GPU on this host (refused above)", None)
        )
        return []
    known = sorted([*by_gpu, *by_instance])
    model.refusals.append(
        Refusal(
            f"{where}: {ref!r} names no GPU or instance declared in gpuprov_host.gpus",
            f"declared: {', '.join(known[:12]) or 'none'}{' ...' if len(known) > 12 else ''}",
        )
    )
    return []
