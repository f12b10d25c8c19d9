"""Converge the vGPU layout: apply a plan, wait for enabled VFs, plan again; the boot unit's entry point.

The VF types of an SR-IOV GPU can only be checked once its VFs exist, so a plan that enables
VFs is applied, the VFs awaited, and the host planned again (gpuprov.plan.vgpu). :func:`main` is
what ``gpuprov-vgpu.service`` runs at boot, from the zipapp ``/usr/lib/gpuprov/gpuprov-vgpu.pyz``
(dev/tools/build_collection.py builds it; docs/collection.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..apply.actions import Applied, apply
from ..core.plan import Plan
from ..facts.host import HostFacts, gather
from ..facts.mig import MigFacts, Runner, read_mig
from ..facts.packages import read_packages
from ..facts.sysfs import Sysfs
from ..facts.vgpu_inputs import STATE_FILE, HostInputs, read_inputs, read_runner_sha256
from ..inputs.vgpu_request import VgpuPlan, VgpuRequest
from ..plan.vgpu.plan import MDEVCTL_PACKAGE, plan_vgpu


def read_host(
    sysfs: Sysfs, request: VgpuRequest, run: Runner | None = None, facts: HostFacts | None = None
) -> tuple[HostFacts, HostInputs, MigFacts | None]:
    """What :func:`plan_vgpu` needs, read below the root: the host's facts, its vGPU inputs, and MIG's
    state when a GPU asks for MIG."""
    facts = facts if facts is not None else gather(sysfs)
    inputs = read_inputs(sysfs, facts)
    gpus = request.gpus if isinstance(request.gpus, dict) else {}
    uses = {v.get("use") for v in gpus.values() if isinstance(v, dict)}
    if request.runner_sha256 and not request.boot:
        inputs.boot_runner_sha256 = read_runner_sha256(sysfs)
    if request.install_mdevctl and "mdev" in uses and "mdevctl" not in inputs.tools:
        inputs.packages = read_packages(sysfs, [MDEVCTL_PACKAGE])
    return facts, inputs, (read_mig(sysfs, run) if "mig" in uses else None)


def plan_host(
    sysfs: Sysfs, request: VgpuRequest, run: Runner | None = None, facts: HostFacts | None = None
) -> VgpuPlan:
    """Read the host (:func:`read_host`), then plan. ``facts``: the host's, when the caller has read
    them (to resolve a declaration) already."""
    facts, inputs, mig = read_host(sysfs, request, run, facts)
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


def first_pass(
    root: str, request: VgpuRequest, plan: VgpuPlan, run: Runner | None = None, *, check: bool = False
) -> tuple[VgpuPlan, Applied | None]:
    """On the live root (and no check): where ``plan`` installs a tool (mdevctl), install it and plan
    again (its udev rule is then checked too); where it enables VFs, enable them and plan again.
    Returns (the plan to apply, the first pass's applied steps or None). Raises ApplyError."""
    if plan.refused or check or not Sysfs(root).live:
        return plan, None
    first = None
    if plan.install is not None:
        first = apply(Plan(actions=[plan.install]), root)
        plan = plan_host(Sysfs(root), request, run)
    if plan.second_pass and not plan.refused:
        plan, enabled = enable_then_replan(root, request, plan, run)
        if first is not None:
            enabled.done[:0] = first.done
        first = enabled
    return plan, first


def converge(root: str, request: VgpuRequest, run: Runner | None = None) -> tuple[VgpuPlan, Applied, Applied | None]:
    """Plan and apply, in two passes where VFs get enabled (on the live root only).
    Returns (last plan, its applied steps, the first pass's applied steps or None)."""
    plan, first = first_pass(root, request, plan_host(Sysfs(root), request, run), run)
    return plan, apply(plan, root), first


# ---------------------------------------------------------------- boot entry point


def _say(line: str, *, err: bool = False) -> None:
    """One line of the boot CLI's output: it runs from gpuprov-vgpu.service, never inside a module."""
    (sys.stderr if err else sys.stdout).write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    """``python3 /usr/lib/gpuprov/gpuprov-vgpu.pyz``: what gpuprov-vgpu.service runs at boot."""
    parser = argparse.ArgumentParser(
        prog="gpuprov-vgpu.pyz",
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
