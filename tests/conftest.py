"""Shared fixtures: captured host roots unpacked into temp dirs, fake hosts."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# scripts/test.sh runs the unit tests a second time under Debian 12's own /usr/bin/python3 (the
# README's platform; CI's python3 is pyenv's 3.11.7, Debian's is 3.11.2), all but the `slow` ones
# and these files (marked `interpreter_independent`). What differs between the two builds of CPython
# 3.11 is the standard library's patch level (tarfile's extraction filters came in 3.11.4, with
# fixes to tarfile, zipfile, ipaddress and urllib after it), the C libraries each links (expat for
# XML, libffi for ctypes, zlib/xz), the bytecode and import machinery, and what runs on a target:
# Ansible's module runtime on Debian's python3 with its dist-packages. So the second pass keeps the
# readers (facts: openat2 through ctypes, tar and .deb members, XML), the CLI on capture tarballs
# (cli), verify's parsers and the domain XML (ElementTree over expat), the modules run for real on a
# bare Python made from this one and ansible-core on it (modules, ansible), every in-process module
# test (tests/modrun.py) wherever it lives, the bytecode cache and the lab's own code. It drops what
# is a pure function of its inputs, which no interpreter of the same version answers differently:
# the planners' and verdicts' rules over parsed facts, the input boundary's parsing of raw values
# into typed ones (gpuprov/inputs: re, uuid, base64 and dataclasses over JSON-shaped values, no file
# format, C library or network code; 59 s of the pass's 518 s of tests, 2026-11-29), the kernel
# arguments as shells source them, text parsers of pci.ids and MIG profiles, the bench's arithmetic,
# and the house's checks of docs, layers and the wheel. A file listed here that is not there stops
# the run: keep the list with the files. Single tests carry the mark themselves where the rest of
# their file runs here: a hostile capture through plan and verify (the unpacking is inspect's too),
# the oldest ansible-core (its cached venv's Python is whichever made it first, not this one),
# openat2's fallback (test_sysfs_openat2.py says why).
INTERPRETER_INDEPENDENT = frozenset(
    {
        "facts/test_pci_names.py",
        "test_first_hour.py",  # it runs the README's commands under the system's own python3, whichever runs pytest
        "facts/test_vgpu_mig.py",
        "house/test_docs_examples.py",
        "house/test_docs_links.py",
        "house/test_docs_reference.py",
        "house/test_layers.py",
        "house/test_skip_policy.py",
        "house/test_wheel.py",
        "inputs/test_console_checks.py",
        "inputs/test_declaration_spec.py",
        "inputs/test_inputs.py",
        "inputs/test_inputs_properties.py",
        "inputs/test_intent_hostile.py",
        "model/test_model_formats.py",
        "plan/test_cmdline.py",
        "plan/test_guest_toolkit_hostile.py",
        "plan/test_vfio_plan.py",
        "plan/test_vgpu_plan.py",
        "plan/test_vm_plan.py",
        "rules/test_assess.py",
        "verify/test_verify_bench.py",
        "verify/test_verify_multigpu.py",
    }
)


# pytest imports readline as it starts (_pytest/capture.py), and GNU readline puts COLUMNS=80 and
# LINES=24 into the process's C environment (not os.environ). A pytest-xdist worker (scripts/test.sh
# runs two) starts from that environment and so finds them in its os.environ, where the CLI's tables
# read COLUMNS: they would be 80 wide there and 160 (cli/table.py's PIPE_WIDTH) in a run without
# workers. Each worker takes the controller's os.environ values back (none in CI); its C environment
# keeps readline's, as a run without workers does (subprocesses started without env= inherit it).
TERMINAL_SIZE = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist's controller, per worker: its own terminal size variables (above)."""
    node.workerinput["gpuprov_terminal_size"] = {name: os.environ.get(name) for name in TERMINAL_SIZE}


def pytest_configure(config: pytest.Config) -> None:
    """In a pytest-xdist worker: the controller's terminal size variables (above)."""
    given = getattr(config, "workerinput", {}).get("gpuprov_terminal_size")
    for name, value in (given or {}).items():
        inherited = os.environ.get(name)
        if value is not None:
            os.environ[name] = value
        elif inherited is not None:
            del os.environ[name]
            os.putenv(name, inherited)


# The other way round: a test that plays a module through `ansible` on a target interpreter (the
# fixture bare_python: a Python with the standard library only, made from the one running the
# tests, as on a fresh target host) is about that target. Under Debian's python3 the target is the
# one a Debian 12 host has; under PATH's python3 (CI's: pyenv's 3.11.7) it is one no target host
# has, and the controller on that Python is what the molecule scenarios run. So scripts/test.sh runs
# these once, in the pass under Debian's python3, when that pass runs: they are marked
# `target_python` where that pass keeps them (neither `slow` nor `interpreter_independent`), and the
# first pass deselects the mark. A run of pytest by hand runs them all.
TARGET_FIXTURE = "bare_python"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks ``interpreter_independent`` and ``target_python`` (above)."""
    tests = Path(__file__).parent
    missing = sorted(name for name in INTERPRETER_INDEPENDENT if not (tests / name).is_file())
    if missing:
        raise pytest.UsageError(f"tests/conftest.py INTERPRETER_INDEPENDENT names files that are not there: {missing}")
    for item in items:
        with contextlib.suppress(ValueError):
            if item.path.relative_to(tests).as_posix() in INTERPRETER_INDEPENDENT:
                item.add_marker(pytest.mark.interpreter_independent)
        kept_by_debian_pass = all(item.get_closest_marker(name) is None for name in ("slow", "interpreter_independent"))
        if TARGET_FIXTURE in getattr(item, "fixturenames", ()) and kept_by_debian_pass:
            item.add_marker(pytest.mark.target_python)


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


def run_timed_by_cpu(argv: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess, float]:
    """``subprocess.run(argv, **kwargs)`` and the CPU seconds (user + system) the child used, its
    waited-for descendants included. Tests bound a gpuprov run by these, not by wall time: in CI
    pytest runs at nice 10 beside the lab lane, and a child can wait ten times its CPU time for a
    processor (docs/development/timings.md, 2026-11-29). A ``timeout`` given is a hang guard only."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(argv, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
