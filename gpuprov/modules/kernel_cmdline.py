"""kernel_cmdline's options and its read-and-plan step: the options through the input boundary
(:func:`gpuprov.inputs.kernel_args.cmdline_options`), the host's boot facts, the bootloader chosen,
and the plan (:mod:`gpuprov.plan.host.cmdline`).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

from typing import Any

from ..facts.boot import gather
from ..facts.sysfs import Sysfs
from ..plan.host.cmdline import CmdlinePlan, build_request, choose_bootloader, plan_kernel_cmdline

ARGUMENT_SPEC: dict[str, Any] = {
    "arguments": {"type": "list", "elements": "str", "default": []},
    "remove": {"type": "list", "elements": "str", "default": []},
    "bootloader": {"type": "str", "choices": ["auto", "grub", "grubby"], "default": "auto"},
    "variable": {"type": "str", "default": "GRUB_CMDLINE_LINUX_DEFAULT"},
    "update": {"type": "bool", "default": True},
    "root": {"type": "path", "default": "/"},
}


def plan(p: dict[str, Any]) -> tuple[CmdlinePlan, dict[str, Any]]:
    """The plan for the module's params ``p``, and what the module returns besides it; refused, with
    nothing read, when the options are."""
    request, refusals = build_request(p["arguments"], p["remove"], p["variable"])
    if refusals:
        return CmdlinePlan(refusals=refusals), {}
    facts = gather(Sysfs(p["root"]), p["bootloader"])
    bootloader = choose_bootloader(p["bootloader"], facts)
    cmdline = plan_kernel_cmdline(facts, request, bootloader, p["update"])
    extra = {
        "reboot_required": cmdline.reboot_required,
        "args_before": cmdline.args_before,
        "args_after": cmdline.args_after,
        "bootloader": bootloader,
    }
    return cmdline, extra
