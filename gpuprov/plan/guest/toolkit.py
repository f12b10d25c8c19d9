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

import json
import re
from dataclasses import dataclass, field

from ...core.plan import COMMAND, WRITE_FILE, Action, Plan, Refusal, file_action
from ...facts.boundedjson import loads_bounded
from ...facts.containers import DAEMON_JSON, DOCKER_PIDFILE, Toolkit
from ...facts.debindex import DEB_NAME, index_set, missing_dependencies, package_file_ok
from ...facts.gpus import GpuInfo, GpuList
from ...facts.guest_toolkit import (
    APT_SOURCE,
    CDI_REFRESH_UNIT,
    DNF_REPO,
    OFFLINE_INDEX,
    OFFLINE_SOURCE,
    GuestToolkitFacts,
)
from ...facts.packages import PACKAGE_NAME
from ...facts.pci import PciAddressError, normalize_address
from ...verify.checks_containers import check_cdi, check_containerd, check_docker
from ...verify.gather import VerifyFacts
from .driver import APT_ENV
from .keyring import plan_keyring

PARTS = ("repository", "docker", "toolkit", "runtime")
# CDI first: the base package holds all that CDI mode needs (nvidia-ctk, nvidia-cdi-hook,
# nvidia-container-runtime); the legacy hook (nvidia-container-toolkit and libnvidia-container*)
# only when asked for (docs/guides/guests-and-containers.md).
CDI_PACKAGES = ["nvidia-container-toolkit-base"]
LEGACY_PACKAGES = ["nvidia-container-toolkit"]
DOCKERD_LOG = "/var/log/gpuprov-dockerd.log"
CDI_STAGING = "var/lib/gpuprov/cdi/nvidia-all.json"  # root-relative: every GPU, before the host's are kept
# Docker's own netfilter rules and bridge need iptables; a guest without it runs the engine without
# them (containers then use --network=host or none, as gpuprov verify's do).
NO_NETFILTER = {"iptables": False, "ip6tables": False, "bridge": "none"}
_URL = re.compile(r"(https?|file):[A-Za-z0-9._~:/?@%+=-]+")
_ARCH = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
_PATH = re.compile(r"/[A-Za-z0-9._+@/-]{0,1000}")
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
    """The repository's signing key, read and checked by the caller (gpuprov.plan.guest.keyring.load_key)."""

    binary: bytes  # for apt's keyring
    fingerprints: list[str]
    armored: str | None = None  # the text from the controller, for dnf's key file; None: dnf fetches the URL


@dataclass
class GuestToolkitOptions:
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    packages: list[str] = field(default_factory=list)  # empty: CDI_PACKAGES (+ LEGACY_PACKAGES with legacy_hook)
    legacy_hook: bool = False
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
    # The offline directory's apt index, read on the controller (gpuprov.facts.debindex.offline_index,
    # the role's lookup gpuprov.kvm.offline_index), and what that read found wrong in the directory.
    offline_index: str | None = None
    offline_problems: list[str] = field(default_factory=list)
    install_docker: bool = True
    docker_packages: list[str] = field(default_factory=lambda: ["docker.io"])
    runtimes: list[str] = field(default_factory=list)  # empty: the engines the guest runs or is given
    start: bool = True  # start Docker when it is installed (or installed now) and not running
    restart: bool = True
    cdi: bool = True
    cdi_output: str = "/etc/cdi/nvidia.yaml"
    # The GPUs (full PCI addresses) the CDI spec may hold: on a GPU host, those declared use: host, never
    # one declared for passthrough or vGPU. None: every GPU the driver shows (a guest).
    cdi_gpus: list[str] | None = None


@dataclass
class GuestToolkitPlan(Plan):
    installs: list[str] = field(default_factory=list)  # packages this plan installs
    runtime_start: int = 0  # actions[runtime_start:] are the runtime part (configure, restart, CDI)
    configure: list[str] = field(default_factory=list)  # runtimes nvidia-ctk configures
    restart: list[str] = field(default_factory=list)  # engines restarted
    restart_pending: list[str] = field(default_factory=list)  # engines whose new configuration waits for a restart
    cdi: str | None = None  # why the CDI spec is generated (gpuprov verify's cdi-spec message)
    checks: list[dict[str, str]] = field(default_factory=list)  # gpuprov verify's checks (id, status, message)
    start: list[str] = field(default_factory=list)  # engines started
    wait_for: list[str] = field(default_factory=list)  # engines to wait for after the actions (started or restarted)
    # With cdi_gpus: nvidia-ctk writes every GPU to CDI_STAGING, then the module writes cdi_output with only
    # these device names (filter_cdi_spec); the names of the GPUs it must leave out.
    cdi_keep: list[str] | None = None
    cdi_drop: list[str] = field(default_factory=list)


def toolkit_packages(opts: GuestToolkitOptions) -> list[str]:
    if opts.packages:
        return list(opts.packages)
    return CDI_PACKAGES + (LEGACY_PACKAGES if opts.legacy_hook else [])


def option_problems(opts: GuestToolkitOptions, *, rpm: bool) -> list[Refusal]:
    """The input boundary of this planner: every option that reaches a file or a command line,
    checked before anything else (no newline or control character in a line-based file, package
    names by Debian's and RPM's rules, paths of plain characters)."""
    out = []
    name_rule = PACKAGE_NAME if rpm else DEB_NAME
    for key, names in (("packages", opts.packages), ("docker_packages", opts.docker_packages)):
        bad = [n for n in names if not name_rule.fullmatch(n)]
        if bad:
            out.append(
                Refusal(
                    f"{key} has {', '.join(repr(n) for n in bad)}: not a package name",
                    "give package names (lower-case letters, digits, . + -; no leading -), one per entry",
                )
            )
    if not _URL.fullmatch(opts.repo_url):
        out.append(Refusal(f"repo_url {opts.repo_url!r} is not a plain http(s) or file URL", "give the mirror's URL"))
    checks = (("keyring", opts.keyring), ("rpm_key", opts.rpm_key), ("offline_dest", opts.offline_dest))
    for key, rel in (*checks, ("cdi_output", opts.cdi_output.lstrip("/"))):
        if not _PATH.fullmatch("/" + rel) or "/../" in f"/{rel}/":
            out.append(Refusal(f"{key} {rel!r} is not a plain absolute path", "letters, digits, . _ + @ - and / only"))
    for address in opts.cdi_gpus or []:
        try:
            if address != address.strip():  # normalize_address forgives spaces; a boundary does not
                raise PciAddressError(f"{address!r} is not a PCI address: it has spaces or line breaks around it")
            normalize_address(address)
        except PciAddressError as exc:
            out.append(Refusal(f"cdi_gpus: {exc}", "name the host's GPUs by full PCI address"))
    bad = [n for n in opts.offline_names or [] if not package_file_ok(n)]
    if bad:
        out.append(
            Refusal(
                f"the offline directory has files whose names are not package file names: {', '.join(map(repr, bad))}",
                "rename or remove them (letters, digits, . + ~ _ % -, not starting with -)",
            )
        )
    return out


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


def daemon_json_text(current: str | None, wanted: dict[str, object]) -> str | None:
    """daemon.json with ``wanted`` merged in (None when it holds them already, or does not parse)."""
    try:
        data = json.loads(current) if current and current.strip() else {}
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or all(data.get(k) == v for k, v in wanted.items()):
        return None
    return json.dumps({**data, **wanted}, indent=4, sort_keys=True) + "\n"


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


def _verify_facts(
    facts: GuestToolkitFacts, *, docker_coming: bool, ctk_coming: bool, gpu_list: GpuList | None = None
) -> VerifyFacts:
    """gpuprov verify's facts from these, with what this plan installs first taken as there (and, on a host
    that keeps only some GPUs for containers, only those)."""
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
        gpu_list=gpu_list if gpu_list is not None else facts.gpu_list,
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
    plan.refusals += option_problems(opts, rpm=not apt)
    arch = facts.architecture or "amd64"
    if not _ARCH.fullmatch(arch):
        plan.refusals.append(
            Refusal(f"architecture {arch!r} is not a package architecture", "give amd64, arm64 ... or leave it empty")
        )
    if plan.refused:
        return plan
    offline = opts.offline_names is not None
    ext = "deb" if apt else "rpm"
    dockerd = facts.engines.get("docker")
    wants_docker = "docker" in opts.parts and opts.install_docker and (dockerd is None or dockerd.binary is None)
    wanted = toolkit_packages(opts)
    installed = facts.packages or {}
    docker_install = list(opts.docker_packages) if wants_docker else []
    toolkit_install = (
        [p for p in wanted if facts.packages is None or p not in installed] if "toolkit" in opts.parts else []
    )
    _refuse_inputs(plan, facts, opts, apt=apt, offline=offline, ext=ext, arch=arch, wants_docker=wants_docker)
    if offline and apt and not plan.refused:
        _offline_closure(plan, facts, opts, docker_install + toolkit_install)
    if plan.refused:
        return plan
    if "repository" in opts.parts:
        _repository(plan, facts, opts, apt=apt, arch=arch)
    if offline and (docker_install or "toolkit" in opts.parts):
        docker_install, toolkit_install = _offline(plan, facts, opts, apt, docker_install, toolkit_install)
    elif docker_install or toolkit_install:
        if apt:
            plan.actions.append(_command([*APT_ENV, "apt-get", "update"], "refresh apt's lists"))
        if docker_install:
            plan.actions.append(_command([*APT_INSTALL, "--", *docker_install], "Docker, which the guest lacks"))
        if toolkit_install:
            argv = [*APT_INSTALL, "--"] if apt else ["dnf", "-y", "install", "--"]
            plan.actions.append(_command(argv + toolkit_install, "NVIDIA's container toolkit (CDI first)"))
    plan.installs = docker_install + toolkit_install
    plan.runtime_start = len(plan.actions)
    if "runtime" in opts.parts:
        _runtime(plan, facts, opts, docker_coming=bool(docker_install), ctk_coming=bool(toolkit_install))
    if plan.refused:
        plan.actions.clear()
    return plan


def _refuse_inputs(
    plan: GuestToolkitPlan,
    facts: GuestToolkitFacts,
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
        for problem in opts.offline_problems:
            plan.refusals.append(Refusal(problem, f"remove or replace that file in {opts.offline_source}"))
        absent = [p for p in toolkit_packages(opts) if p not in names]
        if "toolkit" in opts.parts and absent and not (facts.packages and all(p in facts.packages for p in absent)):
            plan.refusals.append(
                Refusal(
                    f"{', '.join(absent)} is not in {where} (it holds {', '.join(names)}): "
                    "NVIDIA's container toolkit is on no distribution's repository, only on NVIDIA's",
                    f"download {TOOLKIT_DOWNLOAD} ({ext}, for {arch}) from {opts.repo_url}/{ext}/{arch}/ into it, "
                    "or leave guest_container_toolkit_offline_dir empty to install from that repository",
                )
            )
        missing_docker = [p for p in opts.docker_packages if p not in names]
        if wants_docker and apt and missing_docker:
            plan.refusals.append(
                Refusal(
                    f"Docker is not installed and {where} has no {', '.join(missing_docker)} package",
                    "add Docker's packages and what they need (scripts/offline-debs.sh --status GUEST_DPKG_STATUS "
                    "docker.io downloads Debian's), or set guest_container_toolkit_install_docker: false",
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


def _offline_closure(
    plan: GuestToolkitPlan, facts: GuestToolkitFacts, opts: GuestToolkitOptions, wanted: list[str]
) -> None:
    """Before anything is copied or written: every package and dependency the guest lacks (its own
    dpkg status) and the offline directory does not hold, in one refusal."""
    if not wanted:
        return
    if facts.dpkg is None:
        plan.refusals.append(
            Refusal(
                "this guest's dpkg status (/var/lib/dpkg/status) cannot be read: what the offline directory must "
                "hold is unknown",
                "check the guest's dpkg, then run again",
            )
        )
        return
    if opts.offline_index is None:
        plan.refusals.append(
            Refusal(
                f"no index of the offline directory {opts.offline_source} was given (offline_index)",
                "run the role guest_container_toolkit (its lookup gpuprov.kvm.offline_index reads the directory)",
            )
        )
        return
    _will, missing = missing_dependencies(wanted, facts.dpkg, index_set(opts.offline_index))
    if missing:
        needs = sorted({m.needs for m in missing})
        by = "; ".join(sorted({f"{m.needs} (needed by {m.by})" for m in missing}))
        names = " ".join(sorted({n.split(" ", 1)[0] for n in needs}))
        plan.refusals.append(
            Refusal(
                f"the offline directory {opts.offline_source} lacks what this guest lacks too: {by}",
                f"add them to it: scripts/offline-debs.sh --status <this guest's /var/lib/dpkg/status> "
                f"--os-release <its /etc/os-release> {names}, and copy what it prints into the directory",
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
                _command(["dnf", "-y", "install", "--nogpgcheck", "--", *files], "the offline directory's packages")
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
        toolkit_install = toolkit_packages(opts)  # newer ones the directory brought
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
        plan.actions.append(
            _command([*APT_INSTALL, "--", *docker_install, *toolkit_install], "from the offline directory")
        )
    return docker_install, toolkit_install


def _text(facts: GuestToolkitFacts, rel: str) -> str | None:
    current = facts.files.get(rel)
    return current.text if current else None


def _engines_to_configure(facts: GuestToolkitFacts, opts: GuestToolkitOptions, docker_coming: bool) -> list[str]:
    """Only the engines the guest runs or is given: Docker when it is here or installed now, containerd
    when a containerd service of its own runs (Docker's private one is not one), or those named."""
    if opts.runtimes:
        return [rt for rt in RUNTIMES if rt in opts.runtimes]
    docker = facts.engines.get("docker")
    containerd = facts.engines.get("containerd")
    out = []
    if docker_coming or (docker is not None and docker.binary is not None):
        out.append("docker")
    if containerd is not None and containerd.started is not None:
        out.append("containerd")
    return out


def _start_argv(facts: GuestToolkitFacts, engine: str) -> list[str] | None:
    """How this guest's service manager starts an engine (None: it has none gpuprov knows)."""
    if facts.systemd:
        return ["systemctl", "enable", "--now", "--", engine]
    dockerd = (facts.engines.get("docker") and facts.engines["docker"].binary) or "/usr/bin/dockerd"
    if engine == "docker" and facts.start_stop_daemon:
        # No systemd (a microVM's PID 1, a container): dpkg's start-stop-daemon runs dockerd detached,
        # its output to a log; dockerd writes its own pid file.
        return [
            facts.start_stop_daemon,
            "--start",
            "--background",
            "--oknodo",
            "--pidfile",
            DOCKER_PIDFILE,
            "--output",
            DOCKERD_LOG,
            "--exec",
            dockerd,
            "--",
            "--pidfile",
            DOCKER_PIDFILE,
        ]
    return None


def _runtime(
    plan: GuestToolkitPlan,
    facts: GuestToolkitFacts,
    opts: GuestToolkitOptions,
    *,
    docker_coming: bool,
    ctk_coming: bool,
) -> None:
    kept, dropped = _host_gpus(facts, opts)
    kept_list = None
    if facts.gpu_list is not None and opts.cdi_gpus is not None:
        kept_list = GpuList(facts.gpu_list.source, facts.gpu_list.driver_version, facts.gpu_list.cuda_version, kept)
    checks = _verify_facts(facts, docker_coming=docker_coming, ctk_coming=ctk_coming, gpu_list=kept_list)
    docker, containerd = check_docker(checks), check_containerd(checks)
    cdi = check_cdi(checks)
    if dropped:
        named = {n for spec in facts.cdi if spec.kind == "nvidia.com/gpu" for n in spec.devices}
        held = [g for g in dropped if _names(g) & named]
        if held:
            which = ", ".join(f"GPU {g.index} ({g.address})" for g in held)
            cdi = type(cdi)(
                "cdi-spec",
                "fail",
                f"the CDI spec holds {which}, which this host does not keep for its containers",
                "regenerate it with only the host's GPUs (guest_container_toolkit_cdi_gpus)",
            )
    plan.checks = [{"id": c.id, "status": c.status, "message": c.message} for c in (docker, containerd, cdi)]
    engines = _engines_to_configure(facts, opts, docker_coming)
    if "docker" in engines and facts.docker.error:
        plan.refusals.append(Refusal(facts.docker.error, "fix the JSON, then run again (nvidia-ctk edits it)"))
    if "containerd" in engines and facts.containerd.error:
        # nvidia-ctk would edit a configuration gpuprov could not read in full: not over unknown state.
        plan.refusals.append(Refusal(facts.containerd.error, "check containerd's configuration, then run again"))
    wanted = {"docker": docker, "containerd": containerd}
    plan.configure = [rt for rt in engines if wanted[rt].status in OWED]
    if opts.cdi and cdi.status in OWED:
        plan.cdi = cdi.message
    cdi_mode = not opts.legacy_hook and facts.runtime_mode != "cdi"
    ctk = facts.toolkit.nvidia_ctk or ("nvidia-ctk" if ctk_coming else None)
    if (plan.configure or plan.cdi or cdi_mode) and ctk is None:
        plan.refusals.append(
            Refusal(
                f"nvidia-ctk is not on this guest although {', '.join(toolkit_packages(opts))} should be installed",
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
    dockerd = facts.engines.get("docker")
    docker_here = docker_coming or (dockerd is not None and dockerd.binary is not None)
    docker_running = dockerd is not None and dockerd.started is not None
    wants_start = facts.live and "docker" in engines and docker_here and not docker_running and opts.start
    if wants_start and _start_argv(facts, "docker") is None:
        plan.refusals.append(
            Refusal(
                "Docker is installed but does not run, and this guest has no service manager gpuprov can start it "
                "with (no systemd, no start-stop-daemon)",
                "start dockerd yourself (with --pidfile /var/run/docker.pid), or set "
                "guest_container_toolkit_start: false",
            )
        )
    if plan.refused:
        return
    # The engine's configuration, from the facts: no iptables here, no netfilter rules and no bridge.
    if "docker" in engines and facts.iptables is None:
        current = facts.files.get(DAEMON_JSON)
        text = daemon_json_text(current.text if current else None, dict(NO_NETFILTER))
        if text is not None:
            before = current.text if current else None
            plan.actions.append(
                Action(
                    WRITE_FILE,
                    "no iptables on this guest: Docker without its netfilter rules and bridge",
                    path=DAEMON_JSON,
                    content=text,
                    before=before,
                )
            )
    if cdi_mode:
        plan.actions.append(
            _command(
                ["nvidia-ctk", "config", "--in-place", "--set", "nvidia-container-runtime.mode=cdi"],
                "the nvidia runtime in CDI mode (the legacy hook is not installed)",
            )
        )
    for rt in plan.configure:
        plan.actions.append(
            _command(["nvidia-ctk", "runtime", "configure", f"--runtime={rt}"], f"{wanted[rt].message}")
        )
    if plan.cdi and opts.cdi_gpus is not None:
        # Every GPU to a staging file, then only the host's into the spec (the module, filter_cdi_spec).
        plan.cdi_keep = sorted(n for g in kept for n in _names(g))
        plan.cdi_drop = sorted(n for g in dropped for n in _names(g))
        plan.actions.append(
            _command(
                ["nvidia-ctk", "cdi", "generate", "--format=json", f"--output=/{CDI_STAGING}"],
                f"{plan.cdi}; every GPU first, then only those this host keeps ({', '.join(opts.cdi_gpus) or 'none'})",
            )
        )
    elif plan.cdi:
        plan.actions.append(_command(["nvidia-ctk", "cdi", "generate", f"--output={opts.cdi_output}"], plan.cdi))
    _refresh_units(plan, facts)
    changed_config = any(a.path == DAEMON_JSON for a in plan.actions)
    ready = {
        "docker": facts.docker.nvidia_runtime is not None or facts.docker.cdi,
        "containerd": facts.containerd.nvidia_runtime or facts.containerd.cdi,
    }
    for rt in RUNTIMES:
        engine = facts.engines.get(rt)
        running = engine is not None and engine.started is not None
        if rt not in engines or not running:
            continue
        newer = ready[rt] and engine is not None and engine.config_newer_than_process
        if rt == "docker" and facts.docker_engine_runtimes is not None and facts.docker.nvidia_runtime:
            # The engine says what is in force: a reload (SIGHUP) leaves its start time as it was.
            newer = "nvidia" not in facts.docker_engine_runtimes
        if not (rt in plan.configure or newer or (rt == "docker" and changed_config)):
            continue
        if not opts.restart or (rt != "docker" and not facts.systemd):
            # containerd without systemd: no pid file gpuprov knows to restart it by.
            plan.restart_pending.append(rt)
            continue
        plan.restart.append(rt)
        plan.wait_for.append(rt)
        stops = ""
        if rt == "docker" and facts.docker_running and not facts.docker_live_restore:
            stops = f"; it stops the {facts.docker_running} running container(s): live-restore is off"
            plan.warnings.append(f"restarting Docker stops its {facts.docker_running} running container(s)")
        reload_only = rt == "docker" and not changed_config
        plan.actions.append(
            _command(
                _restart_argv(facts, rt, reload_only), f"{rt}'s configuration is newer than its running process{stops}"
            )
        )
        if rt == "docker" and not reload_only and not facts.systemd:
            plan.actions.append(_command(_start_argv(facts, "docker") or [], "start Docker again"))
    if wants_start:
        plan.start.append("docker")
        plan.wait_for.append("docker")
        argv = _start_argv(facts, "docker") or []
        plan.actions.append(_command(argv, "Docker is installed and does not run"))


def _restart_argv(facts: GuestToolkitFacts, engine: str, reload_only: bool) -> list[str]:
    """Restart (or, for Docker's runtimes alone, reload: SIGHUP, no container stops) through the guest's
    service manager, or dockerd's own pid file where there is none."""
    if facts.systemd:
        return ["systemctl", "reload" if reload_only else "restart", "--", engine]
    if engine == "docker" and reload_only:
        return ["start-stop-daemon", "--stop", "--signal", "HUP", "--pidfile", DOCKER_PIDFILE]
    return ["start-stop-daemon", "--stop", "--retry", "TERM/30/KILL/5", "--pidfile", DOCKER_PIDFILE]


def _refresh_units(plan: GuestToolkitPlan, facts: GuestToolkitFacts) -> None:
    """The base package's nvidia-cdi-refresh units regenerate the spec on a driver, MIG or vGPU change."""
    if facts.systemd and facts.cdi_refresh_unit and facts.cdi_refresh_enabled is not True:
        plan.actions.append(
            _command(
                ["systemctl", "enable", "--now", "--", CDI_REFRESH_UNIT],
                "regenerate the CDI spec whenever the driver changes",
            )
        )
    elif not facts.systemd:
        plan.warnings.append(
            "no systemd on this guest: nothing regenerates the CDI spec when the driver changes; gpuprov verify "
            "flags a stale spec (run this role again after a driver change)"
        )


def _names(gpu: GpuInfo) -> set[str]:
    """A GPU's device names in nvidia-ctk's spec: its index and its UUID."""
    return {str(gpu.index), *([gpu.uuid] if gpu.uuid else [])}


def _host_gpus(facts: GuestToolkitFacts, opts: GuestToolkitOptions) -> tuple[list[GpuInfo], list[GpuInfo]]:
    """The GPUs the driver shows, split into those the spec may hold and those it must not."""
    gpus = facts.gpu_list.gpus if facts.gpu_list else []
    if opts.cdi_gpus is None:
        return gpus, []
    wanted = {normalize_address(a) for a in opts.cdi_gpus}
    kept = [g for g in gpus if g.address in wanted]
    return kept, [g for g in gpus if g not in kept]


def filter_cdi_spec(text: str, keep: list[str], drop: list[str]) -> str:
    """nvidia-ctk's JSON spec with only the devices named in ``keep`` (an index, a UUID, or a MIG device
    "index:n" of a kept index); "all" keeps its device nodes but those of the dropped GPUs. Raises ValueError
    on a spec that is not nvidia-ctk's JSON."""
    spec = loads_bounded(text, max_chars=16 << 20)
    if not isinstance(spec, dict) or not isinstance(spec.get("devices"), list):
        raise ValueError("not a CDI spec (no devices list)")

    def nodes(device: dict) -> list:
        edits = device.get("containerEdits")
        found = edits.get("deviceNodes") if isinstance(edits, dict) else None
        return found if isinstance(found, list) else []

    keep_set, drop_set = set(keep), set(drop)
    devices = [d for d in spec["devices"] if isinstance(d, dict) and isinstance(d.get("name"), str)]
    dropped_paths = {n.get("path") for d in devices if d["name"] in drop_set for n in nodes(d) if isinstance(n, dict)}
    kept_paths = {n.get("path") for d in devices if d["name"] in keep_set for n in nodes(d) if isinstance(n, dict)}
    out = []
    for device in devices:
        name = device["name"]
        if name == "all":
            edits = dict(device.get("containerEdits") or {})
            edits["deviceNodes"] = [
                n for n in nodes(device) if not isinstance(n, dict) or n.get("path") not in dropped_paths - kept_paths
            ]
            out.append({**device, "containerEdits": edits})
        elif name in keep_set or name.split(":", 1)[0] in keep_set:
            out.append(device)
    return json.dumps({**spec, "devices": out}, indent=2) + "\n"
