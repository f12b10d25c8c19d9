"""Planning the host-side concerns ahead, in one module run (gpu_host_plan, role host_plan): each
concern's own read-and-plan step on the options its role would pass, and which have nothing to do.
docs/concepts/plan-gate.md says when a role may then skip its module.

Ships to targets with the modules (``module_utils``); standard library and Ansible's own
``module_utils`` only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ..facts.drain import recorded
from ..facts.host import HostFacts, cpu_count, gather
from ..facts.sysfs import Sysfs
from ..model.host_model import HostModel
from ..model.resolve import resolve
from ..plan.host.drain import Disruption
from . import gpu_vgpu, iommu_boot, vfio_bind

CONCERNS: dict[str, Any] = {"iommu_boot": iommu_boot, "vfio_bind": vfio_bind, "gpu_vgpu": gpu_vgpu}
# Each concern: the options its role would pass, and their digest (what the role compares).
_CONCERN = {
    "type": "dict",
    "options": {"options": {"type": "dict", "required": True}, "digest": {"type": "str", "required": True}},
}
ARGUMENT_SPEC: dict[str, Any] = {
    "concerns": {"type": "dict", "required": True, "options": {name: _CONCERN for name in CONCERNS}},
    "record_root": {"type": "path"},
}


class Unresolved(Exception):
    """The declaration does not resolve: the module that resolves it refuses, so it must run."""


@dataclass
class Ahead:
    """What planning ahead found: the converged concerns' keys, why the others must run, the model."""

    converged: list[str] = field(default_factory=list)
    pending: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    model: HostModel | None = None
    model_root: str | None = None
    # What the pending concerns take from running VMs (docs/guides/rolling.md), and whether a drain
    # record waits for its restore.
    disruption: Disruption = field(default_factory=Disruption)
    recorded: bool = False


class _Host:
    """One read of the host per root: its facts and each declaration resolved on them, once."""

    def __init__(self, ahead: Ahead) -> None:
        self.ahead = ahead
        self.facts: dict[str, HostFacts] = {}
        self.models: dict[tuple[str, str], HostModel] = {}

    def facts_of(self, root: str) -> HostFacts:
        if root not in self.facts:
            self.facts[root] = gather(Sysfs(root))
        return self.facts[root]

    def resolver(self, root: str) -> vfio_bind.Resolver:
        def resolved(doc: dict[str, Any], facts: HostFacts) -> HostModel:
            key = (root, json.dumps(doc, sort_keys=True, default=str))
            if key not in self.models:
                model = resolve(doc, facts, cpu_limit=cpu_count(facts))
                self.models[key] = model
                if not (model.problems or model.refusals):
                    self.ahead.warnings.extend(model.warnings)
                    self.ahead.model, self.ahead.model_root = model, root
            model = self.models[key]
            if model.problems or model.refusals:
                raise Unresolved("the declaration does not resolve")
            return model

        return resolved


def plan_ahead(concerns: dict[str, Any], record_root: str | None = None) -> Ahead:
    """``concerns``: module name -> {"options": the role's options, "digest": their digest} (or None);
    ``record_root``: where the drain keeps its record (None: not looked at)."""
    ahead = Ahead()
    host = _Host(ahead)
    for name, given in concerns.items():
        if given is None:
            continue
        reason, disruption = _pending(name, given["options"], host)
        ahead.disruption.add(disruption)
        if reason is None:
            ahead.converged.append(given["digest"])
        else:
            ahead.pending[name] = reason
    ahead.recorded = record_root is not None and recorded(Sysfs(record_root))
    return ahead


def _pending(name: str, options: dict[str, Any], host: _Host) -> tuple[str | None, Disruption]:
    """Why the concern's module must run (None: it has nothing to do), and what its change disrupts;
    a concern that could not be planned disrupts what cannot be told (the drain refuses on it)."""
    support = CONCERNS[name]
    checked = ArgumentSpecValidator(support.ARGUMENT_SPEC, **support.RULES).validate(options)
    if checked.error_messages:
        # The module refuses the same options, changing nothing.
        return "its options are refused: " + "; ".join(checked.error_messages), Disruption()
    p = checked.validated_parameters
    try:
        if support is iommu_boot:
            return iommu_boot.pending(p)
        resolved = host.resolver(p["root"])
        warned: list[str] = []

        def resolving(doc: dict[str, Any], facts: HostFacts) -> HostModel:
            model = resolved(doc, facts)
            warned.extend(model.warnings)  # the module gives each as a warning on every run
            return model

        reason, disruption = support.pending(p, resolving, host.facts_of(p["root"]))
        if reason is None and warned:
            # "Converged" promises the module would be silent: one that warns runs and says it.
            reason = f"its module warns: {warned[0]}"
        return reason, disruption
    except Unresolved as exc:
        return str(exc), Disruption()  # the module that resolves the declaration refuses it
    except Exception as exc:  # noqa: BLE001 - fail closed: whatever went wrong, the module runs and says it
        why = f"not planned ({type(exc).__name__}: {exc})"
        return why, Disruption(unknown=[f"{name}: {why}"])


def finish_ahead(module: Any, ahead: Ahead) -> None:
    """Exit the module gpu_host_plan: the converged concerns, why the others must run, the model
    resolved on the way (as gpu_host_model's fact) and its warnings. It changes nothing."""
    for warning in ahead.warnings:
        module.warn(warning)
    disruption = {**ahead.disruption.as_dict(), "recorded": ahead.recorded}
    result = {"changed": False, "converged": ahead.converged, "pending": ahead.pending, "disruption": disruption}
    if ahead.model is not None:
        result.update(ansible_facts={"gpuprov_model": ahead.model.derived()}, model_root=ahead.model_root)
    module.exit_json(**result)
