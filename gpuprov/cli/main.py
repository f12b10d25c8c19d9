"""The ``gpuprov`` command line.

Exit codes: 0 fine; 2 bad input (nothing was done); 3 a GPU named with
``--require-ready`` is not ready (for monitoring and CI gates).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Any

from .. import __version__
from .common import (
    EXIT_BAD_INPUT,
    EXIT_NOT_READY,
    EXIT_OK,
    UsageError,
    add_json_arguments,
    addresses,
    host_root,
    read_input,
)

# ---------------------------------------------------------------- inspect


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..facts.domains import read_running
    from ..facts.host import gather
    from ..facts.sysfs import Sysfs
    from ..report import write_json
    from ..report.inspect import build_report
    from ..rules.assess import assess

    named = addresses(args.device, "--device")
    require = [] if args.require_ready == ["all"] else addresses(args.require_ready, "--require-ready")
    from .inventory import wanted

    given = wanted(args, args.declaration, "--declaration")
    source, doc = given or (args.declaration, read_input(args.declaration) if args.declaration else None)
    with host_root(args.root) as root:
        sysfs = Sysfs(root)
        facts = gather(sysfs)
        running = read_running(sysfs)
    missing = [a for a in named + require if a not in facts.pci]
    if missing:
        raise UsageError(
            f"no PCI device {', '.join(missing)} on this host: check the address with `lspci -D` "
            f"(this host has {len(facts.pci)} PCI devices)"
        )
    declared: dict[str, dict[str, str]] | None = None
    refused: list[str] = []
    if doc is not None:
        declared, refused = _declared_uses(source, doc, facts)
        named += [a for a in declared if a in facts.pci and a not in named]
    gpus = assess(facts, extra=named + require)
    from ..rules.intent import in_use_by_vm, judge

    for gpu in gpus:
        if declared is None:
            in_use_by_vm(gpu, running)
        else:
            entry = declared.get(gpu.address)
            judge(facts, gpu, entry and entry["use"], entry and entry["entry"], running)
    report = build_report(facts, gpus)
    report["host"]["root"] = args.root
    if args.json:
        write_json(report, sys.stdout, compact=args.compact)
    else:
        from .table import print_report

        print_report(report, show_all=args.all)

    gate = [g for g in gpus if g.address in require] if require else gpus if args.require_ready else []
    if declared is not None and not require:  # the GPUs the declaration gives a job, not those it leaves alone
        gate = [g for g in gate if g.intended_use not in ("host", "not declared")]
    not_ready = [g for g in gate if not g.ready]
    # A declaration this host breaks (told above, by _declared_uses) is never ready.
    nothing = not gate and declared is None  # with a declaration, GPUs it gives no job need nothing
    if args.require_ready and (not_ready or nothing or refused):
        what = ", ".join(g.address for g in not_ready) or ("" if refused else "no GPU found")
        print(f"gpuprov: not ready: {what or f'{source} does not fit this host'}", file=sys.stderr)
        for gpu in not_ready:  # why, and what to do, for a log that has only stderr
            use = f" (use: {gpu.intended_use})" if gpu.intended_use else ""
            for f in gpu.blockers:
                print(
                    f"gpuprov: {gpu.address}{use}: {f.message}" + (f"; fix: {f.fix}" if f.fix else ""), file=sys.stderr
                )
        return EXIT_NOT_READY
    return EXIT_OK


def _declared_uses(source: str, doc: Any, facts: Any) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Address -> {use, entry} from a host declaration (or the old gpuprov_gpus), and what this host
    refuses of it (a renumbered bus, an id guard); exit 2 on input problems."""
    from ..model.resolve import resolve
    from .plan import input_problems

    model = resolve(doc, facts)
    if model.problems:
        raise UsageError(input_problems(source, model.problems))
    refused = [r.describe() for r in model.refusals]
    for line in refused:  # the declaration against this host: told; its GPUs are judged as declared
        print(f"gpuprov: {source}: {line}", file=sys.stderr)
    return model.declared, refused


def cmd_capture(args: argparse.Namespace) -> int:
    from .capture import CaptureError, capture

    try:
        with host_root(args.root) as root:  # a capture of a capture: the same checks as inspect's
            count = capture(args.output, root, run_commands=not args.no_commands)
    except CaptureError as exc:
        raise UsageError(str(exc)) from None
    size = os.path.getsize(args.output)
    print(f"wrote {args.output}: {count} entries, {size / 1024:.0f} KiB")
    return EXIT_OK


# ---------------------------------------------------------------- completion

# Words the generated scripts may hold unquoted: option strings, command names, choices.
_SHELL_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+-]*|-{1,2}[A-Za-z0-9][A-Za-z0-9_-]*")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _completion_table(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, tuple]]:
    """(the words after ``gpuprov``, command -> (its options, option -> its value's choices or
    None for a path, its first positional's choices or None for a path or () for none))."""
    commands: dict[str, tuple] = {}
    for name, sub in _subcommands(parser).items():
        options: list[str] = []
        values: dict[str, tuple[str, ...] | None] = {}
        positional: tuple[str, ...] | None = ()
        for action in sub._actions:
            choices = tuple(str(c) for c in action.choices) if action.choices else None
            if action.option_strings:
                options += action.option_strings
                if action.nargs != 0:
                    values |= dict.fromkeys(action.option_strings, choices)
            elif positional == ():
                positional = choices
        commands[name] = (options, values, positional)
    top = [o for a in parser._actions for o in a.option_strings] + list(commands)
    words = top + [w for opts, values, pos in commands.values() for w in [*opts, *(pos or ())]]
    words += [c for _, values, _ in commands.values() for choices in values.values() for c in choices or ()]
    odd = sorted({w for w in words if not _SHELL_WORD.fullmatch(w)})
    if odd:  # the scripts hold these words unquoted
        raise ValueError(f"completion: words a shell would split or expand: {odd}")
    return top, commands


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A bash completion function for ``parser``'s command and its subcommands, from the parser
    itself: commands, options per subcommand, choices where an option or argument has them,
    and the shell's file name completion elsewhere. zsh runs the same function through its
    bash layer (bashcompinit)."""
    top, commands = _completion_table(parser)
    options = [f'        {name}) opts="{" ".join(opts)}" ;;' for name, (opts, _, _) in commands.items()]
    by_values: dict[tuple[str, ...] | None, list[str]] = {}  # what a value completes to -> "command option"s
    for name, (_, vals, _) in commands.items():
        for option, choices in vals.items():
            by_values.setdefault(choices, []).append(f'"{name} {option}"')
    # A path (no choices): no words, so the shell's own file name completion runs (-o default).
    values = [
        f"        {'|'.join(pairs)})\n            "
        + (f'COMPREPLY=($(compgen -W "{" ".join(choices)}" -- "$cur")); ' if choices else "")
        + "return 0 ;;"
        for choices, pairs in by_values.items()
    ]
    positionals = [
        f'        {name}) COMPREPLY=($(compgen -W "{" ".join(pos)}" -- "$cur")) ;;'
        for name, (_, _, pos) in commands.items()
        if pos
    ]
    body = "\n".join(
        [
            "_gpuprov() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" opts i',
            "    COMPREPLY=()",
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        case "${COMP_WORDS[i]}" in -*) ;; *) cmd="${COMP_WORDS[i]}"; break ;; esac',
            "    done",
            '    case "$cmd" in',
            f'        "") opts="{" ".join(top)}" ;;',
            *options,
            "        *) return 0 ;;",
            "    esac",
            '    case "$cmd $prev" in',
            *values,
            "    esac",
            '    if [[ -z "$cmd" || "$cur" == -* ]]; then',
            '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
            "        return 0",
            "    fi",
            '    case "$cmd" in',
            *positionals,
            "    esac",
            "}",
            "complete -o default -F _gpuprov gpuprov",
        ]
    )
    if shell == "zsh":
        return (
            "#compdef gpuprov\n"
            "# zsh completion for gpuprov, generated from its argument parser by `gpuprov completion zsh`:\n"
            "# zsh's bash completion layer runs the bash function. Install: gpuprov completion zsh >\n"
            '# "${fpath[1]}/_gpuprov", or `source <(gpuprov completion zsh)` in ~/.zshrc after compinit.\n'
            "autoload -U +X bashcompinit && bashcompinit\n" + body + "\n"
        )
    return (
        "# bash completion for gpuprov, generated from its argument parser by `gpuprov completion bash`.\n"
        "# Install: gpuprov completion bash > ~/.local/share/bash-completion/completions/gpuprov\n"
        "# (or `source <(gpuprov completion bash)` in ~/.bashrc).\n" + body + "\n"
    )


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(build_parser(), args.shell))
    return EXIT_OK


# ---------------------------------------------------------------- parser


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; ``command`` limits the lazily loaded commands to that one."""
    parser = argparse.ArgumentParser(
        prog="gpuprov",
        description="Turn KVM/libvirt hosts with GPUs into GPU-sharing hosts; diagnose why one is not ready.",
    )
    parser.add_argument("--version", action="version", version=f"gpuprov {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "inspect",
        help="show GPUs, IOMMU groups and passthrough readiness (read-only)",
        description="Read the host's sysfs/procfs and say, per GPU, whether it can be passed "
        "through to a VM and every reason why not. Read-only; runs as a normal user.",
    )
    p.add_argument("--root", default="/", help="read this root (an unpacked capture, or its .tar.gz) instead of /")
    add_json_arguments(p, "the report", "gpuprov.inspect/v1")
    p.add_argument("--all", action="store_true", help="also list every PCI device and IOMMU group")
    p.add_argument(
        "--device",
        action="append",
        default=[],
        metavar="ADDR",
        help="assess this PCI device too, whatever its class (repeatable)",
    )
    p.add_argument(
        "--require-ready",
        action="append",
        default=[],
        metavar="ADDR",
        help="exit 3 unless this GPU is ready for passthrough, or with --declaration for its declared use "
        "(repeatable; 'all' for every GPU found, or every GPU the declaration gives a job); the reasons go to stderr",
    )
    p.add_argument(
        "--declaration",
        metavar="HOST_VARS.yml",
        help="judge each GPU for the use this file declares (gpuprov_host, docs/reference/host-model.md): "
        "vGPU-ready, passthrough-ready or kept by the host; a GPU a running VM holds is in use by it",
    )
    from .inventory import add_arguments

    add_arguments(p)  # -i INVENTORY --host HOST: the declaration as Ansible sees that host's variables
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "capture",
        help="write what inspect reads into a tarball for a bug report",
        description="Copy the sysfs/procfs files that inspect reads into OUTPUT (.tar.gz), "
        "which `gpuprov inspect --root` reads back. Serial numbers, MACs, the host name and secrets are "
        "left out; addresses are renumbered (docs/concepts/capture-privacy.md).",
    )
    p.add_argument("output", metavar="OUTPUT", help="the tarball to write, e.g. host.tar.gz")
    p.add_argument("--root", default="/", help="capture this root instead of /")
    p.add_argument("--no-commands", action="store_true", help="do not add lspci/nvidia-smi outputs")
    p.set_defaults(func=cmd_capture)

    p = sub.add_parser(
        "completion",
        help="print a shell completion script for gpuprov (bash or zsh)",
        description="Print a completion script for gpuprov's commands and options, made from its own "
        "argument parser. bash: `gpuprov completion bash > ~/.local/share/bash-completion/completions/gpuprov`; "
        'zsh: `gpuprov completion zsh > "${fpath[1]}/_gpuprov"`.',
    )
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell")
    p.set_defaults(func=cmd_completion)

    # Commands whose modules are imported only when they run (or for the full
    # help): `inspect --json` on a big host pays for nothing it does not use.
    wanted = dict.fromkeys(m for name, m in COMMAND_MODULES.items() if command in (None, name))
    for module in wanted:  # one module may register several commands
        importlib.import_module(module, __package__).add_parser(sub)
    return parser


COMMAND_MODULES = {
    "verify": ".verify",
    "plan": ".plan",
    "topology": ".topology",
    "fleet": ".fleet",
    "init": ".declare",
    "convert": ".declare",
    "schema": ".declare",
}


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in ``argv``, when it is one of the lazily loaded ones."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMAND_MODULES or first in ("inspect", "capture", "completion") else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command_of(argv) or None)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    finally:
        from .secrets import end_redaction

        end_redaction()


def _run(args: argparse.Namespace) -> int:
    try:
        result: Any = args.func(args)
    except UsageError as exc:
        from .textsafe import safe_text  # the message may quote a member or value from the input

        print(f"gpuprov: error: {safe_text(exc, keep_newlines=True)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        print("gpuprov: interrupted", file=sys.stderr)
        return 130  # the shell's code for Ctrl-C; temporary roots are already removed
    except ModuleNotFoundError as exc:
        print(
            f"gpuprov: error: the Python module '{exc.name}' is missing: install gpuprov with its dependencies "
            "(pipx install ., or pip install . in a venv, from the checkout or its wheel: README, Install)",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    except Exception as exc:  # noqa: BLE001 - the last guard: hostile input must not end in a traceback
        # Causes found are fixed where they arise; this only keeps an unforeseen one to one line.
        if os.environ.get("GPUPROV_DEBUG") == "1":
            import traceback  # here: on the error path only (linecache, tokenize: ms of every run)

            traceback.print_exc()
        where = f"{type(exc).__name__} in {_where(exc)}"
        print(
            f"gpuprov: error: unexpected {where} while reading the input: check it (a capture: re-run "
            "`gpuprov capture` on the host); GPUPROV_DEBUG=1 shows the traceback for a bug report",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return int(result)


def _where(exc: BaseException) -> str:
    """``module:function`` where ``exc`` was raised, for the one-line report."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "gpuprov"
    last = frames[-1]
    return f"{os.path.basename(last.filename)}:{last.name}"
