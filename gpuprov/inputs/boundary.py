"""The validation boundary: one function per kind of input, every reader goes through it.

- :func:`validate_host_vars`: a host_vars file (or a bare VM list), as ``gpuprov plan`` reads it;
- :func:`validate_gpu_vm_options`: the module gpu_vm's options;
- :func:`validate_gpu_vgpu_options`: the module gpu_vgpu's options.

Each returns the typed input and every problem at once (each naming its field
path and the fix); with any problem the caller changes nothing (``gpuprov
plan`` exits 2, a module fails with ``refusals``). The field rules are those of
:mod:`gpuprov.inputs.validate`, applied by the parsers that build the typed values
(:func:`gpuprov.inputs.vm_list.parse_vm`, :func:`gpuprov.plan.vgpu.parse_gpus`), so a host_vars
file and a module's options get the same verdict. A module's top-level options
arrive after Ansible's own type coercion (``type: bool`` turns ``"false"`` into
false); what sits inside its mappings (``vm``, ``host_vms``, ``defaults``,
``gpus``) arrives as written and meets the strict rules, as in a host_vars file.
Rules and limits: docs/reference/inputs.md.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..core.plan import Plan, Refusal
from ..core.vm_spec import STATES, VM_KEYS, ConsoleCheck, HostSettings
from .host_settings import check_settings
from .validate import (
    MAX_GPUS,
    MAX_SECONDS,
    MAX_VMS,
    Problems,
    boolean,
    choice,
    integer,
    mapping,
    path_text,
    sequence,
    shown,
    text,
)
from .vgpu_request import SCHEDULERS, USES, parse_gpus
from .vm_list import merge_defaults, parse_vm

SHA256_RE = re.compile(r"[0-9a-f]{64}")  # whole text (fullmatch): no trailing newline

# Role gpu_vms' variables (roles/gpu_vms/defaults/main.yml; a test keeps the two in step):
# another gpu_vms_* key in a host_vars file is a typo that would silently do nothing.
GPU_VMS_VARIABLES = (
    "gpu_vms_list",
    "gpu_vms_install",
    "gpu_vms_packages",
    "gpu_vms_defaults",
    "gpu_vms_state",
    "gpu_vms_uri",
    "gpu_vms_storage_dir",
    "gpu_vms_remove_storage",
    "gpu_vms_reserved_memory_mib",
    "gpu_vms_reserved_cpus",
    "gpu_vms_mixed_vgpu_types",
    "gpu_vms_root",
    "gpu_vms_wait",
    "gpu_vms_wait_timeout",
    "gpu_vms_ssh_port",
    "gpu_vms_shutdown_timeout",
    "gpu_vms_guest_group",
    "gpu_vms_guest_ssh_args",
    "gpu_vms_guest_ssh_private_key_file",
    "gpu_vms_console_checks",
    "gpu_vms_check_consoles",
)
# How a host_vars file names the host settings.
HOST_VARS_SETTINGS = {
    "reserved_memory_mib": "gpu_vms_reserved_memory_mib",
    "reserved_cpus": "gpu_vms_reserved_cpus",
    "mixed_vgpu_types": "gpu_vms_mixed_vgpu_types",
}
MAX_TIMESLICE_MS = 30  # RmPVMRL time slices: 1 to 30 ms


@dataclass
class HostVars:
    """A validated host_vars file: the VM list (defaults merged), the host settings, the vGPU layout."""

    vm_list: list[dict[str, Any]] = field(default_factory=list)
    settings: HostSettings = field(default_factory=HostSettings)
    gpus: dict[str, Any] | None = None  # gpuprov_gpus, when the file has it


@dataclass
class GpuVmInput:
    """gpu_vm's validated options: the VM (defaults merged) and the host's whole list, this VM in it."""

    name: str
    state: str
    vm: dict[str, Any]
    vm_list: list[dict[str, Any]]
    settings: HostSettings
    declared: dict[str, dict[str, str]] | None = None  # the host model's address -> {use, entry}
    console_checks: list[ConsoleCheck] = field(default_factory=list)


def _vm_list(
    p: Problems, vms: Any, defaults: dict[str, Any], path: str, defaults_path: str, cpu_limit: int | None
) -> list[dict[str, Any]]:
    """Each entry merged over ``defaults`` and checked, named ``path[i]`` (its defaults' keys by ``defaults_path``)."""
    merged = []
    for i, entry in enumerate(sequence(p, path, vms, MAX_VMS) or []):
        vm = merge_defaults(defaults, entry)
        _spec, found = parse_vm(vm, i, path=f"{path}[{i}]", own=entry, defaults_path=defaults_path, cpu_limit=cpu_limit)
        p.items.extend(found)
        merged.append(vm)
    return merged


def vm_list_problems(
    vms: list[Any], defaults: Any, path: str, defaults_path: str, cpu_limit: int | None
) -> tuple[list[dict[str, Any]], list[Refusal]]:
    """A VM list (``defaults`` merged under each entry) and every problem of it (the host model's VMs)."""
    p = Problems()
    merged = _vm_list(p, vms, _defaults(p, defaults, defaults_path), path, defaults_path, cpu_limit)
    return merged, p.items


def _defaults(p: Problems, value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    return mapping(p, path, value, tuple(k for k in VM_KEYS if k != "name")) or {}


def validate_host_vars(doc: Any, *, cpu_limit: int | None = None) -> tuple[HostVars | None, list[Refusal]]:
    """A host_vars file (a mapping with ``gpu_vms_list``...) or a bare VM list -> its typed
    content, or every problem. ``cpu_limit``: the host's CPU count, when known."""
    p = Problems()
    out = HostVars()
    if isinstance(doc, list):
        out.vm_list = _vm_list(p, doc, {}, "gpu_vms_list", "gpu_vms_defaults", cpu_limit)
        return (None, p.items) if p else (out, [])
    if not isinstance(doc, dict) or "gpu_vms_list" not in doc:
        from .declaration import TOP_KEYS
        from .schema_eval import did_you_mean

        typo = (
            next((hint for k in doc if (hint := did_you_mean(k, list(TOP_KEYS)))), "") if isinstance(doc, dict) else ""
        )
        p.add(
            "(the file)",
            "has no gpuprov_host (nor a list of VMs, or gpu_vms_list: the old form)"
            + (f"; {typo.removeprefix(': ')}" if typo else ""),
            "give the host's host_vars file with gpuprov_host (gpuprov init prints a start), or a YAML list of VMs",
        )
        return None, p.items
    unknown = sorted(k for k in doc if isinstance(k, str) and k.startswith("gpu_vms_") and k not in GPU_VMS_VARIABLES)
    for key in unknown:
        p.add(key, "is not a variable of role gpu_vms", f"known: {', '.join(GPU_VMS_VARIABLES)}")
    defaults = _defaults(p, doc.get("gpu_vms_defaults"), "gpu_vms_defaults")
    vms = [] if doc["gpu_vms_list"] is None else doc["gpu_vms_list"]
    out.vm_list = _vm_list(p, vms, defaults, "gpu_vms_list", "gpu_vms_defaults", cpu_limit)
    out.settings = HostSettings(
        reserved_memory_mib=doc.get("gpu_vms_reserved_memory_mib"),
        reserved_cpus="" if doc.get("gpu_vms_reserved_cpus", "0") is None else doc.get("gpu_vms_reserved_cpus", "0"),
        mixed_vgpu_types=doc.get("gpu_vms_mixed_vgpu_types", False),
    )
    check_settings(out.settings, p, HOST_VARS_SETTINGS)
    if doc.get("gpuprov_gpus") is not None:
        scratch = Plan()
        parse_gpus(doc["gpuprov_gpus"], scratch)
        p.items.extend(scratch.refusals)
        out.gpus = doc["gpuprov_gpus"]
    return (None, p.items) if p else (out, [])


def _common_options(p: Problems, params: dict[str, Any]) -> None:
    if "root" in params:
        path_text(p, "root", params["root"])


def validate_gpu_vm_options(
    params: dict[str, Any], *, cpu_limit: int | None = None
) -> tuple[GpuVmInput | None, list[Refusal]]:
    """gpu_vm's ``module.params`` -> the VM, the host list it is checked in, and the settings."""
    p = Problems()
    _common_options(p, params)
    defaults = _defaults(p, params.get("defaults"), "defaults")
    vm = mapping(p, "vm", params.get("vm"), VM_KEYS)
    state = choice(p, "state", params.get("state", "running"), STATES)
    if vm is not None and vm.get("state") is not None:
        state = vm["state"]  # the entry's own wins; parse_vm checks it
    text(p, "uri", params.get("uri", ""), rule="a libvirt URI, e.g. qemu:///system")
    path_text(p, "storage_dir", params.get("storage_dir", "/"))
    boolean(p, "remove_storage", params.get("remove_storage", False))
    for key in ("wait_for_address", "shutdown_timeout"):
        integer(p, key, params.get(key, 0), 0, MAX_SECONDS, " seconds")
    settings = HostSettings(
        reserved_memory_mib=params.get("reserved_memory_mib"),
        reserved_cpus="" if params.get("reserved_cpus") is None else params["reserved_cpus"],
        mixed_vgpu_types=params.get("mixed_vgpu_types", False),
    )
    check_settings(settings, p, {})
    declared = _declared(p, params.get("declared"))
    console_checks = _console_checks(p, params.get("console_checks") or [])
    if vm is None:
        return None, p.items
    merged = merge_defaults(defaults, vm)
    merged = {**merged, "state": state} if state is not None else merged
    spec, found = parse_vm(merged, path="vm", own=vm, defaults_path="defaults", cpu_limit=cpu_limit)
    p.items.extend(found)
    host_vms = _vm_list(p, params.get("host_vms") or [], defaults, "host_vms", "defaults", cpu_limit)
    if p or spec is None or spec.state is None:
        return None, p.items
    # The VM takes its own place in the host's list (CPU pinning goes in list order), or the end.
    vm_list = [merged if entry.get("name") == spec.name else entry for entry in host_vms]
    if not any(entry.get("name") == spec.name for entry in host_vms):
        vm_list.append(merged)
    listed = {entry.get("name") for entry in vm_list}
    for i, (name, _check) in enumerate(console_checks):
        if name is not None and name not in listed:
            p.add(f"console_checks[{i}].vm", f"{shown(name)} is not a VM of host_vms", "name a listed VM in `vm`")
    if p:
        return None, p.items
    return (
        GpuVmInput(
            name=spec.name,
            state=spec.state,
            vm=merged,
            vm_list=vm_list,
            settings=settings,
            declared=declared,
            console_checks=[check for name, check in console_checks if name in (None, spec.name)],
        ),
        [],
    )


CONSOLE_CHECK_KEYS = ("vm", "wait_for", "timeout", "expect")
MAX_CONSOLE_CHECKS = 16
MAX_CONSOLE_PATTERNS = 64
MAX_PATTERN = 1024


def _pattern(p: Problems, path: str, value: Any, flags: int = 0) -> re.Pattern[str] | None:
    raw = text(p, path, value, max_len=MAX_PATTERN, rule="a Python regular expression")
    if raw is None:
        return None
    try:
        return re.compile(raw, flags)
    except re.error as exc:
        p.add(path, f"{shown(raw)} is not a regular expression ({exc})", "give a Python regular expression")
        return None


def _console_checks(p: Problems, value: Any) -> list[tuple[str | None, ConsoleCheck]]:
    """gpu_vm's ``console_checks``: [{vm, wait_for, timeout, expect}] -> (the VM named or None, the
    check). Role gpu_vms passes gpu_vms_console_checks whole: each VM's run keeps its own."""
    out: list[tuple[str | None, ConsoleCheck]] = []
    for i, entry in enumerate(sequence(p, "console_checks", value, MAX_CONSOLE_CHECKS) or []):
        where = f"console_checks[{i}]"
        if mapping(p, where, entry, CONSOLE_CHECK_KEYS) is None:
            continue
        name = entry.get("vm")
        if name is not None and text(p, f"{where}.vm", name, rule="the name of a VM of host_vms") is None:
            continue
        # As Ansible's wait_for and search, which the role used before: wait_for multiline, expect not.
        wait_for = _pattern(p, f"{where}.wait_for", entry.get("wait_for"), re.M)
        timeout = integer(p, f"{where}.timeout", entry.get("timeout", 600), 1, MAX_SECONDS, " seconds")
        patterns = sequence(p, f"{where}.expect", entry.get("expect", []), MAX_CONSOLE_PATTERNS) or []
        expect = [_pattern(p, f"{where}.expect[{j}]", item) for j, item in enumerate(patterns)]
        if wait_for is not None and timeout is not None and None not in expect:
            out.append((name, ConsoleCheck(wait_for, timeout, tuple(e for e in expect if e is not None))))
    return out


def _declared(p: Problems, value: Any) -> dict[str, dict[str, str]] | None:
    """gpu_vm's ``declared``: address -> {use, entry}, as gpu_host_model returns it."""
    if value is None:
        return None
    if isinstance(value, dict) and len(value) > MAX_GPUS * 2:
        p.add("declared", f"has {len(value)} entries, more than {MAX_GPUS * 2}", "pass gpu_host_model's declared")
        return None
    out: dict[str, dict[str, str]] = {}
    for key, entry in (mapping(p, "declared", value) or {}).items():
        where = f"declared[{shown(key)}]"
        if mapping(p, where, entry, ("use", "entry")) is None:
            continue
        use = choice(p, f"{where}.use", entry.get("use"), USES)
        label = text(p, f"{where}.entry", entry.get("entry", str(key)), rule="the entry's name")
        if isinstance(key, str) and use is not None and label is not None:
            out[key] = {"use": use, "entry": label}
    return out


def validate_gpu_vgpu_options(params: dict[str, Any]) -> list[Refusal]:
    """gpu_vgpu's ``module.params``: every problem (none: the options are good)."""
    p = Problems()
    _common_options(p, params)
    if params.get("scheduler") is not None:
        choice(p, "scheduler", params["scheduler"], tuple(SCHEDULERS))
    if params.get("scheduler_timeslice_ms") is not None:
        integer(p, "scheduler_timeslice_ms", params["scheduler_timeslice_ms"], 1, MAX_TIMESLICE_MS, " ms")
    for key in ("mixed_vgpu_types", "persistent", "prune", "allow_mig_mode_change", "install_mdevctl"):
        if key in params:
            boolean(p, key, params[key])
    runner = params.get("runner_sha256")
    if runner is not None and not (isinstance(runner, str) and SHA256_RE.fullmatch(runner)):
        fix = "leave it to the role vgpu_host"
        p.add("runner_sha256", f"{shown(runner)} is not a sha256 (64 lowercase hex digits)", fix)
    if params.get("gpus") is not None and mapping(p, "gpus", params["gpus"]) is not None:
        scratch = Plan()
        parse_gpus(params["gpus"], scratch)
        p.items.extend(scratch.refusals)
    return p.items
