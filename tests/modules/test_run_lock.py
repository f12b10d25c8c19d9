"""One gpuprov run at a time on a host's boot or a guest's packages (gpuprov.apply.lock,
docs/reference/boot-trial.md): a run started while another still changes them (its play killed on the
controller, its module going on on the host: the lab, 2026-11-29) waits for it and then reads what it
left; one that waits too long fails, names the holder and changes nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprov.apply import lock
from tests.conftest import tree_digest
from tests.modrun import run_in_process
from tests.plan.conftest import gpg_key  # noqa: F401 (the fixture, for guest_toolkit's key)
from tests.plan.test_boot_trial import debian
from tests.plan.test_guest_toolkit import guest as toolkit_guest
from tests.plan.test_guest_toolkit import module_args as toolkit_args

# Another process takes the lock, says so, and keeps it for argv[2] seconds (or until killed).
HOLDER = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(sys.argv[1]) else os.O_CREAT))\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


@pytest.fixture
def other_run() -> Iterator:
    """Start a process that holds a lock: ``other_run(path, seconds)``; each is killed at the end."""
    procs: list[subprocess.Popen] = []

    def start(path: Path, seconds: float = 600) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()
    lock.release()


def test_a_staged_root_locks_its_own_folder_and_a_missing_one_gets_nothing_made(tmp_path: Path, other_run) -> None:
    before = tree_digest(tmp_path)
    assert lock.hold_for(str(tmp_path), "boot") is None  # held: the folder itself, nothing written
    assert tree_digest(tmp_path) == before
    lock.release()
    proc = other_run(tmp_path)
    problem = lock.hold_for(str(tmp_path), "boot", 0.2)
    assert problem and f"another run holds {tmp_path} (pid {proc.pid}" in problem
    missing = tmp_path / "not-there"
    assert lock.hold_for(str(missing), "boot", 0.2) is None and not missing.exists()


def test_the_live_root_by_another_spelling_takes_the_live_roots_lock(monkeypatch, tmp_path: Path, other_run) -> None:
    """Sysfs reads "/." as the live root, so the module would change the live host: same lock."""
    monkeypatch.setattr(lock, "LOCK_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    proc = other_run(tmp_path / "run" / "boot.lock")
    problem = lock.hold_for("/.", "boot", 0.2)
    assert problem and f"another run holds {tmp_path}/run/boot.lock (pid {proc.pid}" in problem


def test_a_second_run_waits_for_the_first_then_goes_on(tmp_path: Path, other_run) -> None:
    path = tmp_path / "run" / "boot.lock"
    path.parent.mkdir()
    other_run(path, 1.0)
    started = time.monotonic()
    assert lock.hold(str(path), 30) is None
    assert time.monotonic() - started >= 0.5  # it waited for the holder's end
    lock.release()


def test_a_run_that_waits_too_long_names_the_holder(tmp_path: Path, other_run) -> None:
    path = tmp_path / "boot.lock"
    proc = other_run(path)
    problem = lock.hold(str(path), 0.5)
    assert problem is not None
    assert f"another run holds {path} (pid {proc.pid}, python" in problem and "after 0 s of waiting" in problem


def test_a_lock_file_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / "boot.lock").symlink_to(target)
    problem = lock.hold(str(tmp_path / "boot.lock"), 0)
    assert problem is not None and "cannot open the lock" in problem and not target.exists()


def test_a_module_given_a_root_that_is_not_there_makes_nothing_there(tmp_path: Path) -> None:
    missing = tmp_path / "srv" / "not-there"
    result = run_in_process("iommu_boot", {"root": str(missing), "reboot_allowed": True})
    assert not missing.exists() and not (tmp_path / "srv").exists(), result


def boot_host(root: Path, _: pytest.FixtureRequest) -> dict[str, Any]:
    debian(root)
    return {"root": str(root), "reboot_allowed": True}


def cmdline_host(root: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    debian(root)
    return {"root": str(root), "arguments": ["intel_iommu=on"]}


def vfio_host(root: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    shutil.copytree(request.getfixturevalue("host_root")("gpu-audio"), root, symlinks=True, dirs_exist_ok=True)
    return {"devices": ["0000:01:00.0"], "root": str(root)}


def driver_guest(root: Path, _: pytest.FixtureRequest) -> dict[str, Any]:
    toolkit_guest(root, driver=False)
    return {"root": str(root)}


def toolkit_guest_args(root: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    toolkit_guest(root)
    return toolkit_args(root, request.getfixturevalue("gpg_key"))


# Each module that takes a lock: its lock's concern, and a root it changes with the arguments to.
MODULES = {
    "iommu_boot": ("boot", boot_host),
    "kernel_cmdline": ("boot", cmdline_host),
    "vfio_bind": ("boot", vfio_host),
    "guest_driver": ("packages", driver_guest),
    "guest_toolkit": ("packages", toolkit_guest_args),
}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_that_cannot_take_its_lock_changes_nothing(
    tmp_path: Path, other_run, monkeypatch, request: pytest.FixtureRequest, module: str
) -> None:
    concern, setup = MODULES[module]
    args = setup(tmp_path, request)
    proc = other_run(tmp_path)
    monkeypatch.setattr(lock, "WAIT_SECONDS", 0.5)
    before = tree_digest(tmp_path)
    result = run_in_process(module, args)
    assert result["failed"] and "nothing changed" in result["msg"] and f"pid {proc.pid}" in result["msg"]
    assert f"this host's {concern}" in result["msg"] and "lslocks" in result["msg"]
    assert tree_digest(tmp_path) == before
    # Check mode changes nothing and waits for no one.
    dry = run_in_process(module, args, check=True)
    assert not dry["failed"] and dry["changed"], dry.get("msg")
    proc.kill()
    proc.wait()
    result = run_in_process(module, args)  # the holder gone, the run goes on
    assert not result["failed"] and result["changed"], result.get("msg")
