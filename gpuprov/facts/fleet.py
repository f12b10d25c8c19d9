"""What the fleet report reads of a host besides :class:`~gpuprov.facts.host.HostFacts`, to tell
drift (:mod:`gpuprov.plan.drift`): libvirt's domains (defined and running, from its XML files, no
bindings), the kernel's command line as booted and as configured (GRUB's defaults file and its
drop-ins, or ``/etc/kernel/cmdline``), the CDI specs and the NVIDIA driver's version, and MIG
state when a GPU is declared ``use: mig``. All through :class:`Sysfs` (a staged root reads the
same), read each time, never from a cache; MIG's state is nvidia-smi's on the live machine
(:func:`gpuprov.facts.mig.read_mig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .boot import GRUB_DEFAULT, GRUB_DROPINS, MAX_CMDLINE, MAX_DROPIN, MAX_DROPINS
from .containers import CdiSpec, read_cdi_specs
from .domains import RUNNING_DOMAINS, domain_devices
from .driver import read_driver
from .mig import MigFacts
from .sysfs import Sysfs

DEFINED_DOMAINS = "etc/libvirt/qemu"
# systemd-boot's and kernel-install's kernel line, as gpuprov.facts.bootloader.KERNEL_CMDLINE (not
# imported: this module ships with the fleet report's module, bootloader's trial code would too).
KERNEL_CMDLINE = "etc/kernel/cmdline"
# /etc/default/grub is a page or two; a larger one is not read (as plan/host/cmdline.py refuses it).
MAX_GRUB_DEFAULT = 256 * 1024
MAX_DOMAIN_XML = 1 << 20
MAX_DOMAINS = 4096


@dataclass
class Domains:
    """libvirt's QEMU domains by name; ``None`` where the folder exists but cannot be read."""

    defined: set[str] | None = field(default_factory=set)
    running: dict[str, list[str]] | None = field(default_factory=dict)  # name -> PCI addresses and mdev UUIDs


@dataclass
class BootConfig:
    booted: str  # /proc/cmdline
    grub_default: str | None = None  # /etc/default/grub's text
    dropins: dict[str, str] = field(default_factory=dict)  # /etc/default/grub.d/*.cfg, name -> text
    kernel_cmdline: str | None = None  # /etc/kernel/cmdline (systemd-boot, kernel-install)


@dataclass
class FleetFacts:
    domains: Domains
    boot: BootConfig
    cdi: list[CdiSpec]
    driver_version: str | None
    driver_loaded: bool
    mig: MigFacts | None = None  # read only when a GPU is declared use: mig


def _xml_names(names: list[str] | None) -> list[str]:
    return [n[: -len(".xml")] for n in (names or []) if n.endswith(".xml")][:MAX_DOMAINS]


def read_domains(sysfs: Sysfs) -> Domains:
    domains = Domains()
    listed = sysfs.try_listdir(DEFINED_DOMAINS)
    if listed is None and sysfs.exists(DEFINED_DOMAINS):
        domains.defined = None
    else:
        domains.defined = set(_xml_names(listed))
    listed = sysfs.try_listdir(RUNNING_DOMAINS)
    if listed is None and sysfs.exists(RUNNING_DOMAINS):
        domains.running = None
        return domains
    running: dict[str, list[str]] = {}
    for name in _xml_names(listed):
        raw = sysfs.read_bytes(f"{RUNNING_DOMAINS}/{name}.xml")
        running[name] = (
            [] if raw is None or len(raw) > MAX_DOMAIN_XML else domain_devices(raw.decode("utf-8", "replace"))
        )
    domains.running = running
    return domains


def _text(sysfs: Sysfs, rel: str, limit: int) -> str | None:
    raw = sysfs.read_bytes(rel)
    if raw is None or len(raw) > limit:
        return None
    return raw.decode("utf-8", "replace")


def read_boot_config(sysfs: Sysfs) -> BootConfig:
    boot = BootConfig(booted=(sysfs.read("proc/cmdline") or "")[:MAX_CMDLINE])
    boot.grub_default = _text(sysfs, GRUB_DEFAULT, MAX_GRUB_DEFAULT)
    names = [n for n in sysfs.listdir(GRUB_DROPINS) if n.endswith(".cfg")][:MAX_DROPINS]
    boot.dropins = {n: t for n in names if (t := _text(sysfs, f"{GRUB_DROPINS}/{n}", MAX_DROPIN)) is not None}
    kernel = _text(sysfs, KERNEL_CMDLINE, MAX_CMDLINE)
    boot.kernel_cmdline = None if kernel is None else kernel.strip()
    return boot


def _read_mig(sysfs: Sysfs) -> MigFacts:
    from .mig import read_mig  # nvidia-smi's parsers, imported only where a GPU is declared use: mig

    return read_mig(sysfs)


def read_fleet_facts(sysfs: Sysfs, *, mig: bool = False) -> FleetFacts:
    driver = read_driver(sysfs)
    return FleetFacts(
        domains=read_domains(sysfs),
        boot=read_boot_config(sysfs),
        cdi=read_cdi_specs(sysfs),
        driver_version=driver.version,
        driver_loaded=driver.loaded,
        mig=_read_mig(sysfs) if mig else None,
    )
