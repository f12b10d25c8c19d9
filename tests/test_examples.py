"""Every example the project ships plans cleanly against the capture shipped for it (issue #50, item 4):
inventories/example's hosts through ``-i``, and the README's host_vars file, read from the files
themselves, against inventories/example-captures/ (built by tests/examplehosts.py, as a newcomer finds
them beside the example)."""

from __future__ import annotations

import json
import re
import sys
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


def test_the_host_stage_dry_runs_against_a_capture(tmp_path: Path) -> None:
    """The playbook's host stage in check mode against a capture (no host at all): gpuprov_root gives every
    role the staged root; it shows the changes a real host would get and changes nothing (issue #50, item 6)."""
    import os
    import subprocess

    from gpuprov.cli import rootfs
    from tests.conftest import collections_path, tree_digest

    root = tmp_path / "root"
    root.mkdir()
    rootfs.unpack(str(examplehosts.CAPTURES / "gpu-node-01.tar.gz"), str(root))
    before = tree_digest(root)
    collections_path()
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(EXAMPLE),
        "gpuprov.kvm.hosts",
        "--check",
        "--diff",
        "-l",
        "gpu-node-01",
        "-c",
        "local",
        "-e",
        f"gpuprov_root={root}",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "failed=0" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0000:41:00.0/driver_override" in proc.stdout and "vfio_pci" in proc.stdout  # what a host would get
    assert tree_digest(root) == before
