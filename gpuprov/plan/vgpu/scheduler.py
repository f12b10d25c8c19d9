"""The NVIDIA vGPU scheduler (RmPVMRL) in modprobe.d."""

from __future__ import annotations

import re

from ...core.plan import (
    file_action,
)
from ...facts.vgpu_inputs import SCHEDULER_CONF, HostInputs
from ...inputs.vgpu_request import _HEADER, SCHEDULERS, VgpuPlan, VgpuRequest, _problem

_REGISTRY_RE = re.compile(r"RmPVMRL\s*=\s*(0x[0-9a-fA-F]+|\d+)")


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
