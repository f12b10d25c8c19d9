"""The house's layers (docs/development/layout.md): no module imports a layer above its own, no
import circle between modules, and nothing outside gpuprov/apply/ writes, bar the few writers
named below with the reason each may.

Read from the source (ast), not by importing: a lazy import inside a function counts the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from dev.tools.house import ALLOWED_WRITERS, LAYERS, MODULES, REPO, TOP, imports, layer, writes

GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_belongs_to_a_layer() -> None:
    assert not [m for m in MODULES if layer(m) is None and m not in TOP]


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = []
    for module, targets in GRAPH.items():
        mine = layer(module)
        for target, line in targets:
            theirs = layer(target)
            if mine and theirs and LAYERS.index(theirs) > LAYERS.index(mine):
                upward.append(f"{MODULES[module].relative_to(REPO)}:{line}: {mine} imports {theirs} ({target})")
            if mine and target in TOP - {"gpuprov"}:
                upward.append(f"{MODULES[module].relative_to(REPO)}:{line}: imports the package's top ({target})")
    assert not upward, "\n".join(upward)


def test_no_import_circle() -> None:
    # Tarjan's strongly connected components over module-level and lazy imports alike.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target, _ in GRAPH[node]:
            if target == "gpuprov":  # the package's __init__ (the version, the bytecode cache)
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert not circles, circles


WRITERS = {str(p.relative_to(REPO)): w for p in MODULES.values() if (w := writes(p))}


def test_only_apply_writes() -> None:
    outside = {f: w for f, w in WRITERS.items() if not f.startswith("gpuprov/apply/") and f not in ALLOWED_WRITERS}
    assert not outside, "writes outside gpuprov/apply/ (move them there, or name the reason in ALLOWED_WRITERS):\n" + (
        "\n".join(f"{f}:{w}" for f, ws in outside.items() for w in ws)
    )


@pytest.mark.parametrize("path", sorted(ALLOWED_WRITERS))
def test_each_allowed_writer_still_writes(path: str) -> None:
    assert path in WRITERS, f"{path} no longer writes: take it off ALLOWED_WRITERS"


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The detectors themselves: a write and an upward import are found (a test that cannot fail
    is no test)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os, subprocess\nfrom pathlib import Path\n"
        "def f(p):\n    os.replace('a', 'b')\n    Path(p).write_text('x')\n    subprocess.run(['true'])\n"
        "    open(p, 'w')\n    open(p)\n"
    )
    assert [w.split(": ", 1)[1] for w in writes(sample)] == [
        "os.replace",
        ".write_text()",
        "subprocess.run",
        "open(..., 'w')",
    ]
    assert layer("gpuprov.facts.sysfs") == "facts" and LAYERS.index("plan") > LAYERS.index("facts")
