"""The NVIDIA driver in a GPU guest: leave a working one alone, install a missing one.

A pure planner over :class:`gpuprov.facts.driver_install.GuestDriverFacts`
(docs/guides/guest.md, "The driver"). Its verdict:

- ``working``: the module is loaded, the user-space libraries are the module's version (or
  the driver itself answered, which it does only when they match) and the branch asked for,
  if any, is the one loaded: nothing to do, whatever installed it (packages, NVIDIA's
  ``.run``, a vendor image).
- ``reboot``: the module and the libraries differ (the libraries were updated since boot):
  a reboot, never a reinstall.
- ``other``: a driver of another branch, or one whose libraries cannot be found: refused
  unless ``replace_other_driver``; with it the plan removes what is there first (and refuses
  when it cannot tell how: a vendor image's driver is removed the vendor's way).
- ``installed``: installed but not loaded: ``modprobe nvidia`` (or a reboot while nouveau holds the GPU).
- ``missing``: the distribution's packages and commands, as the role always installed them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.plan import COMMAND, Action, Plan, Refusal, file_action
from ...facts.driver_install import LIB_DIRS, GuestDriverFacts

NOUVEAU_CONF = "etc/modprobe.d/gpuprov-blacklist-nouveau.conf"
NOUVEAU_TEXT = (
    "# Managed by gpuprov (role guest_nvidia_driver): the NVIDIA driver needs the GPU,\n"
    "# nouveau must not take it first (also in the initramfs).\n"
    "blacklist nouveau\n"
    "options nouveau modeset=0\n"
)
REPLACE_OPTION = "replace_other_driver: true"
APT_ENV = ["env", "DEBIAN_FRONTEND=noninteractive"]
# The archive components the driver lives in, added to the distribution's apt entries.
APT_COMPONENTS = {"ubuntu": ["restricted"], "debian": ["contrib", "non-free", "non-free-firmware"]}
INITRAMFS = {"debian": ["update-initramfs", "-u", "-k", "all"], "redhat": ["dracut", "-f", "--regenerate-all"]}
VGPU_PREREQS = {"debian": ["dkms", "build-essential"], "redhat": ["dkms", "gcc", "make"]}


@dataclass
class RhelRepo:
    name: str  # the repository id, e.g. cuda-rhel9-x86_64
    url: str
    gpgkey: str


@dataclass
class GuestDriverOptions:
    branch: str | None = None  # "580"; None: the distribution's choice
    flavor: str = "open"  # open | proprietary kernel modules
    replace_other_driver: bool = False
    blacklist_nouveau: bool = True
    # NVIDIA's vGPU guest driver comes from a file the role installs: plan its prerequisites only.
    vgpu: bool = False
    rhel_repo: RhelRepo | None = None
    rhel_epel: bool = True


@dataclass
class GuestDriverPlan(Plan):
    verdict: str = "missing"  # working | reboot | other | installed | missing
    reboot_reasons: list[str] = field(default_factory=list)
    removes: list[str] = field(default_factory=list)  # what the plan removes first (replace_other_driver)
    installed: str = "none"  # what is installed, in words


def components_for(os_id: str | None) -> list[str]:
    """The apt components to add on this distribution (the module plans them with gpuprov.plan.guest.aptsources)."""
    return APT_COMPONENTS.get(os_id or "", [])


def describe_installed(facts: GuestDriverFacts) -> str:
    inst, drv = facts.install, facts.driver
    version = drv.version or inst.library_version or facts.reported_version or "of unknown version"
    how = {
        "packages": "from the packages " + ", ".join(f"{p.name} {p.version}" for p in inst.packages),
        "run": f"by NVIDIA's .run installer ({inst.run_installer})",
        "unknown": "by neither a package nor NVIDIA's .run installer (a vendor image's?)",
    }.get(
        inst.source or "",
        "with its libraries not found by name (the driver itself answered)"
        if facts.reported_version
        else "with no user-space libraries found",
    )
    if inst.source is None and not drv.loaded:
        return "no NVIDIA driver"
    state = "loaded" if drv.loaded else "not loaded"
    return f"NVIDIA driver {version} ({state}), installed {how}"


def _module_version(facts: GuestDriverFacts) -> str | None:
    return facts.driver.version or (facts.reported_version if facts.driver.loaded else None)


def _branch_of(version: str | None) -> str | None:
    return version.split(".", 1)[0] if version else None


def plan_guest_driver(
    facts: GuestDriverFacts,
    opts: GuestDriverOptions,
    *,
    sources: list[Action] | None = None,
    nouveau_before: str | None = None,
) -> GuestDriverPlan:
    """``sources``: the apt-components actions (gpuprov.plan.guest.aptsources) an install needs first;
    ``nouveau_before``: the current text of :data:`NOUVEAU_CONF` (None: absent)."""
    plan = GuestDriverPlan(installed=describe_installed(facts))
    drv, inst = facts.driver, facts.install
    module = _module_version(facts)
    if not facts.gpus:
        plan.warnings.append("no NVIDIA GPU on this guest's PCI bus: the driver would have nothing to drive")
    if drv.loaded:
        library = inst.library_version or facts.reported_version
        if module is None:
            plan.refusals.append(
                Refusal(
                    "the nvidia module is loaded but its version cannot be read "
                    "(/proc/driver/nvidia/version, /sys/module/nvidia/version)",
                    "look at `cat /proc/driver/nvidia/version`; nothing is installed over a driver of unknown version",
                )
            )
            return plan
        if library is None:
            found = ", ".join(inst.library_versions) or "none"
            return _other(
                plan,
                facts,
                opts,
                sources,
                nouveau_before,
                f"the nvidia module {module} is loaded but its user-space libraries are not found or ambiguous "
                f"(libnvidia-ml.so.<version>, libcuda.so.<version> in /{', /'.join(LIB_DIRS)}: versions {found})",
            )
        if library != module:
            plan.verdict = "reboot"
            plan.reboot_reasons.append(
                f"the nvidia kernel module is {module} but the installed driver's libraries are {library} "
                "(updated since boot): a reboot loads the new module"
            )
            return plan
        if opts.branch and _branch_of(module) != opts.branch:
            return _other(plan, facts, opts, sources, nouveau_before, f"branch {opts.branch} is asked for")
        plan.verdict = "working"
        return plan
    # Not loaded.
    installed_version = inst.library_version or next((p.version for p in inst.packages), None)
    if inst.source is not None:
        if opts.branch and _branch_of(installed_version) not in (opts.branch, None):
            return _other(plan, facts, opts, sources, nouveau_before, f"branch {opts.branch} is asked for")
        plan.verdict = "installed"
        _nouveau(plan, facts, opts, nouveau_before)
        _load(plan, facts, opts)
        return plan
    plan.verdict = "missing"
    _install(plan, facts, opts, sources)
    if not plan.refused:
        _nouveau(plan, facts, opts, nouveau_before)
        _load(plan, facts, opts)
    return plan


def _other(
    plan: GuestDriverPlan,
    facts: GuestDriverFacts,
    opts: GuestDriverOptions,
    sources: list[Action] | None,
    nouveau_before: str | None,
    why: str,
) -> GuestDriverPlan:
    """A driver that is not the one asked for: refused, or removed first with ``replace_other_driver``."""
    plan.verdict = "other"
    if not opts.replace_other_driver:
        plan.refusals.append(
            Refusal(
                f"{why}; installed: {plan.installed}; it is left alone",
                f"keep it (leave the branch empty), or set {REPLACE_OPTION} to remove it and install the "
                "distribution's driver",
            )
        )
        return plan
    remove = _removal(facts)
    if remove is None:
        plan.refusals.append(
            Refusal(
                f"{why}; installed: {plan.installed}: there is no package and no .run uninstaller to remove it with",
                "remove it the way it was installed (the image's vendor), then run again",
            )
        )
        return plan
    plan.actions.append(remove)
    plan.removes = [plan.installed]
    _install(plan, facts, opts, sources)
    if not plan.refused:
        _nouveau(plan, facts, opts, nouveau_before)
        if facts.driver.loaded:
            plan.reboot_reasons.append(f"the old driver ({plan.installed}) is loaded until a reboot")
        else:
            _load(plan, facts, opts)
    return plan


def _removal(facts: GuestDriverFacts) -> Action | None:
    inst = facts.install
    if inst.packages:
        names = [p.name for p in inst.packages]
        if facts.os.family == "redhat":
            argv = ["dnf", "-y", "remove", *names]
        else:
            argv = [*APT_ENV, "apt-get", "purge", "-y", *names]
        return Action(COMMAND, "remove the other driver's packages (replace_other_driver)", argv=argv)
    if inst.source == "run":
        return Action(
            COMMAND,
            "remove the other driver with NVIDIA's uninstaller (replace_other_driver)",
            argv=["nvidia-installer", "--uninstall", "--silent"],
        )
    return None


def _command(argv: list[str], why: str) -> Action:
    return Action(COMMAND, why, argv=argv)


def _install(
    plan: GuestDriverPlan, facts: GuestDriverFacts, opts: GuestDriverOptions, sources: list[Action] | None
) -> None:
    """The distribution's packages and commands (the role's apt.yml and dnf.yml, as before)."""
    os_ = facts.os
    if os_.family not in ("debian", "redhat"):
        plan.refusals.append(
            Refusal(
                f"unsupported distribution {os_.id or 'unknown'} {os_.version_id or ''}".rstrip()
                + ": the role knows Debian, Ubuntu and the RHEL family",
                "install the driver another way and keep the rest of the play",
            )
        )
        return
    if os_.kernel is None:
        plan.refusals.append(Refusal("the running kernel's release cannot be read (/proc/version)"))
        return
    if os_.family == "debian":
        _install_apt(plan, facts, opts, sources or [])
    else:
        _install_dnf(plan, facts, opts)


def _install_apt(
    plan: GuestDriverPlan, facts: GuestDriverFacts, opts: GuestDriverOptions, sources: list[Action]
) -> None:
    os_ = facts.os
    open_modules = opts.flavor == "open"
    headers = [f"linux-headers-{os_.kernel}"]
    ubuntu_drivers = False
    if os_.id == "debian":
        if opts.branch:
            plan.refusals.append(
                Refusal(
                    f"branch {opts.branch} is asked for, but Debian ships one driver per release "
                    "(non-free's nvidia-driver)",
                    "leave the branch empty, or pin a backports driver with your own apt preferences",
                )
            )
            return
        driver = ["nvidia-driver", "nvidia-open-kernel-dkms" if open_modules else "nvidia-kernel-dkms"]
    elif opts.branch:
        driver = [f"nvidia-driver-{opts.branch}-server" + ("-open" if open_modules else ""), "dkms"]
    else:
        driver, ubuntu_drivers = ["ubuntu-drivers-common"], True
    packages = headers + (VGPU_PREREQS["debian"] if opts.vgpu else driver)
    plan.actions.extend(sources)
    plan.actions.append(_command([*APT_ENV, "apt-get", "update"], "refresh apt's lists"))
    plan.actions.append(
        _command(
            [*APT_ENV, "apt-get", "install", "-y", "--no-install-recommends", *packages],
            "the kernel headers, DKMS and the driver" if not opts.vgpu else "what the vGPU guest driver builds with",
        )
    )
    if ubuntu_drivers and not opts.vgpu:
        plan.actions.append(
            _command(["ubuntu-drivers", "install", "--gpgpu"], "ubuntu-drivers picks the compute driver")
        )


def _install_dnf(plan: GuestDriverPlan, facts: GuestDriverFacts, opts: GuestDriverOptions) -> None:
    os_ = facts.os
    major = (os_.version_id or "").split(".", 1)[0]
    if opts.rhel_repo is None:
        plan.refusals.append(Refusal("the RHEL family needs NVIDIA's CUDA repository", "set rhel_repo_url"))
        return
    repo = opts.rhel_repo
    text = (
        f"[{repo.name}]\nname=NVIDIA CUDA repository (driver packages; gpuprov guest_nvidia_driver)\n"
        f"baseurl={repo.url}\ngpgcheck=1\ngpgkey={repo.gpgkey}\nenabled=1\n"
    )
    repo_action = file_action(f"etc/yum.repos.d/{repo.name}.repo", text, None, "NVIDIA's CUDA repository")
    if repo_action is not None:
        plan.actions.append(repo_action)
    if opts.rhel_epel:
        epel = (
            f"https://dl.fedoraproject.org/pub/epel/epel-release-latest-{major}.noarch.rpm"
            if os_.id == "rhel"
            else "epel-release"
        )
        argv = ["dnf", "-y", "install", *(["--nogpgcheck"] if os_.id == "rhel" else []), epel]
        plan.actions.append(_command(argv, "EPEL (DKMS comes from there)"))
    packages = [f"kernel-devel-{os_.kernel}", f"kernel-headers-{os_.kernel}"]
    if opts.vgpu:
        plan.actions.append(
            _command(["dnf", "-y", "install", *packages, *VGPU_PREREQS["redhat"]], "the vGPU driver's prerequisites")
        )
        return
    plan.actions.append(_command(["dnf", "-y", "install", *packages], "the kernel headers"))
    open_modules = opts.flavor == "open"
    if major.isdigit() and int(major) < 10:
        b = opts.branch or ""
        stream = (f"{b}-open" if b else "open-dkms") if open_modules else f"{b or 'latest'}-dkms"
        plan.actions.append(
            _command(["dnf", "-y", "module", "enable", f"nvidia-driver:{stream}"], "the driver's module stream")
        )
    plan.actions.append(
        _command(["dnf", "-y", "install", "nvidia-open" if open_modules else "cuda-drivers"], "the driver")
    )


def _nouveau(plan: GuestDriverPlan, facts: GuestDriverFacts, opts: GuestDriverOptions, before: str | None) -> None:
    """Keep nouveau off the GPU: only when a driver is installed or loaded here by this plan."""
    if opts.blacklist_nouveau:
        action = file_action(NOUVEAU_CONF, NOUVEAU_TEXT, before, "nouveau must not take the GPU before nvidia")
        if action is not None:
            plan.actions.append(action)
            argv = INITRAMFS.get(facts.os.family or "")
            if argv:
                plan.actions.append(_command(argv, "the initramfs keeps nouveau off too"))
    if facts.driver.nouveau:
        plan.reboot_reasons.append("nouveau is loaded and holds the GPU (the blacklist takes effect at boot)")


def _load(plan: GuestDriverPlan, facts: GuestDriverFacts, opts: GuestDriverOptions) -> None:
    """Load the module now when nothing else holds the GPU (no reboot needed then)."""
    if not facts.driver.nouveau and not opts.vgpu:
        plan.actions.append(_command(["modprobe", "nvidia"], "load the driver (no reboot needed)"))
