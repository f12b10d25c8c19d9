"""What the module gpu_vm does around its plan: whether to consult libvirt, what it
reads there and on disk, the plan, and :func:`finish_vm` (refuse, report or carry
out; one result shape). The module stays thin: argument spec -> validate -> facts
-> plan -> apply -> finish (:mod:`gpuprov.modules.common`).

Ships to targets with the modules (``module_utils``); standard library only.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..apply.actions import Applied, ApplyError, apply
from ..apply.libvirt import execute, wait_for_address
from ..core.plan import Plan
from ..core.vm_spec import ConsoleCheck, VmSpec
from ..facts.host import HostFacts, cpu_count, gather
from ..facts.libvirt import (
    LibvirtMissing,
    LiveDomain,
    bindings,
    connect,
    leases_before_boot,
    network_state,
    other_assignments,
    read_live,
)
from ..facts.sysfs import Sysfs
from ..facts.vm_storage import StorageState, read_storage
from ..inputs.boundary import validate_gpu_vm_options
from ..plan.vm.fit import plan_host
from ..plan.vm.host import VmHostPlan
from ..plan.vm.plan import START, VmOptions, VmPlan, plan_vm, vm_paths
from ..plan.vm.seed import ISO_TOOLS
from ..verify.console import check_console
from . import gpu_vm_host
from .common import failed_result, planned, warn_or_refuse

ARGUMENT_SPEC: dict[str, Any] = {
    "vm": {"type": "dict", "required": True},
    "state": {"type": "str", "choices": ["defined", "running", "shutdown", "absent"], "default": "running"},
    "defaults": {"type": "dict", "default": {}},
    "host_vms": {"type": "list", "elements": "dict", "default": []},
    "uri": {"type": "str", "default": "qemu:///system"},
    "storage_dir": {"type": "path", "default": "/var/lib/libvirt/images/gpuprov"},
    "remove_storage": {"type": "bool", "default": False},
    "reserved_memory_mib": {"type": "int"},
    "reserved_cpus": {"type": "str", "default": "0"},
    "mixed_vgpu_types": {"type": "bool", "default": False},
    "declared": {"type": "dict"},
    "wait_for_address": {"type": "int", "default": 0},
    "shutdown_timeout": {"type": "int", "default": 180},
    "console_checks": {
        "type": "list",
        "elements": "dict",
        "default": [],
        "options": {
            "vm": {"type": "str"},
            "wait_for": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 600},
            "expect": {"type": "list", "elements": "str", "default": []},
        },
    },
    "install": {"type": "bool", "default": False},
    "packages": {"type": "list", "elements": "str", "default": []},
    "root": {"type": "path", "default": "/"},
}


def checked_options(module: Any) -> tuple[Any, HostFacts]:
    """The module's options through the input boundary
    (:func:`gpuprov.inputs.boundary.validate_gpu_vm_options`, the CPU numbers bounded by the host's),
    and the host's facts read for it; the module fails, naming every problem, nothing changed."""
    p = module.params
    facts = gather(Sysfs(p["root"]))
    given, problems = validate_gpu_vm_options(p, cpu_limit=cpu_count(facts))
    if given is None or problems:
        warn_or_refuse(module, Plan(refusals=problems), {"plan": [], "not_run": [], "root": p["root"]})
    return given, facts


def plan(module: Any, given: Any, facts: HostFacts) -> tuple[VmPlan, Any, dict[str, Any]]:
    """gpu_vm's read and plan for the VM ``given`` names: with ``install``, what the host lacks (carried
    out first, :func:`open_libvirt`), libvirt consulted or not, then :func:`plan_gpu_vm`. Returns the
    plan, the libvirt connection (None: not consulted) and the rest :func:`finish_vm` takes."""
    p = module.params
    install = plan_install(module, p["root"])
    conn, installed = open_libvirt(module, p["root"], p["uri"], install)
    vm, spec = plan_gpu_vm(module, facts, given, conn)
    extra = {
        "shutdown_timeout": p["shutdown_timeout"],
        "wait_address": p["wait_for_address"],
        "console_checks": given.console_checks,
        "install": install,
        "installed": installed,
        **vm_result(given.state, spec),
    }
    return vm, conn, extra


def find_iso_tool(which: Any) -> str | None:
    """The first ISO tool ``which(name)`` finds (``AnsibleModule.get_bin_path`` or shutil.which)."""
    for name in ISO_TOOLS:
        path = which(name)
        if path:
            return str(path)
    return None


def consults_libvirt(root: str, uri: str) -> bool:
    """Whether gpu_vm talks to libvirt at ``uri``: on the live root, or through libvirt's test
    driver (``test:///...``, a fake that holds no machine). With a staged or captured root the
    facts are another machine's: libvirt here, and every command, stay untouched."""
    return Sysfs(root).live or uri.startswith("test:///")


def plan_install(module: Any, root: str) -> VmHostPlan | None:
    """With ``install``: what the host lacks to run VMs (:mod:`gpuprov.plan.vm.host`, the plan of
    the module gpu_vm_host), planned in gpu_vm's own run (issue #14: one module call per concern)."""
    p = module.params
    if not p["install"]:
        return None
    return gpu_vm_host.plan({"root": root, "packages": p["packages"]})


def open_libvirt(module: Any, root: str, uri: str, install: VmHostPlan | None = None) -> tuple[Any, Applied]:
    """A libvirt connection when gpu_vm consults libvirt (:func:`consults_libvirt`), else None, and
    what was installed or started first (``install``'s actions; not in check mode). The module fails
    when the bindings are missing or the connection fails, except in check mode before an install
    that would bring them: then None, with a warning."""
    applied = Applied()
    if install is not None:
        warn_or_refuse(module, install, {"plan": planned(install.describe(), module.check_mode), **install.result()})
        if install.actions and not module.check_mode:
            try:
                applied = apply(Plan(actions=install.actions), root)
            except ApplyError as exc:
                module.fail_json(msg=str(exc), done=exc.applied.done)
            importlib.invalidate_caches()  # the bindings may be new in this run
    if not consults_libvirt(root, uri):
        return None, applied
    try:
        return connect(uri), applied
    except (LibvirtMissing, RuntimeError) as exc:
        if module.check_mode and install is not None and install.actions:
            module.warn(
                f"libvirt is not ready ({exc}); the run would install or start it first: "
                "the plan takes the domain as absent"
            )
            return None, applied
        module.fail_json(msg=str(exc))
    return None, applied


def plan_gpu_vm(module: Any, facts: HostFacts, given: Any, conn: Any) -> tuple[VmPlan, VmSpec | None]:
    """The plan for the VM ``given`` names (``given``: :func:`gpuprov.inputs.boundary.validate_gpu_vm_options`'s
    input): the host plan over its list, then what libvirt (``conn``; None: not consulted) and
    the disk below ``root`` hold, then :func:`gpuprov.plan.vm.plan.plan_vm`. Returns the plan and the VM's spec."""
    p = module.params
    root = p["root"]
    host = plan_host(facts, given.vm_list, given.settings, declared=given.declared)
    spec = host.vm(given.name)
    live = read_live(conn, given.name) if conn is not None else LiveDomain()
    storage = StorageState()
    if spec is not None:
        storage = read_storage(spec, vm_paths(spec, p["storage_dir"]), p["storage_dir"], root)
    opts = VmOptions(
        state=given.state,
        storage_dir=p["storage_dir"],
        # Another root: the tools are that host's, and nothing is run here.
        iso_tool=find_iso_tool(module.get_bin_path) or (None if conn is not None else ISO_TOOLS[0]),
        qemu_img=module.get_bin_path("qemu-img") or "qemu-img",
        remove_storage=p["remove_storage"],
        network_state=network_state(conn, spec.network if spec else None) if conn is not None else "active",
    )
    others = other_assignments(conn, given.name) if conn is not None and given.state != "absent" else {}
    plan = plan_vm(facts, host, given.name, live if live.exists else LiveDomain(), others, storage, opts)
    if conn is None and not consults_libvirt(root, p["uri"]):
        plan.warnings.append(
            f"root is {root}, not /: libvirt ({p['uri']}) was not consulted and nothing is run on this machine; "
            "the plan takes the domain as absent and its network as active (see not_run)"
        )
    return plan, spec


def vm_result(state: str, spec: VmSpec | None) -> dict[str, Any]:
    """What gpu_vm's result says of the VM besides the plan: its state, MAC and guest user."""
    return {
        "state": state,
        "mac": spec.guest_mac if spec is not None and spec.network else None,
        "guest_user": spec.cloud_init.user if spec is not None and spec.cloud_init else None,
    }


def finish_vm(
    module: Any,
    plan: VmPlan,
    conn: Any,
    root: str,
    *,
    shutdown_timeout: float = 180,
    wait_address: float = 0,
    console_checks: list[ConsoleCheck] | None = None,
    install: VmHostPlan | None = None,
    installed: Applied | None = None,
    **extra: Any,
) -> None:
    """Exit the module ``gpu_vm``: refuse, report (check mode) or carry out ``plan``.

    Like :func:`gpuprov.modules.common.finish`, plus the libvirt ops: storage first,
    then sysfs writes, then libvirt, then storage clean-up. Files are written below
    ``root``; commands and sysfs writes run only when ``root`` is ``/``, libvirt ops
    only with a connection (``conn`` None: not consulted, see :func:`consults_libvirt`);
    the rest is reported in ``not_run``. Then, on a running domain, the ``console_checks`` of its
    serial log (:mod:`gpuprov.verify.console`; not in check mode). ``install``: the host's install
    plan, carried out before (``installed``, :func:`open_libvirt`), shown first. ``module`` is an ``AnsibleModule``.
    """
    before = install.describe() if install is not None else []
    result: dict[str, Any] = {
        "changed": False,
        "plan": planned(before + plan.describe(), module.check_mode),
        "not_run": [],
        "root": root,
        "name": plan.name,
        "xml": plan.xml,
        "needs_restart": plan.needs_restart,
        "placement": plan.placement.as_dict() if plan.placement else None,
        "paths": plan.paths,
        "addresses": [],
        "host": install.result() if install is not None else None,
        **extra,
    }
    warn_or_refuse(module, plan, result)
    if module._diff:
        diffs = (install.diff(root) if install is not None else []) + plan.diff(root)
        domain = plan.domain_diff()
        result["diff"] = [domain, *diffs] if domain else diffs
    live = Sysfs(root).live
    if module.check_mode:
        steps = plan.actions + plan.sysfs + plan.cleanup
        result["changed"] = (
            any(live or not a.live_only for a in steps)
            or bool(plan.ops and conn is not None)
            or bool(install is not None and install.actions)
        )
        module.exit_json(**result)
    done: list[str] = list(installed.done) if installed else []
    not_run: list[str] = list(installed.not_run) if installed else []
    try:
        for actions in (plan.actions, plan.sysfs):
            applied = apply(Plan(actions=actions), root)
            done += applied.done
            not_run += applied.not_run
    except ApplyError as exc:
        module.fail_json(msg=str(exc), done=done + exc.applied.done, **failed_result(result))
    if conn is None:
        not_run += [op.describe() for op in plan.ops]
    else:
        libvirt = bindings()
        try:
            done += execute(conn, plan, shutdown_timeout)
        except libvirt.libvirtError as exc:
            module.fail_json(msg=f"libvirt: {exc}", done=done, **failed_result(result))
    try:
        applied = apply(Plan(actions=plan.cleanup), root)
        done += applied.done
        not_run += applied.not_run
    except ApplyError as exc:
        module.fail_json(msg=str(exc), done=done + exc.applied.done, **failed_result(result))
    result["changed"] = bool(done)
    result["done"] = done
    result["not_run"] = not_run
    if wait_address and conn is not None and extra.get("state") == "running" and plan.mac:
        # Started here: the leases the MAC had before (execute); running already: those from before its boot.
        started_here = any(op.kind == START for op in plan.ops)
        stale = (
            plan.stale_leases
            if started_here
            else leases_before_boot(conn, Sysfs(root), plan.name, plan.network, plan.mac)
        )
        addresses = wait_for_address(conn, plan.network, plan.mac, wait_address, stale)
        result["addresses"] = addresses
        if addresses:
            result["guest"] = {
                "name": plan.name,
                "address": addresses[0],
                "addresses": addresses,
                "user": extra.get("guest_user"),
            }
        if not addresses:
            module.fail_json(
                msg=f"domain {plan.name} got no address on its network within {wait_address:.0f}s "
                f"(MAC {plan.mac}); see its serial log {plan.paths.get('serial_log')}",
                **failed_result(result),
            )
    log = plan.paths.get("serial_log")
    if console_checks and extra.get("state") == "running" and log and conn is not None:
        console = check_console(Sysfs(root), log, console_checks)
        result["console"] = console.as_dict()
        if console.problems:
            module.fail_json(
                msg=f"domain {plan.name}'s serial console: " + "; ".join(console.problems), **failed_result(result)
            )
    module.exit_json(**result)
