"""Shared fixtures: captured host roots unpacked into temp dirs, fake hosts."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from gpuprov.cli import rootfs
from tests.fakehost import FakeHost

# Property-based tests run on a fixed, reproducible budget: the same examples on every run
# (derandomize), no per-example deadline (a loaded 2-core CI machine), and a bounded count so
# they add a known time to CI. GPUPROV_HYPOTHESIS_EXAMPLES raises it for a longer local hunt.
settings.register_profile(
    "gpuprov",
    max_examples=int(os.environ.get("GPUPROV_HYPOTHESIS_EXAMPLES", "60")),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("gpuprov")

# CI fails on a skip that the test command could have avoided (its allowlist is there).
pytest_plugins = ["tests.skip_policy"]

HOSTS = Path(__file__).parent / "fixtures" / "hosts"
REPO = Path(__file__).resolve().parents[1]


def captured_hosts() -> list[str]:
    """Names of every captured host tarball kept under tests/fixtures/hosts."""
    return sorted(p.name[: -len(".tar.gz")] for p in HOSTS.glob("*.tar.gz"))


@pytest.fixture(scope="session")
def host_root(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``host_root("h100-passthrough-guest")`` -> the unpacked capture (once per session)."""
    cache: dict[str, Path] = {}

    def unpack(name: str) -> Path:
        if name not in cache:
            dest = tmp_path_factory.mktemp(name)
            rootfs.unpack(str(HOSTS / f"{name}.tar.gz"), str(dest))  # the CLI's own safe reader
            cache[name] = dest
        return cache[name]

    return unpack


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path / "root")


def tree_digest(root: Path) -> str:
    """A hash of every path, link target and file content below ``root``."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            h.update(str(path.relative_to(root)).encode())
            if path.is_symlink():
                h.update(os.readlink(path).encode())
            elif path.is_file():
                h.update(path.read_bytes())
    return h.hexdigest()


def build_collection_tool():
    """dev/tools/build_collection.py as a module (dev/tools/ is no package)."""
    spec = importlib.util.spec_from_file_location("build_collection", REPO / "dev" / "tools" / "build_collection.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def collections_path() -> Path:
    """The checkout's collection gpuprov.kvm, assembled once per test run where ansible.cfg's
    collections_path expects it; every test that runs ansible calls this first."""
    tool = build_collection_tool()
    tool.assemble()
    return tool.COLLECTIONS
