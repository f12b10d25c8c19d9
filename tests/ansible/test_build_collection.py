"""dev/tools/build_collection.py: what goes into plugins/module_utils, what it refuses, and
that an unchanged checkout is not assembled again."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import build_collection_tool

tool = build_collection_tool()


def test_module_utils_are_the_modules_import_closure_without_the_command_line() -> None:
    files = {p.relative_to(tool.REPO / "gpuprov").as_posix() for p in tool.module_utils_closure()}
    # imported by the modules directly, by their adapters (gpuprov/modules/), and the packages on the way
    assert {
        "__init__.py",
        "facts/__init__.py",
        "facts/sysfs.py",
        "report/inspect.py",
        "modules/common.py",
        "plan/vgpu/__init__.py",
        "apply/vgpu.py",
    } <= files
    assert not any(f.split("/")[0].removesuffix(".py") in tool.CLI_ONLY for f in files)


def fake_repo(tmp_path: Path, package: dict[str, str], module: str) -> Path:
    for name, text in package.items():
        (tmp_path / "gpuprov" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "gpuprov" / name).write_text(text)
    (tmp_path / "plugins" / "modules").mkdir(parents=True)
    (tmp_path / "plugins" / "modules" / "m.py").write_text(module)
    return tmp_path


IMPORT = f"from {tool.UTILS_PACKAGE}.facts import gather\n"


@pytest.mark.parametrize(
    ("package", "message"),
    [
        (
            {"facts.py": "from .cli import main\n", "cli.py": ""},
            "imports gpuprov.cli (command line only) at module level",
        ),
        ({"facts.py": "import yaml\n"}, "imports yaml at module level"),
        ({"facts.py": "from rich.table import Table\n"}, "imports rich.table at module level"),
        ({"facts.py": "from .nothere import x\n"}, "no module gpuprov.nothere"),
    ],
)
def test_what_a_target_cannot_import_is_refused(tmp_path: Path, monkeypatch, package, message) -> None:
    monkeypatch.setattr(tool, "REPO", fake_repo(tmp_path, {"__init__.py": "", **package}, IMPORT))
    with pytest.raises(tool.BuildError) as refused:
        tool.module_utils_closure()
    assert message in str(refused.value)


def test_lazy_imports_of_the_command_line_and_of_optional_libraries_are_fine(tmp_path: Path, monkeypatch) -> None:
    package = {
        "__init__.py": '__version__ = "1"\n',
        "facts.py": "from . import __version__\n\n\ndef f():\n    from .cli import main\n    import pynvml\n"
        "    from .plan import x\n",
        "plan.py": "x = 1\n",
        "cli.py": "import rich\n",
    }
    monkeypatch.setattr(tool, "REPO", fake_repo(tmp_path, package, IMPORT))
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tool.module_utils_closure())
    assert files == ["gpuprov/__init__.py", "gpuprov/facts.py", "gpuprov/plan.py"]


def test_a_symlink_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tool, "REPO", fake_repo(tmp_path, {"__init__.py": "", "facts.py": ""}, IMPORT))
    (tmp_path / "plugins" / "modules" / "link.py").symlink_to(tmp_path / "plugins" / "modules" / "m.py")
    with pytest.raises(tool.BuildError, match="is a symlink"):
        tool.module_utils_closure()


def test_an_unchanged_checkout_is_not_assembled_again() -> None:
    tool.assemble()
    stamp = tool.STAMP.stat().st_mtime_ns
    assert tool.assemble() is False and tool.STAMP.stat().st_mtime_ns == stamp
    assert (tool.TREE / "galaxy.yml").read_text().endswith(f"\nversion: {tool.version()}\n")


def test_the_build_script_needs_ansible_core_only(tmp_path: Path) -> None:
    """scripts/build-collection.sh in a copy of the checkout (its files as git lists them; no .venv),
    with only python3 and ansible-galaxy (ansible-core's) on PATH: it builds the tarball, asking
    for no apt package and no gpuprov install (scripts/bootstrap.sh is left out of the copy)."""
    copy = tmp_path / "checkout"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=tool.REPO,
        capture_output=True,
        check=True,
    )
    for name in listed.stdout.decode().split("\0"):
        source = tool.REPO / name
        if name and name != "scripts/bootstrap.sh" and source.is_file() and not source.is_symlink():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("python3", "ansible-galaxy"):
        (tools / name).symlink_to(Path(sys.executable).with_name(name))
    env = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path), "GPUPROV_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [str(copy / "scripts/build-collection.sh"), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == str(copy / "build" / f"gpuprov-kvm-{tool.version()}.tar.gz")
    assert not (tmp_path / "cache").exists() and not (copy / ".venv").exists()


def docs_repo(tmp_path: Path, pages: dict[str, str]) -> dict[str, Path]:
    """A repository with ``pages`` (path -> text), collection/galaxy.yml naming its repository and a
    LICENSE; the copies carried_docs starts from (the README, the LICENSE)."""
    for name, text in {
        "collection/galaxy.yml": "namespace: gpuprov\nrepository: https://example.org/gpuprov/\n",
        "LICENSE": "",
        **pages,
    }.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return {"README.md": tmp_path / "collection/README.md", "LICENSE": tmp_path / "LICENSE"}


def test_the_docs_are_the_readmes_links_followed(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(tool, "REPO", tmp_path)
    copies = docs_repo(
        tmp_path,
        {
            "collection/README.md": "[a](docs/a.md#top) [web](https://x.org) [in](#here) `[code](docs/no.md)` "
            "[license](LICENSE)\n",
            "docs/a.md": "[b](sub/b.md), ![pic](pic.png)\n\n```\n[fenced](nothere.md)\n```\n[ref]: sub/b.md\n",
            "docs/sub/b.md": "[a](../a.md) [schema](../../gpuprov/s.json#x) [fixture](../../tests/f.md)\n",
            "docs/pic.png": "png",
            "docs/unlinked.md": "not carried",
            "gpuprov/s.json": "{}",
            "tests/f.md": "",
        },
    )
    docs = tool.carried_docs(copies)
    assert sorted(docs) == ["docs/a.md", "docs/pic.png", "docs/sub/b.md"]
    assert docs["docs/a.md"] == (tmp_path / "docs/a.md").read_bytes()  # every link carried: as it is
    assert docs["docs/sub/b.md"].decode() == (
        "[a](../a.md) [schema](https://example.org/gpuprov/blob/main/gpuprov/s.json#x) "
        "[fixture](https://example.org/gpuprov/blob/main/tests/f.md)\n"
    )


@pytest.mark.parametrize(
    ("pages", "message"),
    [
        ({"collection/README.md": "[a](docs/a.md)\n", "docs/a.md": "[up](../../x.md)\n"}, "leaves the repository"),
        ({"collection/README.md": "[a](docs/a.md)\n", "docs/a.md": "[gone](gone.md)\n"}, "no docs/gone.md"),
        ({"collection/README.md": "[src](gpuprov/x.py)\n", "gpuprov/x.py": ""}, "link a page of docs/"),
    ],
)
def test_a_link_that_cannot_resolve_is_refused(tmp_path: Path, monkeypatch, pages, message) -> None:
    monkeypatch.setattr(tool, "REPO", tmp_path)
    with pytest.raises(tool.BuildError, match=message):
        tool.carried_docs(docs_repo(tmp_path, pages))


def test_the_sanity_ignores_name_every_plugin_for_each_admitted_release() -> None:
    copies = tool.plan_copies()
    ignores = tool.sanity_ignores(copies)
    assert sorted(ignores) == ["tests/sanity/ignore-2.18.txt", "tests/sanity/ignore-2.19.txt"]
    plugins = sorted(
        f"plugins/{kind}/{p.name}"
        for kind in ("modules", "lookup", "callback")
        for p in (tool.REPO / "plugins" / kind).glob("*.py")
    )
    for text in ignores.values():
        lines = text.decode().splitlines()
        assert sorted(line.split()[0] for line in lines) == plugins
        assert {line.split()[1] for line in lines} == {"validate-modules:missing-gplv3-license"}
