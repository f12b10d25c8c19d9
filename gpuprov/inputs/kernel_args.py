"""Kernel arguments and the boot options given with them, checked where they come in
(docs/reference/kernel-cmdline.md, docs/reference/boot-trial.md).

``update-grub`` sources ``/etc/default/grub`` as shell, as root, and pastes the variable into
``grub.cfg``, which GRUB parses as its own script at boot. So every argument passes
:func:`argument_problem` (exactly one kernel argument, of characters that neither shell nor GRUB's
script expand): an argument given as an option here (kernel_cmdline's ``arguments`` and ``remove``,
iommu_boot's ``extra_args``), and one the planners would write back from the host's files
(gpuprov.plan.host.cmdline, gpuprov.plan.host.boot_trial). :func:`cmdline_options` and
:func:`trial_options` are the two modules' options checked: typed values, or every problem as a
refusal naming the option and the fix. PCI addresses go through
:func:`gpuprov.inputs.validate.pci_address`, the one rule for them.

Pure; ships to targets with the modules; standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..core.plan import Refusal
from ..facts.iommu import kernel_param, kernel_split
from .validate import Problems, pci_address

# x86's COMMAND_LINE_SIZE (arch/x86/include/asm/setup.h) counts the terminating NUL.
COMMAND_LINE_SIZE = 2048
MAX_LINE = COMMAND_LINE_SIZE - 1
# The only variables edited: GRUB's kernel command-line variables whose arguments /proc/cmdline
# shows after a normal boot (RECOVERY and XEN ones never reach it, so no reboot verdict).
GRUB_VARIABLES = ("GRUB_CMDLINE_LINUX_DEFAULT", "GRUB_CMDLINE_LINUX")
# The trial's ranges (docs/reference/boot-trial.md): seconds before a panic reboots, and before the
# watchdog resets a trial boot that hangs.
PANIC_SECONDS = (1, 3600)
WATCHDOG_SECONDS = (60, 7200)

_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
# Never accepted: shell expansion in double quotes ($ ` \), our single-quoted form ('),
# and double quotes outside the one quoted form name="value".
_NEVER = "$`\\'"
_QUOTED_CHARS = "".join(c for c in _PRINTABLE if c not in _NEVER + '"')
# An unquoted value is pasted into grub.cfg as a bare word: no space, no GRUB script
# operators ({ } | & ; < >), no comment (#), no wildcard (* ? [ ]).
_GRUB_SPECIAL = "{}|&;<>#*?[]"
_BARE_CHARS = "".join(c for c in _QUOTED_CHARS if c not in " " + _GRUB_SPECIAL)
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"
_ARGUMENT = re.compile(
    rf'(?P<name>{_NAME})(?:=(?P<value>"[{re.escape(_QUOTED_CHARS)}]*"|[{re.escape(_BARE_CHARS)}]*))?\Z'
)
_QUOTED_FIX = 'write a value with spaces or other special characters in double quotes, name="a b"'


def show(text: str, limit: int = 60) -> str:
    """``text`` quoted for a message: control and non-ASCII characters escaped, long text cut."""
    return ascii(text[:limit]) + ("..." if len(text) > limit else "")


def argument_problem(arg: object) -> tuple[str, str] | None:
    """(what is wrong, how to fix it) when ``arg`` is not exactly one kernel argument that is safe
    in /etc/default/grub and grub.cfg; None when it is. The one validator of an argument."""
    if not isinstance(arg, str):
        return f"is a {type(arg).__name__}, not text", "give each argument as a string, name or name=value"
    if not arg:
        return "is empty", "drop the empty item"
    if len(arg) > MAX_LINE:
        return (
            f"is {len(arg)} characters long; the kernel's whole command line holds at most {MAX_LINE}",
            "shorten it",
        )
    for i, ch in enumerate(arg):
        if ch < " " or ch == "\x7f":
            return (
                f"holds the control character {ch!a} at position {i}",
                "remove it: an argument is printable ASCII on one line (the kernel splits on tabs and newlines)",
            )
        if ch > "\x7e":
            return (
                f"holds the non-ASCII character {ch!a} at position {i}",
                "use ASCII: the kernel splits arguments on byte 0xA0, which UTF-8 uses inside other characters",
            )
        if ch == "'":
            return (
                f"holds ' at position {i}: the kernel does not take ' as a quote, and gpuprov may write "
                "the variable single-quoted",
                f"remove it; {_QUOTED_FIX}",
            )
        if ch in _NEVER:
            return (
                f"holds {ch} at position {i}: update-grub sources /etc/default/grub as shell as root, "
                "and GRUB reads grub.cfg as script; both expand or escape with it",
                "remove it: no quoting makes $ ` or \\ safe there",
            )
    tokens = kernel_split(arg)
    if tokens != [arg]:
        return (
            f"is {len(tokens)} kernel arguments, not one (the kernel splits on spaces outside double quotes)",
            f"give each argument as its own item; {_QUOTED_FIX}",
        )
    m = _ARGUMENT.match(arg)
    if m:
        return None
    name, _sep, value = arg.partition("=")
    if not re.fullmatch(_NAME, name):
        return (
            f"has the name {show(name)}, not a kernel parameter name",
            "use name or name=value, the name of letters, digits, _ . and - (not starting with - or .)",
        )
    if '"' in value:
        return (
            'has a double quote outside the one quoted form name="value"',
            'quote the whole value, name="a b", with no other double quote in it',
        )
    bad = next(c for c in value if c not in _BARE_CHARS)
    return (
        f"has {bad!r} in an unquoted value, which GRUB's script language (grub.cfg) reads as an operator, "
        "comment or wildcard",
        f'quote the value: {name}="{value}"',
    )


def argument_refusals(option: str, items: object) -> list[Refusal]:
    """A refusal for each item of ``items`` (an option's list) that :func:`argument_problem` refuses."""
    refusals = []
    for item in items if isinstance(items, list) else [items]:
        problem = argument_problem(item)
        if problem:
            refusals.append(Refusal(f"{option}: {show(str(item))} {problem[0]}", problem[1]))
    return refusals


@dataclass
class CmdlineOptions:
    """kernel_cmdline's options, checked: the arguments to add (as given, one per name), the names
    to remove, and the GRUB variable edited."""

    add: list[str] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    variable: str = "GRUB_CMDLINE_LINUX_DEFAULT"


def cmdline_options(arguments: object, remove: object, variable: object) -> tuple[CmdlineOptions, list[Refusal]]:
    """kernel_cmdline's options checked: every problem is a refusal naming the item and the fix."""
    refusals: list[Refusal] = []
    options = CmdlineOptions()
    if variable not in GRUB_VARIABLES:
        refusals.append(
            Refusal(
                f"variable {show(str(variable))} is not a GRUB kernel command-line variable",
                f"use {' or '.join(GRUB_VARIABLES)} (update-grub runs /etc/default/grub as shell; "
                "no other variable is edited)",
            )
        )
    else:
        options.variable = str(variable)
    added: dict[str, str] = {}
    for option, items in (("arguments", arguments), ("remove", remove)):
        for item in items if isinstance(items, list) else [items]:
            problem = argument_problem(item)
            if problem:
                refusals.append(Refusal(f"{option}: {show(str(item))} {problem[0]}", problem[1]))
                continue
            if not isinstance(item, str):  # argument_problem refuses every non-string: never reached
                continue
            name = kernel_param(item)[0]
            if option == "remove":
                if name in added:
                    refusals.append(Refusal(f"{name} is both in arguments and in remove", "keep it in one of them"))
                options.remove.append(name)
            elif name in added and added[name] != item:
                refusals.append(
                    Refusal(
                        f"arguments: {name} is given twice ({show(added[name])}, {show(item)})",
                        "give each name once: the module keeps one value per name",
                    )
                )
            elif name not in added:
                added[name] = item
                options.add.append(item)
    return options, refusals


@dataclass
class TrialOptions:
    """iommu_boot's options that meet a rule of their own, checked: ``expect_vfio`` normalised
    (``0000:41:00.0``; an item refused stays as given, and the plan refuses)."""

    extra_args: list[str] = field(default_factory=list)
    vfio_modules: list[str] = field(default_factory=list)
    watchdog_module: str | None = None
    expect_vfio: list[str] = field(default_factory=list)
    panic_seconds: int = 10
    watchdog_seconds: int = 600


def trial_options(options: TrialOptions) -> tuple[TrialOptions, list[Refusal]]:
    """``options`` checked: the kernel arguments (:func:`argument_problem`), the kernel module names,
    the PCI addresses (:func:`gpuprov.inputs.validate.pci_address`) and the trial's ranges; every
    problem a refusal naming the option and the fix."""
    from ..facts.bootloader import MODULE_NAME  # the trial's module: not imported by every cmdline reader

    refusals = argument_refusals("extra_args", options.extra_args)
    modules = [*options.vfio_modules, *([options.watchdog_module] if options.watchdog_module else [])]
    for name in modules:
        if not isinstance(name, str) or not MODULE_NAME.match(name):
            refusals.append(Refusal(f"{show(str(name))} is not a kernel module name", "use names like vfio_pci"))
    expect: list[str] = []
    for i, value in enumerate(options.expect_vfio):
        problems = Problems()
        address = pci_address(problems, f"expect_vfio[{i}]", value)
        refusals += problems.items
        expect.append(value if address is None else address)
    refusals += _range_refusals("panic_seconds", options.panic_seconds, PANIC_SECONDS)
    refusals += _range_refusals("watchdog_seconds", options.watchdog_seconds, WATCHDOG_SECONDS)
    checked = TrialOptions(
        extra_args=list(options.extra_args),
        vfio_modules=list(options.vfio_modules),
        watchdog_module=options.watchdog_module,
        expect_vfio=expect,
        panic_seconds=options.panic_seconds,
        watchdog_seconds=options.watchdog_seconds,
    )
    return checked, refusals


def _range_refusals(option: str, value: Any, bounds: tuple[int, int]) -> list[Refusal]:
    lo, hi = bounds
    if not lo <= value <= hi:
        return [Refusal(f"{option} {value} is out of range", f"give {lo} to {hi}")]
    return []
