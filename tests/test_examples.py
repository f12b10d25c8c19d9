"""Every example the project ships plans cleanly against the capture shipped for it (issue #50, item 4):
inventories/example's hosts through ``-i``, and the README's host_vars file, read from the files
themselves, against inventories/example-captures/ (built by tests/examplehosts.py, as a newcomer finds
them beside the example)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuprov.cli.main import main
from tests import examplehosts

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "inventories" / "example"


def plan(capsys, *argv: str) -> tuple[int, dict]:
    code = main(["plan", "--json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {"err": err}


@pytest.mark.parametrize("host", sorted(examplehosts.HOSTS))
def test_the_example_inventory_plans_against_its_capture(capsys, host: str) -> None:
    capture = examplehosts.CAPTURES / f"{host}.tar.gz"
    code, report = plan(capsys, "--root", str(capture), "-i", str(EXAMPLE), "--host", host)
    assert code == 0 and report["ok"] and not report["refusals"], report
    assert report["vms"]


def test_the_readme_host_vars_plans_against_its_capture(capsys, tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    block = re.search(r"```yaml\n(# host_vars/gpu-node-01\.yml\n.*?)```", readme, re.S)
    assert block, "the README's host_vars example is gone"
    path = tmp_path / "gpu-node-01.yml"
    path.write_text(block.group(1))
    code, report = plan(capsys, "--root", str(examplehosts.CAPTURES / "gpu-node-01.tar.gz"), str(path))
    assert code == 0 and report["ok"], report
    assert [vm["name"] for vm in report["vms"]] == ["train-01", "infer-01", "infer-02"]


@pytest.mark.parametrize("host", sorted(examplehosts.HOSTS))
def test_the_shipped_captures_are_what_the_builder_makes(capsys, tmp_path: Path, host: str) -> None:
    examplehosts.write_captures(tmp_path)
    shipped = plan(capsys, "--root", str(examplehosts.CAPTURES / f"{host}.tar.gz"), "-i", str(EXAMPLE), "--host", host)
    built = plan(capsys, "--root", str(tmp_path / f"{host}.tar.gz"), "-i", str(EXAMPLE), "--host", host)
    for _code, report in (shipped, built):
        report.pop("root", None)
    assert shipped == built, "rebuild them: python -m tests.examplehosts"
