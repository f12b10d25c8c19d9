"""NVIDIA SR-IOV vGPU: enable the VFs, set each VF's vGPU type."""

from __future__ import annotations

from ...core.plan import (
    sysfs_write,
)
from ...facts.host import HostFacts
from ...facts.vgpu_inputs import SRIOV_MANAGE, HostInputs
from ...inputs.vgpu_request import Entry, VgpuPlan, VgpuRequest, _problem, type_name_key
from ...rules.assess import VFIO_DRIVERS, held_open
from .checks import _cmd, _in_use, _in_use_unknown, _mixed, _pci_users
from .state import Managed


def vgpu_type_names(facts: HostFacts, pf: str, managed: Managed | None = None) -> dict[int, str]:
    """Type ID -> name of the vGPU types a PF's VFs offer (and those gpuprov set before, from the
    saved layout): what a type given by name is resolved against."""
    names = dict(managed.type_names) if managed else {}
    dev = facts.pci.get(pf)
    for vf in dev.virtfns if dev else []:
        state = facts.vgpu_vfs.get(vf)
        if state is not None:
            names.update(state.creatable)
    return names


def resolve_vgpu_type(ref: str | int, names: dict[int, str]) -> int | None:
    if isinstance(ref, int) or str(ref).strip().isdigit():
        return int(ref)
    text = str(ref).strip()
    for tid, name in names.items():
        if name == text:
            return tid
    matches = [tid for tid, name in names.items() if type_name_key(name) == type_name_key(text)]
    return matches[0] if len(matches) == 1 else None


def _plan_sriov_entry(
    facts: HostFacts,
    entry: Entry,
    managed: Managed,
    inputs: HostInputs,
    held: dict[str, list[str]],
    plan: VgpuPlan,
    final: dict[str, int],
) -> None:
    pf = facts.pci.get(entry.key)
    if pf is None:
        _problem(
            plan,
            f"no PCI device {entry.key} on this host (sriov_vgpu)",
            "check the address with `lspci -D` or `gpuprov inspect`",
            entry.key,
        )
        return
    if pf.physfn is not None:
        _problem(
            plan,
            f"{entry.key} is itself a VF (of {pf.physfn})",
            f"key the entry by the physical GPU {pf.physfn}",
            entry.key,
        )
        return
    if not pf.sriov_totalvfs:
        _problem(
            plan,
            f"{entry.key} ({pf.name}) has no SR-IOV virtual functions (no sriov_totalvfs)",
            "NVIDIA SR-IOV vGPU needs an Ampere or later data-center GPU with the vGPU host driver; "
            "older GPUs give vGPUs as mdevs (use: mdev), or pass the GPU through whole",
            entry.key,
        )
        return
    if pf.driver in VFIO_DRIVERS:
        _problem(
            plan,
            f"{entry.key} is bound to {pf.driver} (passthrough): the vGPU manager cannot slice it",
            "declare it for vGPUs, not use: passthrough (gpuprov_host), remove the early binding "
            "(vfio_host_state: unbound) and reboot",
            entry.key,
        )
        return
    if pf.driver != "nvidia":
        _problem(
            plan,
            f"{entry.key} is on driver {pf.driver or 'none'}, not nvidia",
            "install and load the NVIDIA vGPU host driver (vGPU manager) for this GPU",
            entry.key,
        )
        return
    vfs = sorted(pf.virtfns)
    if not vfs:
        if "sriov-manage" in inputs.tools:
            plan.actions.append(_cmd(["/" + SRIOV_MANAGE, "-e", entry.key], f"enable the SR-IOV VFs of {entry.key}"))
        else:
            plan.actions.append(
                sysfs_write(
                    f"{pf.sysfs_path}/sriov_numvfs", str(pf.sriov_totalvfs), f"enable the SR-IOV VFs of {entry.key}"
                )
            )
            plan.warnings.append(f"/{SRIOV_MANAGE} not found: the VFs of {entry.key} are enabled through sriov_numvfs")
        if entry.vgpus:
            plan.second_pass.append(entry.key)
            plan.warnings.append(f"the vGPU types of {entry.key} are checked and set once its VFs exist")
            for want in entry.vgpus:
                plan.vgpus.append(
                    {"pf": entry.key, "vf": want.vf, "type": want.type_ref, "name": None, "state": "pending"}
                )
        return
    names = vgpu_type_names(facts, entry.key, managed)
    taken: dict[str, int] = {}
    for i, want in enumerate(entry.vgpus):
        where = f"{entry.key}: vgpus[{i}]"
        address = want.vf or (vfs[i] if i < len(vfs) else None)
        if address is None:
            _problem(plan, f"{where}: the GPU has {len(vfs)} VFs, no VF number {i}", "declare fewer vGPUs", entry.key)
            continue
        if address not in vfs:
            _problem(
                plan,
                f"{where}: {address} is not a VF of {entry.key} (its VFs: {vfs[0]} to {vfs[-1]})",
                "pin one of its VFs",
                entry.key,
            )
            continue
        if address in taken:
            _problem(
                plan,
                f"{where}: VF {address} is taken by vgpus[{taken[address]}] too",
                "each vGPU needs its own VF (pin another)",
                address,
            )
            continue
        taken[address] = i
        want.address = address
        state = facts.vgpu_vfs.get(address)
        if state is None:
            if address in facts.mdev_parents:
                _problem(
                    plan,
                    f"{where}: VF {address} offers vGPUs as mdev types "
                    "(a driver older than the vendor-specific VFIO framework)",
                    f'declare the VF as an mdev parent instead: {{name: ..., address: "{address}", use: mdev, '
                    "instances: {TYPE: COUNT}}",
                    address,
                )
            else:
                _problem(
                    plan,
                    f"{where}: VF {address} shows no nvidia/creatable_vgpu_types",
                    "start the NVIDIA vGPU manager (nvidia-vgpu-mgr.service) and check the VFs are bound to nvidia",
                    address,
                )
            continue
        if state.current_type is None:
            _problem(
                plan,
                f"{where}: VF {address}'s nvidia/current_vgpu_type is unreadable",
                "check the vGPU manager's state (nvidia-smi vgpu) and that this runs as root",
                address,
            )
            continue
        tid = resolve_vgpu_type(want.type_ref, names)
        if tid is None or (tid not in names and tid != state.current_type):
            known = ", ".join(f"{k} ({v})" for k, v in sorted(names.items())) or "none creatable now"
            _problem(
                plan,
                f"{where}: vGPU type {want.type_ref!r} is not offered by {entry.key} (types: {known})",
                "use one of these names or IDs",
                entry.key,
            )
            continue
        want.type_id, want.name = tid, names.get(tid)
        dev = facts.pci[address]
        path = f"{dev.sysfs_path}/nvidia/current_vgpu_type"
        record = {"pf": entry.key, "vf": address, "type": tid, "name": want.name}
        final[address] = tid
        if state.current_type == tid:
            plan.vgpus.append({**record, "state": "present"})
            continue
        if state.current_type:
            if address not in managed.vfs:
                _problem(
                    plan,
                    f"{where}: VF {address} holds vGPU type {state.current_type} "
                    f"({names.get(state.current_type, '?')}), which gpuprov did not set",
                    "pin this vGPU to a free VF, or clear that one first "
                    f"(echo 0 > /sys/bus/pci/devices/{address}/nvidia/current_vgpu_type)",
                    address,
                )
                continue
            what = f"changing VF {address} from vGPU type {state.current_type} to {tid}"
            users = _pci_users(held, address, inputs.running)
            if _in_use(plan, what, users, address, _in_use_unknown(facts, inputs, [address])):
                continue
            plan.actions.append(sysfs_write(path, "0", f"clear vGPU type {state.current_type} from VF {address}"))
        elif tid not in state.creatable:
            creatable = ", ".join(f"{k} ({v})" for k, v in sorted(state.creatable.items())) or "none"
            _problem(
                plan,
                f"{where}: vGPU type {tid} ({want.name}) is not creatable on VF {address} now (creatable: {creatable})",
                "the GPU is full or holds another type: declare fewer or smaller vGPUs, or free VFs",
                address,
            )
            continue
        plan.actions.append(sysfs_write(path, str(tid), f"vGPU type {tid} ({want.name}) on VF {address}"))
        plan.vgpus.append({**record, "state": "set"})


def _plan_sriov(
    facts: HostFacts, entries: list[Entry], managed: Managed, inputs: HostInputs, request: VgpuRequest, plan: VgpuPlan
) -> None:
    held = held_open(facts)
    final: dict[str, int] = {}
    for entry in entries:
        _plan_sriov_entry(facts, entry, managed, inputs, held, plan, final)
    if request.boot:
        return
    # VFs gpuprov set before and no longer declared (or, with prune, any typed VF of a declared GPU).
    declared = {e.key for e in entries}
    for address, state in sorted(facts.vgpu_vfs.items()):
        dev = facts.pci.get(address)
        if dev is None or address in final or not state.current_type:
            continue
        if address in managed.vfs or (request.prune and dev.physfn in declared):
            what = f"clearing vGPU type {state.current_type} from VF {address}"
            users = _pci_users(held, address, inputs.running)
            if _in_use(plan, what, users, address, _in_use_unknown(facts, inputs, [address])):
                continue
            plan.actions.append(
                sysfs_write(f"{dev.sysfs_path}/nvidia/current_vgpu_type", "0", f"VF {address} is no longer declared")
            )
            plan.cleared_vfs.append({"vf": address, "type": state.current_type})
    cleared = {c["vf"] for c in plan.cleared_vfs}
    by_pf: dict[str, dict[str, list[str]]] = {}
    for address, state in facts.vgpu_vfs.items():
        dev = facts.pci.get(address)
        if dev is None or dev.physfn is None or address in cleared:
            continue
        tid = final.get(address, state.current_type or 0)
        if tid:
            by_pf.setdefault(dev.physfn, {}).setdefault(str(tid), []).append(address)
    for pf, by_type in sorted(by_pf.items()):
        _mixed(plan, pf, by_type, request.mixed_vgpu_types)
