"""guest_toolkit's options, its read-and-plan step and how it carries the plan out: NVIDIA's
container toolkit in a GPU guest (:mod:`gpuprov.plan.guest.toolkit`).

The run: the repository's key had (:func:`options`: given, or fetched through the module's
:data:`~gpuprov.modules.common.Fetch`), the guest read (:meth:`Guest.facts`: its files through
:class:`Sysfs`, and on the live guest what only it can say: rpm's database, the CDI refresh unit,
the Docker engine) and planned; then :func:`finish`: packages first, the guest read and planned again
on what they brought, the runtime part, the CDI spec cut to this host's GPUs, Docker waited for,
and what nvidia-ctk was to fix read once more. Every write goes through :mod:`gpuprov.apply.actions`.

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass
from typing import Any

from ..apply import actions
from ..core.plan import Plan, file_action
from ..facts.containers import DAEMON_JSON
from ..facts.docker_api import EngineError, engine_info, find_engine
from ..facts.driver import read_driver
from ..facts.driver_install import read_os
from ..facts.gpus import run_nvidia_smi
from ..facts.guest_toolkit import (
    APT_SOURCE,
    CDI_REFRESH_UNIT,
    DNF_REPO,
    OFFLINE_INDEX,
    OFFLINE_SOURCE,
    GuestToolkitFacts,
    read_guest_toolkit,
)
from ..facts.mig import run_command
from ..facts.packages import read_services, rpm_installed
from ..facts.sysfs import Sysfs
from ..plan.guest.keyring import KeyDataError, fetch_failed, load_key
from ..plan.guest.toolkit import (
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
from ..verify.gather import import_optional, query_gpus
from .common import Fetch, failed_result, warn_or_refuse

ARGUMENT_SPEC: dict[str, Any] = {
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
}
DOCKER_WAIT = 60  # seconds Docker has to answer on its socket after a start or restart


def _rel(path: str) -> str:
    return os.path.abspath(path).lstrip("/")


@dataclass
class Guest:
    """One run's options as the planner takes them, and how to read the guest again."""

    root: str
    sysfs: Sysfs
    opts: GuestToolkitOptions
    parts: list[str]  # the parts asked for (``opts.parts`` narrows to the runtime part on a second read)
    family: str | None
    managed: list[str]
    offline_dir: str | None
    architecture: str

    def facts(self) -> GuestToolkitFacts:
        """The guest as it is now (on the live guest, rpm's database and the engines' answers too)."""
        sysfs, opts = self.sysfs, self.opts
        packages = None
        if self.family == "redhat" and sysfs.live:
            # rpm's database is not a file to read: rpm --query (None when rpm cannot say).
            packages = rpm_installed(toolkit_packages(opts) + opts.docker_packages, run_command)
        gpu_list = None
        if "runtime" in self.parts and opts.cdi and read_driver(sysfs).loaded:
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
            managed=self.managed,
            offline_dir=self.offline_dir,
            architecture=self.architecture,
            packages=packages,
            gpu_list=gpu_list,
        )
        if sysfs.live:
            _live_facts(facts, self.root)
        return facts

    def plan(self) -> tuple[GuestToolkitFacts, GuestToolkitPlan]:
        facts = self.facts()
        return facts, plan_guest_toolkit(facts, self.opts)


def options(module: Any, fetch: Fetch) -> Guest:
    """``module``'s params as the planner takes them, the repository's key had and checked (the
    module fails, nothing changed, when it cannot be); the offline files' names are checked by the
    planner's input boundary (package file names), the CDI GPUs' addresses too."""
    p = module.params
    sysfs = Sysfs(p["root"])
    parts = [part for part in PARTS if part in p["parts"]]
    offline = bool(p["offline_dir"])
    names = sorted(set(p["offline_files"]))
    family = read_os(sysfs).family
    key = _key(module, fetch, family) if "repository" in parts and family else None
    dest = _rel(p["offline_dest"])
    keyring, rpm_key = _rel(p["keyring"]), _rel(p["rpm_key"])
    index_rel = f"{dest}/{OFFLINE_INDEX}"
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
    return Guest(
        root=p["root"],
        sysfs=sysfs,
        opts=opts,
        parts=parts,
        family=family,
        managed=[keyring, rpm_key, APT_SOURCE, DNF_REPO, OFFLINE_SOURCE, index_rel, DAEMON_JSON],
        offline_dir=dest if offline else None,
        architecture=p["architecture"] or deb_architecture(os.uname().machine),
    )


def _key(module: Any, fetch: Fetch, family: str | None) -> Key | None:
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
        fetched, why = fetch(p["gpg_key_url"])
        if fetched is None:
            module.fail_json(msg=fetch_failed(p["gpg_key_url"], why))
        raw = fetched or b""
        source = p["gpg_key_url"]
    try:
        binary, found = load_key(raw, source, p["gpg_fingerprint"])
    except KeyDataError as exc:
        module.fail_json(msg=str(exc), fingerprints=exc.found)
    return Key(binary, found, raw.decode("utf-8", "replace") if family == "redhat" else None)


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


def finish(module: Any, guest: Guest, facts: GuestToolkitFacts, plan: GuestToolkitPlan) -> None:
    """Exit the module guest_toolkit: refuse, report (check mode) or carry out ``plan`` in its steps
    (the module docstring's); the module fails, saying what was done, when a step fails or nvidia-ctk
    left undone what it was to do."""
    sysfs, opts, root = guest.sysfs, guest.opts, guest.root
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
    if plan.installs and "runtime" in guest.parts and sysfs.live:
        first = plan.actions[: plan.runtime_start]
        _apply(module, Plan(actions=first), root, result, done, not_run)
        opts.parts = ["runtime"]
        plan = guest.plan()[1]
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
        actions.make_parent(root, CDI_STAGING)  # nvidia-ctk writes its spec there, every GPU in it
    _apply(module, plan, root, result, done, not_run)
    if sysfs.live and plan.cdi_keep is not None:
        _write_host_spec(module, sysfs, plan, opts.cdi_output, result, done)
    if sysfs.live and plan.wait_for:
        problem = _wait_for_docker(root)
        if problem:
            module.fail_json(msg=problem, done=done, **failed_result(result))
    if sysfs.live and (plan.configure or plan.cdi or plan.restart):
        # Read again: what nvidia-ctk was to fix must be fixed now.
        opts.parts = ["runtime"]
        after = guest.plan()[1]
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


def _apply(module: Any, plan: Plan, root: str, result: dict[str, Any], done: list[str], not_run: list[str]) -> None:
    # actions.apply looked up at each call: a test stands a simulated guest in for it.
    try:
        applied = actions.apply(plan, root)
    except actions.ApplyError as exc:
        module.fail_json(msg=str(exc), done=done + exc.applied.done, **failed_result(result))
    done.extend(applied.done)
    not_run.extend(applied.not_run)


def _write_host_spec(
    module: Any, sysfs: Sysfs, plan: GuestToolkitPlan, output: str, result: dict[str, Any], done: list[str]
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


def _wait_for_docker(root: str, seconds: float = DOCKER_WAIT) -> str | None:
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
