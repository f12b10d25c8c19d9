"""How the NVIDIA driver of a guest is installed: its user-space libraries' version, the
distribution packages (dpkg's status file, read as a file: no python3-apt), NVIDIA's ``.run``
installer, and the distribution the guest runs. With :func:`gpuprov.facts.driver.read_driver`
(the kernel module) these are the facts :mod:`gpuprov.plan.guest.driver` plans from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .driver import DriverInfo, read_driver
from .packages import dpkg_installed
from .pci import read_pci_devices
from .sysfs import Sysfs

NVIDIA = 0x10DE
DISPLAY_CLASS = 0x03

# Where distributions and NVIDIA's .run installer put the libraries (listed, never walked).
LIB_DIRS = (
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "usr/lib64",
    "usr/lib",
    "usr/local/nvidia/lib64",
)
# libnvidia-ml.so.580.159.04, libcuda.so.580.159.04: the version is in the name.
_LIB = re.compile(r"^(libnvidia-ml|libcuda)\.so\.(\d+\.\d+(?:\.\d+)?)$")
# The soname link the loader uses: which of several versions is live.
_SONAME = "libnvidia-ml.so.1"

# The packages that carry the driver on Debian and Ubuntu (nvidia-driver-580-server-open,
# libnvidia-compute-580-server, nvidia-headless-580, Debian's nvidia-driver, nvidia-kernel-dkms ...).
# Debian's package-name characters only: a name from the file ends up in apt-get's argv (replace).
_NAME = r"[a-z0-9.+-]*"
_DRIVER_PACKAGE = re.compile(
    rf"^(nvidia-driver(-\d+{_NAME})?|nvidia-headless(-no-dkms)?-\d+{_NAME}|libnvidia-compute-\d+{_NAME}"
    rf"|nvidia-dkms-\d+{_NAME}|nvidia-(open-)?kernel-dkms|nvidia-kernel-common-\d+{_NAME}|nvidia-utils-\d+{_NAME})$"
)
# NVIDIA's .run installer leaves these behind.
RUN_INSTALLER_EVIDENCE = ("usr/bin/nvidia-installer", "usr/bin/nvidia-uninstall", "var/log/nvidia-installer.log")


@dataclass
class DriverPackage:
    name: str
    version: str


@dataclass
class DriverInstall:
    """What is installed besides the loaded module (which :class:`DriverInfo` says)."""

    library_version: str | None  # the user-space libraries' version (None: not found or ambiguous)
    library_files: list[str] = field(default_factory=list)  # root-relative, for the report
    library_versions: list[str] = field(default_factory=list)  # every version found (more than one: ambiguous)
    packages: list[DriverPackage] = field(default_factory=list)  # installed driver packages (dpkg)
    dpkg_status: bool = False  # the status file was read
    run_installer: str | None = None  # the file that shows NVIDIA's .run installer was used

    @property
    def source(self) -> str | None:
        """packages, run (NVIDIA's .run installer), unknown (libraries, no sign of how), or None (nothing)."""
        if self.packages:
            return "packages"
        if self.run_installer:
            return "run"
        return "unknown" if self.library_files else None


@dataclass
class GuestOs:
    id: str | None  # os-release ID: ubuntu, debian, rhel, rocky ...
    family: str | None  # debian (Debian, Ubuntu) or redhat (the RHEL family)
    version_id: str | None
    codename: str | None
    kernel: str | None  # the running kernel's release


@dataclass
class GuestDriverFacts:
    driver: DriverInfo
    install: DriverInstall
    os: GuestOs
    gpus: list[str]  # NVIDIA display-class PCI addresses
    # The driver's own answer (NVML or nvidia-smi): its version, and whether it answered at all.
    reported_version: str | None = None
    vgpu_seen: bool = False  # the running driver reports a vGPU


def read_os(sysfs: Sysfs) -> GuestOs:
    values: dict[str, str] = {}
    for path in ("etc/os-release", "usr/lib/os-release"):
        for line in sysfs.read_lines(path):
            key, sep, value = line.partition("=")
            if sep and key.isidentifier():
                values.setdefault(key, value.strip().strip("\"'"))
        if values:
            break
    ident = values.get("ID", "").lower() or None
    like = {ident or "", *values.get("ID_LIKE", "").lower().split()}
    family = "debian" if like & {"debian", "ubuntu"} else "redhat" if like & {"rhel", "fedora", "centos"} else None
    release = (sysfs.read("proc/version") or "").split()
    return GuestOs(
        id=ident,
        family=family,
        version_id=values.get("VERSION_ID"),
        codename=values.get("VERSION_CODENAME") or values.get("UBUNTU_CODENAME"),
        kernel=release[2] if len(release) > 2 else None,
    )


def read_libraries(sysfs: Sysfs) -> tuple[str | None, list[str], list[str]]:
    """(the live version, the files, every version found). One listing per directory."""
    files: list[str] = []
    versions: set[str] = set()
    live: str | None = None
    for directory in LIB_DIRS:
        names = sysfs.listdir(directory)
        for name in names:
            m = _LIB.match(name)
            if m:
                files.append(f"{directory}/{name}")
                versions.add(m.group(2))
        if _SONAME in names:
            target = sysfs.link_name(f"{directory}/{_SONAME}")
            m = _LIB.match(target or "")
            if m and live is None:
                live = m.group(2)
    if live is None and len(versions) == 1:
        live = next(iter(versions))
    return live, files, sorted(versions)


def read_dpkg_driver_packages(sysfs: Sysfs) -> tuple[bool, list[DriverPackage]]:
    """(the status file was read, the driver packages dpkg has installed)."""
    installed = dpkg_installed(sysfs)
    if installed is None:
        return False, []
    return True, [DriverPackage(name=n, version=v) for n, v in installed.items() if _DRIVER_PACKAGE.match(n)]


def read_driver_install(sysfs: Sysfs) -> DriverInstall:
    version, files, versions = read_libraries(sysfs)
    dpkg_read, packages = read_dpkg_driver_packages(sysfs)
    run = next((f"/{p}" for p in RUN_INSTALLER_EVIDENCE if sysfs.exists(p)), None)
    return DriverInstall(
        library_version=version,
        library_files=files,
        library_versions=versions,
        packages=packages,
        dpkg_status=dpkg_read,
        run_installer=run,
    )


def read_guest_driver(
    sysfs: Sysfs, *, reported_version: str | None = None, vgpu_seen: bool = False
) -> GuestDriverFacts:
    """Everything the guest driver's planner needs. ``reported_version``: the version the driver
    itself reported (NVML, nvidia-smi), when the caller asked it; the library check uses it
    when no library file is found (a capture holds no /usr/lib)."""
    gpus = sorted(
        a for a, d in read_pci_devices(sysfs).items() if d.vendor_id == NVIDIA and d.base_class == DISPLAY_CLASS
    )
    return GuestDriverFacts(
        driver=read_driver(sysfs),
        install=read_driver_install(sysfs),
        os=read_os(sysfs),
        gpus=gpus,
        reported_version=reported_version,
        vgpu_seen=vgpu_seen,
    )
