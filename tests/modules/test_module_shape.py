"""Every Ansible module of plugins/modules has one shape (issue #27): its documentation, then a
short ``main()`` that hands everything else to its adapter, ``gpuprov/modules/NAME.py``:

    module = AnsibleModule(argument_spec=NAME.ARGUMENT_SPEC, supports_check_mode=True[, **NAME.RULES])
    (the options checked, read and planned by the adapter)
    finish(...) (gpuprov.modules.common's, or the adapter's)

Measured from the source (ast), so a module cannot grow logic back unseen:

- at its top only the docstring, ``from __future__``, DOCUMENTATION/EXAMPLES/RETURN, imports,
  ``def main()`` and the ``__main__`` guard;
- it imports Ansible's ``module_utils.basic`` (and ``.urls``: fetch_url is Ansible's, passed to the
  adapter) and gpuprov only through ``gpuprov.modules`` (its adapter, ``common``): no os, subprocess,
  shutil or tempfile, no facts, plan or apply of its own;
- ``main()`` holds at most :data:`MAX_MAIN` statements, none a loop, ``try``, ``with`` or definition;
- the argument spec given to AnsibleModule is the adapter's ``ARGUMENT_SPEC`` (gpu_host_plan checks
  the role's options against the same one), its rules the adapter's ``RULES``;
- nothing in it writes (dev/tools/house.py's detector: the house's one rule for writers).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from dev.tools.house import writes

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "plugins" / "modules"
ADAPTERS = REPO / "gpuprov" / "modules"
MODULES = sorted(p.stem for p in PLUGINS.glob("*.py"))
DOCS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}
ANSIBLE = {"ansible.module_utils.basic", "ansible.module_utils.urls"}
GPUPROV_MODULES = "ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.modules"
MAX_MAIN = 8  # statements in main(), nested ones counted


def problems(name: str, source: str) -> list[str]:
    """Every way the module ``name`` (its ``source``) breaks the shape; empty when it has it."""
    tree = ast.parse(source)
    found: list[str] = []
    main: ast.FunctionDef | None = None
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in DOCS:
            if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                found.append(f"line {node.lineno}: the documentation is not one string")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found += _import_problems(name, node)
        elif isinstance(node, ast.FunctionDef) and node.name == "main" and main is None:
            main = node
        elif not _is_main_guard(node):
            found.append(f"line {node.lineno}: {type(node).__name__} at the top: only docs, imports and main()")
    if main is None:
        return [*found, "no main()"]
    body = [n for stmt in main.body for n in ast.walk(stmt) if isinstance(n, ast.stmt)]
    if len(body) > MAX_MAIN:
        found.append(f"main() has {len(body)} statements, more than {MAX_MAIN}: move the logic to its adapter")
    for node in body:
        if isinstance(
            node, (ast.For, ast.While, ast.Try, ast.With, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)
        ):
            found.append(f"line {node.lineno}: a {type(node).__name__} in main(): that is the adapter's")
    found += _spec_problems(name, main)
    if not any(
        isinstance(n, ast.ImportFrom) and n.module == GPUPROV_MODULES and name in [a.name for a in n.names]
        for n in tree.body
    ):
        found.append(f"it does not import its adapter ({GPUPROV_MODULES} import {name})")
    return found


def _import_problems(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [f"line {node.lineno}: import {', '.join(a.name for a in node.names)}: only Ansible's and the adapter"]
    module = node.module or ""
    if module == "__future__" or module in ANSIBLE:
        return []
    if module == GPUPROV_MODULES or module.startswith(GPUPROV_MODULES + "."):
        return []
    return [f"line {node.lineno}: from {module} import ...: gpuprov only through {GPUPROV_MODULES}"]


def _is_main_guard(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and ast.unparse(node.test) == "__name__ == '__main__'"
        and [ast.unparse(s) for s in node.body] == ["main()"]
        and not node.orelse
    )


def _spec_problems(name: str, main: ast.FunctionDef) -> list[str]:
    """The first statement builds AnsibleModule from the adapter's ARGUMENT_SPEC (and RULES)."""
    first = main.body[0] if main.body else None
    call = first.value if isinstance(first, ast.Assign) else None
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "AnsibleModule"):
        return ["main() does not begin with module = AnsibleModule(...)"]
    keywords = {k.arg: ast.unparse(k.value) for k in call.keywords}
    out = []
    if call.args or keywords.get("argument_spec") != f"{name}.ARGUMENT_SPEC":
        out.append(f"AnsibleModule's argument_spec is not {name}.ARGUMENT_SPEC (the adapter's)")
    if keywords.get("supports_check_mode") != "True":
        out.append("AnsibleModule without supports_check_mode=True")
    extra = {k: v for k, v in keywords.items() if k not in ("argument_spec", "supports_check_mode")}
    if extra not in ({}, {None: f"{name}.RULES"}):
        out.append(f"AnsibleModule takes {sorted(map(str, extra))} besides the spec: only **{name}.RULES")
    return out


@pytest.mark.parametrize("name", MODULES)
def test_module_is_documentation_and_a_short_main_over_its_adapter(name: str) -> None:
    assert (ADAPTERS / f"{name}.py").is_file(), f"no adapter gpuprov/modules/{name}.py"
    found = problems(name, (PLUGINS / f"{name}.py").read_text())
    assert not found, f"plugins/modules/{name}.py:\n" + "\n".join(found)


@pytest.mark.parametrize("name", MODULES)
def test_no_module_writes(name: str) -> None:
    """No plugin writes a file or runs a command itself: gpuprov.apply does (through its adapter)."""
    assert not writes(PLUGINS / f"{name}.py")


def test_the_shape_check_sees_what_it_looks_for() -> None:
    """The detector itself: a thin module passes; logic, a stray import, an inline spec are found."""
    thin = (
        '"""doc"""\nfrom __future__ import annotations\nDOCUMENTATION = r"""x"""\n'
        "from ansible.module_utils.basic import AnsibleModule\n"
        f"from {GPUPROV_MODULES} import demo\n"
        f"from {GPUPROV_MODULES}.common import finish\n"
        "def main() -> None:\n"
        "    module = AnsibleModule(argument_spec=demo.ARGUMENT_SPEC, supports_check_mode=True, **demo.RULES)\n"
        "    plan, extra = demo.plan(module.params)\n"
        "    finish(module, plan, module.params['root'], **extra)\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    assert problems("demo", thin) == []
    fat = thin.replace("import annotations\n", "import annotations\nimport subprocess\n").replace(
        "argument_spec=demo.ARGUMENT_SPEC", "argument_spec={'root': {}}"
    )
    fat = fat.replace("    plan, extra", "    for x in []:\n        subprocess.run(x)\n    plan, extra")
    fat = fat.replace(
        f"from {GPUPROV_MODULES}.common",
        "from ansible_collections.gpuprov.kvm.plugins.module_utils.gpuprov.apply.actions",
    )
    found = "\n".join(problems("demo", fat))
    for words in ("import subprocess", "argument_spec is not demo.ARGUMENT_SPEC", "a For in main()", "apply.actions"):
        assert words in found, found
    assert len(problems("demo", thin.replace("    plan, extra", "    x = 1\n" * 9 + "    plan, extra"))) == 1
