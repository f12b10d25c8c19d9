"""gpuprov inspect shows the vGPU instances per GPU (and mdev parent) and the free capacity."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

import gpuprov
from gpuprov.cli.main import main
from tests import vgpuhosts as vh

SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "inspect.v1.json").read_text())
UUID = "5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01"


def test_instances_and_free_capacity_in_json_and_table(tmp_path, capsys) -> None:
    fake = vh.build(tmp_path / "root", current={vh.SRIOV_VFS[0]: 557, vh.SRIOV_VFS[2]: 557})
    vh.mdev_instance(fake, vh.MDEV_GPU, "nvidia-259", UUID, 300)
    root = str(fake.finish())
    assert main(["inspect", "--json", "--root", root]) == 0
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, SCHEMA)
    gpus = {g["address"]: g["vgpu"] for g in report["gpus"]}
    sriov = gpus[vh.SRIOV_PF]["sriov_vgpu"]
    assert sriov["vfs_free"] == 2 and sriov["vfs_in_use"] == 2
    assert sriov["instances"] == [
        {"vf": vh.SRIOV_VFS[0], "type": 557, "name": "NVIDIA A100-4C"},
        {"vf": vh.SRIOV_VFS[2], "type": 557, "name": "NVIDIA A100-4C"},
    ]
    types = {t["type"]: t for t in gpus[vh.MDEV_GPU]["mdev_types"]}
    assert types["nvidia-259"]["instances"] == [UUID] and types["nvidia-259"]["available_instances"] == 3
    (parent,) = report["mdev"]["parents"]
    assert parent["parent"] == vh.MDEV_GPU and parent["is_pci"] is True and parent["instances"] == 1
    assert main(["inspect", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "SR-IOV vGPU: 2/4 VFs have a type, 2 free" in out
    assert f"VF {vh.SRIOV_VFS[2]}: type 557 (NVIDIA A100-4C)" in out
    assert "vGPU mdev type nvidia-259 'GRID V100-8Q': 3 available, 1 created" in out and f"mdev {UUID}" in out


def test_a_non_gpu_mdev_parent_is_shown_with_its_instances(host_root, capsys) -> None:
    root = str(host_root("mtty-mdev"))
    assert main(["inspect", "--root", root]) == 0
    out = capsys.readouterr().out
    assert "mdev parent mtty:" in out
    assert "mdev type mtty-2 'Dual port serial': 11 available, 1 created" in out
    assert "mdev 83b8f4f2-509f-382f-3c1e-e6bfe0fa1001" in out
    assert main(["inspect", "--json", "--root", root]) == 0
    (parent,) = json.loads(capsys.readouterr().out)["mdev"]["parents"]
    assert parent["parent"] == "mtty" and parent["is_pci"] is False and parent["instances"] == 1
