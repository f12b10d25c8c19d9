"""The host settings (``gpuprov_host``'s reserved CPUs and memory, mixed vGPU types; the old
``gpu_vms_reserved_*``) against the input rules of :mod:`gpuprov.inputs.validate`.

Apart from the VM list's own checks (:mod:`gpuprov.inputs.vm_list`, which imports it from here) so
that a host that declares no VMs (a fleet report's read of a passthrough host) loads neither
them nor :mod:`uuid`. Standard library only.
"""

from __future__ import annotations

from ..core.vm_spec import HostSettings
from .validate import MAX_MEMORY_MIB, Problems, boolean, cpu_list, integer, kind


def check_settings(settings: HostSettings, problems: Problems, names: dict[str, str] | None = None) -> list[int]:
    """``settings`` against the input rules, problems named by ``names`` (field -> how the
    input calls it: gpu_vms_reserved_cpus in a host_vars file); returns the CPUs kept for the host."""
    names = names or {}
    if settings.reserved_memory_mib is not None:
        path = names.get("reserved_memory_mib", "reserved_memory_mib")
        integer(problems, path, settings.reserved_memory_mib, 0, MAX_MEMORY_MIB, " MiB")
    path = names.get("reserved_cpus", "reserved_cpus")
    reserved: list[int] | None = None
    if isinstance(settings.reserved_cpus, (str, int)) and not isinstance(settings.reserved_cpus, bool):
        # A cpulist string, or one CPU number: what role gpu_vms passes on as its string option.
        reserved = cpu_list(problems, path, str(settings.reserved_cpus))
    else:
        problems.add(
            path, f"must be a cpulist, not {kind(settings.reserved_cpus)}", "write it as a quoted cpulist: '0-1,8'"
        )
    if not isinstance(settings.mixed_vgpu_types, bool):
        boolean(problems, names.get("mixed_vgpu_types", "mixed_vgpu_types"), settings.mixed_vgpu_types)
    return reserved or []
