"""A host's VM list: the spec of each VM, where it runs, and whether the host can take it.

The VM list is what the inventory gives role ``gpu_vms`` (``gpu_vms_list``,
with ``gpu_vms_defaults`` merged under each entry) and what ``gpuprov plan``
reads from a YAML file. :func:`plan_host` checks the whole list against the
host facts before anything changes and reports every problem at once:

- a GPU, VF or mdev given twice, or an IOMMU group split between VMs;
- a device that is not vfio-ready (the safety rules of :mod:`gpuprov.assess`;
  a device still on its host driver but bindable is fine: role vfio_host binds it);
- an mdev parent or type the host does not offer, more new instances than
  ``available_instances``, mixed vGPU types on an NVIDIA GPU (all vGPUs of a
  board share one profile unless the host opts into mixed sizes);
- SR-IOV vGPU VFs: a type that is not creatable, a VF that holds another type;
- host memory, CPUs and hugepages oversubscribed.

It also places each VM (:class:`Placement`): its NUMA node (the node of its
first GPU, VF or mdev parent, unless given), one host CPU per vCPU on that node
(first free, in list order, after the CPUs kept for the host), and hugepages
when enough are reserved. The module ``gpu_vm`` places a VM with the same
function over the same list, so the plan and the domains agree.

Pure: no I/O. Ships to targets with the modules; standard library only.
"""

from __future__ import annotations

import hashlib
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from ..facts.evidence import RESOURCES, how_to_read
from ..facts.host import HostFacts
from ..facts.numa import parse_cpulist
from ..rules.assess import BLOCKER, VFIO_DRIVERS, assess_gpu, companions_of, held_open, unknown_finding
from ..rules.validate import (
    HOSTNAME_RE,
    MAX_DEVICES,
    MAX_DISK_GIB,
    MAX_KEYS,
    MAX_MEMORY_MIB,
    MAX_NUMA_NODE,
    MAX_PACKAGES,
    MAX_VCPUS,
    MAX_VGPU_TYPE,
    MAX_VMS,
    PACKAGE_RE,
    SYSFS_NAME_RE,
    USER_RE,
    VENDOR_ID_RE,
    Problems,
    boolean,
    choice,
    cmdline,
    cpu_list,
    integer,
    kind,
    mac_address,
    machine_type,
    mapping,
    network_name,
    path_text,
    pci_address,
    rom,
    sequence,
    ssh_key,
    text,
    uuid_text,
    vm_name,
)
from .base import Refusal
from .vgpu import mixed_types_refusal

STATES = ("running", "shutdown", "defined", "absent")
FIRMWARES = ("efi", "bios")
ACCELS = ("kvm", "tcg")
NVIDIA = 0x10DE
# A fixed namespace: an mdev without a UUID gets the same one on every run.
_MDEV_NAMESPACE = uuidlib.UUID("6f1c3b52-8c0e-4a52-9d8e-0b7a6d1e2c41")
_DEFAULT_USER = "gpuadmin"

VM_KEYS = (
    "name",
    "state",
    "memory_mib",
    "vcpus",
    "firmware",
    "accel",
    "machine",
    "gpus",
    "vfs",
    "mdevs",
    "numa_node",
    "cpuset",
    "pin",
    "hugepages",
    "hide_kvm",
    "vendor_id",
    "network",
    "mac",
    "disk",
    "cloud_init",
    "boot",
    "autostart",
)


@dataclass
class GpuSpec:
    address: str  # full PCI address of the GPU (its other functions join it)
    rom: str | None = None  # "on" | "off" | an absolute path to a ROM file | None: libvirt's default


@dataclass
class VfSpec:
    address: str  # an SR-IOV VF (NVIDIA SR-IOV vGPU on Ampere and later)
    vgpu_type: int | None = None  # NVIDIA vGPU type ID for nvidia/current_vgpu_type


@dataclass
class MdevSpec:
    parent: str  # PCI address, or the parent's name for non-PCI parents (mtty)
    type: str  # mdev_supported_types entry, e.g. nvidia-474
    uuid: str


@dataclass
class DiskSpec:
    base: str | None = None  # the base image the overlay is backed by
    size_gib: int | None = None  # the overlay's virtual size (None: the base's)
    path: str | None = None  # the overlay (None: <storage_dir>/<name>.qcow2)


@dataclass
class CloudInitSpec:
    user: str = _DEFAULT_USER
    ssh_authorized_keys: list[str] = field(default_factory=list)
    hostname: str | None = None  # None: the VM's name
    packages: list[str] = field(default_factory=list)


@dataclass
class BootSpec:
    """Direct kernel boot (a kernel and initrd on the host)."""

    kernel: str
    initrd: str | None = None
    cmdline: str | None = None


@dataclass
class VmSpec:
    name: str
    state: str | None = None  # None: the caller's default
    memory_mib: int = 1024
    vcpus: int = 1
    firmware: str = "efi"
    accel: str = "kvm"
    machine: str = "q35"
    gpus: list[GpuSpec] = field(default_factory=list)
    vfs: list[VfSpec] = field(default_factory=list)
    mdevs: list[MdevSpec] = field(default_factory=list)
    numa_node: int | None = None
    cpuset: list[int] | None = None
    pin: bool = True
    hugepages: str = "auto"  # auto | yes | no
    hide_kvm: bool | None = None  # None: on for consumer NVIDIA GPUs
    vendor_id: str | None = None
    network: str | None = "default"
    mac: str | None = None
    disk: DiskSpec | None = None
    cloud_init: CloudInitSpec | None = None
    boot: BootSpec | None = None
    autostart: bool = False

    @property
    def guest_mac(self) -> str:
        """The NIC's MAC: given, or derived from the name (stable across runs)."""
        if self.mac:
            return self.mac
        digest = hashlib.sha256(self.name.encode()).digest()
        return "52:54:00:" + ":".join(f"{b:02x}" for b in digest[:3])


@dataclass
class HostSettings:
    """What the host keeps for itself, and the expert switches."""

    reserved_memory_mib: int | None = None  # None: 10% of RAM, at most 4 GiB
    reserved_cpus: str = "0"  # cpulist kept for the host (and QEMU's own threads); "" keeps none
    mixed_vgpu_types: bool = False  # the GPUs run NVIDIA's mixed-size vGPU mode


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


@dataclass
class Placement:
    node: int | None  # NUMA node of memory and vCPUs; None: not bound
    cpus: list[int] | None  # host CPU of each vCPU; None: not pinned
    hugepage_kib: int | None  # page size backing the memory; None: normal pages
    pci_slots: list[list[str]] = field(default_factory=list)  # each GPU: its functions, function 0 first
    hide_kvm: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "numa_node": self.node,
            "cpus": self.cpus,
            "hugepage_kib": self.hugepage_kib,
            "pci_slots": self.pci_slots,
            "hide_kvm": self.hide_kvm,
        }


@dataclass
class HostPlan:
    vms: list[VmSpec] = field(default_factory=list)
    placements: dict[str, Placement] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def vm(self, name: str) -> VmSpec | None:
        return next((v for v in self.vms if v.name == name), None)

    def refusal_text(self) -> str:
        return "refused, nothing changed: " + "; ".join(r.describe() for r in self.refusals)


# ---------------------------------------------------------------- parsing


class _Fields:
    """Where each field of one VM entry is written, for messages: the entry's own path
    (``gpu_vms_list[2].cpuset``) or, for a key it took from the defaults, theirs
    (``gpu_vms_defaults.cpuset``)."""

    def __init__(self, problems: Problems, path: str, own: Any, defaults_path: str | None) -> None:
        self.problems = problems
        self.path = path
        self.own = own  # the entry as written, before the defaults were merged under it
        self.defaults_path = defaults_path

    def at(self, *keys: str | int) -> str:
        base, node = self.path, self.own
        if self.defaults_path is not None and isinstance(keys[0], str):
            for key in keys:
                if isinstance(key, int):
                    break
                if not isinstance(node, dict) or key not in node:
                    base = self.defaults_path
                    break
                node = node[key]
        return base + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys)


def _gpus(value: Any, f: _Fields) -> list[GpuSpec]:
    gpus = []
    if value is None:
        return []
    for i, entry in enumerate(sequence(f.problems, f.at("gpus"), value, MAX_DEVICES) or []):
        data = entry if isinstance(entry, dict) else {"address": entry}
        mapping(f.problems, f.at("gpus", i), data, ("address", "rom"))
        where = f.at("gpus", i, "address") if isinstance(entry, dict) else f.at("gpus", i)
        address = pci_address(f.problems, where, data.get("address"))
        rom_option = None if data.get("rom") is None else rom(f.problems, f.at("gpus", i, "rom"), data["rom"])
        if address:
            gpus.append(GpuSpec(address, rom_option))
    return gpus


def _vfs(value: Any, f: _Fields) -> list[VfSpec]:
    vfs = []
    if value is None:
        return []
    for i, entry in enumerate(sequence(f.problems, f.at("vfs"), value, MAX_DEVICES) or []):
        data = entry if isinstance(entry, dict) else {"address": entry}
        mapping(f.problems, f.at("vfs", i), data, ("address", "vgpu_type"))
        where = f.at("vfs", i, "address") if isinstance(entry, dict) else f.at("vfs", i)
        address = pci_address(f.problems, where, data.get("address"))
        vtype = data.get("vgpu_type")
        vgpu_type = None if vtype is None else integer(f.problems, f.at("vfs", i, "vgpu_type"), vtype, 1, MAX_VGPU_TYPE)
        if address:
            vfs.append(VfSpec(address, vgpu_type))
    return vfs


def default_mdev_uuid(vm: str, index: int) -> str:
    """The UUID of a VM's n-th mdev when none is given: the same on every run."""
    return str(uuidlib.uuid5(_MDEV_NAMESPACE, f"{vm}/{index}"))


def _mdevs(value: Any, vm: str, f: _Fields) -> list[MdevSpec]:
    mdevs = []
    p = f.problems
    if value is None:
        return []
    for i, entry in enumerate(sequence(p, f.at("mdevs"), value, MAX_DEVICES) or []):
        if mapping(p, f.at("mdevs", i), entry, ("parent", "type", "uuid")) is None:
            continue
        if entry.get("parent") is None or entry.get("type") is None:
            p.add(f.at("mdevs", i), "needs a parent and a type", "e.g. {parent: '0000:41:00.0', type: nvidia-474}")
            continue
        raw = entry["parent"]
        if isinstance(raw, str) and ":" in raw:
            parent = pci_address(p, f.at("mdevs", i, "parent"), raw)
        else:  # a non-PCI parent (the mtty sample) is named by its device name
            parent = text(
                p, f.at("mdevs", i, "parent"), raw, pattern=SYSFS_NAME_RE, rule=_SYSFS_NAME_RULE, what="parent"
            )
        mtype = text(
            p, f.at("mdevs", i, "type"), entry["type"], pattern=SYSFS_NAME_RE, rule=_SYSFS_NAME_RULE, what="type"
        )
        if entry.get("uuid") is None:
            uuid = default_mdev_uuid(vm, i)
        else:
            uuid = uuid_text(p, f.at("mdevs", i, "uuid"), entry["uuid"])
        if parent and mtype and uuid:
            mdevs.append(MdevSpec(parent, mtype, uuid))
    return mdevs


_SYSFS_NAME_RULE = "a name as sysfs shows it: letters, digits and _.:- (`gpuprov inspect` lists parents and types)"


def _disk(value: Any, f: _Fields) -> DiskSpec | None:
    p = f.problems
    if mapping(p, f.at("disk"), value, ("base", "size_gib", "path")) is None:
        return None
    base = None if value.get("base") is None else path_text(p, f.at("disk", "base"), value["base"])
    path = None if value.get("path") is None else path_text(p, f.at("disk", "path"), value["path"])
    size = None
    if value.get("size_gib") is not None:
        size = integer(p, f.at("disk", "size_gib"), value["size_gib"], 1, MAX_DISK_GIB, " GiB")
    if value.get("base") is None and value.get("path") is None:
        p.add(f.at("disk"), "needs a base image or an existing disk", "give disk.base (or disk.path)")
    return DiskSpec(base, size, path)


def _cloud_init(value: Any, f: _Fields) -> CloudInitSpec | None:
    p = f.problems
    if mapping(p, f.at("cloud_init"), value, ("user", "ssh_authorized_keys", "hostname", "packages")) is None:
        return None
    user = _DEFAULT_USER
    if value.get("user") is not None:
        rule = "a Linux user name: lower-case letters, digits, _ and -, at most 32"
        user = (
            text(p, f.at("cloud_init", "user"), value["user"], pattern=USER_RE, rule=rule, what="user name")
            or _DEFAULT_USER
        )
    keys = []
    raw_keys = value.get("ssh_authorized_keys")
    raw_keys = [] if raw_keys is None else raw_keys
    for i, key in enumerate(sequence(p, f.at("cloud_init", "ssh_authorized_keys"), raw_keys, MAX_KEYS) or []):
        checked = ssh_key(p, f.at("cloud_init", "ssh_authorized_keys", i), key)
        if checked:
            keys.append(checked)
    hostname = None
    if value.get("hostname") is not None:
        rule = "a host name: letters, digits and -, at most 63"
        hostname = text(
            p, f.at("cloud_init", "hostname"), value["hostname"], pattern=HOSTNAME_RE, rule=rule, what="host name"
        )
    packages = []
    raw_packages = [] if value.get("packages") is None else value["packages"]
    for i, name in enumerate(sequence(p, f.at("cloud_init", "packages"), raw_packages, MAX_PACKAGES) or []):
        rule = "a package name (optionally =version)"
        checked = text(p, f.at("cloud_init", "packages", i), name, pattern=PACKAGE_RE, rule=rule, what="package")
        if checked:
            packages.append(checked)
    return CloudInitSpec(user, keys, hostname, packages)


def _boot(value: Any, f: _Fields) -> BootSpec | None:
    p = f.problems
    if mapping(p, f.at("boot"), value, ("kernel", "initrd", "cmdline")) is None:
        return None
    if value.get("kernel") is None:
        p.add(f.at("boot"), "needs a kernel (and optionally initrd, cmdline)", "boot: {kernel: /path/to/vmlinuz}")
        return None
    kernel = path_text(p, f.at("boot", "kernel"), value["kernel"])
    initrd = None if value.get("initrd") is None else path_text(p, f.at("boot", "initrd"), value["initrd"])
    line = None if value.get("cmdline") is None else cmdline(p, f.at("boot", "cmdline"), value["cmdline"])
    return BootSpec(kernel or "", initrd, line)


def parse_vm(
    data: Any,
    index: int = 0,
    *,
    path: str | None = None,
    own: Any = None,
    defaults_path: str | None = None,
    cpu_limit: int | None = None,
) -> tuple[VmSpec | None, list[Refusal]]:
    """One entry of the VM list -> a :class:`VmSpec`, or the problems that stop it.

    Every field meets the rules of :mod:`gpuprov.validate`; each problem names its
    field by ``path`` (default ``gpu_vms_list[index]``). ``own`` is the entry as
    written when ``data`` has defaults merged under it (they are named by
    ``defaults_path``); ``cpu_limit`` is the host's CPU count, when known.
    """
    problems = Problems()
    f = _Fields(problems, path or f"gpu_vms_list[{index}]", data if own is None else own, defaults_path)
    if mapping(problems, f.path, data, VM_KEYS) is None:
        return None, problems.items
    name = ""
    if data.get("name") is None:
        problems.add(f.at("name"), "is missing", "give each VM a unique name: it is the libvirt domain's")
    else:
        name = vm_name(problems, f.at("name"), data["name"]) or ""
    spec = VmSpec(name=name)
    if data.get("state") is not None:
        spec.state = choice(problems, f.at("state"), data["state"], STATES)
    if data.get("memory_mib") is not None:
        memory = integer(problems, f.at("memory_mib"), data["memory_mib"], 64, MAX_MEMORY_MIB, " MiB")
        spec.memory_mib = memory or spec.memory_mib
    if data.get("vcpus") is not None:
        spec.vcpus = integer(problems, f.at("vcpus"), data["vcpus"], 1, MAX_VCPUS) or spec.vcpus
    if data.get("firmware") is not None:
        spec.firmware = choice(problems, f.at("firmware"), data["firmware"], FIRMWARES) or spec.firmware
    if data.get("accel") is not None:
        spec.accel = choice(problems, f.at("accel"), data["accel"], ACCELS) or spec.accel
    if data.get("machine") is not None:
        machine = machine_type(problems, f.at("machine"), data["machine"])
        if machine is not None and not machine.startswith(("q35", "pc-q35")):
            problems.add(f.at("machine"), f"{machine!r} is not a q35 machine type", "GPUs need PCIe: use q35")
        spec.machine = machine or spec.machine
    spec.gpus = _gpus(data.get("gpus"), f)
    spec.vfs = _vfs(data.get("vfs"), f)
    spec.mdevs = _mdevs(data.get("mdevs"), name, f)
    if data.get("numa_node") is not None:
        spec.numa_node = integer(problems, f.at("numa_node"), data["numa_node"], 0, MAX_NUMA_NODE)
    if data.get("cpuset") is not None:
        spec.cpuset = cpu_list(problems, f.at("cpuset"), data["cpuset"], cpu_limit)
        if spec.cpuset is not None and len(spec.cpuset) != spec.vcpus:
            problems.add(
                f.at("cpuset"),
                f"names {len(spec.cpuset)} CPUs for {spec.vcpus} vCPUs",
                "give one host CPU per vCPU",
            )
    if data.get("pin") is not None:
        pin = boolean(problems, f.at("pin"), data["pin"])
        spec.pin = spec.pin if pin is None else pin
    if data.get("hugepages") is not None:
        raw = data["hugepages"]
        if isinstance(raw, bool):
            spec.hugepages = "yes" if raw else "no"
        else:
            spec.hugepages = choice(problems, f.at("hugepages"), raw, ("auto", "yes", "no")) or "auto"
    if data.get("hide_kvm") is not None:
        spec.hide_kvm = boolean(problems, f.at("hide_kvm"), data["hide_kvm"])
    if data.get("vendor_id") is not None:
        rule = "1 to 12 letters or digits"
        spec.vendor_id = text(
            problems, f.at("vendor_id"), data["vendor_id"], pattern=VENDOR_ID_RE, rule=rule, what="vendor_id"
        )
    if "network" in data:
        raw = data["network"]
        spec.network = None if raw in (None, "") else network_name(problems, f.at("network"), raw)
    if data.get("mac") is not None:
        spec.mac = mac_address(problems, f.at("mac"), data["mac"])
    spec.disk = None if data.get("disk") is None else _disk(data["disk"], f)
    spec.cloud_init = None if data.get("cloud_init") is None else _cloud_init(data["cloud_init"], f)
    spec.boot = None if data.get("boot") is None else _boot(data["boot"], f)
    if data.get("autostart") is not None:
        spec.autostart = bool(boolean(problems, f.at("autostart"), data["autostart"]))
    return (None if problems.items else spec), problems.items


# ---------------------------------------------------------------- the host plan


def _gib(kib: float) -> str:
    gib = kib / 1048576
    return f"{gib:.0f} GiB" if gib == int(gib) or gib >= 10 else f"{gib:.1f} GiB"


def _mib(kib: float) -> str:
    return f"{kib / 1024:.0f} MiB"


def _device_node(facts: HostFacts, addresses: list[str]) -> int | None:
    for addr in addresses:
        dev = facts.pci.get(addr)
        if dev is not None and dev.numa_node is not None and dev.numa_node >= 0:
            return dev.numa_node
    return None


def _is_consumer_nvidia(facts: HostFacts, address: str) -> bool:
    dev = facts.pci.get(address)
    if dev is None or dev.vendor_id != NVIDIA:
        return False
    name = f"{dev.vendor_name or ''} {dev.device_name or ''}"
    return any(word in name for word in ("GeForce", "TITAN"))


def _slot_functions(facts: HostFacts, address: str) -> list[str]:
    """The GPU and the functions of its slot that must go with it, in function order."""
    if address not in facts.pci:
        return [address]
    return sorted({address, *companions_of(facts, address)})


class _Ledger:
    """Who was given each host device: a GPU/VF/mdev given twice is found here."""

    def __init__(self, plan: HostPlan) -> None:
        self.plan = plan
        self.owner: dict[str, tuple[str, str]] = {}  # device -> (vm, how)

    def take(self, device: str, vm: str, how: str) -> None:
        if device in self.owner:
            other_vm, other_how = self.owner[device]
            where = "twice to VM " + vm if other_vm == vm else f"to VM {other_vm} ({other_how}) and to VM {vm}"
            self.plan.refusals.append(
                Refusal(
                    f"{device} is given {where} ({how})",
                    "a device goes to one VM once; remove the duplicate",
                    device,
                )
            )
            return
        self.owner[device] = (vm, how)


def _check_pci(facts: HostFacts, vm: VmSpec, plan: HostPlan, ledger: _Ledger, held: dict[str, list[str]]) -> None:
    placement = plan.placements[vm.name]
    vm_devices: set[str] = set()
    for gpu in vm.gpus:
        vm_devices.update(_slot_functions(facts, gpu.address))
    vm_devices.update(vf.address for vf in vm.vfs)
    wanted: list[tuple[str, str]] = [(g.address, "gpus") for g in vm.gpus] + [(v.address, "vfs") for v in vm.vfs]
    for addr, how in wanted:
        dev = facts.pci.get(addr)
        if dev is None:
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: no PCI device {addr} on this host ({how})",
                    "check the address with `lspci -D` or `gpuprov inspect --all`",
                    addr,
                )
            )
            continue
        if how == "vfs" and dev.physfn is None:
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: {addr} is not an SR-IOV virtual function (vfs)",
                    "list a whole GPU under gpus; VFs come from `sriov-manage -e` or sriov_numvfs",
                    addr,
                )
            )
        functions = _slot_functions(facts, addr) if how == "gpus" else [addr]
        if how == "gpus":
            placement.pci_slots.append(functions)
        else:
            placement.pci_slots.append([addr])
        for i, function in enumerate(functions):
            ledger.take(function, vm.name, how if i == functions.index(addr) else f"goes with {addr}")
        for finding in assess_gpu(facts, addr, held).findings:
            if finding.severity != BLOCKER:
                continue
            if finding.code == "group-shared" and finding.device in vm_devices:
                continue  # the other member goes to the same VM
            if finding.code == "in-use":
                member = facts.pci.get(finding.device or addr)
                if member is not None and member.driver in VFIO_DRIVERS:
                    plan.warnings.append(
                        f"VM {vm.name}: {addr}: {finding.message} (vfio-bound: it must be this VM's own)"
                    )
                    continue
            plan.refusals.append(
                Refusal(f"VM {vm.name}: {addr} is not vfio-ready: {finding.message}", finding.fix, addr)
            )


def _check_groups(facts: HostFacts, plan: HostPlan, ledger: _Ledger) -> None:
    """An IOMMU group goes to one VM whole: vfio attaches a group to one container."""
    users: dict[str, dict[str, list[str]]] = {}
    for device, (vm, _how) in ledger.owner.items():
        dev = facts.pci.get(device)
        if dev is not None and dev.iommu_group is not None:
            users.setdefault(dev.iommu_group, {}).setdefault(vm, []).append(device)
    for group, by_vm in sorted(users.items()):
        if len(by_vm) > 1:
            parts = ", ".join(f"{vm} ({', '.join(sorted(devs))})" for vm, devs in by_vm.items())
            plan.refusals.append(
                Refusal(
                    f"IOMMU group {group} is split between VMs {parts}",
                    "a group goes to one VM whole; give these devices to the same VM",
                )
            )


def _check_whole_and_sliced(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, ledger: _Ledger) -> None:
    """A GPU passed whole cannot also give VFs or mdevs to VMs."""
    for device, (vm, how) in ledger.owner.items():
        if how != "gpus":
            continue
        dev = facts.pci.get(device)
        slices = [f"VF {vf} (VM {ledger.owner[vf][0]})" for vf in (dev.virtfns if dev else []) if vf in ledger.owner]
        slices += [f"mdev {m.uuid} (VM {other.name})" for other in vms for m in other.mdevs if m.parent == device]
        if slices:
            plan.refusals.append(
                Refusal(
                    f"{device} is passed whole to VM {vm} and sliced too: {', '.join(slices)}",
                    "pass a GPU whole or slice it into vGPUs, not both",
                    device,
                )
            )


def _parent_vendor(facts: HostFacts, parent: str) -> int | None:
    dev = facts.pci.get(parent)
    return dev.vendor_id if dev else None


def _check_mdevs(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, ledger: _Ledger, settings: HostSettings) -> None:
    existing = {m.uuid: m for m in facts.mdevs}
    new_count: dict[tuple[str, str], list[str]] = {}
    types_on: dict[str, dict[str, list[str]]] = {}  # parent -> type -> who
    for inst in facts.mdevs:
        if inst.parent and inst.type_id:
            types_on.setdefault(inst.parent, {}).setdefault(inst.type_id, []).append(f"existing mdev {inst.uuid}")
    for vm in vms:
        for m in vm.mdevs:
            ledger.take(m.uuid, vm.name, f"mdev {m.type} on {m.parent}")
            parent = facts.mdev_parents.get(m.parent)
            if parent is None:
                offered = ", ".join(sorted(facts.mdev_parents)) or "none"
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: no mdev parent {m.parent} on this host (mdev parents: {offered})",
                        "load the vGPU host driver (NVIDIA vGPU manager, mtty...) or fix the parent",
                        m.parent,
                    )
                )
                continue
            mtype = parent.types.get(m.type)
            if mtype is None:
                offered = ", ".join(f"{t.type_id} ({t.name})" for t in parent.types.values()) or "none"
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: mdev type {m.type} is not offered by {m.parent} (offered: {offered})",
                        "pick one of the offered types (`gpuprov inspect` lists them)",
                        m.parent,
                    )
                )
                continue
            types_on.setdefault(m.parent, {}).setdefault(m.type, []).append(f"VM {vm.name}")
            old = existing.get(m.uuid)
            if old is not None:
                if (old.parent, old.type_id) != (m.parent, m.type):
                    plan.refusals.append(
                        Refusal(
                            f"VM {vm.name}: mdev {m.uuid} exists already as {old.type_id} on {old.parent}, "
                            f"not {m.type} on {m.parent}",
                            "use another UUID, or remove that mdev first",
                            m.uuid,
                        )
                    )
                continue
            new_count.setdefault((m.parent, m.type), []).append(vm.name)
    for (parent_name, type_id), who in sorted(new_count.items()):
        available = facts.mdev_parents[parent_name].types[type_id].available_instances
        if available is not None and len(who) > available:
            plan.refusals.append(
                Refusal(
                    f"{len(who)} new {type_id} mdevs on {parent_name} (VMs {', '.join(who)}) but "
                    f"available_instances is {available}",
                    "use fewer or smaller vGPUs, or another GPU",
                    parent_name,
                )
            )
    for parent_name, by_type in sorted(types_on.items()):
        if _parent_vendor(facts, parent_name) == NVIDIA:
            refusal = mixed_types_refusal(parent_name, by_type, settings.mixed_vgpu_types)
            if refusal:
                plan.refusals.append(refusal)


def _check_vgpu_vfs(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, settings: HostSettings) -> None:
    wanted: dict[str, int] = {}
    for vm in vms:
        for vf in vm.vfs:
            if vf.vgpu_type is None:
                continue
            state = facts.vgpu_vfs.get(vf.address)
            if state is None:
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: {vf.address} shows no NVIDIA vGPU types (nvidia/creatable_vgpu_types)",
                        "enable the VFs with the vGPU manager (`sriov-manage -e`), or drop vgpu_type",
                        vf.address,
                    )
                )
                continue
            wanted[vf.address] = vf.vgpu_type
            if state.current_type and state.current_type != vf.vgpu_type:
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: {vf.address} already holds vGPU type {state.current_type}, not {vf.vgpu_type}",
                        "clear it first (echo 0 > nvidia/current_vgpu_type) while no VM uses it",
                        vf.address,
                    )
                )
            elif state.current_type != vf.vgpu_type and vf.vgpu_type not in state.creatable:
                creatable = ", ".join(f"{k} ({v})" for k, v in sorted(state.creatable.items())) or "none"
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: vGPU type {vf.vgpu_type} is not creatable on {vf.address} "
                        f"(creatable now: {creatable})",
                        "pick a creatable type; on a GPU that holds vGPUs already only their type is creatable",
                        vf.address,
                    )
                )
    # All VFs of one GPU: the types asked for plus those the other VFs hold.
    by_pf: dict[str, dict[str, list[str]]] = {}
    for addr, state in facts.vgpu_vfs.items():
        dev = facts.pci.get(addr)
        if dev is None or dev.physfn is None:
            continue
        vtype = wanted.get(addr, state.current_type or None)
        if vtype:
            by_pf.setdefault(dev.physfn, {}).setdefault(str(vtype), []).append(addr)
    for pf, by_type in sorted(by_pf.items()):
        refusal = mixed_types_refusal(pf, by_type, settings.mixed_vgpu_types)
        if refusal:
            plan.refusals.append(refusal)


def _node_hugepages(facts: HostFacts) -> dict[int, dict[int, int]]:
    """node -> page size KiB -> KiB reserved (total pages x size)."""
    out: dict[int, dict[int, int]] = {}
    for node in facts.numa:
        for size, counts in node.hugepages.items():
            try:
                size_kib = int(size.rstrip("kB"))
            except ValueError:
                continue
            total = counts.get("total") or 0
            if total:
                out.setdefault(node.node, {})[size_kib] = total * size_kib
    return out


def _place(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, reserved_cpus: list[int]) -> None:
    node_cpus = {n.node: parse_cpulist(n.cpulist) for n in facts.numa}
    all_cpus = sorted({c for cpus in node_cpus.values() for c in cpus})
    reserved = set(reserved_cpus)
    used: dict[int, str] = {}  # host CPU -> VM pinned there
    hugepages_left = _node_hugepages(facts)
    for vm in vms:
        devices = [g.address for g in vm.gpus] + [v.address for v in vm.vfs] + [m.parent for m in vm.mdevs]
        device_node = _device_node(facts, devices)
        node = vm.numa_node if vm.numa_node is not None else device_node
        if vm.numa_node is not None and vm.numa_node not in node_cpus:
            plan.refusals.append(
                Refusal(
                    f"VM {vm.name}: NUMA node {vm.numa_node} does not exist (nodes: {', '.join(map(str, node_cpus))})"
                )
            )
            node = None
        elif vm.numa_node is not None and device_node is not None and vm.numa_node != device_node:
            plan.warnings.append(
                f"VM {vm.name}: placed on NUMA node {vm.numa_node} while its GPU is on node {device_node} "
                "(every DMA crosses the interconnect)"
            )
        if len(node_cpus) <= 1 and vm.numa_node is None:
            node = None  # one node: nothing to bind
        nodes_of_devices = {facts.pci[a].numa_node for a in devices if a in facts.pci} - {None, -1}
        if len(nodes_of_devices) > 1:
            plan.warnings.append(
                f"VM {vm.name}: its devices sit on NUMA nodes {sorted(nodes_of_devices)}; placed on node {node}"
            )
        cpus: list[int] | None = None
        if vm.pin:
            if vm.cpuset is not None:
                cpus = list(vm.cpuset)
                unknown = [c for c in cpus if c not in all_cpus]
                if unknown:
                    plan.refusals.append(Refusal(f"VM {vm.name}: cpuset names CPUs {unknown} the host does not have"))
                taken = sorted({used[c] for c in cpus if c in used})
                if taken:
                    plan.refusals.append(
                        Refusal(
                            f"VM {vm.name}: cpuset overlaps the CPUs pinned to VM {', '.join(taken)}",
                            "pinned VMs must not share host CPUs",
                        )
                    )
                if node is not None and any(c not in node_cpus.get(node, []) for c in cpus):
                    plan.warnings.append(f"VM {vm.name}: cpuset is not all on NUMA node {node}")
            else:
                pool_all = node_cpus.get(node, []) if node is not None else all_cpus
                pool = [c for c in pool_all if c not in reserved and c not in used]
                if len(pool) < vm.vcpus:
                    where = f"NUMA node {node}" if node is not None else "the host"
                    kept = len([c for c in pool_all if c in reserved])
                    pinned = len([c for c in pool_all if c in used])
                    plan.refusals.append(
                        Refusal(
                            f"VM {vm.name}: CPUs oversubscribed: {vm.vcpus} vCPUs to pin, {len(pool)} CPUs of {where} "
                            f"left ({len(pool_all)} CPUs, {kept} kept for the host, {pinned} pinned to earlier VMs)",
                            "use fewer vCPUs, another GPU's node, or pin: false",
                        )
                    )
                else:
                    cpus = pool[: vm.vcpus]
            for c in cpus or []:
                used.setdefault(c, vm.name)
        hugepage_kib = None
        if vm.hugepages != "no":
            memory_kib = vm.memory_mib * 1024
            nodes = [node] if node is not None else sorted(hugepages_left)
            sizes = sorted({s for n in nodes for s in hugepages_left.get(n, {})}, reverse=True)
            for size in sizes:
                if memory_kib % size:
                    continue
                left = sum(hugepages_left.get(n, {}).get(size, 0) for n in nodes)
                if left >= memory_kib:
                    hugepage_kib = size
                    need = memory_kib
                    for n in nodes:
                        take = min(need, hugepages_left.get(n, {}).get(size, 0))
                        if take:
                            hugepages_left[n][size] -= take
                            need -= take
                    break
            if hugepage_kib is None and vm.hugepages == "yes":
                where = f"NUMA node {node}" if node is not None else "the host"
                reserved_text = (
                    ", ".join(
                        f"{s} kB pages: {_mib(sum(hugepages_left.get(n, {}).get(s, 0) for n in nodes))} left"
                        for s in sizes
                    )
                    or "none reserved"
                )
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: hugepages oversubscribed: {vm.memory_mib} MiB wanted in hugepages on {where} "
                        f"({reserved_text})",
                        "reserve more hugepages (vm.nr_hugepages or hugepages= at boot), or hugepages: auto",
                    )
                )
        plan.placements[vm.name] = Placement(node=node, cpus=cpus, hugepage_kib=hugepage_kib)


def _check_totals(
    facts: HostFacts, vms: list[VmSpec], plan: HostPlan, settings: HostSettings, reserved: list[int]
) -> None:
    total_kib = sum(n.memory_kib or 0 for n in facts.numa)
    reserved_kib = (
        settings.reserved_memory_mib * 1024
        if settings.reserved_memory_mib is not None
        else min(4 * 1048576, total_kib // 10)
    )
    huge_kib = sum(v for sizes in _node_hugepages(facts).values() for v in sizes.values())
    normal_vms = [v for v in vms if plan.placements[v.name].hugepage_kib is None]
    want_kib = sum(v.memory_mib * 1024 for v in vms)
    normal_kib = sum(v.memory_mib * 1024 for v in normal_vms)
    cpus = sorted({c for n in facts.numa for c in parse_cpulist(n.cpulist)})
    reserved_cpus = [c for c in reserved if c in cpus]
    vcpus = sum(v.vcpus for v in vms)
    plan.resources = {
        "memory": {
            "host_mib": total_kib // 1024,
            "reserved_for_host_mib": reserved_kib // 1024,
            "hugepages_reserved_mib": huge_kib // 1024,
            "vms_mib": want_kib // 1024,
            "vms_in_hugepages_mib": (want_kib - normal_kib) // 1024,
        },
        "cpus": {"host": len(cpus), "reserved_for_host": len(reserved_cpus), "vcpus": vcpus},
    }
    unknown = {n: m for n, m in facts.missing.items() if m.rule == RESOURCES}
    for finding in [unknown_finding(name, m) for name, m in unknown.items()]:
        # Fail closed: a fit that cannot be checked is refused (docs/concepts/safety-rules.md).
        plan.refusals.append(Refusal(finding.message, finding.fix))
    if not total_kib and not unknown:
        plan.refusals.append(
            Refusal("unknown: host memory reads as 0 kB (NUMA meminfo)", how_to_read(facts.root == "/"))
        )
    if not total_kib or unknown:
        return
    sizes: dict[int, int] = {}
    for v in vms:
        sizes[v.memory_mib] = sizes.get(v.memory_mib, 0) + 1
    breakdown = " + ".join(f"{n} x {_gib(m * 1024)}" for m, n in sorted(sizes.items(), reverse=True))
    if want_kib + reserved_kib > total_kib:
        plan.refusals.append(
            Refusal(
                f"host memory oversubscribed: the VMs need {_gib(want_kib)} ({len(vms)} VMs: {breakdown}), "
                f"the host has {_gib(total_kib)} of which {_gib(reserved_kib)} is kept for the host",
                "fewer or smaller VMs, or a host with more memory (VFIO pins all guest memory: no overcommit)",
            )
        )
    elif normal_kib + huge_kib + reserved_kib > total_kib:
        plan.refusals.append(
            Refusal(
                f"host memory oversubscribed: {_gib(normal_kib)} of VMs in normal pages, {_gib(huge_kib)} reserved as "
                f"hugepages and {_gib(reserved_kib)} kept for the host exceed the host's {_gib(total_kib)}",
                "back more VMs with the reserved hugepages, or reserve fewer",
            )
        )
    if cpus and vcpus > len(cpus) - len(reserved_cpus):
        plan.refusals.append(
            Refusal(
                f"host CPUs oversubscribed: the VMs have {vcpus} vCPUs, the host {len(cpus)} CPUs of which "
                f"{len(reserved_cpus)} are kept for the host",
                "fewer vCPUs per VM, or fewer VMs",
            )
        )


def plan_host(
    facts: HostFacts,
    vm_list: list[Any],
    settings: HostSettings | None = None,
    *,
    path: str = "gpu_vms_list",
) -> HostPlan:
    """Check a host's whole VM list against its facts; place every VM. Pure.

    Entries and settings that break the input rules (:mod:`gpuprov.validate`) are
    refused first, each named by its field (``path[i].field``)."""
    settings = settings or HostSettings()
    plan = HostPlan()
    problems = Problems()
    reserved = check_settings(settings, problems)
    if sequence(problems, path, vm_list, MAX_VMS) is None or problems:
        plan.refusals.extend(problems.items)
        return plan
    names: dict[str, int] = {}
    for i, data in enumerate(vm_list):
        spec, found = parse_vm(data, i, path=f"{path}[{i}]", cpu_limit=cpu_count(facts))
        plan.refusals.extend(found)
        if spec is None:
            continue
        if spec.name in names:
            plan.refusals.append(Refusal(f"VM {spec.name} is listed twice", "VM names are libvirt domain names"))
            continue
        names[spec.name] = i
        plan.vms.append(spec)
    active = [v for v in plan.vms if v.state != "absent"]
    _place(facts, active, plan, reserved)
    held = held_open(facts)
    ledger = _Ledger(plan)
    for vm in active:
        _check_pci(facts, vm, plan, ledger, held)
        placement = plan.placements[vm.name]
        if vm.hide_kvm is None:
            placement.hide_kvm = any(_is_consumer_nvidia(facts, g.address) for g in vm.gpus)
        else:
            placement.hide_kvm = vm.hide_kvm
    _check_groups(facts, plan, ledger)
    _check_whole_and_sliced(facts, active, plan, ledger)
    _check_mdevs(facts, active, plan, ledger, settings)
    _check_vgpu_vfs(facts, active, plan, settings)
    _check_totals(facts, active, plan, settings, reserved)
    for vm in plan.vms:
        plan.placements.setdefault(vm.name, Placement(node=None, cpus=None, hugepage_kib=None))
    return plan


def cpu_count(facts: HostFacts) -> int | None:
    """One past the host's highest CPU number (None: the host shows no NUMA CPU lists)."""
    cpus = [c for n in facts.numa for c in parse_cpulist(n.cpulist)]
    return max(cpus) + 1 if cpus else None


def check_declared_mdevs(plan: HostPlan, declared: dict[str, dict[str, str]]) -> None:
    """VMs' mdevs against the vGPU layout (``gpuprov_gpus``, UUID -> {parent, type}, from
    ``gpuprov.vgpu.declared_mdevs``): the role vgpu_host makes and keeps those; an mdev a VM
    names that the layout lacks is made at start by gpu_vm but not again after a reboot."""
    for vm in plan.vms:
        if vm.state == "absent":
            continue
        for m in vm.mdevs:
            want = declared.get(m.uuid)
            if want is None:
                plan.warnings.append(
                    f"VM {vm.name}: mdev {m.uuid} ({m.type} on {m.parent}) is not in gpuprov_gpus: "
                    "it is made when the VM starts, but nothing makes it again after a reboot"
                )
            elif (want["parent"], want["type"]) != (m.parent, m.type):
                plan.refusals.append(
                    Refusal(
                        f"VM {vm.name}: mdev {m.uuid} is {m.type} on {m.parent}, but gpuprov_gpus declares it "
                        f"as {want['type']} on {want['parent']}",
                        "make the VM's mdev and the gpuprov_gpus entry agree",
                        m.uuid,
                    )
                )


def merge_defaults(defaults: dict[str, Any], vm: Any) -> Any:
    """``vm`` over ``defaults``; mappings (cloud_init, disk, boot) merge key by key, lists are replaced."""
    if not isinstance(vm, dict):
        return vm
    out = dict(defaults)
    for key, value in vm.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_defaults(out[key], value)
        else:
            out[key] = value
    return out
