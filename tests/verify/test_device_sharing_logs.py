"""Issue 48's run of record on a GPU guest (1x H200, 2026-12-02; dev/device/sharing-stage.sh, logs in
tests/fixtures/outputs/device-sharing-stage/, UUIDs zeroed): what gpuprov verify measured must hold, each
figure recomputed from the logs. A measured share off its declared share by more than 10%, a tenant that got
more memory than its share or more throughput by its own environment, a rerun that changed something, or a
daemon or folder left behind after the GPU went back to exclusive fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[1] / "fixtures" / "outputs" / "device-sharing-stage" / "h200x1-2026-12-02"
VERIFIES = ["four/four-verify.json", "two/two-unequal-verify.json", "two/two-equal-verify.json"]
TOLERANCE = 0.10
SHARE = re.compile(r"side by side (\d+) of the tenants' (\d+) TFLOP/s, ([0-9.]+) for a declared ([0-9.]+)")
MEMORY = re.compile(r"asking for (\d+) MiB got (\d+) MiB, then was refused \(share (\d+) MiB\)")
P99 = re.compile(r"p99 x([0-9.]+)")


def checks(name: str) -> list[dict]:
    return json.loads((RUN / name).read_text())["checks"]


def summary(part: str) -> str:
    return (RUN / part / "summary.txt").read_text()


def recap(text: str, play: str) -> str:
    line = next(line for line in text.splitlines() if line.startswith(f"== {play}:"))
    assert "rc=0" in line, line
    return line


@pytest.mark.parametrize("name", VERIFIES)
def test_every_tenant_got_its_declared_share_side_by_side(name: str) -> None:
    shares = [c for c in checks(name) if c["id"] == "sharing-share"]
    assert len(shares) in (2, 4)
    total = 0.0
    for c in shares:
        side, aggregate, share, declared = (float(x) for x in SHARE.search(c["message"]).groups())
        assert abs(side / aggregate - share) < 0.002  # the message's own arithmetic
        assert abs(share - declared) / declared <= TOLERANCE, c["message"]
        assert c["status"] == "ok"
        total += declared
    assert abs(total - 1.0) < 0.01


@pytest.mark.parametrize("name", VERIFIES)
def test_no_tenant_got_more_memory_than_its_share(name: str) -> None:
    (mem,) = [c for c in checks(name) if c["id"] == "sharing-memory"]
    asked, got, share = (int(x) for x in MEMORY.search(mem["message"]).groups())
    assert asked > share >= got and mem["status"] == "ok"


@pytest.mark.parametrize("name", VERIFIES)
def test_the_daemon_held_its_limits_and_verify_passed(name: str) -> None:
    report = json.loads((RUN / name).read_text())
    assert report["summary"]["passed"] is True and report["summary"]["fail"] == 0
    (daemon,) = [c for c in report["checks"] if c["id"] == "sharing"]
    assert daemon["status"] == "ok" and "MPS daemon up" in daemon["message"]
    (latency,) = [c for c in report["checks"] if c["id"] == "sharing-latency"]
    assert float(P99.search(latency["message"]).group(1)) <= 1.5


def test_a_tenant_asking_for_more_by_its_environment_does_not_get_it() -> None:
    probe = json.loads((RUN / "four" / "four-hostile.json").read_text())
    plain, env, alloc = probe["plain"], probe["env"], probe["env-alloc"]
    # docker -e asked for 100% of SMs, 140G and another pipe folder; CDI's environment won, the server's limits held.
    assert env["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpuprov/mps/gpu0/pipe"
    assert env["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["tflops"] <= plain["tflops"] * 1.05
    assert alloc["refused"] is True and alloc["got_mib"] <= 34 * 1024 < alloc["asked_mib"]


def test_a_process_that_leaves_mps_by_itself_is_reported_not_hidden() -> None:
    """Compute mode stayed Default (the device machines' GPU settings are not ours to change): a process that
    sets its own pipe folder inside its container gets the whole GPU; verify says so, as a warning."""
    probe = json.loads((RUN / "four" / "four-hostile.json").read_text())
    assert probe["leaves-mps"]["tflops"] > 2 * probe["plain"]["tflops"]
    (iso,) = [c for c in checks("four/four-verify.json") if c["id"] == "sharing-isolation"]
    assert iso["status"] == "warn" and "compute mode Default" in iso["message"]


def test_check_mode_changed_nothing_a_rerun_is_changed_0_and_drift_is_repaired() -> None:
    text = summary("four")
    before = re.search(r"^before: (\w+)", text, re.M).group(1)
    assert re.search(r"^after check: (\w+)", text, re.M).group(1) == before
    assert "changed=0" in recap(text, "four-again")
    for drift in ("drift-limits", "drift-pipe", "drift-all"):
        assert "changed=1" in recap(text, drift)
    assert "by hand: sm=100.0  mem=100G" in text and "repaired: sm=25.0  mem=34G" in text
    assert "changed=0" in recap(text, "drift-again")
    assert "changed=0" in recap(text, "drift-killed")  # the supervisor had started the daemon again itself


def test_back_to_exclusive_leaves_no_daemon_and_no_folder() -> None:
    text = summary("two")
    assert "changed=0" in recap(text, "exclusive-again") and "changed=0" in recap(text, "two-equal-again")
    after = text.split("== exclusive-again:", 1)[1]
    assert re.search(r"^daemons: *$", after, re.M)
    assert "folder: ls: cannot access '/run/gpuprov/mps/gpu0'" in after
    assert "cdi MPS lines: 0" in after and "shm mounts: 0" in after


def test_the_bench_table_has_every_mode() -> None:
    rows = json.loads((RUN / "two" / "sharing-bench.json").read_text())["rows"]
    assert {(r["n"], r["tenants"]) for r in rows} == {(1024, 4), (8192, 4)}
    for r in rows:
        assert all(r[mode]["tflops"] > 0 for mode in ("exclusive", "plain", "mps"))
