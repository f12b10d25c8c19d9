"""The ``gpuprov plan`` report as plain data (schema ``gpuprov.plan/v1``)."""

from __future__ import annotations

from typing import Any

from .. import __version__

SCHEMA = "gpuprov.plan/v1"


def plan_report(plan: Any, root: str) -> dict[str, Any]:
    """The plan as plain data (``--json``)."""
    vms = []
    for vm in plan.vms:
        placement = plan.placements.get(vm.name)
        vms.append(
            {
                "name": vm.name,
                "state": vm.state or "running",
                "memory_mib": vm.memory_mib,
                "vcpus": vm.vcpus,
                "firmware": vm.firmware,
                "accel": vm.accel,
                "gpus": [g.address for g in vm.gpus],
                "vfs": [{"address": v.address, "vgpu_type": v.vgpu_type} for v in vm.vfs],
                "mdevs": [{"parent": m.parent, "type": m.type, "uuid": m.uuid} for m in vm.mdevs],
                "network": vm.network,
                "mac": vm.guest_mac if vm.network else None,
                "placement": placement.as_dict() if placement else None,
            }
        )
    return {
        "schema": SCHEMA,
        "gpuprov_version": __version__,
        "root": root,
        "ok": not plan.refused,
        "vms": vms,
        "refusals": [{"message": r.message, "fix": r.fix, "device": r.device} for r in plan.refusals],
        "warnings": list(plan.warnings),
        "resources": plan.resources,
    }
