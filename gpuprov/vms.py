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
import re
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from .assess import BLOCKER, VFIO_DRIVERS, assess_gpu, companions_of, held_open, unknown_finding
from .host.evidence import RESOURCES, how_to_read
from .host.facts import HostFacts
from .host.numa import parse_cpulist
from .host.pci import PciAddressError, normalize_address
from .plan import Refusal

STATES = ("running", "shutdown", "defined", "absent")
FIRMWARES = ("efi", "bios")
ACCELS = ("kvm", "tcg")
NVIDIA = 0x10DE
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,62}$")
_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_VENDOR_ID_RE = re.compile(r"^[A-Za-z0-9]{1,12}$")
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
    reserved_cpus: str = "0"  # cpulist kept for the host (and QEMU's own threads)
    mixed_vgpu_types: bool = False  # the GPUs run NVIDIA's mixed-size vGPU mode


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


class _Problems:
    def __init__(self, vm: str) -> None:
        self.vm = vm
        self.items: list[Refusal] = []

    def add(self, message: str, fix: str | None = None) -> None:
        self.items.append(Refusal(f"VM {self.vm}: {message}", fix))


def _int(value: Any, key: str, problems: _Problems, minimum: int = 0) -> int | None:
    if isinstance(value, bool) or value is None:
        problems.add(f"{key} must be a whole number, not {value!r}")
        return None
    try:
        number = int(str(value), 10)
    except ValueError:
        problems.add(f"{key} must be a whole number, not {value!r}")
        return None
    if number < minimum:
        problems.add(f"{key} must be at least {minimum}, not {number}")
        return None
    return number


def _bool(value: Any, key: str, problems: _Problems) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("yes", "on", "true", "1"):
        return True
    if text in ("no", "off", "false", "0"):
        return False
    problems.add(f"{key} must be true or false, not {value!r}")
    return None


def _choice(value: Any, key: str, choices: tuple[str, ...], problems: _Problems) -> str | None:
    text = str(value).strip().lower()
    if text not in choices:
        problems.add(f"{key} must be one of {', '.join(choices)}, not {value!r}")
        return None
    return text


def _address(value: Any, key: str, problems: _Problems) -> str | None:
    try:
        return normalize_address(str(value))
    except PciAddressError as exc:
        problems.add(f"{key}: {exc}")
        return None


def _list(value: Any, key: str, problems: _Problems) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add(f"{key} must be a list")
        return []
    return value


def _path(value: Any, key: str, problems: _Problems) -> str | None:
    text = str(value)
    if not text.startswith("/"):
        problems.add(f"{key} must be an absolute path on the host, not {value!r}")
        return None
    return text


def _gpus(value: Any, problems: _Problems) -> list[GpuSpec]:
    gpus = []
    for i, entry in enumerate(_list(value, "gpus", problems)):
        data = entry if isinstance(entry, dict) else {"address": entry}
        unknown = set(data) - {"address", "rom"}
        if unknown:
            problems.add(f"gpus[{i}]: unknown keys {', '.join(sorted(unknown))} (known: address, rom)")
        address = _address(data.get("address"), f"gpus[{i}]", problems)
        rom = data.get("rom")
        if isinstance(rom, bool):
            rom = "on" if rom else "off"
        if rom is not None and rom not in ("on", "off"):
            rom = _path(rom, f"gpus[{i}].rom", problems)
        if address:
            gpus.append(GpuSpec(address, rom))
    return gpus


def _vfs(value: Any, problems: _Problems) -> list[VfSpec]:
    vfs = []
    for i, entry in enumerate(_list(value, "vfs", problems)):
        data = entry if isinstance(entry, dict) else {"address": entry}
        unknown = set(data) - {"address", "vgpu_type"}
        if unknown:
            problems.add(f"vfs[{i}]: unknown keys {', '.join(sorted(unknown))} (known: address, vgpu_type)")
        address = _address(data.get("address"), f"vfs[{i}]", problems)
        vtype = data.get("vgpu_type")
        vgpu_type = None if vtype is None else _int(vtype, f"vfs[{i}].vgpu_type", problems, 1)
        if address:
            vfs.append(VfSpec(address, vgpu_type))
    return vfs


def default_mdev_uuid(vm: str, index: int) -> str:
    """The UUID of a VM's n-th mdev when none is given: the same on every run."""
    return str(uuidlib.uuid5(_MDEV_NAMESPACE, f"{vm}/{index}"))


def _mdevs(value: Any, vm: str, problems: _Problems) -> list[MdevSpec]:
    mdevs = []
    for i, entry in enumerate(_list(value, "mdevs", problems)):
        if not isinstance(entry, dict):
            problems.add(f"mdevs[{i}] must be a mapping with parent, type and (optionally) uuid")
            continue
        unknown = set(entry) - {"parent", "type", "uuid"}
        if unknown:
            problems.add(f"mdevs[{i}]: unknown keys {', '.join(sorted(unknown))} (known: parent, type, uuid)")
        parent, mtype = entry.get("parent"), entry.get("type")
        if not parent or not mtype:
            problems.add(f"mdevs[{i}] needs a parent (PCI address or name) and a type (e.g. nvidia-474)")
            continue
        parent = str(parent)
        try:
            parent = normalize_address(parent)
        except PciAddressError:
            pass  # a non-PCI parent (the mtty sample) is named by its device name
        raw = entry.get("uuid")
        if raw is None:
            uuid = default_mdev_uuid(vm, i)
        else:
            try:
                uuid = str(uuidlib.UUID(str(raw)))
            except ValueError:
                problems.add(f"mdevs[{i}].uuid {raw!r} is not a UUID")
                continue
        mdevs.append(MdevSpec(parent, str(mtype), uuid))
    return mdevs


def _disk(value: Any, problems: _Problems) -> DiskSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.add("disk must be a mapping (base, size_gib, path)")
        return None
    unknown = set(value) - {"base", "size_gib", "path"}
    if unknown:
        problems.add(f"disk: unknown keys {', '.join(sorted(unknown))} (known: base, size_gib, path)")
    base = _path(value["base"], "disk.base", problems) if value.get("base") else None
    path = _path(value["path"], "disk.path", problems) if value.get("path") else None
    size = _int(value["size_gib"], "disk.size_gib", problems, 1) if value.get("size_gib") is not None else None
    if base is None and path is None:
        problems.add("disk needs a base image (disk.base) or an existing disk (disk.path)")
    return DiskSpec(base, size, path)


def _cloud_init(value: Any, problems: _Problems) -> CloudInitSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        problems.add("cloud_init must be a mapping (user, ssh_authorized_keys, hostname, packages)")
        return None
    unknown = set(value) - {"user", "ssh_authorized_keys", "hostname", "packages"}
    if unknown:
        known = "user, ssh_authorized_keys, hostname, packages"
        problems.add(f"cloud_init: unknown keys {', '.join(sorted(unknown))} (known: {known})")
    user = str(value.get("user") or _DEFAULT_USER)
    if not re.match(r"^[a-z_][a-z0-9_-]{0,31}$", user):
        problems.add(f"cloud_init.user {user!r} is not a valid user name")
    keys = [str(k).strip() for k in _list(value.get("ssh_authorized_keys"), "cloud_init.ssh_authorized_keys", problems)]
    hostname = value.get("hostname")
    if hostname is not None and not re.match(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$", str(hostname)):
        problems.add(f"cloud_init.hostname {hostname!r} is not a host name")
    packages = [str(p) for p in _list(value.get("packages"), "cloud_init.packages", problems)]
    return CloudInitSpec(user, keys, None if hostname is None else str(hostname), packages)


def _boot(value: Any, problems: _Problems) -> BootSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not value.get("kernel"):
        problems.add("boot must be a mapping with kernel (and optionally initrd, cmdline)")
        return None
    unknown = set(value) - {"kernel", "initrd", "cmdline"}
    if unknown:
        problems.add(f"boot: unknown keys {', '.join(sorted(unknown))} (known: kernel, initrd, cmdline)")
    kernel = _path(value["kernel"], "boot.kernel", problems)
    initrd = _path(value["initrd"], "boot.initrd", problems) if value.get("initrd") else None
    cmdline = None if value.get("cmdline") is None else str(value["cmdline"])
    return BootSpec(kernel or "", initrd, cmdline)


def parse_vm(data: Any, index: int = 0) -> tuple[VmSpec | None, list[Refusal]]:
    """One entry of the VM list -> a :class:`VmSpec`, or the problems that stop it."""
    if not isinstance(data, dict):
        return None, [Refusal(f"VM list entry {index} must be a mapping, not {type(data).__name__}")]
    name = str(data.get("name") or "")
    problems = _Problems(name or f"#{index}")
    if not _NAME_RE.match(name):
        problems.add(
            "needs a name of letters, digits and _.+- (at most 63)",
            "give each VM a unique name: it is the libvirt domain's",
        )
    unknown = sorted(set(data) - set(VM_KEYS))
    if unknown:
        problems.add(f"unknown keys {', '.join(unknown)}", f"known keys: {', '.join(VM_KEYS)}")
    spec = VmSpec(name=name)
    if data.get("state") is not None:
        spec.state = _choice(data["state"], "state", STATES, problems)
    if "memory_mib" in data:
        spec.memory_mib = _int(data["memory_mib"], "memory_mib", problems, 64) or spec.memory_mib
    if "vcpus" in data:
        spec.vcpus = _int(data["vcpus"], "vcpus", problems, 1) or spec.vcpus
    if data.get("firmware") is not None:
        spec.firmware = _choice(data["firmware"], "firmware", FIRMWARES, problems) or spec.firmware
    if data.get("accel") is not None:
        spec.accel = _choice(data["accel"], "accel", ACCELS, problems) or spec.accel
    if data.get("machine") is not None:
        spec.machine = str(data["machine"])
        if not spec.machine.startswith(("q35", "pc-q35")):
            problems.add(f"machine {spec.machine!r} is not a q35 machine type", "GPUs need PCIe: use q35")
    spec.gpus = _gpus(data.get("gpus"), problems)
    spec.vfs = _vfs(data.get("vfs"), problems)
    spec.mdevs = _mdevs(data.get("mdevs"), name, problems)
    if data.get("numa_node") is not None:
        spec.numa_node = _int(data["numa_node"], "numa_node", problems)
    if data.get("cpuset") is not None:
        cpus = parse_cpulist(str(data["cpuset"])) if not isinstance(data["cpuset"], list) else data["cpuset"]
        try:
            spec.cpuset = [int(c) for c in cpus]
        except (TypeError, ValueError):
            problems.add(f"cpuset {data['cpuset']!r} is not a CPU list (e.g. '8-15' or [8, 9])")
        if spec.cpuset is not None and len(spec.cpuset) != spec.vcpus:
            problems.add(f"cpuset names {len(spec.cpuset)} CPUs for {spec.vcpus} vCPUs: give one host CPU per vCPU")
    if data.get("pin") is not None:
        pin = _bool(data["pin"], "pin", problems)
        spec.pin = spec.pin if pin is None else pin
    if data.get("hugepages") is not None:
        raw = data["hugepages"]
        if isinstance(raw, bool):
            spec.hugepages = "yes" if raw else "no"
        else:
            spec.hugepages = _choice(raw, "hugepages", ("auto", "yes", "no", "true", "false"), problems) or "auto"
            spec.hugepages = {"true": "yes", "false": "no"}.get(spec.hugepages, spec.hugepages)
    if data.get("hide_kvm") is not None:
        spec.hide_kvm = _bool(data["hide_kvm"], "hide_kvm", problems)
    if data.get("vendor_id") is not None:
        spec.vendor_id = str(data["vendor_id"])
        if not _VENDOR_ID_RE.match(spec.vendor_id):
            problems.add(f"vendor_id {spec.vendor_id!r} must be 1 to 12 letters or digits")
    if "network" in data:
        spec.network = None if data["network"] in (None, "") else str(data["network"])
    if data.get("mac") is not None:
        spec.mac = str(data["mac"]).lower()
        if not _MAC_RE.match(spec.mac):
            problems.add(f"mac {data['mac']!r} is not a MAC address (52:54:00:xx:xx:xx)")
    spec.disk = _disk(data.get("disk"), problems)
    spec.cloud_init = _cloud_init(data.get("cloud_init"), problems)
    spec.boot = _boot(data.get("boot"), problems)
    if data.get("autostart") is not None:
        autostart = _bool(data["autostart"], "autostart", problems)
        spec.autostart = bool(autostart)
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
        if len(by_type) > 1 and _parent_vendor(facts, parent_name) == NVIDIA and not settings.mixed_vgpu_types:
            parts = "; ".join(f"{t} for {', '.join(w)}" for t, w in sorted(by_type.items()))
            plan.refusals.append(
                Refusal(
                    f"mixed vGPU types on {parent_name} ({parts}): all vGPUs of an NVIDIA GPU share one type",
                    "give every vGPU on this GPU the same type, or put the other type on another GPU "
                    "(or enable the driver's mixed-size mode and set mixed_vgpu_types)",
                    parent_name,
                )
            )


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
    by_pf: dict[str, dict[int, list[str]]] = {}
    for addr, state in facts.vgpu_vfs.items():
        dev = facts.pci.get(addr)
        if dev is None or dev.physfn is None:
            continue
        vtype = wanted.get(addr, state.current_type or None)
        if vtype:
            by_pf.setdefault(dev.physfn, {}).setdefault(vtype, []).append(addr)
    for pf, by_type in sorted(by_pf.items()):
        if len(by_type) > 1 and not settings.mixed_vgpu_types:
            parts = "; ".join(f"type {t} on {', '.join(sorted(a))}" for t, a in sorted(by_type.items()))
            plan.refusals.append(
                Refusal(
                    f"mixed vGPU types on {pf} ({parts}): all vGPUs of an NVIDIA GPU share one type",
                    "give every VF of this GPU the same vgpu_type (or enable mixed-size mode and set mixed_vgpu_types)",
                    pf,
                )
            )


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


def _place(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, settings: HostSettings) -> None:
    node_cpus = {n.node: parse_cpulist(n.cpulist) for n in facts.numa}
    all_cpus = sorted({c for cpus in node_cpus.values() for c in cpus})
    reserved = set(parse_cpulist(settings.reserved_cpus))
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


def _check_totals(facts: HostFacts, vms: list[VmSpec], plan: HostPlan, settings: HostSettings) -> None:
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
    reserved_cpus = [c for c in parse_cpulist(settings.reserved_cpus) if c in cpus]
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


def plan_host(facts: HostFacts, vm_list: list[Any], settings: HostSettings | None = None) -> HostPlan:
    """Check a host's whole VM list against its facts; place every VM. Pure."""
    settings = settings or HostSettings()
    plan = HostPlan()
    if not isinstance(vm_list, list):
        plan.refusals.append(Refusal("the VM list must be a list of mappings (one per VM)"))
        return plan
    names: dict[str, int] = {}
    for i, data in enumerate(vm_list):
        spec, problems = parse_vm(data, i)
        plan.refusals.extend(problems)
        if spec is None:
            continue
        if spec.name in names:
            plan.refusals.append(Refusal(f"VM {spec.name} is listed twice", "VM names are libvirt domain names"))
            continue
        names[spec.name] = i
        plan.vms.append(spec)
    active = [v for v in plan.vms if v.state != "absent"]
    _place(facts, active, plan, settings)
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
    _check_totals(facts, active, plan, settings)
    for vm in plan.vms:
        plan.placements.setdefault(vm.name, Placement(node=None, cpus=None, hugepage_kib=None))
    return plan


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


def vm_list_from_document(doc: Any) -> tuple[list[Any], HostSettings, dict[str, Any]]:
    """The VM list, host settings and defaults from a YAML document: a bare list of
    VMs, or a mapping with the role's variables (a host_vars file):
    ``gpu_vms_list``, ``gpu_vms_defaults``, ``gpu_vms_reserved_memory_mib``,
    ``gpu_vms_reserved_cpus``, ``gpu_vms_mixed_vgpu_types``."""
    if isinstance(doc, list):
        return doc, HostSettings(), {}
    if not isinstance(doc, dict) or "gpu_vms_list" not in doc:
        raise ValueError("expected a list of VMs, or a mapping with gpu_vms_list (a host_vars file)")
    defaults = doc.get("gpu_vms_defaults") or {}
    if not isinstance(defaults, dict):
        raise ValueError("gpu_vms_defaults must be a mapping")
    vms = doc.get("gpu_vms_list") or []
    if not isinstance(vms, list):
        raise ValueError("gpu_vms_list must be a list of VMs")
    merged = [merge_defaults(defaults, vm) for vm in vms]
    settings = HostSettings(
        reserved_memory_mib=doc.get("gpu_vms_reserved_memory_mib"),
        reserved_cpus=str(doc.get("gpu_vms_reserved_cpus", "0") or ""),
        mixed_vgpu_types=bool(doc.get("gpu_vms_mixed_vgpu_types", False)),
    )
    return merged, settings, defaults
