"""One version: gpuprov/__init__.py's ``__version__`` is the collection's (the build writes it
into galaxy.yml), and no module, plugin, role or option says it came in a later one
(``version_added``, which antsibull-changelog reads to list what a release brings)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import gpuprov
from tests.conftest import build_collection_tool

REPO = Path(__file__).resolve().parents[2]
PLUGINS = sorted([*(REPO / "plugins" / "modules").glob("*.py"), *(REPO / "plugins" / "lookup").glob("*.py")])
ROLE_SPECS = sorted((REPO / "roles").glob("*/meta/argument_specs.yml"))


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(version).split("."))


def added(doc: dict[str, Any], where: str) -> Iterator[tuple[str, str]]:
    """(where, version_added) of ``doc`` and of each of its options, suboptions included."""
    if "version_added" in doc:
        yield where, str(doc["version_added"])
    for name, option in (doc.get("options") or {}).items():
        yield from added(option, f"{where} option {name}")
    for name, option in (doc.get("suboptions") or {}).items():
        yield from added(option, f"{where}.{name}")


def documentation(path: Path) -> dict[str, Any]:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            return yaml.safe_load(ast.literal_eval(node.value))
    raise AssertionError(f"{path}: no DOCUMENTATION")


def test_the_collection_has_the_one_version() -> None:
    tool = build_collection_tool()
    assert tool.version() == gpuprov.__version__
    assert tool.galaxy_yml().endswith(f"\nversion: {gpuprov.__version__}\n")


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_plugin_was_added_after_the_collection_version(path: Path) -> None:
    doc = documentation(path)
    assert "version_added" in doc, f"{path.relative_to(REPO)}: no version_added (the release that brought it)"
    later = [(w, v) for w, v in added(doc, path.stem) if version_key(v) > version_key(gpuprov.__version__)]
    assert not later, f"version_added later than the collection's {gpuprov.__version__}: {later}"


@pytest.mark.parametrize("path", ROLE_SPECS, ids=lambda p: p.parts[-3])
def test_no_role_was_added_after_the_collection_version(path: Path) -> None:
    specs = yaml.safe_load(path.read_text())["argument_specs"]
    found = [x for entry, spec in specs.items() for x in added(spec, f"{path.parts[-3]} entry point {entry}")]
    later = [(w, v) for w, v in found if version_key(v) > version_key(gpuprov.__version__)]
    assert not later, f"version_added later than the collection's {gpuprov.__version__}: {later}"
