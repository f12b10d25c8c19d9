"""Plan kernel command line changes in the bootloader config, by argument.

GRUB: one variable of ``/etc/default/grub`` (``GRUB_CMDLINE_LINUX_DEFAULT`` by
default) is edited argument by argument, never rewritten: other arguments,
comments and lines stay as they are; then ``update-grub`` (Debian/Ubuntu) or
``grub2-mkconfig`` regenerates the menu. grubby (RHEL family, BLS entries)
takes ``--args``/``--remove-args`` directly. Whether a reboot is still owed is
decided by comparing the wanted arguments with ``/proc/cmdline``.

Untrusted input (docs/reference/kernel-cmdline.md): ``update-grub`` sources
``/etc/default/grub`` as shell, as root, and pastes the variable into
``grub.cfg``, which GRUB parses as its own script at boot. So every argument
passes :func:`gpuprov.inputs.kernel_args.argument_problem` (exactly one kernel
argument, of characters that neither shell nor GRUB's script expand; the
module's options are checked there too, :func:`build_request`), the variable
is written quoted so that sourcing gives back exactly the arguments, and a
file whose current line cannot be read that safely is refused, unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...core.plan import COMMAND, Action, Plan, Refusal, file_action
from ...facts.boot import GRUB_DEFAULT, GRUB_DROPINS, BootFacts
from ...facts.iommu import kernel_param, kernel_split, parse_cmdline
from ...inputs.kernel_args import (
    COMMAND_LINE_SIZE,
    MAX_LINE,
    argument_problem,
    cmdline_options,
    show,
)
from .grubvar import _word, read_grub_variable

DOC = "docs/reference/kernel-cmdline.md"
# /etc/default/grub is a page or two; a larger file is refused before it is scanned (issue 26).
MAX_GRUB_DEFAULT = 256 * 1024


@dataclass
class CmdlineRequest:
    add: list[str] = field(default_factory=list)  # arguments as given, each valid, one per name
    remove: list[str] = field(default_factory=list)  # names
    variable: str = "GRUB_CMDLINE_LINUX_DEFAULT"


@dataclass
class CmdlinePlan(Plan):
    args_before: str | None = None
    args_after: str | None = None
    reboot_required: bool = False


def build_request(arguments: object, remove: object, variable: object) -> tuple[CmdlineRequest, list[Refusal]]:
    """The module's options through the input boundary (:func:`gpuprov.inputs.kernel_args.cmdline_options`):
    every problem is a refusal naming the item and the fix."""
    options, refusals = cmdline_options(arguments, remove, variable)
    return CmdlineRequest(add=options.add, remove=options.remove, variable=options.variable), refusals


def edit_args(current: list[str], add: list[str], remove: list[str]) -> list[str]:
    """Add/replace/remove arguments by name; everything else keeps its place and its text.
    An argument the kernel reads the same as a wanted one (``"a=b c"`` for ``a="b c"``) stays."""
    wanted = {kernel_param(arg)[0]: arg for arg in add}
    out: list[str] = []
    seen: set[str] = set()
    for tok in current:
        name, value = kernel_param(tok)
        if name in remove:
            continue
        if name in wanted:
            if name in seen:
                continue  # a duplicate of an argument we set: keep one
            same = (name, value) == kernel_param(wanted[name])
            out.append(tok if same else wanted[name])
            seen.add(name)
        else:
            out.append(tok)
    out += [arg for name, arg in wanted.items() if name not in seen]
    return out


# -- /etc/default/grub, written (read as the shell reads it: .grubvar) ----------------------------


def grub_quote(args: list[str], quote: str = '"') -> str:
    """The shell text of a variable holding ``args`` (each passed :func:`argument_problem`):
    double-quoted, or single-quoted where an argument has a double quote or ``quote`` is '.
    Neither form expands anything: the arguments hold no $ ` \\ ' and no control character."""
    value = " ".join(args)
    q = "'" if '"' in value or quote == "'" else '"'
    return f"{q}{value}{q}"


def _decode(raw: str | bytes) -> str:
    if len(raw) > MAX_GRUB_DEFAULT:
        raise ValueError(f"it is longer ({len(raw)}) than the {MAX_GRUB_DEFAULT} bytes gpuprov reads")
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ValueError(f"it is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    if "\0" in text:
        raise ValueError("it holds a NUL byte")
    return text


def plan_grub(
    grub_text: str | bytes | None,
    proc_cmdline: str,
    request: CmdlineRequest,
    update_argv: list[str],
    dropins: dict[str, str] | None = None,
) -> CmdlinePlan:
    """``dropins``: name -> text of /etc/default/grub.d/*.cfg, which update-grub sources afterwards."""
    plan = CmdlinePlan()
    if grub_text is None:
        plan.refusals.append(
            Refusal(
                f"/{GRUB_DEFAULT} does not exist: this host does not boot through GRUB's defaults file",
                "use bootloader=grubby on RHEL-family hosts, or set the arguments in your bootloader's config",
            )
        )
        return plan
    try:
        text = _decode(grub_text)
        current = read_grub_variable(text, request.variable)
    except ValueError as exc:
        plan.refusals.append(
            Refusal(
                f"/{GRUB_DEFAULT} cannot be edited safely: {exc}",
                f"edit /{GRUB_DEFAULT} by hand so that {request.variable} is one plain quoted assignment "
                f'(e.g. {request.variable}="quiet"), then run again; see {DOC}',
            )
        )
        return plan
    new = edit_args(current.args, request.add, request.remove)
    plan.args_before, plan.args_after = " ".join(current.args), " ".join(new)
    for name, dropin in sorted((dropins or {}).items()):
        if re.search(_word(request.variable), dropin):
            plan.warnings.append(
                f"/{GRUB_DROPINS}/{name} also names {request.variable}; update-grub reads it after "
                f"/{GRUB_DEFAULT}, so it may override this edit"
            )
    if new != current.args:
        for arg in new:
            problem = argument_problem(arg)
            if problem:
                plan.refusals.append(
                    Refusal(
                        f"/{GRUB_DEFAULT} line {current.line}: {request.variable} holds {show(arg)}, which "
                        f"gpuprov cannot rewrite safely: it {problem[0]}",
                        f"fix that argument by hand ({problem[1]}), then run again",
                    )
                )
        if len(plan.args_after) > MAX_LINE:
            plan.refusals.append(
                Refusal(
                    f"{request.variable} would be {len(plan.args_after)} characters; the kernel's command line "
                    f"holds at most {MAX_LINE} (COMMAND_LINE_SIZE {COMMAND_LINE_SIZE} on x86)",
                    "drop arguments",
                )
            )
        if plan.refused:
            return plan
        if current.span:
            start, end = current.span
            text = text[:start] + grub_quote(new, current.quote) + text[end:]
        else:
            text += ("" if text.endswith("\n") or not text else "\n") + f"{request.variable}={grub_quote(new)}\n"
        action = file_action(GRUB_DEFAULT, text, _decode(grub_text), "kernel arguments for the next boot")
        if action:
            plan.actions.append(action)
            plan.actions.append(Action(COMMAND, "regenerate the GRUB menu", argv=update_argv))
    plan.reboot_required = reboot_owed(proc_cmdline, request)
    return plan


def grubby_default_args(info: str) -> str | None:
    """The ``args="..."`` of ``grubby --info=DEFAULT``, its one pair of outer quotes taken off."""
    for line in info.splitlines():
        if line.startswith("args="):
            value = line[len("args=") :].strip()
            return value[1:-1] if len(value) >= 2 and value[0] == value[-1] == '"' else value
    return None


def plan_grubby(default_args: str, proc_cmdline: str, request: CmdlineRequest) -> CmdlinePlan:
    """grubby: ``default_args`` is what ``grubby --info=DEFAULT`` shows as args."""
    current = kernel_split(default_args)
    plan = CmdlinePlan(args_before=default_args, args_after=" ".join(edit_args(current, request.add, request.remove)))
    present = parse_cmdline(default_args)
    to_add = [arg for arg in request.add if _missing(present, arg)]
    to_remove = [n for n in request.remove if n in present]
    # argv lists, never a shell: each argument passed argument_problem.
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


def choose_bootloader(option: str, facts: BootFacts) -> str:
    """kernel_cmdline's ``bootloader``: auto takes grubby where it is installed on the live root."""
    if option != "auto":
        return option
    return "grubby" if facts.has_grubby and facts.live else "grub"


def plan_kernel_cmdline(facts: BootFacts, request: CmdlineRequest, bootloader: str, update: bool) -> CmdlinePlan:
    """The whole of kernel_cmdline: ``bootloader`` as :func:`choose_bootloader` gives it; ``update``
    False drops the command that regenerates the GRUB menu."""
    if bootloader == "grubby":
        if not facts.live:
            return CmdlinePlan(refusals=[Refusal("bootloader grubby works on the live root only", _GRUBBY_FIX)])
        rc, out, err = facts.grubby_info or (127, "", "grubby was not asked")
        args = grubby_default_args(out) if rc == 0 else None
        if args is None:
            return CmdlinePlan(refusals=[Refusal(f"grubby --info=DEFAULT gave no args= line (rc {rc}): {err.strip()}")])
        return plan_grubby(args, facts.proc_cmdline, request)
    if facts.update_argv is None and facts.live and update:
        return CmdlinePlan(
            refusals=[
                Refusal(
                    "no update-grub or grub2-mkconfig on this host",
                    "install GRUB's tools, or set update: false and regenerate the menu yourself",
                )
            ]
        )
    if facts.grub_default_unreadable:
        return CmdlinePlan(refusals=[Refusal(f"/{GRUB_DEFAULT} exists but cannot be read", "run the module as root")])
    plan = plan_grub(
        facts.grub_default, facts.proc_cmdline, request, facts.update_argv or ["update-grub"], facts.dropins
    )
    if not update:
        plan.actions = [a for a in plan.actions if a.kind != COMMAND]
    return plan


_GRUBBY_FIX = "set root to / or use bootloader grub"


def _missing(present: dict[str, str | None], arg: str) -> bool:
    name, value = kernel_param(arg)
    return name not in present or present[name] != value


def reboot_owed(proc_cmdline: str, request: CmdlineRequest) -> bool:
    """True when the running kernel was not booted with what is wanted (compared as the kernel
    reads each argument, so GRUB's ``"a=b c"`` matches a wanted ``a="b c"``)."""
    running = parse_cmdline(proc_cmdline)
    return any(_missing(running, arg) for arg in request.add) or any(n in running for n in request.remove)
