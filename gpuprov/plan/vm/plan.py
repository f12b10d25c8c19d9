"""One VM on one host: the plan that makes it be in the state asked for. Pure.

:func:`plan_vm` turns the host plan (:func:`gpuprov.plan.vm.fit.plan_host`), what
libvirt has (:class:`~gpuprov.facts.libvirt.LiveDomain`, the devices other domains
hold) and what is on disk (:class:`~gpuprov.facts.vm_storage.StorageState`) into a
:class:`VmPlan`: storage steps (a qcow2 overlay on the base image, the cloud-init
seed files and ISO), sysfs steps (create a missing mdev, set an SR-IOV VF's vGPU
type), then libvirt steps (define, start, shut down, undefine...), or refusals
that stop everything before it starts.

A domain is redefined only when its definition differs in meaning
(:mod:`gpuprov.plan.vm.domain_compare`). The libvirt steps are carried out by
:func:`gpuprov.apply.libvirt.execute`. Standard library only (ships with the modules).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.plan import COMMAND, REMOVE_FILE, WRITE_SYSFS, Action, Plan, Refusal, file_action
from ...core.vm_spec import ROM_DIR, HostPlan, Placement, VmSpec
from ...facts.host import HostFacts
from ...facts.libvirt import LiveDomain
from ...facts.vm_storage import StorageState
from .domain import DomainConfig, NumaCell, PciPassthrough, build_domain, to_xml
from .domain_compare import compare_domain_xml
from .seed import ISO_TOOLS, iso_command, seed_files

SERIAL_LOG_DIR = "/var/log/libvirt/qemu"

# Ops on libvirt objects, in the order they run.
START_NETWORK, DEFINE, AUTOSTART, START, SHUTDOWN, DESTROY, UNDEFINE = (
    "start-network",
    "define",
    "autostart",
    "start",
    "shutdown",
    "destroy",
    "undefine",
)


@dataclass
class VmOptions:
    state: str = "running"
    storage_dir: str = "/var/lib/libvirt/images/gpuprov"
    iso_tool: str | None = "genisoimage"  # path or name of the ISO tool found on the host
    qemu_img: str = "qemu-img"
    remove_storage: bool = False  # state absent: also delete the overlay and seed
    network_state: str | None = "active"  # active | inactive | None (absent)


@dataclass
class DomainOp:
    kind: str
    why: str
    target: str  # the domain's or network's name
    xml: str | None = None
    value: bool | None = None  # autostart on/off

    def describe(self) -> str:
        if self.kind == START_NETWORK:
            return f"start libvirt network {self.target} ({self.why})"
        if self.kind == AUTOSTART:
            return f"set autostart {'on' if self.value else 'off'} for domain {self.target} ({self.why})"
        return f"{self.kind} domain {self.target} ({self.why})"


@dataclass
class VmPlan(Plan):
    """Storage ``actions`` (on ``/``), ``sysfs`` actions (live root only), libvirt ``ops``,
    then ``cleanup`` actions (storage removed after an undefine)."""

    name: str = ""
    sysfs: list[Action] = field(default_factory=list)
    ops: list[DomainOp] = field(default_factory=list)
    cleanup: list[Action] = field(default_factory=list)
    xml: str | None = None
    xml_before: str | None = None  # the live definition projected onto what the builder sets
    needs_restart: bool = False
    placement: Placement | None = None
    paths: dict[str, str | None] = field(default_factory=dict)
    network: str | None = None
    mac: str | None = None
    stale_leases: list[tuple[str, int]] = field(default_factory=list)  # the MAC's leases before a start

    @property
    def changes(self) -> bool:
        return bool(self.actions or self.sysfs or self.ops or self.cleanup)

    def describe(self) -> list[str]:
        return [
            *[a.describe() for a in self.actions],
            *[a.describe() for a in self.sysfs],
            *[o.describe() for o in self.ops],
            *[a.describe() for a in self.cleanup],
        ]

    def diff(self, root: str = "/") -> list[dict[str, str]]:
        """Every step's --diff entry: storage and sysfs actions, libvirt's runtime ops (a define is
        :meth:`domain_diff`'s), then the clean-up."""
        entries = Plan(actions=self.actions + self.sysfs).diff(root)
        for op in self.ops:
            if op.kind != DEFINE:
                header = f"libvirt {'network' if op.kind == START_NETWORK else 'domain'} {op.target} (now)"
                entries.append(
                    {
                        "before_header": header,
                        "after_header": f"{header}: {op.why}",
                        "before": "",
                        "after": op.describe().split(" (", 1)[0] + "\n",
                    }
                )
        return entries + Plan(actions=self.cleanup).diff(root)

    def domain_diff(self) -> dict[str, str] | None:
        if self.xml_before == self.xml:
            return None
        return {
            "before_header": f"libvirt domain {self.name}",
            "after_header": f"libvirt domain {self.name}",
            "before": self.xml_before or "",
            "after": self.xml or "",
        }


# ---------------------------------------------------------------- paths and config


def vm_paths(spec: VmSpec, storage_dir: str) -> dict[str, str | None]:
    base = storage_dir.rstrip("/")
    disk = None
    if spec.disk is not None:
        disk = spec.disk.path or f"{base}/{spec.name}.qcow2"
    seed_dir = f"{base}/{spec.name}-seed" if spec.cloud_init is not None else None
    return {
        "disk": disk,
        "base": spec.disk.base if spec.disk else None,
        "seed_dir": seed_dir,
        "seed_iso": f"{base}/{spec.name}-seed.iso" if seed_dir else None,
        "serial_log": f"{SERIAL_LOG_DIR}/{spec.name}-serial.log",
    }


def domain_config(spec: VmSpec, placement: Placement, paths: dict[str, str | None]) -> DomainConfig:
    roms = {g.address: g.rom for g in spec.gpus}
    pci = [PciPassthrough(functions=list(slot), rom=roms.get(slot[0])) for slot in placement.pci_slots]
    # A slot's ROM option belongs to the GPU named in the list, whichever function that is.
    for slot in pci:
        for address in slot.functions:
            if roms.get(address):
                slot.rom = roms[address]
    # A GPU's guest cell and NVLink clique go to its slot, whichever function it is.
    cliques = {address: i for i, group in enumerate(spec.nvlink_cliques) for address in group}
    for slot in pci:
        for address in slot.functions:
            if address in placement.gpu_cells:
                slot.numa_cell = placement.gpu_cells[address]
            if address in cliques:
                slot.clique = cliques[address]
    cells: list[NumaCell] = []
    first = 0
    for cell in placement.cells:
        cells.append(NumaCell(cell.node, list(range(first, first + cell.vcpus)), cell.memory_mib * 1024))
        first += cell.vcpus
    return DomainConfig(
        name=spec.name,
        memory_kib=spec.memory_mib * 1024,
        vcpus=spec.vcpus,
        domain_type="kvm" if spec.accel == "kvm" else "qemu",
        machine=spec.machine,
        firmware=spec.firmware,
        pci=pci,
        mdevs=[m.uuid for m in spec.mdevs],
        cpus=placement.cpus,
        numa_node=placement.node,
        numa_cells=cells,
        mmio64_mib=placement.mmio64_mib,
        hugepage_kib=placement.hugepage_kib,
        hide_kvm=placement.hide_kvm,
        vendor_id=spec.vendor_id,
        disk=paths.get("disk"),
        seed=paths.get("seed_iso"),
        network=spec.network,
        mac=spec.guest_mac if spec.network else None,
        kernel=spec.boot.kernel if spec.boot else None,
        initrd=spec.boot.initrd if spec.boot else None,
        cmdline=spec.boot.cmdline if spec.boot else None,
        serial_log=paths.get("serial_log"),
    )


# ---------------------------------------------------------------- the plan


def _rel(path: str) -> str:
    return path.lstrip("/")


def _storage(spec: VmSpec, paths: dict[str, str | None], storage: StorageState, opts: VmOptions, plan: VmPlan) -> None:
    if (paths["disk"] and not storage.overlay_exists) or paths["seed_dir"]:
        if not storage.dir_exists:
            plan.actions.append(
                Action(COMMAND, "storage folder for the VMs", argv=["mkdir", "-p", "-m", "0711", opts.storage_dir])
            )
    if paths["disk"] and not storage.overlay_exists:
        if not paths["base"]:
            plan.refusals.append(Refusal(f"VM {spec.name}: disk {paths['disk']} does not exist and no base is given"))
        elif not storage.base_exists:
            plan.refusals.append(
                Refusal(
                    f"VM {spec.name}: base image {paths['base']} not found on the host",
                    "copy a cloud image (qcow2) there first",
                )
            )
        else:
            argv = [opts.qemu_img, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", paths["base"], paths["disk"]]
            if spec.disk and spec.disk.size_gib:
                argv.append(f"{spec.disk.size_gib}G")
            plan.actions.append(Action(COMMAND, f"disk of {spec.name}: a qcow2 overlay on its base", argv=argv))
    if spec.cloud_init is not None and paths["seed_dir"] and paths["seed_iso"]:
        files = seed_files(spec.cloud_init, spec.name)
        changed = False
        for name, content in files.items():
            path = f"{paths['seed_dir']}/{name}"
            action = file_action(_rel(path), content, storage.seed_files.get(path), f"cloud-init seed of {spec.name}")
            if action:
                plan.actions.append(action)
                changed = True
        if changed or not storage.seed_iso_exists:
            if not opts.iso_tool:
                plan.refusals.append(
                    Refusal(
                        f"VM {spec.name}: no tool to build the cloud-init seed ISO (looked for {', '.join(ISO_TOOLS)})",
                        "apt-get install genisoimage (or xorriso, cloud-image-utils)",
                    )
                )
            else:
                sources = {n: f"{paths['seed_dir']}/{n}" for n in files}
                argv = iso_command(opts.iso_tool, paths["seed_iso"], sources)
                plan.actions.append(Action(COMMAND, f"cloud-init seed ISO of {spec.name}", argv=argv))
    for missing in storage.missing_boot_files:
        plan.refusals.append(
            Refusal(f"VM {spec.name}: boot file {missing} not found on the host", "copy it there, or fix boot")
        )
    for problem in storage.rom_problems:
        plan.refusals.append(Refusal(f"VM {spec.name}: {problem}", f"put the ROM file in {ROM_DIR} on the host"))


def _sysfs(facts: HostFacts, spec: VmSpec, plan: VmPlan) -> None:
    existing = {m.uuid for m in facts.mdevs}
    for m in spec.mdevs:
        if m.uuid in existing:
            continue
        path = f"sys/class/mdev_bus/{m.parent}/mdev_supported_types/{m.type}/create"
        plan.sysfs.append(Action(WRITE_SYSFS, f"create mdev {m.type} for {spec.name}", path=path, content=m.uuid))
    for vf in spec.vfs:
        state = facts.vgpu_vfs.get(vf.address)
        dev = facts.pci.get(vf.address)
        if vf.vgpu_type and state is not None and dev is not None and state.current_type != vf.vgpu_type:
            plan.sysfs.append(
                Action(
                    WRITE_SYSFS,
                    f"vGPU type {vf.vgpu_type} on VF {vf.address} for {spec.name}",
                    path=f"{dev.sysfs_path}/nvidia/current_vgpu_type",
                    content=str(vf.vgpu_type),
                )
            )


def _conflicts(spec: VmSpec, placement: Placement, others: dict[str, tuple[str, bool]], plan: VmPlan) -> None:
    mine = [a for slot in placement.pci_slots for a in slot] + [m.uuid for m in spec.mdevs]
    for device in mine:
        if device in others:
            domain, active = others[device]
            plan.refusals.append(
                Refusal(
                    f"VM {spec.name}: {device} is already assigned to domain {domain} "
                    f"({'running' if active else 'defined, not running'})",
                    f"take it out of {domain} first (virsh edit {domain}), or give {spec.name} another device",
                    device,
                )
            )


def plan_vm(
    facts: HostFacts,
    host: HostPlan,
    name: str,
    live: LiveDomain,
    others: dict[str, tuple[str, bool]],
    storage: StorageState,
    opts: VmOptions,
) -> VmPlan:
    """Everything that makes VM ``name`` of ``host`` be in ``opts.state``. Pure."""
    plan = VmPlan(name=name)
    if opts.state == "absent":
        if live.exists:
            if live.active:
                plan.ops.append(DomainOp(DESTROY, "state absent: power off", name))
            plan.ops.append(DomainOp(UNDEFINE, "state absent", name))
        spec = host.vm(name)
        if opts.remove_storage and spec is not None:
            paths = vm_paths(spec, opts.storage_dir)
            plan.paths = paths
            managed = [paths["seed_iso"]]
            if paths["disk"] and (spec.disk is None or spec.disk.path is None):
                managed.append(paths["disk"])  # only the overlay gpuprov made, never a given disk
            for path in [p for p in managed if p]:
                exists = storage.overlay_exists if path == paths["disk"] else storage.seed_iso_exists
                if exists:
                    plan.cleanup.append(Action(REMOVE_FILE, "state absent, remove_storage", path=_rel(path), before=""))
            for path, text in storage.seed_files.items():
                if text is not None:
                    plan.cleanup.append(
                        Action(REMOVE_FILE, "state absent, remove_storage", path=_rel(path), before=text)
                    )
            if storage.seed_dir_exists and paths["seed_dir"]:
                argv = ["rmdir", "--ignore-fail-on-non-empty", paths["seed_dir"]]
                plan.cleanup.append(Action(COMMAND, "state absent, remove_storage", argv=argv))
        return plan

    plan.refusals.extend(host.refusals)
    plan.warnings.extend(host.warnings)
    spec = host.vm(name)
    if spec is None:
        if not host.refusals:
            plan.refusals.append(Refusal(f"VM {name} is not in the host's VM list"))
        return plan
    placement = host.placements[name]
    plan.placement = placement
    paths = vm_paths(spec, opts.storage_dir)
    plan.paths = paths
    plan.network = spec.network
    plan.mac = spec.guest_mac if spec.network else None
    _conflicts(spec, placement, others, plan)
    if spec.network:
        if opts.network_state is None:
            plan.refusals.append(
                Refusal(
                    f"VM {name}: libvirt network {spec.network} does not exist",
                    "define it (virsh net-define) or set network to an existing one (virsh net-list --all)",
                )
            )
        elif opts.network_state != "active":
            plan.ops.append(DomainOp(START_NETWORK, f"the NIC of {name} is on it", spec.network))
    _storage(spec, paths, storage, opts, plan)
    _sysfs(facts, spec, plan)

    cfg = domain_config(spec, placement, paths)
    desired = to_xml(build_domain(cfg))
    same, before, after = compare_domain_xml(desired, live.xml if live.exists else None)
    plan.xml_before, plan.xml = (before if live.exists else None), after
    if not same:
        if live.uuid:
            cfg.uuid = live.uuid  # a redefinition keeps the domain's identity
        why = "new" if not live.exists else "its definition differs"
        plan.ops.append(DomainOp(DEFINE, why, name, xml=to_xml(build_domain(cfg))))
        if live.active:
            plan.needs_restart = True
            plan.warnings.append(f"domain {name} is running: the new definition applies from its next start")
    if spec.autostart != live.autostart and (live.exists or spec.autostart):
        plan.ops.append(DomainOp(AUTOSTART, "as listed", name, value=spec.autostart))
    if opts.state == "running" and not live.active:
        plan.ops.append(DomainOp(START, "state running", name))
    elif opts.state == "shutdown" and live.active:
        plan.ops.append(DomainOp(SHUTDOWN, "state shutdown", name))
    return plan
