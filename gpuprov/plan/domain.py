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
- a qcow2 overlay disk, a cloud-init NoCloud seed (read-only CD-ROM), a virtio
  NIC on a libvirt network, a serial console logged to a file.

Standard library only (``xml.etree.ElementTree``): ships to targets with the
modules. Inputs come from :mod:`gpuprov.plan.vm_spec` (spec + placement); the output is
what ``virt-xml-validate`` accepts for every combination (tests/test_domain.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

DESCRIPTION = "Managed by gpuprov (gpu_vm); edits are overwritten."
DEFAULT_VENDOR_ID = "gpuprov"


@dataclass
class PciPassthrough:
    """One guest slot: the host functions that go on it, the first being function 0."""

    functions: list[str]  # full host PCI addresses, in function order
    rom: str | None = None  # "on" | "off" | path of a ROM file | None


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
    _sub(cpu, "topology", sockets="1", dies="1", cores=str(cfg.vcpus), threads="1")


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
    if cfg.numa_node is not None:
        numatune = _sub(root, "numatune")
        _sub(numatune, "memory", mode="strict", nodeset=str(cfg.numa_node))


def _hostdevs(devices: ET.Element, cfg: DomainConfig) -> None:
    # One pcie-root-port per guest slot; the device sits at slot 0 of the port's bus.
    index = 1
    for slot in cfg.pci:
        _sub(devices, "controller", type="pci", index=str(index), model="pcie-root-port")
        multi = len(slot.functions) > 1
        for guest_fn, host in enumerate(slot.functions):
            hostdev = _sub(devices, "hostdev", mode="subsystem", type="pci", managed="yes")
            source = _sub(hostdev, "source")
            _sub(source, "address", **_pci_address(host))
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
    return root


def to_xml(element: ET.Element) -> str:
    """Indented XML text, as libvirt prints it (two spaces, no declaration)."""
    copy = ET.fromstring(ET.tostring(element))
    ET.indent(copy, space="  ")
    return ET.tostring(copy, encoding="unicode") + "\n"


def domain_xml(cfg: DomainConfig) -> str:
    return to_xml(build_domain(cfg))
