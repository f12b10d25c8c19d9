"""gpu_vgpu's options and its read-and-plan step, one copy for the module and for gpu_host_plan
(docs/concepts/plan-gate.md).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..apply.actions import ApplyError
from ..apply.vgpu import first_pass, plan_host
from ..core.plan import Plan, Refusal
from ..facts.host import HostFacts, gather
from ..facts.sysfs import Sysfs
from ..inputs.boundary import validate_gpu_vgpu_options
from ..inputs.vgpu_request import VgpuPlan, VgpuRequest
from ..plan.host.drain import Disruption, vgpu_disruption
from .common import warn_or_refuse
from .gpu_host_model import declaration
from .vfio_bind import Resolver, quiet

ARGUMENT_SPEC: dict[str, Any] = {
    "gpus": {"type": "dict"},
    "host": {"type": "dict"},
    "layouts": {"type": "dict"},
    "scheduler": {"type": "str", "choices": ["best_effort", "equal_share", "fixed_share"]},
    "scheduler_timeslice_ms": {"type": "int"},
    "mixed_vgpu_types": {"type": "bool"},
    "persistent": {"type": "bool", "default": True},
    "prune": {"type": "bool", "default": False},
    "allow_mig_mode_change": {"type": "bool", "default": False},
    "install_mdevctl": {"type": "bool", "default": False},
    "runner_sha256": {"type": "str"},
    "root": {"type": "path", "default": "/"},
}
RULES: dict[str, Any] = {"mutually_exclusive": [("gpus", "host")], "required_by": {"layouts": "host"}}


def option_problems(p: dict[str, Any]) -> list[Refusal]:
    """Every problem of the options themselves, before anything is read (docs/reference/inputs.md)."""
    # host and layouts are the declaration's, checked when it resolves; an unset mixed_vgpu_types
    # takes the declaration's setting.
    given = {k: v for k, v in p.items() if k not in ("host", "layouts") and not (k == "mixed_vgpu_types" and v is None)}
    return validate_gpu_vgpu_options(given)


def refuse_options(module: Any) -> None:
    """Fail the module, nothing read or changed, on :func:`option_problems`."""
    problems = option_problems(module.params)
    if problems:
        warn_or_refuse(module, Plan(refusals=problems), {"plan": [], "not_run": [], "root": module.params["root"]})


def plan(p: dict[str, Any], resolver: Resolver, facts: HostFacts | None = None) -> tuple[VgpuPlan, VgpuRequest]:
    """The first plan for the module's params ``p`` (with ``host``: its layout, resolved by
    ``resolver`` on the facts the planner reads anyway, or ``facts`` when the caller read them) and
    the request it answers."""
    sysfs = Sysfs(p["root"])
    gpus, mixed = p["gpus"] or {}, p["mixed_vgpu_types"]
    if p["host"] is not None:
        facts = facts if facts is not None else gather(sysfs)
        model = resolver(declaration(p["host"], p["layouts"]), facts)
        gpus = model.layout
        mixed = model.settings.mixed_vgpu_types if mixed is None else mixed
    request = VgpuRequest(
        gpus=gpus,
        scheduler=p["scheduler"],
        scheduler_timeslice_ms=p["scheduler_timeslice_ms"],
        mixed_vgpu_types=bool(mixed),
        persistent=p["persistent"],
        prune=p["prune"],
        allow_mig_mode_change=p["allow_mig_mode_change"],
        install_mdevctl=p["install_mdevctl"],
        runner_sha256=p["runner_sha256"],
    )
    return plan_host(sysfs, request, facts=facts), request


def carry_first_pass(module: Any, plan: VgpuPlan, request: VgpuRequest) -> tuple[VgpuPlan, dict[str, Any]]:
    """The first pass carried out where the plan owes one (gpuprov.apply.vgpu.first_pass: an install,
    VFs enabled; not in check mode), and the plan that follows it, with what the module returns
    besides it; the module fails, saying what was done, when a step of it fails."""
    root = module.params["root"]
    try:
        plan, first = first_pass(root, request, plan, check=module.check_mode)
    except ApplyError as exc:
        module.fail_json(msg=str(exc), done=exc.applied.done, plan=plan.describe(), **plan.result())
        raise
    extra = plan.result()
    if first is not None:
        extra["first_pass"] = first.done
    return plan, extra


def pending(p: dict[str, Any], resolver: Resolver, facts: HostFacts | None = None) -> tuple[str | None, Disruption]:
    """Why the module must run for ``p`` (None: it would change, install and say nothing), and the
    devices whose holders its change takes (docs/guides/rolling.md)."""
    if option_problems(p):
        return "its options are refused", Disruption()
    vgpu = plan(p, resolver, facts)[0]
    disruption = vgpu_disruption(vgpu, Sysfs(p["root"]).live)
    if vgpu.install is not None or vgpu.second_pass or vgpu.reboot_required:
        return "a first pass or a reboot is owed", disruption
    if vgpu.runner == "install":
        return "the boot runner is missing or differs", disruption
    return quiet(vgpu, p["root"]), disruption
