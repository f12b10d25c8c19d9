"""The vGPU request and its config: ``gpuprov_gpus`` entries parsed into wants, derived mdev UUIDs.

The config's shape is docs/reference/inputs.md's; what each use does is gpuprov.plan.vgpu's docstring.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from ..core.plan import (
    Action,
    Plan,
    Refusal,
)
from .validate import (
    MAX_GPUS,
    MAX_INSTANCES,
    MAX_MIG_INSTANCES,
    MAX_VGPU_TYPE,
    SYSFS_NAME_RE,
    TYPE_REF_RE,
    Problems,
    integer,
    kind,
    pci_address,
    sequence,
    shown,
    uuid_text,
)
from .validate import text as text_field

USES = ("passthrough", "host", "mdev", "sriov_vgpu", "mig")
MANAGED_USES = ("mdev", "sriov_vgpu", "mig")
ENTRY_KEYS = {"mdev": ("use", "mdevs"), "sriov_vgpu": ("use", "vgpus"), "mig": ("use", "mig")}
# RmPVMRL (NVIDIA vGPU user guide, "Changing Scheduling Behavior for Time-Sliced vGPUs"):
# 0x00 best effort (the driver's default), 0x01 equal share, 0x11 fixed share;
# 0x00TT0001 / 0x00TT0011 set a time slice of TT ms (1 to 30).
SCHEDULERS = {"best_effort": 0x00, "equal_share": 0x01, "fixed_share": 0x11}
NVIDIA = 0x10DE
_HEADER = "# Managed by gpuprov (vgpu_host role / gpu_vgpu module); edits are overwritten.\n"
# A fixed namespace: an mdev without a UUID gets the same one on every run.
_MDEV_NAMESPACE = uuidlib.UUID("3d3c2b8e-0b8f-4d52-a7d6-5f0e9a41c7b3")


# ---------------------------------------------------------------- request


@dataclass
class VgpuRequest:
    gpus: Any  # the gpuprov_gpus mapping, as given
    scheduler: str | None = None  # best_effort | equal_share | fixed_share | None: not managed
    scheduler_timeslice_ms: int | None = None
    mixed_vgpu_types: bool = False  # the GPUs run NVIDIA's mixed-size vGPU mode
    persistent: bool = True  # mdevctl definitions, the saved layout and the boot unit
    prune: bool = False  # also remove instances on declared GPUs that gpuprov did not make
    allow_mig_mode_change: bool = False  # may run `nvidia-smi -i N -mig 1` (needs a GPU reset)
    boot: bool = False  # the boot unit's run: VF types and MIG only, no files, nothing removed
    install_mdevctl: bool = False  # install mdevctl (a command of the plan) where an mdev entry needs it
    # The sha256 of the boot runner the role would install (its files/): the plan says whether the
    # installed one is it (VgpuPlan.runner), so the role copies it only when it is not.
    runner_sha256: str | None = None


@dataclass
class MdevWant:
    parent: str
    type_ref: str  # as given: type directory name or its name
    uuid: str | None  # None: derived once the type is known
    type_id: str | None = None
    name: str | None = None


@dataclass
class VfWant:
    type_ref: str | int
    vf: str | None  # pinned VF address
    type_id: int | None = None
    name: str | None = None
    address: str | None = None  # the VF it lands on


@dataclass
class Entry:
    key: str  # PCI address or non-PCI parent name
    use: str
    mdevs: list[MdevWant] = field(default_factory=list)
    vgpus: list[VfWant] = field(default_factory=list)
    mig: list[str | int] = field(default_factory=list)


@dataclass
class VgpuPlan(Plan):
    mdevs: list[dict[str, Any]] = field(default_factory=list)  # each wanted mdev and what happens to it
    removed_mdevs: list[dict[str, Any]] = field(default_factory=list)
    vgpus: list[dict[str, Any]] = field(default_factory=list)  # each wanted VF type
    cleared_vfs: list[dict[str, Any]] = field(default_factory=list)
    mig: dict[str, dict[str, Any]] = field(default_factory=dict)
    second_pass: list[str] = field(default_factory=list)  # PFs whose VFs this plan enables
    reboot_required: bool = False
    scheduler: dict[str, Any] | None = None
    state: dict[str, Any] | None = None  # the saved layout (None: not written)
    install: Action | None = None  # the tools' install command (also in actions): run, then planned again
    runner: str | None = None  # the boot runner: current | install | None (not needed or not compared)

    def result(self) -> dict[str, Any]:
        """What the module returns besides the plan."""
        return {
            "mdevs": self.mdevs,
            "created": [m["uuid"] for m in self.mdevs if m["state"] == "created"],
            "removed": [m["uuid"] for m in self.removed_mdevs],
            "vgpus": self.vgpus,
            "cleared_vfs": self.cleared_vfs,
            "mig": self.mig,
            "reboot_required": self.reboot_required,
            "scheduler": self.scheduler,
            "runner": self.runner,
        }


def type_name_key(name: str | None) -> str:
    """A vGPU type's name for matching: case-folded, without the "NVIDIA " / "GRID " sysfs puts
    before it, so vgpu-device-manager's "A100-4C" names sysfs's "NVIDIA A100-4C"."""
    text = (name or "").strip().lower()
    for prefix in ("nvidia ", "grid "):
        text = text.removeprefix(prefix)
    return text


def derived_uuid(parent: str, type_id: str, rank: int) -> str:
    """The UUID of the ``rank``-th UUID-less ``type_id`` entry on ``parent``: the same on every run."""
    return str(uuidlib.uuid5(_MDEV_NAMESPACE, f"{parent}/{type_id}/{rank}"))


def _problem(plan: Plan, message: str, fix: str | None = None, device: str | None = None) -> None:
    plan.refusals.append(Refusal(message, fix, device))


def _unknown_keys(plan: Plan, where: str, data: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in set(data) - set(known))
    if unknown:
        _problem(plan, f"{where}: unknown keys {', '.join(unknown)}", f"known keys here: {', '.join(known)}")


def _checked(plan: Plan, check: Any, *args: Any, **kwargs: Any) -> Any:
    """A :mod:`gpuprov.inputs.validate` checker's value; its problems become the plan's refusals."""
    problems = Problems()
    value = check(problems, *args, **kwargs)
    plan.refusals.extend(problems.items)
    return value


def _key(plan: Plan, raw: Any, use: str) -> str | None:
    where = f"gpuprov_gpus key {shown(raw)}"
    if isinstance(raw, str) and ":" in raw:
        return _checked(plan, pci_address, where, raw)
    if use == "mdev" and isinstance(raw, str) and SYSFS_NAME_RE.fullmatch(raw):
        return raw  # a non-PCI mdev parent (the mtty sample) is named by its device name
    number = " (YAML read an unquoted address as a number: quote it)" if isinstance(raw, (int, float)) else ""
    _problem(
        plan,
        f"{where} is not a PCI address{number}",
        'key each GPU by its full PCI address ("0000:41:00.0", see `lspci -D`); only use: mdev takes a parent\'s name',
    )
    return None


def _list(plan: Plan, where: str, value: Any) -> list[Any]:
    if value is None:
        return []
    return _checked(plan, sequence, where, value, MAX_INSTANCES) or []


def _type_ref(plan: Plan, where: str, ref: Any) -> str | int | None:
    """A vGPU or mdev type as given: its numeric ID, its directory name or its name (no '/')."""
    if isinstance(ref, int) and not isinstance(ref, bool):
        return _checked(plan, integer, f"{where}: type", ref, 1, MAX_VGPU_TYPE)
    rule = "a type's name or ID as `gpuprov inspect` lists it"
    return _checked(plan, text_field, f"{where}: type", ref, pattern=TYPE_REF_RE, rule=rule, what="type")


def _mdev_entries(plan: Plan, key: str, value: Any) -> list[MdevWant]:
    out = []
    for i, item in enumerate(_list(plan, f"{key}: mdevs", value)):
        where = f"{key}: mdevs[{i}]"
        if not isinstance(item, dict) or item.get("type") in (None, ""):
            _problem(plan, f"{where} must be a mapping with a type (and optionally a uuid)", "e.g. {type: nvidia-259}")
            continue
        _unknown_keys(plan, where, item, ("type", "uuid"))
        ref = _type_ref(plan, where, item["type"])
        uuid = None if item.get("uuid") is None else _checked(plan, uuid_text, f"{where}: uuid", item["uuid"])
        if ref is not None and (uuid is not None or item.get("uuid") is None):
            out.append(MdevWant(key, str(ref), uuid))
    return out


def _vf_entries(plan: Plan, key: str, value: Any) -> list[VfWant]:
    out = []
    for i, item in enumerate(_list(plan, f"{key}: vgpus", value)):
        where = f"{key}: vgpus[{i}]"
        if not isinstance(item, dict) or item.get("type") in (None, ""):
            _problem(
                plan, f"{where} must be a mapping with a type (and optionally a vf)", 'e.g. {type: "NVIDIA A100-4C"}'
            )
            continue
        _unknown_keys(plan, where, item, ("type", "vf"))
        vf = None
        if item.get("vf") is not None:
            vf = _checked(plan, pci_address, f"{where}: vf", item["vf"])
            if vf is None:
                continue
        ref = item["type"]
        if isinstance(ref, bool) or not isinstance(ref, (int, str)):
            _problem(plan, f"{where}: type {shown(ref)} must be a vGPU type name or numeric ID", "e.g. type: 557")
            continue
        ref = _type_ref(plan, where, ref)
        if ref is not None:
            out.append(VfWant(ref, vf))
    return out


def _mig_entries(plan: Plan, key: str, value: Any) -> list[str | int]:
    rule = 'name profiles as nvidia-smi mig -lgip does: "3g.40gb"'
    if isinstance(value, dict):
        out: list[str | int] = []
        for profile, count in value.items():
            checked = _checked(plan, text_field, f"{key}: mig: profile", profile, pattern=TYPE_REF_RE, rule=rule)
            if checked is None:
                continue
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                where = f"{key}: mig: count {shown(count)} for {profile}"
                _problem(plan, f"{where} must be a whole number", 'e.g. {"1g.10gb": 7}')
                continue
            # Bounded before the list is built: a GPU holds at most 7 GPU instances.
            if _checked(plan, integer, f"{key}: mig: {profile}", count, 0, MAX_MIG_INSTANCES) is None:
                continue
            out += [profile] * count
        return out
    out = []
    for p in _list(plan, f"{key}: mig", value):
        if isinstance(p, int) and not isinstance(p, bool):
            checked = _checked(plan, integer, f"{key}: mig: profile", p, 0, MAX_VGPU_TYPE)
        elif isinstance(p, str) and p.strip():
            checked = _checked(plan, text_field, f"{key}: mig: profile", p, pattern=TYPE_REF_RE, rule=rule)
        else:
            _problem(plan, f"{key}: mig: {shown(p)} is not a MIG profile", rule)
            continue
        if checked is not None:
            out.append(checked)
    return out


def parse_gpus(gpus: Any, plan: Plan) -> list[Entry]:
    """The entries this module manages (mdev, sriov_vgpu, mig); problems go to ``plan``.

    Every value meets the input rules of :mod:`gpuprov.inputs.validate` (docs/reference/inputs.md)."""
    if gpus is None:
        return []
    if not isinstance(gpus, dict):
        _problem(
            plan,
            f"gpuprov_gpus must be a mapping keyed by PCI address, not {kind(gpus)}",
            'e.g. {"0000:41:00.0": {use: mdev, mdevs: [...]}}',
        )
        return []
    if len(gpus) > MAX_GPUS:
        _problem(plan, f"gpuprov_gpus has {len(gpus)} entries, more than {MAX_GPUS}", "one entry per GPU of the host")
        return []
    entries: list[Entry] = []
    seen: dict[str, str] = {}
    for raw_key, value in gpus.items():
        if not isinstance(value, dict) or "use" not in value:
            _problem(
                plan, f"gpuprov_gpus[{shown(raw_key)}] must be a mapping with use", f"use is one of {', '.join(USES)}"
            )
            continue
        use = value["use"]
        if not isinstance(use, str) or use not in USES:
            _problem(
                plan,
                f"gpuprov_gpus[{shown(raw_key)}]: use {shown(use)} is not one of {', '.join(USES)}",
                f"write use: one of {', '.join(USES)}",
            )
            continue
        key = _key(plan, raw_key, use)
        if key is None or use not in MANAGED_USES:
            continue  # passthrough and host entries are vfio_host's and the host's: only their key is checked
        if key in seen:
            _problem(plan, f"{key} is declared twice in gpuprov_gpus ({seen[key]!r} and {raw_key!r})", "keep one entry")
            continue
        seen[key] = str(raw_key)
        _unknown_keys(plan, f"gpuprov_gpus[{raw_key!r}] (use: {use})", value, ENTRY_KEYS[use])
        entry = Entry(key, use)
        if use == "mdev":
            entry.mdevs = _mdev_entries(plan, key, value.get("mdevs"))
        elif use == "sriov_vgpu":
            entry.vgpus = _vf_entries(plan, key, value.get("vgpus"))
        else:
            entry.mig = _mig_entries(plan, key, value.get("mig"))
        entries.append(entry)
    return entries
