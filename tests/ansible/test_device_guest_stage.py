"""The guest stage of record: playbooks/guests.yml run through ansible-playbook on the device
machines (real GPU guests: 1x H100 and 2x H200 with NVLink; Ubuntu 24.04, driver 580.159.04 from
the image, no package registry) by dev/device/guest-stage.sh, 2026-11-22. Its logs are the
fixtures (tests/fixtures/outputs/device-guest-stage/); these tests say what they must show."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RUNS = Path(__file__).parents[1] / "fixtures/outputs/device-guest-stage"
MACHINES = {
    "1x H100": RUNS,
    "2x H200": RUNS / "h200x2",
    "1x H200, run lock": RUNS / "h200x1-run-lock",
    "1x H200, issue 27's last step": RUNS / "h200x1-2026-11-30",
}
RECAP = re.compile(r"^localhost\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(machine: Path, run: str) -> dict[str, int]:
    (found,) = RECAP.findall((machine / f"{run}.log").read_text())
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, found)))


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


def test_the_two_gpu_guest_reports_its_nvlink_pair() -> None:
    log = (RUNS / "h200x2/driver-verify.log").read_text()
    assert "ok p2p-access GPU 0 <-> GPU 1: peer read and write over NVLink" in log
    assert "ok bar1 GPU 1: BAR1 mapped in full (NVML 256 GiB, PCI BAR 256 GiB)" in log


def test_a_run_waits_while_another_holds_the_guests_packages_lock() -> None:
    """On the real guest, guest_driver started while flock(1) held /run/gpuprov/packages.lock 11 s
    more (gpuprov.apply.lock): it waited for it, then ran and left the working driver alone."""
    machine = RUNS / "h200x1-run-lock"
    stage = (machine / "stage.txt").read_text()
    found = re.search(r"holds /run/gpuprov/packages.lock 11 s more: rc=(\d+) ([0-9.]+) s", stage)
    assert found and found[1] == "0" and float(found[2]) >= 10, stage[-500:]
    assert "-rw------- 1 root root    0" in stage and "packages.lock" in stage  # made 0600, empty
    waited = (machine / "waited.log").read_text()
    assert waited.startswith("localhost | SUCCESS") and '"verdict": "working"' in waited


# ---------------------------------------------------------------- issue 25: a container reaches the GPU

CONTAINER_RUNS = Path(__file__).parents[1] / "fixtures/outputs/device-container-stage"
CONTAINER_MACHINES = sorted(p for p in CONTAINER_RUNS.iterdir() if p.is_dir())


@pytest.mark.parametrize("machine", CONTAINER_MACHINES, ids=[p.name for p in CONTAINER_MACHINES])
def test_a_container_from_the_bare_guest_saw_every_gpu(machine: Path) -> None:
    """dev/device/container-stage.sh on a bare GPU guest (no engine, no toolkit, no systemd): the role
    installed the engine and the toolkit from an offline directory, and a container saw every GPU."""
    summary = (machine / "summary.txt").read_text()
    assert "bare: dockerd=none nvidia-ctk=none pid1=process_api" in summary
    snapshots = dict(re.findall(r"^etc (before|after check|after toolkit|after toolkit-again): (\S+)", summary, re.M))
    assert snapshots["before"] == snapshots["after check"] != snapshots["after toolkit"]  # check mode changed nothing
    assert recap(machine, "check")["failed"] == 0 and recap(machine, "toolkit")["failed"] == 0
    # The role again: nothing to do, nothing changed (/etc and dpkg's status hashed the same).
    assert recap(machine, "toolkit-again") | {"ok": 0} == {"ok": 0, "changed": 0, "unreachable": 0, "failed": 0}
    assert snapshots["after toolkit-again"] == snapshots["after toolkit"]
    # From the offline directory the tool filled from this guest's dpkg status: the engine and what it lacks.
    offline = (machine / "offline-dir.txt").read_text()
    assert "libdevmapper1.02.1_" in offline and "iptables_" in offline and "nvidia-container-toolkit-base_" in offline
    report = json.loads((machine / "verify-bench.json").read_text())
    status = {c["id"]: c["status"] for c in report["checks"] if c["gpu"] is None}
    assert status["container-run"] == "ok" and report["summary"]["fail"] == 0
    run = report["containers"]["run"]
    guest_uuids = sorted(g["uuid"] for g in report["gpus"])
    assert guest_uuids and sorted(run["uuids"]) == guest_uuids, (run["uuids"], guest_uuids)
    assert run["how"].startswith("the nvidia runtime")
    # The same bench inside the container: at least 0.97 of the guest's on every figure.
    ratios = run["bench_ratios"]
    assert {r["uuid"].lower() for r in ratios} == {u.lower().removeprefix("gpu-") for u in guest_uuids}
    for r in ratios:
        assert min(r["h2d_gbps"], r["d2h_gbps"], r["matmul_tflops"]) >= 0.97, r
    ratio = float(re.search(r"ratio no-op / facts-only: ([0-9.]+)", (machine / "noop-ratio.txt").read_text())[1])
    assert ratio <= 2.0


def test_a_host_that_keeps_one_gpu_gives_its_containers_that_one_only() -> None:
    """Issue 25, item 6, on the 2x H100 guest: the role with guest_container_toolkit_cdi_gpus naming the first
    GPU (as a host whose declaration keeps it, use: host): the spec then holds that GPU alone, a container
    asking for all sees one, the rerun changes nothing, and unset again the spec holds both."""
    machine = CONTAINER_RUNS / "h100x2"
    summary = (machine / "summary.txt").read_text()
    assert recap(machine, "host-keeps")["changed"] == 1 and recap(machine, "host-keeps")["failed"] == 0
    assert recap(machine, "host-keeps-again") | {"ok": 0} == {"ok": 0, "changed": 0, "unreachable": 0, "failed": 0}
    kept = re.search(r"^host keeps (\S+): spec devices: \['0', '(GPU-[0-9a-f-]+)', 'all'\]$", summary, re.M)
    assert kept, summary
    seen = summary.split("a container sees:\n", 1)[1].split("\n== ", 1)[0].strip().splitlines()
    assert seen == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {kept[2]})"]
    log = (machine / "host-keeps.log").read_text()
    assert "nvidia-ctk cdi generate --format=json --output=/var/lib/gpuprov/cdi/nvidia-all.json" in log
    assert "which this host does not keep for its containers" in log
