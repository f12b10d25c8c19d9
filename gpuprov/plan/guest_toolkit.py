"""NVIDIA's container toolkit in a GPU guest: each step only when the guest's state says it is owed.

A pure planner over :class:`gpuprov.facts.guest_toolkit.GuestToolkitFacts`
(docs/guides/guests-and-containers.md, "guest_container_toolkit"). Its parts, in order:

- ``repository``: NVIDIA's repository and its signing key (apt: a binary keyring for
  ``signed-by`` and a deb822 source; dnf: a ``.repo`` file, and the key file when it came from
  the controller); the role leaves this part out in offline mode;
- ``docker``: Docker when ``dockerd`` is nowhere, from the distribution (apt) or the offline
  directory; the RHEL family has no Docker in its repositories: refused there without one;
- ``toolkit``: the toolkit's packages, those not installed (dpkg's status file, or rpm);
- ``runtime``: ``nvidia-ctk runtime configure`` for Docker and containerd when gpuprov verify's
  docker-runtime / containerd-runtime check is not ok, a restart of an engine whose configuration
  is newer than its running process (so a run killed between the two still restarts it), and
  ``nvidia-ctk cdi generate`` when the cdi-spec check is not ok (no spec, a GPU missing from it,
  another driver's libraries). The checks are gpuprov verify's own: one rule for both.

Refusals come before any action and name the fix; check mode shows every action.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..facts.containers import Toolkit
from ..facts.guest_toolkit import APT_SOURCE, DNF_REPO, OFFLINE_INDEX, OFFLINE_SOURCE, GuestToolkitFacts
from ..verify.checks_containers import check_cdi, check_containerd, check_docker
from ..verify.gather import VerifyFacts
from .base import COMMAND, WRITE_FILE, Action, Plan, Refusal, file_action
from .guest_driver import APT_ENV
from .keyring import plan_keyring

PARTS = ("repository", "docker", "toolkit", "runtime")
RUNTIMES = ("docker", "containerd")
TOOLKIT_DOWNLOAD = (
    "nvidia-container-toolkit, nvidia-container-toolkit-base, libnvidia-container-tools and libnvidia-container1"
)
OWED = ("warn", "fail")  # a check's status that nvidia-ctk fixes
# Package names in the offline directory's file names: name_version_arch.deb, name-version.arch.rpm.
_DEB_NAME = re.compile(r"^([^_]+)_.*$")
_RPM_NAME = re.compile(r"^(.+?)-[0-9].*[.]rpm$")
APT_INSTALL = [*APT_ENV, "apt-get", "install", "-y", "-q", "--no-install-recommends"]


@dataclass
class Key:
    """The repository's signing key, read and checked by the caller (gpuprov.plan.keyring.load_key)."""

    binary: bytes  # for apt's keyring
    fingerprints: list[str]
    armored: str | None = None  # the text from the controller, for dnf's key file; None: dnf fetches the URL


@dataclass
class GuestToolkitOptions:
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    packages: list[str] = field(default_factory=lambda: ["nvidia-container-toolkit"])
    repo_url: str = "https://nvidia.github.io/libnvidia-container/stable"
    gpg_key_url: str = "https://nvidia.github.io/libnvidia-container/gpgkey"
    key: Key | None = None  # apt needs one for the repository part
    keyring: str = "etc/apt/keyrings/nvidia-container-toolkit.gpg"  # root-relative
    rpm_key: str = "etc/pki/rpm-gpg/nvidia-container-toolkit.asc"  # root-relative
    # Offline mode: the package files' names in the controller's directory (its path for messages);
    # None: online. They are copied to offline_dest (root-relative) before the module runs.
    offline_names: list[str] | None = None
    offline_source: str = ""
    offline_dest: str = "var/lib/gpuprov/offline-packages"
    # The apt index the offline directory needs (gpuprov.facts.guest_toolkit.offline_index); None: not made.
    offline_index: str | None = None
    install_docker: bool = True
    docker_packages: list[str] = field(default_factory=lambda: ["docker.io"])
    runtimes: list[str] = field(default_factory=lambda: list(RUNTIMES))
    restart: bool = True
    cdi: bool = True
    cdi_output: str = "/etc/cdi/nvidia.yaml"


@dataclass
class GuestToolkitPlan(Plan):
    installs: list[str] = field(default_factory=list)  # packages this plan installs
    runtime_start: int = 0  # actions[runtime_start:] are the runtime part (configure, restart, CDI)
    configure: list[str] = field(default_factory=list)  # runtimes nvidia-ctk configures
    restart: list[str] = field(default_factory=list)  # engines restarted
    restart_pending: list[str] = field(default_factory=list)  # engines whose new configuration waits for a restart
    cdi: str | None = None  # why the CDI spec is generated (gpuprov verify's cdi-spec message)
    checks: list[dict[str, str]] = field(default_factory=list)  # gpuprov verify's checks (id, status, message)


def deb_architecture(machine: str) -> str:
    """Debian's name for the kernel's machine name (NVIDIA's repository is laid out by it)."""
    return {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el"}.get(machine, machine)


def apt_source_text(repo_url: str, arch: str, keyring: str) -> str:
    return (
        "# Managed by gpuprov (role guest_container_toolkit): NVIDIA's container toolkit\n"
        "# repository, a flat one, trusted only with its own key.\n"
        "Types: deb\n"
        f"URIs: {repo_url}/deb/{arch}\n"
        "Suites: /\n"
        f"Signed-By: /{keyring}\n"
    )


def dnf_repo_text(repo_url: str, gpgkey: str) -> str:
    # As NVIDIA's own .repo file: the repository metadata is signed, the packages are not checked one by one.
    return (
        "[nvidia-container-toolkit]\n"
        "name=NVIDIA Container Toolkit (gpuprov guest_container_toolkit)\n"
        f"baseurl={repo_url}/rpm/$basearch\n"
        "enabled=1\n"
        "gpgcheck=0\n"
        "repo_gpgcheck=1\n"
        f"gpgkey={gpgkey}\n"
        "sslverify=1\n"
    )


def offline_source_text(dest: str) -> str:
    return (
        "# Managed by gpuprov (role guest_container_toolkit): packages copied from the controller.\n"
        f"deb [trusted=yes] file:/{dest} ./\n"
    )


def package_names(files: list[str]) -> list[str]:
    """The package names in the offline directory's file names."""
    out = []
    for name in files:
        m = _DEB_NAME.match(name) or _RPM_NAME.match(name)
        out.append(m.group(1) if m else name)
    return out


def _command(argv: list[str], why: str) -> Action:
    return Action(COMMAND, why, argv=argv)


def _verify_facts(facts: GuestToolkitFacts, *, docker_coming: bool, ctk_coming: bool) -> VerifyFacts:
    """gpuprov verify's facts from these, with what this plan installs first taken as there."""
    docker = facts.docker
    if docker_coming and not docker.installed:
        docker = type(docker)(True, None, None, None, None, False)
    toolkit = facts.toolkit
    if ctk_coming and toolkit.nvidia_ctk is None:
        toolkit = Toolkit(nvidia_ctk="/usr/bin/nvidia-ctk", runtime=toolkit.runtime)
    return VerifyFacts(
        root="/",
        live=True,
        kernel=facts.os.kernel,
        os_name=facts.os.id,
        hypervisor=True,
        driver=facts.driver,
        pci_gpus=facts.pci_gpus,
        gpu_list=facts.gpu_list,
        gpu_error=None,
        docker=docker,
        containerd=facts.containerd,
        toolkit=toolkit,
        cdi=facts.cdi,
    )


def plan_guest_toolkit(facts: GuestToolkitFacts, opts: GuestToolkitOptions) -> GuestToolkitPlan:
    plan = GuestToolkitPlan()
    family = facts.os.family
    if family not in ("debian", "redhat"):
        plan.refusals.append(
            Refusal(
                f"unsupported distribution {facts.os.id or 'unknown'} (family {family or 'unknown'})",
                "the role knows the Debian and RHEL families: install the toolkit another way",
            )
        )
        return plan
    apt = family == "debian"
    offline = opts.offline_names is not None
    ext = "deb" if apt else "rpm"
    arch = facts.architecture or "amd64"
    dockerd = facts.engines.get("docker")
    wants_docker = "docker" in opts.parts and opts.install_docker and (dockerd is None or dockerd.binary is None)
    _refuse_inputs(plan, opts, apt=apt, offline=offline, ext=ext, arch=arch, wants_docker=wants_docker)
    if plan.refused:
        return plan
    if "repository" in opts.parts:
        _repository(plan, facts, opts, apt=apt, arch=arch)
    installed = facts.packages or {}
    docker_install = list(opts.docker_packages) if wants_docker else []
    toolkit_install = (
        [p for p in opts.packages if facts.packages is None or p not in installed] if "toolkit" in opts.parts else []
    )
    if offline and (docker_install or "toolkit" in opts.parts):
        docker_install, toolkit_install = _offline(plan, facts, opts, apt, docker_install, toolkit_install)
    elif docker_install or toolkit_install:
        if apt:
            plan.actions.append(_command([*APT_ENV, "apt-get", "update"], "refresh apt's lists"))
        if docker_install:
            plan.actions.append(_command(APT_INSTALL + docker_install, "Docker, which the guest lacks (dockerd)"))
        if toolkit_install:
            argv = APT_INSTALL if apt else ["dnf", "-y", "install"]
            plan.actions.append(_command(argv + toolkit_install, "NVIDIA's container toolkit"))
    plan.installs = docker_install + toolkit_install
    plan.runtime_start = len(plan.actions)
    if "runtime" in opts.parts:
        _runtime(plan, facts, opts, docker_coming=bool(docker_install), ctk_coming=bool(toolkit_install))
    if plan.refused:
        plan.actions.clear()
    return plan


def _refuse_inputs(
    plan: GuestToolkitPlan,
    opts: GuestToolkitOptions,
    *,
    apt: bool,
    offline: bool,
    ext: str,
    arch: str,
    wants_docker: bool,
) -> None:
    """What the inputs alone refuse: an offline directory without what is needed, Docker from nowhere."""
    if offline:
        names = package_names(opts.offline_names or [])
        where = f"the offline directory {opts.offline_source}"
        if not names:
            plan.refusals.append(
                Refusal(
                    f"{where} holds no .{ext} file on the controller",
                    "put the packages there (scripts/offline-debs.sh downloads Debian ones) or leave "
                    "guest_container_toolkit_offline_dir empty to use NVIDIA's repository",
                )
            )
            return
        absent = [p for p in opts.packages if p not in names]
        if "toolkit" in opts.parts and absent:
            plan.refusals.append(
                Refusal(
                    f"{', '.join(absent)} is not in {where} (it holds {', '.join(names)}): "
                    "nvidia-container-toolkit is on no distribution's repository, only on NVIDIA's",
                    f"download {TOOLKIT_DOWNLOAD} ({ext}, for {arch}) from {opts.repo_url}/{ext}/{arch}/ into it, "
                    "or leave guest_container_toolkit_offline_dir empty to install from that repository",
                )
            )
        missing_docker = [p for p in opts.docker_packages if p not in names]
        if wants_docker and apt and missing_docker:
            plan.refusals.append(
                Refusal(
                    f"Docker is not installed and {where} has no {', '.join(missing_docker)} package",
                    "add Docker's packages and what they need (scripts/offline-debs.sh docker.io downloads "
                    "Debian's), or set guest_container_toolkit_install_docker: false",
                )
            )
    elif wants_docker and not apt:
        plan.refusals.append(
            Refusal(
                "Docker is not installed and the RHEL family's repositories do not have it",
                "put Docker's packages (docker-ce and what it needs) in an offline directory "
                "(guest_container_toolkit_offline_dir), install it yourself, or set "
                "guest_container_toolkit_install_docker: false",
            )
        )


def _repository(
    plan: GuestToolkitPlan, facts: GuestToolkitFacts, opts: GuestToolkitOptions, apt: bool, arch: str
) -> None:
    if apt:
        key = opts.key
        if key is None:
            plan.refusals.append(
                Refusal("no signing key for NVIDIA's repository was given", "give the key's URL or file")
            )
            return
        current = facts.files.get(opts.keyring)
        keyring = plan_keyring(
            opts.keyring,
            key.binary,
            key.fingerprints,
            0o644,
            current.data if current else None,
            current.mode if current else None,
        )
        plan.actions.extend(keyring.actions)
        _file(
            plan,
            facts,
            APT_SOURCE,
            apt_source_text(opts.repo_url, arch, opts.keyring),
            "NVIDIA's repository, signed by that key only",
        )
        return
    gpgkey = opts.gpg_key_url
    if opts.key is not None and opts.key.armored is not None:
        _file(plan, facts, opts.rpm_key, opts.key.armored, "the repository's signing key, from the controller")
        gpgkey = f"file:///{opts.rpm_key}"
    _file(plan, facts, DNF_REPO, dnf_repo_text(opts.repo_url, gpgkey), "NVIDIA's repository (its metadata signed)")


def _file(plan: GuestToolkitPlan, facts: GuestToolkitFacts, rel: str, text: str, why: str) -> None:
    """``rel`` holding ``text``, mode 0644 (a file of another mode is written again)."""
    current = facts.files.get(rel)
    before = current.text if current else None
    action = file_action(rel, text, before, why)
    if action is None and current is not None and current.mode != 0o644:
        action = Action(WRITE_FILE, why + ", mode 0644", path=rel, content=text, before=before)
    if action is not None:
        plan.actions.append(action)


def _offline(
    plan: GuestToolkitPlan,
    facts: GuestToolkitFacts,
    opts: GuestToolkitOptions,
    apt: bool,
    docker_install: list[str],
    toolkit_install: list[str],
) -> tuple[list[str], list[str]]:
    """The offline directory as a local apt repository (apt picks what it needs from it, dependencies
    included), or its files handed to dnf. A rewritten index installs again (newer packages it brought)."""
    dest = opts.offline_dest
    if not apt:
        if docker_install or toolkit_install:
            files = [f"/{dest}/{n}" for n in sorted(facts.offline_files)]
            plan.actions.append(
                # The files are the ones the admin put on the controller; dnf cannot check keys it does not have.
                _command(["dnf", "-y", "install", "--nogpgcheck", *files], "the offline directory's packages")
            )
        return docker_install, toolkit_install
    index_rel = f"{dest}/{OFFLINE_INDEX}"
    index = None
    if opts.offline_index is not None:
        index = file_action(
            index_rel, opts.offline_index, _text(facts, index_rel), "index the offline packages for apt"
        )
    source = file_action(OFFLINE_SOURCE, offline_source_text(dest), _text(facts, OFFLINE_SOURCE), "serve them to apt")
    for action in (index, source):
        if action is not None:
            plan.actions.append(action)
    if index is not None and "toolkit" in opts.parts:
        toolkit_install = list(opts.packages)  # newer ones the directory brought
    if docker_install or toolkit_install:
        plan.actions.append(
            _command(
                [
                    *APT_ENV,
                    "apt-get",
                    "update",
                    "-o",
                    f"Dir::Etc::sourcelist={OFFLINE_SOURCE.removeprefix('etc/apt/')}",
                    "-o",
                    "Dir::Etc::sourceparts=-",
                    "-o",
                    "APT::Get::List-Cleanup=0",
                ],
                "read the local repository's index (that source only; the guest may have no network)",
            )
        )
        plan.actions.append(_command(APT_INSTALL + docker_install + toolkit_install, "from the offline directory"))
    return docker_install, toolkit_install


def _text(facts: GuestToolkitFacts, rel: str) -> str | None:
    current = facts.files.get(rel)
    return current.text if current else None


def _runtime(
    plan: GuestToolkitPlan,
    facts: GuestToolkitFacts,
    opts: GuestToolkitOptions,
    *,
    docker_coming: bool,
    ctk_coming: bool,
) -> None:
    checks = _verify_facts(facts, docker_coming=docker_coming, ctk_coming=ctk_coming)
    docker, containerd = check_docker(checks), check_containerd(checks)
    cdi = check_cdi(checks)
    plan.checks = [{"id": c.id, "status": c.status, "message": c.message} for c in (docker, containerd, cdi)]
    if "docker" in opts.runtimes and facts.docker.error:
        plan.refusals.append(Refusal(facts.docker.error, "fix the JSON, then run again (nvidia-ctk edits it)"))
    wanted = {"docker": docker, "containerd": containerd}
    plan.configure = [rt for rt in RUNTIMES if rt in opts.runtimes and wanted[rt].status in OWED]
    if opts.cdi and cdi.status in OWED:
        plan.cdi = cdi.message
    ctk = facts.toolkit.nvidia_ctk or ("nvidia-ctk" if ctk_coming else None)
    if (plan.configure or plan.cdi) and ctk is None:
        plan.refusals.append(
            Refusal(
                f"nvidia-ctk is not on this guest although {', '.join(opts.packages)} should be installed",
                "check that the package provides /usr/bin/nvidia-ctk (nvidia-container-toolkit-base), or install it "
                "by hand",
            )
        )
    if plan.cdi and not facts.driver.loaded:
        plan.refusals.append(
            Refusal(
                f"the CDI spec must be (re)generated ({plan.cdi}) but the NVIDIA driver is not loaded, so nvidia-ctk "
                "cannot list the GPUs",
                "run the guest_nvidia_driver role first (and reboot if it says so), then this role again",
            )
        )
    if plan.refused:
        return
    for rt in plan.configure:
        plan.actions.append(
            _command(["nvidia-ctk", "runtime", "configure", f"--runtime={rt}"], f"{wanted[rt].message}")
        )
    ready = {
        "docker": facts.docker.nvidia_runtime is not None or facts.docker.cdi,
        "containerd": facts.containerd.nvidia_runtime or facts.containerd.cdi,
    }
    for rt in RUNTIMES:
        engine = facts.engines.get(rt)
        running = engine is not None and engine.started is not None
        if rt not in opts.runtimes or not running:
            continue
        if rt in plan.configure or (ready[rt] and engine is not None and engine.config_newer_than_process):
            if opts.restart:
                plan.restart.append(rt)
                plan.actions.append(
                    _command(
                        ["systemctl", "restart", rt],
                        f"{rt}'s configuration is newer than its running process (a restart stops its containers "
                        "unless live-restore is on)",
                    )
                )
            else:
                plan.restart_pending.append(rt)
    if plan.cdi:
        plan.actions.append(_command(["nvidia-ctk", "cdi", "generate", f"--output={opts.cdi_output}"], plan.cdi))
