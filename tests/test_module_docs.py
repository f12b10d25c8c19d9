"""Every module's DOCUMENTATION, EXAMPLES and RETURN parse, and the documented
options are exactly the argument spec's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
# Every module lives in library/ (ansible.cfg's library path), none in a role's own library/.
MODULE_FILES = {p.stem: p for p in REPO.glob("library/*.py")}
MODULES = sorted(MODULE_FILES)


def module_parts(name: str) -> tuple[dict[str, str], set[str]]:
    tree = ast.parse(MODULE_FILES[name].read_text())
    docs: dict[str, str] = {}
    spec: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    docs[target.id] = node.value.value
        if isinstance(node, ast.keyword) and node.arg == "argument_spec" and isinstance(node.value, ast.Dict):
            spec = {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    return docs, spec


def test_there_are_modules() -> None:
    assert MODULES == [
        "apt_components",
        "apt_keyring",
        "gpu_host_facts",
        "gpu_verify",
        "gpu_vgpu",
        "gpu_vm",
        "kernel_cmdline",
        "vfio_bind",
    ]
    assert not list(REPO.glob("roles/*/library")), "modules go in library/, one place for all"


@pytest.mark.parametrize("name", MODULES)
def test_module_documentation_is_complete(name: str) -> None:
    docs, spec = module_parts(name)
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    doc = yaml.safe_load(docs["DOCUMENTATION"])
    assert doc["module"] == name and doc["short_description"] and doc["description"] and doc["author"]
    assert set(doc["options"]) == spec
    for option, body in doc["options"].items():
        assert body.get("description") and body.get("type"), f"{name}: option {option} lacks description or type"
    examples = yaml.safe_load(docs["EXAMPLES"])
    assert examples and all(
        any(k in task for k in (name, f"gpuprov.{name}"))
        or "ansible.builtin.assert" in task
        or "ansible.builtin.debug" in task
        for task in examples
    )
    returns = yaml.safe_load(docs["RETURN"])
    assert returns and all(v.get("description") and v.get("returned") and v.get("type") for v in returns.values())
