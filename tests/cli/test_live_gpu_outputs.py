"""What `gpuprov inspect --json` printed on real GPU machines (the device
machines: Firecracker guests with an H100 or H200 passed through), kept as
fixtures with the capture taken in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from gpuprov.cli.main import main
from tests.cli.test_schema import SCHEMA

OUTPUTS = Path(__file__).parents[1] / "fixtures" / "outputs"


@pytest.mark.parametrize(("name", "device_id"), [("h100-live", "2330"), ("h200-live", "2335")])
def test_live_report(name: str, device_id: str, host_root, capsys) -> None:
    live = json.loads((OUTPUTS / f"{name}.inspect.json").read_text())
    jsonschema.validate(live, SCHEMA)
    (gpu,) = live["gpus"]
    assert (gpu["address"], gpu["vendor_device"], gpu["driver"]) == ("0000:00:06.0", f"10de:{device_id}", "nvidia")
    assert gpu["link"] == "32 GT/s x16 (= max)" and gpu["reset_methods"] == ["flr"]
    assert live["iommu"]["enabled"] is False and live["iommu"]["hypervisor"] is True
    assert [f["code"] for f in gpu["findings"] if f["severity"] == "blocker"] == ["iommu-off"]

    # The capture from the same run reads back to the same verdicts and facts.
    assert main(["inspect", "--json", "--root", str(host_root(name))]) == 0
    again = json.loads(capsys.readouterr().out)
    for report in (live, again):
        report["host"].pop("root")
        report["host"].pop("names_from")  # no pci.ids on the device machine
        for g in report["gpus"]:
            g.pop("name")
        for d in report["pci_devices"]:
            d.pop("vendor_name"), d.pop("device_name")
    # Keys added to schema v1 since the live run (intended_use, declared_as, state; the names:
    # product_name, class_name) are left out.
    known, known_pci = set(live["gpus"][0]), set(live["pci_devices"][0])
    assert [{k: v for k, v in g.items() if k in known} for g in again["gpus"]] == live["gpus"]
    assert [{k: v for k, v in d.items() if k in known_pci} for d in again["pci_devices"]] == live["pci_devices"]
    # The names the driver gave the GPU on that run (its /proc/driver/nvidia, as nvidia-smi).
    assert [g["product_name"] for g in again["gpus"]] == [
        {"h100-live": "NVIDIA H100 80GB HBM3"}.get(name, "NVIDIA H200")
    ]
    assert [g["class_name"] for g in again["gpus"]] == ["3D controller"]
    assert again["iommu"] == live["iommu"]
