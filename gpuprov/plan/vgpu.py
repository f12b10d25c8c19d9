"""Plan the vGPU instances each GPU offers: mdevs, NVIDIA SR-IOV vGPU types, MIG layouts.

The config is the inventory's ``gpuprov_gpus``, keyed by GPU PCI address (or,
for a non-PCI mdev parent such as the kernel's ``mtty`` sample, the parent's
name in ``/sys/class/mdev_bus``)::

    "0000:81:00.0": {use: mdev, mdevs: [{type: nvidia-259, uuid: ...}, {type: "GRID V100-8Q"}]}
    "0000:c1:00.0": {use: sriov_vgpu, vgpus: [{type: "NVIDIA A100-4C"}, {type: 557, vf: "0000:c1:00.5"}]}
    "0000:e1:00.0": {use: mig, mig: ["3g.40gb", "2g.20gb"]}      # or {"1g.10gb": 7}

``use: passthrough`` and ``use: host`` entries belong to other roles and are
skipped. Three mechanisms:

- **mdev** (pre-Ampere NVIDIA vGPU, any mdev parent): an instance is created by
  writing its UUID to ``mdev_supported_types/<type>/create`` and removed by
  writing 1 to ``/sys/bus/mdev/devices/<uuid>/remove``; it persists as an
  mdevctl definition ``/etc/mdevctl.d/<parent>/<uuid>``, which mdevctl's udev
  rule starts when the parent appears at boot. A UUID not given is derived
  (uuid5 of parent, type and the entry's rank among that type's entries), the
  same on every run, so a VM keeps its vGPU.
- **SR-IOV vGPU** (NVIDIA Ampere and later): the VFs are enabled
  (``/usr/lib/nvidia/sriov-manage -e``, else ``sriov_numvfs``), then each VF gets
  its type ID in ``nvidia/current_vgpu_type`` (0 clears it). Entry *i* takes VF
  number *i* unless pinned with ``vf``.
- **MIG**: GPU instances with a default compute instance each
  (``nvidia-smi mig -cgi IDS -C``), destroyed with ``-dci``/``-dgi``; MIG mode itself
  is only switched with an explicit ``allow_mig_mode_change``.

VF types and MIG instances do not survive a reboot: the layout is saved in
``/etc/gpuprov/vgpu.json`` and the boot unit ``gpuprov-vgpu.service`` re-applies
it with this same planner (``python3 -m gpuprov.plan.vgpu``, from a copy of the
package the module writes under ``/usr/lib/gpuprov``). The same file records
what gpuprov made: an instance is removed only when gpuprov made it and the
config no longer names it, or, with ``prune``, when it sits on a declared GPU
the config does not name. Removing or changing an instance a running domain
uses (its ``/dev/vfio`` group held open, or named by a running domain's XML
under ``/run/libvirt/qemu``) is refused.

:func:`plan_vgpu` is pure (facts and file texts in, a :class:`VgpuPlan` out);
:func:`read_host` gathers its inputs and :func:`converge` runs it twice where
VFs are enabled first. Standard library only: ships with the module and runs
at boot.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import re
import sys
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from ..facts.domains import read_running
from ..facts.evidence import IN_USE, MissingEvidence
from ..facts.host import HostFacts, gather
from ..facts.mdev import MdevParent, MdevType
from ..facts.mig import MigFacts, MigProfile, Runner, read_mig
from ..facts.sysfs import Sysfs
from ..rules.assess import VFIO_DRIVERS, Finding, held_open, unknown_finding, unknown_findings
from ..rules.validate import (
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
from ..rules.validate import text as text_field
from .base import (
    COMMAND,
    REMOVE_FILE,
    Action,
    Applied,
    Plan,
    Refusal,
    apply,
    file_action,
    read_text,
    sysfs_write,
)

USES = ("passthrough", "host", "mdev", "sriov_vgpu", "mig")
MANAGED_USES = ("mdev", "sriov_vgpu", "mig")
ENTRY_KEYS = {"mdev": ("use", "mdevs"), "sriov_vgpu": ("use", "vgpus"), "mig": ("use", "mig")}
# RmPVMRL (NVIDIA vGPU user guide, "Changing Scheduling Behavior for Time-Sliced vGPUs"):
# 0x00 best effort (the driver's default), 0x01 equal share, 0x11 fixed share;
# 0x00TT0001 / 0x00TT0011 set a time slice of TT ms (1 to 30).
SCHEDULERS = {"best_effort": 0x00, "equal_share": 0x01, "fixed_share": 0x11}
NVIDIA = 0x10DE

STATE_FILE = "etc/gpuprov/vgpu.json"
STATE_SCHEMA = "gpuprov.vgpu-state/v1"
SCHEDULER_CONF = "etc/modprobe.d/gpuprov-vgpu-scheduler.conf"
BOOT_SERVICE = "gpuprov-vgpu.service"
BOOT_UNIT = f"etc/systemd/system/{BOOT_SERVICE}"
BOOT_WANTS = f"etc/systemd/system/multi-user.target.wants/{BOOT_SERVICE}"
BOOT_LIB = "usr/lib/gpuprov"  # the package copy the boot unit runs: usr/lib/gpuprov/gpuprov/...
MDEVCTL_DIR = "etc/mdevctl.d"
MDEVCTL_RULE = "etc/udev/rules.d/60-mdevctl.rules"  # same name: overrides the packaged rule
PACKAGED_MDEVCTL_RULES = ("usr/lib/udev/rules.d/60-mdevctl.rules", "lib/udev/rules.d/60-mdevctl.rules")
MDEVCTL_PATHS = ("usr/sbin/mdevctl", "usr/bin/mdevctl", "sbin/mdevctl", "bin/mdevctl")
SRIOV_MANAGE = "usr/lib/nvidia/sriov-manage"
NVIDIA_PARAMS = "proc/driver/nvidia/params"
_HEADER = "# Managed by gpuprov (vgpu_host role / gpu_vgpu module); edits are overwritten.\n"
# A fixed namespace: an mdev without a UUID gets the same one on every run.
_MDEV_NAMESPACE = uuidlib.UUID("3d3c2b8e-0b8f-4d52-a7d6-5f0e9a41c7b3")
_REGISTRY_RE = re.compile(r"RmPVMRL\s*=\s*(0x[0-9a-fA-F]+|\d+)")
_RULE_PATH_RE = re.compile(r"(/\S*/mdevctl) start-parent-mdevs")


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
        }


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
    """A :mod:`gpuprov.validate` checker's value; its problems become the plan's refusals."""
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

    Every value meets the input rules of :mod:`gpuprov.validate` (docs/reference/inputs.md)."""
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


# ---------------------------------------------------------------- inputs besides facts


@dataclass
class HostInputs:
    """What the planner reads besides :class:`HostFacts`: file texts, tools, running domains."""

    files: dict[str, str | None] = field(default_factory=dict)  # root-relative path -> text (None: absent)
    mdevctl_defs: dict[str, str] = field(default_factory=dict)  # "parent/uuid" -> definition text
    running: dict[str, str] = field(default_factory=dict)  # mdev UUID or PCI address -> running domain
    missing: MissingEvidence = field(default_factory=dict)  # what of the above could not be read
    tools: list[str] = field(default_factory=list)  # of sriov-manage, mdevctl: those installed
    boot_enabled: bool = False  # the unit's multi-user.target.wants link exists
    nvidia_params: str | None = None  # /proc/driver/nvidia/params (None: the module is not loaded)
    registry_elsewhere: list[str] = field(default_factory=list)  # other modprobe.d files setting RegistryDwords
    mdevctl_rule: tuple[str, str] | None = None  # (path, text) of the packaged udev rule
    mdevctl_path: str | None = None  # where mdevctl is, root-relative
    boot_sources: dict[str, str] = field(default_factory=dict)  # package files the boot unit runs
    boot_files: dict[str, str] = field(default_factory=dict)  # what is under BOOT_LIB now


def _import_closure(package: str, start: str) -> dict[str, str]:
    """module name (relative to ``package``) -> its source, for ``start`` and every module it imports."""
    sources: dict[str, str] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        if name in sources:
            continue
        module = importlib.import_module(f"{package}.{name}" if name else package)
        source = inspect.getsource(module)
        sources[name] = source
        is_pkg = hasattr(module, "__path__")
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        here = [p for p in here if p]
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ImportFrom) or node.level == 0:
                continue
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else list(here)
            target = ".".join(base + ([node.module] if node.module else []))
            if node.module is None:
                todo += [".".join([*base, a.name]) for a in node.names]
            else:
                todo.append(target)
        # the packages' __init__ come along so the copy imports as a package
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(len(parts))]
    return sources


def boot_sources() -> dict[str, str]:
    """Root-relative path -> text of the package files ``python3 -m gpuprov.plan.vgpu`` needs.

    Read from the package this code was imported from (the checkout, or the
    module_utils an Ansible module shipped), so the boot copy is exactly the
    planner that ran."""
    package = __name__.rsplit(".", 2)[0]  # gpuprov (this module is gpuprov.plan.vgpu)
    out = {}
    for name, source in _import_closure(package, "plan.vgpu").items():
        module = importlib.import_module(f"{package}.{name}" if name else package)
        rel = name.replace(".", "/")
        rel = f"{rel}/__init__.py" if hasattr(module, "__path__") else f"{rel}.py"
        out[f"{BOOT_LIB}/gpuprov/{rel.lstrip('/')}"] = source
    return out


def _mdevctl_rule(sysfs: Sysfs) -> tuple[str, str] | None:
    for path in PACKAGED_MDEVCTL_RULES:
        text = read_text(sysfs, path)
        if text is not None:
            return path, text
    return None


def read_inputs(sysfs: Sysfs, facts: HostFacts, *, with_boot_sources: bool = True) -> HostInputs:
    """Everything besides facts that :func:`plan_vgpu` reads, below the root."""
    inputs = HostInputs()
    for path in (STATE_FILE, SCHEDULER_CONF, BOOT_UNIT, MDEVCTL_RULE):
        inputs.files[path] = read_text(sysfs, path)
    for parent in sysfs.listdir(MDEVCTL_DIR):
        if parent == "scripts.d":
            continue
        for name in sysfs.listdir(f"{MDEVCTL_DIR}/{parent}"):
            text = read_text(sysfs, f"{MDEVCTL_DIR}/{parent}/{name}")
            if text is not None:
                inputs.mdevctl_defs[f"{parent}/{name}"] = text
    inputs.running = read_running(sysfs, inputs.missing)
    if sysfs.exists(SRIOV_MANAGE):
        inputs.tools.append("sriov-manage")
    inputs.mdevctl_path = next((p for p in MDEVCTL_PATHS if sysfs.exists(p)), None)
    if inputs.mdevctl_path:
        inputs.tools.append("mdevctl")
    inputs.boot_enabled = sysfs.exists(BOOT_WANTS)
    inputs.nvidia_params = sysfs.read(NVIDIA_PARAMS)
    for name in sysfs.listdir("etc/modprobe.d"):
        path = f"etc/modprobe.d/{name}"
        if path != SCHEDULER_CONF and name.endswith(".conf"):
            text = sysfs.read(path) or ""
            if any(
                line.split("#", 1)[0].split()[:2] == ["options", "nvidia"] and "NVreg_RegistryDwords" in line
                for line in text.splitlines()
            ):
                inputs.registry_elsewhere.append("/" + path)
    inputs.mdevctl_rule = _mdevctl_rule(sysfs)
    if with_boot_sources:
        inputs.boot_sources = boot_sources()
    for path in sysfs.walk_files(BOOT_LIB):
        if not path.endswith(".py"):
            continue  # __pycache__ and the like: Python's, not ours
        text = read_text(sysfs, path)
        if text is not None:
            inputs.boot_files[path] = text
    return inputs


# ---------------------------------------------------------------- previous state


@dataclass
class Managed:
    """What gpuprov made before, from the saved layout."""

    mdevs: dict[str, tuple[str, str]] = field(default_factory=dict)  # uuid -> (parent, type)
    vfs: dict[str, int] = field(default_factory=dict)  # VF -> type ID
    type_names: dict[int, str] = field(default_factory=dict)


def parse_state(text: str | None, plan: Plan) -> tuple[dict[str, Any], Managed]:
    """The saved layout and what it says gpuprov made; a garbled file is reported and taken as empty."""
    managed = Managed()
    if not text:
        return {}, managed
    try:
        state = json.loads(text)
        if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
            raise ValueError(f"not a {STATE_SCHEMA} document")
        gpus = state.get("gpus") or {}
        for key, entry in gpus.items():
            if entry.get("use") == "mdev":
                for m in entry.get("mdevs") or []:
                    if m.get("uuid"):
                        managed.mdevs[str(m["uuid"])] = (key, str(m["type"]))
            elif entry.get("use") == "sriov_vgpu":
                for v in entry.get("vgpus") or []:
                    if v.get("vf") and isinstance(v.get("type"), int):
                        managed.vfs[str(v["vf"])] = int(v["type"])
        for k, v in (state.get("vgpu_type_names") or {}).items():
            managed.type_names[int(k)] = str(v)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        plan.warnings.append(
            f"/{STATE_FILE} is unreadable ({exc}): nothing gpuprov made before is removed this run; "
            "it is rewritten from the config"
        )
        return {}, Managed()
    return state, managed


# ---------------------------------------------------------------- checks shared by the mechanisms


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


# ---------------------------------------------------------------- mdev


def _resolve_mdev_type(parent: MdevParent, ref: str) -> tuple[MdevType | None, str | None]:
    if ref in parent.types:
        return parent.types[ref], None
    named = [t for t in parent.types.values() if t.name == ref] or [
        t for t in parent.types.values() if (t.name or "").lower() == ref.lower()
    ]
    if len(named) == 1:
        return named[0], None
    if named:
        return None, f"type name {ref!r} matches {', '.join(t.type_id for t in named)} on {parent.parent}"
    offered = ", ".join(f"{t.type_id} ({t.name})" for t in parent.types.values()) or "none"
    return None, f"mdev type {ref!r} is not offered by {parent.parent} (offered: {offered})"


def _resolve_mdevs(facts: HostFacts, entries: list[Entry], plan: Plan) -> list[MdevWant]:
    """Each declared mdev with its type resolved and its UUID (given or derived); problems go to ``plan``."""
    wanted: list[MdevWant] = []
    for entry in entries:
        parent = facts.mdev_parents.get(entry.key)
        if parent is None:
            offered = ", ".join(sorted(facts.mdev_parents)) or "none"
            dev = facts.pci.get(entry.key)
            if dev is not None:
                problem = (
                    f"{entry.key} offers no mdev types (driver {dev.driver or 'none'}; mdev parents here: {offered})"
                )
                fix = (
                    "load the NVIDIA vGPU host driver (vGPU manager) for this GPU; Ampere and later GPUs "
                    "give vGPUs through SR-IOV VFs instead: use: sriov_vgpu"
                )
            else:
                problem = f"no mdev parent {entry.key} on this host (mdev parents here: {offered})"
                fix = "load the parent's driver (the NVIDIA vGPU manager, mtty...) or fix the key"
            _problem(plan, problem, fix, entry.key)
            continue
        if facts.pci.get(entry.key) is not None and facts.pci[entry.key].physfn is not None:
            plan.warnings.append(
                f"{entry.key} is an SR-IOV VF: VFs are gone after a reboot until enabled again "
                "(sriov-manage -e), and mdevctl starts its mdevs only once the VF is back"
            )
        ranks: dict[str, int] = {}
        for i, want in enumerate(entry.mdevs):
            mtype, problem = _resolve_mdev_type(parent, want.type_ref)
            if mtype is None:
                _problem(
                    plan,
                    f"{entry.key}: mdevs[{i}]: {problem}",
                    "use one of the offered types (`gpuprov inspect` lists them)",
                    entry.key,
                )
                continue
            want.type_id, want.name = mtype.type_id, mtype.name
            if want.uuid is None:
                rank = ranks.get(mtype.type_id, 0)
                ranks[mtype.type_id] = rank + 1
                want.uuid = derived_uuid(entry.key, mtype.type_id, rank)
            wanted.append(want)
    return wanted


def declared_mdevs(facts: HostFacts, gpus: Any) -> tuple[dict[str, dict[str, str]], list[Refusal]]:
    """UUID -> {parent, type} of every mdev ``gpus`` (gpuprov_gpus) declares, as vgpu_host will
    create them, and the problems found: for checking VMs' mdevs against the vGPU layout."""
    plan = Plan()
    wanted = _resolve_mdevs(facts, [e for e in parse_gpus(gpus, plan) if e.use == "mdev"], plan)
    return {str(w.uuid): {"parent": w.parent, "type": str(w.type_id)} for w in wanted}, plan.refusals


def _plan_mdevs(
    facts: HostFacts,
    entries: list[Entry],
    managed: Managed,
    inputs: HostInputs,
    request: VgpuRequest,
    plan: VgpuPlan,
) -> list[MdevWant]:
    existing = {m.uuid: m for m in facts.mdevs}
    wanted = _resolve_mdevs(facts, entries, plan)
    by_uuid: dict[str, MdevWant] = {}
    for want in wanted:
        if want.uuid in by_uuid:
            other = by_uuid[want.uuid]
            _problem(
                plan,
                f"mdev {want.uuid} is declared twice ({other.parent} and {want.parent})",
                "give each mdev its own UUID",
                want.uuid,
            )
        by_uuid[str(want.uuid)] = want
    declared = {e.key for e in entries}
    removals: list[Any] = []
    if not request.boot:
        for uuid, inst in sorted(existing.items()):
            if uuid in by_uuid:
                continue
            ours = managed.mdevs.get(uuid)
            if ours is not None or (request.prune and inst.parent in declared):
                removals.append(inst)
    changes = []
    new_count: dict[tuple[str, str], list[str]] = {}
    for want in wanted:
        inst = existing.get(str(want.uuid))
        record = {"parent": want.parent, "type": want.type_id, "name": want.name, "uuid": want.uuid}
        if inst is None:
            new_count.setdefault((want.parent, str(want.type_id)), []).append(str(want.uuid))
            plan.mdevs.append({**record, "state": "created"})
        elif (inst.parent, inst.type_id) == (want.parent, want.type_id):
            plan.mdevs.append({**record, "state": "present"})
        elif str(want.uuid) in managed.mdevs:
            changes.append((inst, want))
            new_count.setdefault((want.parent, str(want.type_id)), []).append(str(want.uuid))
            plan.mdevs.append({**record, "state": "created", "replaces": f"{inst.type_id} on {inst.parent}"})
        else:
            _problem(
                plan,
                f"mdev {want.uuid} exists already as {inst.type_id} on {inst.parent}, "
                f"not {want.type_id} on {want.parent}, and gpuprov did not make it",
                "give this entry another UUID, or remove that mdev first (mdevctl stop and undefine)",
                want.uuid,
            )
    for inst in removals + [c[0] for c in changes]:
        what = f"removing mdev {inst.uuid} ({inst.type_id} on {inst.parent})"
        users = _mdev_users(facts, inst.uuid, inst.iommu_group, inputs.running)
        _in_use(plan, what, users, inst.uuid, _in_use_unknown(facts, inputs, [str(inst.parent)]))
    # Capacity: what the type offers now, plus what this run frees of that same type.
    freed: dict[tuple[str, str], int] = {}
    for inst in removals + [c[0] for c in changes]:
        key = (str(inst.parent), str(inst.type_id))
        freed[key] = freed.get(key, 0) + 1
    for (parent_name, type_id), uuids in sorted(new_count.items()):
        available = facts.mdev_parents[parent_name].types[type_id].available_instances
        room = None if available is None else available + freed.get((parent_name, type_id), 0)
        if room is not None and len(uuids) > room:
            _problem(
                plan,
                f"{len(uuids)} new {type_id} mdevs on {parent_name} but available_instances is {available}",
                "declare fewer or smaller vGPUs on this parent, or use another GPU",
                parent_name,
            )
    # NVIDIA time-sliced vGPU: one type per board unless mixed mode.
    removing = {i.uuid for i in removals} | {c[0].uuid for c in changes}
    types_on: dict[str, dict[str, list[str]]] = {}
    for inst in facts.mdevs:
        if inst.uuid not in removing and inst.parent and inst.type_id and inst.uuid not in by_uuid:
            types_on.setdefault(inst.parent, {}).setdefault(inst.type_id, []).append(f"existing mdev {inst.uuid}")
    for want in wanted:
        types_on.setdefault(want.parent, {}).setdefault(str(want.type_id), []).append(f"mdev {want.uuid}")
    for parent_name, by_type in sorted(types_on.items()):
        dev = facts.pci.get(parent_name)
        if dev is not None and dev.vendor_id == NVIDIA:
            _mixed(plan, parent_name, by_type, request.mixed_vgpu_types)
    # Actions: removals first (they free room), then creations.
    for inst in removals + [c[0] for c in changes]:
        plan.actions.append(
            sysfs_write(f"sys/bus/mdev/devices/{inst.uuid}/remove", "1", f"remove mdev {inst.type_id} on {inst.parent}")
        )
        plan.removed_mdevs.append({"parent": inst.parent, "type": inst.type_id, "uuid": inst.uuid})
    for want in wanted:
        inst = existing.get(str(want.uuid))
        if inst is None or str(want.uuid) in {c[1].uuid for c in changes}:
            path = f"sys/class/mdev_bus/{want.parent}/mdev_supported_types/{want.type_id}/create"
            plan.actions.append(
                sysfs_write(path, str(want.uuid), f"create mdev {want.type_id} ({want.name}) on {want.parent}")
            )
    plan.removed_mdevs = [r for r in plan.removed_mdevs if r["uuid"] not in by_uuid]
    if request.persistent and not request.boot:
        _mdevctl_files(wanted, removals, managed, inputs, plan)
    return wanted


def mdevctl_definition(type_id: str) -> str:
    """An mdevctl definition, as ``mdevctl define --auto`` writes it: started when its parent appears."""
    return json.dumps({"mdev_type": type_id, "start": "auto", "attrs": []}, indent=2) + "\n"


def _mdevctl_files(
    wanted: list[MdevWant], removals: list[Any], managed: Managed, inputs: HostInputs, plan: VgpuPlan
) -> None:
    keep = {f"{w.parent}/{w.uuid}" for w in wanted}
    for want in wanted:
        rel = f"{want.parent}/{want.uuid}"
        action = file_action(
            f"{MDEVCTL_DIR}/{rel}",
            mdevctl_definition(str(want.type_id)),
            inputs.mdevctl_defs.get(rel),
            f"mdevctl starts mdev {want.uuid} at boot",
        )
        if action:
            plan.actions.append(action)
    # Definitions of mdevs gpuprov made (or prunes) and no longer declared there; others' stay.
    ours = set(managed.mdevs) | {i.uuid for i in removals}
    for rel, text in sorted(inputs.mdevctl_defs.items()):
        if rel not in keep and rel.rsplit("/", 1)[-1] in ours:
            plan.actions.append(
                Action(
                    REMOVE_FILE,
                    f"mdev {rel.rsplit('/', 1)[-1]} is no longer declared",
                    path=f"{MDEVCTL_DIR}/{rel}",
                    before=text,
                )
            )


# ---------------------------------------------------------------- SR-IOV vGPU


def _type_names(facts: HostFacts, pf: str, managed: Managed) -> dict[int, str]:
    names = dict(managed.type_names)
    for vf in facts.pci[pf].virtfns:
        state = facts.vgpu_vfs.get(vf)
        if state is not None:
            names.update(state.creatable)
    return names


def _resolve_vgpu_type(ref: str | int, names: dict[int, str]) -> int | None:
    if isinstance(ref, int) or str(ref).strip().isdigit():
        return int(ref)
    text = str(ref).strip()
    for tid, name in names.items():
        if name == text:
            return tid
    matches = [tid for tid, name in names.items() if name.lower() == text.lower()]
    return matches[0] if len(matches) == 1 else None


def _plan_sriov_entry(
    facts: HostFacts,
    entry: Entry,
    managed: Managed,
    inputs: HostInputs,
    held: dict[str, list[str]],
    plan: VgpuPlan,
    final: dict[str, int],
) -> None:
    pf = facts.pci.get(entry.key)
    if pf is None:
        _problem(
            plan,
            f"no PCI device {entry.key} on this host (sriov_vgpu)",
            "check the address with `lspci -D` or `gpuprov inspect`",
            entry.key,
        )
        return
    if pf.physfn is not None:
        _problem(
            plan,
            f"{entry.key} is itself a VF (of {pf.physfn})",
            f"key the entry by the physical GPU {pf.physfn}",
            entry.key,
        )
        return
    if not pf.sriov_totalvfs:
        _problem(
            plan,
            f"{entry.key} ({pf.name}) has no SR-IOV virtual functions (no sriov_totalvfs)",
            "NVIDIA SR-IOV vGPU needs an Ampere or later data-center GPU with the vGPU host driver; "
            "older GPUs give vGPUs as mdevs (use: mdev), or pass the GPU through whole",
            entry.key,
        )
        return
    if pf.driver in VFIO_DRIVERS:
        _problem(
            plan,
            f"{entry.key} is bound to {pf.driver} (passthrough): the vGPU manager cannot slice it",
            "take it out of the passthrough devices (use: passthrough / vfio_host_devices), remove the early "
            "binding (vfio_host_state: unbound) and reboot",
            entry.key,
        )
        return
    if pf.driver != "nvidia":
        _problem(
            plan,
            f"{entry.key} is on driver {pf.driver or 'none'}, not nvidia",
            "install and load the NVIDIA vGPU host driver (vGPU manager) for this GPU",
            entry.key,
        )
        return
    vfs = sorted(pf.virtfns)
    if not vfs:
        if "sriov-manage" in inputs.tools:
            plan.actions.append(_cmd(["/" + SRIOV_MANAGE, "-e", entry.key], f"enable the SR-IOV VFs of {entry.key}"))
        else:
            plan.actions.append(
                sysfs_write(
                    f"{pf.sysfs_path}/sriov_numvfs", str(pf.sriov_totalvfs), f"enable the SR-IOV VFs of {entry.key}"
                )
            )
            plan.warnings.append(f"/{SRIOV_MANAGE} not found: the VFs of {entry.key} are enabled through sriov_numvfs")
        if entry.vgpus:
            plan.second_pass.append(entry.key)
            plan.warnings.append(f"the vGPU types of {entry.key} are checked and set once its VFs exist")
            for want in entry.vgpus:
                plan.vgpus.append(
                    {"pf": entry.key, "vf": want.vf, "type": want.type_ref, "name": None, "state": "pending"}
                )
        return
    names = _type_names(facts, entry.key, managed)
    taken: dict[str, int] = {}
    for i, want in enumerate(entry.vgpus):
        where = f"{entry.key}: vgpus[{i}]"
        address = want.vf or (vfs[i] if i < len(vfs) else None)
        if address is None:
            _problem(plan, f"{where}: the GPU has {len(vfs)} VFs, no VF number {i}", "declare fewer vGPUs", entry.key)
            continue
        if address not in vfs:
            _problem(
                plan,
                f"{where}: {address} is not a VF of {entry.key} (its VFs: {vfs[0]} to {vfs[-1]})",
                "pin one of its VFs",
                entry.key,
            )
            continue
        if address in taken:
            _problem(
                plan,
                f"{where}: VF {address} is taken by vgpus[{taken[address]}] too",
                "each vGPU needs its own VF (pin another)",
                address,
            )
            continue
        taken[address] = i
        want.address = address
        state = facts.vgpu_vfs.get(address)
        if state is None:
            if address in facts.mdev_parents:
                _problem(
                    plan,
                    f"{where}: VF {address} offers vGPUs as mdev types "
                    "(a driver older than the vendor-specific VFIO framework)",
                    f'declare the VF as an mdev parent instead: "{address}": {{use: mdev, mdevs: [{{type: ...}}]}}',
                    address,
                )
            else:
                _problem(
                    plan,
                    f"{where}: VF {address} shows no nvidia/creatable_vgpu_types",
                    "start the NVIDIA vGPU manager (nvidia-vgpu-mgr.service) and check the VFs are bound to nvidia",
                    address,
                )
            continue
        if state.current_type is None:
            _problem(
                plan,
                f"{where}: VF {address}'s nvidia/current_vgpu_type is unreadable",
                "check the vGPU manager's state (nvidia-smi vgpu) and that this runs as root",
                address,
            )
            continue
        tid = _resolve_vgpu_type(want.type_ref, names)
        if tid is None or (tid not in names and tid != state.current_type):
            known = ", ".join(f"{k} ({v})" for k, v in sorted(names.items())) or "none creatable now"
            _problem(
                plan,
                f"{where}: vGPU type {want.type_ref!r} is not offered by {entry.key} (types: {known})",
                "use one of these names or IDs",
                entry.key,
            )
            continue
        want.type_id, want.name = tid, names.get(tid)
        dev = facts.pci[address]
        path = f"{dev.sysfs_path}/nvidia/current_vgpu_type"
        record = {"pf": entry.key, "vf": address, "type": tid, "name": want.name}
        final[address] = tid
        if state.current_type == tid:
            plan.vgpus.append({**record, "state": "present"})
            continue
        if state.current_type:
            if address not in managed.vfs:
                _problem(
                    plan,
                    f"{where}: VF {address} holds vGPU type {state.current_type} "
                    f"({names.get(state.current_type, '?')}), which gpuprov did not set",
                    "pin this vGPU to a free VF, or clear that one first "
                    f"(echo 0 > /sys/bus/pci/devices/{address}/nvidia/current_vgpu_type)",
                    address,
                )
                continue
            what = f"changing VF {address} from vGPU type {state.current_type} to {tid}"
            users = _pci_users(held, address, inputs.running)
            if _in_use(plan, what, users, address, _in_use_unknown(facts, inputs, [address])):
                continue
            plan.actions.append(sysfs_write(path, "0", f"clear vGPU type {state.current_type} from VF {address}"))
        elif tid not in state.creatable:
            creatable = ", ".join(f"{k} ({v})" for k, v in sorted(state.creatable.items())) or "none"
            _problem(
                plan,
                f"{where}: vGPU type {tid} ({want.name}) is not creatable on VF {address} now (creatable: {creatable})",
                "the GPU is full or holds another type: declare fewer or smaller vGPUs, or free VFs",
                address,
            )
            continue
        plan.actions.append(sysfs_write(path, str(tid), f"vGPU type {tid} ({want.name}) on VF {address}"))
        plan.vgpus.append({**record, "state": "set"})


def _plan_sriov(
    facts: HostFacts, entries: list[Entry], managed: Managed, inputs: HostInputs, request: VgpuRequest, plan: VgpuPlan
) -> None:
    held = held_open(facts)
    final: dict[str, int] = {}
    for entry in entries:
        _plan_sriov_entry(facts, entry, managed, inputs, held, plan, final)
    if request.boot:
        return
    # VFs gpuprov set before and no longer declared (or, with prune, any typed VF of a declared GPU).
    declared = {e.key for e in entries}
    for address, state in sorted(facts.vgpu_vfs.items()):
        dev = facts.pci.get(address)
        if dev is None or address in final or not state.current_type:
            continue
        if address in managed.vfs or (request.prune and dev.physfn in declared):
            what = f"clearing vGPU type {state.current_type} from VF {address}"
            users = _pci_users(held, address, inputs.running)
            if _in_use(plan, what, users, address, _in_use_unknown(facts, inputs, [address])):
                continue
            plan.actions.append(
                sysfs_write(f"{dev.sysfs_path}/nvidia/current_vgpu_type", "0", f"VF {address} is no longer declared")
            )
            plan.cleared_vfs.append({"vf": address, "type": state.current_type})
    cleared = {c["vf"] for c in plan.cleared_vfs}
    by_pf: dict[str, dict[str, list[str]]] = {}
    for address, state in facts.vgpu_vfs.items():
        dev = facts.pci.get(address)
        if dev is None or dev.physfn is None or address in cleared:
            continue
        tid = final.get(address, state.current_type or 0)
        if tid:
            by_pf.setdefault(dev.physfn, {}).setdefault(str(tid), []).append(address)
    for pf, by_type in sorted(by_pf.items()):
        _mixed(plan, pf, by_type, request.mixed_vgpu_types)


# ---------------------------------------------------------------- MIG


def fit(wanted: list[MigProfile], occupied: list[tuple[int, int]]) -> list[int] | None:
    """A start slice for each profile so no two instances overlap, or None.

    ``occupied``: (start, size) of the instances that stay. Backtracking over
    the placements ``nvidia-smi mig -lgipp`` lists: a GPU has at most 8 slices."""
    order = sorted(range(len(wanted)), key=lambda i: -(wanted[i].size or 0))
    starts: list[int] = [0] * len(wanted)
    used = [(s, s + n) for s, n in occupied]

    def free(start: int, size: int) -> bool:
        return all(start + size <= a or b <= start for a, b in used)

    def place(k: int) -> bool:
        if k == len(order):
            return True
        p = wanted[order[k]]
        if not p.size or not p.placements:
            return False
        for start in p.placements:
            if free(start, p.size):
                used.append((start, start + p.size))
                starts[order[k]] = start
                if place(k + 1):
                    return True
                used.pop()
        return False

    return starts if place(0) else None


def _plan_mig_entry(facts: HostFacts, entry: Entry, mig: MigFacts, request: VgpuRequest, plan: VgpuPlan) -> None:
    key = entry.key
    dev = facts.pci.get(key)
    if dev is None:
        _problem(
            plan,
            f"no PCI device {key} on this host (mig)",
            "check the address with `lspci -D` or `gpuprov inspect`",
            key,
        )
        return
    if mig.error:
        _problem(
            plan,
            f"{key}: the MIG state cannot be read: {mig.error}",
            "install the NVIDIA driver and its nvidia-smi",
            key,
        )
        return
    gpu = mig.gpus.get(key)
    if gpu is None:
        _problem(
            plan,
            f"{key}: nvidia-smi does not show this GPU",
            "check it is bound to the nvidia driver (`gpuprov inspect`)",
            key,
        )
        return
    n = str(gpu.index)
    if not gpu.supported:
        _problem(
            plan,
            f"{key} (GPU {n}) does not support MIG",
            "MIG needs an A100/A30/H100/H200-class GPU: use sriov_vgpu or passthrough",
            key,
        )
        return
    if gpu.mode_current != "enabled":
        if gpu.mode_pending == "enabled":
            _problem(
                plan,
                f"{key} (GPU {n}): MIG mode is enabled but pending: it takes effect after a GPU reset",
                f"reset the GPU with no process on it (nvidia-smi -r -i {n}) or reboot, then run again",
                key,
            )
        elif request.allow_mig_mode_change:
            plan.actions.append(_cmd(["nvidia-smi", "-i", n, "-mig", "1"], f"MIG mode on for GPU {n} ({key})"))
            plan.warnings.append(
                f"{key} (GPU {n}): MIG mode is switched on and takes effect after a GPU reset "
                f"(nvidia-smi -r -i {n}) or a reboot; run again afterwards to create the instances"
            )
            plan.reboot_required = True
            plan.mig[key] = {"index": gpu.index, "profiles": [str(p) for p in entry.mig], "mode": "pending"}
        else:
            _problem(
                plan,
                f"{key} (GPU {n}): MIG mode is off",
                f"enable it with nvidia-smi -i {n} -mig 1 (needs a GPU reset or a reboot), "
                "or set allow_mig_mode_change",
                key,
            )
        return
    profiles: list[MigProfile] = []
    for ref in entry.mig:
        p = gpu.profile(ref)
        if p is None:
            known = ", ".join(sorted(gpu.profiles)) or "none"
            _problem(
                plan,
                f"{key} (GPU {n}): MIG profile {ref!r} is unknown (profiles: {known})",
                "name profiles as nvidia-smi mig -lgip does",
                key,
            )
            continue
        profiles.append(p)
    if len(profiles) != len(entry.mig):
        return
    counts: dict[str, int] = {}
    for p in profiles:
        counts[p.name] = counts.get(p.name, 0) + 1
    too_many = [(name, c) for name, c in sorted(counts.items()) if c > gpu.profiles[name].total]
    for name, count in too_many:
        _problem(
            plan,
            f"{key} (GPU {n}): {count} x {name} but the GPU holds at most {gpu.profiles[name].total}",
            "declare fewer",
            key,
        )
    if too_many:
        return
    # Keep instances that match the layout (with a compute instance); the rest goes.
    left = [p.name for p in profiles]
    keep, destroy = [], []
    for gi in sorted(gpu.instances, key=lambda g: g.gi_id):
        if gi.name in left and gi.compute_instances:
            left.remove(gi.name)
            keep.append(gi)
        else:
            destroy.append(gi)
    create = [gpu.profiles[name] for name in left]
    record: dict[str, Any] = {
        "index": gpu.index,
        "profiles": [p.name for p in profiles],
        "created": [],
        "destroyed": [],
    }
    plan.mig[key] = record
    if not create and not destroy:
        return
    if fit(create, [(g.start, g.size) for g in keep]) is None:
        if fit(profiles, []) is None:
            slices = sum(p.size or 0 for p in profiles)
            _problem(
                plan,
                f"{key} (GPU {n}): MIG layout {', '.join(p.name for p in profiles)} does not fit "
                f"({slices} slices asked; placements: "
                + "; ".join(f"{p.name} at {p.placements} x{p.size}" for p in gpu.profiles.values() if p.placements)
                + ")",
                "choose profiles whose placements do not overlap (nvidia-smi mig -lgipp)",
                key,
            )
            return
        destroy, keep, create = sorted(gpu.instances, key=lambda g: g.gi_id), [], list(profiles)
    users = list(gpu.processes)
    users += [f"vGPU on VF {vf}" for vf in dev.virtfns if (facts.vgpu_vfs.get(vf) and facts.vgpu_vfs[vf].current_type)]
    users += [f"mdev {m.uuid}" for m in facts.mdevs if m.parent == key]
    if destroy and _in_use(
        plan, f"destroying MIG GPU instances {', '.join(str(g.gi_id) for g in destroy)} on {key}", users, key
    ):
        return
    for gi in destroy:
        if gi.compute_instances:
            plan.actions.append(
                _cmd(
                    ["nvidia-smi", "mig", "-i", n, "-gi", str(gi.gi_id), "-dci"],
                    f"destroy the compute instances of GPU instance {gi.gi_id} ({gi.name})",
                )
            )
        plan.actions.append(
            _cmd(
                ["nvidia-smi", "mig", "-i", n, "-gi", str(gi.gi_id), "-dgi"],
                f"destroy GPU instance {gi.gi_id} ({gi.name})",
            )
        )
        record["destroyed"].append({"gi": gi.gi_id, "profile": gi.name})
    if create:
        # Largest first: nvidia-smi places each where it first fits.
        create.sort(key=lambda p: -(p.size or 0))
        ids = ",".join(str(p.profile_id) for p in create)
        plan.actions.append(
            _cmd(
                ["nvidia-smi", "mig", "-i", n, "-cgi", ids, "-C"],
                f"MIG instances {', '.join(p.name for p in create)} on GPU {n} ({key})",
            )
        )
        record["created"] = [p.name for p in create]


# ---------------------------------------------------------------- scheduler


def registry_value(scheduler: str, timeslice_ms: int | None) -> str:
    value = SCHEDULERS[scheduler]
    if timeslice_ms and scheduler != "best_effort":
        value |= timeslice_ms << 16
    return f"0x{value:02x}" if value < 0x100 else f"0x{value:08x}"


def scheduler_conf(scheduler: str, timeslice_ms: int | None) -> str:
    value = registry_value(scheduler, timeslice_ms)
    slice_text = f", time slice {timeslice_ms} ms" if timeslice_ms and scheduler != "best_effort" else ""
    return (
        _HEADER
        + f"# NVIDIA vGPU scheduler for time-sliced vGPUs: {scheduler}{slice_text} (RmPVMRL={value}).\n"
        + "# Read when the nvidia module loads: a module reload or a reboot applies a change.\n"
        + f'options nvidia NVreg_RegistryDwords="RmPVMRL={value}"\n'
    )


def running_registry_value(params: str | None) -> int | None:
    """RmPVMRL in the loaded nvidia module's RegistryDwords (/proc/driver/nvidia/params); None: not set."""
    for line in (params or "").splitlines():
        if line.strip().startswith("RegistryDwords"):
            m = _REGISTRY_RE.search(line)
            return int(m.group(1), 0) if m else None
    return None


def _plan_scheduler(request: VgpuRequest, inputs: HostInputs, plan: VgpuPlan) -> None:
    if request.scheduler is None:
        if request.scheduler_timeslice_ms is not None:
            _problem(
                plan, "scheduler_timeslice_ms is set but scheduler is not", "set scheduler: equal_share or fixed_share"
            )
        return
    if request.scheduler not in SCHEDULERS:
        _problem(plan, f"scheduler {request.scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        return
    ms = request.scheduler_timeslice_ms
    if ms is not None and (request.scheduler == "best_effort" or not 1 <= ms <= 30):
        _problem(
            plan,
            f"scheduler_timeslice_ms {ms} needs equal_share or fixed_share and 1 to 30 ms",
            "leave it out for the default time slice",
        )
        return
    value = registry_value(request.scheduler, ms)
    plan.scheduler = {"policy": request.scheduler, "RmPVMRL": value, "file": "/" + SCHEDULER_CONF}
    action = file_action(
        SCHEDULER_CONF,
        scheduler_conf(request.scheduler, ms),
        inputs.files.get(SCHEDULER_CONF),
        "vGPU scheduling policy",
    )
    if action:
        plan.actions.append(action)
    for path in inputs.registry_elsewhere:
        plan.warnings.append(
            f"{path} sets NVreg_RegistryDwords for nvidia too: one of the two settings is lost; "
            f"merge them into /{SCHEDULER_CONF} (dwords separated by ';')"
        )
    # The loaded module keeps the policy it was loaded with; not loaded: its next load reads the file.
    if inputs.nvidia_params is not None and (running_registry_value(inputs.nvidia_params) or 0) != int(value, 16):
        plan.reboot_required = True


# ---------------------------------------------------------------- persistence


def boot_unit() -> str:
    return f"""{_HEADER}# Re-applies the vGPU layout of /{STATE_FILE} at boot: SR-IOV VFs and their vGPU types,
# MIG instances (neither survives a reboot). mdevs are started by mdevctl's udev rule.
[Unit]
Description=gpuprov: re-create vGPU VF types and MIG instances
After=systemd-modules-load.service nvidia-persistenced.service nvidia-vgpud.service nvidia-vgpu-mgr.service
Wants=nvidia-vgpu-mgr.service
Before=libvirtd.service virtqemud.service
ConditionPathExists=/{STATE_FILE}

[Service]
Type=oneshot
RemainAfterExit=yes
Environment=PYTHONPATH=/{BOOT_LIB} PYTHONDONTWRITEBYTECODE=1
ExecStart=/usr/bin/python3 -m gpuprov.plan.vgpu --state /{STATE_FILE}

[Install]
WantedBy=multi-user.target
"""


def mdevctl_rule_fix(inputs: HostInputs) -> str | None:
    """The packaged mdevctl udev rule with the path mdevctl really has, when the packaged one names a
    path that does not exist (Debian 12's mdevctl 1.2.0 runs /usr/sbin/mdevctl and installs
    /usr/bin/mdevctl: its mdevs would never start at boot)."""
    if inputs.mdevctl_rule is None or inputs.mdevctl_path is None:
        return None
    _path, text = inputs.mdevctl_rule
    named = set(_RULE_PATH_RE.findall(text))
    real = "/" + inputs.mdevctl_path
    if not named or named == {real}:
        return None
    fixed = _RULE_PATH_RE.sub(f"{real} start-parent-mdevs", text)
    return (
        _HEADER
        + f"# mdevctl's rule ({_path}) runs {', '.join(sorted(named))}, which is not there; this copy\n"
        + f"# (same name: it overrides the packaged one) runs {real}, so mdevs start when their parent appears.\n"
        + fixed
    )


def _state_document(entries: list[Entry], request: VgpuRequest, names: dict[int, str]) -> dict[str, Any]:
    gpus: dict[str, Any] = {}
    for e in entries:
        if e.use == "mdev":
            gpus[e.key] = {"use": "mdev", "mdevs": [{"type": m.type_id, "uuid": m.uuid} for m in e.mdevs if m.type_id]}
        elif e.use == "sriov_vgpu":
            vgpus = []
            for v in e.vgpus:
                if v.type_id is not None and v.address is not None:
                    vgpus.append({"type": v.type_id, "vf": v.address})
                else:
                    vgpus.append({"type": v.type_ref, **({"vf": v.vf} if v.vf else {})})
            gpus[e.key] = {"use": "sriov_vgpu", "vgpus": vgpus}
        else:
            gpus[e.key] = {"use": "mig", "mig": [str(p) for p in e.mig]}
    return {
        "schema": STATE_SCHEMA,
        "comment": "Managed by gpuprov (vgpu_host role / gpu_vgpu module): the vGPU layout it made. "
        f"{BOOT_SERVICE} re-applies its VF types and MIG instances at boot. Edits are overwritten.",
        "gpus": gpus,
        "mixed_vgpu_types": request.mixed_vgpu_types,
        "vgpu_type_names": {str(k): v for k, v in sorted(names.items())},
    }


def _persistence(
    entries: list[Entry], request: VgpuRequest, inputs: HostInputs, managed: Managed, plan: VgpuPlan
) -> None:
    names = dict(managed.type_names)
    for e in entries:
        for v in e.vgpus:
            if v.type_id is not None and v.name:
                names[v.type_id] = v.name
    used = {v.type_id for e in entries for v in e.vgpus if v.type_id is not None}
    names = {k: v for k, v in names.items() if k in used}
    state = _state_document(entries, request, names)
    plan.state = state
    previous = inputs.files.get(STATE_FILE)
    content = json.dumps(state, indent=2, sort_keys=True) + "\n" if entries else None
    action = file_action(STATE_FILE, content, previous, "the vGPU layout gpuprov keeps (re-applied at boot)")
    if action:
        plan.actions.append(action)
    needs_boot = any(e.use in ("sriov_vgpu", "mig") for e in entries)
    had_unit = inputs.files.get(BOOT_UNIT) is not None
    if not needs_boot and had_unit and inputs.boot_enabled:
        plan.actions.append(_cmd(["systemctl", "disable", BOOT_SERVICE], "no VF types or MIG layout left to re-apply"))
    wanted_sources = inputs.boot_sources if needs_boot else {}
    for path, text in sorted(wanted_sources.items()):
        action = file_action(path, text, inputs.boot_files.get(path), "the planner the boot unit runs")
        if action:
            action.brief_diff = True
            plan.actions.append(action)
    for path, text in sorted(inputs.boot_files.items()):
        if path not in wanted_sources:
            plan.actions.append(
                Action(REMOVE_FILE, "not part of the boot planner", path=path, before=text, brief_diff=True)
            )
    unit_action = file_action(
        BOOT_UNIT, boot_unit() if needs_boot else None, inputs.files.get(BOOT_UNIT), "re-apply VF types and MIG at boot"
    )
    if unit_action:
        plan.actions.append(unit_action)
    if unit_action or (needs_boot and not inputs.boot_enabled):
        plan.actions.append(_cmd(["systemctl", "daemon-reload"], "systemd reads the units again"))
    if needs_boot and not inputs.boot_enabled:
        plan.actions.append(_cmd(["systemctl", "enable", BOOT_SERVICE], "run it at every boot"))
    if any(e.use == "mdev" for e in entries):
        rule = mdevctl_rule_fix(inputs)
        a = file_action(MDEVCTL_RULE, rule, inputs.files.get(MDEVCTL_RULE), "mdevctl starts the mdevs at boot")
        if a and rule is not None:
            plan.actions.append(a)
            plan.actions.append(_cmd(["udevadm", "control", "--reload"], "udev reads the rule"))
        if "mdevctl" not in inputs.tools:
            plan.warnings.append(
                "mdevctl is not installed: the mdevctl definitions take effect once it is (apt/dnf install mdevctl)"
            )


# ---------------------------------------------------------------- the plan


def plan_vgpu(facts: HostFacts, request: VgpuRequest, inputs: HostInputs, mig: MigFacts | None = None) -> VgpuPlan:
    """The actions that give each declared GPU its instances, or the refusals. Pure."""
    plan = VgpuPlan()
    entries = parse_gpus(request.gpus, plan)
    if request.boot:
        entries = [e for e in entries if e.use in ("sriov_vgpu", "mig")]
    _layout, managed = parse_state(inputs.files.get(STATE_FILE), plan)
    if plan.refused:
        return plan
    _plan_mdevs(facts, [e for e in entries if e.use == "mdev"], managed, inputs, request, plan)
    _plan_sriov(facts, [e for e in entries if e.use == "sriov_vgpu"], managed, inputs, request, plan)
    for entry in entries:
        if entry.use == "mig":
            _plan_mig_entry(facts, entry, mig or MigFacts(error="not read"), request, plan)
    if not request.boot:
        _plan_scheduler(request, inputs, plan)
        if request.persistent and not plan.refused:
            _persistence(entries, request, inputs, managed, plan)
    if plan.refused:
        plan.actions = []
    return plan


# ---------------------------------------------------------------- reading the host, two passes


def read_host(
    sysfs: Sysfs, request: VgpuRequest, run: Runner | None = None, *, with_boot_sources: bool = True
) -> tuple[HostFacts, HostInputs, MigFacts | None]:
    facts = gather(sysfs)
    inputs = read_inputs(sysfs, facts, with_boot_sources=with_boot_sources)
    wants_mig = isinstance(request.gpus, dict) and any(
        isinstance(v, dict) and v.get("use") == "mig" for v in request.gpus.values()
    )
    return facts, inputs, (read_mig(sysfs, run) if wants_mig else None)


def plan_host(sysfs: Sysfs, request: VgpuRequest, run: Runner | None = None) -> VgpuPlan:
    facts, inputs, mig = read_host(sysfs, request, run, with_boot_sources=request.persistent and not request.boot)
    return plan_vgpu(facts, request, inputs, mig)


def wait_for_vfs(sysfs: Sysfs, pfs: list[str], timeout: float = 30.0) -> None:
    """Wait until every VF of ``pfs`` shows its nvidia/current_vgpu_type (the driver adds it after the VF)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = True
        for pf in pfs:
            links = [n for n in sysfs.listdir(f"sys/bus/pci/devices/{pf}") if n.startswith("virtfn")]
            if not links or any(
                not sysfs.exists(f"sys/bus/pci/devices/{pf}/{link}/nvidia/current_vgpu_type") for link in links
            ):
                ready = False
        if ready:
            return
        time.sleep(0.5)


def enable_then_replan(
    root: str, request: VgpuRequest, plan: VgpuPlan, run: Runner | None = None
) -> tuple[VgpuPlan, Applied]:
    """Apply a plan that enables VFs, wait for them, and plan again: the VF types
    can only be checked once the VFs exist. Returns (the new plan, what the first did)."""
    first = apply(plan, root)
    wait_for_vfs(Sysfs(root), plan.second_pass)
    return plan_host(Sysfs(root), request, run), first


def converge(root: str, request: VgpuRequest, run: Runner | None = None) -> tuple[VgpuPlan, Applied, Applied | None]:
    """Plan and apply, in two passes where VFs get enabled (on the live root only).
    Returns (last plan, its applied steps, the first pass's applied steps or None)."""
    plan = plan_host(Sysfs(root), request, run)
    first = None
    if plan.second_pass and not plan.refused and Sysfs(root).live:
        plan, first = enable_then_replan(root, request, plan, run)
    return plan, apply(plan, root), first


# ---------------------------------------------------------------- boot entry point


def _say(line: str, *, err: bool = False) -> None:
    """One line of the boot CLI's output: it runs from gpuprov-vgpu.service, never inside a module."""
    (sys.stderr if err else sys.stdout).write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    """``python3 -m gpuprov.plan.vgpu``: what gpuprov-vgpu.service runs at boot."""
    parser = argparse.ArgumentParser(
        prog="python3 -m gpuprov.plan.vgpu",
        description="Re-apply the saved vGPU layout (SR-IOV VF types, MIG instances) to this host.",
    )
    parser.add_argument("--state", default="/" + STATE_FILE, help="the saved layout (default /%(default)s)")
    parser.add_argument("--root", default="/", help="the host's root (sysfs writes and commands only on /)")
    parser.add_argument("--check", action="store_true", help="print the plan, change nothing")
    args = parser.parse_args(argv)
    try:
        with open(args.state, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError) as exc:
        _say(f"gpuprov-vgpu: cannot read {args.state}: {exc}", err=True)
        return 1
    request = VgpuRequest(
        gpus=state.get("gpus") or {},
        mixed_vgpu_types=state.get("mixed_vgpu_types") is True,  # anything else: one type per GPU
        persistent=False,
        boot=True,
    )
    try:
        if args.check:
            plan = plan_host(Sysfs(args.root), request)
            if plan.refused:
                _say(f"gpuprov-vgpu: {plan.refusal_text()}", err=True)
                return 1
            for line in plan.describe():
                _say(f"would {line}")
            return 0
        plan, applied, first = converge(args.root, request)
    except Exception as exc:  # noqa: BLE001 - a boot unit reports, it does not trace back
        _say(f"gpuprov-vgpu: {exc}", err=True)
        return 1
    for warning in plan.warnings:
        _say(f"gpuprov-vgpu: warning: {warning}", err=True)
    for line in (first.done if first else []) + applied.done:
        _say(f"done: {line}")
    for line in applied.not_run:
        _say(f"not run (root is not /): {line}")
    if not applied.done and not first:
        _say("gpuprov-vgpu: the layout is in place")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
