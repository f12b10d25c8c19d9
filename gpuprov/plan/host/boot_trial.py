"""The IOMMU's boot change, tried once before it becomes the default (docs/reference/boot-trial.md).

One concern, one plan: the kernel arguments the IOMMU needs (by CPU vendor), vfio loaded at boot and
in the initramfs, and the boot change itself as a trial:

1. arm: a trial entry (the default entry's kernel with the new arguments, ``panic=N``, a watchdog
   armed from the initramfs, a ``gpuprov.trial=ID`` marker, and a trial initramfs when the
   initramfs must change) and a one-shot next boot (``grub-reboot``, ``bootctl set-oneshot``,
   ``grub2-reboot``); the default entry is not touched;
2. the play reboots; the trial boot comes up (its marker is in /proc/cmdline) or the host comes back
   by itself on its old default (a panic reboots after ``panic=N``, a hang is ended by the watchdog,
   the one-shot is spent either way);
3. on the trial boot: the checks (IOMMU on, vfio loaded, devices on vfio-pci, the user's command);
   passed: commit (the default's arguments edited as kernel_cmdline does, the trial initramfs moved
   into place, the trial entry removed, the watchdog stopped); failed, or back on the old default:
   the trial is recorded as failed with its arguments, the default stays byte for byte as it was,
   and the same arguments are not tried again unless ``retry_failed`` says so.

What is owed comes from the host's state (the default's arguments, the initramfs against the files
it is built from, the trial record and this boot's id), never from a handler that dies with the
controller. Pure: facts in, plan out.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace

from ...core.plan import COMMAND, REMOVE_FILE, Action, Refusal, file_action, sysfs_write
from ...facts.bootloader import (
    DRACUT_CONF,
    GRUB_CFG,
    GRUB_CUSTOM,
    GRUB_ENV,
    INITRAMFS_MODULES,
    KERNEL_CMDLINE,
    MODULES_LOAD,
    TRIAL_ARG,
    TRIAL_ENTRY,
    TRIAL_HOOK,
    TRIAL_SCRIPT,
    TRIAL_STATE,
    TRIAL_UNIT,
    TRIAL_UP,
    TRIAL_WANTS,
    BlsEntry,
    BootInputs,
    BootloaderFacts,
    TrialChecks,
)
from ...facts.iommu import kernel_param, kernel_split, parse_cmdline
from ...inputs.kernel_args import MAX_LINE, TrialOptions, argument_problem, show, trial_options
from .cmdline import (
    CmdlinePlan,
    CmdlineRequest,
    edit_args,
    grubby_default_args,
    plan_grub,
    plan_grubby,
    reboot_owed,
)

DOC = "docs/reference/boot-trial.md"
TRIAL_SUFFIX = ".gpuprov-trial"
MARK_BEGIN, MARK_END = "# BEGIN gpuprov iommu_host", "# END gpuprov iommu_host"
MAX_UNCONFIRMED = 2  # trial boots that came up unchecked, tried again before one counts as failed
# Notes, on a trial boot only, that it reached multi-user: a trial reset unchecked is told from one
# that never came up. Enabled by its link in multi-user.target.wants (no systemctl: staged roots work).
TRIAL_UNIT_TEXT = f"""\
# Managed by gpuprov (iommu_host role), {DOC}.
[Unit]
Description=gpuprov: note that a trial boot came up
ConditionKernelCommandLine={TRIAL_ARG}
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'grep -o "{TRIAL_ARG}=[^ ]*" /proc/cmdline > /{TRIAL_UP}'

[Install]
WantedBy=multi-user.target
"""
# Wanted by multi-user.target through a drop-in: a plain file, no `systemctl enable` needed.
TRIAL_UNIT_FILES = {
    TRIAL_UNIT: TRIAL_UNIT_TEXT,
    TRIAL_WANTS: f"# Managed by gpuprov (iommu_host role), {DOC}.\n[Unit]\nWants=gpuprov-trial-up.service\n",
}
CUSTOM_BEGIN = "### BEGIN gpuprov trial boot (gpuprov removes it after the trial) ###"
CUSTOM_END = "### END gpuprov trial boot ###"
# The hardware watchdog drivers whose timeout a kernel argument sets, in seconds: each resets about
# that long after the last write. Linux's i6300esb splits its `heartbeat` over the device's two
# stages (heartbeat=30 reset the lab host 34 s after it was armed, docs/development/lab.md; halving
# it here had halved every i6300esb trial's time).
WATCHDOG_TIMEOUT = {
    "i6300esb": "heartbeat",
    "iTCO_wdt": "heartbeat",
    "sp5100_tco": "heartbeat",
    "wdat_wdt": "timeout",
    "ipmi_watchdog": "timeout",
}


@dataclass
class BootRequest:
    passthrough: bool = True
    extra_args: list[str] = field(default_factory=list)
    vfio_modules: list[str] = field(default_factory=lambda: ["vfio", "vfio_iommu_type1", "vfio_pci"])
    variable: str = "GRUB_CMDLINE_LINUX_DEFAULT"
    trial: bool = True  # False: change the default directly (the old way; a bad argument strands the host)
    reboot_allowed: bool = False
    panic_seconds: int = 10
    watchdog_seconds: int = 600
    watchdog_module: str | None = None  # None: the first watchdog the host has
    retry_failed: bool = False
    expect_vfio: list[str] = field(default_factory=list)  # PCI addresses on vfio-pci after the trial boot


@dataclass
class BootPlan(CmdlinePlan):
    stage: str = "converged"  # converged | armed | committed | failed | refused
    reboot: str = "none"  # none | trial (boot the armed trial) | plain (the default already has it) | fallback
    trial_id: str | None = None
    trial_args: str | None = None  # the trial entry's whole kernel line
    added: list[str] = field(default_factory=list)  # arguments the default gains
    failure: str | None = None  # the trial failed: the module applies the actions, then fails with this


def wanted_args(cpu_vendor: str | None, request: BootRequest) -> list[str]:
    """The kernel arguments the IOMMU needs here: Intel's is off by default, AMD's on."""
    args = ["intel_iommu=on"] if cpu_vendor == "GenuineIntel" else []
    return args + (["iommu=pt"] if request.passthrough else []) + list(request.extra_args)


def checked_request(request: BootRequest) -> tuple[BootRequest, list[Refusal]]:
    """``request`` through the input boundary (:func:`gpuprov.inputs.kernel_args.trial_options`): its
    kernel arguments, module names, PCI addresses (normalised) and ranges; every problem a refusal."""
    options, refusals = trial_options(
        TrialOptions(
            extra_args=request.extra_args,
            vfio_modules=request.vfio_modules,
            watchdog_module=request.watchdog_module,
            expect_vfio=request.expect_vfio,
            panic_seconds=request.panic_seconds,
            watchdog_seconds=request.watchdog_seconds,
        )
    )
    return replace(request, expect_vfio=options.expect_vfio), refusals


# -- vfio at boot and in the initramfs --------------------------------------------------------


def _line_start_find(text: str, needle: str, start: int) -> int:
    """The first index >= ``start`` where ``needle`` begins a line of ``text``, or -1 (each
    candidate is passed once: linear)."""
    i = text.find(needle, start)
    while i > 0 and text[i - 1] != "\n":
        i = text.find(needle, i + 1)
    return i


def marked_spans(text: str, begin: str, end: str) -> list[tuple[int, int]]:
    """The spans of the blocks from a line ``begin`` to the next line starting ``end`` (and its
    newline), in order, as ``^begin\\n.*?^end\\n?`` (re.M, re.S) finds them, in one linear pass."""
    spans, pos = [], 0
    while True:
        start = _line_start_find(text, begin + "\n", pos)
        if start < 0:
            return spans
        stop = _line_start_find(text, end, start + len(begin) + 1)
        if stop < 0:  # no end after this begin, so none after a later one either
            return spans
        stop += len(end)
        stop += text.startswith("\n", stop)
        spans.append((start, stop))
        pos = stop


def _block(text: str | None, lines: list[str]) -> str:
    """``text`` with gpuprov's marked block holding ``lines`` (blockinfile's markers, so hosts
    the old role set up stay as they are)."""
    block = "\n".join([MARK_BEGIN, *lines, MARK_END]) + "\n"
    text = text or ""
    spans = marked_spans(text, MARK_BEGIN, MARK_END)
    if spans:
        start, stop = spans[0]
        return text[:start] + block + text[stop:]
    return text + ("" if text.endswith("\n") or not text else "\n") + block


def module_files(
    files: dict[str, str | None], os_family: str, request: BootRequest
) -> tuple[list[Action], list[Action]]:
    """(files loading vfio at boot, files the initramfs is built from): actions for those that differ.
    ``files``: root-relative path -> current text (None: absent)."""
    load = "# Managed by gpuprov (iommu_host role).\n" + "".join(f"{m}\n" for m in request.vfio_modules)
    boot = [file_action(MODULES_LOAD, load, files.get(MODULES_LOAD), "load vfio at boot")]
    if os_family == "Debian":
        initramfs = {INITRAMFS_MODULES: _block(files.get(INITRAMFS_MODULES), request.vfio_modules)}
    else:
        initramfs = {
            DRACUT_CONF: "# Managed by gpuprov (iommu_host role).\n"
            f'force_drivers+=" {" ".join(request.vfio_modules)} "\n'
        }
    built = [file_action(path, text, files.get(path), "vfio in the initramfs") for path, text in initramfs.items()]
    return [a for a in boot if a], [a for a in built if a]


def initramfs_owed(boot: BootloaderFacts, input_actions: list[Action]) -> str | None:
    """Why the running kernel's initramfs must be rebuilt, or None: it is missing, or older than a
    file it is built from (update-initramfs and dracut write beside and rename, so a rebuild killed
    halfway leaves the old, older image)."""
    if input_actions:
        return f"/{input_actions[0].path} changes"
    if not boot.initrd:
        return None
    if boot.initrd_mtime is None:
        return f"/{boot.initrd} is missing"
    newer = [p for p, t in boot.config_mtimes.items() if t > boot.initrd_mtime]
    return f"/{boot.initrd} predates /{newer[0]}" if newer else None


def initramfs_build_argv(tool: str | None, output: str, kernel: str) -> list[str]:
    if tool == "dracut":
        return ["dracut", "-f", output, kernel]
    return ["mkinitramfs", "-o", output, kernel]


def initramfs_update_argv(tool: str | None) -> list[str]:
    if tool == "dracut":
        return ["dracut", "-f", "--regenerate-all"]
    return ["update-initramfs", "-u", "-k", "all"]


# -- the watchdog armed for the trial boot only --------------------------------------------------

HOOK_TEXT = """\
#!/bin/sh
# Managed by gpuprov (iommu_host role): puts the watchdog driver into the initramfs, for the
# script init-top/gpuprov-trial, which arms it on a trial boot only ({doc}).
PREREQ=""
prereqs() {{ echo "$PREREQ"; }}
case "$1" in prereqs) prereqs; exit 0 ;; esac
. /usr/share/initramfs-tools/hook-functions
manual_add_modules {module}
"""

SCRIPT_TEXT = """\
#!/bin/sh
# Managed by gpuprov (iommu_host role). On a trial boot only (gpuprov.trial= on the kernel command
# line) arm the hardware watchdog and leave it running unfed: if this boot hangs, the machine resets
# and boots its unchanged default; gpuprov stops the watchdog once the trial boot passed its checks
# ({doc}). On any other boot it does nothing.
PREREQ=""
prereqs() {{ echo "$PREREQ"; }}
case "$1" in prereqs) prereqs; exit 0 ;; esac
# Shell builtins only: a small initramfs has no grep or printf.
read -r cmdline < /proc/cmdline
case " $cmdline " in *" {marker}="*) ;; *) exit 0 ;; esac
modprobe {module} || exit 0
# Opened, written and closed without the magic 'V': the driver keeps counting and nothing feeds it.
[ -c /dev/watchdog ] && echo gpuprov > /dev/watchdog
exit 0
"""


def watchdog_files(module: str) -> dict[str, str]:
    return {
        TRIAL_HOOK: HOOK_TEXT.format(module=module, doc=DOC),
        TRIAL_SCRIPT: SCRIPT_TEXT.format(module=module, marker=TRIAL_ARG, doc=DOC),
    }


def watchdog_args(module: str | None, seconds: int) -> list[str]:
    """The kernel argument that sets the trial watchdog's timeout, where its driver takes one."""
    if module not in WATCHDOG_TIMEOUT:
        return []
    return [f"{module}.{WATCHDOG_TIMEOUT[module]}={max(1, seconds)}"]


# -- the trial entry ----------------------------------------------------------------------------


@dataclass
class Entry:
    """The default boot entry the trial copies: its kernel line and initramfs."""

    kernel: str  # the kernel image path as the entry names it
    release: str  # its kernel release (vmlinuz-RELEASE)
    args: list[str]
    initrd: str | None  # as the entry names it
    text: str  # the entry's text (GRUB: the menuentry block; BLS: the file)


def _release(kernel_path: str) -> str:
    name = kernel_path.rsplit("/", 1)[-1]
    return name.split("-", 1)[1] if name.startswith("vmlinuz-") else ""


def grub_menuentries(cfg: str) -> list[tuple[str, str, str]]:
    """(the whole entry, its head, its body) of each top-level ``menuentry``: from a line starting
    ``menuentry `` through the first line ending ``{``, then to the next line starting ``}``, as
    ``^menuentry (.*?)\\{\\n(.*?)^\\}\\n?`` (re.M, re.S) finds them. Line by line, each line looked
    at once (a regex over the text backtracks on padding: issue 26)."""
    lines = cfg.split("\n")
    n, i, out = len(lines), 0, []
    while i < n:
        if not lines[i].startswith("menuentry "):
            i += 1
            continue
        open_at = i
        while open_at < n and not lines[open_at].endswith("{"):
            open_at += 1
        close = open_at + 1
        while close < n and not lines[close].startswith("}"):
            close += 1
        if close >= n:  # unterminated: no later entry can close either
            break
        head = "\n".join(lines[i : open_at + 1])[len("menuentry ") : -1]
        body = "".join(line + "\n" for line in lines[open_at + 1 : close])
        tail = "}\n" if lines[close] == "}" and close + 1 < n else "}"
        whole = "".join(line + "\n" for line in lines[i : open_at + 1]) + body + tail
        out.append((whole, head, body))
        i = close + 1
    return out


def grub_command(line: str, names: tuple[str, ...]) -> tuple[str, str, str] | None:
    """A GRUB command line ``  NAME  OPERAND REST``: (its text through the blanks after NAME, the
    first operand, the rest of the line), when NAME is one of ``names``; else None."""
    word = line.lstrip()
    for name in names:
        rest = word[len(name) :]
        operand = rest.lstrip()
        if word.startswith(name) and operand and operand != rest:
            path = operand.split(None, 1)[0]
            lead = len(line) - len(operand)
            return line[:lead], path, operand[len(path) :]
    return None


_LINUX, _INITRD = ("linuxefi", "linux"), ("initrdefi", "initrd")


def grub_default_entry(cfg: str, grub_default: str | None, saved: str | None) -> tuple[Entry | None, str | None]:
    """(the entry GRUB boots by default, None) or (None, why it cannot be told). Top-level entries
    only: GRUB_DEFAULT 0 (or unset), a top-level entry's id or title, or saved with such an entry."""
    blocks = []
    for whole, head, body in grub_menuentries(cfg):
        ids = re.findall(r"\$menuentry_id_option '([^']*)'|--id '?([^' ]*)'?", head)
        title = re.match(r"'([^']*)'|\"([^\"]*)\"", head.strip())
        names = {x for pair in ids for x in pair if x} | ({next(g for g in title.groups() if g)} if title else set())
        blocks.append((whole, body, names))
    if not blocks:
        return None, "/boot/grub/grub.cfg has no top-level menuentry"
    want = (grub_default or "0").strip().strip("\"'")
    if want == "saved":
        want = saved or "0"
    if want == "0":
        chosen = blocks[0]
    else:
        chosen = next((b for b in blocks if want in b[2]), None)
        if chosen is None:
            return None, f"GRUB_DEFAULT={show(want)} names no top-level entry of /boot/grub/grub.cfg"
    body = chosen[1].split("\n")
    linux = next(filter(None, (grub_command(line, _LINUX) for line in body)), None)
    if not linux:
        return None, "the default entry has no linux line"
    initrds = (grub_command(line, _INITRD) for line in body)
    initrd = next((c[1] for c in initrds if c and not c[2].strip()), None)
    kernel = linux[1]
    return Entry(kernel, _release(kernel), kernel_split(linux[2]), initrd, chosen[0]), None


def grub_trial_entry(entry: Entry, args: list[str], initrd: str | None, title: str) -> str:
    """The default's menuentry as the trial entry: its own id, the trial's kernel line and initramfs."""
    lines = entry.text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.endswith("{")), 0) + 1
    body = lines[start:]
    linux_done = initrd_done = False
    for i, line in enumerate(body):
        linux = None if linux_done else grub_command(line, _LINUX)
        if linux:
            body[i], linux_done = f"{linux[0]}{entry.kernel} {' '.join(args)}", True
            continue
        found = None if initrd_done or not initrd else grub_command(line, _INITRD)
        if found and not found[2].strip():
            body[i], initrd_done = found[0] + (initrd or ""), True
    return f"menuentry '{title}' --id {TRIAL_ENTRY} {{\n" + "\n".join(body)


def custom_cfg(current: str | None, entry: str | None) -> str | None:
    """/boot/grub/custom.cfg (Debian's 41_custom sources it) with gpuprov's trial block set to
    ``entry`` (None: removed); the user's own entries stay. None: the file goes (it held only ours)."""
    text, kept, pos = current or "", [], 0
    for start, stop in marked_spans(text, CUSTOM_BEGIN, CUSTOM_END):
        kept.append(text[pos:start])
        pos = stop
    text = "".join(kept) + text[pos:]
    if entry is not None:
        text += ("" if text.endswith("\n") or not text else "\n") + f"{CUSTOM_BEGIN}\n{entry}{CUSTOM_END}\n"
    if not text.strip():
        return None
    return text


def bls_fields(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        key, _sep, value = line.strip().partition(" ")
        if key and not key.startswith("#"):
            out.append((key, value.strip()))
    return out


def bls_default_entry(entries: list[BlsEntry], selected: str | None, release: str) -> tuple[Entry | None, str | None]:
    """The BLS entry to copy: the one this boot came from (systemd-boot says it), else the running
    kernel's; never gpuprov's own trial entry."""

    def version(entry: BlsEntry) -> str:
        fields = dict(reversed(bls_fields(entry.text)))  # the first of a key wins
        return fields.get("version") or _release(fields.get("linux", ""))

    usable = [e for e in entries if not e.name.startswith(TRIAL_ENTRY)]
    chosen = next((e for e in usable if e.name == selected), None) or next(
        (e for e in usable if version(e) == release), None
    )
    if chosen is None:
        return None, f"no boot entry for the running kernel {release} among {len(usable)} entries"
    fields = dict(reversed(bls_fields(chosen.text)))
    if "linux" not in fields:
        return None, f"{chosen.name} has no linux line"
    if "sort-key" not in fields:
        # The trial entry has none: it sorts after every entry that has one, so it never becomes
        # the default. Without one on the default, file names decide, and the trial could win.
        return None, f"{chosen.name} has no sort-key, so the trial entry could sort before it and become the default"
    args = kernel_split(fields.get("options", ""))
    return Entry(fields["linux"], version(chosen) or release, args, fields.get("initrd"), chosen.text), None


def bls_trial_entry(entry: Entry, args: list[str], initrd: str | None, title: str) -> str:
    lines = []
    for line in entry.text.splitlines():
        key = line.strip().split(" ", 1)[0]
        if key == "title":
            line = f"title {title}"
        elif key == "options":
            line = f"options {' '.join(args)}"
        elif key == "initrd" and initrd:
            line = f"initrd {initrd}"
        elif key in ("version", "sort-key"):
            continue
        lines.append(line)
    if not any(line.strip().startswith("options") for line in lines):
        lines.append(f"options {' '.join(args)}")
    return "\n".join(lines) + "\n"


# -- the state record ---------------------------------------------------------------------------


def trial_id(args_after: list[str], vfio_modules: list[str]) -> str:
    """The trial's name: the same arguments and initramfs modules are the same trial, in any run."""
    blob = json.dumps([args_after, vfio_modules])
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def state_text(record: dict) -> str:
    return json.dumps(record, indent=2, sort_keys=True) + "\n"


# -- the plan -------------------------------------------------------------------------------------


def _failed_record(state: dict, boot_id: str, why: str) -> dict:
    return {**state, "status": "failed", "failed_boot_id": boot_id, "why": why}


def plan_boot(inputs: BootInputs, request: BootRequest) -> BootPlan:
    boot = inputs.boot
    request, refusals = checked_request(request)
    plan = BootPlan(refusals=refusals)
    if plan.refused:
        plan.stage = "refused"
        return plan
    family = boot.os_family or "Debian"
    load_actions, input_actions = module_files(inputs.files, family, request)
    add = wanted_args(inputs.cpu_vendor, request)
    default = _default_args_plan(inputs, CmdlineRequest(add=add, variable=request.variable))
    if default.refused:
        plan.refusals, plan.stage = default.refusals, "refused"
        return plan
    plan.warnings += default.warnings
    plan.args_before, plan.args_after = default.args_before, default.args_after
    before = set(kernel_split(default.args_before or ""))
    plan.added = [a for a in kernel_split(default.args_after or "") if a not in before]
    boot_change = bool(default.actions)
    running_has = not reboot_owed(boot.proc_cmdline, CmdlineRequest(add=add))
    if not boot_change:
        # The default has the arguments: the files and initramfs are brought in line directly,
        # and a reboot is owed only when the running kernel lacks them.
        plan.actions = load_actions + input_actions + _rebuild_initramfs(boot, input_actions)
        plan.actions += _regenerate_menu(inputs, add, default)
        plan.actions += _forget_trial(inputs, committed=True)
        plan.reboot_required = not running_has
        plan.reboot = "plain" if plan.reboot_required else "none"
        plan.stage = "converged"
        return plan
    if not request.trial or (not boot.live and not request.reboot_allowed):
        # No trial: asked so, or a staged or image root, which boots nothing here.
        plan.actions = load_actions + input_actions + _rebuild_initramfs(boot, input_actions) + default.actions
        plan.reboot_required = reboot_owed(boot.proc_cmdline, CmdlineRequest(add=add))
        plan.reboot, plan.stage = ("plain" if plan.reboot_required else "none"), "converged"
        if boot.live:
            plan.warnings.append(
                "trial: false: the new default is not tried first; a bad argument needs the console to undo"
            )
        return plan
    return _plan_trial(inputs, request, plan, default, load_actions, input_actions)


def _regenerate_menu(inputs: BootInputs, add: list[str], default: CmdlinePlan) -> list[Action]:
    """The menu regenerated when the default's configuration has the arguments but the entry the
    bootloader boots does not (a run killed between the two): the boot entry is what counts."""
    boot = inputs.boot
    if boot.loader not in ("grub", "systemd-boot") or not boot.live:
        return []
    entry, _problem = _default_entry(boot, inputs)
    if entry is None or not reboot_owed(" ".join(entry.args), CmdlineRequest(add=add)):
        return []
    why = "the default boot entry lacks the arguments its configuration has"
    if boot.loader == "systemd-boot":
        return [Action(COMMAND, why, argv=_sdboot_refresh(boot).argv)]
    grub = inputs.grub
    return [Action(COMMAND, why, argv=(grub.update_argv if grub else None) or ["update-grub"])]


def _rebuild_initramfs(boot: BootloaderFacts, input_actions: list[Action]) -> list[Action]:
    owed = initramfs_owed(boot, input_actions)
    if not owed:
        return []
    return [Action(COMMAND, f"rebuild the initramfs: {owed}", argv=initramfs_update_argv(boot.initramfs_tool))]


def _default_args_plan(inputs: BootInputs, request: CmdlineRequest) -> CmdlinePlan:
    """The edit of the default's arguments (kernel_cmdline's planner where the loader has one)."""
    boot = inputs.boot
    if boot.loader == "grub":
        grub = inputs.grub
        if grub is None or grub.grub_default is None:
            return CmdlinePlan(
                refusals=[
                    Refusal(
                        "/etc/default/grub does not exist on this GRUB host",
                        "restore it (Debian's package grub2-common ships it)",
                    )
                ]
            )
        return plan_grub(
            grub.grub_default, boot.proc_cmdline, request, grub.update_argv or ["update-grub"], grub.dropins
        )
    if boot.loader == "bls":
        rc, out, err = inputs.grubby_info or (127, "", "grubby was not asked (not the live root)")
        args = grubby_default_args(out) if rc == 0 else None
        if args is None:
            return CmdlinePlan(
                refusals=[Refusal(f"grubby --info=DEFAULT gave no args= line (rc {rc}): {err.strip()[:200]}")]
            )
        return plan_grubby(args, boot.proc_cmdline, request)
    if boot.loader == "systemd-boot":
        return _plan_kernel_cmdline_file(boot, request)
    return CmdlinePlan(
        refusals=[
            Refusal(
                f"no bootloader gpuprov can change was found ({boot.evidence})",
                f"see {DOC} for the bootloaders gpuprov supports",
            )
        ]
    )


# Arguments of the running kernel that belong to one boot, never to /etc/kernel/cmdline.
_BOOT_ONLY = ("BOOT_IMAGE", "initrd", TRIAL_ARG)


def _plan_kernel_cmdline_file(boot: BootloaderFacts, request: CmdlineRequest) -> CmdlinePlan:
    """systemd-boot: kernel-install (and proxmox-boot-tool) take the arguments from /etc/kernel/cmdline."""
    current_text = boot.kernel_cmdline
    if current_text is None:  # kernel-install falls back to the running kernel's
        current_text = " ".join(a for a in kernel_split(boot.proc_cmdline) if kernel_param(a)[0] not in _BOOT_ONLY)
    current = kernel_split(current_text)
    new = edit_args(current, request.add, request.remove)
    plan = CmdlinePlan(args_before=" ".join(current), args_after=" ".join(new))
    if new != current:
        bad = [a for a in new if argument_problem(a)]
        if bad:
            return CmdlinePlan(
                refusals=[
                    Refusal(
                        f"/{KERNEL_CMDLINE} holds {show(bad[0])}, which gpuprov cannot rewrite safely",
                        "fix it by hand, then run again",
                    )
                ]
            )
        if len(plan.args_after) > MAX_LINE:
            return CmdlinePlan(refusals=[Refusal("the kernel command line would be too long", "drop arguments")])
        action = file_action(
            KERNEL_CMDLINE,
            plan.args_after + "\n",
            boot.kernel_cmdline + "\n" if boot.kernel_cmdline is not None else None,
            "kernel arguments for the next boot",
        )
        if action:
            plan.actions.append(action)
            plan.actions.append(_sdboot_refresh(boot))
    plan.reboot_required = reboot_owed(boot.proc_cmdline, request)
    return plan


def _sdboot_refresh(boot: BootloaderFacts) -> Action:
    if boot.proxmox_boot_tool:
        return Action(COMMAND, "copy kernels and arguments to the ESPs", argv=["proxmox-boot-tool", "refresh"])
    kver = boot.kernel_release
    return Action(
        COMMAND,
        "rewrite the boot entry from /etc/kernel/cmdline",
        argv=["kernel-install", "add", kver, f"/boot/vmlinuz-{kver}", f"/{boot.initrd or f'boot/initrd.img-{kver}'}"],
    )


def _oneshot_argv(boot: BootloaderFacts) -> list[str] | None:
    if boot.loader == "systemd-boot":
        return ["bootctl", "set-oneshot", f"{TRIAL_ENTRY}.conf"] if "bootctl" in boot.tools else None
    tool = "grub-reboot" if "grub-reboot" in boot.tools else "grub2-reboot" if "grub2-reboot" in boot.tools else None
    return [tool, TRIAL_ENTRY] if tool else None


def grubenv_problem(boot: BootloaderFacts) -> str | None:
    """Why GRUB could not spend a one-shot entry on this host (it writes its environment block
    only on a plain disk and a file system without checksums), or None."""
    if boot.loader == "systemd-boot":
        return None
    source, fstype = boot.boot_fs
    if fstype in ("zfs", "btrfs"):
        return f"/boot is on {fstype}, where GRUB cannot write its environment block"
    if source.startswith(("/dev/md", "/dev/mapper/", "/dev/dm-")):
        return f"/boot is on {source} (RAID or LVM), where GRUB cannot write its environment block"
    if boot.grubenv is None:
        return "there is no GRUB environment block (/boot/grub/grubenv)"
    if GRUB_ENV in boot.unreadable:
        return f"{boot.unreadable[GRUB_ENV]}: GRUB would neither read nor spend a one-shot entry in it"
    return None


def _default_entry(boot: BootloaderFacts, inputs: BootInputs) -> tuple[Entry | None, str | None]:
    if boot.loader == "grub":
        if GRUB_CFG in boot.unreadable:
            return None, boot.unreadable[GRUB_CFG]
        grub_default = None
        if inputs.grub and inputs.grub.grub_default is not None:
            m = re.search(r"^GRUB_DEFAULT=(.*)$", inputs.grub.grub_default.decode("utf-8", "replace"), re.M)
            grub_default = m.group(1) if m else None
        return grub_default_entry(boot.grub_cfg or "", grub_default, (boot.grubenv or {}).get("saved_entry"))
    return bls_default_entry(boot.entries, boot.entry_selected, boot.kernel_release)


def _trial_paths(boot: BootloaderFacts, entry: Entry) -> tuple[str | None, str | None]:
    """(the trial initramfs as the entry names it, its root-relative path)."""
    if not entry.initrd:
        return None, None
    named = entry.initrd + TRIAL_SUFFIX
    if boot.loader == "systemd-boot":
        return named, f"{boot.esp}/{named.lstrip('/')}"
    # GRUB and BLS name it on the file system that holds /boot: "/boot/x" on /, "/x" on a /boot mount.
    return named, "boot/" + named.rsplit("/", 1)[-1]


def _plan_trial(
    inputs: BootInputs,
    request: BootRequest,
    plan: BootPlan,
    default: CmdlinePlan,
    load_actions: list[Action],
    input_actions: list[Action],
) -> BootPlan:
    boot = inputs.boot
    problem = grubenv_problem(boot)
    oneshot = _oneshot_argv(boot)
    if problem is None and oneshot is None:
        tool = "bootctl" if boot.loader == "systemd-boot" else "grub-reboot or grub2-reboot"
        problem = f"no tool to set a one-shot boot ({tool})"
    entry, entry_problem = _default_entry(boot, inputs)
    problem = problem or entry_problem or ("no default boot entry" if entry is None else None)
    if problem or entry is None:
        plan.stage = "refused"
        plan.refusals.append(
            Refusal(
                f"the new kernel arguments cannot be tried once before they become the default: {problem}",
                f"set trial: false (iommu_host_boot_trial: false) to change the default directly, "
                f"with the console at hand; see {DOC}",
            )
        )
        return plan
    tid = trial_id(kernel_split(default.args_after or ""), request.vfio_modules)
    plan.trial_id = tid
    state, boot_id = boot.state, boot.boot_id
    running = parse_cmdline(boot.proc_cmdline)
    same = state is not None and state.get("id") == tid
    if boot.state_problem:
        # Unknown, never guessed: no field of it is used. The default was never changed while a
        # trial was open, so the way back (a plain boot) is intact; a new trial replaces the record.
        plan.warnings.append(
            f"{boot.state_problem}: it is unknown and replaced by this trial's record (nothing in it is used; "
            f"the default entry is unchanged); to keep it for a look, copy it away first; see {DOC}"
        )
    added = " ".join(plan.added) or "(none)"
    if same and state and state.get("status") == "failed" and not request.retry_failed:
        plan.stage = "refused"
        plan.refusals.append(
            Refusal(
                f"a trial boot with the new arguments {added} failed "
                f"({show(str(state.get('why', 'it did not come up')), 400)}); "
                f"the default is unchanged ({show(str(state.get('args_before') or ''), 200)})",
                "fix the arguments, or set retry_failed: true (iommu_host_retry_failed_trial: true) "
                "to try them once more",
            )
        )
        return plan
    if same and state and state.get("status") == "armed" and state.get("armed_boot_id") != boot_id:
        if running.get(TRIAL_ARG) == tid:
            return _judge_trial(inputs, request, plan, default, state)
        # The host is up again without the trial's marker, the one-shot spent. When the trial boot
        # reached multi-user (its unit noted it) nobody checked it in time (the controller died, or
        # was slower than the watchdog): not the arguments' fault, it is armed again (twice at most).
        came_up = (inputs.files.get(TRIAL_UP) or "").strip() == f"{TRIAL_ARG}={tid}"
        unconfirmed = unconfirmed_count(state)
        if came_up and unconfirmed < MAX_UNCONFIRMED:
            plan.warnings.append(
                "the trial boot came up but was not checked before its watchdog reset it "
                "(the controller was gone, or slower than watchdog_seconds): it is tried again"
            )
            state = {**state, "unconfirmed": unconfirmed + 1, "status": "armed"}
            return _arm(inputs, request, plan, default, load_actions, input_actions, entry, state, tid, rearm=False)
        # Else the trial boot panicked, hung or was reset before multi-user. Record it; the default
        # was never touched.
        why = "the trial boot did not come up: the host came back by itself on its previous arguments"
        plan.failure = (
            f"{why}; the arguments tried: {added} (whole line: {show(str(state.get('trial_args')), 400)}); "
            f"the default is unchanged. Fix them, or set retry_failed: true to try again; see {DOC}"
        )
        plan.stage = "failed"
        record = _state_action(inputs, _failed_record(state, boot_id, why), "record the failed trial")
        plan.actions = _forget_trial(inputs, committed=False) + ([record] if record else [])
        return plan
    rearm = same and state is not None and state.get("status") == "armed"
    return _arm(inputs, request, plan, default, load_actions, input_actions, entry, state if same else None, tid, rearm)


def _arm(
    inputs: BootInputs,
    request: BootRequest,
    plan: BootPlan,
    default: CmdlinePlan,
    load_actions: list[Action],
    input_actions: list[Action],
    entry: Entry,
    state: dict | None,
    tid: str,
    rearm: bool,
) -> BootPlan:
    """Arm the trial (again, when a run was killed before its reboot: what is done is not redone)."""
    boot = inputs.boot
    added = " ".join(plan.added) or "(none)"
    wdt = request.watchdog_module or (boot.watchdogs[0] if boot.watchdogs else None)
    if not (wdt and family_debian(boot)):
        wdt = None
        plan.warnings.append(
            "no hardware watchdog to arm for the trial boot (none found, or not an initramfs-tools host): "
            "a panic still falls back (panic=), a hang needs the console or your BMC"
        )
    hooks = []
    for path, text in (watchdog_files(wdt) if wdt else {}).items():
        action = file_action(path, text, inputs.files.get(path), "arm the watchdog on a trial boot only", mode=0o755)
        if action:
            hooks.append(action)
    owed_initramfs = initramfs_owed(boot, input_actions + hooks)
    actions = [*load_actions, *input_actions, *hooks]
    if not request.reboot_allowed:
        # Nothing that boots is touched until the play may reboot: an unwatched trial boot would
        # always "fail" (its watchdog fires) and be recorded so.
        plan.actions, plan.reboot_required, plan.reboot, plan.stage = actions, True, "trial", "owed"
        return plan
    if rearm and state is not None and trial_initrd_of(state) in inputs.present:
        owed_initramfs = owed_initramfs or "built for this trial"  # the trial entry keeps naming it
    trial_initrd, trial_initrd_rel = _trial_paths(boot, entry) if owed_initramfs else (None, None)
    if trial_initrd_rel is not None and trial_initrd_of({"trial_initrd": trial_initrd_rel}) is None:
        # The entry's initrd path is read from the host: built, moved or removed only where the
        # trial record's own check would allow it later.
        plan.stage = "refused"
        plan.refusals.append(
            Refusal(
                f"the default entry names its initramfs {show(entry.initrd or '')}, not a path gpuprov "
                "builds a trial initramfs beside",
                f"set trial: false; see {DOC}",
            )
        )
        return plan
    built = rearm and trial_initrd_rel is not None and trial_initrd_rel in inputs.present
    extra = [f"panic={request.panic_seconds}", f"{TRIAL_ARG}={tid}", *watchdog_args(wdt, request.watchdog_seconds)]
    before, after = kernel_split(default.args_before or ""), kernel_split(default.args_after or "")
    trial_args = edit_args(_apply_default_edit(entry.args, before, after), extra, [])
    bad = [a for a in trial_args if argument_problem(a)]
    if bad:
        plan.stage = "refused"
        plan.refusals.append(
            Refusal(
                f"the default entry's kernel line holds {show(bad[0])}, which gpuprov cannot copy safely "
                "into a trial entry",
                f"set trial: false; see {DOC}",
            )
        )
        return plan
    plan.trial_args = " ".join(trial_args)
    title = f"gpuprov trial: {added}"[:120]
    if trial_initrd_rel and not built:
        # Built beside and renamed: a build killed halfway never leaves a trial initramfs that counts.
        target = "/" + trial_initrd_rel
        argv = initramfs_build_argv(boot.initramfs_tool, target + ".new", entry.release)
        actions.append(Action(COMMAND, f"build the trial initramfs ({owed_initramfs})", argv=argv))
        actions.append(Action(COMMAND, "the trial initramfs is complete", argv=["mv", "-f", target + ".new", target]))
    if boot.loader == "grub":
        text = custom_cfg(inputs.files.get(GRUB_CUSTOM), grub_trial_entry(entry, trial_args, trial_initrd, title))
        action = file_action(GRUB_CUSTOM, text, inputs.files.get(GRUB_CUSTOM), "the trial boot entry")
    else:
        path = _bls_trial_path(boot)
        text = bls_trial_entry(entry, trial_args, trial_initrd, title)
        action = file_action(path, text, inputs.files.get(path), "the trial boot entry")
    if action:
        actions.append(action)
    if not boot.oneshot_pending:
        argv = _oneshot_argv(boot)  # there is one: _plan_trial refused otherwise
        actions.append(Action(COMMAND, "boot the trial entry once, at the next boot only", argv=argv))
    if inputs.files.get(TRIAL_UP) is not None:
        actions.append(Action(REMOVE_FILE, "a new trial boot", path=TRIAL_UP, before=inputs.files.get(TRIAL_UP)))
    for path, text in TRIAL_UNIT_FILES.items():
        action = file_action(path, text, inputs.files.get(path), "note that a trial boot came up")
        if action:
            actions.append(action)
    record = {
        "id": tid,
        "status": "armed",
        "loader": boot.loader,
        "armed_boot_id": boot.boot_id,
        "unconfirmed": unconfirmed_count(state or {}),
        "added": plan.added,
        "args_before": default.args_before,
        "args_after": default.args_after,
        "trial_args": plan.trial_args,
        "trial_initrd": trial_initrd_rel,
        "watchdog": wdt,
    }
    state_action = _state_action(inputs, record, "record the armed trial")
    if state_action:
        actions.append(state_action)
    plan.actions = actions
    plan.reboot_required, plan.reboot, plan.stage = True, "trial", "armed"
    return plan


def unconfirmed_count(state: dict) -> int:
    """The record's count of trial boots that came up unchecked (facts/bootloader.py checked its
    type); anything else counts as spent, so the trial is not tried again unasked."""
    value = state.get("unconfirmed", 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_UNCONFIRMED:
        return MAX_UNCONFIRMED
    return value


def family_debian(boot: BootloaderFacts) -> bool:
    return (boot.os_family or "Debian") == "Debian"


def _apply_default_edit(entry_args: list[str], before: list[str], after: list[str]) -> list[str]:
    """The default entry's kernel line with the default's edit applied: what ``after`` gains over
    ``before`` is added (by name), what it lost is removed."""
    had = set(before)
    gained = [a for a in after if a not in had]
    after_names = {kernel_param(a)[0] for a in after}
    lost = [kernel_param(a)[0] for a in before if kernel_param(a)[0] not in after_names]
    return edit_args(entry_args, gained, lost)


def _bls_trial_path(boot: BootloaderFacts) -> str:
    folder = f"{boot.esp}/loader/entries" if boot.loader == "systemd-boot" else "boot/loader/entries"
    return f"{folder}/{TRIAL_ENTRY}.conf"


def _state_action(inputs: BootInputs, record: dict, why: str) -> Action | None:
    return file_action(TRIAL_STATE, state_text(record), inputs.files.get(TRIAL_STATE), why)


def _forget_trial(inputs: BootInputs, committed: bool, tried: bool = False) -> list[Action]:
    """Remove what a trial left: its entry, its note, its initramfs (moved into place only when
    ``tried``: this trial passed its checks; else removed) and, when ``committed``, its record."""
    boot, actions = inputs.boot, []
    if boot.loader == "grub":
        text = custom_cfg(inputs.files.get(GRUB_CUSTOM), None)
        action = file_action(GRUB_CUSTOM, text, inputs.files.get(GRUB_CUSTOM), "drop the trial boot entry")
    else:
        path = _bls_trial_path(boot)
        action = file_action(path, None, inputs.files.get(path), "drop the trial boot entry")
    if action:
        actions.append(action)
    trial_initrd = trial_initrd_of(boot.state)
    if trial_initrd and trial_initrd in inputs.present:
        if tried:
            target = "/" + trial_initrd[: -len(TRIAL_SUFFIX)]
            actions.append(
                Action(
                    COMMAND, "the tried initramfs becomes the default's", argv=["mv", "-f", "/" + trial_initrd, target]
                )
            )
        else:
            actions.append(Action(COMMAND, "drop the trial initramfs", argv=["rm", "-f", "/" + trial_initrd]))
    action = file_action(TRIAL_UP, None, inputs.files.get(TRIAL_UP), "the trial is over")
    if action:
        actions.append(action)
    if committed:
        action = file_action(TRIAL_STATE, None, inputs.files.get(TRIAL_STATE), "the trial is over")
        if action:
            actions.append(action)
    return actions


_TRIAL_INITRD = re.compile(rf"(?:boot|efi|boot/efi)(?:/[A-Za-z0-9._+-]+)+{re.escape(TRIAL_SUFFIX)}\Z")


def trial_initrd_of(state: dict | None) -> str | None:
    """The trial initramfs a trial record names, when it is a path gpuprov makes (the record is read
    from the host: a path elsewhere is never moved or removed)."""
    path = (state or {}).get("trial_initrd")
    if isinstance(path, str) and _TRIAL_INITRD.match(path) and "/../" not in f"/{path}/" and "/./" not in f"/{path}/":
        return path
    return None


def trial_check_failures(checks: TrialChecks | None, request: BootRequest) -> list[str]:
    """What the trial boot must show before it is committed, as failures (empty: passed)."""
    if checks is None or checks.iommu is None:
        return ["the trial boot's IOMMU facts could not be read"]
    out = []
    if not checks.iommu.enabled:
        out.append("no IOMMU came up (no DMAR/IVRS unit, no IOMMU groups): enable VT-d / AMD-Vi in the firmware setup")
    missing = [m for m in request.vfio_modules if m.replace("-", "_") not in checks.iommu.modules]
    if missing:
        out.append(f"vfio modules not loaded: {', '.join(missing)}")
    for address in request.expect_vfio:
        driver = checks.drivers.get(address)
        if driver != "vfio-pci":
            out.append(f"{address} is on {driver or 'no driver'}, not vfio-pci")
    if checks.user_check is not None and checks.user_check[0] != 0:
        out.append(f"the trial check command failed (exit {checks.user_check[0]}): {checks.user_check[1][-300:]}")
    return out


def _judge_trial(
    inputs: BootInputs, request: BootRequest, plan: BootPlan, default: CmdlinePlan, state: dict
) -> BootPlan:
    """On the trial boot: commit when the checks pass, else record the failure and fall back."""
    boot = inputs.boot
    failures = trial_check_failures(inputs.checks, request)
    armed = state.get("watchdog") and boot.watchdogs
    stop_watchdog = sysfs_write("dev/watchdog", "V", "stop the trial boot's watchdog") if armed else None
    if failures:
        why = "the trial boot came up but its checks failed: " + "; ".join(failures)
        tried = " ".join(plan.added) or "(none)"
        plan.failure = f"{why}; the default is unchanged; the host reboots onto it. Arguments tried: {tried}; see {DOC}"
        plan.stage, plan.reboot = "failed", "fallback"
        record = _state_action(inputs, _failed_record(state, boot.boot_id, why), "record the failed trial")
        plan.actions = _forget_trial(inputs, committed=False) + ([record] if record else [])
        return plan
    first = [stop_watchdog] if stop_watchdog else []
    trial_initrd = trial_initrd_of(state)
    sdboot = boot.loader == "systemd-boot"
    if sdboot and trial_initrd in inputs.present and boot.initrd:
        # The trial's initramfs is on the ESP; kernel-install (or proxmox-boot-tool) copies /boot's
        # there for the default entry: it goes to /boot first.
        argv = ["cp", "-f", f"/{trial_initrd}", f"/{boot.initrd}"]
        first.append(Action(COMMAND, "the tried initramfs becomes the default's", argv=argv))
    forget = _forget_trial(inputs, committed=True, tried=not sdboot)
    plan.actions = [*first, *default.actions, *forget]
    plan.stage, plan.reboot, plan.reboot_required = "committed", "none", False
    return plan
