"""The Pythons gpuprov claims, 3.9 to 3.13, and how the README installs it.

The package (gpuprov/, the CLI and the code the modules carry to targets) and the modules
(plugins/) must run on 3.9: pyproject's requires-python, its classifiers and ruff's
target-version say the same floor, and the source holds no construct newer than that floor,
neither syntax (a ``match``, parenthesised context managers: the parser is asked for 3.9) nor
what parses everywhere and fails only when it runs (``isinstance(x, int | str)``, a module-level
``X | None`` alias, ``zip(strict=)``, ``dataclass(slots=)``, 3.10+ names from the standard
library). scripts/py39.sh runs the tests under Debian 11's python3.9 itself; this file finds the
same mistakes in a second, under any Python.

The README installs the CLI the way a fresh Debian 12 allows (PEP 668: no ``pip install`` into
the system's Python): pipx, or a venv of its own; never ``pip install gpuprov`` (it is on no
index).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
FLOOR = (3, 9)
NEWEST = (3, 13)
SHIPPED = ("gpuprov", "plugins")

# Standard-library names newer than the floor: (module, name) -> the version that added it.
NEWER_NAMES = {
    ("typing", "TypeAlias"): "3.10",
    ("typing", "ParamSpec"): "3.10",
    ("typing", "Concatenate"): "3.10",
    ("typing", "TypeGuard"): "3.10",
    ("typing", "is_typeddict"): "3.10",
    ("typing", "Self"): "3.11",
    ("typing", "Never"): "3.11",
    ("typing", "LiteralString"): "3.11",
    ("typing", "assert_never"): "3.11",
    ("typing", "assert_type"): "3.11",
    ("typing", "reveal_type"): "3.11",
    ("typing", "Required"): "3.11",
    ("typing", "NotRequired"): "3.11",
    ("typing", "Unpack"): "3.11",
    ("typing", "TypeVarTuple"): "3.11",
    ("typing", "dataclass_transform"): "3.11",
    ("typing", "override"): "3.12",
    ("itertools", "pairwise"): "3.10",
    ("itertools", "batched"): "3.12",
    ("datetime", "UTC"): "3.11",
    ("enum", "StrEnum"): "3.11",
    ("enum", "verify"): "3.11",
    ("contextlib", "chdir"): "3.11",
    ("contextlib", "aclosing"): "3.10",
    ("hashlib", "file_digest"): "3.11",
    ("inspect", "get_annotations"): "3.10",
    ("sys", "stdlib_module_names"): "3.10",
    ("sys", "orig_argv"): "3.10",
    ("sys", "exception"): "3.11",
    ("dataclasses", "KW_ONLY"): "3.10",
}
NEWER_MODULES = {"tomllib": "3.11", "wsgiref.types": "3.11"}
NEWER_BUILTINS = {"aiter": "3.10", "anext": "3.10", "ExceptionGroup": "3.11", "BaseExceptionGroup": "3.11"}
NEWER_METHODS = {"bit_count": "3.10", "add_note": "3.11"}
NEWER_KEYWORDS = {  # callee name -> keyword -> version
    "zip": {"strict": "3.10"},
    "dataclass": {"slots": "3.10", "kw_only": "3.10", "match_args": "3.10"},
    "field": {"kw_only": "3.10"},
}
BUILTIN_TYPES = {"int", "str", "bytes", "bool", "float", "complex", "list", "dict", "tuple", "set", "frozenset", "type"}

# 3.10+ constructs in files their owners are changing now: (file, kind). An entry that no longer
# matches fails the test too, so the list only shrinks: remove the entry with the fix.
PENDING: set[tuple[str, str]] = set()


def python_files() -> list[Path]:
    return sorted(p for top in SHIPPED for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts)


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation (never evaluated: each file has PEP 563's import)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        roots: list[ast.AST | None] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            roots += [a.annotation for a in every if a is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
        for root in roots:
            if root is not None:
                inside.update(id(n) for n in ast.walk(root))
    return inside


def _is_type(node: ast.AST) -> bool:
    """A type written as an expression: None, a builtin type, a class name, a generic alias."""
    if isinstance(node, ast.Constant):
        return node.value is None
    if isinstance(node, ast.Name):
        return node.id in BUILTIN_TYPES or (node.id[:1].isupper() and not node.id.isupper())
    if isinstance(node, ast.Attribute):
        return node.attr[:1].isupper() and not node.attr.isupper()
    if isinstance(node, ast.Subscript):
        return _is_type(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _is_type(node.left) and _is_type(node.right)
    return False


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def newer_constructs(path: Path) -> list[tuple[int, str, str]]:
    """(line, kind, message) for each construct of ``path`` that needs a Python newer than the floor."""
    source = path.read_text(encoding="utf-8")
    try:
        ast.parse(source, str(path), feature_version=FLOOR)
    except SyntaxError as exc:
        return [(exc.lineno or 0, "syntax", f"syntax newer than {FLOOR[0]}.{FLOOR[1]}: {exc.msg}")]
    tree = ast.parse(source, str(path))
    annotations = _annotation_nodes(tree)
    found: list[tuple[int, str, str]] = []
    if "|" in source and "from __future__ import annotations" not in source:
        found.append((1, "future", "no `from __future__ import annotations`: an `X | Y` annotation fails on 3.9"))
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if id(node) in annotations:
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) and _is_type(node):
            found.append(
                (line, "X | Y", f"`{ast.unparse(node)}` evaluated (3.10): Optional[...], Union[...] or a tuple")
            )
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                version = NEWER_KEYWORDS.get(_callee(node), {}).get(keyword.arg or "")
                if version:
                    found.append(
                        (line, f"{_callee(node)}({keyword.arg}=)", f"{_callee(node)}({keyword.arg}=) ({version})")
                    )
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                version = NEWER_NAMES.get((node.module or "", alias.name)) or NEWER_MODULES.get(node.module or "")
                if version:
                    what = f"{node.module}.{alias.name}"
                    found.append((line, what, f"from {node.module} import {alias.name} ({version})"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in NEWER_MODULES:
                    found.append((line, alias.name, f"import {alias.name} ({NEWER_MODULES[alias.name]})"))
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in NEWER_NAMES:
                what = f"{node.value.id}.{node.attr}"
                found.append((line, what, f"{what} ({NEWER_NAMES[node.value.id, node.attr]})"))
            elif node.attr in NEWER_METHODS:
                found.append((line, f".{node.attr}()", f".{node.attr}() ({NEWER_METHODS[node.attr]})"))
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS and isinstance(node.ctx, ast.Load):
            found.append((line, node.id, f"{node.id} ({NEWER_BUILTINS[node.id]})"))
    return found


def test_the_package_and_the_modules_run_on_the_oldest_python_claimed() -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        for line, kind, message in newer_constructs(path):
            found.setdefault((rel, kind), []).append(f"{rel}:{line}: {message}")
    new = [hit for key, hits in sorted(found.items()) if key not in PENDING for hit in hits]
    assert not new, "needs a Python newer than 3.9, which gpuprov claims (pyproject.toml):\n" + "\n".join(new)
    fixed = sorted(PENDING - set(found))
    assert not fixed, f"fixed: remove from PENDING in {Path(__file__).relative_to(REPO)}: {fixed}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from __future__ import annotations\nok = isinstance(1, int | bool)\n", "`int | bool` evaluated"),
        ("from __future__ import annotations\nEntry = tuple[int, bytes | None]\n", "`bytes | None` evaluated"),
        ("list(zip([], [], strict=True))\n", "zip(strict=)"),
        ("match x:\n    case 1:\n        pass\n", "syntax newer"),
        ("from itertools import pairwise\n", "pairwise (3.10)"),
        ("import tomllib\n", "import tomllib"),
        ("import sys\nsys.stdlib_module_names\n", "sys.stdlib_module_names"),
        ("x = (5).bit_count()\n", ".bit_count()"),
        ("def f(x: int | None) -> str | None: ...\n", "no `from __future__ import annotations`"),
    ],
)
def test_the_check_sees_each_kind_of_construct(tmp_path: Path, source: str, expected: str) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert any(expected in message for _, _, message in newer_constructs(path)), newer_constructs(path)


def test_the_check_lets_pass_what_3_9_runs(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "from __future__ import annotations\n"
        "import os\nfrom typing import Optional\n"
        "FLAGS = os.O_RDONLY | os.O_CLOEXEC\n"
        "Entry = tuple[int, Optional[bytes]]\n"
        "def f(x: int | None, *ys: list[str] | None) -> dict[str, int | None]:\n"
        "    y: str | None = None\n"
        "    return {k: v for k, v in zip('ab', (1, None))} if isinstance(x, (int, bool)) else {}\n"
    )
    assert newer_constructs(path) == []


def _pyproject() -> dict:
    with (REPO / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def test_pyproject_claims_the_same_pythons_everywhere() -> None:
    config = _pyproject()
    project = config["project"]
    floor = f"{FLOOR[0]}.{FLOOR[1]}"
    assert project["requires-python"] == f">={floor}"
    assert config["tool"]["ruff"]["target-version"] == f"py{FLOOR[0]}{FLOOR[1]}"
    versions = [
        c.rsplit(" :: ", 1)[1]
        for c in project.get("classifiers", [])
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert versions == [f"3.{minor}" for minor in range(FLOOR[1], NEWEST[1] + 1)], versions


def _py39_deselected() -> list[str]:
    script = (REPO / "scripts" / "py39.sh").read_text(encoding="utf-8")
    block = script.split("\nDESELECT=(\n", 1)[1].split("\n)\n", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_oldest_python_is_the_one_scripts_py39_runs() -> None:
    script = (REPO / "scripts" / "py39.sh").read_text(encoding="utf-8")
    assert "\nSUITE=bullseye\n" in script  # Debian 11, whose python3 is 3.9
    assert FLOOR == (3, 9)


def test_every_test_scripts_py39_leaves_out_is_there() -> None:
    """A deselected test that was renamed or moved would silently run again, or its name linger."""
    missing = []
    for nodeid in _py39_deselected():
        path, _, name = nodeid.partition("::")
        file = REPO / path
        if not file.is_file():
            missing.append(nodeid)
        elif name and name not in {
            n.name for n in ast.parse(file.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)
        }:
            missing.append(nodeid)
    assert not missing, f"scripts/py39.sh DESELECT names tests that are not there: {missing}"


# ---------------------------------------------------------------- the README's install

INSTALL_DOCS = ["README.md", "docs/development/tests.md"]


def install_commands() -> list[str]:
    """The commands (``$ ...``) of the README's console blocks under "## Install"."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```console\n(.*?)^```", section, re.M | re.S)
    commands = [line[2:].split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [c for c in commands if c]


def test_the_readme_installs_the_cli_where_pep_668_allows() -> None:
    commands = install_commands()
    assert any(c.startswith("sudo apt-get install -y pipx") for c in commands), commands  # Debian 12, Ubuntu 22.04
    assert "pipx install ." in commands, commands
    venvs: set[str] = set()
    for command in commands:
        for part in (p.strip() for p in command.split("&&")):
            made = re.fullmatch(r"python3 -m venv (\S+)", part)
            if made:
                venvs.add(made.group(1))
            if re.search(r"\bpip3? install\b", part) and not part.startswith("pipx "):
                # Only the pip of a venv made just before: the system's refuses (externally managed).
                pip = part.split()[0]
                assert any(pip == f"{v}/bin/pip" for v in venvs), f"`{part}`: pip outside a venv fails on Debian 12"


@pytest.mark.parametrize("doc", INSTALL_DOCS)
def test_no_install_from_an_index_gpuprov_is_not_on(doc: str) -> None:
    """No command in a code block installs ``gpuprov`` by name, bar from a directory of wheels."""
    text = (REPO / doc).read_text(encoding="utf-8")
    blocks = "\n".join(re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S))
    wrong = [
        line.strip()
        for line in blocks.splitlines()
        if re.search(r"\bpip3? install\b.*\bgpuprov\b(?!\[)", line) and "--no-index" not in line
    ]
    assert not wrong, f"{doc}: gpuprov is on no package index; install it from the checkout or a wheel: {wrong}"
