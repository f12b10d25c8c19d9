"""The old variables (and mig-parted / vgpu-device-manager files) written in the new form.

:func:`convert` turns a host_vars file with ``gpuprov_gpus``, ``gpu_vms_list``,
``gpu_vms_defaults``, ``gpu_vms_reserved_*``/``gpu_vms_mixed_vgpu_types`` and
``vfio_host_devices`` into one ``gpuprov_host`` that resolves (:func:`gpuprov.model.resolve.resolve`)
to the same VMs, vfio list and vGPU layout, with the declaration's ``version``; other variables
are kept as they are. Each GPU gets a name from its address (``gpu-41-00-0``); each VM names what
it had by address: a whole GPU by its entry, an mdev or VF by its instance (added to its GPU's
entry when the layout lacked it). What cannot be carried over faithfully is refused
(:class:`ConvertError`), never guessed: the new form meets the declaration's schema.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.plan import Plan
from ..facts.host import HostFacts
from ..facts.pci import PciAddressError, normalize_address
from ..inputs.boundary import validate_host_vars
from ..inputs.declaration import VERSION, check
from ..inputs.validate import shown
from ..inputs.vgpu_request import parse_gpus
from . import formats
from .legacy import OLD_VARIABLES

SETTINGS = {
    "gpu_vms_reserved_memory_mib": "reserved_memory_mib",
    "gpu_vms_reserved_cpus": "reserved_cpus",
    "gpu_vms_mixed_vgpu_types": "mixed_vgpu_types",
}
CONVERTED = (*OLD_VARIABLES, "gpu_vms_defaults", *SETTINGS)


class ConvertError(ValueError):
    """The input cannot be written in the new form as it is; the message says why and what to do."""


def _name(key: str) -> str:
    """An entry's name from its key: gpu-41-00-0 for 0000:41:00.0, the parent's name otherwise."""
    text = re.sub(r"[^a-z0-9]+", "-", key.lower().removeprefix("0000:")).strip("-")
    return ("gpu-" + text)[:32] if ":" in key or not text[:1].isalpha() else text[:32]


def _address(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ConvertError(f'{where}: {shown(raw)} is not a PCI address: write it quoted, e.g. "0000:41:00.0"')
    if ":" not in raw:
        return raw
    try:
        return normalize_address(raw)
    except PciAddressError as exc:
        raise ConvertError(f"{where}: {exc}: give the full address as `lspci -D` prints it") from None


class _Gpus:
    """The new form's GPU entries, keyed by address, built as the old variables are read."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.taken: set[tuple[str, int]] = set()  # instances a VM already names

    def add(self, address: str, use: str) -> dict[str, Any]:
        if address not in self.entries:
            self.entries[address] = {"name": _name(address), "address": address, "use": use}
        return self.entries[address]

    def instance(self, address: str, use: str, item: dict[str, Any]) -> str:
        """The reference to the instance ``item`` on ``address`` (added when the entry lacks it)."""
        entry = self.add(address, use)
        if entry["use"] != use:
            return entry["name"]  # the VM asks for a kind the entry does not give: plan refuses it, naming it
        instances = entry.setdefault("instances", [])
        free = [i for i in range(len(instances)) if (address, i) not in self.taken]
        match = next((i for i in free if _same(instances[i], item)), None)
        if match is None:
            instances.append(item)
            match = len(instances) - 1
        self.taken.add((address, match))
        return f"{entry['name']}.{match}"


def _same(declared: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """One instance: the same UUID or VF; without either, the same type and no UUID of its own."""
    for key in ("uuid", "vf"):
        if wanted.get(key) is not None:
            return declared.get(key) == wanted[key]
    return declared.get("uuid") is None and str(declared.get("type")) == str(wanted.get("type"))


def convert(doc: Any, facts: HostFacts, *, use: str = "mdev") -> tuple[dict[str, Any], list[str]]:
    """``doc`` in the new form, and notes for the reader."""
    if formats.is_mig_parted(doc) or formats.is_vgpu_device_manager(doc):
        if formats.is_mig_parted(doc):
            layouts, problems = formats.layouts_from_mig_parted(doc)
        else:
            layouts, problems = formats.layouts_from_vgpu_device_manager(doc, use=use)
        if problems:
            raise ConvertError("; ".join(p.describe() for p in problems))
        return {"gpuprov_layouts": layouts}, ["a host picks one with gpuprov_host.layout: NAME"]
    if not isinstance(doc, dict) or not any(k in doc for k in OLD_VARIABLES):
        raise ConvertError(
            "no old variables here (gpuprov_gpus, gpu_vms_list, vfio_host_devices), nor mig-configs / vgpu-configs"
        )
    _check(doc)
    notes: list[str] = []
    gpus = _Gpus()
    _layout(doc.get("gpuprov_gpus"), gpus)
    given = doc.get("vfio_host_devices")
    if isinstance(given, str):
        notes.append("vfio_host_devices was a template: the passthrough GPUs now come from gpuprov_host.gpus")
    elif isinstance(given, list):
        for i, raw in enumerate(given):
            gpus.add(_address(raw, f"vfio_host_devices[{i}]"), "passthrough")
    vms = [_vm(vm, i, gpus, facts) for i, vm in enumerate(_list(doc.get("gpu_vms_list"), "gpu_vms_list"))]
    host: dict[str, Any] = {"version": VERSION, "gpus": list(gpus.entries.values())}
    if vms:
        host["vms"] = vms
    if doc.get("gpu_vms_defaults"):
        host["vm_defaults"] = doc["gpu_vms_defaults"]
    for old, new in SETTINGS.items():
        if old in doc:
            host[new] = doc[old]
    problems = check({"gpuprov_host": host}, "(the new form)").items
    if problems:
        # The old rules took it, the declaration's schema does not (its free text is printable
        # ASCII, its defaults are VM keys but gpus): said, never written half-right.
        lines = [r.message + (f" (fix: {r.fix})" if r.fix else "") for r in problems]
        head = f"{len(lines)} value(s) the new form does not take; nothing was converted:"
        raise ConvertError("\n  ".join([head, *lines]))
    out = {k: v for k, v in doc.items() if k not in CONVERTED}
    return {"gpuprov_host": host, **out}, notes


def _check(doc: dict[Any, Any]) -> None:
    """The old variables meet the rules ``gpuprov plan`` and the roles hold them to (the legacy
    reader's): what they refuse is refused here, every problem named by its path with its fix,
    before anything is converted."""
    rest = {k: v for k, v in doc.items() if k != "gpuprov_gpus"}
    _host_vars, problems = validate_host_vars({**rest, "gpu_vms_list": doc.get("gpu_vms_list") or []})
    lines = [r.message + (f" (fix: {r.fix})" if r.fix else "") for r in problems]
    if doc.get("gpuprov_gpus") is not None:
        scratch = Plan()
        parse_gpus(doc["gpuprov_gpus"], scratch)  # the layout's own rules (vgpu_host's), each named by its key
        for r in scratch.refusals:
            where = r.message if r.message.startswith("gpuprov_gpus") else f"gpuprov_gpus.{r.message}"
            lines.append(where + (f" (fix: {r.fix})" if r.fix else ""))
    if lines:
        head = f"{len(lines)} problem(s) in the old variables; nothing was converted:"
        raise ConvertError("\n  ".join([head, *lines]))


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConvertError(f"{where} is not a list")
    return value


def _layout(layout: Any, gpus: _Gpus) -> None:
    if layout is None:
        return
    if not isinstance(layout, dict):
        raise ConvertError("gpuprov_gpus is not a mapping keyed by PCI address")
    for raw, value in layout.items():
        where = f"gpuprov_gpus[{raw!r}]"
        if not isinstance(value, dict) or not isinstance(value.get("use"), str):
            raise ConvertError(f"{where} has no use")
        entry = gpus.add(_address(raw, where), value["use"])
        if value["use"] == "mdev":
            entry["instances"] = _instances(value.get("mdevs"), f"{where}.mdevs", ("type", "uuid"))
        elif value["use"] == "sriov_vgpu":
            entry["instances"] = _instances(value.get("vgpus"), f"{where}.vgpus", ("type", "vf"))
        elif value["use"] == "mig" and value.get("mig") is not None:
            entry["mig"] = value["mig"]


def _instances(value: Any, where: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """A layout's mdevs or vgpus: each a mapping of ``keys`` with a type (never a bare value)."""
    out = []
    for j, item in enumerate(_list(value, where)):
        if not isinstance(item, dict) or "type" not in item or any(k not in keys for k in item):
            raise ConvertError(
                f"{where}[{j}]: {shown(item)} is not an instance: write a mapping of {', '.join(keys)}, "
                'e.g. {type: "nvidia-474"}'
            )
        out.append(dict(item))
    return out


def _vm(vm: Any, i: int, gpus: _Gpus, facts: HostFacts) -> dict[str, Any]:
    where = f"gpu_vms_list[{i}]"
    if not isinstance(vm, dict):
        raise ConvertError(f"{where} is not a mapping")
    out = {k: v for k, v in vm.items() if k not in ("gpus", "mdevs", "vfs")}
    refs: list[Any] = []
    for j, gpu in enumerate(_list(vm.get("gpus"), f"{where}.gpus")):
        raw, rom = (gpu.get("address"), gpu.get("rom")) if isinstance(gpu, dict) else (gpu, None)
        address = _address(raw, f"{where}.gpus[{j}]")
        name = gpus.add(address, "passthrough")["name"]  # a host GPU stays host: plan refuses the VM, naming it
        refs.append(name if rom is None else {"name": name, "rom": rom})
    for j, m in enumerate(_list(vm.get("mdevs"), f"{where}.mdevs")):
        if not isinstance(m, dict) or "parent" not in m or "type" not in m:
            raise ConvertError(f"{where}.mdevs[{j}] needs parent and type")
        item = {"type": m["type"]} | ({"uuid": m["uuid"]} if m.get("uuid") else {})
        refs.append(gpus.instance(_address(m["parent"], f"{where}.mdevs[{j}].parent"), "mdev", item))
    for j, v in enumerate(_list(vm.get("vfs"), f"{where}.vfs")):
        raw, vtype = (v.get("address"), v.get("vgpu_type")) if isinstance(v, dict) else (v, None)
        vf = _address(raw, f"{where}.vfs[{j}]")
        dev = facts.pci.get(vf)
        if dev is None or dev.physfn is None:
            raise ConvertError(
                f"{where}.vfs[{j}]: {vf} is not an SR-IOV VF on this host: give --root the host (or its capture)"
            )
        if vtype is None:
            raise ConvertError(f"{where}.vfs[{j}]: give its vgpu_type, so that the instance has a type")
        refs.append(gpus.instance(dev.physfn, "sriov_vgpu", {"type": vtype, "vf": vf}))
    if refs or "gpus" in vm:
        out["gpus"] = refs
    return out
