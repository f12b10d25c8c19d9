"""The host's declaration resolved in a module run, one way for every module that does it:
gpu_host_model (the role host_model), and vfio_bind, which resolves it from the facts it reads
anyway when the run has not yet (role vfio_host: one module run instead of two, issue #14).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..core.plan import Plan, Refusal
from ..facts.host import HostFacts, cpu_count, gather
from ..facts.sysfs import Sysfs
from ..inputs.hostroot import root_problem
from ..model.host_model import HostModel
from ..model.resolve import resolve
from .common import warn_or_refuse

ARGUMENT_SPEC: dict[str, Any] = {
    "root": {"type": "path", "default": "/"},
    "host": {"type": "dict"},
    "layouts": {"type": "dict"},
    "gpus": {"type": "raw"},
    "vms": {"type": "raw"},
    "vfio_devices": {"type": "raw"},
    "old_variables": {"type": "list", "elements": "str", "default": []},
}


def declaration(host: Any, layouts: Any) -> dict[str, Any]:
    """The host_vars form of a module's ``host`` and ``layouts`` options."""
    return {"gpuprov_host": host, **({"gpuprov_layouts": layouts} if layouts else {})}


def checked_root(module: Any, root: str) -> str:
    """The module's ``root``, or the module fails as the CLI refuses its ``--root``
    (:func:`gpuprov.inputs.hostroot.root_problem`): nothing there is not "a host with no devices"."""
    problem = root_problem(root, "root", captures=False)
    if problem is not None:
        warn_or_refuse(module, Plan(refusals=[Refusal(problem, None)]), {})
    return root


def resolve_or_refuse(module: Any, doc: dict[str, Any], facts: HostFacts) -> HostModel:
    """:func:`gpuprov.model.resolve.resolve` on ``facts``; the module fails, naming every problem and
    its fix, when the declaration breaks its schema or does not fit the host; warnings passed on."""
    model = resolve(doc, facts, cpu_limit=cpu_count(facts))
    warn_or_refuse(module, Plan(refusals=model.problems + model.refusals, warnings=model.warnings), {})
    return model


def model(module: Any) -> HostModel:
    """The module gpu_host_model: its declaration (``host`` and ``layouts``, or the old variables)
    resolved on the facts below its root; the module fails as :func:`checked_root` and
    :func:`resolve_or_refuse` say."""
    p = module.params
    old = {"gpuprov_gpus": p["gpus"], "gpu_vms_list": p["vms"], "vfio_host_devices": p["vfio_devices"]}
    doc = {k: v for k, v in old.items() if v is not None}
    if p["host"] is not None:
        # The old variables beside the declaration go with it: the resolver refuses the pair, naming both.
        doc = {**{k: None for k in p["old_variables"]}, **doc, **declaration(p["host"], p["layouts"])}
    root = checked_root(module, p["root"])
    return resolve_or_refuse(module, doc, gather(Sysfs(root)))
