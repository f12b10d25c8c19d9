"""dev/bench/fleet.py: its arithmetic, inventory and output parsing, and one tiny real run."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import HOSTS, REPO


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fleet_bench", REPO / "dev" / "bench" / "fleet.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fleet = _load()

RECAP = """
PLAY RECAP *********************************************************************
fleet0001                  : ok=4    changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
fleet0002                  : ok=3    changed=1    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0

TASKS RECAP ********************************************************************
Sunday 22 November 2026  15:05:51 +0000 (0:00:02.067)       0:00:06.392 *******
===============================================================================
gpu_host_model ---------------------------------------------------------- 2.08s
vfio_bind --------------------------------------------------------------- 1.26s
"""


def test_marginal_and_projection() -> None:
    assert fleet.marginal(12.0, 3.0, 10) == pytest.approx(1.0)
    assert fleet.marginal(3.5, 3.0, 2) == pytest.approx(0.5)
    assert math.isnan(fleet.marginal(3.0, 3.0, 1))
    # t(1) + 999 x marginal
    assert fleet.projection(3.0, 1.0) == pytest.approx(1002.0)
    assert fleet.projection(2.0, 0.5, fleet=11) == pytest.approx(7.0)


def test_inventory_gives_each_host_its_own_root_and_the_declaration(tmp_path: Path) -> None:
    roots = [tmp_path / f"r{i}" for i in range(3)]
    inv = fleet.inventory(roots, "0000:01:00.0", "/usr/bin/python3")
    hosts = inv["all"]["hosts"]
    assert list(hosts) == ["fleet0001", "fleet0002", "fleet0003"]  # order: the -l all[0:N-1] slice
    assert [h["gpuprov_root"] for h in hosts.values()] == [str(r) for r in roots]
    for h in hosts.values():
        assert h["ansible_connection"] == "local"
        assert h["ansible_python_interpreter"] == "/usr/bin/python3"
        assert h["gpuprov_host"] == {"gpus": [{"name": "gpu", "address": "0000:01:00.0", "use": "passthrough"}]}


def test_stage_copies_the_capture_with_the_converged_grub_file(tmp_path: Path) -> None:
    roots = fleet.stage(HOSTS / "gpu-audio.tar.gz", tmp_path / "roots", 2)
    assert len({str(r) for r in roots}) == 2
    for root in roots:
        assert (root / "sys/bus/pci/devices/0000:01:00.0").is_symlink()
        grub = (root / "etc/default/grub").read_text()
        assert all(arg in grub for arg in fleet.KERNEL_ARGUMENTS)
    (roots[0] / "etc/default/grub").write_text("changed")
    assert (roots[1] / "etc/default/grub").read_text() != "changed"  # copies, not one tree


def test_recap_and_profile_parsing() -> None:
    assert fleet.recap_totals(RECAP) == {"hosts": 2, "ok": 7, "changed": 1, "unreachable": 0, "failed": 1}
    assert fleet.task_profile(RECAP) == [("gpu_host_model", 2.08), ("vfio_bind", 1.26)]
    assert fleet.recap_totals("no recap") == {"hosts": 0, "ok": 0, "changed": 0, "unreachable": 0, "failed": 0}


def test_a_converge_that_changed_anything_is_called_out() -> None:
    counts = fleet.recap_totals(RECAP)
    assert "NOT A NO-OP" in fleet.not_a_noop(fleet.PlayRun(9.0, counts), 2)
    assert fleet.not_a_noop(fleet.PlayRun(9.0, {**counts, "changed": 0}), 2) is None


@pytest.mark.parametrize("text", ["", "x", "0,10", "1,-2", "1;10"])
def test_bad_counts_exit_2_naming_the_option(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        fleet.parse_counts(text, "--hosts")
    assert exc.value.code == 2
    assert "--hosts" in capsys.readouterr().err


def test_counts_sorted_and_unique() -> None:
    assert fleet.parse_counts("50, 1,10,10", "--hosts") == [1, 10, 50]


def test_table_projects_from_the_one_host_run() -> None:
    def run(s: float) -> Any:
        return fleet.PlayRun(s, {"hosts": 1, "ok": 1, "changed": 0, "unreachable": 0, "failed": 0})

    one = fleet.Point(1, 10, run(2.0), run(4.0))
    ten = fleet.Point(10, 10, run(11.0), run(22.0))
    text = fleet.table([one, ten, fleet.Point(1, 50, one.facts, one.noop, same_as_forks=10)])
    row = next(line for line in text.splitlines() if line.split()[:2] == ["10", "10"])
    # facts: (11 - 2) / 9 = 1.0 s/host -> 2 + 999 = 1001 s; no-op: (22 - 4) / 9 = 2.0 -> 4 + 1998 = 2002 s
    assert row.split()[2:] == ["11.00", "22.00", "2.00", "1.000", "2.000", "1001", "2002"]
    assert "same run as forks 10" in text.splitlines()[-1]


@pytest.mark.slow
def test_a_tiny_real_run_prints_the_table_and_changes_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "dev" / "bench" / "fleet.py"), "--hosts", "2", "--forks", "2"],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.split()[:3] == ["hosts", "forks", "facts"] for line in lines), proc.stdout
    two = next(line.split() for line in lines if line.split()[:2] == ["2", "2"])
    assert float(two[2]) > 0 and float(two[3]) > 0 and two[7] != "-"  # timed, and projected
    # Runs on 1 and 2 hosts: each host ran the plan and kept its verdicts (2 ok) and skipped the
    # three modules, which the plan found converged; a module that ran would add an ok.
    assert "no-op runs: changed=0 over 6 task results" in proc.stdout
    assert "NOT A NO-OP" not in proc.stdout


def test_profile_keeps_long_tasks_of_ten_seconds_or_more() -> None:
    # profile_tasks pads name and time to fixed widths: a long name that took 10 s or more is
    # followed by two dashes only (a bench once lost 43 s of a run's tasks this way).
    name = "gpuprov.kvm.gpu_vms : Bring each VM to its state (the whole list is checked against the host first)"
    text = f"TASKS RECAP ***\n{name} -- 12.35s\nshort --------------------- 1.00s\n"
    assert fleet.task_profile(text) == [(name, 12.35), ("short", 1.0)]


def _run(seconds: float, cpu: float) -> Any:
    return fleet.PlayRun(seconds, {"hosts": 1, "ok": 1, "changed": 0, "unreachable": 0, "failed": 0}, cpu=cpu)


def test_fleet_table_puts_the_three_plays_of_one_run_side_by_side() -> None:
    one = fleet.Point(1, 10, _run(2.0, 1.0), _run(3.0, 1.5), report=_run(2.5, 1.2))
    # per host: facts (11 - 2) / 9 = 1.0, report (14.5 - 2.5) / 9 = 1.333, no-op (21 - 3) / 9 = 2.0
    ten = fleet.Point(10, 10, _run(11.0, 10.0), _run(21.0, 19.5), report=_run(14.5, 11.1))
    text = fleet.fleet_table([one, ten])
    row = next(line for line in text.splitlines() if line.split()[:2] == ["10", "10"])
    cells = [c.strip() for c in row.split("|")]
    assert cells[1] == "11.00/14.50/21.00"
    assert cells[2] == "1.000/1.333/2.000"
    assert cells[3] == "1.33/2.00"  # the report's and the no-op's marginal against the facts-only play's
    assert cells[4] == "1.000/1.100/2.000"  # CPU: (10 - 1) / 9, (11.1 - 1.2) / 9, (19.5 - 1.5) / 9
    assert cells[5] == "1.10/2.00"
    # t(1) + 999 x marginal and t(1) + 9,999 x marginal, each play
    assert cells[6] == "1,001/1,334/2,001"  # 2.5 + 999 x 1.3333 = 1,334.5
    assert cells[7] == "10,001/13,334/20,001"
    assert "NOT met (wall 1.33x, CPU 1.10x)" in fleet.verdict([one, ten])
    met = fleet.Point(10, 10, _run(11.0, 10.0), _run(21.0, 19.5), report=_run(12.0, 10.2))
    assert "at 10 hosts, forks 10: met" in fleet.verdict([one, met])


def test_the_limit_takes_the_staged_hosts_and_the_lab_host() -> None:
    assert fleet.host_limit(1, False) == "all[0:0]"
    assert fleet.host_limit(50, True) == "all[0:49]:lab-gpu-host"


def test_lab_arguments_add_the_lab_inventory_and_its_overrides() -> None:
    assert fleet.lab_arguments({"running": True, "inventory_overrides": None}) == ["-i", str(REPO / "inventories/lab")]
    overrides = {
        "ansible_port": 2600,
        "ansible_ssh_private_key_file": "/c/lab/id_ed25519",
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/c/lab/known_hosts -o IdentitiesOnly=yes",
    }
    args = fleet.lab_arguments({"running": True, "inventory_overrides": overrides})
    assert args[:3] == ["-i", str(REPO / "inventories/lab"), "-e"]
    assert json.loads(args[3]) == overrides


@pytest.mark.parametrize(
    "status",
    [
        {"running": False, "inventory_overrides": None},
        {"inventory_overrides": None},
        {"running": "yes"},
        {"running": True, "inventory_overrides": {"ansible_become_pass": "x"}},  # not the connection's
        {"running": True, "inventory_overrides": ["ansible_port", 1]},
        {"running": True, "inventory_overrides": {}},
        {"running": True, "inventory_overrides": {"ansible_port": True}},
        {"running": True, "inventory_overrides": {"ansible_port": {"a": 1}}},
    ],
)
def test_lab_arguments_refuse_a_lab_not_running_or_odd_overrides(
    status: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        fleet.lab_arguments(status)
    assert exc.value.code == 2
    assert "--lab" in capsys.readouterr().err


def test_the_lab_arguments_build_an_inventory_with_the_lab_host_beside_the_staged_ones(tmp_path: Path) -> None:
    """What ansible-inventory makes of the bench's inventory with --lab's arguments: the staged hosts
    first (the -l slice), then the lab host with its host_vars and the overrides."""
    inv = tmp_path / "inventory.yml"
    inv.write_text(json.dumps(fleet.inventory([tmp_path / "r1", tmp_path / "r2"], "0000:01:00.0", sys.executable)))
    lab = fleet.lab_arguments({"running": True, "inventory_overrides": {"ansible_port": 2600}})
    env = {k: v for k, v in fleet._env().items() if k != "ANSIBLE_CALLBACKS_ENABLED"}
    tool = fleet.PLAYBOOK.with_name("ansible-inventory")
    limit = fleet.host_limit(2, True)
    proc = subprocess.run(
        [str(tool), "-i", str(inv), *lab, "-l", limit, "--list"], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    hostvars = listed["_meta"]["hostvars"]
    assert set(hostvars) == {"fleet0001", "fleet0002", fleet.LAB_HOST}
    assert hostvars[fleet.LAB_HOST]["ansible_host"] == "127.0.0.1"
    assert hostvars[fleet.LAB_HOST]["gpuprov_host"]["gpus"]  # its host_vars, read beside the inventory
    assert "gpuprov_root" not in hostvars[fleet.LAB_HOST]  # read at its own /
    assert hostvars["fleet0001"]["ansible_connection"] == "local"


def test_the_run_says_whether_the_lab_host_is_in_it() -> None:
    assert "NOT included" in fleet.lab_line(None)
    said = fleet.lab_line(["-i", "inventories/lab"], "drifted")
    assert "lab-gpu-host included" in said and "drifted" in said and "not of the no-op converge" in said
