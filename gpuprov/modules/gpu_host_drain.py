"""The module gpu_host_drain (role host_drain, docs/guides/rolling.md): before a change that reboots the
host or rebinds devices (the ``disruption`` gpu_host_plan planned), shut down the running VMs it
would take down, as each VM's ``drain`` allows, and record them; after it, start exactly those again.

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..apply.actions import ApplyError, apply
from ..apply.libvirt import drain, start
from ..core.plan import Plan, Refusal
from ..core.vm_spec import DRAINS
from ..facts.drain import RECORD, RecordError, device_parents, read_record
from ..facts.host import gather
from ..facts.libvirt import LibvirtMissing, connect, read_domains, system_libvirt_absent
from ..facts.sysfs import Sysfs
from ..inputs.validate import Problems, choice, pci_address, uuid_text, vm_name
from ..plan.host.drain import UNDECLARED, Disruption, DrainPlan, RestorePlan, plan_drain, plan_restore
from .common import failed_result, planned, refuse_bad_root, warn_or_refuse
from .gpu_vm import consults_libvirt

ARGUMENT_SPEC: dict[str, Any] = {
    "state": {"type": "str", "choices": ["drained", "restored"], "default": "drained"},
    "disruption": {
        "type": "dict",
        "default": {},
        "options": {
            "reboot": {"type": "bool", "default": False},
            "devices": {"type": "list", "elements": "str", "default": []},
            "why": {"type": "list", "elements": "str", "default": []},
            "unknown": {"type": "list", "elements": "str", "default": []},
            # gpu_host_plan's too: whether a record waits (this module reads the record itself).
            "recorded": {"type": "bool", "default": False},
        },
    },
    "vms": {"type": "list", "elements": "dict", "default": []},
    "defaults": {"type": "dict", "default": {}},
    "undeclared": {"type": "str", "choices": list(UNDECLARED), "default": "refuse"},
    "timeout": {"type": "int", "default": 300},
    "uri": {"type": "str", "default": "qemu:///system"},
    "root": {"type": "path", "default": "/"},
}
MAX_TIMEOUT = 24 * 3600


def _inputs(p: dict[str, Any]) -> tuple[Disruption, dict[str, str], list[Refusal]]:
    """The disruption and each declared VM's drain, checked (PCI addresses normalised, mdevs by UUID);
    every problem as a refusal."""
    problems = Problems()
    given = p["disruption"] or {}
    devices = []
    for i, raw in enumerate(given.get("devices") or []):
        path = f"disruption.devices[{i}]"
        device = uuid_text(problems, path, raw) if "-" in str(raw) else pci_address(problems, path, raw)
        if device is not None:
            devices.append(device.lower())
    disruption = Disruption(
        reboot=bool(given.get("reboot")),
        devices=devices,
        why=list(given.get("why") or []),
        unknown=list(given.get("unknown") or []),
    )
    policies: dict[str, str] = {}
    default = (p["defaults"] or {}).get("drain")
    if default is not None:
        default = choice(problems, "defaults.drain", default, DRAINS)
    for i, vm in enumerate(p["vms"]):
        name = vm_name(problems, f"vms[{i}].name", vm.get("name"))
        raw = vm.get("drain", default)
        policy = "shutdown" if raw is None else choice(problems, f"vms[{i}].drain", raw, DRAINS)
        if name is not None and policy is not None:
            policies[name] = policy
    if not 0 < p["timeout"] <= MAX_TIMEOUT:
        problems.add("timeout", f"is {p['timeout']}", f"seconds from 1 to {MAX_TIMEOUT}")
    return disruption, policies, problems.items


def _connection(module: Any, plan: Plan, why: str) -> Any:
    """libvirt at the module's ``uri``; the module fails, changing nothing, when it cannot be reached
    or is not this host's (a staged root with a URI other than the test driver's)."""
    p = module.params
    if not consults_libvirt(p["root"], p["uri"]):
        plan.refusals.append(
            Refusal(
                f"root is {p['root']}, not /: libvirt ({p['uri']}) here is not that host's, so {why} cannot be read",
                "run on the host itself (root: /)",
            )
        )
        warn_or_refuse(module, plan, {"root": p["root"]})
    try:
        return connect(p["uri"])
    except (LibvirtMissing, RuntimeError) as exc:
        module.fail_json(msg=f"{exc}; nothing changed", root=p["root"])


def run(module: Any) -> None:
    """The module's whole run: check the inputs, read, plan, then refuse, report (check mode) or act."""
    p = module.params
    refuse_bad_root(module, host=False)
    disruption, policies, problems = _inputs(p)
    base: dict[str, Any] = {"changed": False, "root": p["root"], "record": "/" + RECORD}
    warn_or_refuse(module, Plan(refusals=problems), base)
    sysfs = Sysfs(p["root"])
    try:
        record = read_record(sysfs)
    except RecordError as exc:
        where = f"{p['root'].rstrip('/')}/{RECORD}"
        refusal = Refusal(
            f"the drain record {where} is not one gpuprov wrote: {exc}",
            f"read it, start the VMs it names yourself (virsh start), then remove {where}",
        )
        warn_or_refuse(module, Plan(refusals=[refusal]), base)
    if p["state"] == "restored":
        _restore(module, record, base)
    _drain(module, disruption, policies, record, base)


def _drain(module: Any, disruption: Disruption, policies: dict[str, str], record: Any, base: dict[str, Any]) -> None:
    p = module.params
    result = {**base, "stopped": [], "forced": [], "reasons": {}, "disruption": disruption.as_dict()}
    if not disruption:
        module.exit_json(**result)  # nothing is taken from a VM: libvirt is not consulted
    if system_libvirt_absent(Sysfs(p["root"]), p["uri"]):
        # A bare host (libvirt not installed yet) or one without libvirt: no VM to shut down.
        module.exit_json(**result, libvirt="absent: no socket of the system's libvirt, so no VM runs")
    conn = _connection(module, DrainPlan(), "the running VMs")
    domains = read_domains(conn)
    parents = device_parents(gather(Sysfs(p["root"]))) if disruption.devices and not disruption.reboot else {}
    plan = plan_drain(domains, disruption, policies, p["undeclared"], parents, record)
    result.update(plan.result(), plan=planned(plan.describe(), module.check_mode))
    warn_or_refuse(module, plan, result)
    if module.check_mode or not plan.stop:
        result["stopped"] = planned(result["stopped"], module.check_mode) if module.check_mode else []
        result["changed"] = bool(plan.stop)
        module.exit_json(**result)
    try:
        done = apply(plan, p["root"]).done  # the record first: a run killed now still restores them
    except ApplyError as exc:
        module.fail_json(msg=f"{exc}; no VM was stopped", **failed_result(result))
    stopped, left = drain(conn, [(d.name, d.uuid) for d in plan.stop], plan.force, p["timeout"])
    result.update(changed=True, done=done + stopped)
    if left:
        module.fail_json(
            msg=f"{', '.join(left)} did not shut down in {p['timeout']}s and were left running; the change was "
            "not made. Fix: shut them down yourself (virsh shutdown), or declare drain: force to power them "
            "off after the wait, then run again (the others are recorded and started again by the restore)",
            still_running=left,
            **failed_result(result),
        )
    module.exit_json(**result)


def _restore(module: Any, record: Any, base: dict[str, Any]) -> None:
    p = module.params
    result = {**base, "started": [], "already_running": []}
    if record is None:
        module.exit_json(**result)
    conn = _connection(module, RestorePlan(), "the drained VMs")
    plan = plan_restore(record, read_domains(conn))
    result.update(plan.result(), plan=planned(plan.describe(), module.check_mode))
    warn_or_refuse(module, plan, result)
    if module.check_mode:
        result["started"] = planned(result["started"], True)
        result["changed"] = True
        module.exit_json(**result)
    done = []
    try:
        done = start(conn, [(d.name, d.uuid) for d in plan.start])
        done += apply(plan, p["root"]).done
    except Exception as exc:  # noqa: BLE001 - libvirt's errors: the record stays, the next run goes on
        module.fail_json(msg=f"restore: {exc}; the record is kept: run again", done=done, **failed_result(result))
    module.exit_json(**{**result, "changed": True, "done": done})
