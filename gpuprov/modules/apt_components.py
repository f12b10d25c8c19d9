"""apt_components's options and its read-and-plan step: the distribution's apt entries below the
root, and the edits that give them the components asked for (:mod:`gpuprov.plan.guest.aptsources`).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..core.plan import Plan
from ..facts.sysfs import Sysfs
from ..plan.guest.aptsources import plan_components

ARGUMENT_SPEC: dict[str, Any] = {
    "codename": {"type": "str", "required": True},
    "components": {"type": "list", "elements": "str", "required": True},
    "root": {"type": "path", "default": "/"},
}


def plan(p: dict[str, Any]) -> tuple[Plan, dict[str, Any]]:
    """The plan for the module's params ``p`` (the planner checks the codename and components), and
    what the module returns besides it: the entries found."""
    plan, entries = plan_components(Sysfs(p["root"]), p["codename"], p["components"])
    found = [{"path": "/" + e.path, "suites": e.suites, "components": e.components, "added": e.added} for e in entries]
    return plan, {"entries": found}
