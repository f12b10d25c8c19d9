"""One VM on one host: plan it (pure) and carry the plan out through libvirt.

:func:`plan_vm` turns the host plan (:mod:`gpuprov.vms`), what libvirt has
(:class:`LiveDomain`, the devices other domains hold) and what is on disk
(:class:`StorageState`) into a :class:`VmPlan`: storage steps (a qcow2 overlay
on the base image, the cloud-init seed files and ISO), sysfs steps (create a
missing mdev, set an SR-IOV VF's vGPU type), then libvirt steps (define, start,
shut down, undefine...), or refusals that stop everything before it starts.

Idempotence: the generated domain XML is compared with the domain's persistent
XML *projected* onto what the builder sets (:func:`compare_domain_xml`):
attributes and elements libvirt adds (PCI addresses of its own controllers,
``<alias>``, the ``pc-q35-7.2`` expansion of ``q35``, loader paths, input
devices, the console twin of the serial port...) and whitespace do not count; a
managed device (disk, NIC, hostdev...) that the builder no longer makes does.
Only a difference in meaning redefines the domain.

The libvirt side (:func:`connect`, :func:`read_live`, :func:`execute`...) imports
the ``libvirt`` Python bindings lazily: a host without them gets a message naming
the package. Everything else is standard library (ships with the modules).
"""

from __future__ import annotations

import difflib
import os
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from ..facts.domains import domain_devices
from ..facts.host import HostFacts
from ..facts.numa import parse_cpulist
from ..facts.sysfs import Sysfs
from ..rules.validate import ROM_DIR, rom_file_problem
from .base import COMMAND, REMOVE_FILE, WRITE_SYSFS, Action, Plan, Refusal, file_action
from .domain import DomainConfig, PciPassthrough, build_domain, to_xml
from .seed import ISO_TOOLS, iso_command, seed_files
from .vms import HostPlan, Placement, VmSpec

LIBVIRT_MISSING = (
    "the libvirt Python bindings are not installed for {python}: install python3-libvirt "
    "(Debian/Ubuntu: apt-get install python3-libvirt; EL: dnf install python3-libvirt) "
    "or `pip install libvirt-python` into that interpreter"
)
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


class LibvirtMissing(RuntimeError):
    """The ``libvirt`` module cannot be imported; the message names the package."""


@dataclass
class LiveDomain:
    exists: bool = False
    active: bool = False
    xml: str | None = None  # the persistent (inactive) definition
    uuid: str | None = None
    autostart: bool = False


@dataclass
class StorageState:
    """What is on disk for one VM (read by the module, given to the planner)."""

    dir_exists: bool = True
    base_exists: bool = True
    overlay_exists: bool = False
    seed_files: dict[str, str | None] = field(default_factory=dict)  # path -> current text
    seed_iso_exists: bool = False
    seed_dir_exists: bool = False
    missing_boot_files: list[str] = field(default_factory=list)
    rom_problems: list[str] = field(default_factory=list)  # GPU ROM files that are not usable


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


# ---------------------------------------------------------------- XML comparison

# Children whose presence in the live XML counts even when the builder makes none
# (a hostdev removed from the spec must leave the domain); elsewhere what libvirt
# adds is ignored.
_COUNTED = {
    "domain": {"memoryBacking", "cputune", "numatune"},
    "devices": {
        "disk",
        "interface",
        "hostdev",
        "serial",
        "rng",
        "memballoon",
        "graphics",
        "video",
        "filesystem",
        "tpm",
        "sound",
        "redirdev",
        "smartcard",
        "shmem",
    },
    "cputune": {"vcpupin", "emulatorpin"},
    "os": {"kernel", "initrd", "cmdline"},
    "features": {"kvm", "hyperv"},
    "hugepages": {"page"},
}
_ADDRESS_ATTRS = ("domain", "bus", "slot", "function")


def _norm_value(tag: str, name: str, value: str) -> str:
    if tag == "address" and name in _ADDRESS_ATTRS:
        try:
            return hex(int(value, 0))
        except ValueError:
            return value
    if name in ("cpuset", "nodeset"):
        return ",".join(str(c) for c in sorted(set(parse_cpulist(value))))
    if tag == "type" and name == "machine":
        if value.startswith("pc-q35-"):
            return "q35"
        if value.startswith("pc-i440fx-"):
            return "pc"
    if tag == "mac" and name == "address":
        return value.lower()
    return value


def _key(el: ET.Element) -> Any:
    tag = el.tag
    if tag == "disk":
        target = el.find("target")
        return target.get("dev") if target is not None else None
    if tag == "interface":
        mac = el.find("mac")
        return (mac.get("address") or "").lower() if mac is not None else None
    if tag == "hostdev":
        addr = el.find("source/address")
        if addr is None:
            return None
        if addr.get("uuid"):
            return addr.get("uuid")
        return tuple(_norm_value("address", a, addr.get(a, "0")) for a in _ADDRESS_ATTRS)
    if tag == "controller":
        return (el.get("type"), el.get("index"))
    if tag == "vcpupin":
        return el.get("vcpu")
    if tag in ("timer", "feature"):
        return el.get("name")
    return None


def _normalized(el: ET.Element) -> ET.Element:
    out = ET.Element(el.tag, {k: _norm_value(el.tag, k, v) for k, v in sorted(el.attrib.items())})
    text = (el.text or "").strip()
    if text:
        out.text = text
    # Siblings of different kinds in one order (libvirt groups devices by kind); same-kind order kept.
    for child in sorted(el, key=lambda c: c.tag):
        out.append(_normalized(child))
    return out


def _match(desired: list[ET.Element], live: list[ET.Element]) -> list[ET.Element | None]:
    """For each desired child, its live counterpart (by key, else by position), or None."""
    left = list(live)
    out: list[ET.Element | None] = []
    keyed = all(_key(d) is not None for d in desired)
    for i, d in enumerate(desired):
        found = None
        if keyed:
            found = next((lv for lv in left if _key(lv) == _key(d)), None)
        elif i < len(live) and live[i] in left:
            found = live[i]
        if found is not None:
            left.remove(found)
        out.append(found)
    return out


def _project(desired: ET.Element, live: ET.Element) -> ET.Element:
    """``live`` reduced to the attributes and children ``desired`` has (plus counted extras)."""
    out = ET.Element(live.tag)
    for name in desired.attrib:
        if name in live.attrib:
            out.set(name, live.attrib[name])
    if (desired.text or "").strip():
        out.text = (live.text or "").strip()
    tags: list[str] = []
    for child in desired:
        if child.tag not in tags:
            tags.append(child.tag)
    counted = _COUNTED.get(desired.tag, set())
    for tag in tags:
        wanted = [c for c in desired if c.tag == tag]
        have = [c for c in live if c.tag == tag]
        matched = _match(wanted, have)
        for d, lv in zip(wanted, matched, strict=True):
            if lv is not None:
                out.append(_project(d, lv))
        if tag in counted:
            for lv in have:
                if lv not in matched:
                    out.append(lv)
    for tag in sorted(counted - set(tags)):
        for lv in live:
            if lv.tag == tag:
                out.append(lv)
    return out


def _strip_uuid(root: ET.Element) -> ET.Element:
    copy = ET.fromstring(ET.tostring(root))
    for el in copy.findall("uuid"):
        copy.remove(el)
    return copy


def compare_domain_xml(desired_xml: str, live_xml: str | None) -> tuple[bool, str, str]:
    """(same in meaning?, live projected, desired), both as normalized indented XML."""
    desired = _strip_uuid(ET.fromstring(desired_xml))
    after = to_xml(_normalized(desired))
    if not live_xml:
        return False, "", after
    live = _strip_uuid(ET.fromstring(live_xml))
    before = to_xml(_normalized(_project(desired, live)))
    return before == after, before, after


def diff_text(before: str, after: str, name: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            f"domain {name} (libvirt)",
            f"domain {name} (gpuprov)",
        )
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


# ---------------------------------------------------------------- libvirt (I/O)


def _libvirt() -> Any:
    try:
        import libvirt
    except ImportError:
        import sys

        raise LibvirtMissing(LIBVIRT_MISSING.format(python=sys.executable)) from None
    return libvirt


def connect(uri: str) -> Any:
    libvirt = _libvirt()
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors are raised, not printed
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise RuntimeError(f"cannot connect to libvirt at {uri}: {exc}") from None


def read_live(conn: Any, name: str) -> LiveDomain:
    libvirt = _libvirt()
    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        return LiveDomain()
    return LiveDomain(
        exists=True,
        active=bool(dom.isActive()),
        xml=dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
        uuid=dom.UUIDString(),
        autostart=bool(dom.autostart()),
    )


def other_assignments(conn: Any, name: str) -> dict[str, tuple[str, bool]]:
    """Device (PCI address or mdev UUID) -> (domain, running) for every other domain."""
    libvirt = _libvirt()
    out: dict[str, tuple[str, bool]] = {}
    for dom in conn.listAllDomains():
        if dom.name() == name:
            continue
        try:
            xml = dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
        except libvirt.libvirtError:
            continue
        for device in domain_devices(xml):
            out[device] = (dom.name(), bool(dom.isActive()))
    return out


def network_state(conn: Any, network: str | None) -> str | None:
    if not network:
        return "active"
    libvirt = _libvirt()
    try:
        net = conn.networkLookupByName(network)
    except libvirt.libvirtError:
        return None
    return "active" if net.isActive() else "inactive"


def rom_problems(spec: VmSpec, root: str = "/") -> list[str]:
    """Why each ROM file the VM's GPUs name is not usable below ``root`` (validate.rom_file_problem)."""
    paths = [g.rom for g in spec.gpus if g.rom not in (None, "on", "off")]
    return [problem for path in paths if (problem := rom_file_problem(root, str(path)))]


def read_storage(spec: VmSpec, paths: dict[str, str | None], storage_dir: str, root: str = "/") -> StorageState:
    """What is on disk for the VM, read below ``root`` (a staged root holds the host's files)."""

    def below(path: str) -> str:
        return Sysfs(root).write_path(path.lstrip("/"))

    def text(path: str) -> str | None:
        try:
            with open(below(path), encoding="utf-8") as f:
                return f.read()
        except (OSError, UnicodeDecodeError):
            return None

    def exists(path: str | None) -> bool:
        return bool(path) and os.path.exists(below(path or ""))

    seed = {}
    if paths.get("seed_dir"):
        for name in ("user-data", "meta-data"):
            path = f"{paths['seed_dir']}/{name}"
            seed[path] = text(path)
    boot = [p for p in ([spec.boot.kernel, spec.boot.initrd] if spec.boot else []) if p and not exists(p)]
    return StorageState(
        dir_exists=os.path.isdir(below(storage_dir)),
        base_exists=exists(paths.get("base")),
        overlay_exists=exists(paths.get("disk")),
        seed_files=seed,
        seed_iso_exists=exists(paths.get("seed_iso")),
        seed_dir_exists=bool(paths.get("seed_dir")) and os.path.isdir(below(paths["seed_dir"] or "")),
        missing_boot_files=boot,
        rom_problems=rom_problems(spec, root),
    )


def find_iso_tool(which: Any) -> str | None:
    """The first ISO tool ``which(name)`` finds (``AnsibleModule.get_bin_path`` or shutil.which)."""
    for name in ISO_TOOLS:
        path = which(name)
        if path:
            return str(path)
    return None


def _shutdown(dom: Any, timeout: float, libvirt: Any) -> str:
    """ACPI shutdown, waiting ``timeout`` seconds; then power off. Returns how it stopped."""
    try:
        dom.shutdown()
    except libvirt.libvirtError:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not dom.isActive():
            return "shut down"
        time.sleep(1)
    if dom.isActive():
        dom.destroy()
        return f"did not shut down in {timeout:.0f}s: powered off"
    return "shut down"


def execute(conn: Any, plan: VmPlan, shutdown_timeout: float = 180) -> list[str]:
    """Carry out the libvirt ops of ``plan``; returns what was done, as text."""
    libvirt = _libvirt()
    done = []
    for op in plan.ops:
        text = op.describe()
        if op.kind == START_NETWORK:
            conn.networkLookupByName(op.target).create()
        elif op.kind == DEFINE:
            conn.defineXML(op.xml)
        elif op.kind == AUTOSTART:
            conn.lookupByName(op.target).setAutostart(1 if op.value else 0)
        elif op.kind == START:
            plan.stale_leases = leases(conn, plan.network, plan.mac) if plan.mac else []
            conn.lookupByName(op.target).create()
        elif op.kind == SHUTDOWN:
            how = _shutdown(conn.lookupByName(op.target), shutdown_timeout, libvirt)
            text += f": {how}"
        elif op.kind == DESTROY:
            dom = conn.lookupByName(op.target)
            if dom.isActive():
                dom.destroy()
        elif op.kind == UNDEFINE:
            dom = conn.lookupByName(op.target)
            flags = libvirt.VIR_DOMAIN_UNDEFINE_NVRAM | libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            try:
                dom.undefineFlags(flags)
            except libvirt.libvirtError:
                dom.undefine()  # drivers without NVRAM support (test:///)
        done.append(text)
    return done


def leases(conn: Any, network: str | None, mac: str) -> list[tuple[str, int]]:
    """IPv4 leases the libvirt network's DHCP server holds for ``mac``: (address, expiry), newest first."""
    libvirt = _libvirt()
    if not network:
        return []
    try:
        found = conn.networkLookupByName(network).DHCPLeases(mac) or []
    except libvirt.libvirtError:
        return []
    out = [
        (lease["ipaddr"], int(lease.get("expirytime") or 0))
        for lease in found
        if lease.get("type") == libvirt.VIR_IP_ADDR_TYPE_IPV4 and (lease.get("mac") or "").lower() == mac.lower()
    ]
    return sorted(out, key=lambda lease: lease[1], reverse=True)


def wait_for_address(
    conn: Any, network: str | None, mac: str, timeout: float, stale: list[tuple[str, int]] | None = None
) -> list[str]:
    """The guest's IPv4 addresses, newest lease first, waiting up to ``timeout`` seconds.

    ``stale``: the leases the MAC had before the domain was started here. A guest
    made anew (a fresh overlay, a new DHCP client id) under an old name and MAC
    gets a new address while dnsmasq still holds the old one, so only a lease that
    is new, or renewed since, counts.
    """
    old = set(stale or [])
    deadline = time.monotonic() + timeout
    while True:
        fresh = [ip for ip, expiry in leases(conn, network, mac) if (ip, expiry) not in old]
        if fresh or time.monotonic() >= deadline:
            return fresh
        time.sleep(2)


def consults_libvirt(root: str, uri: str) -> bool:
    """Whether gpu_vm talks to libvirt at ``uri``: on the live root, or through libvirt's test
    driver (``test:///...``, a fake that holds no machine). With a staged or captured root the
    facts are another machine's: libvirt here, and every command, stay untouched."""
    return Sysfs(root).live or uri.startswith("test:///")


def finish_vm(
    module: Any,
    plan: VmPlan,
    conn: Any,
    root: str,
    *,
    shutdown_timeout: float = 180,
    wait_address: float = 0,
    **extra: Any,
) -> None:
    """Exit the module ``gpu_vm``: refuse, report (check mode) or carry out ``plan``.

    Like :func:`gpuprov.modsupport.finish`, plus the libvirt ops: storage first,
    then sysfs writes, then libvirt, then storage clean-up. Files are written below
    ``root``; commands and sysfs writes run only when ``root`` is ``/``, libvirt ops
    only with a connection (``conn`` None: not consulted, see :func:`consults_libvirt`);
    the rest is reported in ``not_run``. ``module`` is an ``AnsibleModule``.
    """
    from ..modsupport import failed_result, warn_or_refuse
    from .base import ApplyError, apply

    result: dict[str, Any] = {
        "changed": False,
        "plan": plan.describe(),
        "not_run": [],
        "root": root,
        "name": plan.name,
        "xml": plan.xml,
        "needs_restart": plan.needs_restart,
        "placement": plan.placement.as_dict() if plan.placement else None,
        "paths": plan.paths,
        "addresses": [],
        **extra,
    }
    warn_or_refuse(module, plan, result)
    if module._diff:
        diffs = plan.diff(root)
        domain = plan.domain_diff()
        result["diff"] = [*diffs, domain] if domain else diffs
    live = Sysfs(root).live
    if module.check_mode:
        steps = plan.actions + plan.sysfs + plan.cleanup
        result["changed"] = any(live or not a.live_only for a in steps) or bool(plan.ops and conn is not None)
        module.exit_json(**result)
    done: list[str] = []
    not_run: list[str] = []
    try:
        for actions in (plan.actions, plan.sysfs):
            applied = apply(Plan(actions=actions), root)
            done += applied.done
            not_run += applied.not_run
    except ApplyError as exc:
        module.fail_json(msg=str(exc), done=done + exc.applied.done, **failed_result(result))
    if conn is None:
        not_run += [op.describe() for op in plan.ops]
    else:
        libvirt = _libvirt()
        try:
            done += execute(conn, plan, shutdown_timeout)
        except libvirt.libvirtError as exc:
            module.fail_json(msg=f"libvirt: {exc}", done=done, **failed_result(result))
    try:
        applied = apply(Plan(actions=plan.cleanup), root)
        done += applied.done
        not_run += applied.not_run
    except ApplyError as exc:
        module.fail_json(msg=str(exc), done=done + exc.applied.done, **failed_result(result))
    result["changed"] = bool(done)
    result["done"] = done
    result["not_run"] = not_run
    if wait_address and conn is not None and extra.get("state") == "running" and plan.mac:
        addresses = wait_for_address(conn, plan.network, plan.mac, wait_address, plan.stale_leases)
        result["addresses"] = addresses
        if addresses:
            result["guest"] = {
                "name": plan.name,
                "address": addresses[0],
                "addresses": addresses,
                "user": extra.get("guest_user"),
            }
        if not addresses:
            module.fail_json(
                msg=f"domain {plan.name} got no address on its network within {wait_address:.0f}s "
                f"(MAC {plan.mac}); see its serial log {plan.paths.get('serial_log')}",
                **failed_result(result),
            )
    module.exit_json(**result)
