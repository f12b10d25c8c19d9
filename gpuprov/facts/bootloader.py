"""What a boot change depends on (docs/reference/boot-trial.md): which bootloader booted this host
and how it takes a one-shot entry, the default entry's kernel line, the initramfs and what it is
built from, the hardware watchdogs, this boot's id and the trial state gpuprov keeps.

Read through :class:`Sysfs` (captured and staged roots work); nothing here runs a command.
plan/boot_trial.py decides what to change.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass, field

from .boot import BootFacts, grubby_info
from .boot import gather as gather_grub
from .iommu import IommuState, read_iommu
from .pci import PCI_ADDRESS_RE
from .sysfs import Sysfs

GRUB_CFG = "boot/grub/grub.cfg"
GRUB_ENV = "boot/grub/grubenv"
GRUB_CUSTOM = "boot/grub/custom.cfg"
BLS_ENTRIES = "boot/loader/entries"
KERNEL_CMDLINE = "etc/kernel/cmdline"
TRIAL_STATE = "var/lib/gpuprov/boot-trial.json"
TRIAL_UP = "var/lib/gpuprov/trial-up"  # written by TRIAL_UNIT on a trial boot that reached multi-user
TRIAL_UNIT = "etc/systemd/system/gpuprov-trial-up.service"
TRIAL_WANTS = "etc/systemd/system/multi-user.target.d/gpuprov-trial.conf"
# systemd-boot's loader interface (the Boot Loader Interface): variables under its vendor GUID.
LOADER_GUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
EFIVARS = "sys/firmware/efi/efivars"
# Where an ESP is mounted, most usual first (the Boot Loader Specification's $ESP and $BOOT).
ESP_MOUNTS = ("boot/efi", "efi", "boot")
PROXMOX_BOOT_UUIDS = "etc/kernel/proxmox-boot-uuids"
MODULES_LOAD = "etc/modules-load.d/gpuprov-vfio.conf"
INITRAMFS_MODULES = "etc/initramfs-tools/modules"
DRACUT_CONF = "etc/dracut.conf.d/gpuprov-iommu.conf"
TRIAL_HOOK = "etc/initramfs-tools/hooks/gpuprov-trial"
TRIAL_SCRIPT = "etc/initramfs-tools/scripts/init-top/gpuprov-trial"
MAX_STATE = 64 * 1024
# A kernel module's name: what may be written into the trial's initramfs scripts and its kernel line
# (a name read from a host's sysfs is no exception: a broken host's link can hold anything).
MODULE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
TRIAL_ARG = "gpuprov.trial"  # on the trial boot's kernel command line: gpuprov.trial=ID
TRIAL_ENTRY = "gpuprov-trial"  # the trial boot entry's id (GRUB) and file name (BLS, without .conf)


@dataclass
class BlsEntry:
    """A Boot Loader Specification entry (systemd-boot, and GRUB with BLS on RHEL)."""

    name: str  # file name, e.g. 3c1f...-6.1.0-28-amd64.conf
    path: str  # root-relative
    text: str


@dataclass
class BootloaderFacts:
    loader: str  # grub | bls | systemd-boot | unknown
    evidence: str  # how it was told, for messages
    live: bool = True  # the running machine's root (a trial boot needs one)
    kernel_release: str = ""
    boot_id: str = ""
    proc_cmdline: str = ""
    os_family: str = ""  # Debian | RedHat | ... (etc/os-release's ID_LIKE/ID)
    grub_cfg: str | None = None
    grub_custom: str | None = None
    grubenv: dict[str, str] | None = None  # None: no environment block
    boot_fs: tuple[str, str] = ("", "")  # (source, fstype) of the file system holding /boot
    esp: str | None = None  # root-relative mount point holding loader/entries (systemd-boot)
    entries: list[BlsEntry] = field(default_factory=list)
    entry_selected: str | None = None  # systemd-boot: the entry this boot came from (LoaderEntrySelected)
    kernel_cmdline: str | None = None  # /etc/kernel/cmdline (systemd-boot, kernel-install)
    proxmox_boot_tool: bool = False
    tools: set[str] = field(default_factory=set)  # boot tools installed under the root
    initramfs_tool: str | None = None  # initramfs-tools | dracut | None
    initrd: str | None = None  # root-relative path of the running kernel's initramfs
    initrd_mtime: float | None = None
    config_mtimes: dict[str, float] = field(default_factory=dict)  # initramfs inputs gpuprov manages
    watchdogs: list[str] = field(default_factory=list)  # kernel modules of the watchdogs present
    oneshot_pending: bool = False  # gpuprov's trial entry is set as the next boot's, once
    state: dict | None = None  # gpuprov's trial state (TRIAL_STATE), None when absent
    state_problem: str | None = None  # the state file exists but is not what gpuprov writes


@dataclass
class TrialChecks:
    """What the trial boot showed (the module gathers it on the trial boot only)."""

    iommu: IommuState | None = None
    drivers: dict[str, str | None] = field(default_factory=dict)  # expect_vfio address -> driver
    user_check: tuple[int, str] | None = None  # (rc, output tail) of the user's command, None: none given


@dataclass
class BootInputs:
    """Everything the planner reads, gathered by the module (facts, files' text, checks)."""

    boot: BootloaderFacts
    grub: BootFacts | None  # /etc/default/grub and its tools (GRUB hosts)
    cpu_vendor: str | None
    iommu_enabled: bool | None
    files: dict[str, str | None]  # managed files' current text
    present: set[str] = field(default_factory=set)  # root-relative paths that exist (the trial initramfs)
    grubby_info: tuple[int, str, str] | None = None  # BLS hosts: grubby --info=DEFAULT (rc, out, err)
    checks: TrialChecks | None = None  # on the trial boot


TOOLS = {
    "update-grub": ("usr/sbin/update-grub",),
    "grub-reboot": ("usr/sbin/grub-reboot",),
    "grub2-reboot": ("usr/sbin/grub2-reboot", "sbin/grub2-reboot"),
    "grub-editenv": ("usr/bin/grub-editenv",),
    "grub2-editenv": ("usr/bin/grub2-editenv", "bin/grub2-editenv"),
    "grubby": ("usr/sbin/grubby", "sbin/grubby"),
    "bootctl": ("usr/bin/bootctl", "bin/bootctl"),
    "kernel-install": ("usr/bin/kernel-install", "bin/kernel-install"),
    "proxmox-boot-tool": ("usr/sbin/proxmox-boot-tool",),
    "update-initramfs": ("usr/sbin/update-initramfs", "sbin/update-initramfs"),
    "mkinitramfs": ("usr/sbin/mkinitramfs", "sbin/mkinitramfs"),
    "dracut": ("usr/bin/dracut", "bin/dracut", "usr/sbin/dracut"),
}


def efi_string(raw: bytes | None) -> str | None:
    """An EFI variable of the loader interface: 4 attribute bytes, then UTF-16LE text, NUL-ended."""
    if raw is None or len(raw) < 4:
        return None
    return raw[4:].decode("utf-16-le", "replace").split("\0", 1)[0]


def parse_grubenv(text: str) -> dict[str, str]:
    """GRUB's environment block: ``name=value`` lines, ``#`` padding."""
    env = {}
    for line in text.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        env[name] = value
    return env


def boot_filesystem(sysfs: Sysfs) -> tuple[str, str]:
    """(source, fstype) of the mount that holds /boot (or / when /boot is no mount)."""
    found: dict[str, tuple[str, str]] = {}
    for line in (sysfs.read("proc/mounts") or "").splitlines():
        parts = line.split()
        if len(parts) >= 3:
            found[parts[1]] = (parts[0], parts[2])  # the last mount on a point hides the others
    return found.get("/boot") or found.get("/") or ("", "")


def _os_family(sysfs: Sysfs) -> str:
    text = sysfs.read("etc/os-release") or ""
    ids = " ".join(m.group(2) for m in re.finditer(r'^(ID|ID_LIKE)="?([^"\n]*)"?$', text, re.M)).split()
    if any(i in ("debian", "ubuntu") for i in ids):
        return "Debian"
    if any(i in ("rhel", "fedora", "centos") for i in ids):
        return "RedHat"
    return ids[0] if ids else ""


def _read_entries(sysfs: Sysfs, folder: str) -> list[BlsEntry]:
    entries = []
    for name in sorted(sysfs.listdir(folder))[:256]:
        if name.endswith(".conf"):
            text = sysfs.read_bytes(f"{folder}/{name}")
            if text is not None:
                entries.append(BlsEntry(name, f"{folder}/{name}", text[:65536].decode("utf-8", "replace")))
    return entries


def _read_state(sysfs: Sysfs) -> tuple[dict | None, str | None]:
    raw = sysfs.read_bytes(TRIAL_STATE)
    if raw is None:
        return None, None
    try:
        state = json.loads(raw[: MAX_STATE + 1]) if len(raw) <= MAX_STATE else None
    except ValueError:
        state = None
    if not isinstance(state, dict) or not isinstance(state.get("id"), str):
        return None, f"/{TRIAL_STATE} is not a trial record gpuprov wrote"
    return state, None


def detect_loader(sysfs: Sysfs, facts: BootloaderFacts) -> tuple[str, str]:
    """(loader, evidence). The loader interface's variables name the boot loader that ran (set by
    systemd-boot, never by GRUB); else GRUB with BLS entries (grubby's hosts); else GRUB's config."""
    info = efi_string(sysfs.read_bytes(f"{EFIVARS}/LoaderInfo-{LOADER_GUID}"))
    if info and "systemd-boot" in info:
        return "systemd-boot", f"EFI variable LoaderInfo says {info!r}"
    if not sysfs.live and facts.esp and facts.kernel_cmdline is not None and not facts.grub_cfg:
        return "systemd-boot", f"/{facts.esp}/loader/entries and /{KERNEL_CMDLINE}, no GRUB menu"
    if "grubby" in facts.tools and sysfs.listdir(BLS_ENTRIES):
        return "bls", f"grubby and /{BLS_ENTRIES}"
    if facts.grub_cfg is not None:
        return "grub", f"/{GRUB_CFG}"
    if sysfs.exists("etc/default/grub"):  # a staged or image root: GRUB's menu is made at install
        return "grub", "/etc/default/grub (no menu yet)"
    return "unknown", f"no systemd-boot loader variables, no /{GRUB_CFG}, no BLS entries with grubby"


# The initramfs inputs gpuprov writes: the initramfs is owed when it predates one of them.
INITRAMFS_INPUTS = (INITRAMFS_MODULES, TRIAL_HOOK, TRIAL_SCRIPT, DRACUT_CONF)


def gather_bootloader(sysfs: Sysfs, managed: tuple[str, ...] = INITRAMFS_INPUTS) -> BootloaderFacts:
    """The boot facts of ``sysfs``'s root; ``managed``: root-relative initramfs inputs whose
    modification times say whether the initramfs predates them."""
    facts = BootloaderFacts(loader="unknown", evidence="", live=sysfs.live)
    facts.kernel_release = sysfs.read("proc/sys/kernel/osrelease") or ""
    facts.boot_id = sysfs.read("proc/sys/kernel/random/boot_id") or ""
    facts.proc_cmdline = sysfs.read("proc/cmdline") or ""
    facts.os_family = _os_family(sysfs)
    facts.tools = {tool for tool, paths in TOOLS.items() if any(sysfs.exists(p) for p in paths)}
    cfg = sysfs.read_bytes(GRUB_CFG)
    facts.grub_cfg = None if cfg is None else cfg.decode("utf-8", "replace")
    custom = sysfs.read_bytes(GRUB_CUSTOM)
    facts.grub_custom = None if custom is None else custom.decode("utf-8", "replace")
    env = sysfs.read_bytes(GRUB_ENV)
    facts.grubenv = None if env is None else parse_grubenv(env.decode("utf-8", "replace"))
    facts.boot_fs = boot_filesystem(sysfs)
    facts.esp = next((m for m in ESP_MOUNTS if sysfs.listdir(f"{m}/loader/entries")), None)
    facts.kernel_cmdline = sysfs.read(KERNEL_CMDLINE)
    facts.proxmox_boot_tool = sysfs.exists(PROXMOX_BOOT_UUIDS) and "proxmox-boot-tool" in facts.tools
    facts.loader, facts.evidence = detect_loader(sysfs, facts)
    if facts.loader == "systemd-boot" and facts.esp:
        facts.entries = _read_entries(sysfs, f"{facts.esp}/loader/entries")
        facts.entry_selected = efi_string(sysfs.read_bytes(f"{EFIVARS}/LoaderEntrySelected-{LOADER_GUID}"))
    elif facts.loader == "bls":
        facts.entries = _read_entries(sysfs, BLS_ENTRIES)
    if "update-initramfs" in facts.tools:
        facts.initramfs_tool = "initramfs-tools"
        facts.initrd = f"boot/initrd.img-{facts.kernel_release}"
    elif "dracut" in facts.tools:
        facts.initramfs_tool = "dracut"
        facts.initrd = f"boot/initramfs-{facts.kernel_release}.img"
    if facts.initrd:
        facts.initrd_mtime = sysfs.mtime(facts.initrd)
    for rel in managed:
        mtime = sysfs.mtime(rel)
        if mtime is not None:
            facts.config_mtimes[rel] = mtime
    for wdt in sorted(sysfs.listdir("sys/class/watchdog"))[:16]:
        module = sysfs.link_name(f"sys/class/watchdog/{wdt}/device/driver/module")
        if module and MODULE_NAME.match(module) and module not in facts.watchdogs:
            facts.watchdogs.append(module)
    if facts.loader == "systemd-boot":
        oneshot = efi_string(sysfs.read_bytes(f"{EFIVARS}/LoaderEntryOneShot-{LOADER_GUID}"))
        facts.oneshot_pending = oneshot == f"{TRIAL_ENTRY}.conf"
    else:
        facts.oneshot_pending = (facts.grubenv or {}).get("next_entry") == TRIAL_ENTRY
    facts.state, facts.state_problem = _read_state(sysfs)
    return facts


# The files the plan edits, read as text (each bounded by Sysfs).
MANAGED_FILES = (
    MODULES_LOAD,
    *INITRAMFS_INPUTS,
    GRUB_CUSTOM,
    TRIAL_STATE,
    TRIAL_UP,
    TRIAL_UNIT,
    TRIAL_WANTS,
    KERNEL_CMDLINE,
)
TRIAL_CHECK_TIMEOUT = 300


def run_trial_check(argv: list[str]) -> tuple[int, str]:
    """The user's trial check (an argv, no shell), bounded in time; (rc, output tail)."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=TRIAL_CHECK_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, str(exc)
    return r.returncode, (r.stdout + r.stderr)[-2000:]


def gather_boot_inputs(sysfs: Sysfs, expect_vfio: list[str], trial_check: list[str]) -> BootInputs:
    """Everything the boot planner reads. The trial checks are gathered on a trial boot only (its
    marker in /proc/cmdline), the user's command run then, and only on the live root."""
    boot = gather_bootloader(sysfs)
    iommu = read_iommu(sysfs)
    files = {path: sysfs.read_text(path) for path in MANAGED_FILES}
    trial_entry = f"{boot.esp}/loader/entries/{TRIAL_ENTRY}.conf" if boot.esp else f"{BLS_ENTRIES}/{TRIAL_ENTRY}.conf"
    files[trial_entry] = sysfs.read_text(trial_entry)
    inputs = BootInputs(boot=boot, grub=None, cpu_vendor=iommu.cpu_vendor, iommu_enabled=iommu.enabled, files=files)
    if boot.loader == "grub":
        inputs.grub = gather_grub(sysfs, "grub")
    elif boot.loader == "bls" and sysfs.live:
        inputs.grubby_info = grubby_info()
    state = boot.state or {}
    trial_initrd = state.get("trial_initrd")
    if isinstance(trial_initrd, str) and sysfs.exists(trial_initrd):
        inputs.present.add(trial_initrd)
    if f"{TRIAL_ARG}=" in boot.proc_cmdline:
        inputs.checks = TrialChecks(iommu=iommu)
        for address in expect_vfio:  # a malformed address is refused by the planner, never read
            if PCI_ADDRESS_RE.match(address):
                inputs.checks.drivers[address] = sysfs.link_name(f"sys/bus/pci/devices/{address}/driver")
        if trial_check and sysfs.live:
            inputs.checks.user_check = run_trial_check(trial_check)
    return inputs
