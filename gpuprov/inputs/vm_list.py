"""One entry of the VM list -> a :class:`~gpuprov.core.vm_spec.VmSpec`, or every problem
that stops it, each named by its field (``gpu_vms_list[2].cpuset``); defaults merged under
entries. The host settings are checked the same way by :mod:`gpuprov.inputs.host_settings`.

The field rules are those of :mod:`gpuprov.inputs.validate` (docs/reference/inputs.md);
:mod:`gpuprov.inputs.boundary` (the input boundary) and
:func:`gpuprov.plan.vm.fit.plan_host` call :func:`parse_vm`. Standard library only.
"""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from ..core.plan import Refusal
from ..core.vm_spec import (
    ACCELS,
    DEFAULT_USER,
    DRAINS,
    FIRMWARES,
    MAX_CLIQUE,
    STATES,
    VM_KEYS,
    BootSpec,
    CloudInitSpec,
    DiskSpec,
    GpuSpec,
    MdevSpec,
    VfSpec,
    VmSpec,
)
from .validate import (
    HOSTNAME_RE,
    MAX_DEVICES,
    MAX_DISK_GIB,
    MAX_KEYS,
    MAX_MEMORY_MIB,
    MAX_NUMA_NODE,
    MAX_PACKAGES,
    MAX_VCPUS,
    MAX_VGPU_TYPE,
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

# A fixed namespace: an mdev without a UUID gets the same one on every run.
_MDEV_NAMESPACE = uuidlib.UUID("6f1c3b52-8c0e-4a52-9d8e-0b7a6d1e2c41")


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


def _nvlink_cliques(value: Any, gpus: list[GpuSpec], f: _Fields) -> list[list[str]]:
    """``nvlink_clique``: true (all the VM's GPUs are one NVLink clique) or a list of cliques,
    each a list of the VM's GPU addresses, a GPU in one clique at most. There is no NVLink
    fact on a host yet: the admin says which GPUs NVLink joins."""
    p = f.problems
    mine = [g.address for g in gpus]
    if not isinstance(value, (bool, list)):
        p.add(
            f.at("nvlink_clique"),
            f"must be true, false or a list of cliques, not {kind(value)}",
            "write true (all the VM's GPUs), or a list of lists of its GPU addresses",
        )
        return []
    if isinstance(value, bool):
        if not value:
            return []
        if len(mine) < 2:
            p.add(f.at("nvlink_clique"), f"joins {len(mine)} GPU", "NVLink joins two GPUs or more: list them in gpus")
            return []
        return [mine]
    cliques: list[list[str]] = []
    seen: set[str] = set()
    for i, group in enumerate(sequence(p, f.at("nvlink_clique"), value, MAX_CLIQUE + 1) or []):
        members: list[str] = []
        for j, raw in enumerate(sequence(p, f.at("nvlink_clique", i), group, MAX_DEVICES) or []):
            address = pci_address(p, f.at("nvlink_clique", i, j), raw)
            if address is None:
                continue
            if address not in mine:
                p.add(f.at("nvlink_clique", i, j), f"{address} is not one of the VM's gpus", "list it under gpus")
            elif address in seen:
                p.add(f.at("nvlink_clique", i, j), f"{address} is in two cliques", "put each GPU in one clique")
            else:
                seen.add(address)
                members.append(address)
        if members:
            cliques.append(members)
    return cliques


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
    user = DEFAULT_USER
    if value.get("user") is not None:
        rule = "a Linux user name: lower-case letters, digits, _ and -, at most 32"
        user = (
            text(p, f.at("cloud_init", "user"), value["user"], pattern=USER_RE, rule=rule, what="user name")
            or DEFAULT_USER
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

    Every field meets the rules of :mod:`gpuprov.inputs.validate`; each problem names its
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
    if data.get("nvlink_clique") is not None:
        spec.nvlink_cliques = _nvlink_cliques(data["nvlink_clique"], spec.gpus, f)
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
    if data.get("drain") is not None:
        spec.drain = choice(problems, f.at("drain"), data["drain"], DRAINS) or spec.drain
    return (None if problems.items else spec), problems.items


# ---------------------------------------------------------------- the host plan


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
