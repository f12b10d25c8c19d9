"""The vGPU planner: config, facts and inputs in, a VgpuPlan out (:func:`plan_vgpu`, pure). Reading them
below a root first is gpuprov.apply.vgpu.read_host (the converge loop reads again after each pass)."""

from __future__ import annotations

from ...core.plan import COMMAND, Action
from ...facts.host import HostFacts
from ...facts.mig import MigFacts
from ...facts.packages import install_argv
from ...facts.vgpu_inputs import STATE_FILE, HostInputs
from ...inputs.vgpu_request import Entry, VgpuPlan, VgpuRequest, parse_gpus
from .mdev import _plan_mdevs
from .mig import _plan_mig_entry
from .persistence import _persistence
from .scheduler import _plan_scheduler
from .sriov import _plan_sriov
from .state import parse_state


def plan_vgpu(facts: HostFacts, request: VgpuRequest, inputs: HostInputs, mig: MigFacts | None = None) -> VgpuPlan:
    """The actions that give each declared GPU its instances, or the refusals. Pure."""
    plan = VgpuPlan()
    entries = parse_gpus(request.gpus, plan)
    if request.boot:
        entries = [e for e in entries if e.use in ("sriov_vgpu", "mig")]
    _layout, managed = parse_state(inputs.files.get(STATE_FILE), plan)
    if plan.refused:
        return plan
    _plan_mdevs(facts, [e for e in entries if e.use == "mdev"], managed, inputs, request, plan)
    _plan_sriov(facts, [e for e in entries if e.use == "sriov_vgpu"], managed, inputs, request, plan)
    for entry in entries:
        if entry.use == "mig":
            _plan_mig_entry(facts, entry, mig or MigFacts(error="not read"), request, plan)
    if not request.boot:
        _plan_scheduler(request, inputs, plan)
        if request.persistent and not plan.refused:
            _persistence(entries, request, inputs, managed, plan)
    if plan.refused:
        plan.actions = []
    elif not request.boot:
        _plan_mdevctl_install(entries, request, inputs, plan)
    return plan


MDEVCTL_PACKAGE = "mdevctl"


def _plan_mdevctl_install(entries: list[Entry], request: VgpuRequest, inputs: HostInputs, plan: VgpuPlan) -> None:
    """Install mdevctl first where an mdev entry is declared and neither its binary nor the package
    manager says it is there (unknown: installed, idempotently)."""
    if not request.install_mdevctl or "mdevctl" in inputs.tools or not any(e.use == "mdev" for e in entries):
        return
    packages = inputs.packages
    if packages is not None and not packages.missing([MDEVCTL_PACKAGE]):
        return
    argv = install_argv(packages.manager if packages else None, [MDEVCTL_PACKAGE])
    plan.install = Action(COMMAND, "mdevs persist as its definitions", argv=argv)
    plan.actions.insert(0, plan.install)
