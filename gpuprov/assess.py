"""Passthrough readiness of each GPU, from host facts alone (pure, no I/O).

The safety rules of DESIGN.md live here, once: what makes a device or its
IOMMU group untouchable, which functions must go with a GPU, and what only
degrades it. ``gpuprov inspect`` shows these findings; the vfio planner
refuses on the same blockers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .host.facts import HostFacts
from .host.pci import PciDevice

BLOCKER, WARNING, INFO = "blocker", "warning", "info"

# Companion functions that share the GPU's slot and must be passed with it.
COMPANION_CLASSES = {0x0403: "HD audio", 0x0C03: "USB controller", 0x0C80: "USB-C UCSI controller"}
# Chipset functions the host cannot run without.
CHIPSET_CLASSES = {0x0600: "host bridge", 0x0601: "ISA bridge", 0x0C05: "SMBus controller"}
HOST_GPU_DRIVERS = ("nvidia", "nouveau", "amdgpu", "radeon", "i915", "xe", "ast", "mgag200")
VFIO_DRIVERS = ("vfio-pci", "vfio_pci", "nvgrace-gpu-vfio-pci", "mlx5_vfio_pci")


@dataclass
class Finding:
    code: str
    severity: str  # blocker | warning | info
    message: str
    fix: str | None = None
    device: str | None = None  # the group member concerned, when not the GPU itself


@dataclass
class GpuAssessment:
    address: str
    name: str
    vendor_device: str
    driver: str | None
    iommu_group: str | None
    numa_node: int | None
    link: str
    reset_methods: list[str] | None
    group_members: list[str]
    companions: list[str]  # functions that must be bound with it
    findings: list[Finding] = field(default_factory=list)
    vgpu: dict[str, object] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return not any(f.severity == BLOCKER for f in self.findings)

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == BLOCKER]


def is_gpu(dev: PciDevice) -> bool:
    """Display-class physical functions (0x03xx), any vendor; VFs go under their PF."""
    return dev.base_class == 0x03 and dev.physfn is None


def companions_of(facts: HostFacts, address: str) -> list[str]:
    """Other functions of the GPU's slot (audio, USB, UCSI...), bridges excluded."""
    dev = facts.pci[address]
    return [
        a for a, d in facts.pci.items() if a != address and d.slot == dev.slot and not d.is_bridge and d.physfn is None
    ]


def _iommu_fix(facts: HostFacts) -> str:
    if facts.iommu.hypervisor:
        return (
            "this host is itself a VM: passthrough from here needs a virtual IOMMU from its hypervisor "
            "(QEMU: -device intel-iommu,intremap=on,caching-mode=on); a GPU passed into this VM "
            "is used here directly (gpuprov verify checks it)"
        )
    cpu = facts.iommu.cpu_vendor or ""
    if "AMD" in cpu:
        args = "iommu=pt (AMD-Vi is on by default; check amd_iommu is not off)"
    else:
        args = "intel_iommu=on iommu=pt"
    return (
        f"enable VT-d/AMD-Vi in the firmware, add {args} to the kernel command line "
        "(role iommu_host does both the args and the initramfs) and reboot"
    )


def held_open(facts: HostFacts) -> dict[str, list[str]]:
    """PCI address -> who holds it open (GPU, DRM or VFIO device files)."""
    from .host.usage import devices_with_open_files

    # A /dev/vfio/N holder holds the group's endpoints; its bridges stay with the host.
    groups = {
        n: [a for a in g.devices if a in facts.pci and not facts.pci[a].is_pci_bridge]
        for n, g in facts.iommu.groups.items()
    }
    nvidia_bound = [a for a, d in facts.pci.items() if d.driver == "nvidia"]
    return devices_with_open_files(facts.usage, groups, nvidia_bound)


def host_critical_reasons(facts: HostFacts, member: PciDevice) -> list[str]:
    """Why taking ``member`` from the host would take the host's disk, network,
    console or chipset away; [] when the host does not need it."""
    reasons: list[str] = []
    addr = member.address
    if member.boot_vga:
        reasons.append("is the boot display (boot_vga=1)")
    if addr in facts.usage.console_devices:
        reasons.append("drives the framebuffer console")
    chipset = CHIPSET_CLASSES.get(member.class_prefix or -1)
    if chipset or member.base_class == 0x05:
        reasons.append(f"is a chipset device ({chipset or 'memory controller'})")
    block = facts.usage.block
    for disk in block.values():
        if disk.pci_device == addr and disk.in_use and disk.partition_of is None:
            uses = [u for u in disk.uses if not u.startswith("backs ")]
            uses += [
                f"{p.name} {', '.join(p.uses)}" for p in block.values() if p.partition_of == disk.name and p.in_use
            ]
            reasons.append(f"controls block device {disk.name} ({'; '.join(uses) or ', '.join(disk.uses)})")
    for net in facts.usage.net.values():
        if net.pci_device != addr:
            continue
        carriers = [net] + [facts.usage.net[u] for u in net.upper if u in facts.usage.net]
        for carrier in carriers:
            via = "" if carrier is net else f" through {carrier.name}"
            if carrier.carries_default_route:
                reasons.append(f"is NIC {net.name}, which carries the default route{via}")
            elif carrier.in_use:
                what = ", ".join(carrier.addresses + carrier.routes)
                reasons.append(f"is NIC {net.name}, with address/route {what}{via}")
    return reasons


def _member_findings(
    facts: HostFacts, gpu: PciDevice, companions: list[str], held: dict[str, list[str]]
) -> list[Finding]:
    findings: list[Finding] = []
    members = facts.group_members(gpu.address) or [gpu.address, *companions]
    for addr in members:
        member = facts.pci.get(addr)
        if member is None:
            continue
        own = addr == gpu.address
        critical = host_critical_reasons(facts, member)
        for reason in critical:
            findings.append(
                Finding(
                    code="host-critical",
                    severity=BLOCKER,
                    message=f"{addr} {reason}; binding it to vfio-pci takes it from the host",
                    fix=(
                        "pass through another device; the host needs this one"
                        if own
                        else f"keep {gpu.address} for the host, or move it to a slot with its own IOMMU group"
                    ),
                    device=None if own else addr,
                )
            )
        for who in held.get(addr, []):
            findings.append(
                Finding(
                    code="in-use",
                    severity=BLOCKER,
                    message=f"{addr} is in use: {who}",
                    fix="stop the VM or process that holds it, or choose another device",
                    device=None if own else addr,
                )
            )
        if own or member.is_pci_bridge:
            continue
        if addr in companions:
            continue
        if member.driver and member.driver not in VFIO_DRIVERS and not host_critical_reasons(facts, member):
            findings.append(
                Finding(
                    code="group-shared",
                    severity=BLOCKER,
                    message=(
                        f"shares IOMMU group {gpu.iommu_group} with {addr} ({member.name}, "
                        f"driver {member.driver}); every device of a group must be vfio-bound or driverless"
                    ),
                    fix=f"pass {addr} through as well, unbind it, or move the GPU to a slot with its own group",
                    device=addr,
                )
            )
    return findings


def _device_findings(facts: HostFacts, gpu: PciDevice) -> list[Finding]:
    findings: list[Finding] = []
    if gpu.reset_methods == []:
        findings.append(
            Finding(
                "no-reset",
                WARNING,
                "no FLR, PM or bus reset: the GPU may keep state between VMs or fail to restart",
                "check for a firmware update; avoid handing it to a second VM without a host reboot",
            )
        )
    elif gpu.reset_methods is None:
        findings.append(Finding("reset-unknown", INFO, "the kernel shows no reset_method (older than 5.15)"))
    if gpu.link.degraded:
        findings.append(
            Finding(
                "link-degraded",
                WARNING,
                f"PCIe link {gpu.link.describe()}: running below its maximum "
                "(idle GPUs lower the speed to save power; a narrow width is a slot or riser problem)",
                "check again under load; reseat the card or use a full-width slot",
            )
        )
    elif not gpu.link.known and gpu.physfn is None:
        findings.append(
            Finding(
                "no-link",
                INFO,
                "no PCIe link reported (a device on a plain PCI bus, e.g. a guest without a pcie-root-port)",
            )
        )
    if gpu.driver in VFIO_DRIVERS:
        findings.append(Finding("vfio-bound", INFO, f"bound to {gpu.driver}"))
    elif gpu.driver in HOST_GPU_DRIVERS:
        findings.append(
            Finding(
                "host-driver",
                INFO,
                f"bound to host driver {gpu.driver}",
                "bind it to vfio-pci early at boot (role vfio_host) so the host driver never claims it",
            )
        )
    if gpu.driver_override and gpu.driver_override not in VFIO_DRIVERS:
        findings.append(
            Finding(
                "driver-override",
                WARNING,
                f"driver_override is '{gpu.driver_override}': the kernel binds only that driver to it",
            )
        )
    return findings


def _vgpu_capabilities(facts: HostFacts, gpu: PciDevice) -> dict[str, object]:
    caps: dict[str, object] = {}
    parent = facts.mdev_parents.get(gpu.address)
    if parent:
        caps["mdev_types"] = [
            {
                "type": t.type_id,
                "name": t.name,
                "available_instances": t.available_instances,
                "device_api": t.device_api,
                "instances": t.instances,
            }
            for t in parent.types.values()
        ]
    if gpu.sriov_totalvfs:
        caps["sriov"] = {"total_vfs": gpu.sriov_totalvfs, "enabled_vfs": gpu.sriov_numvfs or 0}
    vgpu_vfs = [facts.vgpu_vfs[v] for v in gpu.virtfns if v in facts.vgpu_vfs]
    if vgpu_vfs:
        creatable: dict[int, str] = {}
        for vf in vgpu_vfs:
            creatable.update(vf.creatable)
        caps["sriov_vgpu"] = {
            "vfs": len(vgpu_vfs),
            "vfs_in_use": sum(1 for vf in vgpu_vfs if vf.current_type),
            "creatable_types": {str(k): v for k, v in sorted(creatable.items())},
        }
    return caps


def assess_gpu(facts: HostFacts, address: str, held: dict[str, list[str]] | None = None) -> GpuAssessment:
    gpu = facts.pci[address]
    held = held_open(facts) if held is None else held
    companions = companions_of(facts, address)
    findings: list[Finding] = []
    if not facts.iommu.enabled:
        findings.append(
            Finding(
                "iommu-off", BLOCKER, "the IOMMU is off: no /sys/class/iommu units, no IOMMU groups", _iommu_fix(facts)
            )
        )
    elif gpu.iommu_group is None:
        findings.append(
            Finding(
                "no-iommu-group",
                BLOCKER,
                "the IOMMU is on but this device has no IOMMU group",
                "check the firmware's DMAR/IVRS tables cover this slot",
            )
        )
    findings += _member_findings(facts, gpu, companions, held)
    for comp in companions:
        cdev = facts.pci.get(comp)
        kind = COMPANION_CLASSES.get((cdev.class_prefix if cdev else None) or -1, "function")
        findings.append(
            Finding(
                "companion",
                INFO,
                f"companion {kind} {comp} (driver {cdev.driver if cdev else None}) must be passed through with it",
                device=comp,
            )
        )
    findings += _device_findings(facts, gpu)
    if (
        facts.iommu.enabled
        and facts.iommu.interrupt_remapping == "unsupported"
        and not facts.iommu.allow_unsafe_interrupts
    ):
        findings.append(
            Finding(
                "no-interrupt-remapping",
                WARNING,
                "the IOMMU lacks interrupt remapping: vfio refuses to assign devices",
                "enable interrupt remapping in the firmware (expert override: allow_unsafe_interrupts=1)",
            )
        )
    if not facts.usage.open_files_complete:
        findings.append(
            Finding(
                "in-use-unknown", INFO, "other users' open files were not readable: run as root for the in-use check"
            )
        )
    return GpuAssessment(
        address=address,
        name=gpu.name,
        vendor_device=gpu.id_pair,
        driver=gpu.driver,
        iommu_group=gpu.iommu_group,
        numa_node=gpu.numa_node,
        link=gpu.link.describe(),
        reset_methods=gpu.reset_methods,
        group_members=facts.group_members(address),
        companions=companions,
        findings=findings,
        vgpu=_vgpu_capabilities(facts, gpu),
    )


def assess(facts: HostFacts, extra: list[str] | None = None) -> list[GpuAssessment]:
    """Every GPU, plus the devices named in ``extra`` (stand-ins such as QEMU's edu)."""
    wanted = [a for a, d in facts.pci.items() if is_gpu(d)]
    for addr in extra or []:
        if addr in facts.pci and addr not in wanted:
            wanted.append(addr)
    held = held_open(facts)
    return [assess_gpu(facts, a, held) for a in sorted(wanted)]
