"""Draining a host before a change that takes its VMs' devices (docs/guides/rolling.md): which running
domains a reboot or a rebind would take down, what each VM's declaration allows (``drain``:
shutdown, force, keep), and what is refused; after the change, which of the domains the drain stopped
start again. Pure: facts (domains, device ancestry, the record) and the disruption in, a plan out.

What a change disrupts is read from the concerns' own plans (:func:`boot_disruption`,
:func:`vfio_disruption`, :func:`vgpu_disruption`), planned ahead by gpu_host_plan: a reboot the play
will carry out; a device whose driver changes (vfio-pci bound or given back); an mdev removed, a VF's
vGPU type cleared or changed, SR-IOV VFs re-made, MIG instances destroyed or MIG mode switched; and a
device the plan refuses to touch only because something holds it (a refusal of code ``in-use``), which
a running VM may. A plan refused for any other reason changes nothing, so it disrupts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.plan import REMOVE_FILE, WRITE_FILE, WRITE_SYSFS, Action, Plan, Refusal
from ...core.vm_spec import DRAINS
from ...facts.drain import RECORD, DrainRecord, RecordError, StoppedDomain, name_ok, parse_record, record_text
from ...facts.evidence import IN_USE
from ...facts.libvirt import DomainState
from ...inputs.vgpu_request import VgpuPlan
from .boot_trial import BootPlan
from .vfio import VfioPlan

UNDECLARED = ("refuse", *[d for d in DRAINS if d != "keep"])  # what a domain not declared may get
_RUNS = ("running", "blocked", "shutdown")  # states an ACPI shutdown stops (shutdown: one is under way)
DOC = "docs/guides/rolling.md"


@dataclass
class Disruption:
    """What the planned change takes from running VMs."""

    reboot: bool = False
    devices: list[str] = field(default_factory=list)  # PCI addresses and mdev UUIDs whose holder must stop
    why: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # concerns whose disruption could not be planned

    def __bool__(self) -> bool:
        return self.reboot or bool(self.devices or self.unknown)

    def add(self, other: Disruption) -> None:
        self.reboot = self.reboot or other.reboot
        self.devices += [d for d in other.devices if d not in self.devices]
        self.why += other.why
        self.unknown += other.unknown

    def as_dict(self) -> dict[str, Any]:
        return {"reboot": self.reboot, "devices": self.devices, "why": self.why, "unknown": self.unknown}


def _in_use(plan: Plan) -> list[str] | None:
    """The devices a refused ``plan`` names when every refusal is only "in use"; None otherwise."""
    if not plan.refusals or any(r.code != IN_USE or not r.device for r in plan.refusals):
        return None
    return [r.device for r in plan.refusals if r.device]


def boot_disruption(boot: BootPlan, reboot_allowed: bool) -> Disruption:
    """A reboot the play will carry out (iommu_host reboots only when it is allowed, on ``/``)."""
    if reboot_allowed and boot.reboot in ("trial", "plain") and not boot.refusals:
        return Disruption(reboot=True, why=[f"iommu_boot: a reboot ({boot.reboot}) for the kernel arguments"])
    return Disruption()


def vfio_disruption(plan: VfioPlan, live: bool) -> Disruption:
    """The devices whose driver the binding changes now (on ``/`` only: below another root nothing runs)."""
    if not live:
        return Disruption()
    held = _in_use(plan)
    if held is not None:
        devices = sorted(set(held) | set(plan.bind_set))
        return Disruption(devices=devices, why=[f"vfio_bind: {', '.join(devices)} in use"])
    if plan.refusals:
        return Disruption()
    devices = [
        str(a.content).strip() for a in plan.actions if a.kind == WRITE_SYSFS and a.path == "sys/bus/pci/drivers_probe"
    ]
    return Disruption(devices=devices, why=[f"vfio_bind: rebinds {', '.join(devices)}"] if devices else [])


def _sriov_pf(action: Action) -> str | None:
    """The PF whose VFs an action removes or re-makes (``.../<address>/sriov_numvfs``)."""
    path = action.path or ""
    if action.kind == WRITE_SYSFS and path.endswith("/sriov_numvfs"):
        return path.rsplit("/", 2)[-2]
    return None


def vgpu_disruption(plan: VgpuPlan, live: bool) -> Disruption:
    """The mdevs removed, VFs cleared or re-typed, PFs whose VFs are re-made and GPUs whose MIG layout
    or mode changes (on ``/`` only)."""
    if not live:
        return Disruption()
    held = _in_use(plan)
    if held is not None:
        return Disruption(devices=sorted(set(held)), why=[f"gpu_vgpu: {', '.join(sorted(set(held)))} in use"])
    if plan.refusals:
        return Disruption()
    devices = [m["uuid"] for m in plan.removed_mdevs]
    devices += [c["vf"] for c in plan.cleared_vfs]
    devices += [pf for pf in (_sriov_pf(a) for a in plan.actions) if pf]
    devices += [key for key, m in plan.mig.items() if m.get("destroyed") or m.get("mode") == "pending"]
    devices = sorted(set(devices))
    return Disruption(devices=devices, why=[f"gpu_vgpu: changes {', '.join(devices)}"] if devices else [])


@dataclass
class DrainPlan(Plan):
    """The domains to shut down (in order), those of them powered off after the wait, and the record."""

    stop: list[DomainState] = field(default_factory=list)
    force: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # domain -> what takes it down

    def result(self) -> dict[str, Any]:
        return {
            "stopped": [d.name for d in self.stop],
            "forced": self.force,
            "reasons": self.reasons,
        }


def _touches(devices: list[str], disrupted: set[str], parents: dict[str, str]) -> str | None:
    """The disrupted device one of ``devices`` is, or hangs below (an mdev on a GPU or on a VF, a VF
    of a PF); None when none."""
    for device in devices:
        seen: set[str] = set()
        node: str | None = device
        while node is not None and node not in seen:
            if node in disrupted:
                return node
            seen.add(node)
            node = parents.get(node)
    return None


def plan_drain(
    domains: list[DomainState],
    disruption: Disruption,
    policies: dict[str, str],
    undeclared: str,
    parents: dict[str, str],
    record: DrainRecord | None,
) -> DrainPlan:
    """Which domains to shut down before ``disruption``, or why not. ``policies``: each declared VM's
    ``drain``; ``undeclared``: what a domain not declared gets (one of :data:`UNDECLARED`);
    ``parents``: device -> the device it hangs below (mdev -> its parent, VF -> its PF); ``record``:
    what an earlier drain stopped and no restore started yet (kept, with the new ones added)."""
    plan = DrainPlan()
    for why in disruption.unknown:
        plan.refusals.append(
            Refusal(
                f"what the change would disrupt could not be planned ({why})",
                "run the playbook without the drain's role to see the concern's own refusal, fix it, then run again",
            )
        )
    if not disruption or plan.refusals:
        return plan
    disrupted = set(disruption.devices)
    for dom in domains:
        if dom.state == "shutoff":
            continue
        if disruption.reboot:
            cause = "the host reboots"
        elif dom.devices is None:
            plan.refusals.append(
                Refusal(
                    f"domain {dom.name} is {dom.state} and the devices it holds cannot be read, so whether the "
                    f"rebind of {', '.join(disruption.devices)} takes them cannot be told",
                    f"check `virsh dumpxml {dom.name}`, or shut it down yourself, then run again",
                )
            )
            continue
        else:
            hit = _touches(dom.devices, disrupted, parents)
            if hit is None:
                continue
            cause = f"{hit} is rebound or re-made"
        if dom.state not in _RUNS:
            plan.refusals.append(
                Refusal(
                    f"domain {dom.name} is {dom.state} and {cause}: a drain does not know it is safe to stop",
                    f"resume it (virsh resume {dom.name}) or shut it down yourself, then run again",
                )
            )
            continue
        policy = policies.get(dom.name, undeclared)
        if policy == "keep":
            plan.refusals.append(
                Refusal(
                    f"VM {dom.name} is declared drain: keep and {cause}: the host is skipped, nothing changed",
                    f"run the change when {dom.name} may stop and set its drain to shutdown (or force), "
                    "or move it to another host first",
                )
            )
        elif policy == "refuse":
            plan.refusals.append(
                Refusal(
                    f"domain {dom.name} runs here, is not declared (gpuprov_host.vms), and {cause}: "
                    "the host is skipped, nothing changed",
                    f"declare {dom.name} with drain: shutdown, force or keep, or set host_drain_undeclared: "
                    f"shutdown to let the drain stop domains gpuprov does not declare ({DOC})",
                )
            )
        elif not name_ok(dom.name):
            plan.refusals.append(
                Refusal(
                    f"domain {dom.name!r} would be shut down but its name cannot go into the drain record",
                    "rename the domain (virsh domrename) or shut it down yourself, then run again",
                )
            )
        else:
            plan.stop.append(dom)
            plan.reasons[dom.name] = cause
            if policy == "force":
                plan.force.append(dom.name)
    if plan.refusals:
        plan.stop, plan.force, plan.reasons = [], [], {}
        return plan
    old = record or DrainRecord()
    new = [StoppedDomain(d.name, d.uuid) for d in plan.stop if d.uuid not in old.uuids()]
    if new:
        merged = DrainRecord(stopped=old.stopped + new, reason="; ".join(disruption.why))
        text = record_text(merged)
        try:
            parse_record(text)  # a drain never writes what its restore would refuse to read back
        except RecordError as exc:
            plan.stop, plan.force, plan.reasons = [], [], {}
            plan.refusals.append(
                Refusal(
                    f"the drain record would not read back ({exc}): {len(old.stopped)} domains are recorded "
                    f"already and {len(new)} more would stop; the host is skipped, nothing changed",
                    "restore the VMs of the earlier drain first (playbooks/hosts.yml, role host_drain's restore), "
                    "then run again",
                )
            )
            return plan
        before = None if record is None else record_text(record)
        plan.actions.append(Action(WRITE_FILE, "the VMs the drain stops, started again after", RECORD, text, before))
    return plan


@dataclass
class RestorePlan(Plan):
    """The recorded domains to start again; the record removed once they are."""

    start: list[StoppedDomain] = field(default_factory=list)
    running: list[str] = field(default_factory=list)  # recorded, already running

    def result(self) -> dict[str, Any]:
        return {"started": [d.name for d in self.start], "already_running": self.running}


def plan_restore(record: DrainRecord | None, domains: list[DomainState]) -> RestorePlan:
    """Start exactly the domains ``record`` lists that are shut off (by UUID: a domain of that name
    made since is another one); a recorded one that is gone or in another state is left, with a
    warning. The record goes when the rest has been done."""
    plan = RestorePlan()
    if record is None:
        return plan
    by_uuid = {d.uuid: d for d in domains}
    for stopped in record.stopped:
        dom = by_uuid.get(stopped.uuid)
        if dom is None:
            plan.warnings.append(f"domain {stopped.name} ({stopped.uuid}) the drain stopped is gone: not started")
        elif dom.state == "shutoff":
            plan.start.append(stopped)
        elif dom.state in _RUNS:
            plan.running.append(dom.name)
        else:
            plan.warnings.append(f"domain {dom.name} the drain stopped is {dom.state} now: left as it is")
    plan.actions.append(Action(REMOVE_FILE, "the drained VMs are back", RECORD))
    return plan
