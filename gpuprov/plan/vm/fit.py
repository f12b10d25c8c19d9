"""A host's VM list: the spec of each VM, where it runs, and whether the host can take it.

The VM list is what the inventory gives role ``gpu_vms`` (``gpu_vms_list``,
with ``gpu_vms_defaults`` merged under each entry) and what ``gpuprov plan``
reads from a YAML file. :func:`plan_host` checks the whole list against the
host facts before anything changes and reports every problem at once:

- a GPU, VF or mdev given twice, or an IOMMU group split between VMs;
- a device that is not vfio-ready (the safety rules of :mod:`gpuprov.rules.assess`;
  a device still on its host driver but bindable is fine: role vfio_host binds it);
- an mdev parent or type the host does not offer, more new instances than
  ``available_instances``, mixed vGPU types on an NVIDIA GPU (all vGPUs of a
  board share one profile unless the host opts into mixed sizes);
- SR-IOV vGPU VFs: a type that is not creatable, a VF that holds another type;
- host memory, CPUs and hugepages oversubscribed, on the host and on each NUMA node
  (memory is bound to its node: strict).

It also places each VM (:func:`gpuprov.plan.vm.place.place`): its NUMA node (the
node of its first GPU, VF or mdev parent, unless given), one host CPU per vCPU on
that node (first free, in list order, after the CPUs kept for the host), and
hugepages when enough are reserved. The module ``gpu_vm`` places a VM with the same
function over the same list, so the plan and the domains agree.

Pure: no I/O. Ships to targets with the modules; standard library only.

The checks live in :mod:`gpuprov.plan.vm.checks`, the data in
:mod:`gpuprov.core.vm_spec`, the input rules in :mod:`gpuprov.inputs.vm_list`.
"""

from __future__ import annotations

from typing import Any

from ...core.plan import Refusal
from ...core.vm_spec import HostPlan, HostSettings, Placement, VmSpec
from ...facts.host import HostFacts, cpu_count
from ...inputs.host_settings import check_settings
from ...inputs.validate import MAX_VMS, Problems, sequence
from ...inputs.vm_list import parse_vm
from ...rules.assess import held_open, open_holders
from .checks import (
    Ledger,
    check_groups,
    check_mdevs,
    check_pci,
    check_vgpu_vfs,
    check_whole_and_sliced,
    is_consumer_nvidia,
)
from .place import check_totals, place, size_mmio64


def plan_host(
    facts: HostFacts,
    vm_list: list[Any],
    settings: HostSettings | None = None,
    *,
    path: str = "gpu_vms_list",
    declared: dict[str, dict[str, str]] | None = None,
) -> HostPlan:
    """Check a host's whole VM list against its facts; place every VM. Pure.

    Entries and settings that break the input rules (:mod:`gpuprov.inputs.validate`) are
    refused first, each named by its field (``path[i].field``). ``declared``: the host model's
    address -> {use, entry} (:class:`gpuprov.model.host_model.HostModel`), checked by
    :func:`check_declared_uses`; None: no declaration (a VM list alone)."""
    settings = settings or HostSettings()
    plan = HostPlan()
    problems = Problems()
    reserved = check_settings(settings, problems)
    if sequence(problems, path, vm_list, MAX_VMS) is None or problems:
        plan.refusals.extend(problems.items)
        return plan
    names: dict[str, int] = {}
    for i, data in enumerate(vm_list):
        spec, found = parse_vm(data, i, path=f"{path}[{i}]", cpu_limit=cpu_count(facts))
        plan.refusals.extend(found)
        if spec is None:
            continue
        if spec.name in names:
            plan.refusals.append(Refusal(f"VM {spec.name} is listed twice", "VM names are libvirt domain names"))
            continue
        names[spec.name] = i
        plan.vms.append(spec)
    active = [v for v in plan.vms if v.state != "absent"]
    place(facts, active, plan, reserved)
    held, holders = held_open(facts), open_holders(facts)
    ledger = Ledger(plan)
    for vm in active:
        check_pci(facts, vm, plan, ledger, held, holders)
        size_mmio64(facts, vm, plan)
        placement = plan.placements[vm.name]
        if vm.hide_kvm is None:
            placement.hide_kvm = any(is_consumer_nvidia(facts, g.address) for g in vm.gpus)
        else:
            placement.hide_kvm = vm.hide_kvm
    if declared is not None:
        check_declared_uses(facts, active, plan, declared)
    check_groups(facts, plan, ledger)
    check_whole_and_sliced(facts, active, plan, ledger)
    check_mdevs(facts, active, plan, ledger, settings)
    check_vgpu_vfs(facts, active, plan, settings)
    check_totals(facts, active, plan, settings, reserved)
    for vm in plan.vms:
        plan.placements.setdefault(vm.name, Placement(node=None, cpus=None, hugepage_kib=None))
    return plan


# What a VM's device must be declared as: a whole GPU, an mdev's parent, a VF's PF.
_VM_DEVICE_USE = {"gpus": "passthrough", "mdevs": "mdev", "vfs": "sriov_vgpu"}


def check_declared_uses(
    facts: HostFacts, vms: list[VmSpec], plan: HostPlan, declared: dict[str, dict[str, str]]
) -> None:
    """Every VM device against the host's declaration: a whole GPU only from a ``use: passthrough``
    entry (libvirt's managed='yes' would take a ``use: host`` GPU from the host when the VM
    starts), an mdev only on a ``use: mdev`` parent, a VF only of a ``use: sriov_vgpu`` PF; a
    device the declaration lacks is refused too (docs/reference/host-model.md)."""
    for vm in vms:
        devices = [("gpus", g.address) for g in vm.gpus] + [("mdevs", m.parent) for m in vm.mdevs]
        for vf in vm.vfs:
            dev = facts.pci.get(vf.address)
            devices.append(("vfs", dev.physfn if dev is not None and dev.physfn else vf.address))
        for kind, address in devices:
            want = _VM_DEVICE_USE[kind]
            entry = declared.get(address)
            if entry is None:
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: {address} is not declared in the host's GPUs",
                        f"declare it (use: {want}) in gpuprov_host.gpus, or give the VM a declared one",
                        address,
                    )
                )
            elif entry["use"] != want:
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: {address} is {entry['entry']}, declared use: {entry['use']}; "
                        f"the VM's {kind} need use: {want}",
                        f"declare it use: {want}, or give the VM another device",
                        address,
                    )
                )


def check_declared_mdevs(plan: HostPlan, declared: dict[str, dict[str, str]]) -> None:
    """VMs' mdevs against the vGPU layout (``gpuprov_gpus``, UUID -> {parent, type}, from
    ``gpuprov.plan.vgpu.declared_mdevs``): the role vgpu_host makes and keeps those; an mdev a VM
    names that the layout lacks is made at start by gpu_vm but not again after a reboot."""
    for vm in plan.vms:
        if vm.state == "absent":
            continue
        for m in vm.mdevs:
            want = declared.get(m.uuid)
            if want is None:
                plan.warnings.append(
                    f"VM {vm.name}: mdev {m.uuid} ({m.type} on {m.parent}) is not in gpuprov_gpus: "
                    "it is made when the VM starts, but nothing makes it again after a reboot"
                )
            elif (want["parent"], want["type"]) != (m.parent, m.type):
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: mdev {m.uuid} is {m.type} on {m.parent}, but gpuprov_gpus declares it "
                        f"as {want['type']} on {want['parent']}",
                        "make the VM's mdev and the gpuprov_gpus entry agree",
                        m.uuid,
                    )
                )
