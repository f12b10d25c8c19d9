"""The old variables, read into the host model: ``gpuprov_gpus`` (the vGPU layout keyed by address),
``gpu_vms_list`` (+ ``gpu_vms_defaults`` and the ``gpu_vms_*`` host settings) and
``vfio_host_devices``. Deprecated (docs/reference/host-model.md, "The old variables"): they
still work, with a warning, and ``gpuprov convert`` writes the new form. Their rules are the
same as the new form's: a VM gets a whole GPU only when it is declared ``use: passthrough``
(:func:`gpuprov.plan.vm.fit.check_declared_uses`), and a VM's mdev without a UUID takes the
layout's UUID (one scheme) when the layout declares it. Standard library only.
"""

from __future__ import annotations

from typing import Any

from ..facts.host import HostFacts
from ..facts.pci import PciAddressError, normalize_address
from ..inputs.boundary import validate_host_vars
from ..plan.vgpu.mdev import mdev_uuids
from .host_model import HostModel

OLD_VARIABLES = ("gpuprov_gpus", "gpu_vms_list", "vfio_host_devices")
DEPRECATED = (
    "{names}: deprecated; declare the host once in gpuprov_host (docs/reference/host-model.md); "
    "`gpuprov convert FILE` writes the new form"
)


def _key(raw: Any) -> str:
    try:
        return normalize_address(raw) if isinstance(raw, str) and ":" in raw else str(raw)
    except PciAddressError:
        return str(raw)


def from_legacy(doc: Any, facts: HostFacts | None, *, cpu_limit: int | None = None) -> HostModel:
    model = HostModel(legacy=True, vm_path="gpu_vms_list")
    if isinstance(doc, dict) and "gpu_vms_list" not in doc and any(k in doc for k in OLD_VARIABLES):
        doc = {**doc, "gpu_vms_list": []}  # a layout or vfio list alone
    used = [k for k in OLD_VARIABLES if isinstance(doc, dict) and doc.get(k)]
    if isinstance(doc, list):
        used = ["a bare VM list"]
    if used:
        model.warnings.append(DEPRECATED.format(names=", ".join(used)))
    if facts is not None and isinstance(doc, dict) and isinstance(doc.get("gpuprov_gpus"), dict):
        doc = {**doc, "gpu_vms_list": _vm_mdev_uuids(facts, doc["gpuprov_gpus"], doc.get("gpu_vms_list"))}
    host_vars, problems = validate_host_vars(doc, cpu_limit=cpu_limit)
    model.problems.extend(problems)
    if host_vars is None:
        return model
    model.vm_list, model.settings = host_vars.vm_list, host_vars.settings
    layout = host_vars.gpus or {}
    model.layout = {_key(k): v for k, v in layout.items()}
    for raw, entry in layout.items():
        model.declared[_key(raw)] = {"use": entry["use"], "entry": f"gpuprov_gpus[{raw!r}]"}
    given = doc.get("vfio_host_devices") if isinstance(doc, dict) else None
    if isinstance(given, list) and all(isinstance(a, str) for a in given):
        model.vfio_devices = [_key(a) for a in given]
    else:
        model.vfio_devices = [a for a, e in model.declared.items() if e["use"] == "passthrough"]
    return model


def _vm_mdev_uuids(facts: HostFacts, layout: dict[Any, Any], vms: Any) -> Any:
    """VMs' mdevs without a UUID take the layout's (same parent and type, in order) so both
    name one instance; the rest keep theirs. Entries that are not well formed are left to the
    input rules."""
    if not isinstance(vms, list):
        return vms
    uuids, _problems = mdev_uuids(facts, layout)
    given = {str(m.get("uuid")) for vm in vms if isinstance(vm, dict) for m in _mdevs(vm) if m.get("uuid")}
    free: dict[tuple[str, str], list[str]] = {}
    for parent, found in uuids.items():
        for item in found:
            if item is not None and item[0] not in given:
                free.setdefault((parent, item[1]), []).append(item[0])
    out = []
    for vm in vms:
        if isinstance(vm, dict) and _mdevs(vm):
            mdevs = []
            for m in vm["mdevs"]:
                key = (_key(m.get("parent")), str(m.get("type"))) if isinstance(m, dict) else None
                if key is not None and m.get("uuid") is None and free.get(key):
                    m = {**m, "uuid": free[key].pop(0)}
                mdevs.append(m)
            vm = {**vm, "mdevs": mdevs}
        out.append(vm)
    return out


def _mdevs(vm: dict[str, Any]) -> list[Any]:
    mdevs = vm.get("mdevs")
    return [m for m in mdevs if isinstance(m, dict)] if isinstance(mdevs, list) else []
