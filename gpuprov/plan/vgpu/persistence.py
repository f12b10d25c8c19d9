"""What survives a reboot: the saved layout, the boot unit, mdevctl's udev rule.

The boot unit runs installed code, the zipapp ``/usr/lib/gpuprov/gpuprov-vgpu.pyz`` the role
vgpu_host copies from the assembled collection (docs/collection.md), as mig-parted's service runs
its installed binary; this planner writes only the unit and the saved layout, and removes the
package copy earlier versions wrote under ``/usr/lib/gpuprov/gpuprov``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...core.plan import (
    REMOVE_FILE,
    Action,
    file_action,
)
from ...facts.vgpu_inputs import BOOT_PYZ, BOOT_SERVICE, BOOT_UNIT, MDEVCTL_RULE, STATE_FILE, HostInputs
from ...inputs.vgpu_request import _HEADER, Entry, VgpuPlan, VgpuRequest
from .checks import _cmd
from .state import STATE_SCHEMA, Managed

_RULE_PATH_RE = re.compile(r"(/\S*/mdevctl) start-parent-mdevs")


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
Environment=PYTHONDONTWRITEBYTECODE=1
ExecStart=/usr/bin/python3 /{BOOT_PYZ} --state /{STATE_FILE}

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
    if needs_boot and request.runner_sha256:
        plan.runner = "current" if inputs.boot_runner_sha256 == request.runner_sha256 else "install"
    elif needs_boot and not inputs.boot_runner:
        # The role installs it right after this plan is applied (a refused plan must write nothing,
        # so the runner never goes first); said loudly for a module run on its own.
        plan.warnings.append(
            f"/{BOOT_PYZ} is not installed: {BOOT_SERVICE}, which re-applies the VF types and MIG layout "
            "at boot, runs it; the role gpuprov.kvm.vgpu_host installs it from its files/ (or copy the "
            f"assembled collection's roles/vgpu_host/files/{BOOT_PYZ.rsplit('/', 1)[1]} there)"
        )
    for path, text in sorted(inputs.old_boot_files.items()):
        plan.actions.append(
            Action(
                REMOVE_FILE,
                f"an earlier planner copy: {BOOT_SERVICE} runs /{BOOT_PYZ}",
                path=path,
                before=text,
                brief_diff=True,
            )
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
        if "mdevctl" not in inputs.tools and not request.install_mdevctl:
            plan.warnings.append(
                "mdevctl is not installed: the mdevctl definitions take effect once it is (apt/dnf install mdevctl)"
            )
