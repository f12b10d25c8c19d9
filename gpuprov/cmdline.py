"""Plan kernel command line changes in the bootloader config, by argument.

GRUB: one variable of ``/etc/default/grub`` (``GRUB_CMDLINE_LINUX_DEFAULT`` by
default) is edited argument by argument, never rewritten: other arguments,
comments and lines stay as they are; then ``update-grub`` (Debian/Ubuntu) or
``grub2-mkconfig`` regenerates the menu. grubby (RHEL family, BLS entries)
takes ``--args``/``--remove-args`` directly. Whether a reboot is still owed is
decided by comparing the wanted arguments with ``/proc/cmdline``.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from .host.iommu import parse_cmdline
from .plan import COMMAND, Action, Plan, Refusal, file_action

GRUB_DEFAULT = "etc/default/grub"
_ARG_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass
class CmdlineRequest:
    add: dict[str, str | None] = field(default_factory=dict)  # name -> value (None: a bare flag)
    remove: list[str] = field(default_factory=list)
    variable: str = "GRUB_CMDLINE_LINUX_DEFAULT"


@dataclass
class CmdlinePlan(Plan):
    args_before: str | None = None
    args_after: str | None = None
    reboot_required: bool = False


def parse_args(items: list[str]) -> dict[str, str | None]:
    """``["intel_iommu=on", "iommu=pt", "quiet"]`` -> a name/value map; raises ValueError on a bad name."""
    out: dict[str, str | None] = {}
    for item in items:
        name, sep, value = item.strip().partition("=")
        if not _ARG_NAME.match(name):
            raise ValueError(f"'{item}' is not a kernel argument: use name or name=value, e.g. intel_iommu=on")
        out[name] = value if sep else None
    return out


def _token(name: str, value: str | None) -> str:
    return name if value is None else f"{name}={value}"


def edit_args(current: str, add: dict[str, str | None], remove: list[str]) -> str:
    """Add/replace/remove arguments by name; everything else keeps its place."""
    tokens = current.split()
    out: list[str] = []
    seen: set[str] = set()
    for tok in tokens:
        name = tok.partition("=")[0]
        if name in remove:
            continue
        if name in add:
            if name in seen:
                continue  # a duplicate of an argument we set: keep one
            out.append(_token(name, add[name]))
            seen.add(name)
        else:
            out.append(tok)
    out += [_token(n, v) for n, v in add.items() if n not in seen]
    return " ".join(out)


def _find_variable(text: str, variable: str) -> tuple[int, int, str, str] | None:
    """(start, end, quote, value) of the last ``VAR="..."`` assignment, as shell sources it."""
    found = None
    for m in re.finditer(rf"^[ \t]*(?:export[ \t]+)?{re.escape(variable)}=(.*)$", text, re.M):
        raw = m.group(1).strip()
        quote = raw[:1] if raw[:1] in ("'", '"') else ""
        try:
            parts = shlex.split(raw, comments=True)
        except ValueError:
            continue
        found = (m.start(1), m.end(1), quote or '"', " ".join(parts))
    return found


def plan_grub(grub_text: str | None, proc_cmdline: str, request: CmdlineRequest, update_argv: list[str]) -> CmdlinePlan:
    plan = CmdlinePlan()
    if grub_text is None:
        plan.refusals.append(
            Refusal(
                f"/{GRUB_DEFAULT} does not exist: this host does not boot through GRUB's defaults file",
                "use bootloader=grubby on RHEL-family hosts, or set the arguments in your bootloader's config",
            )
        )
        return plan
    found = _find_variable(grub_text, request.variable)
    current = found[3] if found else ""
    new = edit_args(current, request.add, request.remove)
    plan.args_before, plan.args_after = current, new
    if new != current:
        if found:
            start, end, quote, _rest = found
            quote = "'" if quote == "'" and "'" not in new else '"'
            text = grub_text[:start] + f"{quote}{new}{quote}" + grub_text[end:]
        else:
            text = (
                grub_text
                + ("" if grub_text.endswith("\n") or not grub_text else "\n")
                + f'{request.variable}="{new}"\n'
            )
        action = file_action(GRUB_DEFAULT, text, grub_text, "kernel arguments for the next boot")
        if action:
            plan.actions.append(action)
            plan.actions.append(Action(COMMAND, "regenerate the GRUB menu", argv=update_argv))
    plan.reboot_required = reboot_owed(proc_cmdline, request)
    return plan


def plan_grubby(default_args: str, proc_cmdline: str, request: CmdlineRequest) -> CmdlinePlan:
    """grubby: ``default_args`` is what ``grubby --info=DEFAULT`` shows as args."""
    plan = CmdlinePlan(args_before=default_args)
    plan.args_after = edit_args(default_args, request.add, request.remove)
    present = parse_cmdline(default_args)
    to_add = [_token(n, v) for n, v in request.add.items() if n not in present or present[n] != v]
    to_remove = [n for n in request.remove if n in present]
    if to_add:
        plan.actions.append(
            Action(
                COMMAND,
                "kernel arguments for every entry",
                argv=["grubby", "--update-kernel=ALL", f"--args={' '.join(to_add)}"],
            )
        )
    if to_remove:
        plan.actions.append(
            Action(
                COMMAND,
                "drop kernel arguments",
                argv=["grubby", "--update-kernel=ALL", f"--remove-args={' '.join(to_remove)}"],
            )
        )
    plan.reboot_required = reboot_owed(proc_cmdline, request)
    return plan


def reboot_owed(proc_cmdline: str, request: CmdlineRequest) -> bool:
    """True when the running kernel was not booted with what is wanted."""
    running = parse_cmdline(proc_cmdline)
    missing = any(n not in running or running[n] != v for n, v in request.add.items())
    extra = any(n in running for n in request.remove)
    return missing or extra
