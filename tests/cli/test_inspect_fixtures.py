"""inspect over real captured hosts: the fixtures under tests/fixtures/hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuprov.cli.main import main
from tests.conftest import captured_hosts


def inspect_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict]:
    rc = main(["inspect", "--json", *args])
    return rc, json.loads(capsys.readouterr().out)


def test_h100_guest_reports_the_h100(host_root, capsys) -> None:
    rc, report = inspect_json(capsys, "--root", str(host_root("h100-passthrough-guest")))
    assert rc == 0
    (gpu,) = report["gpus"]
    assert gpu["address"] == "0000:00:06.0"
    assert gpu["vendor_device"] == "10de:2330"
    assert gpu["driver"] == "nvidia"
    assert gpu["link"] == "32 GT/s x16 (= max)"
    assert gpu["reset_methods"] == ["flr"]
    assert report["iommu"]["enabled"] is False
    assert not gpu["ready"]
    codes = {f["code"]: f for f in gpu["findings"]}
    assert codes["iommu-off"]["severity"] == "blocker"
    assert "itself a VM" in codes["iommu-off"]["fix"]  # a guest needs a vIOMMU, not firmware settings
    assert report["iommu"]["hypervisor"] is True
    assert "link-degraded" not in codes and "no-reset" not in codes
    dev = next(d for d in report["pci_devices"] if d["address"] == "0000:00:06.0")
    assert dev["link"] == {"current_speed": 32.0, "current_width": 16, "max_speed": 32.0, "max_width": 16}
    assert dev["class"] == "030200"


def test_h100_guest_table_names_the_problem(host_root, capsys) -> None:
    assert main(["inspect", "--root", str(host_root("h100-passthrough-guest"))]) == 0
    out = capsys.readouterr().out
    assert "0000:00:06.0" in out and "IOMMU: off" in out and "not ready" in out


def test_machine_without_gpu_or_iommu_says_nothing_here(host_root, capsys) -> None:
    root = str(host_root("ci-host-no-iommu"))
    assert main(["inspect", "--root", root]) == 0
    assert "No GPUs here" in capsys.readouterr().out
    rc, report = inspect_json(capsys, "--root", root)
    assert rc == 0
    assert report["gpus"] == [] and report["summary"] == {"gpus": 0, "ready": 0, "not_ready": 0}
    # A monitoring gate on "every GPU ready" must not pass on a host with none.
    assert main(["inspect", "--root", root, "--require-ready", "all"]) == 3


def test_require_ready_gate(host_root, capsys) -> None:
    root = str(host_root("h100-passthrough-guest"))
    assert main(["inspect", "--root", root, "--require-ready", "0000:00:06.0"]) == 3
    assert "not ready: 0000:00:06.0" in capsys.readouterr().err


@pytest.mark.parametrize("name", captured_hosts())
def test_every_capture_inspects_cleanly(name: str, host_root, capsys) -> None:
    """Any captured host, also with --all: a report, never a traceback."""
    root = str(host_root(name))
    rc, report = inspect_json(capsys, "--root", root)
    assert rc == 0
    assert report["schema"] == "gpuprov.inspect/v1"
    assert len(report["pci_devices"]) == len(list(Path(root, "sys/bus/pci/devices").iterdir()))
    assert main(["inspect", "--all", "--root", root]) == 0


def test_live_machine_inspects_cleanly(capsys) -> None:
    """The machine the tests run on (no GPU in CI) is inspected without error."""
    rc, report = inspect_json(capsys)
    assert rc == 0
    assert report["host"]["root"] == "/"
