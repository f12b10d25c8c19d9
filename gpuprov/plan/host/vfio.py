"""Plan binding devices to vfio-pci: now (sysfs) and from boot (files).

Early binding by PCI address, the way driverctl does it: a udev rule sets
``driver_override`` to vfio-pci as each device appears, and ``softdep`` makes
vfio-pci load before the GPU and companion drivers, so nvidia/nouveau never
claim the device. Both go into the initramfs. Devices are named by full
address only: two identical GPUs, one kept for the host, is the common case.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ...core.plan import COMMAND, Action, Plan, Refusal, file_action, sysfs_write
from ...facts.evidence import IN_USE
from ...facts.host import HostFacts
from ...inputs.validate import Problems, pci_address
from ...rules.assess import (
    BLOCKER,
    NEVER_OVERRIDDEN,
    VFIO_DRIVERS,
    assess_gpu,
    bridge_kind,
    companions_of,
    held_open,
    unknown_findings,
)

MODPROBE_CONF = "etc/modprobe.d/gpuprov-vfio.conf"
UDEV_RULES = "etc/udev/rules.d/61-gpuprov-vfio.rules"
INITRAMFS_HOOK = "etc/initramfs-tools/hooks/gpuprov-vfio"
DRACUT_CONF = "etc/dracut.conf.d/gpuprov-vfio.conf"

# Drivers that could claim a GPU or its companions before vfio-pci does.
SOFTDEP_DRIVERS = (
    "nvidia",
    "nouveau",
    "amdgpu",
    "radeon",
    "snd_hda_intel",
    "xhci_pci",
    "ucsi_ccg",
    "i2c_nvidia_gpu",
)
_HEADER = "# Managed by gpuprov (vfio_host role / vfio_bind module); edits are overwritten.\n"
_RULE_RE = re.compile(r'KERNEL=="([0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7])"')


@dataclass
class VfioRequest:
    devices: list[str]
    state: str = "bound"  # bound | unbound
    persistent: bool = True
    allow_unsafe: list[str] = field(default_factory=list)  # expert override, per device


@dataclass
class VfioPlan(Plan):
    bind_set: list[str] = field(default_factory=list)  # requested + companions
    previous_drivers: dict[str, str | None] = field(default_factory=dict)


def addresses_in_rules(text: str | None) -> list[str]:
    """Devices the managed udev rule file binds."""
    return sorted(set(_RULE_RE.findall(text or "")))


def udev_rules(addresses: list[str]) -> str | None:
    if not addresses:
        return None
    lines = [
        _HEADER,
        "# Early binding: these devices go to vfio-pci from boot.\n",
    ]
    lines += [
        f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{a}", ATTR{{driver_override}}="vfio-pci"\n' for a in addresses
    ]
    return "".join(lines)


def modprobe_conf(addresses: list[str]) -> str | None:
    # driver_override alone keeps other drivers off; loading vfio-pci first also
    # covers drivers that udev loads for the device before the rule has run.
    if not addresses:
        return None
    return (
        _HEADER
        + "# vfio-pci loads before any driver that could claim a device the udev rule gives it.\n"
        + "".join(f"softdep {d} pre: vfio-pci\n" for d in SOFTDEP_DRIVERS)
    )


def initramfs_hook(addresses: list[str]) -> str | None:
    if not addresses:
        return None
    return f"""#!/bin/sh
{_HEADER.strip()}
# Puts vfio-pci, the early-binding udev rule and the softdeps into the initramfs,
# so the devices are claimed before a GPU driver in the initramfs can take them.
PREREQ="udev"
prereqs() {{ echo "$PREREQ"; }}
case "$1" in prereqs) prereqs; exit 0 ;; esac
. /usr/share/initramfs-tools/hook-functions
manual_add_modules vfio vfio_iommu_type1 vfio_pci
mkdir -p "$DESTDIR/etc/udev/rules.d" "$DESTDIR/etc/modprobe.d"
cp /{UDEV_RULES} "$DESTDIR/etc/udev/rules.d/"
cp /{MODPROBE_CONF} "$DESTDIR/etc/modprobe.d/"
"""


def dracut_conf(addresses: list[str]) -> str | None:
    if not addresses:
        return None
    return (
        _HEADER
        + 'force_drivers+=" vfio vfio_iommu_type1 vfio_pci "\n'
        + f'install_items+=" /{UDEV_RULES} /{MODPROBE_CONF} "\n'
    )


def _addresses(option: str, values: list[str], plan: Plan) -> list[str]:
    """An option's PCI addresses that pass the one rule for them (:func:`gpuprov.inputs.validate.pci_address`),
    normalised; a refusal for each that does not."""
    out = []
    for i, value in enumerate(values):
        problems = Problems()
        address = pci_address(problems, f"{option}[{i}]", value)
        plan.refusals += problems.items
        if address is not None:
            out.append(address)
    return out


def _normalize(request: VfioRequest, facts: HostFacts, plan: Plan) -> list[str]:
    wanted: list[str] = []
    for addr in _addresses("devices", request.devices, plan):
        if addr not in facts.pci:
            plan.refusals.append(
                Refusal(
                    f"no PCI device {addr} on this host",
                    "check the address with `lspci -D` or `gpuprov inspect --all`",
                    addr,
                )
            )
            continue
        if addr not in wanted:
            wanted.append(addr)
    if not request.devices:
        plan.refusals.append(Refusal("no devices given", "list the full PCI addresses to bind, e.g. 0000:41:00.0"))
    return wanted


def _safety(facts: HostFacts, request: VfioRequest, wanted: list[str], bind_set: list[str], plan: Plan) -> None:
    """Refuse per the safety rules (gpuprov.rules.assess); an expert override turns a device's
    refusals into warnings, except those no override lifts (a bridge or port)."""
    held = held_open(facts)
    for addr in wanted:
        gpu = assess_gpu(facts, addr, held)
        findings = gpu.findings
        if request.state == "unbound":
            # Giving a device back is only unsafe while something holds it, or may.
            involved = [addr, *gpu.group_members, *gpu.companions]
            findings = [f for f in findings if f.code == "in-use"] + unknown_findings(facts, involved, [IN_USE])
        for finding in findings:
            if finding.severity != BLOCKER:
                continue
            if finding.code == "group-shared" and finding.device in bind_set:
                continue  # the other member is being bound too
            if finding.code == "in-use" and request.state == "bound":
                member = facts.pci.get(finding.device or addr)
                if member is not None and member.driver in VFIO_DRIVERS:
                    continue  # already vfio's and held by its VM: nothing to change
            message = f"{addr}: {finding.message}"
            if addr in request.allow_unsafe:
                if finding.code not in NEVER_OVERRIDDEN:
                    plan.warnings.append(f"OVERRIDDEN by allow_unsafe: {message}")
                    continue
                message += " (allow_unsafe does not lift this)"
            plan.refusals.append(Refusal(message, finding.fix, addr, IN_USE if finding.code == IN_USE else None))


def _runtime_bind(facts: HostFacts, bind_set: list[str], plan: VfioPlan) -> None:
    todo = [a for a in bind_set if facts.pci[a].driver not in VFIO_DRIVERS]
    if not todo:
        return
    if "vfio_pci" not in facts.iommu.modules:
        plan.actions.append(Action(COMMAND, "load vfio-pci", argv=["modprobe", "vfio-pci"]))
    for addr in todo:
        dev = facts.pci[addr]
        if dev.driver_override != "vfio-pci":
            plan.actions.append(
                sysfs_write(f"{dev.sysfs_path}/driver_override", "vfio-pci", "only vfio-pci may bind it")
            )
    for addr in todo:
        driver = facts.pci[addr].driver
        if driver:
            plan.actions.append(sysfs_write(f"sys/bus/pci/drivers/{driver}/unbind", addr, f"release it from {driver}"))
    for addr in todo:
        plan.actions.append(sysfs_write("sys/bus/pci/drivers_probe", addr, "bind it to vfio-pci"))


def _runtime_unbind(facts: HostFacts, bind_set: list[str], plan: VfioPlan) -> None:
    for addr in bind_set:
        dev = facts.pci[addr]
        if dev.driver_override:
            plan.actions.append(sysfs_write(f"{dev.sysfs_path}/driver_override", "\n", "let any driver bind it"))
        if dev.driver in VFIO_DRIVERS:
            unbind = f"sys/bus/pci/drivers/{dev.driver}/unbind"
            plan.actions.append(sysfs_write(unbind, addr, f"release it from {dev.driver}"))
            plan.actions.append(sysfs_write("sys/bus/pci/drivers_probe", addr, "give it back to its host driver"))


def _persistence(
    facts: HostFacts,
    request: VfioRequest,
    bind_set: list[str],
    files: dict[str, str | None],
    initramfs: list[str],
    plan: VfioPlan,
) -> None:
    current = addresses_in_rules(files.get(UDEV_RULES))
    for addr in [a for a in current if a in facts.pci and bridge_kind(facts, facts.pci[a])]:
        # Written by an older version: a bridge or port never gets vfio-pci from boot.
        current.remove(addr)
        plan.warnings.append(f"{addr} is a bridge or port: dropped from {UDEV_RULES}, it stays with the host")
    if request.state == "bound":
        addresses = sorted(set(current) | set(bind_set))
    else:
        addresses = sorted(set(current) - set(bind_set))
    wanted = {UDEV_RULES: udev_rules(addresses), MODPROBE_CONF: modprobe_conf(addresses)}
    # The hook is written where initramfs-tools is, or where no tool is known
    # (a staged root); the rebuild runs only with the tool that is there.
    if "initramfs-tools" in initramfs or not initramfs:
        wanted[INITRAMFS_HOOK] = initramfs_hook(addresses)
    if "dracut" in initramfs:
        wanted[DRACUT_CONF] = dracut_conf(addresses)
    changed = False
    for path, content in wanted.items():
        mode = 0o755 if path == INITRAMFS_HOOK else 0o644
        action = file_action(path, content, files.get(path), "early binding from boot", mode)
        if action:
            plan.actions.append(action)
            changed = True
    if changed and "initramfs-tools" in initramfs:
        plan.actions.append(Action(COMMAND, "rebuild the initramfs", argv=["update-initramfs", "-u", "-k", "all"]))
    elif changed and "dracut" in initramfs:
        plan.actions.append(Action(COMMAND, "rebuild the initramfs", argv=["dracut", "-f", "--regenerate-all"]))


def plan_vfio(
    facts: HostFacts, request: VfioRequest, files: dict[str, str | None], initramfs: list[str] | None = None
) -> VfioPlan:
    """Actions that bind (or release) ``request.devices`` and their companions,
    or refusals. ``files``: current text of the managed files (None: absent);
    ``initramfs``: the initramfs tools the host has ("initramfs-tools", "dracut")."""
    plan = VfioPlan()
    if request.state not in ("bound", "unbound"):
        plan.refusals.append(Refusal(f"state '{request.state}' is not one of bound, unbound"))
        return plan
    wanted = _normalize(request, facts, plan)
    request = replace(request, allow_unsafe=_addresses("allow_unsafe", request.allow_unsafe, plan))
    if plan.refused:
        return plan
    bind_set = sorted({a for w in wanted for a in [w, *companions_of(facts, w)]})
    plan.bind_set = bind_set
    plan.previous_drivers = {a: facts.pci[a].driver for a in bind_set}
    _safety(facts, request, wanted, bind_set, plan)
    if plan.refused:
        return plan
    if request.state == "bound":
        _runtime_bind(facts, bind_set, plan)
    else:
        _runtime_unbind(facts, bind_set, plan)
    if request.persistent:
        _persistence(facts, request, bind_set, files, initramfs or [], plan)
    return plan


MANAGED_FILES = (UDEV_RULES, MODPROBE_CONF, INITRAMFS_HOOK, DRACUT_CONF)
