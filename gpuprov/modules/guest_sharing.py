"""guest_sharing's options and its run: the guest declaration (``gpuprov_guest``) through the one boundary
(:func:`gpuprov.inputs.sharing.parse_guest`), then :func:`gpuprov.apply.sharing.converge` (facts -> plan ->
apply -> the daemons answering as declared), then the result.

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..apply.sharing import converge
from ..core.plan import Plan
from ..inputs.sharing import parse_guest
from ..inputs.validate import Problems, path_text
from .common import failed_result, planned, warn_or_refuse

ARGUMENT_SPEC: dict[str, Any] = {
    "declaration": {"type": "raw"},
    "cdi": {"type": "bool", "default": True},
    "cdi_output": {"type": "path", "default": "/etc/cdi/nvidia.yaml"},
    "root": {"type": "path", "default": "/"},
}


def run(module: Any) -> None:
    """The module's whole run: refuse bad options, plan, apply (unless check mode), exit."""
    params = module.params
    p = Problems()
    cdi_output = path_text(p, "cdi_output", params["cdi_output"])
    decl, refusals = parse_guest(params.get("declaration"), "declaration")
    refusals = p.items + refusals
    result: dict[str, Any] = {"changed": False, "plan": [], "not_run": [], "gpus": [], "root": params["root"]}
    if refusals or decl is None or cdi_output is None:
        warn_or_refuse(module, Plan(refusals=refusals), result)
        return
    done = converge(
        params["root"], decl, cdi=params["cdi"], cdi_output=cdi_output.lstrip("/"), check_mode=module.check_mode
    )
    result["gpus"] = done.plan.report
    result["plan"] = planned(done.lines, module.check_mode)
    if module._diff:
        result["diff"] = done.plan.plan.diff(params["root"])
    warn_or_refuse(module, done.plan.plan, result)
    if module.check_mode:
        result["changed"] = bool(done.plan.plan.actions)
        module.exit_json(**result)
    result["changed"] = done.applied.changed
    result["not_run"] = done.applied.not_run
    if done.error is not None:
        module.fail_json(msg=done.error, done=done.applied.done, **failed_result(result))
    module.exit_json(**result)
