"""Whether the host can give each VM its devices: the checks of the host plan
(:func:`gpuprov.plan.vm.fit.plan_host`) on PCI devices, IOMMU groups, mdevs and
SR-IOV vGPU VFs.

- a GPU, VF or mdev given twice (:class:`Ledger`), or an IOMMU group split between VMs;
- a device that is not vfio-ready (the safety rules of :mod:`gpuprov.rules.assess`,
  docs/concepts/safety-rules.md);
- a GPU passed whole and sliced too;
- an mdev parent or type the host does not offer, more new instances than
  ``available_instances``, mixed vGPU types on an NVIDIA GPU;
- a VF vGPU type that is not creatable, a VF that holds another type.

Pure: no I/O. Standard library only.
"""

from __future__ import annotations

from ...core.plan import Refusal
from ...core.vm_spec import HostPlan, HostSettings, VmSpec
from ...facts.host import HostFacts
from ...facts.usage import OpenDeviceFile
from ...rules.assess import BLOCKER, VFIO_DRIVERS, assess_gpu, companions_of, open_holders
from ..vgpu.checks import mixed_types_refusal

NVIDIA = 0x10DE


def is_consumer_nvidia(facts: HostFacts, address: str) -> bool:
    dev = facts.pci.get(address)
    if dev is None or dev.vendor_id != NVIDIA:
        return False
    name = f"{dev.vendor_name or ''} {dev.device_name or ''}"
    return any(word in name for word in ("GeForce", "TITAN"))


def _slot_functions(facts: HostFacts, address: str) -> list[str]:
    """The GPU and the functions of its slot that must go with it, in function order."""
    if address not in facts.pci:
        return [address]
    return sorted({address, *companions_of(facts, address)})


class Ledger:
    """Who was given each host device: a GPU/VF/mdev given twice is found here."""

    def __init__(self, plan: HostPlan) -> None:
        self.plan = plan
        self.owner: dict[str, tuple[str, str]] = {}  # device -> (vm, how)

    def take(self, device: str, vm: str, how: str) -> None:
        if device in self.owner:
            other_vm, other_how = self.owner[device]
            where = "twice to VM " + vm if other_vm == vm else f"to VM {other_vm} ({other_how}) and to VM {vm}"
            self.plan.refusals.append(
                Refusal(
                    f"{device} is given {where} ({how})",
                    "a device goes to one VM once; remove the duplicate",
                    device,
                )
            )
            return
        self.owner[device] = (vm, how)


def check_pci(
    facts: HostFacts,
    vm: VmSpec,
    plan: HostPlan,
    ledger: Ledger,
    held: dict[str, list[str]],
    holders: dict[str, list[OpenDeviceFile]] | None = None,
) -> None:
    holders = open_holders(facts) if holders is None else holders
    placement = plan.placements[vm.name]
    vm_devices: set[str] = set()
    for gpu in vm.gpus:
        vm_devices.update(_slot_functions(facts, gpu.address))
    vm_devices.update(vf.address for vf in vm.vfs)
    wanted: list[tuple[str, str]] = [(g.address, "gpus") for g in vm.gpus] + [(v.address, "vfs") for v in vm.vfs]
    for addr, how in wanted:
        dev = facts.pci.get(addr)
        if dev is None:
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: no PCI device {addr} on this host ({how})",
                    "check the address with `lspci -D` or `gpuprov inspect --all`",
                    addr,
                )
            )
            continue
        if how == "vfs" and dev.physfn is None:
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: {addr} is not an SR-IOV virtual function (vfs)",
                    "list a whole GPU under gpus; VFs come from `sriov-manage -e` or sriov_numvfs",
                    addr,
                )
            )
        functions = _slot_functions(facts, addr) if how == "gpus" else [addr]
        if how == "gpus":
            placement.pci_slots.append(functions)
        else:
            placement.pci_slots.append([addr])
        for i, function in enumerate(functions):
            ledger.take(function, vm.name, how if i == functions.index(addr) else f"goes with {addr}")
        told: set[str] = set()  # members whose holders were judged (one finding per holder)
        for finding in assess_gpu(facts, addr, held).findings:
            if finding.severity != BLOCKER:
                continue
            if finding.code == "group-shared" and finding.device in vm_devices:
                continue  # the other member goes to the same VM
            if finding.code == "in-use":
                member = facts.pci.get(finding.device or addr)
                if member is not None and member.driver in VFIO_DRIVERS:
                    if member.address not in told:
                        told.add(member.address)
                        _vfio_holders(vm, addr, member.address, holders.get(member.address, []), plan)
                    continue
            plan.refusals.append(
                Refusal(f"VM {vm.name}: {addr} is not vfio-ready: {finding.message}", finding.fix, addr)
            )


def _vfio_holders(vm: VmSpec, addr: str, member: str, files: list[OpenDeviceFile], plan: HostPlan) -> None:
    """A vfio-bound device a process holds open: fine only when that process is this VM's own QEMU
    (its ``-name guest=`` or libvirt's pid file says so: the VM runs already). A holder plan cannot
    tie to this VM (another VM, a process that is no QEMU, a capture that keeps no command lines)
    is refused, named: "it must be this VM's own" is a guess, and a wrong one takes a running
    guest's GPU."""
    device = addr if member == addr else f"{addr} ({member} of its IOMMU group)"
    others = [f for f in files if not f.runs(vm.name)]
    if files and not others:
        pids = ", ".join(str(p) for p in sorted({f.pid for f in files}))
        plan.warnings.append(f"VM {vm.name}: {device} is held open by this VM's own QEMU (pid {pids}): it runs")
        return
    whom = "; ".join(f"{f.describe()} has {f.path} open" for f in others) or "a process"
    guests = sorted({f.guest for f in others if f.guest})
    why = (
        f"another VM's ({', '.join(guests)})"
        if all(f.guest for f in others)
        else f"a holder plan cannot tie to VM {vm.name} (no -name guest= or libvirt pid file names it)"
    )
    plan.refusals.append(
        Refusal(
            f"VM {vm.name}: {device} is in use: {whom}; {why}",
            "stop that process (or the VM it runs) or give this VM another GPU",
            addr,
        )
    )


def check_groups(facts: HostFacts, plan: HostPlan, ledger: Ledger) -> None:
    """An IOMMU group goes to one VM whole: vfio attaches a group to one container."""
    users: dict[str, dict[str, list[str]]] = {}
    for device, (vm, _how) in ledger.owner.items():
        dev = facts.pci.get(device)
        if dev is not None and dev.iommu_group is not None:
            users.setdefault(dev.iommu_group, {}).setdefault(vm, []).append(device)
    for group, by_vm in sorted(users.items()):
        if len(by_vm) > 1:
            parts = ", ".join(f"{vm} ({', '.join(sorted(devs))})" for vm, devs in by_vm.items())
            plan.refusals.append(
                Refusal(
                    f"IOMMU group {group} is split between VMs {parts}",
                    "a group goes to one VM whole; give these devices to the same VM",
                )
            )


def check_whole_and_sliced(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, ledger: Ledger) -> None:
    """A GPU passed whole cannot also give VFs or mdevs to VMs."""
    for device, (vm, how) in ledger.owner.items():
        if how != "gpus":
            continue
        dev = facts.pci.get(device)
        slices = [f"VF {vf} (VM {ledger.owner[vf][0]})" for vf in (dev.virtfns if dev else []) if vf in ledger.owner]
        slices += [f"mdev {m.uuid} (VM {other.name})" for other in vms for m in other.mdevs if m.parent == device]
        if slices:
            plan.refusals.append(
                Refusal(
                    f"{device} is passed whole to VM {vm} and sliced too: {', '.join(slices)}",
                    "pass a GPU whole or slice it into vGPUs, not both",
                    device,
                )
            )


def _parent_vendor(facts: HostFacts, parent: str) -> int | None:
    dev = facts.pci.get(parent)
    return dev.vendor_id if dev else None


def check_mdevs(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, ledger: Ledger, settings: HostSettings) -> None:
    existing = {m.uuid: m for m in facts.mdevs}
    new_count: dict[tuple[str, str], list[str]] = {}
    types_on: dict[str, dict[str, list[str]]] = {}  # parent -> type -> who
    for inst in facts.mdevs:
        if inst.parent and inst.type_id:
            types_on.setdefault(inst.parent, {}).setdefault(inst.type_id, []).append(f"existing mdev {inst.uuid}")
    for vm in vms:
        for m in vm.mdevs:
            ledger.take(m.uuid, vm.name, f"mdev {m.type} on {m.parent}")
            parent = facts.mdev_parents.get(m.parent)
            if parent is None:
                offered = ", ".join(sorted(facts.mdev_parents)) or "none"
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: no mdev parent {m.parent} on this host (mdev parents: {offered})",
                        "load the vGPU host driver (NVIDIA vGPU manager, mtty...) or fix the parent",
                        m.parent,
                    )
                )
                continue
            mtype = parent.types.get(m.type)
            if mtype is None:
                offered = ", ".join(f"{t.type_id} ({t.name})" for t in parent.types.values()) or "none"
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: mdev type {m.type} is not offered by {m.parent} (offered: {offered})",
                        "pick one of the offered types (`gpuprov inspect` lists them)",
                        m.parent,
                    )
                )
                continue
            types_on.setdefault(m.parent, {}).setdefault(m.type, []).append(f"VM {vm.name}")
            old = existing.get(m.uuid)
            if old is not None:
                if (old.parent, old.type_id) != (m.parent, m.type):
                    plan.refusals.append(
                        Refusal(
                            f"VM {vm.name}: mdev {m.uuid} exists already as {old.type_id} on {old.parent}, "
                            f"not {m.type} on {m.parent}",
                            "use another UUID, or remove that mdev first",
                            m.uuid,
                        )
                    )
                continue
            new_count.setdefault((m.parent, m.type), []).append(vm.name)
    for (parent_name, type_id), who in sorted(new_count.items()):
        available = facts.mdev_parents[parent_name].types[type_id].available_instances
        if available is not None and len(who) > available:
            plan.refusals.append(
                Refusal(
                    f"{len(who)} new {type_id} mdevs on {parent_name} (VMs {', '.join(who)}) but "
                    f"available_instances is {available}",
                    "use fewer or smaller vGPUs, or another GPU",
                    parent_name,
                )
            )
    for parent_name, by_type in sorted(types_on.items()):
        if _parent_vendor(facts, parent_name) == NVIDIA:
            refusal = mixed_types_refusal(parent_name, by_type, settings.mixed_vgpu_types)
            if refusal:
                plan.refusals.append(refusal)


def check_vgpu_vfs(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, settings: HostSettings) -> None:
    wanted: dict[str, int] = {}
    for vm in vms:
        for vf in vm.vfs:
            if vf.vgpu_type is None:
                continue
            state = facts.vgpu_vfs.get(vf.address)
            if state is None:
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: {vf.address} shows no NVIDIA vGPU types (nvidia/creatable_vgpu_types)",
                        "enable the VFs with the vGPU manager (`sriov-manage -e`), or drop vgpu_type",
                        vf.address,
                    )
                )
                continue
            wanted[vf.address] = vf.vgpu_type
            if state.current_type and state.current_type != vf.vgpu_type:
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: {vf.address} already holds vGPU type {state.current_type}, not {vf.vgpu_type}",
                        "clear it first (echo 0 > nvidia/current_vgpu_type) while no VM uses it",
                        vf.address,
                    )
                )
            elif state.current_type != vf.vgpu_type and vf.vgpu_type not in state.creatable:
                creatable = ", ".join(f"{k} ({v})" for k, v in sorted(state.creatable.items())) or "none"
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: vGPU type {vf.vgpu_type} is not creatable on {vf.address} "
                        f"(creatable now: {creatable})",
                        "pick a creatable type; on a GPU that holds vGPUs already only their type is creatable",
                        vf.address,
                    )
                )
    # All VFs of one GPU: the types asked for plus those the other VFs hold.
    by_pf: dict[str, dict[str, list[str]]] = {}
    for addr, state in facts.vgpu_vfs.items():
        dev = facts.pci.get(addr)
        if dev is None or dev.physfn is None:
            continue
        vtype = wanted.get(addr, state.current_type or None)
        if vtype:
            by_pf.setdefault(dev.physfn, {}).setdefault(str(vtype), []).append(addr)
    for pf, by_type in sorted(by_pf.items()):
        refusal = mixed_types_refusal(pf, by_type, settings.mixed_vgpu_types)
        if refusal:
            plan.refusals.append(refusal)
