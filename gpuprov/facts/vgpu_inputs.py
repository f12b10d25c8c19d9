"""What the vGPU planner reads besides HostFacts: managed file texts, tools present, running domains.

The paths are the ones gpuprov.plan.vgpu manages (docs/reference/inputs.md for the config; the boot
runner is the zipapp the role vgpu_host installs, docs/collection.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from .domains import read_running
from .evidence import MissingEvidence
from .files import read_text
from .host import HostFacts
from .packages import Packages
from .sysfs import Sysfs

STATE_FILE = "etc/gpuprov/vgpu.json"
SCHEDULER_CONF = "etc/modprobe.d/gpuprov-vgpu-scheduler.conf"
BOOT_SERVICE = "gpuprov-vgpu.service"
BOOT_UNIT = f"etc/systemd/system/{BOOT_SERVICE}"
BOOT_WANTS = f"etc/systemd/system/multi-user.target.wants/{BOOT_SERVICE}"
# The boot unit runs this zipapp of the gpuprov package (the role vgpu_host installs it).
BOOT_PYZ = "usr/lib/gpuprov/gpuprov-vgpu.pyz"
# Where earlier versions copied the planner's sources for the boot unit: gone once seen.
OLD_BOOT_LIB = "usr/lib/gpuprov/gpuprov"
MDEVCTL_DIR = "etc/mdevctl.d"
MDEVCTL_RULE = "etc/udev/rules.d/60-mdevctl.rules"  # same name: overrides the packaged rule
PACKAGED_MDEVCTL_RULES = ("usr/lib/udev/rules.d/60-mdevctl.rules", "lib/udev/rules.d/60-mdevctl.rules")
MDEVCTL_PATHS = ("usr/sbin/mdevctl", "usr/bin/mdevctl", "sbin/mdevctl", "bin/mdevctl")
SRIOV_MANAGE = "usr/lib/nvidia/sriov-manage"
NVIDIA_PARAMS = "proc/driver/nvidia/params"


@dataclass
class HostInputs:
    """What the planner reads besides :class:`HostFacts`: file texts, tools, running domains."""

    files: dict[str, str | None] = field(default_factory=dict)  # root-relative path -> text (None: absent)
    mdevctl_defs: dict[str, str] = field(default_factory=dict)  # "parent/uuid" -> definition text
    running: dict[str, str] = field(default_factory=dict)  # mdev UUID or PCI address -> running domain
    missing: MissingEvidence = field(default_factory=dict)  # what of the above could not be read
    tools: list[str] = field(default_factory=list)  # of sriov-manage, mdevctl: those installed
    boot_enabled: bool = False  # the unit's multi-user.target.wants link exists
    nvidia_params: str | None = None  # /proc/driver/nvidia/params (None: the module is not loaded)
    registry_elsewhere: list[str] = field(default_factory=list)  # other modprobe.d files setting RegistryDwords
    mdevctl_rule: tuple[str, str] | None = None  # (path, text) of the packaged udev rule
    mdevctl_path: str | None = None  # where mdevctl is, root-relative
    boot_runner: bool = False  # BOOT_PYZ is installed
    old_boot_files: dict[str, str] = field(default_factory=dict)  # the .py files under OLD_BOOT_LIB
    boot_runner_sha256: str | None = None  # BOOT_PYZ's sha256, when asked for (read_runner_sha256)
    packages: Packages | None = None  # the package manager's word on mdevctl, when asked for


def _mdevctl_rule(sysfs: Sysfs) -> tuple[str, str] | None:
    for path in PACKAGED_MDEVCTL_RULES:
        text = read_text(sysfs, path)
        if text is not None:
            return path, text
    return None


def read_runner_sha256(sysfs: Sysfs) -> str | None:
    """The installed boot runner's sha256 (None: absent)."""
    raw = sysfs.read_bytes(BOOT_PYZ)
    return None if raw is None else hashlib.sha256(raw).hexdigest()


def read_inputs(sysfs: Sysfs, facts: HostFacts) -> HostInputs:
    """Everything besides facts that :func:`plan_vgpu` reads, below the root."""
    inputs = HostInputs()
    for path in (STATE_FILE, SCHEDULER_CONF, BOOT_UNIT, MDEVCTL_RULE):
        inputs.files[path] = read_text(sysfs, path)
    for parent in sysfs.listdir(MDEVCTL_DIR):
        if parent == "scripts.d":
            continue
        for name in sysfs.listdir(f"{MDEVCTL_DIR}/{parent}"):
            text = read_text(sysfs, f"{MDEVCTL_DIR}/{parent}/{name}")
            if text is not None:
                inputs.mdevctl_defs[f"{parent}/{name}"] = text
    inputs.running = read_running(sysfs, inputs.missing)
    if sysfs.exists(SRIOV_MANAGE):
        inputs.tools.append("sriov-manage")
    inputs.mdevctl_path = next((p for p in MDEVCTL_PATHS if sysfs.exists(p)), None)
    if inputs.mdevctl_path:
        inputs.tools.append("mdevctl")
    inputs.boot_enabled = sysfs.exists(BOOT_WANTS)
    inputs.nvidia_params = sysfs.read(NVIDIA_PARAMS)
    for name in sysfs.listdir("etc/modprobe.d"):
        path = f"etc/modprobe.d/{name}"
        if path != SCHEDULER_CONF and name.endswith(".conf"):
            text = sysfs.read(path) or ""
            if any(
                line.split("#", 1)[0].split()[:2] == ["options", "nvidia"] and "NVreg_RegistryDwords" in line
                for line in text.splitlines()
            ):
                inputs.registry_elsewhere.append("/" + path)
    inputs.mdevctl_rule = _mdevctl_rule(sysfs)
    inputs.boot_runner = sysfs.exists(BOOT_PYZ)
    for path in sysfs.walk_files(OLD_BOOT_LIB):
        if not path.endswith(".py"):
            continue  # __pycache__ and the like: Python's, not ours
        text = read_text(sysfs, path)
        if text is not None:
            inputs.old_boot_files[path] = text
    return inputs
