"""dev/bench/lab_noop.py: its parsing and printing on canned ansible-playbook output (the lab itself
is never run here: the lead runs the benchmark)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO


def _load() -> ModuleType:
    sys.path.insert(0, str(REPO / "dev" / "bench"))
    spec = importlib.util.spec_from_file_location("lab_noop_bench", REPO / "dev" / "bench" / "lab_noop.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bench = _load()
fleet = bench.fleet

NOOP_OUTPUT = """
PLAY RECAP *********************************************************************
lab-gpu-host               : ok=14   changed=0    unreachable=0    failed=0    skipped=9    rescued=0    ignored=0

TASKS RECAP ********************************************************************
Sunday 22 November 2026  18:05:51 +0000 (0:00:00.030)       0:00:31.392 *******
===============================================================================
Gathering Facts --------------------------------------------------------- 7.20s
gpuprov.kvm.host_model : Resolve the host's declaration against its facts --- 4.10s
gpuprov.kvm.host_model : Remember that this run resolved it ------------- 0.03s
gpuprov.kvm.vgpu_host : Install the boot unit's runner, once the layout is accepted --- 0.02s
gpuprov.kvm.gpu_vms : Bring each VM to its state ------------------------ 5.55s
"""


def run(seconds: float, output: str = NOOP_OUTPUT) -> object:
    return fleet.PlayRun(seconds, fleet.recap_totals(output), fleet.task_profile(output))


def test_the_recap_and_the_profile_are_read() -> None:
    played = run(30.0)
    assert played.recap == {"hosts": 1, "ok": 14, "changed": 0, "unreachable": 0, "failed": 0}
    assert bench.skipped(NOOP_OUTPUT) == 9
    names = [name for name, _ in played.profile]
    assert names[0] == "Gathering Facts" and names[-1] == "gpuprov.kvm.gpu_vms : Bring each VM to its state"
    assert [n for n, _ in bench.module_tasks(played.profile)] == [names[0], names[1], names[4]]


def test_the_report_has_times_ratio_profile_fleet_table_and_projection() -> None:
    facts = bench.Timed([12.0, 10.0, 11.0], run(10.0, "lab-gpu-host : ok=1 changed=0 unreachable=0 failed=0\n"))
    noop = bench.Timed([22.0], run(22.0))
    one = fleet.Point(1, 10, run(2.0), run(4.0))
    ten = fleet.Point(10, 10, run(4.7), run(13.0))  # marginals 0.3 and 1.0 s per host
    text = bench.report(facts, noop, 9, [one, ten])
    assert "facts-only play (gather_facts): 12.00, 10.00, 11.00 s; median 11.00 s" in text
    assert "ratio no-op / facts-only: 2.00 (median over median; goal <= 2.00); best over best 2.20" in text
    assert "no-op recap: ok=14 changed=0 skipped=9" in text
    assert "(5 tasks listed, 3 took >= 0.3 s: a run on the host; sum 16.90 s)" in text
    lines = text.splitlines()
    assert any(line.startswith("  * Gathering Facts") and line.endswith("7.20 s") for line in lines)
    assert any(line.startswith("    gpuprov.kvm.host_model : Remember") for line in lines)  # not a module run
    assert fleet.table([one, ten]) in text
    # 11 + 999 x 0.3 and 22 + 999 x 1.0
    assert "projected to 1000 hosts at forks 10 (lab t(1) + 999 x the marginal of 10 hosts): " in text
    assert "facts-only 311 s, no-op 1021 s" in text
    assert "fleet" not in bench.report(facts, noop, 9, [])


def test_the_lab_must_be_up_and_its_overrides_are_passed(capsys) -> None:
    assert bench.lab_overrides('{"running": true, "inventory_overrides": {"ansible_port": 2600}}') == {
        "ansible_port": 2600
    }
    assert bench.lab_overrides('{"running": true, "inventory_overrides": null}') == {}
    for bad, says in (
        ('{"running": false}', "the lab host is not running: start it with `python -m dev.lab up`"),
        ("Traceback", "printed no JSON"),
        ("[1]", "no status object"),
    ):
        with pytest.raises(SystemExit) as exc:
            bench.lab_overrides(bad)
        assert exc.value.code == 2 and says in capsys.readouterr().err


def test_extra_vars_and_bad_options_exit_2(capsys) -> None:
    assert bench.extra_vars(["gpu_vms_check_consoles=false", "x=3", "y=text"]) == {
        "gpu_vms_check_consoles": False,
        "x": 3,
        "y": "text",
    }
    with pytest.raises(SystemExit) as exc:
        bench.extra_vars(["no-equals"])
    assert exc.value.code == 2 and "give KEY=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench.main(["--facts-runs", "0"])
    assert exc.value.code == 2 and "--facts-runs 0: give an integer >= 1" in capsys.readouterr().err


def test_a_no_op_run_that_changed_something_stops_the_bench(monkeypatch, capsys) -> None:
    changed = "lab-gpu-host : ok=14 changed=2 unreachable=0 failed=0 skipped=9\n"
    monkeypatch.setattr(bench, "ansible", lambda *a: (run(20.0, changed), 9))
    with pytest.raises(SystemExit) as exc:
        bench.interleaved([(Path("x.yml"), 1, "no-op", True)], {}, {})
    assert exc.value.code == 1 and "NOT A NO-OP" in capsys.readouterr().out
    # facts runs may report anything
    (facts,), _ = bench.interleaved([(Path("x.yml"), 2, "facts-only", False)], {}, {})
    assert facts.seconds == [20.0, 20.0]


def test_the_facts_and_no_op_runs_alternate(monkeypatch) -> None:
    order: list[str] = []

    def ansible(playbook: Path, *_: object) -> tuple[object, int]:
        order.append(playbook.name)
        return run(1.0), 9

    monkeypatch.setattr(bench, "ansible", ansible)
    plays = [(Path("facts.yml"), 3, "facts-only", False), (Path("noop.yml"), 2, "no-op", True)]
    (facts, noops), skips = bench.interleaved(plays, {}, {})
    assert order == ["facts.yml", "noop.yml", "facts.yml", "noop.yml", "facts.yml"]
    assert (len(facts.seconds), len(noops.seconds), skips) == (3, 2, [9, 9])
