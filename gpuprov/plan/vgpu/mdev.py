"""mdev instances: resolve types, create and remove them through sysfs, their mdevctl definitions."""

from __future__ import annotations

import json
from typing import Any

from ...core.plan import (
    REMOVE_FILE,
    Action,
    Plan,
    Refusal,
    file_action,
    sysfs_write,
)
from ...facts.host import HostFacts
from ...facts.mdev import MdevParent, MdevType
from ...facts.vgpu_inputs import MDEVCTL_DIR, HostInputs
from ...inputs.vgpu_request import (
    NVIDIA,
    Entry,
    MdevWant,
    VgpuPlan,
    VgpuRequest,
    _problem,
    derived_uuid,
    parse_gpus,
    type_name_key,
)
from .checks import _in_use, _in_use_unknown, _mdev_users, _mixed
from .state import Managed


def _resolve_mdev_type(parent: MdevParent, ref: str) -> tuple[MdevType | None, str | None]:
    if ref in parent.types:
        return parent.types[ref], None
    named = [t for t in parent.types.values() if t.name == ref] or [
        t for t in parent.types.values() if type_name_key(t.name) == type_name_key(ref)
    ]
    if len(named) == 1:
        return named[0], None
    if named:
        return None, f"type name {ref!r} matches {', '.join(t.type_id for t in named)} on {parent.parent}"
    offered = ", ".join(f"{t.type_id} ({t.name})" for t in parent.types.values()) or "none"
    return None, f"mdev type {ref!r} is not offered by {parent.parent} (offered: {offered})"


def _resolve_mdevs(facts: HostFacts, entries: list[Entry], plan: Plan) -> list[MdevWant]:
    """Each declared mdev with its type resolved and its UUID (given or derived); problems go to ``plan``."""
    wanted: list[MdevWant] = []
    for entry in entries:
        parent = facts.mdev_parents.get(entry.key)
        if parent is None:
            offered = ", ".join(sorted(facts.mdev_parents)) or "none"
            dev = facts.pci.get(entry.key)
            if dev is not None:
                problem = (
                    f"{entry.key} offers no mdev types (driver {dev.driver or 'none'}; mdev parents here: {offered})"
                )
                fix = (
                    "load the NVIDIA vGPU host driver (vGPU manager) for this GPU; Ampere and later GPUs "
                    "give vGPUs through SR-IOV VFs instead: use: sriov_vgpu"
                )
            else:
                problem = f"no mdev parent {entry.key} on this host (mdev parents here: {offered})"
                fix = "load the parent's driver (the NVIDIA vGPU manager, mtty...) or fix the key"
            _problem(plan, problem, fix, entry.key)
            continue
        if facts.pci.get(entry.key) is not None and facts.pci[entry.key].physfn is not None:
            plan.warnings.append(
                f"{entry.key} is an SR-IOV VF: VFs are gone after a reboot until enabled again "
                "(sriov-manage -e), and mdevctl starts its mdevs only once the VF is back"
            )
        ranks: dict[str, int] = {}
        for i, want in enumerate(entry.mdevs):
            mtype, problem = _resolve_mdev_type(parent, want.type_ref)
            if mtype is None:
                _problem(
                    plan,
                    f"{entry.key}: mdevs[{i}]: {problem}",
                    "use one of the offered types (`gpuprov inspect` lists them)",
                    entry.key,
                )
                continue
            want.type_id, want.name = mtype.type_id, mtype.name
            if want.uuid is None:
                rank = ranks.get(mtype.type_id, 0)
                ranks[mtype.type_id] = rank + 1
                want.uuid = derived_uuid(entry.key, mtype.type_id, rank)
            wanted.append(want)
    return wanted


def declared_mdevs(facts: HostFacts, gpus: Any) -> tuple[dict[str, dict[str, str]], list[Refusal]]:
    """UUID -> {parent, type} of every mdev ``gpus`` (gpuprov_gpus) declares, as vgpu_host will
    create them, and the problems found: for checking VMs' mdevs against the vGPU layout."""
    plan = Plan()
    wanted = _resolve_mdevs(facts, [e for e in parse_gpus(gpus, plan) if e.use == "mdev"], plan)
    return {str(w.uuid): {"parent": w.parent, "type": str(w.type_id)} for w in wanted}, plan.refusals


def mdev_uuids(facts: HostFacts, gpus: Any) -> tuple[dict[str, list[tuple[str, str] | None]], list[Refusal]]:
    """Parent -> (UUID, type directory) of each mdev ``gpus`` (gpuprov_gpus) declares on it, in order (None: its
    type is not offered), as vgpu_host makes them; and the problems. The host model
    (:mod:`gpuprov.model.resolve`) gives VMs these, so a VM's mdev and the layout's are one."""
    plan = Plan()
    entries = [e for e in parse_gpus(gpus, plan) if e.use == "mdev"]
    _resolve_mdevs(facts, entries, plan)  # fills each want's uuid (given or derived) in place
    return {e.key: [(str(w.uuid), w.type_id) if w.type_id else None for w in e.mdevs] for e in entries}, plan.refusals


def _plan_mdevs(
    facts: HostFacts,
    entries: list[Entry],
    managed: Managed,
    inputs: HostInputs,
    request: VgpuRequest,
    plan: VgpuPlan,
) -> list[MdevWant]:
    existing = {m.uuid: m for m in facts.mdevs}
    wanted = _resolve_mdevs(facts, entries, plan)
    by_uuid: dict[str, MdevWant] = {}
    for want in wanted:
        if want.uuid in by_uuid:
            other = by_uuid[want.uuid]
            _problem(
                plan,
                f"mdev {want.uuid} is declared twice ({other.parent} and {want.parent})",
                "give each mdev its own UUID",
                want.uuid,
            )
        by_uuid[str(want.uuid)] = want
    declared = {e.key for e in entries}
    removals: list[Any] = []
    if not request.boot:
        for uuid, inst in sorted(existing.items()):
            if uuid in by_uuid:
                continue
            ours = managed.mdevs.get(uuid)
            if ours is not None or (request.prune and inst.parent in declared):
                removals.append(inst)
    changes = []
    new_count: dict[tuple[str, str], list[str]] = {}
    for want in wanted:
        inst = existing.get(str(want.uuid))
        record = {"parent": want.parent, "type": want.type_id, "name": want.name, "uuid": want.uuid}
        if inst is None:
            new_count.setdefault((want.parent, str(want.type_id)), []).append(str(want.uuid))
            plan.mdevs.append({**record, "state": "created"})
        elif (inst.parent, inst.type_id) == (want.parent, want.type_id):
            plan.mdevs.append({**record, "state": "present"})
        elif str(want.uuid) in managed.mdevs:
            changes.append((inst, want))
            new_count.setdefault((want.parent, str(want.type_id)), []).append(str(want.uuid))
            plan.mdevs.append({**record, "state": "created", "replaces": f"{inst.type_id} on {inst.parent}"})
        else:
            _problem(
                plan,
                f"mdev {want.uuid} exists already as {inst.type_id} on {inst.parent}, "
                f"not {want.type_id} on {want.parent}, and gpuprov did not make it",
                "give this entry another UUID, or remove that mdev first (mdevctl stop and undefine)",
                want.uuid,
            )
    for inst in removals + [c[0] for c in changes]:
        what = f"removing mdev {inst.uuid} ({inst.type_id} on {inst.parent})"
        users = _mdev_users(facts, inst.uuid, inst.iommu_group, inputs.running)
        _in_use(plan, what, users, inst.uuid, _in_use_unknown(facts, inputs, [str(inst.parent)]))
    # Capacity: what the type offers now, plus what this run frees of that same type.
    freed: dict[tuple[str, str], int] = {}
    for inst in removals + [c[0] for c in changes]:
        key = (str(inst.parent), str(inst.type_id))
        freed[key] = freed.get(key, 0) + 1
    for (parent_name, type_id), uuids in sorted(new_count.items()):
        available = facts.mdev_parents[parent_name].types[type_id].available_instances
        room = None if available is None else available + freed.get((parent_name, type_id), 0)
        if room is not None and len(uuids) > room:
            _problem(
                plan,
                f"{len(uuids)} new {type_id} mdevs on {parent_name} but available_instances is {available}",
                "declare fewer or smaller vGPUs on this parent, or use another GPU",
                parent_name,
            )
    # NVIDIA time-sliced vGPU: one type per board unless mixed mode.
    removing = {i.uuid for i in removals} | {c[0].uuid for c in changes}
    types_on: dict[str, dict[str, list[str]]] = {}
    for inst in facts.mdevs:
        if inst.uuid not in removing and inst.parent and inst.type_id and inst.uuid not in by_uuid:
            types_on.setdefault(inst.parent, {}).setdefault(inst.type_id, []).append(f"existing mdev {inst.uuid}")
    for want in wanted:
        types_on.setdefault(want.parent, {}).setdefault(str(want.type_id), []).append(f"mdev {want.uuid}")
    for parent_name, by_type in sorted(types_on.items()):
        dev = facts.pci.get(parent_name)
        if dev is not None and dev.vendor_id == NVIDIA:
            _mixed(plan, parent_name, by_type, request.mixed_vgpu_types)
    # Actions: removals first (they free room), then creations.
    for inst in removals + [c[0] for c in changes]:
        plan.actions.append(
            sysfs_write(f"sys/bus/mdev/devices/{inst.uuid}/remove", "1", f"remove mdev {inst.type_id} on {inst.parent}")
        )
        plan.removed_mdevs.append({"parent": inst.parent, "type": inst.type_id, "uuid": inst.uuid})
    for want in wanted:
        inst = existing.get(str(want.uuid))
        if inst is None or str(want.uuid) in {c[1].uuid for c in changes}:
            path = f"sys/class/mdev_bus/{want.parent}/mdev_supported_types/{want.type_id}/create"
            plan.actions.append(
                sysfs_write(path, str(want.uuid), f"create mdev {want.type_id} ({want.name}) on {want.parent}")
            )
    plan.removed_mdevs = [r for r in plan.removed_mdevs if r["uuid"] not in by_uuid]
    if request.persistent and not request.boot:
        _mdevctl_files(wanted, removals, managed, inputs, plan)
    return wanted


def mdevctl_definition(type_id: str) -> str:
    """An mdevctl definition, as ``mdevctl define --auto`` writes it: started when its parent appears."""
    return json.dumps({"mdev_type": type_id, "start": "auto", "attrs": []}, indent=2) + "\n"


def _mdevctl_files(
    wanted: list[MdevWant], removals: list[Any], managed: Managed, inputs: HostInputs, plan: VgpuPlan
) -> None:
    keep = {f"{w.parent}/{w.uuid}" for w in wanted}
    for want in wanted:
        rel = f"{want.parent}/{want.uuid}"
        action = file_action(
            f"{MDEVCTL_DIR}/{rel}",
            mdevctl_definition(str(want.type_id)),
            inputs.mdevctl_defs.get(rel),
            f"mdevctl starts mdev {want.uuid} at boot",
        )
        if action:
            plan.actions.append(action)
    # Definitions of mdevs gpuprov made (or prunes) and no longer declared there; others' stay.
    ours = set(managed.mdevs) | {i.uuid for i in removals}
    for rel, text in sorted(inputs.mdevctl_defs.items()):
        if rel not in keep and rel.rsplit("/", 1)[-1] in ours:
            plan.actions.append(
                Action(
                    REMOVE_FILE,
                    f"mdev {rel.rsplit('/', 1)[-1]} is no longer declared",
                    path=f"{MDEVCTL_DIR}/{rel}",
                    before=text,
                )
            )
