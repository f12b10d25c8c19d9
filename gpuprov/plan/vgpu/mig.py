"""MIG layouts: fit the wanted profiles, create and destroy GPU instances with nvidia-smi."""

from __future__ import annotations

from typing import Any

from ...facts.host import HostFacts
from ...facts.mig import MigFacts, MigProfile
from ...inputs.vgpu_request import Entry, VgpuPlan, VgpuRequest, _problem
from .checks import _cmd, _in_use


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
