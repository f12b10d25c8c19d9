"""Checks the mechanisms share: who uses an instance, mixed vGPU types on one GPU, commands."""

from __future__ import annotations

from ...core.plan import (
    COMMAND,
    Action,
    Plan,
    Refusal,
)
from ...facts.evidence import IN_USE
from ...facts.host import HostFacts
from ...facts.vgpu_inputs import HostInputs
from ...inputs.vgpu_request import _problem
from ...rules.assess import Finding, unknown_finding, unknown_findings


def _mdev_users(facts: HostFacts, uuid: str, group: str | None, running: dict[str, str]) -> list[str]:
    users = [f"running domain {running[uuid]}"] if uuid in running else []
    if group is not None:
        users += [
            f"{f.command or '?'} (pid {f.pid}) has {f.path} open"
            for f in facts.usage.open_files
            if f.path == f"/dev/vfio/{group}"
        ]
    return users


def _pci_users(held: dict[str, list[str]], address: str, running: dict[str, str]) -> list[str]:
    users = [f"running domain {running[address]}"] if address in running else []
    return users + held.get(address, [])


def _in_use_unknown(facts: HostFacts, inputs: HostInputs, devices: list[str]) -> list[Finding]:
    """The in-use evidence (open device files, running domains) that could not be read: fail closed."""
    unknown = unknown_findings(facts, devices, [IN_USE])
    unknown += [unknown_finding(name, m) for name, m in inputs.missing.items()]
    return unknown


def _in_use(plan: Plan, what: str, users: list[str], device: str, unknown: list[Finding] | None = None) -> bool:
    if users:
        _problem(
            plan,
            f"{what}: in use by {'; '.join(users)}",
            "shut the domain down (virsh shutdown) or stop the process first, then run again",
            device,
        )
        plan.refusals[-1].code = IN_USE
    elif unknown:
        # Whether something uses it cannot be told: the same as in use.
        for finding in unknown:
            _problem(plan, f"{what}: {finding.message}", finding.fix, device)
    return bool(users or unknown)


def mixed_types_refusal(where: str, by_type: dict[str, list[str]], allowed: bool) -> Refusal | None:
    """The one rule for NVIDIA time-sliced vGPUs (gpu_vgpu, gpu_vm, ``gpuprov plan``): all of a
    GPU's vGPUs share one type unless the host runs mixed-size mode. Only a real ``True`` allows it."""
    if len(by_type) <= 1 or allowed is True:
        return None
    parts = "; ".join(f"{t} for {', '.join(sorted(w))}" for t, w in sorted(by_type.items()))
    return Refusal(
        f"mixed vGPU types on {where} ({parts}): all time-sliced vGPUs of an NVIDIA GPU share one type",
        "give every vGPU on this GPU the same type, or put the other type on another GPU "
        "(or enable the driver's mixed-size mode and set mixed_vgpu_types)",
        where,
    )


def _mixed(plan: Plan, where: str, by_type: dict[str, list[str]], allowed: bool) -> None:
    refusal = mixed_types_refusal(where, by_type, allowed)
    if refusal:
        plan.refusals.append(refusal)


def _cmd(argv: list[str], why: str) -> Action:
    return Action(COMMAND, why, argv=argv)
