"""gpu_fleet_facts's options and its read step: the host below the root against its declaration, as
its record in the fleet report (:func:`gpuprov.report.fleet.host_record`).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..inputs.hostroot import root_problem
from ..report.fleet import host_record

ARGUMENT_SPEC: dict[str, Any] = {
    "root": {"type": "path", "default": "/"},
    "host": {"type": "dict"},
    "layouts": {"type": "dict"},
    "gpus": {"type": "raw"},
    "vms": {"type": "raw"},
    "vfio_devices": {"type": "raw"},
    "nvml": {"type": "str", "choices": ["auto", "never"], "default": "auto"},
    "kernel_log": {"type": "bool", "default": True},
}


def declaration(p: dict[str, Any]) -> dict[str, Any] | None:
    """The host_vars form of the options: gpuprov_host (and its layouts), the old variables, or None.
    Given together, the resolver refuses the pair, naming both (the record says so: not ready)."""
    old = {"gpuprov_gpus": p["gpus"], "gpu_vms_list": p["vms"], "vfio_host_devices": p["vfio_devices"]}
    doc = {k: v for k, v in old.items() if v is not None}
    if p["host"] is not None:
        doc = {**doc, "gpuprov_host": p["host"], **({"gpuprov_layouts": p["layouts"]} if p["layouts"] else {})}
    return doc or None


def record(module: Any) -> dict[str, Any]:
    """The host's record for ``module``'s params; the module fails, nothing read, when the root is no
    host (the CLI's --root check). A declaration that does not fit is the record's, not a failure."""
    p = module.params
    problem = root_problem(p["root"], "root", captures=False)
    if problem is not None:
        module.fail_json(msg=problem, refusals=[{"message": problem, "fix": None, "device": None}])
    return host_record(p["root"], declaration(p), nvml=p["nvml"], log=p["kernel_log"])
