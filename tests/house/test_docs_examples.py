"""Every example in the README and docs/ is run by a test (issue #28 item 5), in the way that
fits it; nothing here runs a command or touches a host:

- YAML blocks that declare a host (``gpuprov_host``, ``gpuprov_layouts``, a mig-parted or
  vgpu-device-manager file as ``gpuprov_layouts`` takes it): ``gpuprov plan --json`` on a
  captured host accepts each as input: it may refuse on the capture's devices (exit 3), never
  call the input malformed (exit 2). A layout without a host is planned once per layout, as a
  host picking it (``layout: NAME``); an example in the old form without VMs with an empty
  ``gpu_vms_list``.
- Other variables in a YAML block: each is one a role of the collection takes (its defaults or
  argument spec) or a playbook reads.
- Task lists (``- name: ...``): each task's module is the collection's (or ansible.builtin's)
  and every argument it gives is one of the module's documented options.
- Shell examples (``console`` blocks' ``$`` lines, ``sh``/``bash`` blocks): each ``gpuprov``
  command is parsed by gpuprov's own argument parser (parsed only, never run); each
  ``ansible-playbook`` by ansible-core's parser, and the playbook it names exists (a path in the
  checkout, or ``gpuprov.kvm.NAME`` as the collection's ``playbooks/NAME.yml``), as does its
  inventory (in the checkout, or ``inventory``/``inventory.yml``: the reader's own, which the
  README's step 2 has them write).
- Inline ``gpuprov COMMAND --option`` spans in prose: the command exists and has each option.

The generated CLI reference (docs/reference/cli.md) is the parser's own help and is not
re-checked here (tests/house/test_docs_reference.py keeps it current).
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuprov.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
# A captured host with an mdev parent, so mdev entries meet real sysfs.
HOST = ROOT / "tests" / "fixtures" / "hosts" / "mtty-mdev.tar.gz"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELLS = ("console", "sh", "bash", "shell")
# The reader's own inventory, which the README's step 2 writes (inventory/hosts.yml, host_vars).
READERS_INVENTORY = ("inventory", "inventory.yml")
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*(\S*)\s*$")


def blocks(page: Path) -> list[tuple[str, str, str]]:
    """(where, language, text) of every fenced block of ``page``, its indentation taken off."""
    found: list[tuple[str, str, str]] = []
    current: tuple[int, str, str, list[str]] | None = None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        fence = _FENCE.match(line)
        if current is None and fence:
            current = (number, fence.group(3), fence.group(1), [])
        elif current is not None and fence and not fence.group(3):
            found.append((f"{page.relative_to(ROOT).as_posix()}:{current[0]}", current[1], "\n".join(current[3])))
            current = None
        elif current is not None:
            current[3].append(line[len(current[2]) :] if line.startswith(current[2]) else line)
    assert current is None, f"{page}: a fence opened at line {current[0]} is never closed"
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]
YAML_BLOCKS = [(w, t) for w, lang, t in ALL_BLOCKS if lang in ("yaml", "yml")]


def _ids(items: list[tuple[Any, ...]]) -> list[str]:
    return [str(item[0]) for item in items]


# ---------------------------------------------------------------- YAML


def _kind(doc: Any) -> str:
    if isinstance(doc, list):
        return "tasks"
    if isinstance(doc, dict) and ("gpuprov_host" in doc or "gpuprov_layouts" in doc):
        return "declaration"
    if isinstance(doc, dict) and "version" in doc and ("mig-configs" in doc or "vgpu-configs" in doc):
        return "layout file"
    if isinstance(doc, dict) and re.search(
        r"^(gpu_vms_list|gpuprov_gpus|vfio_host_devices):", yaml.safe_dump(doc), re.M
    ):
        return "declaration"
    return "variables"


def test_every_yaml_example_parses_and_is_checked() -> None:
    kinds = {}
    for where, text in YAML_BLOCKS:
        doc = yaml.safe_load(text)
        assert isinstance(doc, (dict, list)), f"{where}: a YAML example that is neither a mapping nor a list"
        kinds[where] = _kind(doc)
    assert any(w.startswith("README.md:") and k == "declaration" for w, k in kinds.items()), "README lost its example"
    assert {"tasks", "declaration", "layout file", "variables"} <= set(kinds.values()), kinds


def _plan(doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    path = tmp_path / "host_vars.yml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    code = main(["plan", "--json", "--root", str(HOST), str(path)])
    out, err = capsys.readouterr()
    return code, err + out[:2000]


DECLARATIONS = [(w, t) for w, t in YAML_BLOCKS if _kind(yaml.safe_load(t)) in ("declaration", "layout file")]


@pytest.mark.parametrize(("where", "text"), DECLARATIONS, ids=_ids(DECLARATIONS))
def test_declaration_example_is_valid_plan_input(where: str, text: str, tmp_path: Path, capsys) -> None:
    doc = yaml.safe_load(text)
    if _kind(doc) == "layout file":
        doc = {"gpuprov_layouts": doc}
    declared = {k: v for k, v in doc.items() if k in ("gpuprov_host", "gpuprov_layouts")}
    if "gpuprov_host" in doc or "gpuprov_layouts" not in doc:
        hosts = [doc if "gpuprov_host" in doc or "gpu_vms_list" in doc else {**doc, "gpu_vms_list": []}]
    else:  # layouts alone (group_vars): a host picking each
        layouts = doc["gpuprov_layouts"]
        names = list(layouts.get("mig-configs") or layouts.get("vgpu-configs") or layouts)
        names = [n for n in names if n != "version"]
        assert names, f"{where}: gpuprov_layouts without a layout"
        hosts = [{**declared, "gpuprov_host": {"version": 1, "layout": name}} for name in names]
    for host in hosts:
        code, said = _plan(host, tmp_path, capsys)
        assert code in (0, 3), f"{where}: gpuprov plan exited {code}\n{said}"


def _role_variables() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "roles").glob("*/defaults/main.yml"):
        names |= set(yaml.safe_load(path.read_text(encoding="utf-8")) or {})
    for path in (ROOT / "roles").glob("*/meta/argument_specs.yml"):
        for spec in (yaml.safe_load(path.read_text(encoding="utf-8"))["argument_specs"]).values():
            names |= set(spec.get("options") or {})
    for path in (ROOT / "playbooks").glob("*.yml"):
        names |= set(re.findall(r"\b[a-z][a-z0-9_]*\b", path.read_text(encoding="utf-8")))
    return names


VARIABLES = [(w, t) for w, t in YAML_BLOCKS if isinstance(yaml.safe_load(t), dict)]


@pytest.mark.parametrize(("where", "text"), VARIABLES, ids=_ids(VARIABLES))
def test_variables_in_examples_are_ones_the_collection_reads(where: str, text: str) -> None:
    doc = yaml.safe_load(text)
    if _kind(doc) == "layout file":
        return
    known = _role_variables() | {"gpuprov_host", "gpuprov_layouts"}
    unknown = sorted(set(doc) - known)
    assert not unknown, f"{where}: no role or playbook of the collection reads {unknown}"


def _module_options(name: str) -> set[str] | None:
    """The documented options of ``gpuprov.kvm.NAME``; None when the collection has no such module."""
    path = ROOT / "plugins" / "modules" / f"{name}.py"
    if not path.is_file():
        return None
    doc = _documentation(path)
    options = set(doc.get("options") or {})
    for fragment in doc.get("extends_documentation_fragment") or []:
        if fragment.startswith("gpuprov.kvm."):
            name = fragment.removeprefix("gpuprov.kvm.")
            options |= set(_documentation(ROOT / "plugins" / "doc_fragments" / f"{name}.py").get("options") or {})
    return options


def _documentation(path: Path) -> dict[str, Any]:
    """A module's (or a doc fragment's) DOCUMENTATION, read without importing it."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DOCUMENTATION" for t in node.targets):
            return yaml.safe_load(ast.literal_eval(node.value))
    raise AssertionError(f"{path}: no DOCUMENTATION")


TASKS = [(w, t) for w, t in YAML_BLOCKS if isinstance(yaml.safe_load(t), list)]
TASK_KEYS = {"name", "when", "register", "become", "loop", "vars", "tags", "check_mode", "notify", "changed_when"}
TASK_KEYS |= {"failed_when", "until", "retries", "delay", "ignore_errors", "environment", "delegate_to", "loop_control"}


@pytest.mark.parametrize(("where", "text"), TASKS, ids=_ids(TASKS))
def test_task_examples_call_modules_the_collection_has_with_their_options(where: str, text: str) -> None:
    for i, task in enumerate(yaml.safe_load(text)):
        modules = [k for k in task if k not in TASK_KEYS]
        assert len(modules) == 1, f"{where}: task {i} names no one module: {sorted(task)}"
        (module,) = modules
        if module.startswith("ansible.builtin."):
            continue
        assert module.startswith("gpuprov.kvm."), f"{where}: task {i}: call {module} by its FQCN"
        options = _module_options(module.removeprefix("gpuprov.kvm."))
        assert options is not None, f"{where}: task {i}: the collection has no module {module}"
        args = task[module] or {}
        assert isinstance(args, dict), f"{where}: task {i}: {module}'s arguments as a mapping"
        unknown = sorted(set(args) - options)
        assert not unknown, f"{where}: task {i}: {module} has no option {unknown}"


# ---------------------------------------------------------------- shell


def _segments(line: str) -> list[list[str]]:
    """The simple commands of one shell line: split at ; && || | ( ), comments and redirections off."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    out: list[list[str]] = [[]]
    redirect = False
    for token in lexer:
        if redirect:
            redirect = False
        elif token and set(token) <= set(";&|()"):
            out.append([])
        elif token and set(token) <= set("<>"):
            redirect = True  # its target follows
        else:
            out[-1].append(token)
    return [seg[1:] if seg[:1] == ["sudo"] else seg for seg in out if seg]


def shell_commands() -> list[tuple[str, list[str]]]:
    found = []
    for where, lang, text in ALL_BLOCKS:
        if lang not in SHELLS:
            continue
        page, start = where.rsplit(":", 1)
        for k, line in enumerate(text.splitlines()):
            if lang == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            for seg in _segments(line):
                if seg[0] in ("gpuprov", "ansible-playbook"):
                    found.append((f"{page}:{int(start) + 1 + k}", seg))
    return found


COMMANDS = shell_commands()
GPUPROV = [(w, c) for w, c in COMMANDS if c[0] == "gpuprov"]
PLAYBOOK = [(w, c) for w, c in COMMANDS if c[0] == "ansible-playbook"]


def test_the_docs_show_commands() -> None:
    assert len(GPUPROV) > 30 and len(PLAYBOOK) > 5, (len(GPUPROV), len(PLAYBOOK))


@pytest.mark.parametrize(("where", "argv"), GPUPROV, ids=_ids(GPUPROV))
def test_gpuprov_example_parses(where: str, argv: list[str], capsys) -> None:
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{where}: `{shlex.join(argv)}` does not parse (exit {exc.code}): {capsys.readouterr().err}")


@pytest.mark.parametrize(("where", "argv"), PLAYBOOK, ids=_ids(PLAYBOOK))
def test_ansible_playbook_example_names_what_exists(where: str, argv: list[str], capsys) -> None:
    from ansible.cli.playbook import PlaybookCLI

    cli = PlaybookCLI(argv)
    cli.init_parser()
    try:
        options = cli.parser.parse_args(argv[1:])
    except SystemExit as exc:
        pytest.fail(f"{where}: `{shlex.join(argv)}` does not parse (exit {exc.code}): {capsys.readouterr().err}")
    assert options.args, f"{where}: no playbook"
    for playbook in options.args:
        if playbook.startswith("gpuprov.kvm."):
            name = playbook.removeprefix("gpuprov.kvm.")
            assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), f"{where}: {playbook} cannot be called by FQCN"
            assert (ROOT / "playbooks" / f"{name}.yml").is_file(), f"{where}: the collection has no {playbook}"
        else:
            assert (ROOT / playbook).is_file(), f"{where}: no playbook {playbook} in the checkout"
    for inventory in options.inventory or []:
        assert inventory in READERS_INVENTORY or (ROOT / inventory).exists(), f"{where}: no inventory {inventory}"


# ---------------------------------------------------------------- inline `gpuprov ...` in prose

_OPTION = re.compile(r"-[A-Za-z]|--[a-z][a-z0-9-]*")
_INLINE = re.compile(r"(?<!`)`(?:sudo )?(gpuprov [a-z][^`]*)`")


def inline_commands() -> list[tuple[str, list[str]]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _INLINE.finditer(text):
            where = f"{page.relative_to(ROOT).as_posix()}:{text.count(chr(10), 0, match.start()) + 1}"
            for seg in _segments(match.group(1).replace("[", " ").replace("]", " ")):
                if seg[0] == "gpuprov":
                    found.append((where, seg))
    return found


INLINE = inline_commands()


def test_inline_commands_name_commands_and_options_that_exist() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.choices and "plan" in a.choices).choices
    wrong = []
    for where, argv in INLINE:
        if len(argv) < 2 or argv[1].startswith("-"):
            continue
        sub = commands.get(argv[1])
        if sub is None:
            wrong.append(f"{where}: no command gpuprov {argv[1]}")
            continue
        options = {o for a in sub._actions for o in a.option_strings}
        wrong += [
            f"{where}: gpuprov {argv[1]} has no {o}" for o in argv[2:] if _OPTION.fullmatch(o) and o not in options
        ]
    assert len(INLINE) > 30 and not wrong, "\n".join(wrong)


# ---------------------------------------------------------------- outputs shown from a capture

WIDTH = "100"  # the docs show output as an 100-column terminal prints it


def shown_outputs() -> list[tuple[str, list[str], str]]:
    """(where, argv, the output the docs show) of each ``$ gpuprov ...`` console line that reads a
    capture of tests/fixtures and shows what it prints (the lines up to the next ``$`` line)."""
    found = []
    for where, lang, text in ALL_BLOCKS:
        if lang != "console":
            continue
        page, start = where.rsplit(":", 1)
        lines = text.splitlines()
        for k, line in enumerate(lines):
            if not line.startswith("$ gpuprov ") or "--root tests/fixtures/" not in line:
                continue
            output = []
            for following in lines[k + 1 :]:
                if following.startswith("$ "):
                    break
                output.append(following)
            while output and not output[-1].strip():
                output.pop()
            if output:
                (argv,) = _segments(line[2:])
                found.append((f"{page}:{int(start) + 1 + k}", argv, "\n".join(output)))
    return found


OUTPUTS = shown_outputs()


def real_output(argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", WIDTH)
    monkeypatch.setenv("NO_COLOR", "1")
    main(argv[1:])
    return "\n".join(line.rstrip() for line in capsys.readouterr().out.rstrip().splitlines())


def test_the_docs_show_outputs_from_captures() -> None:
    assert len(OUTPUTS) >= 3, OUTPUTS


@pytest.mark.parametrize(("where", "argv", "shown"), OUTPUTS, ids=_ids(OUTPUTS))
def test_output_shown_is_what_the_command_prints(where: str, argv: list[str], shown: str, monkeypatch, capsys):
    real = real_output(argv, monkeypatch, capsys)
    assert "\n".join(line.rstrip() for line in shown.splitlines()) == real, (
        f"{where}: `{shlex.join(argv)}` (COLUMNS={WIDTH}) prints:\n{real}"
    )


def test_inspect_json_page_names_every_key_a_report_has(capsys) -> None:
    """docs/reference/inspect-json.md against a real report (the 2x H200 capture, with nvidia-smi's
    names): every key of the report, its host, its PCI devices and its GPUs is named there."""
    import json

    main(["inspect", "--json", "--root", str(ROOT / "tests" / "fixtures" / "hosts" / "h200x2-live.tar.gz")])
    report = json.loads(capsys.readouterr().out)
    page = (ROOT / "docs" / "reference" / "inspect-json.md").read_text(encoding="utf-8")
    keys = set(report) | set(report["host"])
    keys |= {k for d in report["pci_devices"] for k in d} | {k for g in report["gpus"] for k in g}
    assert any(g.get("product_name") for g in report["gpus"])  # the capture names its GPUs
    missing = sorted(k for k in keys if f"`{k}`" not in page and f"`{k}[]" not in page and f"{k}[]`" not in page)
    assert not missing, f"docs/reference/inspect-json.md does not name {missing}"
