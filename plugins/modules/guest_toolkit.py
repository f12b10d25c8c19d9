#!/usr/bin/python
# Copyright: gpuprov contributors
# Apache License 2.0
"""Ansible module guest_toolkit: NVIDIA's container toolkit, Docker when missing, the runtimes and the CDI spec."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: guest_toolkit
short_description: NVIDIA's container toolkit in a GPU guest - each step only when the guest's state owes it
description:
  - Reads the guest (the distribution, dpkg's status file read as a file or C(rpm -q), C(dockerd), C(containerd)
    and C(podman) in the usual directories, C(/etc/docker/daemon.json), containerd's C(config.toml) and
    drop-ins, C(nvidia-ctk), the CDI specs in C(/etc/cdi) and C(/var/run/cdi), the files it manages, when each
    running engine started) and plans; a converged guest costs the reads and one plan.
  - C(repository) - NVIDIA's repository and its signing key - apt - the key fetched from O(gpg_key_url) on the
    guest (or O(gpg_key_data)), dearmored into the binary keyring O(keyring) for a deb822 source signed by it only,
    pinned with O(gpg_fingerprint) - dnf - a C(.repo) file (metadata signed), the key file from O(gpg_key_data).
  - C(docker) - Docker when C(dockerd) is nowhere and O(install_docker) - the distribution's O(docker_packages)
    (apt) or the offline directory's; refused on the RHEL family without an offline directory.
  - C(toolkit) - the O(packages) not installed, from NVIDIA's repository or the offline directory (O(offline_dir),
    its files copied to O(offline_dest) first - a local apt repository with its own C(Packages) index - or handed
    to dnf).
  - C(runtime) - C(nvidia-ctk runtime configure) for Docker and containerd when gpuprov verify's C(docker-runtime)
    or C(containerd-runtime) check is not ok, C(systemctl restart) of a running engine whose configuration is newer
    than its process (O(restart)), and C(nvidia-ctk cdi generate) when the C(cdi-spec) check is not ok (no spec,
    a GPU missing, another driver's libraries). After packages are installed the runtime part is planned again on
    the new state; after nvidia-ctk ran the checks are read again and the module fails when one is still owed.
  - Refusals come before anything changes and name the fix - an option that is not a plain value (a newline, a
    package name starting with C(-)), an offline directory without the toolkit or Docker or a dependency the guest
    lacks (all of them named together),
    Docker from nowhere, a key that does not fetch or has another fingerprint, C(nvidia-ctk) missing, a CDI spec
    owed while the driver is not loaded.
version_added: "0.2.0"
author: gpuprov contributors (@gpuprov)
options:
  parts:
    description: What to plan (the role's entry points use some), in this order whatever the order given.
    type: list
    elements: str
    choices: [repository, docker, toolkit, runtime]
    default: [repository, docker, toolkit, runtime]
  packages:
    description:
      - The toolkit's packages (their dependencies come along). Empty - C(nvidia-container-toolkit-base), which holds
        all that CDI mode needs (C(nvidia-ctk), C(nvidia-cdi-hook), C(nvidia-container-runtime)), and with
        O(legacy_hook) C(nvidia-container-toolkit) too.
    type: list
    elements: str
    default: []
  legacy_hook:
    description: Install the legacy hook (C(nvidia-container-toolkit) and C(libnvidia-container*)) and leave the nvidia
      runtime's mode alone; without it the runtime is set to CDI mode.
    type: bool
    default: false
  repo_url:
    description: NVIDIA's container toolkit repository (or a mirror of it).
    type: str
    default: https://nvidia.github.io/libnvidia-container/stable
  gpg_key_url:
    description: The repository's signing key, fetched by the guest when O(gpg_key_data) is empty (apt).
    type: str
    default: https://nvidia.github.io/libnvidia-container/gpgkey
  gpg_key_data:
    description: The signing key base64-encoded (armored or binary; armored on the RHEL family), e.g. from C(slurp)
      of a file on the controller, instead of O(gpg_key_url).
    type: str
    default: ""
  gpg_fingerprint:
    description: The primary key's expected fingerprint (hex, spaces allowed); a key with another one is refused.
    type: str
    default: ""
  keyring:
    description: The binary keyring apt's signed-by points at.
    type: path
    default: /etc/apt/keyrings/nvidia-container-toolkit.gpg
  rpm_key:
    description: Where a key given as O(gpg_key_data) goes on the RHEL family.
    type: path
    default: /etc/pki/rpm-gpg/nvidia-container-toolkit.asc
  offline_dir:
    description: The offline directory on the controller (its path names it in messages); set, Docker and the toolkit
      come from it (leave C(repository) out of O(parts) then).
    type: str
    default: ""
  offline_files:
    description: The package files in O(offline_dir) (names), already copied to O(offline_dest).
    type: list
    elements: str
    default: []
  offline_index:
    description:
      - The offline directory's apt C(Packages) index, read on the controller (the lookup C(gpuprov.kvm.offline_index)).
        Every package and dependency the guest lacks (its dpkg status) and the index does not hold is refused before
        anything is written; the index is written beside the copied files for apt.
    type: str
    default: ""
  offline_problems:
    description: What the lookup found wrong in the offline directory (a link, a FIFO, a name that is not a package
      file's); each is a refusal.
    type: list
    elements: str
    default: []
  offline_dest:
    description: Where the offline packages are on the guest (a local apt repository).
    type: path
    default: /var/lib/gpuprov/offline-packages
  install_docker:
    description: Install Docker when the guest has none (C(dockerd) not found).
    type: bool
    default: true
  docker_packages:
    description: Docker's packages (the distribution's C(docker.io), or those in the offline directory).
    type: list
    elements: str
    default: [docker.io]
  runtimes:
    description: Runtimes to configure with C(nvidia-ctk runtime configure). Empty - the engines the guest runs or is
      given (Docker when it is here or installed now, containerd when a containerd service of its own runs).
    type: list
    elements: str
    choices: [docker, containerd]
    default: []
  start:
    description: Start Docker when it is installed and does not run - through systemd, or, on a guest without it (a
      microVM whose PID 1 is not systemd), with C(start-stop-daemon) (its log in C(/var/log/gpuprov-dockerd.log)).
    type: bool
    default: true
  restart:
    description: Restart a running engine whose configuration is newer than its process (a restart stops its
      containers unless live-restore is on).
    type: bool
    default: true
  cdi:
    description: Generate the CDI spec, again whenever gpuprov verify's cdi-spec check is not ok.
    type: bool
    default: true
  cdi_output:
    description: The CDI spec's path.
    type: path
    default: /etc/cdi/nvidia.yaml
  cdi_gpus:
    description:
      - On a GPU host, the GPUs (full PCI addresses) its containers may have - those declared C(use=host). The CDI
        spec then holds only them, never a GPU declared for passthrough or vGPU - C(nvidia-ctk cdi generate) writes
        every GPU the driver shows to C(/var/lib/gpuprov/cdi/nvidia-all.json), and the module writes O(cdi_output)
        with only these (and C(all) standing for them). Unset - every GPU the driver shows (a guest).
    type: list
    elements: str
  architecture:
    description: The package architecture (C(amd64), C(arm64)); empty for the machine's.
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpuprov.kvm.plan
  - gpuprov.kvm.root
attributes:
  platform:
    platforms: posix
seealso:
  - module: gpuprov.kvm.gpu_verify
  - module: gpuprov.kvm.guest_driver
"""

EXAMPLES = r"""
- name: The toolkit from NVIDIA's repository, Docker when missing, the runtimes and the CDI spec
  gpuprov.kvm.guest_toolkit:

- name: Only the runtimes and the CDI spec (the toolkit is in the image)
  gpuprov.kvm.guest_toolkit:
    parts: [runtime]

- name: What it would do, pinning NVIDIA's key
  gpuprov.kvm.guest_toolkit:
    gpg_fingerprint: "C95B 321B 61E8 8C18 09C4  F759 DDCA E044 F796 ECB0"
  check_mode: true
"""

RETURN = r"""
plan:
  description: Every action, as text, in order (also in check mode).
  returned: always
  type: list
  elements: str
  sample:
    - run nvidia-ctk runtime configure --runtime=docker (Docker is here but has no NVIDIA runtime ...)
not_run:
  description: Live actions (commands) not run because O(root) is not C(/).
  returned: always
  type: list
  elements: str
refusals:
  description: Why the module refused, one entry per problem; nothing was changed.
  returned: failed
  type: list
  elements: dict
  contains:
    message:
      description: The problem.
      type: str
      returned: always
    fix:
      description: How to fix it (null when the message says it).
      type: str
      returned: always
    device:
      description: Always null here.
      type: str
      returned: always
installs:
  description: The packages the plan installs.
  returned: always
  type: list
  elements: str
configure:
  description: The runtimes C(nvidia-ctk runtime configure) configures.
  returned: always
  type: list
  elements: str
restart:
  description: The engines restarted (their configuration newer than their process).
  returned: always
  type: list
  elements: str
restart_pending:
  description: Engines whose configuration waits for a restart that O(restart=false) does not do.
  returned: always
  type: list
  elements: str
cdi:
  description: Why the CDI spec is generated (gpuprov verify's cdi-spec message); null when it is not.
  returned: always
  type: str
checks:
  description: gpuprov verify's docker-runtime, containerd-runtime and cdi-spec checks the plan came from.
  returned: always
  type: list
  elements: dict
  sample:
    - id: docker-runtime
      status: ok
      message: /etc/docker/daemon.json has the nvidia runtime (/usr/bin/nvidia-container-runtime)
engines:
  description: The container engines found, whether each runs, whether its configuration is newer than it.
  returned: always
  type: dict
  sample:
    docker: {binary: /usr/bin/dockerd, running: true, config_newer: false}
"""

import base64
import os
import subprocess
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.apply.actions import ApplyError, apply
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.core.plan import Plan, file_action
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.containers import DAEMON_JSON
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.docker_api import (
    EngineError,
    engine_info,
    find_engine,
)
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.driver import read_driver
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.driver_install import read_os
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.gpus import run_nvidia_smi
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.guest_toolkit import (
    APT_SOURCE,
    CDI_REFRESH_UNIT,
    DNF_REPO,
    OFFLINE_INDEX,
    OFFLINE_SOURCE,
    GuestToolkitFacts,
    read_guest_toolkit,
)
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.packages import read_services
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.facts.sysfs import Sysfs
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules.common import (
    failed_result,
    refuse_bad_root,
    warn_or_refuse,
)
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.plan.guest.keyring import (
    KeyDataError,
    fetch_failed,
    load_key,
)
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.plan.guest.toolkit import (
    CDI_STAGING,
    DOCKERD_LOG,
    PARTS,
    GuestToolkitOptions,
    GuestToolkitPlan,
    Key,
    deb_architecture,
    filter_cdi_spec,
    plan_guest_toolkit,
    toolkit_packages,
)
from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.verify.gather import import_optional, query_gpus


def _rel(path: str) -> str:
    return os.path.abspath(path).lstrip("/")


def _key(module: AnsibleModule, family: str | None) -> Key | None:
    """The repository's signing key, checked; the module fails (nothing changed) when it cannot be had."""
    p = module.params
    if p["gpg_key_data"]:
        try:
            raw = base64.b64decode(p["gpg_key_data"], validate=True)
        except ValueError:
            module.fail_json(msg="gpg_key_data is not base64 (give the key's bytes base64-encoded), nothing changed")
        source = "the controller's key file"
    elif family == "redhat":
        return None  # dnf fetches the key from the URL itself
    else:
        response, info = fetch_url(module, p["gpg_key_url"], method="GET")
        status = info.get("status")
        if response is None or (isinstance(status, int) and status >= 400):
            module.fail_json(msg=fetch_failed(p["gpg_key_url"], info.get("msg", "no answer")))
        raw = response.read()
        source = p["gpg_key_url"]
    try:
        binary, found = load_key(raw, source, p["gpg_fingerprint"])
    except KeyDataError as exc:
        module.fail_json(msg=str(exc), fingerprints=exc.found)
    return Key(binary, found, raw.decode("utf-8", "replace") if family == "redhat" else None)


def _rpm_installed(names: list[str]) -> dict[str, str] | None:
    """The installed ones of ``names`` (rpm's database is not a file to read); None when rpm cannot say."""
    try:
        out = subprocess.run(
            ["rpm", "-q", "--qf", "%{NAME} %{VERSION}-%{RELEASE}\\n", *names],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = {}
    for line in out.splitlines():
        name, _sep, version = line.partition(" ")
        if name in names and version:
            found[name] = version
    return found


def _live_facts(facts: GuestToolkitFacts, root: str) -> None:
    """What only the live guest can say: whether the CDI refresh unit is enabled (systemd), and how many
    containers a running Docker engine runs and whether it keeps them over a restart (live-restore)."""
    if facts.systemd and facts.cdi_refresh_unit:
        states = read_services(Sysfs(root), [CDI_REFRESH_UNIT]).states
        facts.cdi_refresh_enabled = None if states is None else _unit_on(states.get(CDI_REFRESH_UNIT, ("", "")))
    engine = find_engine(root)
    docker = facts.engines.get("docker")
    if engine is not None and docker is not None and docker.started is not None:
        try:
            info = engine_info(engine)
        except EngineError:
            return
        facts.docker_running, facts.docker_live_restore = info.running, info.live_restore
        facts.docker_engine_runtimes = info.runtimes


def _unit_on(state: tuple[str, str]) -> bool:
    active, enabled = state
    return active in ("active", "activating") and enabled == "enabled"


def _write_host_spec(
    module: AnsibleModule, sysfs: Sysfs, plan: GuestToolkitPlan, output: str, result: dict[str, Any], done: list[str]
) -> None:
    """nvidia-ctk wrote every GPU to the staging file: the spec gets only those this host keeps."""
    text = sysfs.read(CDI_STAGING)
    try:
        spec = filter_cdi_spec(text or "", plan.cdi_keep or [], plan.cdi_drop)
    except ValueError as exc:
        module.fail_json(
            msg=f"/{CDI_STAGING} (nvidia-ctk's spec) could not be read: {exc}", done=done, **failed_result(result)
        )
    rel = _rel(output)
    action = file_action(
        rel, spec, sysfs.read_text(rel), f"the CDI spec with only this host's GPUs ({len(plan.cdi_keep or [])} names)"
    )
    if action is not None:
        _apply(module, Plan(actions=[action]), sysfs.root, result, done, [])


def _wait_for_docker(root: str, seconds: float = 60) -> str | None:
    """After a start or restart: the engine answers on its socket, or why not (its log)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        engine = find_engine(root)
        if engine is not None and engine.ping():
            return None
        time.sleep(0.5)
    return (
        f"Docker did not answer on /var/run/docker.sock {seconds:.0f} s after it was started: see {DOCKERD_LOG} "
        "(or journalctl -u docker)"
    )


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "parts": {
                "type": "list",
                "elements": "str",
                "choices": ["repository", "docker", "toolkit", "runtime"],
                "default": ["repository", "docker", "toolkit", "runtime"],
            },
            "packages": {"type": "list", "elements": "str", "default": []},
            "legacy_hook": {"type": "bool", "default": False},
            "repo_url": {"type": "str", "default": "https://nvidia.github.io/libnvidia-container/stable"},
            "gpg_key_url": {
                "type": "str",
                "default": "https://nvidia.github.io/libnvidia-container/gpgkey",
                "no_log": False,  # a key's URL, not a secret
            },
            "gpg_key_data": {"type": "str", "default": "", "no_log": False},  # a public key
            "gpg_fingerprint": {"type": "str", "default": ""},
            "keyring": {"type": "path", "default": "/etc/apt/keyrings/nvidia-container-toolkit.gpg", "no_log": False},
            "rpm_key": {"type": "path", "default": "/etc/pki/rpm-gpg/nvidia-container-toolkit.asc", "no_log": False},
            "offline_dir": {"type": "str", "default": ""},
            "offline_files": {"type": "list", "elements": "str", "default": []},
            "offline_index": {"type": "str", "default": ""},
            "offline_problems": {"type": "list", "elements": "str", "default": []},
            "offline_dest": {"type": "path", "default": "/var/lib/gpuprov/offline-packages"},
            "install_docker": {"type": "bool", "default": True},
            "docker_packages": {"type": "list", "elements": "str", "default": ["docker.io"]},
            "runtimes": {
                "type": "list",
                "elements": "str",
                "choices": ["docker", "containerd"],
                "default": [],
            },
            "start": {"type": "bool", "default": True},
            "restart": {"type": "bool", "default": True},
            "cdi": {"type": "bool", "default": True},
            "cdi_output": {"type": "path", "default": "/etc/cdi/nvidia.yaml"},
            "cdi_gpus": {"type": "list", "elements": "str"},
            "architecture": {"type": "str", "default": ""},
            "root": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )
    refuse_bad_root(module)
    p = module.params
    root = p["root"]
    sysfs = Sysfs(root)
    parts = [part for part in PARTS if part in p["parts"]]
    offline = bool(p["offline_dir"])
    names = sorted(set(p["offline_files"]))  # checked by the planner's input boundary (package file names)
    family = read_os(sysfs).family
    key = _key(module, family) if "repository" in parts and family else None
    dest = _rel(p["offline_dest"])
    keyring, rpm_key = _rel(p["keyring"]), _rel(p["rpm_key"])
    index_rel = f"{dest}/{OFFLINE_INDEX}"
    managed = [keyring, rpm_key, APT_SOURCE, DNF_REPO, OFFLINE_SOURCE, index_rel, DAEMON_JSON]
    opts = GuestToolkitOptions(
        parts=parts,
        packages=p["packages"],
        legacy_hook=p["legacy_hook"],
        repo_url=p["repo_url"].rstrip("/"),
        gpg_key_url=p["gpg_key_url"],
        key=key,
        keyring=keyring,
        rpm_key=rpm_key,
        offline_names=names if offline else None,
        offline_source=p["offline_dir"],
        offline_dest=dest,
        offline_index=p["offline_index"] if offline and family == "debian" else None,
        offline_problems=p["offline_problems"],
        install_docker=p["install_docker"],
        docker_packages=p["docker_packages"],
        runtimes=p["runtimes"],
        start=p["start"],
        restart=p["restart"],
        cdi=p["cdi"],
        cdi_output=p["cdi_output"],
        cdi_gpus=p["cdi_gpus"],
    )
    architecture = p["architecture"] or deb_architecture(os.uname().machine)

    def facts_now() -> GuestToolkitFacts:
        packages = None
        if family == "redhat" and sysfs.live:
            packages = _rpm_installed(toolkit_packages(opts) + p["docker_packages"])
        gpu_list = None
        if "runtime" in parts and p["cdi"] and read_driver(sysfs).loaded:
            # The GPUs' indices and UUIDs the CDI spec must name: only the driver knows them.
            live = sysfs.live
            gpu_list, _error = query_gpus(
                sysfs,
                nvml=import_optional("pynvml") if live else None,
                source="auto",
                smi=run_nvidia_smi if live else None,
            )
        facts = read_guest_toolkit(
            sysfs,
            managed=managed,
            offline_dir=dest if offline else None,
            architecture=architecture,
            packages=packages,
            gpu_list=gpu_list,
        )
        if sysfs.live:
            _live_facts(facts, root)
        return facts

    def plan_now() -> tuple[GuestToolkitFacts, GuestToolkitPlan]:
        facts = facts_now()
        return facts, plan_guest_toolkit(facts, opts)

    facts, plan = plan_now()
    result = _result(plan, root, facts)
    warn_or_refuse(module, plan, result)
    if module._diff:
        result["diff"] = plan.diff(root)
    if module.check_mode:
        result["changed"] = any(sysfs.live or not a.live_only for a in plan.actions)
        module.exit_json(**result)
    done: list[str] = []
    not_run: list[str] = []
    # Packages first; what they brought (Docker's containerd, nvidia-ctk) is read again before the runtime part.
    if plan.installs and "runtime" in parts and sysfs.live:
        first = plan.actions[: plan.runtime_start]
        _apply(module, Plan(actions=first), root, result, done, not_run)
        opts.parts = ["runtime"]
        plan = plan_now()[1]
        installs = result["installs"]
        result.update(_result(plan, root, None), installs=installs)
        result["plan"] = [a.describe() for a in first] + plan.describe()
        if plan.refused:
            why = "; ".join(r.describe() for r in plan.refusals)
            module.fail_json(
                msg=f"installed {', '.join(installs)}, then the runtime part was refused: {why}",
                done=done,
                refusals=[{"message": r.message, "fix": r.fix, "device": r.device} for r in plan.refusals],
                **failed_result(result),
            )
        warn_or_refuse(module, plan, result)
    if sysfs.live and plan.cdi_keep is not None and not module.check_mode:
        os.makedirs(os.path.dirname(sysfs.write_path(CDI_STAGING)), mode=0o755, exist_ok=True)
    _apply(module, plan, root, result, done, not_run)
    if sysfs.live and plan.cdi_keep is not None:
        _write_host_spec(module, sysfs, plan, p["cdi_output"], result, done)
    if sysfs.live and plan.wait_for:
        problem = _wait_for_docker(root)
        if problem:
            module.fail_json(msg=problem, done=done, **failed_result(result))
    if sysfs.live and (plan.configure or plan.cdi or plan.restart):
        # Read again: what nvidia-ctk was to fix must be fixed now.
        opts.parts = ["runtime"]
        after = plan_now()[1]
        owed = {"docker-runtime": "docker" in after.configure, "containerd-runtime": "containerd" in after.configure}
        owed["cdi-spec"] = after.cdi is not None
        still = [c for c in after.checks if owed.get(c["id"])]
        if still or after.refused:
            result["checks_after"] = after.checks
            why = [f"{c['id']}: {c['message']}" for c in still] + ([after.refusal_text()] if after.refused else [])
            module.fail_json(msg="after nvidia-ctk: " + "; ".join(why), done=done, **failed_result(result))
    result["changed"] = bool(done)
    result["not_run"] = not_run
    module.exit_json(**result)


def _apply(
    module: AnsibleModule, plan: Plan, root: str, result: dict[str, Any], done: list[str], not_run: list[str]
) -> None:
    try:
        applied = apply(plan, root)
    except ApplyError as exc:
        module.fail_json(msg=str(exc), done=done + exc.applied.done, **failed_result(result))
    done.extend(applied.done)
    not_run.extend(applied.not_run)


def _result(plan: GuestToolkitPlan, root: str, facts: GuestToolkitFacts | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "changed": False,
        "plan": plan.describe(),
        "not_run": [],
        "root": root,
        "installs": plan.installs,
        "configure": plan.configure,
        "restart": plan.restart,
        "restart_pending": plan.restart_pending,
        "cdi": plan.cdi,
        "checks": plan.checks,
    }
    if facts is not None:
        out["engines"] = {
            name: {"binary": e.binary, "running": e.started is not None, "config_newer": e.config_newer_than_process}
            for name, e in facts.engines.items()
        }
    return out


if __name__ == "__main__":
    main()
