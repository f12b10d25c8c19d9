"""The guest stage of record: playbooks/guests.yml run through ansible-playbook on the device
machines (real GPU guests: 1x H100 and 2x H200 with NVLink; Ubuntu 24.04, driver 580.159.04 from
the image, no package registry) by tools/device/guest-stage.sh, 2026-11-22. Its logs are the
fixtures (tests/fixtures/outputs/device-guest-stage/); these tests say what they must show."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

RUNS = Path(__file__).parent / "fixtures/outputs/device-guest-stage"
MACHINES = {"1x H100": RUNS, "2x H200": RUNS / "h200x2"}
RECAP = re.compile(r"^localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(machine: Path, run: str) -> dict[str, int]:
    (found,) = RECAP.findall((machine / f"{run}.log").read_text())
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, found), strict=True))


@pytest.mark.parametrize("machine", MACHINES.values(), ids=MACHINES.keys())
def test_the_working_driver_is_left_alone_and_verify_passes_twice(machine: Path) -> None:
    for run in ("driver-verify", "driver-verify-again"):
        assert recap(machine, run) | {"ok": 0} == {"ok": 0, "changed": 0, "unreachable": 0, "failed": 0}
        log = (machine / f"{run}.log").read_text()
        assert "working: NVIDIA driver 580.159.04 (loaded)" in log and "nothing to do" in log
        checks = re.findall(r'^\s+"(ok|warn|fail|skip) ([a-z0-9-]+) ', log, re.M)
        assert checks and {status for status, _ in checks} <= {"ok", "skip"}
        assert ("ok", "driver") in checks and ("ok", "xid") in checks


@pytest.mark.parametrize("machine", MACHINES.values(), ids=MACHINES.keys())
def test_check_mode_needs_no_python3_apt_and_changes_nothing(machine: Path) -> None:
    log = (machine / "check.log").read_text()
    assert "python3-apt must be installed" not in log
    assert recap(machine, "check")["changed"] == 0
    assert "Show the driver's plan" in log and "nothing to do" in log


@pytest.mark.parametrize("machine", MACHINES.values(), ids=MACHINES.keys())
def test_the_toolkit_with_no_package_reachable_fails_naming_the_fix_and_changes_nothing(machine: Path) -> None:
    assert recap(machine, "toolkit")["failed"] == 1 and recap(machine, "toolkit")["changed"] == 0
    log = (machine / "toolkit.log").read_text()
    assert "could not fetch the key from https://nvidia.github.io/libnvidia-container/gpgkey" in log
    assert "nothing changed; check the guest reaches it, or give the key as a file" in log
    # /etc and dpkg's status hashed before and after every run: one value.
    hashes = {line.split(": ", 1)[1] for line in (machine / "snapshots.txt").read_text().splitlines()}
    assert len(hashes) == 1


def test_the_two_gpu_guest_reports_its_nvlink_pair() -> None:
    log = (RUNS / "h200x2/driver-verify.log").read_text()
    assert "ok p2p-access GPU 0 <-> GPU 1: peer read and write over NVLink" in log
    assert "ok bar1 GPU 1: BAR1 mapped in full (NVML 256 GiB, PCI BAR 256 GiB)" in log
