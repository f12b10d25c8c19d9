"""libvirt domain XML for a VM with GPUs: built from plain data, no I/O.

What a GPU guest wants, and why:

- q35 with a ``pcie-root-port`` per passed-through device: on a plain PCI bus
  the guest sees no PCIe link and drivers (NVIDIA's above all) lose features
  and bandwidth reports;
- all functions of a GPU (VGA/3D + HD audio, USB, UCSI) on one guest slot as
  one multifunction device: function 0 carries ``multifunction='on'``, as on
  the host, so the guest driver finds its companions where it expects them;
- ``managed='yes'``: libvirt detaches the device from its host driver when the
  VM starts and gives it back when it stops (role vfio_host binds at boot);
- ROM BAR on, off or a ROM file (GPUs whose VBIOS the host already ran);
- hidden KVM state and a Hyper-V ``vendor_id`` for consumer GPUs, whose
  older drivers refuse to run in a VM (code 43);
- in-kernel I/O APIC (``ioapic driver='kvm'``) and the local APIC: MSI/MSI-X
  interrupts go straight to the vCPU; no memory balloon (VFIO pins all guest
  memory, a balloon cannot give any back);
- vCPUs pinned one-to-one to host CPUs of the GPU's NUMA node and memory
  bound to that node (strict), backed by hugepages when reserved;
- mdev vGPUs as ``<hostdev type='mdev' model='vfio-pci'>`` by UUID, SR-IOV
  vGPU VFs as PCI hostdevs, each on its own root port;
- a 64-bit MMIO window for OVMF sized from the GPUs' BARs (:func:`mmio64_window_mib`)
  when OVMF's default is too small: a 128 GiB BAR (H100, H200) does not map in it and
  the guest driver sees no BAR1;
- GPUs on several host NUMA nodes: guest NUMA cells matching the host nodes (vCPUs and
  memory split, each cell's memory bound to its node) and each GPU's root port behind a
  ``pcie-expander-bus`` (QEMU's pxb-pcie) of its cell, so the guest sees which GPU is
  near which CPUs;
- GPUs joined by NVLink: QEMU's ``x-nv-gpudirect-clique`` on their vfio-pci devices
  (libvirt's ``<qemu:override>``, libvirt >= 8.2), so the guest driver allows P2P among them;
- a qcow2 overlay disk, a cloud-init NoCloud seed (read-only CD-ROM), a virtio
  NIC on a libvirt network, a serial console logged to a file.

Standard library only (``xml.etree.ElementTree``): ships to targets with the
modules. Inputs come from :mod:`gpuprov.core.vm_spec` (spec + placement); the output is
what ``virt-xml-validate`` accepts for every combination (tests/plan/test_domain.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

DESCRIPTION = "Managed by gpuprov (gpu_vm); edits are overwritten."
DEFAULT_VENDOR_ID = "gpuprov"
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
ET.register_namespace("qemu", QEMU_NS)
# OVMF's 64-bit PCI MMIO window when not told otherwise (OvmfPkg PlatformPei: 32 GiB).
OVMF_DEFAULT_MMIO64_MIB = 32 * 1024
# pxb-pcie bus numbers: cell i's expander bus is 0x80 + 0x10 * i, leaving the buses
# below 0x80 to pcie-root's ports and 15 bus numbers to each expander's root ports.
PXB_FIRST_BUS = 0x80
PXB_BUS_STRIDE = 0x10
MAX_CELLS = 8  # 0x80 + 0x10 * 7 = 0xf0: the last expander bus still has 15 bus numbers


@dataclass
class PciPassthrough:
    """One guest slot: the host functions that go on it, the first being function 0."""

    functions: list[str]  # full host PCI addresses, in function order
    rom: str | None = None  # "on" | "off" | path of a ROM file | None
    numa_cell: int | None = None  # guest NUMA cell whose pcie-expander-bus it sits behind
    clique: int | None = None  # NVLink clique of function 0 (x-nv-gpudirect-clique)


@dataclass
class NumaCell:
    """One guest NUMA cell: its vCPUs and memory, bound to one host node."""

    host_node: int
    vcpus: list[int]  # guest vCPU numbers
    memory_kib: int


@dataclass
class DomainConfig:
    name: str
    memory_kib: int
    vcpus: int
    domain_type: str = "kvm"  # kvm | qemu (TCG)
    machine: str = "q35"
    firmware: str = "efi"  # efi | bios
    pci: list[PciPassthrough] = field(default_factory=list)
    mdevs: list[str] = field(default_factory=list)  # UUIDs
    cpus: list[int] | None = None  # host CPU of each vCPU (pinned)
    numa_node: int | None = None  # memory bound to this host node
    numa_cells: list[NumaCell] = field(default_factory=list)  # guest NUMA; empty: none (numa_node)
    mmio64_mib: int | None = None  # OVMF's 64-bit MMIO window; None: OVMF's default
    hugepage_kib: int | None = None
    hide_kvm: bool = False
    vendor_id: str | None = None
    disk: str | None = None  # the overlay (qcow2)
    seed: str | None = None  # the cloud-init NoCloud ISO
    network: str | None = None
    mac: str | None = None
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None
    serial_log: str | None = None
    uuid: str | None = None  # set when redefining an existing domain


def mmio64_window_mib(bar_sizes: list[int]) -> int:
    """The guest's 64-bit MMIO window (MiB) for 64-bit prefetchable BARs of these sizes (bytes).

    The rule (docs/reference/vm-domain.md): place the BARs largest first, each aligned to its
    own size (BARs are powers of two, so this packs them without gaps); add a quarter for
    headroom (the guest's other 64-bit BARs, each root port's and expander bus's window aligned
    to its largest BAR) and round up to a power of two, at least 1 MiB. One 128 GiB GPU: 256 GiB;
    four: 1 TiB.
    """
    span = 0
    for size in sorted(bar_sizes, reverse=True):
        span = -(-span // size) * size + size  # aligned to its size, then placed
    mib = max(1, -(-(span + span // 4) // (1 << 20)))
    return 1 << (mib - 1).bit_length()


def _pci_address(address: str) -> dict[str, str]:
    """``0000:41:00.1`` -> libvirt's address attributes, in libvirt's own format."""
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    return {
        "domain": f"0x{int(domain, 16):04x}",
        "bus": f"0x{int(bus, 16):02x}",
        "slot": f"0x{int(slot, 16):02x}",
        "function": f"0x{int(function, 16):x}",
    }


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, {k.rstrip("_"): v for k, v in attrs.items()})
    if text is not None:
        el.text = text
    return el


def _cpulist(cpus: list[int]) -> str:
    return ",".join(str(c) for c in cpus)


def _os(root: ET.Element, cfg: DomainConfig) -> None:
    attrs = {"firmware": "efi"} if cfg.firmware == "efi" else {}
    os_el = _sub(root, "os", **attrs)
    _sub(os_el, "type", "hvm", arch="x86_64", machine=cfg.machine)
    if cfg.firmware == "efi":
        # No Secure Boot: unsigned guest GPU drivers (and mdev guest drivers) must load.
        fw = _sub(os_el, "firmware")
        _sub(fw, "feature", enabled="no", name="secure-boot")
    if cfg.kernel:
        _sub(os_el, "kernel", cfg.kernel)
        if cfg.initrd:
            _sub(os_el, "initrd", cfg.initrd)
        if cfg.cmdline:
            _sub(os_el, "cmdline", cfg.cmdline)
    else:
        _sub(os_el, "boot", dev="hd")


def _features(root: ET.Element, cfg: DomainConfig) -> None:
    features = _sub(root, "features")
    _sub(features, "acpi")
    _sub(features, "apic")
    if cfg.hide_kvm:
        hyperv = _sub(features, "hyperv", mode="custom")
        _sub(hyperv, "vendor_id", state="on", value=cfg.vendor_id or DEFAULT_VENDOR_ID)
        kvm = _sub(features, "kvm")
        _sub(kvm, "hidden", state="on")
    # The in-kernel I/O APIC (KVM); TCG has only QEMU's.
    _sub(features, "ioapic", driver="kvm" if cfg.domain_type == "kvm" else "qemu")


def _cpu(root: ET.Element, cfg: DomainConfig) -> None:
    if cfg.domain_type == "kvm":
        cpu = _sub(root, "cpu", mode="host-passthrough", check="none", migratable="off")
    else:
        cpu = _sub(root, "cpu")  # TCG: QEMU's default model; host-passthrough needs KVM
    cells = cfg.numa_cells
    # One socket per cell when the vCPUs split evenly: a socket split across nodes confuses guests.
    sockets = len(cells) if cells and cfg.vcpus % len(cells) == 0 else 1
    _sub(cpu, "topology", sockets=str(sockets), dies="1", cores=str(cfg.vcpus // sockets), threads="1")
    if cells:
        numa = _sub(cpu, "numa")
        for i, cell in enumerate(cells):
            _sub(numa, "cell", id=str(i), cpus=_cpulist(cell.vcpus), memory=str(cell.memory_kib), unit="KiB")


def _tuning(root: ET.Element, cfg: DomainConfig) -> None:
    if cfg.hugepage_kib:
        backing = _sub(root, "memoryBacking")
        pages = _sub(backing, "hugepages")
        _sub(pages, "page", size=str(cfg.hugepage_kib), unit="KiB")
    _sub(root, "vcpu", str(cfg.vcpus), placement="static")
    if cfg.cpus:
        tune = _sub(root, "cputune")
        for vcpu, host_cpu in enumerate(cfg.cpus):
            _sub(tune, "vcpupin", vcpu=str(vcpu), cpuset=str(host_cpu))
        # QEMU's own threads (I/O, emulator) on the same CPUs: they stay on the node.
        _sub(tune, "emulatorpin", cpuset=_cpulist(sorted(set(cfg.cpus))))
    if cfg.numa_cells:
        numatune = _sub(root, "numatune")
        nodes = sorted({c.host_node for c in cfg.numa_cells})
        _sub(numatune, "memory", mode="strict", nodeset=_cpulist(nodes))
        for i, cell in enumerate(cfg.numa_cells):
            _sub(numatune, "memnode", cellid=str(i), mode="strict", nodeset=str(cell.host_node))
    elif cfg.numa_node is not None:
        numatune = _sub(root, "numatune")
        _sub(numatune, "memory", mode="strict", nodeset=str(cfg.numa_node))


def clique_alias(slot_number: int) -> str:
    """The user alias (``ua-``) of a GPU's hostdev, which ``<qemu:override>`` names."""
    return f"ua-gpu{slot_number}"


def _expander_buses(devices: ET.Element, cfg: DomainConfig) -> tuple[dict[int, int], int]:
    """A pcie-expander-bus per guest cell with a GPU on it -> (cell -> controller index, next index).
    Expanders come first: a controller's index is above that of the bus it plugs into."""
    index = 1
    expanders: dict[int, int] = {}
    for cell in sorted({s.numa_cell for s in cfg.pci if s.numa_cell is not None}):
        pxb = _sub(devices, "controller", type="pci", index=str(index), model="pcie-expander-bus")
        _sub(pxb, "model", name="pxb-pcie")
        target = _sub(pxb, "target", busNr=str(PXB_FIRST_BUS + PXB_BUS_STRIDE * cell))
        _sub(target, "node", str(cell))
        expanders[cell] = index
        index += 1
    return expanders, index


def _hostdevs(devices: ET.Element, cfg: DomainConfig) -> None:
    # One pcie-root-port per guest slot; the device sits at slot 0 of the port's bus. A
    # port of a GPU in a guest cell plugs into that cell's expander bus, one slot each.
    expanders, index = _expander_buses(devices, cfg)
    expander_slots: dict[int, int] = {}
    for slot_number, slot in enumerate(cfg.pci):
        port = _sub(devices, "controller", type="pci", index=str(index), model="pcie-root-port")
        if slot.numa_cell is not None:
            bus = expanders[slot.numa_cell]
            taken = expander_slots.get(bus, 0)
            expander_slots[bus] = taken + 1
            _sub(
                port, "address", type="pci", domain="0x0000", bus=f"0x{bus:02x}", slot=f"0x{taken:02x}", function="0x0"
            )
        multi = len(slot.functions) > 1
        for guest_fn, host in enumerate(slot.functions):
            hostdev = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
            source = _sub(hostdev, "source")
            _sub(source, "address", **_pci_address(host))
            if guest_fn == 0 and slot.clique is not None:
                _sub(hostdev, "alias", name=clique_alias(slot_number))
            if guest_fn == 0 and slot.rom is not None:
                if slot.rom in ("on", "off"):
                    _sub(hostdev, "rom", bar=slot.rom)
                else:
                    _sub(hostdev, "rom", file=slot.rom)
            guest = {
                "type": "pci",
                "domain": "0x0000",
                "bus": f"0x{index:02x}",
                "slot": "0x00",
                "function": f"0x{guest_fn:x}",
            }
            if multi and guest_fn == 0:
                guest["multifunction"] = "on"
            _sub(hostdev, "address", **guest)
        index += 1
    for uuid in cfg.mdevs:
        _sub(devices, "controller", type="pci", index=str(index), model="pcie-root-port")
        hostdev = _sub(devices, "hostdev", mode="subsystem", type="mdev", model="vfio-pci", display="off")
        source = _sub(hostdev, "source")
        _sub(source, "address", uuid=uuid)
        _sub(hostdev, "address", type="pci", domain="0x0000", bus=f"0x{index:02x}", slot="0x00", function="0x0")
        index += 1


def _storage_and_nic(devices: ET.Element, cfg: DomainConfig) -> None:
    if cfg.disk:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
        _sub(disk, "source", file=cfg.disk)
        _sub(disk, "target", dev="vda", bus="virtio")
    if cfg.seed:
        cdrom = _sub(devices, "disk", type="file", device="cdrom")
        _sub(cdrom, "driver", name="qemu", type="raw")
        _sub(cdrom, "source", file=cfg.seed)
        _sub(cdrom, "target", dev="sda", bus="sata")
        _sub(cdrom, "readonly")
    if cfg.network:
        nic = _sub(devices, "interface", type="network")
        if cfg.mac:
            _sub(nic, "mac", address=cfg.mac)
        _sub(nic, "source", network=cfg.network)
        _sub(nic, "model", type="virtio")


def _qemu_extras(root: ET.Element, cfg: DomainConfig) -> None:
    """QEMU options libvirt has no element for, in libvirt's qemu namespace."""
    if cfg.firmware == "efi" and cfg.mmio64_mib is not None and cfg.mmio64_mib > OVMF_DEFAULT_MMIO64_MIB:
        # OVMF reads the window's size from fw_cfg (OvmfPkg: opt/ovmf/X-PciMmio64Mb); SeaBIOS has no such knob.
        cmdline = _sub(root, f"{{{QEMU_NS}}}commandline")
        _sub(cmdline, f"{{{QEMU_NS}}}arg", value="-fw_cfg")
        _sub(cmdline, f"{{{QEMU_NS}}}arg", value=f"name=opt/ovmf/X-PciMmio64Mb,string={cfg.mmio64_mib}")
    cliques = [(n, s.clique) for n, s in enumerate(cfg.pci) if s.clique is not None]
    if cliques:
        override = _sub(root, f"{{{QEMU_NS}}}override")
        for slot_number, clique in cliques:
            device = _sub(override, f"{{{QEMU_NS}}}device", alias=clique_alias(slot_number))
            frontend = _sub(device, f"{{{QEMU_NS}}}frontend")
            _sub(frontend, f"{{{QEMU_NS}}}property", name="x-nv-gpudirect-clique", type="unsigned", value=str(clique))


def build_domain(cfg: DomainConfig) -> ET.Element:
    """The ``<domain>`` element for ``cfg``."""
    root = ET.Element("domain", {"type": cfg.domain_type})
    _sub(root, "name", cfg.name)
    if cfg.uuid:
        _sub(root, "uuid", cfg.uuid)
    _sub(root, "description", DESCRIPTION)
    _sub(root, "memory", str(cfg.memory_kib), unit="KiB")
    _tuning(root, cfg)
    _os(root, cfg)
    _features(root, cfg)
    _cpu(root, cfg)
    clock = _sub(root, "clock", offset="utc")
    _sub(clock, "timer", name="rtc", tickpolicy="catchup")
    _sub(clock, "timer", name="pit", tickpolicy="delay")
    _sub(clock, "timer", name="hpet", present="no")
    _sub(root, "on_poweroff", "destroy")
    _sub(root, "on_reboot", "restart")
    _sub(root, "on_crash", "destroy")
    devices = _sub(root, "devices")
    _hostdevs(devices, cfg)
    _storage_and_nic(devices, cfg)
    serial = _sub(devices, "serial", type="pty")
    if cfg.serial_log:
        _sub(serial, "log", file=cfg.serial_log, append="off")
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")
    _sub(devices, "memballoon", model="none" if (cfg.pci or cfg.mdevs) else "virtio")
    _qemu_extras(root, cfg)
    return root


def to_xml(element: ET.Element) -> str:
    """Indented XML text, as libvirt prints it (two spaces, no declaration)."""
    copy = ET.fromstring(ET.tostring(element))
    ET.indent(copy, space="  ")
    return ET.tostring(copy, encoding="unicode") + "\n"


def domain_xml(cfg: DomainConfig) -> str:
    return to_xml(build_domain(cfg))
