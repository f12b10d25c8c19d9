"""Drift: where a host, as read now, differs from its declaration (docs/guides/fleet.md). Pure: the
facts (:class:`~gpuprov.facts.host.HostFacts`, :class:`~gpuprov.facts.fleet.FleetFacts`) and the
declaration resolved on them (:class:`Declared`, plain data from the host model) in, findings out,
each naming what differs, the declared entry (or the configuration file) it differs from, and the
fix. Nothing is cached: the caller reads the host each time.

What is compared:

- the id guard: a declared GPU whose address is gone (moved to another slot, or the bus was
  renumbered: where the GPU the entry expects now is, when it can be told), or whose ids no longer
  match the entry's ``expect``;
- driver binding: ``use: passthrough`` bound to vfio-pci; every other use to a host driver (the
  NVIDIA driver for an NVIDIA GPU's vGPU uses), never vfio-pci, never none;
- the vGPU layout: each declared mdev there with its type (and no other mdev on a declared
  parent), each SR-IOV vGPU instance's VF with its type, each MIG GPU in MIG mode with the
  declared GPU instances;
- VM state: each declared VM defined, running or absent as declared, and a running VM holding the
  devices it is declared with;
- kernel arguments: each argument GRUB's defaults (or ``/etc/kernel/cmdline``) configure is on
  the running kernel's command line, with its value; an IOMMU or vfio argument the kernel booted
  with is still configured;
- CDI: a ``nvidia.com/gpu`` spec lists a device for each GPU the NVIDIA driver has (by index), no
  index beyond them, and was generated for the driver that is loaded.

What cannot be compared (a file not readable, MIG state not known) is listed in ``unknown``,
never guessed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..core.plan import Refusal
from ..facts.fleet import FleetFacts
from ..facts.host import HostFacts
from ..facts.iommu import kernel_param, kernel_split, parse_cmdline
from ..rules.assess import VFIO_DRIVERS
from .host.grubvar import read_grub_variable

NVIDIA = 0x10DE
GRUB_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
# Arguments gpuprov's stages set (the IOMMU, vfio's ids): one the kernel booted with and the
# configuration no longer has is drift too (it goes at the next boot).
MANAGED_ARGUMENTS = ("intel_iommu", "amd_iommu", "iommu", "vfio-pci.ids", "vfio_pci.ids")
DEFAULT_VM_STATE = "running"  # role gpu_vms' gpu_vms_state
# How resolve names an entry at the start of its refusals: gpuprov_host.gpus[1] 'train'.
_ENTRY = re.compile(r"^(gpuprov_(?:host|layouts)\.[A-Za-z0-9_.+-]*gpus\[\d+\] '[^']*')")
VFIO_FIX = "run the vfio stage (role gpuprov.kvm.vfio_host, or the hosts playbook)"
HOST_DRIVER_FIX = "run the vfio stage (it gives the GPU back to the host driver), or load the host driver and reboot"


@dataclass
class Declared:
    """The declaration resolved on the facts, as plain data (the host model's ``derived()`` and its
    refusals); ``entries``: each GPU entry as written, by how messages name it (for ``expect``)."""

    declared: dict[str, dict[str, str]] = field(default_factory=dict)  # address -> {use, entry}
    layout: dict[str, dict[str, Any]] = field(default_factory=dict)
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    vms: list[dict[str, Any]] = field(default_factory=list)
    vm_path: str = "gpuprov_host.vms"
    refusals: list[Refusal] = field(default_factory=list)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class Drift:
    findings: list[dict[str, Any]] = field(default_factory=list)
    unknown: list[dict[str, str]] = field(default_factory=list)  # {"what", "why"}
    refusals: list[Refusal] = field(default_factory=list)  # the model's refusals that are not drift

    def add(self, code: str, entry: str | None, device: str | None, message: str, fix: str | None) -> None:
        self.findings.append({"code": code, "entry": entry, "device": device, "message": message, "fix": fix})


def entry_of(message: str) -> str | None:
    """The declared entry a resolve message names first, or None."""
    m = _ENTRY.match(message)
    return m.group(1) if m else None


def _ids(facts: HostFacts, address: str, full: bool) -> str:
    d = facts.pci[address]
    ids = [d.vendor_id, d.device_id] + ([d.subsystem_vendor_id, d.subsystem_device_id] if full else [])
    return ":".join("????" if i is None else f"{i:04x}" for i in ids)


def _undeclared_gpus(facts: HostFacts, declared: dict[str, Any]) -> list[str]:
    return sorted(a for a, d in facts.pci.items() if d.base_class == 0x03 and d.physfn is None and a not in declared)


# ---------------------------------------------------------------- the id guard


def _id_guard(facts: HostFacts, model: Declared, drift: Drift) -> None:
    for r in model.refusals:
        entry = entry_of(r.message)
        raw = model.entries.get(entry or "", {})
        expect = raw.get("expect")
        if r.device and r.device not in facts.pci and ":" in r.device:
            moved = ""
            if expect:
                full = expect.count(":") == 3
                now = sorted(a for a in facts.pci if _ids(facts, a, full) == expect and a not in model.declared)
                if now:
                    moved = (
                        f"; the GPU it expects ({expect}) is now at {', '.join(now)}: moved to another slot, "
                        "or the bus was renumbered"
                    )
            if not moved:
                others = _undeclared_gpus(facts, model.declared)
                if others:
                    moved = "; undeclared GPU(s) here: " + ", ".join(f"{a} ({_ids(facts, a, False)})" for a in others)
            drift.add(
                "gpu-missing",
                entry,
                r.device,
                f"declared at {r.device}, but there is no device there{moved}",
                "find the GPU (`gpuprov inspect --all`), then fix the entry's address (and expect)",
            )
        elif r.device and r.device in facts.pci and "expect says" in r.message:
            drift.add(
                "gpu-changed",
                entry,
                r.device,
                f"{r.device} is {_ids(facts, r.device, (expect or '').count(':') == 3)}, but the entry expects "
                f"{expect}: the hardware changed or the bus was renumbered",
                "check the host (`gpuprov inspect --all`), then fix the entry's address or expect",
            )
        else:
            drift.refusals.append(r)


# ---------------------------------------------------------------- driver binding


def _drivers(facts: HostFacts, model: Declared, drift: Drift) -> None:
    for address, d in sorted(model.declared.items()):
        dev = facts.pci.get(address)
        if dev is None:
            continue
        use, entry, driver = d["use"], d["entry"], dev.driver
        bound = f"bound to {driver}" if driver else "bound to no driver"
        if use == "passthrough":
            if driver not in VFIO_DRIVERS:
                drift.add(
                    "driver", entry, address, f"declared use: passthrough, {bound}: it should be vfio-pci", VFIO_FIX
                )
            continue
        if driver in VFIO_DRIVERS:
            drift.add(
                "driver", entry, address, f"declared use: {use}, {bound}: the host cannot use it", HOST_DRIVER_FIX
            )
        elif driver is None:
            want = "the NVIDIA driver" if dev.vendor_id == NVIDIA else "its host driver"
            drift.add("driver", entry, address, f"declared use: {use}, {bound}: it should be {want}", HOST_DRIVER_FIX)
        elif use != "host" and dev.vendor_id == NVIDIA and driver != "nvidia":
            drift.add(
                "driver",
                entry,
                address,
                f"declared use: {use}, {bound}: vGPUs need the NVIDIA host driver",
                "install and load the NVIDIA vGPU host driver (docs/guides/vgpu-manager.md)",
            )


# ---------------------------------------------------------------- the vGPU layout


def _mdevs(facts: HostFacts, model: Declared, drift: Drift) -> None:
    present = {m.uuid.lower(): m for m in facts.mdevs}
    wanted: set[str] = set()
    parents: dict[str, str] = {}
    for inst in model.instances.values():
        parent = inst["parent"]
        entry = model.declared.get(parent, {}).get("entry")
        if model.layout.get(parent, {}).get("use") != "mdev":
            continue
        parents[parent] = entry or ""
        uuid = (inst.get("uuid") or "").lower()
        if not uuid:
            continue  # the layout's own refusal says why it has no UUID
        wanted.add(uuid)
        found = present.get(uuid)
        want_type = inst.get("type_id") or inst.get("type")
        if found is None:
            drift.add(
                "mdev-missing",
                entry,
                parent,
                f"mdev {inst['name']!r} ({uuid}, type {want_type}) is not on {parent}",
                "run the vgpu stage (role gpuprov.kvm.vgpu_host); its boot unit makes it again at each boot",
            )
        elif found.parent != parent or (found.type_id and want_type and found.type_id != str(want_type)):
            drift.add(
                "mdev-changed",
                entry,
                parent,
                f"mdev {inst['name']!r} ({uuid}) is type {found.type_id} on {found.parent}; declared: type "
                f"{want_type} on {parent}",
                "stop what uses it, then run the vgpu stage",
            )
    for m in facts.mdevs:
        if m.parent in parents and m.uuid.lower() not in wanted:
            drift.add(
                "mdev-extra",
                parents[m.parent] or None,
                m.parent,
                f"mdev {m.uuid} (type {m.type_id}) on {m.parent} is not in the declaration",
                "declare it, or remove it (the vgpu stage with prune: true)",
            )


def _sriov(facts: HostFacts, model: Declared, drift: Drift) -> None:
    for inst in model.instances.values():
        parent = inst["parent"]
        if model.layout.get(parent, {}).get("use") != "sriov_vgpu":
            continue
        entry = model.declared.get(parent, {}).get("entry")
        vf, type_id = inst.get("vf"), inst.get("type_id")
        if vf is None or vf not in facts.pci:
            where = f"VF {vf} is not there" if vf else f"{parent} has no VF for it (SR-IOV VFs not enabled)"
            drift.add(
                "vgpu-vf-missing",
                entry,
                parent,
                f"vGPU {inst['name']!r} (type {inst['type']}): {where}",
                "run the vgpu stage",
            )
            continue
        state = facts.vgpu_vfs.get(vf)
        current = state.current_type if state else None
        if type_id is not None and current != type_id:
            now = "none" if not current else str(current)
            drift.add(
                "vgpu-type",
                entry,
                vf,
                f"vGPU {inst['name']!r}: VF {vf} has vGPU type {now}; declared: {inst['type']} ({type_id})",
                "stop the VM that holds it, then run the vgpu stage",
            )


def _mig_wanted(spec: Any) -> list[str | int]:
    if isinstance(spec, dict):
        return [p for p, n in spec.items() for _k in range(int(n) if isinstance(n, int) else 0)]
    return list(spec) if isinstance(spec, list) else []


def _mig(model: Declared, fleet: FleetFacts, drift: Drift) -> None:
    mig_gpus = {a: e for a, e in model.layout.items() if e.get("use") == "mig"}
    if not mig_gpus:
        return
    if fleet.mig is None or fleet.mig.error:
        why = fleet.mig.error if fleet.mig is not None else "not read"
        drift.unknown.append({"what": "MIG layout", "why": why or "not read"})
        return
    for address, layout in sorted(mig_gpus.items()):
        entry = model.declared.get(address, {}).get("entry")
        gpu = fleet.mig.gpus.get(address)
        if gpu is None:
            drift.unknown.append({"what": f"MIG layout of {address}", "why": "nvidia-smi does not list this GPU"})
            continue
        if gpu.mode_current != "enabled":
            drift.add(
                "mig-mode",
                entry,
                address,
                f"declared use: mig, MIG mode is {gpu.mode_current or 'not supported'}",
                "run the vgpu stage with allow_mig_mode_change (it resets the GPU)",
            )
            continue
        want = Counter()
        for ref in _mig_wanted(layout.get("mig")):
            profile = gpu.profile(ref)
            want[profile.name if profile else str(ref)] += 1
        have = Counter(gi.name for gi in gpu.instances)
        if want != have:

            def said(c: Counter[str]) -> str:
                return ", ".join(f"{n} x{k}" for n, k in sorted(c.items())) or "none"

            drift.add(
                "mig-layout",
                entry,
                address,
                f"MIG GPU instances: {said(have)}; declared: {said(want)}",
                "stop the GPU's jobs, then run the vgpu stage",
            )


# ---------------------------------------------------------------- VMs


def _vms(model: Declared, fleet: FleetFacts, drift: Drift) -> None:
    if not model.vms:
        return
    defined, running = fleet.domains.defined, fleet.domains.running
    if defined is None or running is None:
        drift.unknown.append(
            {
                "what": "VM state",
                "why": "libvirt's domain folders (/etc/libvirt/qemu, /run/libvirt/qemu) are not readable",
            }
        )
        return
    for i, vm in enumerate(model.vms):
        name = vm.get("name")
        entry = f"{model.vm_path}[{i}] {name!r}"
        want = vm.get("state") or DEFAULT_VM_STATE
        is_running = name in running
        is_defined = is_running or name in defined
        now = "running" if is_running else "defined, not running" if is_defined else "not defined"
        wrong = (
            (want == "running" and not is_running)
            or (want == "shutdown" and (is_running or not is_defined))
            or (want == "defined" and not is_defined)
            or (want == "absent" and is_defined)
        )
        if wrong:
            drift.add(
                "vm-state",
                entry,
                None,
                f"VM {name!r} is {now}; declared state: {want}",
                "run the vms stage (role gpuprov.kvm.gpu_vms)",
            )
            continue
        if not is_running:
            continue
        held = set(running[name])
        devices = [g["address"] if isinstance(g, dict) else g for g in vm.get("gpus") or []]
        devices += [m["uuid"].lower() for m in vm.get("mdevs") or [] if m.get("uuid")]
        devices += [v["address"] for v in vm.get("vfs") or [] if v.get("address")]
        missing = [d for d in devices if d not in held]
        if missing:
            drift.add(
                "vm-devices",
                entry,
                missing[0],
                f"running VM {name!r} does not hold {', '.join(missing)} it is declared with (it holds: "
                f"{', '.join(sorted(held)) or 'no device'})",
                "shut the VM down and run the vms stage: its definition is remade with the declared devices",
            )


# ---------------------------------------------------------------- kernel arguments


def configured_arguments(fleet: FleetFacts) -> tuple[str | None, list[str], str | None]:
    """(where they are configured, the arguments, why they cannot be told)."""
    boot = fleet.boot
    if boot.grub_default is not None:
        found: dict[str, list[str]] = {}
        sources = [("/etc/default/grub", boot.grub_default)] + [
            (f"/etc/default/grub.d/{n}", t) for n, t in sorted(boot.dropins.items())
        ]
        for path, text in sources:
            for variable in GRUB_VARIABLES:
                if variable not in text:
                    continue
                try:
                    value = read_grub_variable(text, variable)
                except ValueError as exc:
                    return None, [], f"{path}: {exc}"
                if value.line is not None:
                    found[variable] = value.args
        where = "/etc/default/grub " + " + ".join(GRUB_VARIABLES)
        return where, [a for v in GRUB_VARIABLES for a in found.get(v, [])], None
    if boot.kernel_cmdline is not None:
        return "/etc/kernel/cmdline", kernel_split(boot.kernel_cmdline), None
    return None, [], "no /etc/default/grub or /etc/kernel/cmdline under the root"


def _shown_arg(name: str, value: str | None) -> str:
    return name if value is None else f"{name}={value}"


def _needs_kernel_args(model: Declared) -> bool:
    """Whether a declared use rests on the kernel's arguments (the IOMMU, vfio): any use but the host's own."""
    return bool(model.vms) or any(e.get("use") != "host" for e in model.declared.values())


def _kernel_args(model: Declared, fleet: FleetFacts, drift: Drift) -> None:
    where, configured, why = configured_arguments(fleet)
    if where is None:
        if _needs_kernel_args(model):  # unknown only where the verdict rests on it: never "converged" then
            drift.unknown.append({"what": "kernel arguments", "why": why or "not configured"})
        return
    booted = parse_cmdline(fleet.boot.booted)
    wanted = dict(kernel_param(a) for a in configured)
    owed = []
    for arg in configured:
        name, value = kernel_param(arg)
        if name not in booted or booted[name] != value:
            owed.append(arg)
    if owed:
        drift.add(
            "kernel-args",
            where,
            None,
            f"configured {' '.join(owed)}, but the running kernel booted without "
            f"{'it' if len(owed) == 1 else 'them'}: a reboot is owed",
            "reboot the host (the iommu stage's boot trial does it once, safely)",
        )
    gone = [n for n in MANAGED_ARGUMENTS if n in booted and n not in wanted]
    if gone:
        drift.add(
            "kernel-args",
            where,
            None,
            f"the running kernel booted with {', '.join(_shown_arg(n, booted[n]) for n in gone)}, "
            "which is no longer configured: the next boot goes without",
            "run the iommu stage, or put the arguments back",
        )


# ---------------------------------------------------------------- CDI


def _cdi(facts: HostFacts, fleet: FleetFacts, drift: Drift) -> None:
    specs = [s for s in fleet.cdi if s.kind == "nvidia.com/gpu" and not s.error]
    for s in fleet.cdi:
        if s.error:
            drift.add("cdi-spec", s.path, None, f"{s.path}: {s.error}", "regenerate it: nvidia-ctk cdi generate")
    if not specs:
        return
    gpus = sorted(
        a for a, d in facts.pci.items() if d.vendor_id == NVIDIA and d.base_class == 0x03 and d.driver == "nvidia"
    )
    names = {n for s in specs for n in s.devices}
    paths = ", ".join(s.path for s in specs)
    indexes = {n for n in names if n.isdigit()}
    missing = [f"{i} ({a})" for i, a in enumerate(gpus) if str(i) not in indexes]
    if missing:
        drift.add(
            "cdi-missing-gpu",
            paths,
            None,
            f"{paths} lists no device for GPU {', '.join(missing)} the NVIDIA driver has",
            "regenerate it: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
        )
    extra = sorted((n for n in indexes if int(n) >= len(gpus)), key=int)
    if extra:
        drift.add(
            "cdi-extra-device",
            paths,
            None,
            f"{paths} lists device(s) {', '.join(extra)}, but the NVIDIA driver has {len(gpus)} GPU(s): "
            "a GPU went away",
            "regenerate it: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
        )
    stale = sorted({v for s in specs for v in s.driver_versions if fleet.driver_version and v != fleet.driver_version})
    if stale:
        drift.add(
            "cdi-driver",
            paths,
            None,
            f"{paths} was generated for driver {', '.join(stale)}, but {fleet.driver_version} is loaded",
            "regenerate it after every driver change: nvidia-ctk cdi generate",
        )


def drift(facts: HostFacts, fleet: FleetFacts, model: Declared) -> Drift:
    """Every way the host differs from its declaration, each naming the entry it differs from."""
    out = Drift()
    _id_guard(facts, model, out)
    _drivers(facts, model, out)
    _mdevs(facts, model, out)
    _sriov(facts, model, out)
    _mig(model, fleet, out)
    _vms(model, fleet, out)
    _kernel_args(model, fleet, out)
    _cdi(facts, fleet, out)
    return out
