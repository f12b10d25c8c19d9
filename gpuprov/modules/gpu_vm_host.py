"""gpu_vm_host's options and its read step (gpu_vm runs it too when it installs what VMs need): the
host's OS, the packages the plan wants and the libvirt units, read below the root for
:func:`plan_vm_host`.

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

import sys
from typing import Any

from ..facts.driver_install import read_os
from ..facts.packages import read_packages, read_services
from ..facts.sysfs import Sysfs
from ..plan.vm.host import SERVICES, VmHostFacts, VmHostPlan, plan_vm_host, wanted_packages

ARGUMENT_SPEC: dict[str, Any] = {
    "packages": {"type": "list", "elements": "str", "default": []},
    "root": {"type": "path", "default": "/"},
}


def read_vm_host(sysfs: Sysfs, override: list[str], system_python: bool) -> VmHostFacts:
    os_ = read_os(sysfs)
    wanted = wanted_packages(os_.family, override, system_python) or []
    return VmHostFacts(
        os=os_,
        packages=read_packages(sysfs, wanted),
        services=read_services(sysfs, SERVICES.get(os_.family or "", SERVICES["debian"])),
        system_python=system_python,
    )


def plan(p: dict[str, Any]) -> VmHostPlan:
    """What the host below ``p["root"]`` lacks to run VMs (the libvirt bindings as a package where
    this module runs on the system's Python)."""
    system_python = sys.executable.startswith("/usr/bin/")
    return plan_vm_host(read_vm_host(Sysfs(p["root"]), p["packages"], system_python), p["packages"])
