"""gpu_vm_host's read step (gpu_vm runs it too when it installs what VMs need): the host's OS, the
packages the plan wants and the libvirt units, read below the root for :func:`plan_vm_host`."""

from __future__ import annotations

from ..facts.driver_install import read_os
from ..facts.packages import read_packages, read_services
from ..facts.sysfs import Sysfs
from ..plan.vm.host import SERVICES, VmHostFacts, wanted_packages


def read_vm_host(sysfs: Sysfs, override: list[str], system_python: bool) -> VmHostFacts:
    os_ = read_os(sysfs)
    wanted = wanted_packages(os_.family, override, system_python) or []
    return VmHostFacts(
        os=os_,
        packages=read_packages(sysfs, wanted),
        services=read_services(sysfs, SERVICES.get(os_.family or "", SERVICES["debian"])),
        system_python=system_python,
    )
