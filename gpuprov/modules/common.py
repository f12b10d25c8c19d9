"""What every gpuprov Ansible module does with a plan: check mode, --diff,
refusals as failures that changed nothing, apply, and one result shape.

Modules stay thin (argument spec -> facts -> plan -> :func:`finish`). Ships
to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..apply import lock
from ..apply.actions import ApplyError, apply
from ..core.plan import Plan
from ..facts.sysfs import Sysfs
from ..inputs.hostroot import root_problem

# A URL's bytes, or None and why not. The plugin passes Ansible's fetch_url in (:func:`url_fetcher`:
# the task's proxy, certificate and timeout settings hold), so the adapters stay standard library only.
Fetch = Callable[[str], "tuple[bytes | None, str]"]


def url_fetcher(module: Any, fetch_url: Any) -> Fetch:
    """``fetch_url`` (``ansible.module_utils.urls``'s) for ``module`` as a :data:`Fetch`: a GET, whose
    answer is None with Ansible's words for why when nothing came or the status is an HTTP error."""

    def fetch(url: str) -> tuple[bytes | None, str]:
        response, info = fetch_url(module, url, method="GET")
        status = info.get("status")
        if response is None or (isinstance(status, int) and status >= 400):
            return None, info.get("msg", "no answer")
        return response.read(), ""

    return fetch


def refuse_bad_root(module: Any, *, host: bool = True) -> None:
    """Fail the module, nothing read or changed, when its ``root`` is not there or not a directory (or,
    with ``host``, holds no sys/): the CLI's --root check (:func:`gpuprov.inputs.hostroot.root_problem`),
    since a root that is not there reads as a host with nothing on it."""
    problem = root_problem(module.params["root"], "root", captures=False, host=host)
    if problem:
        module.fail_json(msg=f"{problem}; nothing changed")


def one_run_at_a_time(module: Any, concern: str) -> None:
    """Hold the host's lock on ``concern`` until the module ends, before anything is read: a run
    started while another still changes it (one whose play was killed goes on on the host) waits,
    then reads what that one left (:mod:`gpuprov.apply.lock`). Fail the module, nothing read or
    changed, when the other has not finished in time. Check mode changes nothing and takes no lock."""
    if module.check_mode:
        return
    problem = lock.hold_for(module.params["root"], concern)
    if problem:
        module.fail_json(
            msg=f"{problem}: another gpuprov run is changing this host's {concern} (a run whose play was "
            "killed goes on on the host to the end of its step); nothing changed. Run again once it has "
            "ended (lslocks names it)"
        )


def failed_result(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` for ``fail_json``: all but ``changed``."""
    return {k: v for k, v in result.items() if k != "changed"}


def warn_or_refuse(module: Any, plan: Any, result: dict[str, Any]) -> None:
    """Pass the plan's warnings on; fail the module, with every refusal and its fix, when it refused."""
    for warning in plan.warnings:
        module.warn(warning)
    if plan.refused:
        module.fail_json(
            msg=plan.refusal_text(),
            refusals=[{"message": r.message, "fix": r.fix, "device": r.device} for r in plan.refusals],
            **failed_result(result),
        )


def planned(lines: list[str], check_mode: bool) -> list[str]:
    """A plan's lines as the result shows them: in check mode nothing ran, so each says what
    would ("would create /etc/x (...)", "would run update-grub (...)")."""
    return [f"would {line}" for line in lines] if check_mode else lines


def finish(module: Any, plan: Plan, root: str, **extra: Any) -> None:
    """Exit the module: refuse, report (check mode) or apply ``plan``.

    ``module`` is an ``AnsibleModule``. Results carry ``plan`` (every action
    as text), ``not_run`` (live-only actions not run because ``root`` is not
    ``/``; not "skipped", which Ansible reads as the task's own status),
    ``warnings`` and, with ``--diff``, every action's diff (runtime ones
    too: :meth:`Plan.diff`). In check mode ``plan`` says "would ..." (:func:`planned`).
    """
    result: dict[str, Any] = {
        "changed": False,
        "plan": planned(plan.describe(), module.check_mode),
        "not_run": [],
        "root": root,
        **extra,
    }
    warn_or_refuse(module, plan, result)
    if module._diff:
        result["diff"] = plan.diff(root)
    if module.check_mode:
        live = Sysfs(root).live
        result["changed"] = any(live or not a.live_only for a in plan.actions)
        module.exit_json(**result)
    try:
        applied = apply(plan, root)
    except ApplyError as exc:
        module.fail_json(msg=str(exc), done=exc.applied.done, **failed_result(result))
    result["changed"] = applied.changed
    result["not_run"] = applied.not_run
    module.exit_json(**result)


def finish_failed(module: Any, plan: Plan, root: str, msg: str, **extra: Any) -> None:
    """Apply ``plan`` (what records and cleans up a failure), then fail with ``msg``: the task fails
    whatever the actions did (a boot trial that did not come up, recorded so)."""
    result: dict[str, Any] = {
        "plan": planned(plan.describe(), module.check_mode),
        "not_run": [],
        "root": root,
        **extra,
    }
    for warning in plan.warnings:
        module.warn(warning)
    if module._diff:
        result["diff"] = plan.diff(root)
    changed = False
    if not module.check_mode:
        try:
            applied = apply(plan, root)
        except ApplyError as exc:
            module.fail_json(msg=f"{msg}; then {exc}", done=exc.applied.done, **result)
        changed, result["not_run"] = applied.changed, applied.not_run
    module.fail_json(msg=msg, changed=changed, **result)
