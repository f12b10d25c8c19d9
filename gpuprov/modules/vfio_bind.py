"""vfio_bind's options and its read-and-plan step, one copy for the module and for gpu_host_plan
(docs/concepts/plan-gate.md).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.plan import Plan
from ..facts.bootloader import initramfs_tools
from ..facts.files import read_text
from ..facts.host import HostFacts, gather
from ..facts.sysfs import Sysfs
from ..model.host_model import HostModel
from ..plan.host.drain import Disruption, vfio_disruption
from ..plan.host.vfio import MANAGED_FILES, VfioPlan, VfioRequest, plan_vfio
from .gpu_host_model import declaration

ARGUMENT_SPEC: dict[str, Any] = {
    "devices": {"type": "list", "elements": "str"},
    "host": {"type": "dict"},
    "layouts": {"type": "dict"},
    "state": {"type": "str", "choices": ["bound", "unbound"], "default": "bound"},
    "persistent": {"type": "bool", "default": True},
    "allow_unsafe": {"type": "list", "elements": "str", "default": []},
    "root": {"type": "path", "default": "/"},
}
RULES: dict[str, Any] = {
    "mutually_exclusive": [("devices", "host")],
    "required_one_of": [("devices", "host")],
    "required_by": {"layouts": "host"},
}

# Resolves a declaration on the facts read (the module's refuses, failing it, where it does not fit).
Resolver = Callable[[dict[str, Any], HostFacts], HostModel]


def plan(p: dict[str, Any], resolver: Resolver, facts: HostFacts | None = None) -> tuple[VfioPlan, HostModel | None]:
    """The vfio plan for the module's params ``p`` (with ``host``: resolved by ``resolver`` on the
    facts this reads anyway, or ``facts`` when the caller read them), and the model resolved (None
    without ``host``)."""
    sysfs = Sysfs(p["root"])
    facts = facts if facts is not None else gather(sysfs)
    devices, model = p["devices"], None
    if p["host"] is not None:
        model = resolver(declaration(p["host"], p["layouts"]), facts)
        devices = model.vfio_devices
    # A declaration with no passthrough GPU binds nothing and leaves vfio's files as they are (as
    # role vfio_host does with an empty vfio_host_devices).
    if p["host"] is not None and not devices:
        return VfioPlan(), model
    request = VfioRequest(devices=devices, state=p["state"], persistent=p["persistent"], allow_unsafe=p["allow_unsafe"])
    files = {path: read_text(sysfs, path) for path in MANAGED_FILES}
    return plan_vfio(facts, request, files, initramfs_tools(sysfs)), model


def pending(p: dict[str, Any], resolver: Resolver, facts: HostFacts | None = None) -> tuple[str | None, Disruption]:
    """Why the module must run for ``p`` (None: it would change and say nothing), and the devices whose
    holders it takes (docs/guides/rolling.md)."""
    vfio = plan(p, resolver, facts)[0]
    return quiet(vfio, p["root"]), vfio_disruption(vfio, Sysfs(p["root"]).live)


def quiet(plan: Plan, root: str) -> str | None:
    """Why a module with ``plan`` must run: it acts, refuses or warns (None: it would do and say
    nothing). Below a root other than ``/`` runtime actions never run (modules.common.finish)."""
    if plan.refusals:
        return "it refuses: " + plan.refusal_text()
    if plan.warnings:
        return "it warns: " + plan.warnings[0]
    live = Sysfs(root).live
    acting = [a for a in plan.actions if live or not a.live_only]
    return f"{len(acting)} action(s): {acting[0].describe()}" if acting else None
