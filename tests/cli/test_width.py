"""Every command's human output at 60, 80 and 120 columns (issue #50, item 3): no PCI address, VM
name or status word is split or cut, in inspect, verify, plan and topology on the shipped
captures; a table that cannot fit stacks its records instead."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuprov.cli.main import main

HOSTS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hosts"
CAPTURES = ("h200-live", "h200x2-live", "h100-live", "gpu-audio", "mtty-mdev", "boot-vga")
ADDRESS = re.compile(r"\b[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\b")
VM_NAMES = ("training-vm-with-a-long-name", "notebook-02")


def run(capsys, monkeypatch, columns: int, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    main(list(argv))
    return capsys.readouterr().out


def addresses(capsys, capture: str) -> set[str]:
    main(["inspect", "--all", "--json", "--root", str(HOSTS / f"{capture}.tar.gz")])
    return set(ADDRESS.findall(capsys.readouterr().out))


@pytest.mark.parametrize("columns", [60, 80, 120])
@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("command", ["inspect", "verify", "topology"])
def test_no_address_is_split(capsys, monkeypatch, command, capture, columns) -> None:
    want = addresses(capsys, capture)
    root = str(HOSTS / f"{capture}.tar.gz")
    args = (command, "--root", root, *(["--all"] if command == "inspect" else []))
    out = run(capsys, monkeypatch, columns, *args)
    assert out.strip()
    reference = run(capsys, monkeypatch, 2000, *args)  # nothing wraps
    for address in want:  # a split address is one whole occurrence fewer
        assert out.count(address) == reference.count(address), (command, columns, address, out)
    if command == "inspect":
        assert want & set(ADDRESS.findall(out)), f"inspect at {columns} columns shows no address whole"


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_plan_keeps_vm_names_and_devices_whole(capsys, monkeypatch, tmp_path, columns) -> None:
    vms = [
        {"name": name, "memory_mib": 1024, "vcpus": 1, "gpus": ["0000:00:06.0"] * (i == 0)}
        for i, name in enumerate(VM_NAMES)
    ]
    path = tmp_path / "vms.yml"
    path.write_text(json.dumps({"gpu_vms_list": vms}))
    out = run(capsys, monkeypatch, columns, "plan", "--root", str(HOSTS / "h100-live.tar.gz"), str(path))
    for name in VM_NAMES:
        assert name in out, out
    assert "0000:00:06.0" in out
    width = max(len(line) for line in out.splitlines())
    assert width <= columns, out
