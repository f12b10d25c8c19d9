"""iommu_boot's options and its read-and-plan step, one copy for the module and for gpu_host_plan
(which plans every host-side concern from one module run, docs/concepts/plan-gate.md).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..facts.bootloader import gather_boot_inputs
from ..facts.sysfs import Sysfs
from ..plan.host.boot_trial import BootPlan, BootRequest, checked_request, plan_boot
from ..plan.host.drain import Disruption, boot_disruption
from .vfio_bind import quiet

ARGUMENT_SPEC: dict[str, Any] = {
    "passthrough": {"type": "bool", "default": True},
    "extra_args": {"type": "list", "elements": "str", "default": []},
    "vfio_modules": {"type": "list", "elements": "str", "default": ["vfio", "vfio_iommu_type1", "vfio_pci"]},
    "variable": {"type": "str", "default": "GRUB_CMDLINE_LINUX_DEFAULT"},
    "trial": {"type": "bool", "default": True},
    "reboot_allowed": {"type": "bool", "default": False},
    "panic_seconds": {"type": "int", "default": 10},
    "watchdog_seconds": {"type": "int", "default": 600},
    "watchdog_module": {"type": "str"},
    "retry_failed": {"type": "bool", "default": False},
    "expect_vfio": {"type": "list", "elements": "str", "default": []},
    "trial_check": {"type": "list", "elements": "str", "default": []},
    "root": {"type": "path", "default": "/"},
}
RULES: dict[str, Any] = {}


def plan(p: dict[str, Any]) -> tuple[BootPlan, dict[str, Any]]:
    """The boot plan for the module's params ``p``, and what the module returns besides it."""
    request = BootRequest(
        passthrough=p["passthrough"],
        extra_args=p["extra_args"],
        vfio_modules=p["vfio_modules"],
        variable=p["variable"],
        trial=p["trial"],
        reboot_allowed=p["reboot_allowed"],
        panic_seconds=p["panic_seconds"],
        watchdog_seconds=p["watchdog_seconds"],
        watchdog_module=p["watchdog_module"],
        retry_failed=p["retry_failed"],
        expect_vfio=p["expect_vfio"],
    )
    # Through the input boundary first: the trial boot's checks read the addresses normalised
    # (0000:41:00.0); the planner refuses what the boundary does.
    request = checked_request(request)[0]
    inputs = gather_boot_inputs(Sysfs(p["root"]), request.expect_vfio, p["trial_check"])
    boot = plan_boot(inputs, request)
    extra = {
        "stage": boot.stage,
        "reboot": boot.reboot,
        "reboot_required": boot.reboot_required,
        "trial_id": boot.trial_id,
        "trial_args": boot.trial_args,
        "added": boot.added,
        "args_before": boot.args_before,
        "args_after": boot.args_after,
        "bootloader": f"{inputs.boot.loader} ({inputs.boot.evidence})",
    }
    return boot, extra


def pending(p: dict[str, Any]) -> tuple[str | None, Disruption]:
    """Why the module must run for ``p`` (None: it would change, reboot and say nothing), and what its
    change takes from running VMs (a reboot the play carries out: docs/guides/rolling.md)."""
    boot = plan(p)[0]
    disruption = boot_disruption(boot, p["reboot_allowed"] and Sysfs(p["root"]).live)
    said = quiet(boot, p["root"])
    if said is None and (boot.stage != "converged" or boot.reboot != "none" or boot.reboot_required or boot.failure):
        owed = " (one is owed)" if boot.reboot_required else ""
        return f"the boot is {boot.stage}, reboot {boot.reboot}{owed}", disruption
    return said, disruption
