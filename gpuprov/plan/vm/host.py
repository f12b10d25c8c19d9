"""What a host needs to run gpu_vm's VMs: libvirt, QEMU, UEFI firmware, qemu-img, an ISO tool,
dnsmasq and the libvirt Python bindings installed, and libvirt running now and from boot.

One module call (gpu_vm_host) instead of a ``setup``, a package query, a ``package`` and a
``service`` task: the installed packages and the services' state are facts
(gpuprov.facts.packages), the install and ``systemctl enable --now`` commands of the plan, so a
prepared host (the lab image) plans nothing. docs/guides/vms.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...core.plan import COMMAND, Action, Plan, Refusal
from ...facts.driver_install import GuestOs
from ...facts.packages import PACKAGE_NAME, Packages, Services, install_argv

# Per OS family (gpuprov.facts.driver_install.read_os): libvirt's daemon with its QEMU driver,
# QEMU for x86, UEFI firmware, qemu-img (disk overlays), an ISO tool (cloud-init seeds) and
# dnsmasq (libvirt's DHCP). The lab image holds the Debian list (dev/lab/image.py PACKAGES;
# tests/test_lab.py keeps them in step), so on the lab host this plans nothing.
PACKAGES = {
    "debian": [
        "libvirt-daemon-system",
        "libvirt-daemon-driver-qemu",
        "qemu-system-x86",
        "qemu-utils",
        "ovmf",
        "genisoimage",
        "dnsmasq-base",
    ],
    "redhat": ["libvirt-daemon-kvm", "libvirt-client", "qemu-img", "edk2-ovmf", "xorriso", "dnsmasq"],
}
# The libvirt bindings gpu_vm imports: only for a module run by the system Python (a virtualenv
# brings its own libvirt-python).
PYTHON_PACKAGES = {"debian": ["python3-libvirt"], "redhat": ["python3-libvirt"]}
# The libvirt units that must run (and start at boot) under systemd: Debian and Ubuntu run the
# monolithic libvirtd, EL 9 the modular daemons (socket-activated).
SERVICES = {
    "debian": ["libvirtd.service"],
    "redhat": ["virtqemud.socket", "virtnodedevd.socket", "virtnetworkd.socket", "virtlogd.socket"],
}


@dataclass
class VmHostFacts:
    os: GuestOs
    packages: Packages
    services: Services
    system_python: bool  # the module runs with a system Python (/usr/bin/...)


@dataclass
class VmHostPlan(Plan):
    family: str | None = None
    wanted: list[str] | None = None
    missing: list[str] | None = None
    stopped: list[str] | None = None  # units not known to be active and enabled

    def result(self) -> dict[str, object]:
        return {"os_family": self.family, "packages": self.wanted, "missing": self.missing, "services": self.stopped}


def wanted_packages(family: str | None, override: list[str], system_python: bool) -> list[str] | None:
    """The packages to have: ``override`` or the family's list, plus the Python bindings for a system
    Python; None when the family has no list and none was given."""
    base = list(override) or PACKAGES.get(family or "")
    if base is None:
        return None
    return base + (PYTHON_PACKAGES.get(family or "", []) if system_python else [])


def plan_vm_host(facts: VmHostFacts, override: list[str]) -> VmHostPlan:
    """Install what is missing, then enable and start the libvirt units that are not. Pure."""
    family = facts.os.family
    plan = VmHostPlan(family=family)
    bad = [n for n in override if not isinstance(n, str) or not PACKAGE_NAME.fullmatch(n)]
    if bad:
        plan.refusals.append(
            Refusal(f"packages: {', '.join(map(repr, bad))} is not a package name", "name the packages as apt/dnf do")
        )
        return plan
    wanted = wanted_packages(family, override, facts.system_python)
    if wanted is None:
        plan.refusals.append(
            Refusal(
                f"no package list for this host's OS ({facts.os.id or 'no /etc/os-release'}; known families: "
                f"{', '.join(sorted(PACKAGES))})",
                "set gpu_vms_packages to this host's libvirt, QEMU, UEFI firmware and python3-libvirt packages, "
                "or gpu_vms_install: false when they are installed already",
            )
        )
        return plan
    plan.wanted = wanted
    plan.missing = facts.packages.missing(wanted)
    if plan.missing:
        argv = install_argv(facts.packages.manager, plan.missing)
        plan.actions.append(Action(COMMAND, "what the VMs need", argv=argv))
    # Without systemd (a container, a test that runs its own libvirtd) libvirt is the caller's.
    if facts.services.systemd:
        plan.stopped = facts.services.not_running(SERVICES.get(family or "", SERVICES["debian"]))
        for unit in plan.stopped:
            plan.actions.append(
                Action(COMMAND, "libvirt runs now and from boot", argv=["systemctl", "enable", "--now", unit])
            )
    return plan
