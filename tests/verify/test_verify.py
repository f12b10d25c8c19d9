"""`gpuprov verify` end to end: captured hosts, the live report of a real GPU
guest, this machine itself (no NVIDIA driver), bad input, the JSON schema."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import gpuprov
from gpuprov.cli.main import main
from gpuprov.verify.bench import COPY_OK_FRACTION, MATMUL_OK_FRACTION
from tests.conftest import captured_hosts, tree_digest
from tests.verify.test_verify_nvml import as_vgpu

SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "verify.v1.json").read_text())
OUTPUTS = Path(__file__).parents[1] / "fixtures" / "outputs"
REPO = Path(__file__).parents[2]


def run_json(args: list[str], capsys) -> tuple[int, dict]:
    rc = main(["verify", "--json", *args])
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, SCHEMA)
    return rc, report


def statuses(report: dict) -> dict[str, str]:
    return {c["id"] if c["gpu"] is None else f"{c['id']}/{c['gpu']}": c["status"] for c in report["checks"]}


def test_the_h100_guest_capture_is_incomplete_never_passed(host_root, capsys) -> None:
    """Issue 26: a capture cannot answer the checks that judge the GPUs' health (NVML, the kernel log):
    nothing fails, and the verdict says what could not run instead of "passed" (exit 1, fail closed)."""
    rc, report = run_json(["--root", str(host_root("h100-passthrough-guest"))], capsys)
    assert rc == 1 and report["summary"]["passed"] is False and report["summary"]["fail"] == 0
    assert report["summary"]["incomplete"] is True and report["summary"]["not_run"] == ["ecc", "row-remap", "xid"]
    assert statuses(report) == {
        "driver": "ok",
        "gpus": "ok",
        "pcie-link/0": "ok",
        "vgpu-memory": "skip",
        "docker-runtime": "skip",
        "containerd-runtime": "skip",
        "cdi-spec": "skip",
        "container-run": "skip",
        # A capture has no NVML to ask, no process of its own, no kernel log: unknown, never ok.
        "nvlink/0": "skip",
        "numa-affinity/0": "skip",
        "bar1/0": "skip",
        "xid": "skip",
        "ecc/0": "skip",
        "row-remap/0": "skip",
        "clock-throttle/0": "skip",
    }
    (gpu,) = report["gpus"]
    assert (gpu["name"], gpu["address"], gpu["memory_total_mib"]) == ("NVIDIA H100 80GB HBM3", "0000:00:06.0", 81559)
    assert gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu["link"]["current_gen"] == 5 and gpu["pci_link"]["current_speed"] == 32.0
    assert report["gpus_from"] == "capture" and report["driver"]["version"] == "580.159.04"
    assert report["bench"] is None


@pytest.mark.parametrize("name", captured_hosts())
def test_every_capture_gives_a_report(name, host_root, capsys) -> None:
    root = host_root(name)
    before = tree_digest(root)
    rc, report = run_json(["--root", str(root)], capsys)
    assert rc == (0 if report["summary"]["passed"] else 1)
    if not report["gpus"]:
        assert report["checks"][0]["id"] == "driver" and report["checks"][0]["status"] == "fail"
    assert tree_digest(root) == before


def test_the_table(host_root, capsys) -> None:
    assert main(["verify", "--root", str(host_root("h100-passthrough-guest"))]) == 1
    out = capsys.readouterr().out
    for text in ("NVIDIA driver: 580.159.04, CUDA 13.0", "NVIDIA H100 80GB HBM3", "gen5 x16", "pcie-link"):
        assert text in out
    assert "INCOMPLETE: could not judge ecc, row-remap, xid" in out and "PASSED" not in out
    assert "GPU-0000" not in out  # the table prints no UUID


def test_a_failed_check_exits_1(host_root, tmp_path, capsys) -> None:
    # The H100 guest as a vGPU guest whose vGPU reports more memory than its profile.
    root = tmp_path / "root"
    src = host_root("h100-passthrough-guest")
    subprocess.run(["cp", "-a", str(src), str(root)], check=True)
    xml = root / "capture" / "nvidia-smi-q-x"
    xml.write_text(as_vgpu(xml.read_text(), "GRID A100-4C", 8192))
    assert main(["verify", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert "vGPU 0 (A100-4C) reports 8192 MiB but its profile has 4096 MiB" in out and "FAILED" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bench", "--root", "CAPTURE"], "--bench measures this machine's GPU"),
        (["--image", "debian:12", "--root", "CAPTURE"], "--image runs a container on this machine"),
        (["--gpu-source", "nvml", "--root", "CAPTURE"], "--gpu-source nvml asks this machine's driver"),
        (["--root", "/nonexistent"], "does not exist"),
    ],
)
def test_bad_input_exits_2(args, message, host_root, capsys) -> None:
    args = [str(host_root("h100-passthrough-guest")) if a == "CAPTURE" else a for a in args]
    assert main(["verify", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("root", [[], ["--root", "/"], ["--root", "/."]])
def test_nvml_asked_for_but_not_installed(monkeypatch, capsys, root) -> None:
    """The live root by any spelling (Sysfs's rule) may ask this machine's driver: the refusal is
    about pynvml, not about --root."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert main(["verify", "--gpu-source", "nvml", *root]) == 2
    err = capsys.readouterr().err
    assert "pip install nvidia-ml-py" in err and "--root" not in err, err


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver")
@pytest.mark.parametrize("json_out", [False, True])
def test_this_machine_has_no_driver(json_out) -> None:
    """CI: `gpuprov verify` says there is no NVIDIA driver and exits 1, cleanly."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "gpuprov", "verify", *(["--json"] if json_out else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO, env=env, check=False)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr == ""
    if json_out:
        report = json.loads(proc.stdout)
        jsonschema.validate(report, SCHEMA)
        driver = report["checks"][0]
        assert (driver["id"], driver["status"]) == ("driver", "fail")
        assert driver["message"].startswith("no NVIDIA driver")
    else:
        assert "no NVIDIA driver" in proc.stdout and "FAILED" in proc.stdout


# ---------------------------------------------------------------- a real GPU guest


@pytest.mark.parametrize(("name", "gpu_name"), [("h100-live", "NVIDIA H100 80GB HBM3"), ("h200-live", "NVIDIA H200")])
def test_live_guest_report(name, gpu_name, host_root, capsys) -> None:
    """`gpuprov verify --bench --json` on Firecracker guests with an H100 and an H200
    passed through (the device machines: torch and nvidia-ml-py there, no Docker), UUIDs zeroed.
    The .txt beside each is the table of a second run in the same session."""
    live = json.loads((OUTPUTS / f"{name}.verify.json").read_text())
    jsonschema.validate(live, SCHEMA)
    assert live["summary"] == {"ok": 6, "warn": 0, "fail": 0, "skip": 5, "passed": True}
    assert statuses(live)["container-run"] == "skip"
    run = next(c for c in live["checks"] if c["id"] == "container-run")
    assert run["message"].startswith("no container runtime")
    assert live["gpus_from"] == "nvml" and live["driver"]["open_kernel_module"] is True
    (gpu,) = live["gpus"]
    assert gpu["name"] == gpu_name and gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert "PASSED" in (OUTPUTS / f"{name}.verify.txt").read_text()

    # Close to what a probe measured on an H100 guest with the same gen5 x16 link.
    probe = json.loads((OUTPUTS / "h100-passthrough-guest.probe.json").read_text())
    (bench,) = live["bench"]["results"]
    assert bench["gpu_index"] == 0 and bench["error"] is None and bench["name"] == gpu_name
    assert bench["h2d_gbps"] == pytest.approx(probe["h2d_GBps"], rel=0.2)
    assert bench["d2h_gbps"] == pytest.approx(probe["d2h_GBps"], rel=0.2)
    assert bench["matmul_tflops"] == pytest.approx(probe["bf16_matmul_TFLOPs"], rel=0.1)
    assert bench["link_peak_gbps"] == 63.02 and bench["gpu_peak_tflops"] == 989.0
    assert bench["d2h_fraction"] >= COPY_OK_FRACTION and bench["matmul_fraction"] >= MATMUL_OK_FRACTION
    if name == "h100-live":
        # That run's 44.7 GB/s host->device (71%) passed as ok when it was recorded; under today's line
        # (80% of the link's peak) it is a warning.
        assert bench["h2d_fraction"] == 0.71 < COPY_OK_FRACTION
    # The link was read while the copies ran: gen5 x16 in NVML and in sysfs.
    assert bench["link_under_load"] == {"current_gen": 5, "current_width": 16, "sysfs_speed": 32.0, "sysfs_width": 16}

    # The capture of the same kind of guest reads back to the same GPU facts.
    rc, again = run_json(["--root", str(host_root(name))], capsys)
    assert rc == 1 and again["summary"]["incomplete"] is True  # a capture: the health checks could not run
    keys = ("index", "name", "address", "architecture", "memory_total_mib", "virtualization_mode", "link", "pci_link")
    assert [{k: g[k] for k in keys} for g in again["gpus"]] == [{k: g[k] for k in keys} for g in live["gpus"]]
    assert again["driver"]["library_version"] == live["driver"]["version"] == "580.159.04"
