"""A GPU's verdict for the use its host declares (docs/reference/host-model.md, "inspect").

:func:`gpuprov.rules.assess.assess_gpu` judges a GPU for passthrough. With a declaration
(:class:`gpuprov.model.host_model.HostModel`) each declared GPU is judged for its own use instead:

- ``passthrough``: the passthrough verdict, except that a GPU a running libvirt domain holds is
  in use by that VM: a state, not a blocker;
- ``host``: kept by the host: ready unless vfio-pci holds it; no advice to bind it to vfio-pci;
- ``mdev``, ``sriov_vgpu``, ``mig``: vGPU-ready: the host driver (never vfio-pci), and the types
  (mdev), the VFs (SR-IOV) it needs; the passthrough rules (its group, the host's devices in it)
  do not apply, since the GPU stays with the host driver.

Unknown stays unknown: evidence that could not be read keeps its blocker. Pure.
"""

from __future__ import annotations

from ..facts.host import HostFacts
from .assess import BLOCKER, INFO, VFIO_DRIVERS, Finding, GpuAssessment

VGPU_USES = ("mdev", "sriov_vgpu", "mig")
UNDECLARED = "not declared"


def _unknown(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.code.startswith("unknown")]


def _vfio_bound(a: GpuAssessment, use: str) -> Finding:
    return Finding(
        "declared-use-mismatch",
        BLOCKER,
        f"declared use: {use}, but bound to {a.driver}: the host driver cannot use it",
        "the declaration keeps it out of the vfio list: run the vfio stage (it unbinds it), then reboot",
    )


def _vgpu_findings(facts: HostFacts, a: GpuAssessment, use: str) -> list[Finding]:
    dev = facts.pci[a.address]
    if a.driver in VFIO_DRIVERS:
        return [_vfio_bound(a, use)]
    if a.driver != "nvidia" and not (use == "mdev" and a.address in facts.mdev_parents):
        return [
            Finding(
                "vgpu-driver",
                BLOCKER,
                f"declared use: {use}, but bound to {a.driver or 'no driver'}",
                "install and load the NVIDIA vGPU host driver (vGPU manager) for it",
            )
        ]
    if use == "mdev":
        parent = facts.mdev_parents.get(a.address)
        if parent is None or not parent.types:
            return [
                Finding(
                    "vgpu-no-types",
                    BLOCKER,
                    "offers no mdev types (no mdev_supported_types)",
                    "load the NVIDIA vGPU host driver; Ampere and later give vGPUs through SR-IOV: use: sriov_vgpu",
                )
            ]
        names = ", ".join(f"{t.type_id} ({t.name})" for t in list(parent.types.values())[:6])
        return [Finding("vgpu-ready", INFO, f"vGPU-ready: mdev types {names}")]
    if use == "sriov_vgpu":
        if not dev.sriov_totalvfs:
            return [
                Finding(
                    "vgpu-no-sriov",
                    BLOCKER,
                    "shows no SR-IOV VFs (sriov_totalvfs 0 or absent)",
                    "enable SR-IOV in the firmware; pre-Ampere GPUs give vGPUs as mdevs: use: mdev",
                )
            ]
        enabled = f"{dev.sriov_numvfs or 0} of {dev.sriov_totalvfs} VFs enabled"
        return [Finding("vgpu-ready", INFO, f"vGPU-ready: host driver nvidia, {enabled} (the vgpu stage enables them)")]
    return [Finding("vgpu-ready", INFO, "host driver nvidia; MIG mode and profiles are the vgpu stage's (nvidia-smi)")]


def judge(facts: HostFacts, a: GpuAssessment, use: str | None, entry: str | None, running: dict[str, str]) -> None:
    """Judge ``a`` for its declared ``use`` (None: the host's declaration does not name it), in place."""
    a.intended_use = use or UNDECLARED
    a.declared_as = entry
    _held_by_vm(a, running)
    if use is None:
        a.findings = [*_unknown(a.findings), Finding("undeclared", INFO, "not in the host's declaration: left alone")]
    elif use == "host":
        kept = [_vfio_bound(a, use)] if a.driver in VFIO_DRIVERS else []
        a.findings = kept or [Finding("kept-by-host", INFO, f"kept by the host (driver {a.driver or 'none'})")]
    elif use in VGPU_USES:
        a.findings = [*_unknown(a.findings), *_vgpu_findings(facts, a, use)]
    else:
        in_use_by_vm(a, running)


def in_use_by_vm(a: GpuAssessment, running: dict[str, str]) -> None:
    """A GPU a running libvirt domain holds is passed through already: "in use by VM X", a state,
    not the in-use blocker (which stays for any other holder)."""
    vm = _held_by_vm(a, running)
    if vm is None:
        return
    held = [f for f in a.findings if f.code == "in-use" and (f.device or a.address) in running]
    a.findings = [f for f in a.findings if f not in held]
    a.findings.append(Finding("in-use-by-vm", INFO, f"in use by VM {vm} (libvirt's running domain)"))


def _held_by_vm(a: GpuAssessment, running: dict[str, str]) -> str | None:
    """The running domain that holds ``a``, set as its state."""
    vm = running.get(a.address)
    if vm is not None:
        a.state = f"in use by VM {vm}"
    return vm
