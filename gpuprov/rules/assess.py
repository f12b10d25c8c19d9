"""Passthrough readiness of each GPU, from host facts alone (pure, no I/O).

The safety rules (docs/concepts/safety-rules.md) live here, once: what makes a
device or its IOMMU group untouchable, which devices are never passable
(bridges, ports), which functions must go with a GPU, and what only degrades
it. Evidence a rule needs that could not be read (``HostFacts.missing``) is an
"unknown" blocker: unknown is never ready. ``gpuprov inspect`` shows these
findings; the vfio and VM planners refuse on the same blockers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..facts.evidence import RESOURCES, Missing
from ..facts.host import HostFacts
from ..facts.iommu import IOMMU_GROUPS
from ..facts.pci import PciDevice, group_link_evidence
from ..facts.usage import OpenDeviceFile

BLOCKER, WARNING, INFO = "blocker", "warning", "info"
UNKNOWN = "unknown"  # evidence a rule needs could not be read
BRIDGE = "bridge"  # a bridge or port named as the device to pass
# Blockers no per-device expert override (vfio_bind allow_unsafe) lifts: a bridge
# or port is never a device to pass, and unbinding one cuts off the bus below it.
NEVER_OVERRIDDEN = frozenset({BRIDGE})

# Companion functions that share the GPU's slot and must be passed with it.
COMPANION_CLASSES = {0x0403: "HD audio", 0x0C03: "USB controller", 0x0C80: "USB-C UCSI controller"}
# Chipset functions the host cannot run without.
CHIPSET_CLASSES = {0x0600: "host bridge", 0x0601: "ISA bridge", 0x0C05: "SMBus controller"}
# Bridge classes (0x06xx) by name; any other 0x06xx is "bridge".
BRIDGE_CLASSES = {
    0x0600: "host bridge",
    0x0601: "ISA bridge",
    0x0602: "EISA bridge",
    0x0603: "MCA bridge",
    0x0604: "PCI-to-PCI bridge",
    0x0605: "PCMCIA bridge",
    0x0606: "NuBus bridge",
    0x0607: "CardBus bridge",
    0x0608: "RACEway bridge",
    0x0609: "semi-transparent PCI-to-PCI bridge",
    0x060A: "InfiniBand-to-PCI bridge",
}
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
    # With a host declaration (gpuprov.rules.intent): the declared use the verdict is for, the
    # entry that declares it, and what holds the GPU now (a state such as "in use by VM a").
    intended_use: str | None = None
    declared_as: str | None = None
    state: str | None = None

    @property
    def ready(self) -> bool:
        return not any(f.severity == BLOCKER for f in self.findings)

    @property
    def blockers(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == BLOCKER]


def is_gpu(dev: PciDevice) -> bool:
    """Display-class physical functions (0x03xx), any vendor; VFs go under their PF."""
    return dev.base_class == 0x03 and dev.physfn is None


def bridge_kind(facts: HostFacts, dev: PciDevice) -> str | None:
    """What makes ``dev`` a bridge or port (never passable), or None for an endpoint."""
    if dev.driver == "pcieport":
        return "PCIe root or switch port (driver pcieport)"
    if dev.is_bridge:
        return BRIDGE_CLASSES.get(dev.class_prefix or -1, "bridge")
    if facts.children(dev.address):
        return "bridge (devices sit on a bus below it)"
    return None


def endpoints_below(facts: HostFacts, address: str) -> list[str]:
    """The devices (not bridges or ports) anywhere below bridge ``address``."""
    found: list[str] = []
    pending = [address]
    while pending:
        for child in facts.children(pending.pop()):
            if bridge_kind(facts, facts.pci[child]) is None:
                found.append(child)
            else:
                pending.append(child)
    return sorted(found)


def _bridge_finding(facts: HostFacts, dev: PciDevice, kind: str) -> Finding:
    below = endpoints_below(facts, dev.address)
    if below:
        fix = f"pass the device below it instead: {', '.join(below)}"
    else:
        gpus = [a for a, d in facts.pci.items() if is_gpu(d)]
        fix = "pass an endpoint device instead (the GPU itself)" + (
            f": {', '.join(gpus)}" if gpus else "; `gpuprov inspect --all` lists the devices"
        )
    return Finding(
        BRIDGE,
        BLOCKER,
        f"{dev.address} is a {kind}: bridges, root ports and host bridges stay with the host and are never "
        "passed through (no override applies)",
        fix,
    )


def unknown_findings(facts: HostFacts, devices: Iterable[str], rules: Iterable[str] | None = None) -> list[Finding]:
    """One blocker per piece of evidence that could not be read and decides the
    verdict of ``devices`` (a GPU, its group, its companions); ``rules`` limits
    them to those rules' evidence. Unknown is never ready."""
    concerned = set(devices)
    wanted = None if rules is None else set(rules)
    findings = []
    for name, missing in facts.missing.items():
        if missing.rule == RESOURCES or (wanted is not None and missing.rule not in wanted):
            continue
        if missing.devices and not concerned & set(missing.devices):
            continue
        others = [d for d in missing.devices if d in concerned]
        findings.append(unknown_finding(name, missing, others[0] if others else None))
    return findings


def unknown_finding(name: str, missing: Missing, device: str | None = None) -> Finding:
    """The blocker for evidence ``name`` that could not be read: what, where, how to get it."""
    return Finding(
        UNKNOWN, BLOCKER, f"unknown: {name} could not be read ({missing.path}: {missing.problem})", missing.fix, device
    )


def companions_of(facts: HostFacts, address: str) -> list[str]:
    """Other functions of the GPU's slot (audio, USB, UCSI...), bridges and ports excluded."""
    dev = facts.pci[address]
    return [
        a
        for a, d in facts.pci.items()
        if a != address and d.slot == dev.slot and d.physfn is None and bridge_kind(facts, d) is None
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


def _holder_inputs(facts: HostFacts) -> tuple[dict[str, list[str]], list[str]]:
    # A /dev/vfio/N holder holds the group's endpoints; its bridges stay with the host.
    groups = {
        n: [a for a in g.devices if a in facts.pci and not facts.pci[a].is_pci_bridge]
        for n, g in facts.iommu.groups.items()
    }
    return groups, [a for a, d in facts.pci.items() if d.driver == "nvidia"]


def held_open(facts: HostFacts) -> dict[str, list[str]]:
    """PCI address -> who holds it open (GPU, DRM or VFIO device files)."""
    from ..facts.usage import devices_with_open_files

    return devices_with_open_files(facts.usage, *_holder_inputs(facts))


def open_holders(facts: HostFacts) -> dict[str, list[OpenDeviceFile]]:
    """PCI address -> the processes' open files that hold it (pid, command, the VM a QEMU runs)."""
    from ..facts.usage import holders_of_devices

    return holders_of_devices(facts.usage, *_holder_inputs(facts))


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
    kind = bridge_kind(facts, gpu)
    if kind is not None:
        findings.append(_bridge_finding(facts, gpu, kind))
    members = facts.group_members(address)
    findings += unknown_findings(facts, [address, *members, *companions])
    if not facts.iommu.enabled and IOMMU_GROUPS not in facts.missing:  # else on or off is unknown
        findings.append(
            Finding(
                "iommu-off", BLOCKER, "the IOMMU is off: no /sys/class/iommu units, no IOMMU groups", _iommu_fix(facts)
            )
        )
    elif facts.iommu.enabled and gpu.iommu_group is None and group_link_evidence(address) not in facts.missing:
        findings.append(
            Finding(
                "no-iommu-group",
                BLOCKER,
                f"the IOMMU is on but this device has no IOMMU group (no /sys/bus/pci/devices/{address}/iommu_group)",
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
                f"companion {kind} {comp} ({f'driver {cdev.driver}' if cdev and cdev.driver else 'no driver'}) "
                "must be passed through with it",
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
    return GpuAssessment(
        address=address,
        name=gpu.name,
        vendor_device=gpu.id_pair,
        driver=gpu.driver,
        iommu_group=gpu.iommu_group,
        numa_node=gpu.numa_node,
        link=gpu.link.describe(),
        reset_methods=gpu.reset_methods,
        group_members=members,
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
