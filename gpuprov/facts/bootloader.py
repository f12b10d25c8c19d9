"""What a boot change depends on (docs/reference/boot-trial.md): which bootloader booted this host
and how it takes a one-shot entry, the default entry's kernel line, the initramfs and what it is
built from, the hardware watchdogs, this boot's id and the trial state gpuprov keeps.

Read through :class:`Sysfs` (captured and staged roots work); nothing here runs a command.
plan/host/boot_trial.py decides what to change.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass, field

from .boot import BootFacts, grubby_info
from .boot import gather as gather_grub
from .boundedjson import json_depth
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
# GRUB's menu and custom entries (a real grub.cfg is tens of KiB, hundreds with many kernels), its
# environment block (1 KiB as grub-editenv makes it) and the kernel's command line (2 KiB on x86;
# /proc/cmdline of a staged root is a file like any other): read up to these, parsed line by line.
MAX_GRUB_CFG = 4 * 1024 * 1024
MAX_GRUBENV = 64 * 1024
MAX_CMDLINE = 64 * 1024
GRUBENV_SIGNATURE = "# GRUB Environment Block\n"
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
    # root-relative path -> why it was not read (larger than gpuprov reads): "unknown", never guessed
    unreadable: dict[str, str] = field(default_factory=dict)


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


def capped_text(sysfs: Sysfs, rel: str, limit: int, facts: BootloaderFacts) -> str | None:
    """A file's text when at most ``limit`` bytes; a larger one is noted in ``facts.unreadable``
    and read as empty (present, but nothing in it is used)."""
    raw = sysfs.read_bytes(rel)
    if raw is None:
        return None
    if len(raw) > limit:
        facts.unreadable[rel] = f"/{rel} is {len(raw)} bytes, more than the {limit} gpuprov reads"
        return ""
    return raw.decode("utf-8", "replace")


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


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number a trial record holds")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _small_int(text: str) -> int:
    if len(text) > 20:
        raise ValueError("an integer of more than 20 digits")
    return int(text)


# The trial record's fields as gpuprov writes them (plan/host/boot_trial.py _arm, _failed_record):
# name -> (types, the longest text). Fields not listed are dropped, never used.
_STATE_TEXT = 4096
_STATE_FIELDS: dict[str, tuple[tuple[type, ...], int]] = {
    "id": ((str,), 64),
    "status": ((str,), 16),
    "loader": ((str,), 32),
    "armed_boot_id": ((str,), 64),
    "failed_boot_id": ((str,), 64),
    "unconfirmed": ((int,), 0),
    "added": ((list,), 0),
    "args_before": ((str, type(None)), _STATE_TEXT),
    "args_after": ((str, type(None)), _STATE_TEXT),
    "trial_args": ((str, type(None)), _STATE_TEXT),
    "trial_initrd": ((str, type(None)), _STATE_TEXT),
    "watchdog": ((str, type(None)), 64),
    "why": ((str,), _STATE_TEXT),
}
TRIAL_ID = re.compile(r"[0-9a-f]{12}\Z")
STATE_STATUSES = ("armed", "failed")
MAX_STATE_DEPTH = 4  # the record is an object holding one list
MAX_UNCONFIRMED_RECORDED = 1000


def check_state(state: object) -> tuple[dict | None, str | None]:
    """(the trial record with only its known fields, None) when ``state`` has the record's shape,
    else (None, what is wrong). Every field's type and range is checked here, before any is used."""
    if not isinstance(state, dict):
        return None, f"it holds a JSON {type(state).__name__}, not an object"
    out: dict = {}
    for name, (types, longest) in _STATE_FIELDS.items():
        if name not in state:
            continue
        value = state[name]
        if not isinstance(value, types) or isinstance(value, bool):
            return None, f"{name} is a JSON {type(value).__name__}, not {' or '.join(t.__name__ for t in types)}"
        if isinstance(value, str) and (len(value) > longest or "\0" in value):
            return None, f"{name} is longer than {longest} characters or holds a NUL"
        out[name] = value
    for name in ("id", "status"):
        if name not in out:
            return None, f"it has no {name}"
    if not TRIAL_ID.match(out["id"]):
        return None, "its id is not 12 hexadecimal digits"
    if out["status"] not in STATE_STATUSES:
        return None, f"its status is not one of {', '.join(STATE_STATUSES)}"
    unconfirmed = out.get("unconfirmed", 0)
    if not 0 <= unconfirmed <= MAX_UNCONFIRMED_RECORDED:
        return None, f"unconfirmed is not 0 to {MAX_UNCONFIRMED_RECORDED}"
    added = out.get("added", [])
    if len(added) > 256 or not all(isinstance(a, str) and len(a) <= _STATE_TEXT for a in added):
        return None, "added is not a list of at most 256 texts"
    out["added"] = list(added)
    watchdog = out.get("watchdog")
    if watchdog is not None and not MODULE_NAME.match(watchdog):
        return None, "watchdog is not a kernel module name"
    return out, None


def parse_state(raw: bytes) -> tuple[dict | None, str | None]:
    """The trial record from its file's bytes: (record, None) or (None, why it is not one). Size
    and nesting are capped before the JSON is parsed; no number is infinite, NaN or huge."""
    if len(raw) > MAX_STATE:
        return None, f"it is {len(raw)} bytes, more than the {MAX_STATE} of a record"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "it is not UTF-8 text"
    if json_depth(text, MAX_STATE_DEPTH) > MAX_STATE_DEPTH:
        return None, f"it nests deeper than {MAX_STATE_DEPTH} levels"
    try:
        state = json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_small_int)
    except (ValueError, RecursionError) as exc:  # RecursionError: never, the depth is checked above
        return None, f"it is not JSON ({str(exc)[:80]})"
    return check_state(state)


STATE_FIX = (
    f"remove /{TRIAL_STATE} if no trial boot is under way (the default boot entry is never changed "
    "while a trial is open); see docs/reference/boot-trial.md"
)


def _read_state(sysfs: Sysfs) -> tuple[dict | None, str | None]:
    raw = sysfs.read_bytes(TRIAL_STATE)
    if raw is None:
        return None, None
    state, why = parse_state(raw)
    if state is None:
        return None, f"/{TRIAL_STATE} is not a trial record gpuprov wrote: {why}"
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
    facts.proc_cmdline = (sysfs.read("proc/cmdline") or "")[:MAX_CMDLINE]
    facts.os_family = _os_family(sysfs)
    facts.tools = {tool for tool, paths in TOOLS.items() if any(sysfs.exists(p) for p in paths)}
    facts.grub_cfg = capped_text(sysfs, GRUB_CFG, MAX_GRUB_CFG, facts)
    facts.grub_custom = capped_text(sysfs, GRUB_CUSTOM, MAX_GRUB_CFG, facts)
    env = capped_text(sysfs, GRUB_ENV, MAX_GRUBENV, facts)
    facts.grubenv = None if env is None else parse_grubenv(env)
    if env is not None and not env.startswith(GRUBENV_SIGNATURE):
        facts.unreadable[GRUB_ENV] = f"/{GRUB_ENV} does not begin with GRUB's signature ({GRUBENV_SIGNATURE.strip()})"
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


def initramfs_tools(sysfs: Sysfs) -> list[str]:
    """The initramfs tools installed below the root."""
    found = []
    if any(sysfs.exists(p) for p in ("usr/sbin/update-initramfs", "sbin/update-initramfs")):
        found.append("initramfs-tools")
    if any(sysfs.exists(p) for p in ("usr/bin/dracut", "usr/sbin/dracut", "sbin/dracut")):
        found.append("dracut")
    return found
