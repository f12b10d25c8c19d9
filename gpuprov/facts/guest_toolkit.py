"""What the container toolkit of a GPU guest stands on: the engines (Docker, containerd, Podman)
and their configuration, the toolkit's packages, the CDI specs, NVIDIA's repository files and
the offline repository the role writes, and when each running engine started (a configuration
written after that is not in force yet). With :mod:`gpuprov.facts.driver_install` (the
distribution, dpkg's status file) these are the facts :mod:`gpuprov.plan.guest.toolkit` plans
from; everything through :class:`Sysfs`, so a staged root works the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .containers import (
    DAEMON_JSON,
    SYSTEMD_RUNNING,
    CdiSpec,
    ContainerdConfig,
    DockerConfig,
    Toolkit,
    find_binary,
    read_cdi_specs,
    read_containerd_config,
    read_docker_config,
    read_toolkit,
)
from .debindex import PackageSet, installed_set
from .driver import DriverInfo, read_driver
from .driver_install import DISPLAY_CLASS, NVIDIA, GuestOs, read_os
from .files import file_state
from .gpus import GpuList
from .packages import DPKG_STATUS, dpkg_installed
from .pci import PciDevice, read_pci_devices
from .proc import boot_time, process_started
from .sysfs import Sysfs

APT_SOURCE = "etc/apt/sources.list.d/nvidia-container-toolkit.sources"
DNF_REPO = "etc/yum.repos.d/nvidia-container-toolkit.repo"
OFFLINE_SOURCE = "etc/apt/sources.list.d/gpuprov-offline.list"
OFFLINE_INDEX = "Packages"  # in the offline directory on the guest
RUNTIME_CONFIG = "etc/nvidia-container-runtime/config.toml"  # the nvidia runtime's mode (cdi, legacy, auto)
CDI_REFRESH_UNIT = "nvidia-cdi-refresh.path"  # the base package's: regenerates the spec on a driver change
_UNIT_DIRS = ("lib/systemd/system", "usr/lib/systemd/system", "etc/systemd/system")
DOCKER_PIDFILES = ("run/docker.pid", "var/run/docker.pid")
# The engines' processes, by /proc/<pid>/comm (containerd has no pid file by default).
ENGINE_COMMS = {"docker": "dockerd", "containerd": "containerd"}
DOCKERS_CONTAINERD = "/var/run/docker/containerd/"
_PROC_SCAN_LIMIT = 4096  # processes looked at for an engine without a pid file


@dataclass
class ManagedFile:
    """A file the role writes, as it is now (None: absent)."""

    path: str  # root-relative
    data: bytes | None = None
    mode: int | None = None

    @property
    def text(self) -> str | None:
        return None if self.data is None else self.data.decode("utf-8", "replace")


@dataclass
class Engine:
    """A container engine: its binary, whether it runs, and whether its configuration is newer."""

    name: str  # docker | containerd | podman
    binary: str | None
    started: float | None = None  # the running process's start (epoch seconds); None: not running or unknown
    config_written: float | None = None  # the newest of its configuration files' mtimes

    @property
    def config_newer_than_process(self) -> bool:
        return self.started is not None and self.config_written is not None and self.config_written > self.started


@dataclass
class GuestToolkitFacts:
    os: GuestOs
    architecture: str | None  # the package architecture: amd64, arm64 ...
    driver: DriverInfo
    pci_gpus: dict[str, PciDevice]
    docker: DockerConfig
    containerd: ContainerdConfig
    toolkit: Toolkit
    cdi: list[CdiSpec]
    engines: dict[str, Engine]
    # name -> version of the installed packages (dpkg's status file, or rpm's answer); None: unknown.
    packages: dict[str, str] | None
    files: dict[str, ManagedFile] = field(default_factory=dict)  # root-relative path -> its state
    offline_files: dict[str, int] = field(default_factory=dict)  # package files in the offline directory -> size
    gpu_list: GpuList | None = None  # the driver's answer (NVML, nvidia-smi), when it was asked
    dpkg: PackageSet | None = None  # dpkg's status with what each package provides (None: no dpkg)
    systemd: bool = False  # booted with systemd (its units start and restart the engines)
    start_stop_daemon: str | None = None  # dpkg's start-stop-daemon: how an engine starts without systemd
    iptables: str | None = None  # no iptables: Docker runs without its netfilter rules and bridge
    runtime_mode: str | None = None  # the nvidia runtime's mode in its config.toml (None: no file or no key)
    cdi_refresh_unit: str | None = None  # the unit file of nvidia-cdi-refresh.path, when installed
    cdi_refresh_enabled: bool | None = None  # systemctl's word on it (None: not asked)
    docker_running: int | None = None  # containers the running engine runs (None: no engine answered)
    docker_live_restore: bool = False
    docker_engine_runtimes: list[str] | None = None  # what the running engine has in force (None: not asked)
    live: bool = True  # the running guest (a staged root has no processes: nothing is started there)


def _mtime(sysfs: Sysfs, rel: str) -> float | None:
    try:
        return os.stat(sysfs.path(rel)).st_mtime
    except OSError:
        return None


def _engine_pid(sysfs: Sysfs, name: str) -> str | None:
    if name == "docker":
        for rel in DOCKER_PIDFILES:
            pid = (sysfs.read(rel) or "").strip()
            if pid.isdigit() and sysfs.read(f"proc/{pid}/comm") == ENGINE_COMMS[name]:
                return pid
    comm = ENGINE_COMMS.get(name)
    if comm is None:
        return None
    pids = [p for p in sysfs.listdir("proc") if p.isdigit()][:_PROC_SCAN_LIMIT]
    for pid in pids:
        if sysfs.read(f"proc/{pid}/comm") != comm:
            continue
        # Docker's own containerd (started by dockerd, its config under /var/run/docker) is not the service.
        if name == "containerd" and DOCKERS_CONTAINERD in (sysfs.read(f"proc/{pid}/cmdline") or ""):
            continue
        return pid
    return None


def read_engines(sysfs: Sysfs, docker: DockerConfig, containerd: ContainerdConfig) -> dict[str, Engine]:
    boot = boot_time(sysfs)
    configs = {
        "docker": [DAEMON_JSON] if docker.daemon_json else [],
        "containerd": [f.lstrip("/") for f in containerd.files],
    }
    engines = {}
    for name, binary in (("docker", "dockerd"), ("containerd", "containerd"), ("podman", "podman")):
        engine = Engine(name, find_binary(sysfs, binary))
        written = [m for m in (_mtime(sysfs, rel) for rel in configs.get(name, [])) if m is not None]
        engine.config_written = max(written) if written else None
        pid = _engine_pid(sysfs, name) if boot is not None and engine.binary else None
        if pid is not None and boot is not None:
            engine.started = process_started(sysfs, pid, boot)
        engines[name] = engine
    return engines


def read_managed(sysfs: Sysfs, rel: str) -> ManagedFile:
    data, mode = file_state(sysfs, rel)
    return ManagedFile(rel, data, mode)


def read_offline_files(sysfs: Sysfs, directory: str, ext: str) -> dict[str, int]:
    out = {}
    for name in sysfs.listdir(directory):
        if name.endswith("." + ext):
            try:
                out[name] = os.stat(sysfs.path(f"{directory}/{name}")).st_size
            except OSError:
                continue
    return out


def runtime_mode(text: str | None) -> str | None:
    """``mode`` under ``[nvidia-container-runtime]`` of the runtime's config.toml (a linear scan)."""
    section = None
    for raw in (text or "").splitlines()[:10000]:
        line = raw.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[] ")
        elif section == "nvidia-container-runtime" and line.replace(" ", "").startswith("mode="):
            return line.split("=", 1)[1].strip().strip("\"'") or None
    return None


def read_guest_toolkit(
    sysfs: Sysfs,
    *,
    managed: list[str],
    offline_dir: str | None = None,
    architecture: str | None = None,
    packages: dict[str, str] | None = None,
    gpu_list: GpuList | None = None,
) -> GuestToolkitFacts:
    """``managed``: the root-relative files the plan may write (their state is read);
    ``offline_dir``: the offline directory on the guest, root-relative (None: not used);
    ``packages``: the installed packages when the caller asked the package manager (rpm),
    else dpkg's status file is read."""
    os_ = read_os(sysfs)
    docker, containerd = read_docker_config(sysfs), read_containerd_config(sysfs)
    if packages is None and os_.family == "debian":
        packages = dpkg_installed(sysfs)
    status = sysfs.read(DPKG_STATUS) if os_.family == "debian" else None
    ext = "rpm" if os_.family == "redhat" else "deb"
    unit = next((f"/{d}/{CDI_REFRESH_UNIT}" for d in _UNIT_DIRS if sysfs.exists(f"{d}/{CDI_REFRESH_UNIT}")), None)
    facts = GuestToolkitFacts(
        os=os_,
        architecture=architecture,
        driver=read_driver(sysfs),
        pci_gpus={
            a: d for a, d in read_pci_devices(sysfs).items() if d.vendor_id == NVIDIA and d.base_class == DISPLAY_CLASS
        },
        docker=docker,
        containerd=containerd,
        toolkit=read_toolkit(sysfs),
        cdi=read_cdi_specs(sysfs),
        engines=read_engines(sysfs, docker, containerd),
        packages=packages,
        files={rel: read_managed(sysfs, rel) for rel in managed},
        offline_files=read_offline_files(sysfs, offline_dir, ext) if offline_dir else {},
        gpu_list=gpu_list,
        dpkg=installed_set(status) if status is not None else None,
        systemd=sysfs.exists(SYSTEMD_RUNNING),
        start_stop_daemon=find_binary(sysfs, "start-stop-daemon"),
        iptables=find_binary(sysfs, "iptables"),
        runtime_mode=runtime_mode(sysfs.read(RUNTIME_CONFIG)),
        cdi_refresh_unit=unit,
        live=sysfs.live,
    )
    return facts
