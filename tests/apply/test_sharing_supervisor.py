"""The MPS supervisor script gpuprov writes, run for real (its shell, its mount namespace, its restarts,
its stop and clean) against a stand-in control daemon (tests/fakemps.py): the lifecycle the guest's
daemon gets, checked on a machine without a GPU. Needs root (mount, unshare), as CI runs."""

from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpuprov.facts import mps
from gpuprov.facts.sysfs import Sysfs
from gpuprov.inputs.sharing import parse_guest
from gpuprov.plan.guest.sharing import Limits, supervisor_script
from tests import fakemps

ROW = mps.GpuRow(0, "GPU-11111111-2222-3333-4444-555555555555", "0000:00:06.0", 143771, "Default", 9.0, "H200", "580")


def _until(what, seconds: float = 40.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = what()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s: {what}")


def _ask(control: Path, folder: Path, command: str) -> str:
    env = {"PATH": os.environ["PATH"], "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe")}
    done = subprocess.run([str(control)], input=command, capture_output=True, text=True, env=env, timeout=10)
    return done.stdout.strip()


@pytest.fixture
def supervised(request):
    # Under /tmp, whatever TMPDIR is: a short root (the daemon's sockets go below it, 107 bytes a socket path
    # at most), and one whose programs may run (test.sh's TMPDIR is a tmpfs in /dev/shm, mounted noexec).
    root = Path(tempfile.mkdtemp(prefix="gpuprov-mps-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    control = fakemps.write(root / "bin")
    if getattr(request, "param", {}).pop("broken", False):  # a daemon that can never start
        control.write_text("#!/bin/sh\nexit 1\n")
    entry = {"name": "gpu0", "uuid": ROW.uuid, "sharing": "mps", "tenants": 4, **getattr(request, "param", {})}
    decl, problems = parse_guest({"gpus": [entry], "mps_root": str(root / "run")})
    assert decl is not None and not problems
    folder = root / "run" / "gpu0"
    script = root / "gpuprov-mps-gpu0"
    script.write_text(supervisor_script(decl.gpus[0], ROW, Limits(25, 34816), str(folder), str(control)))
    script.chmod(0o755)
    subprocess.run(["setsid", "-f", str(script), "run"], check=True, timeout=30)
    try:
        yield script, folder, control
    finally:
        subprocess.run([str(script), "clean"], timeout=60, check=False)


def _state(folder: Path, control: Path, script: Path) -> mps.MpsState:
    sysfs = Sysfs("/")
    return mps.read_state(sysfs, str(folder), "gpu0", str(control), mps._processes(sysfs), str(script))


def test_the_supervisor_keeps_the_daemon_with_its_limits_and_stops_clean(supervised) -> None:
    script, folder, control = supervised
    log = folder / "log" / "supervisor.log"
    _until(lambda: log.exists() and "limits: 25%" in log.read_text())
    state = _state(folder, control, script)
    assert state.supervisor_pid is not None and len(state.daemon_pids) == 1
    assert state.control_socket and state.shm_mounted
    assert (state.default_sm, state.default_mem_mib) == (25.0, 34816)
    # /dev/shm of the daemon is the entry's folder: the namespace is the daemon's own, not this test's.
    assert str(folder / "shm") in Path("/proc/self/mounts").read_text()
    assert Path(f"/proc/{state.daemon_pids[0]}/ns/mnt").resolve() != Path("/proc/self/ns/mnt").resolve()

    # A crash: the supervisor starts the daemon again and gives it its limits again.
    first = state.daemon_pids[0]
    os.kill(first, 9)
    again = _until(lambda: [p for p in _state(folder, control, script).daemon_pids if p != first])
    _until(lambda: _ask(control, folder, "get_default_active_thread_percentage") == "25.0")
    _until(lambda: _ask(control, folder, "get_default_device_pinned_mem_limit 0") == "34G")  # set just after

    subprocess.run([str(script), "stop"], check=True, timeout=60)
    state = _state(folder, control, script)
    assert state.supervisor_pid is None and state.daemon_pids == [] and not state.control_socket
    assert not Path(f"/proc/{again[0]}").exists()
    subprocess.run([str(script), "clean"], check=True, timeout=60)
    assert not folder.exists()
    assert str(folder / "shm") not in Path("/proc/self/mounts").read_text()


def test_stop_ends_a_daemon_whose_supervisor_was_killed(supervised) -> None:
    script, folder, control = supervised
    state = _until(lambda: (s := _state(folder, control, script)).daemon_pids and s.supervisor_pid and s)
    os.kill(state.supervisor_pid, 9)
    subprocess.run([str(script), "stop"], check=True, timeout=60)
    assert _state(folder, control, script).daemon_pids == []


@pytest.mark.parametrize("supervised", [{"clients_group": "nogroup"}], indirect=True)
def test_who_may_connect_is_the_clients_group(supervised) -> None:
    _script, folder, _control = supervised
    log = folder / "log" / "supervisor.log"
    _until(lambda: log.exists() and "limits: 25%" in log.read_text())
    gid = grp.getgrnam("nogroup").gr_gid
    for name, mode in (("pipe", 0o750), ("shm", 0o1770)):
        st = (folder / name).stat()
        assert (st.st_gid, stat.S_IMODE(st.st_mode)) == (gid, mode), name


@pytest.mark.parametrize("supervised", [{"broken": True}], indirect=True)
def test_stop_ends_a_supervisor_whose_daemon_never_starts(supervised) -> None:
    """A supervisor restarting a daemon that cannot start (waiting for its socket in between) still ends at
    stop: left running, it outlived the folder it serves (seen when a test's clean came too soon)."""
    script, folder, _control = supervised
    pid = _until(lambda: (folder / "supervisor.pid").exists() and int((folder / "supervisor.pid").read_text()))
    time.sleep(1.5)  # inside its wait for the daemon's socket
    started = time.monotonic()
    subprocess.run([str(script), "stop"], check=True, timeout=60)
    assert time.monotonic() - started < 25  # ended by its TERM, not by the kill 30 s on
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
