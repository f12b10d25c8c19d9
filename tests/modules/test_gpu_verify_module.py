"""The gpu_verify module, run for real by ansible (AnsiballZ) on a target
interpreter with neither gpuprov nor ansible: the checks of `gpuprov verify`
travel with the module. Roots are captured guests (the H100 passthrough guest)
and copies of it changed into the cases the checks exist for; the statuses are
compared with what `gpuprov verify` said on the live H100
(tests/fixtures/outputs/h100-live.verify.json)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest

import gpuprov
from tests.conftest import tree_digest
from tests.modules.test_modules import bare_python as bare_python  # a fixture: re-exported for pytest
from tests.modules.test_modules import run_module
from tests.verify.test_verify_containers import CDI_DEVICE, CDI_YAML
from tests.verify.test_verify_nvml import as_vgpu

OUTPUTS = Path(__file__).parents[1] / "fixtures" / "outputs"
H100 = "h100-passthrough-guest"
BENCH = ("bench", "bench-h2d", "bench-d2h", "bench-matmul")
MULTIGPU_CHECKS = {"p2p-access", "nvlink", "numa-affinity", "bar1", "xid", "ecc", "row-remap", "clock-throttle"}


def statuses(checks: list[dict]) -> dict[str, str]:
    return {c["id"] if c["gpu"] is None else f"{c['id']}/{c['gpu']}": c["status"] for c in checks}


@pytest.fixture
def guest(host_root, tmp_path):
    """A writable copy of the H100 guest capture."""

    def copy() -> Path:
        dest = tmp_path / "guest"
        shutil.copytree(host_root(H100), dest, symlinks=True)
        return dest

    return copy


def test_the_h100_guest_capture_has_the_live_runs_statuses(bare_python, host_root) -> None:
    root = host_root(H100)
    before = tree_digest(root)
    result = run_module(bare_python, "gpu_verify", {"root": str(root)})
    assert not result["failed"], result.get("msg")
    # Nothing fails; a capture cannot answer the health checks, so the verdict is "incomplete", not "passed".
    assert result["changed"] is False and result["passed"] is False and result["failed_checks"] == []
    assert result["summary"]["incomplete"] is True and result["summary"]["not_run"] == ["ecc", "row-remap", "xid"]
    live = json.loads((OUTPUTS / "h100-live.verify.json").read_text())
    # Every check the live H100 run made, apart from the bench (live only), with the same status.
    expected = {k: v for k, v in statuses(live["checks"]).items() if k.split("/")[0] not in BENCH}
    # The multi-GPU and health checks came after that run: a capture leaves them unknown.
    later = {k: v for k, v in statuses(result["checks"]).items() if k.split("/")[0] in MULTIGPU_CHECKS}
    assert statuses(result["checks"]) == {**expected, **later} and len(later) == 7
    assert set(later.values()) == {"skip"}
    report = result["report"]
    assert report["schema"] == "gpuprov.verify/v1"
    assert report["driver"]["version"] == live["driver"]["version"] == "580.159.04"
    assert [g["name"] for g in report["gpus"]] == [g["name"] for g in live["gpus"]]
    assert report["gpus_from"] == "capture"  # not NVML: a root other than / runs nothing
    assert tree_digest(root) == before


def test_a_failed_check_fails_the_task_with_its_message_and_fix(bare_python, guest) -> None:
    root = guest()
    xml = root / "capture" / "nvidia-smi-q-x"
    xml.write_text(as_vgpu(xml.read_text(), "GRID A100-4C", 8192))
    before = tree_digest(root)
    result = run_module(bare_python, "gpu_verify", {"root": str(root)})
    assert result["failed"] is True
    assert result["msg"].startswith("gpuprov verify: 1 check(s) fail: vgpu-memory (GPU 0) fail: ")
    assert "vGPU 0 (A100-4C) reports 8192 MiB but its profile has 4096 MiB" in result["msg"]
    assert "; fix: match the guest driver to the host's vGPU manager release" in result["msg"]
    assert [c["id"] for c in result["failed_checks"]] == ["vgpu-memory"]
    assert result["passed"] is False and statuses(result["checks"])["driver"] == "ok"
    assert tree_digest(root) == before

    # fail_on: [] reads the same and leaves the decision to the play.
    quiet = run_module(bare_python, "gpu_verify", {"root": str(root), "fail_on": []})
    assert quiet["failed"] is False and quiet["passed"] is False
    assert quiet["failed_checks"] == [] and statuses(quiet["checks"])["vgpu-memory/0"] == "fail"


def test_a_cdi_spec_for_another_driver_fails(bare_python, guest) -> None:
    # What guest_container_toolkit regenerates: a spec left from driver 535 under a 580 driver.
    root = guest()
    (root / "etc/cdi").mkdir(parents=True)
    device = CDI_DEVICE.format(minor=0, name=0)
    (root / "etc/cdi/nvidia.yaml").write_text(CDI_YAML.format(v="535.104.05", devices=device + "\n"))
    result = run_module(bare_python, "gpu_verify", {"root": str(root)})
    assert result["failed"] is True
    (cdi,) = result["failed_checks"]
    assert cdi["id"] == "cdi-spec"
    assert "/etc/cdi/nvidia.yaml was generated for driver 535.104.05, but 580.159.04 is loaded" in cdi["message"]
    assert cdi["fix"].endswith("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    assert result["report"]["containers"]["cdi_specs"][0]["driver_versions"] == ["535.104.05"]


def test_warnings_fail_only_when_asked(bare_python, guest) -> None:
    # containerd's CRI without the nvidia runtime is a warning (Docker-only hosts are common).
    root = guest()
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n')
    default = run_module(bare_python, "gpu_verify", {"root": str(root)})
    assert default["failed"] is False and statuses(default["checks"])["containerd-runtime"] == "warn"
    strict = run_module(bare_python, "gpu_verify", {"root": str(root), "fail_on": ["fail", "warn"]})
    assert strict["failed"] is True
    assert {c["id"] for c in strict["failed_checks"]} == {"containerd-runtime", "cdi-spec"}
    assert "containerd-runtime warn: containerd's CRI (Kubernetes, nerdctl) has no nvidia runtime" in strict["msg"]
    assert "fix: install nvidia-container-toolkit-base (role guest_container_toolkit)" in strict["msg"]


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ({"bench": True}, "bench measures this machine's GPU: it cannot run on a root capture"),
        ({"image": "debian:12"}, "image runs a container on this machine: it cannot go with root"),
        ({"gpu_source": "nvml"}, "gpu_source nvml asks this machine's driver"),
    ],
)
def test_options_that_need_this_machine_are_refused_on_a_root(bare_python, host_root, args, text) -> None:
    result = run_module(bare_python, "gpu_verify", {"root": str(host_root(H100)), **args})
    assert result["failed"] is True
    assert result["msg"].startswith("bad options, nothing was run: ") and text in result["msg"], result["msg"]
    assert "checks" not in result


def test_a_root_that_is_not_a_machine(bare_python, tmp_path) -> None:
    result = run_module(bare_python, "gpu_verify", {"root": str(tmp_path)})
    assert result["failed"] is True and "has no sys/ and proc/" in result["msg"]


def test_check_mode_reads_and_starts_no_container(bare_python, host_root) -> None:
    result = run_module(bare_python, "gpu_verify", {"root": str(host_root(H100))}, check=True)
    assert result["failed"] is False and result["changed"] is False
    run = next(c for c in result["checks"] if c["id"] == "container-run")
    assert run["status"] == "skip"


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver")
def test_this_machine_without_a_driver_fails_naming_the_driver_role(bare_python) -> None:
    """The live root: no NVIDIA driver here (CI), so the driver check fails and names the fix."""
    result = run_module(bare_python, "gpu_verify", {"container": False})
    assert result["failed"] is True
    assert result["msg"].startswith("gpuprov verify: ")
    driver = next(c for c in result["failed_checks"] if c["id"] == "driver")
    assert driver["message"].startswith("no NVIDIA driver")
    run = next(c for c in result["checks"] if c["id"] == "container-run")
    assert run["message"] == "not asked to (container: false)"


def test_the_module_on_a_live_h100_guest() -> None:
    """gpu_verify run by ansible (ad hoc, bench: true) on the H100 device machine (Firecracker guest, driver
    580.159.04, torch and nvidia-ml-py, no Docker), with a target interpreter that had neither gpuprov nor
    ansible; result kept in tests/fixtures/outputs/h100-live.gpu_verify.json (UUIDs zeroed)."""
    result = json.loads((OUTPUTS / "h100-live.gpu_verify.json").read_text())
    schema = json.loads((Path(gpuprov.__file__).parent / "schemas" / "verify.v1.json").read_text())
    jsonschema.validate(result["report"], schema)
    assert result["changed"] is False and result["passed"] is True and result["failed_checks"] == []
    # The same statuses as `gpuprov verify --bench` gave on the same kind of machine.
    live = json.loads((OUTPUTS / "h100-live.verify.json").read_text())
    assert statuses(result["checks"]) == statuses(live["checks"])
    assert result["report"]["gpus_from"] == "nvml"
    (bench,) = result["report"]["bench"]["results"]
    probe = json.loads((OUTPUTS / "h100-passthrough-guest.probe.json").read_text())
    assert bench["h2d_gbps"] == pytest.approx(probe["h2d_GBps"], rel=0.2)
    assert bench["d2h_gbps"] == pytest.approx(probe["d2h_GBps"], rel=0.2)
    assert bench["matmul_tflops"] == pytest.approx(probe["bf16_matmul_TFLOPs"], rel=0.1)
    assert bench["link_under_load"] == {"current_gen": 5, "current_width": 16, "sysfs_speed": 32.0, "sysfs_width": 16}
