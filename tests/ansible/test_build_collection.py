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
    # imported by modules directly, by the package lazily (virt -> modsupport), and packages on the way
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
    """scripts/build-collection.sh in a copy of the checkout without .venv, with only python3 and
    ansible-galaxy (ansible-core's) on PATH: it builds the tarball, asking for no apt package
    and no gpuprov install (scripts/bootstrap.sh is not even there)."""
    repo = tool.REPO
    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".molecule")
    for name in ("collection", "docs", "gpuprov", "playbooks", "plugins", "roles"):
        shutil.copytree(repo / name, copy / name, ignore=ignore)
    for name in (
        "README.md",
        "LICENSE",
        "pyproject.toml",
        "dev/tools/build_collection.py",
        "scripts/build-collection.sh",
    ):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, copy / name)
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
