"""A host's model: what its declaration (or its old variables) resolves to on its facts
(:func:`gpuprov.model.resolve.resolve`, :func:`gpuprov.model.legacy.from_legacy`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.plan import Refusal
from ..core.vm_spec import HostSettings


@dataclass
class Instance:
    """A vGPU instance a VM can be given by name."""

    name: str
    gpu: str  # its entry's name
    parent: str  # the GPU's address (or a non-PCI mdev parent's name)
    type: str | int  # as declared
    uuid: str | None = None  # mdev: given or derived (the layout's scheme)
    type_id: str | int | None = None  # mdev: the type directory; sriov_vgpu: the numeric vGPU type
    vf: str | None = None  # sriov_vgpu: the VF it is set on


@dataclass
class DeclaredGpu:
    name: str
    use: str
    where: str  # how messages name it: gpuprov_host.gpus[1] 'train'
    addresses: list[str] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    mig: Any = None


@dataclass
class HostModel:
    gpus: list[DeclaredGpu] = field(default_factory=list)
    layout: dict[str, dict[str, Any]] = field(default_factory=dict)  # gpuprov_gpus form
    vfio_devices: list[str] = field(default_factory=list)
    vm_list: list[dict[str, Any]] = field(default_factory=list)  # gpu_vms_list form, defaults merged
    vm_path: str = "gpuprov_host.vms"
    settings: HostSettings = field(default_factory=HostSettings)
    declared: dict[str, dict[str, str]] = field(default_factory=dict)  # address -> {use, entry}
    problems: list[Refusal] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    legacy: bool = False

    @property
    def checked_uses(self) -> dict[str, dict[str, str]] | None:
        """What VMs' devices are checked against; None for an old-style VM list without gpuprov_gpus."""
        return None if self.legacy and not self.layout else self.declared

    def derived(self) -> dict[str, Any]:
        """What the roles take (the module gpu_host_model's ``gpuprov_model`` fact)."""
        return {
            "vfio_devices": self.vfio_devices,
            "gpus": self.layout,
            "vms": self.vm_list,
            "declared": self.declared,
            "settings": asdict(self.settings),
            "names": {g.name: g.addresses for g in self.gpus},
            "instances": {i.name: asdict(i) for g in self.gpus for i in g.instances},
            "legacy": self.legacy,
            "warnings": self.warnings,
        }
