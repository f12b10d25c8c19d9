"""``gpuprov plan`` shows the placement it chose over NUMA nodes (issue #29): a VM split over its
GPUs' host nodes gets a row per guest cell (host node, memory, vCPUs and their host CPUs, the GPUs
on the cell's expander bus), each node's memory a line of its own; a node refused is named in the
table's text and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from gpuprov.cli.main import main
from tests.cli.test_plan_schema import SCHEMA
from tests.vmhosts import two_node_host

GPU0, GPU1 = "0000:41:00.0", "0000:c1:00.0"  # on node 0, on node 1
BOTH = {"name": "both", "vcpus": 4, "memory_mib": 8192, "gpus": [GPU0, GPU1]}


def plan_out(tmp_path: Path, capsys, vms: list[dict], *flags: str) -> tuple[int, str]:
    root = tmp_path / "root"
    if not root.exists():
        two_node_host(root, memory_gib=64)
    path = tmp_path / "vms.yml"
    path.write_text(yaml.safe_dump(vms))
    status = main(["plan", str(path), "--root", str(root), *flags])
    return status, capsys.readouterr().out


def table_rows(out: str) -> list[list[str]]:
    """The table's body rows as their cells' text (a wrapped cell's lines are rows of their own)."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]


def test_the_table_shows_each_cell_of_a_split_vm(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    vms = [BOTH, {"name": "n1", "vcpus": 2, "memory_mib": 20480, "numa_node": 1}]
    status, out = plan_out(tmp_path, capsys, vms)
    assert status == 0, out
    assert table_rows(out) == [
        ["both", "running", "8192 MiB", "4", "cells", "by cell", "no", "by cell"],
        ["cell 0", "", "4096 MiB", "2", "0", "1,2", "", f"{GPU0} + 0000:41:00.1"],
        ["cell 1", "", "4096 MiB", "2", "1", "16,17", "", GPU1],
        ["n1", "running", "20480 MiB", "2", "1", "18,19", "no", "-"],
    ]
    lines = out.splitlines()
    for text in (
        "  NUMA node 0: 4096 MiB bound to VMs in normal pages of its 32768 MiB, 2048 MiB kept for the host, "
        "0 MiB reserved as hugepages",
        "  NUMA node 1: 24576 MiB bound to VMs in normal pages of its 32768 MiB, 2048 MiB kept for the host, "
        "0 MiB reserved as hugepages",
    ):
        assert text in lines, out


def test_unpinned_cells_say_so(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    status, out = plan_out(tmp_path, capsys, [{**BOTH, "pin": False}])
    assert status == 0, out
    rows = table_rows(out)
    assert rows[0][5] == "not pinned" and [r[5] for r in rows[1:]] == ["not pinned", "not pinned"]


def test_a_vm_too_big_for_node_1_is_refused_in_the_text_and_the_json(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # each refusal on one line
    vms = [BOTH, {"name": "big", "vcpus": 2, "memory_mib": 28000, "numa_node": 1}]
    message = (
        "VM big: memory oversubscribed on NUMA node 1: 28000 MiB bound there, the node has 26624 MiB left "
        "(32768 MiB, 2048 MiB of it kept for the host, 0 MiB reserved as hugepages, 4096 MiB bound to earlier VMs both)"
    )
    fix = "fewer or smaller VMs on node 1, reserve fewer hugepages there, or place the VM on another node (numa_node)"
    status, out = plan_out(tmp_path, capsys, vms)
    assert status == 3
    assert f"REFUSED: {message}\n    fix: {fix}\n" in out and "1 problem(s)" in out
    status, out = plan_out(tmp_path, capsys, vms, "--json")
    report = json.loads(out)
    jsonschema.validate(report, SCHEMA)
    assert status == 3 and report["refusals"] == [{"message": message, "fix": fix, "device": None}]
    assert report["vms"][0]["placement"]["numa_cells"] == [
        {"node": 0, "vcpus": 2, "memory_mib": 4096},
        {"node": 1, "vcpus": 2, "memory_mib": 4096},
    ]
    assert [(n["node"], n["vms_bound_mib"]) for n in report["resources"]["memory"]["nodes"]] == [(0, 4096), (1, 4096)]
