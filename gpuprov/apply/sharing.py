"""Carrying out a guest's sharing plan (:mod:`gpuprov.plan.guest.sharing`): read, plan, make nvidia-ctk's
JSON spec when the CDI spec is owed and plan again on it, apply, then wait until every MPS daemon
answers with its limits as declared (the supervisor applies them after each start).

The one sequence the module ``guest_sharing`` and the tests run (docs/guides/sharing.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..core.plan import Plan
from ..facts.mps import STATE_FILE, SharingFacts, find_binary, read_sharing, script_path
from ..facts.sysfs import Sysfs
from ..inputs.sharing import GuestSharing
from ..plan.guest.sharing import SharingPlan, plan_sharing, unit_path, wants_path
from ..plan.guest.toolkit import CDI_STAGING
from .actions import Applied, ApplyError, apply, make_parent

READY_SECONDS = 30.0


@dataclass
class Converged:
    plan: SharingPlan
    lines: list[str] = field(default_factory=list)  # every action planned (and done, unless check mode)
    applied: Applied = field(default_factory=Applied)
    error: str | None = None  # what failed (an action, or a daemon that did not come up as declared)


def read(sysfs: Sysfs, decl: GuestSharing, cdi_output: str) -> SharingFacts:
    """Every fact the planner needs, the managed files' text included."""
    names = [g.name for g in decl.gpus]
    facts = read_sharing(sysfs, decl.mps_root, names, gpus=bool(decl.gpus))
    files = [STATE_FILE, cdi_output, CDI_STAGING]
    for name in sorted(set(names) | set(facts.states)):
        files += [script_path(name), unit_path(name), wants_path(name)]
    facts.files = {rel: sysfs.read_text(rel) for rel in files}
    return facts


def plan(sysfs: Sysfs, decl: GuestSharing, *, cdi: bool, cdi_output: str, staged_now: bool = False) -> SharingPlan:
    facts = read(sysfs, decl, cdi_output)
    ctk = find_binary(sysfs, "nvidia-ctk")
    return plan_sharing(facts, decl, cdi=cdi, cdi_output=cdi_output, nvidia_ctk=ctk, staged_now=staged_now)


def converge(root: str, decl: GuestSharing, *, cdi: bool, cdi_output: str, check_mode: bool) -> Converged:
    """Plan, and unless ``check_mode`` apply and wait for the daemons. A refused plan changes nothing."""
    sysfs = Sysfs(root)
    first = plan(sysfs, decl, cdi=cdi, cdi_output=cdi_output)
    out = Converged(first, lines=first.plan.describe())
    if first.plan.refused or check_mode:
        return out
    try:
        if first.staging is not None:
            # nvidia-ctk's spec first (a command that writes a file into a folder it does not make), then
            # the whole plan again on it: the CDI spec is made from what nvidia-ctk wrote.
            make_parent(root, CDI_STAGING)
            out.applied = apply(Plan(actions=[first.staging]), root)
            second = plan(sysfs, decl, cdi=cdi, cdi_output=cdi_output, staged_now=True)
            out.plan = second
            if second.plan.refused:
                out.error = second.plan.refusal_text()
                return out
            done = apply(second.plan, root)
            out.applied.done += done.done
            out.applied.not_run += done.not_run
        else:
            out.applied = apply(first.plan, root)
    except ApplyError as exc:
        out.applied.done += exc.applied.done
        out.error = str(exc)
        return out
    out.lines = out.applied.done + out.applied.not_run
    if sysfs.live and out.applied.changed:
        out.error = wait_ready(sysfs, decl, cdi_output)
    return out


def wait_ready(sysfs: Sysfs, decl: GuestSharing, cdi_output: str, seconds: float = READY_SECONDS) -> str | None:
    """None once every MPS entry's daemon answers with the limits it was given; else what is still wrong."""
    deadline = time.monotonic() + seconds
    while True:
        again = plan(sysfs, decl, cdi=False, cdi_output=cdi_output)
        waiting = _not_ready(again)
        if not waiting:
            return None
        if time.monotonic() > deadline:
            return f"after {seconds:g} s: " + "; ".join(waiting)
        time.sleep(0.5)


def _not_ready(sharing: SharingPlan) -> list[str]:
    """What a converged guest would not owe: a daemon not up, its limits not yet applied."""
    return [a.describe() for a in sharing.plan.actions if a.argv is not None] + [
        r.describe() for r in sharing.plan.refusals
    ]
