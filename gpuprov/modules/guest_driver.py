"""guest_driver's options and its read-and-plan step: the driver the guest has (the kernel module,
the user-space libraries, the packages, a vGPU the driver reports), the archive components it
would need, and the plan (:mod:`gpuprov.plan.guest.driver`).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

import re
from typing import Any

from ..core.plan import Plan
from ..facts.driver import read_driver
from ..facts.driver_install import read_guest_driver
from ..facts.files import read_text
from ..facts.gpus import run_nvidia_smi
from ..facts.sysfs import Sysfs
from ..plan.guest.aptsources import plan_components
from ..plan.guest.driver import NOUVEAU_CONF, GuestDriverOptions, RhelRepo, components_for, plan_guest_driver
from ..verify.gather import import_optional, query_gpus

ARGUMENT_SPEC: dict[str, Any] = {
    "branch": {"type": "str", "default": ""},
    "flavor": {"type": "str", "choices": ["open", "proprietary"], "default": "open"},
    "replace_other_driver": {"type": "bool", "default": False},
    "blacklist_nouveau": {"type": "bool", "default": True},
    "vgpu": {"type": "str", "choices": ["auto", "true", "false"], "default": "auto"},
    "vgpu_package": {"type": "str", "default": ""},
    "rhel_repo_name": {"type": "str", "default": "cuda-rhel"},
    "rhel_repo_url": {"type": "str", "default": ""},
    "rhel_repo_gpgkey": {"type": "str", "default": "", "no_log": False},  # a key's URL, not a secret
    "rhel_epel": {"type": "bool", "default": True},
    "root": {"type": "path", "default": "/"},
}
BRANCH = re.compile(r"(\d{3,4})?")
NO_VGPU_PACKAGE = (
    "this VM has a vGPU (vgpu: true) and no vGPU guest driver is running, but vgpu_package is empty, "
    "nothing changed: the distributions' drivers do not drive a vGPU; download NVIDIA's vGPU guest driver "
    "(NVIDIA-Linux-x86_64-<version>-grid.run, or its .deb/.rpm) from the NVIDIA Licensing Portal, for the "
    "host's vGPU manager release, and give its path (role: guest_nvidia_driver_vgpu_package)"
)


def plan(module: Any) -> tuple[Plan, dict[str, Any]]:
    """The driver's plan for ``module``'s params, and what the module returns besides it; the module
    fails, nothing changed, on a branch that is no branch, or a vGPU asked for with no vGPU driver."""
    p = module.params
    if not BRANCH.fullmatch(p["branch"]):
        module.fail_json(msg=f"branch is {p['branch']!r}: a driver branch such as 580, or empty; nothing changed")
    sysfs = Sysfs(p["root"])
    vgpu = p["vgpu"] == "true" or (p["vgpu"] == "auto" and bool(p["vgpu_package"]))
    reported, vgpu_seen = None, False
    if p["vgpu"] != "false" and not p["vgpu_package"] and read_driver(sysfs).loaded:
        # Only the driver knows a vGPU: ask it (NVML or nvidia-smi; a capture's nvidia-smi output elsewhere).
        live = sysfs.live
        gpu_list, _error = query_gpus(
            sysfs, nvml=import_optional("pynvml") if live else None, source="auto", smi=run_nvidia_smi if live else None
        )
        if gpu_list is not None:
            reported = gpu_list.driver_version
            vgpu_seen = any(g.virtualization_mode == "vgpu" for g in gpu_list.gpus)
    if p["vgpu"] == "true" and not p["vgpu_package"] and not vgpu_seen:
        module.fail_json(msg=NO_VGPU_PACKAGE)
    facts = read_guest_driver(sysfs, reported_version=reported, vgpu_seen=vgpu_seen)
    os_ = facts.os
    sources = []
    components = components_for(os_.id)
    if components and os_.codename:
        sources = plan_components(sysfs, os_.codename, components)[0].actions
    repo = RhelRepo(p["rhel_repo_name"], p["rhel_repo_url"], p["rhel_repo_gpgkey"]) if p["rhel_repo_url"] else None
    opts = GuestDriverOptions(
        branch=p["branch"] or None,
        flavor=p["flavor"],
        replace_other_driver=p["replace_other_driver"],
        blacklist_nouveau=p["blacklist_nouveau"],
        vgpu=vgpu or vgpu_seen,
        rhel_repo=repo,
        rhel_epel=p["rhel_epel"],
    )
    driver_plan = plan_guest_driver(facts, opts, sources=sources, nouveau_before=read_text(sysfs, NOUVEAU_CONF))
    drv, inst = facts.driver, facts.install
    extra = {
        "verdict": driver_plan.verdict,
        "installed": driver_plan.installed,
        "reboot_reasons": driver_plan.reboot_reasons,
        "removes": driver_plan.removes,
        "vgpu": opts.vgpu,
        "driver": {
            "loaded": drv.loaded,
            "version": drv.version or reported,
            "library_version": inst.library_version,
            "source": inst.source,
            "packages": [f"{pk.name} {pk.version}" for pk in inst.packages],
            "run_installer": inst.run_installer,
            "nouveau": drv.nouveau,
        },
    }
    return driver_plan, extra
