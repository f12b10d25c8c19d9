"""plan --json matches its published schema (gpuprov/schemas/plan.v1.json, in the wheel
beside inspect's and verify's), for plans that fit and plans that refuse."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

import gpuprov
from gpuprov.cli.main import main

SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "plan.v1.json").read_text())

CASES = {
    "mdev fits": ("mtty-mdev", [{"name": "a", "memory_mib": 256, "mdevs": [{"parent": "mtty", "type": "mtty-1"}]}], 0),
    "gpu fits": ("gpu-audio", [{"name": "g", "memory_mib": 256, "gpus": ["0000:01:00.0"], "pin": False}], 0),
    "refused": (
        "gpu-audio",
        [
            {"name": "a", "memory_mib": 8000000, "gpus": ["0000:99:00.0"]},
            {"name": "b", "vfs": [{"address": "0000:01:00.4", "vgpu_type": 557}]},
        ],
        3,
    ),
}


def plan_json(host_root, tmp_path: Path, capsys, host: str, vms: list, status: int) -> dict:
    path = tmp_path / "vms.yml"
    path.write_text(yaml.safe_dump(vms))
    assert main(["plan", str(path), "--root", str(host_root(host)), "--json", "--reserved-memory-mib", "0"]) == status
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_json_matches_schema(case: str, host_root, tmp_path: Path, capsys) -> None:
    report = plan_json(host_root, tmp_path, capsys, *CASES[case])
    jsonschema.validate(report, SCHEMA)
    assert report["ok"] is (CASES[case][2] == 0)


def test_schema_rejects_a_plan_missing_a_key(host_root, tmp_path: Path, capsys) -> None:
    report = plan_json(host_root, tmp_path, capsys, *CASES["gpu fits"])
    del report["vms"][0]["placement"]["cpus"]
    with pytest.raises(jsonschema.ValidationError, match="'cpus' is a required property"):
        jsonschema.validate(report, SCHEMA)


def test_a_file_that_fails_validation_is_exit_2_and_no_plan(host_root, tmp_path: Path, capsys) -> None:
    """Input problems stop at the validation boundary (docs/reference/inputs.md): no plan
    document, the field named on stderr."""
    path = tmp_path / "vms.yml"
    path.write_text(yaml.safe_dump([{"name": "bad name!", "memroy_mib": 1}]))
    assert main(["plan", str(path), "--root", str(host_root("gpu-audio")), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "gpu_vms_list[0]" in err
