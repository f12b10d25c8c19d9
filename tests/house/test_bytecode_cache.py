"""gpuprov.bytecode_cache: a package imported from a zip compiles each module once, and the cache
is used only when it can be trusted and matches the source (docs/development/bytecode-cache.md).

Each import runs in a fresh interpreter (a new sys.modules), as each Ansible module run does."""

from __future__ import annotations

import json
import marshal
import os
import subprocess
import sys
import zipfile
from importlib.util import MAGIC_NUMBER
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The package in the zip turns the cache on as gpuprov/__init__.py does, into the test's directory.
INIT = """
import os
from gpuprov.bytecode_cache import install
CACHING = install(__name__, globals().get("__loader__"), os.environ["CACHE_DIR"])
"""
SOURCES = {
    "pkgx/__init__.py": INIT,
    "pkgx/a.py": "VALUE = 'a1'\ndef where():\n    return where.__code__.co_filename\n",
    "pkgx/sub/__init__.py": "from .b import VALUE\n",
    "pkgx/sub/b.py": "VALUE = 'b1'\n",
}
# What the child prints: each module's value, file and loader, and whether the cache is on.
PROBE = """
import json, sys
import pkgx, pkgx.a, pkgx.sub
print(json.dumps({"caching": pkgx.CACHING, "a": pkgx.a.VALUE, "b": pkgx.sub.VALUE,
    "a_file": pkgx.a.__file__, "a_code_file": pkgx.a.where(), "sub_path": list(pkgx.sub.__path__),
    "loader": type(pkgx.a.__loader__).__name__}))
"""


def make_zip(path: Path, sources: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in sources.items():
            z.writestr(name, text)
    return path


def probe(archive: Path, cache: Path) -> dict:
    env = {**os.environ, "CACHE_DIR": str(cache), "PYTHONPATH": f"{archive}{os.pathsep}{REPO}"}
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def entry(cache: Path, module: str) -> Path:
    return cache / f"{module}.{MAGIC_NUMBER.hex()}.pyc"


def planted(header_from: Path, value: str) -> bytes:
    """An entry with the header of ``header_from`` (its source's) and code that sets VALUE to ``value``."""
    header = header_from.read_bytes()[: len(MAGIC_NUMBER) + 32]
    return header + marshal.dumps(compile(f"VALUE = {value!r}\ndef where():\n    return ''\n", "a.py", "exec"))


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return make_zip(tmp_path / "payload.zip", SOURCES)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "bytecode"


def test_each_module_is_compiled_into_the_cache_on_the_first_import(archive: Path, cache: Path) -> None:
    got = probe(archive, cache)
    assert got["caching"] is True
    assert (got["a"], got["b"]) == ("a1", "b1")
    assert got["loader"] == "Loader"
    assert got["a_file"] == f"{archive}/pkgx/a.py"
    assert got["sub_path"] == [f"{archive}/pkgx/sub"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        entry(cache, m).name for m in ("pkgx.a", "pkgx.sub", "pkgx.sub.b")
    )
    assert oct(cache.stat().st_mode & 0o777) == "0o700"


def test_a_later_run_loads_the_cached_code(archive: Path, cache: Path) -> None:
    probe(archive, cache)
    # Cached code that differs from the source, under the source's own header: a run that
    # prints it read the cache instead of compiling.
    path = entry(cache, "pkgx.a")
    path.write_bytes(planted(path, "cached"))
    assert probe(archive, cache)["a"] == "cached"


def test_cached_code_names_the_file_it_is_imported_from_now(tmp_path: Path, archive: Path, cache: Path) -> None:
    probe(archive, cache)
    moved = make_zip(tmp_path / "other.zip", SOURCES)
    got = probe(moved, cache)
    assert got["a_code_file"] == f"{moved}/pkgx/a.py"  # tracebacks name this run's payload


def test_a_changed_source_is_compiled_again_and_replaces_its_entry(tmp_path: Path, archive: Path, cache: Path) -> None:
    probe(archive, cache)
    before = entry(cache, "pkgx.a").read_bytes()
    changed = make_zip(tmp_path / "new.zip", {**SOURCES, "pkgx/a.py": "VALUE = 'a2'\ndef where():\n    return ''\n"})
    assert probe(changed, cache)["a"] == "a2"
    assert entry(cache, "pkgx.a").read_bytes() != before
    assert probe(archive, cache)["a"] == "a1"  # and back: never the other source's code


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "other_python"])
def test_a_damaged_entry_is_compiled_again(archive: Path, cache: Path, damage: str) -> None:
    probe(archive, cache)
    path = entry(cache, "pkgx.a")
    data = path.read_bytes()
    header = len(MAGIC_NUMBER) + 32
    path.write_bytes(
        {
            "truncated": data[: header + 5],
            "garbage": data[:header] + b"\xff" * 64,
            "empty": b"",
            "other_python": b"\x00\x00\r\n" + data[4:],
        }[damage]
    )
    assert probe(archive, cache)["a"] == "a1"


def test_an_entry_that_is_a_link_is_not_followed(tmp_path: Path, archive: Path, cache: Path) -> None:
    probe(archive, cache)
    path = entry(cache, "pkgx.a")
    decoy = tmp_path / "decoy.pyc"
    decoy.write_bytes(planted(path, "linked"))
    path.unlink()
    path.symlink_to(decoy)
    assert probe(archive, cache)["a"] == "a1"


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_directory_others_can_write_turns_the_cache_off(archive: Path, cache: Path, mode: int) -> None:
    cache.mkdir(parents=True)
    cache.chmod(mode)
    got = probe(archive, cache)
    assert got["caching"] is False
    assert (got["a"], got["b"]) == ("a1", "b1")
    assert list(cache.iterdir()) == []


def test_an_entry_others_can_write_is_not_read(archive: Path, cache: Path) -> None:
    probe(archive, cache)
    path = entry(cache, "pkgx.a")
    path.write_bytes(planted(path, "planted"))
    path.chmod(0o666)
    assert probe(archive, cache)["a"] == "a1"


def test_a_directory_behind_a_link_turns_the_cache_off(tmp_path: Path, archive: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    assert probe(archive, link / "bytecode")["caching"] is False


def test_a_package_imported_from_files_is_left_alone(tmp_path: Path, cache: Path) -> None:
    for name, text in SOURCES.items():
        (tmp_path / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / name).write_text(text)
    got = probe(tmp_path / "src", cache)
    assert got["caching"] is False
    assert got["loader"] == "SourceFileLoader"
    assert not cache.exists()
