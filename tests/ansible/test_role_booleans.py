"""Role booleans given the way people give them on the command line, ``-e name=false``: a
string. Every boolean role variable goes through ``| bool`` where the role decides on it, so
``false``/``no``/``0`` mean false, instead of ansible-core 2.19 stopping the play with
"Conditional result (True) was derived from value of type 'str'" (issue #11, category 5)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ansible.jsonplay import json_playbook_env
from tests.conftest import collections_path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = (
    "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles:\n    - role: gpuprov.kvm.iommu_host\n"
)


def role_booleans() -> dict[str, str]:
    """Every variable a role's argument spec types as bool -> its role."""
    found: dict[str, str] = {}
    for spec in REPO.glob("roles/*/meta/argument_specs.yml"):
        for entry in yaml.safe_load(spec.read_text())["argument_specs"].values():
            for name, option in entry.get("options", {}).items():
                if option.get("type") == "bool":
                    found[name] = spec.parts[-3]
    return found


def test_every_boolean_role_variable_is_read_through_bool() -> None:
    """Outside YAML keys and prose (``name: true``), each use of a boolean role variable in the
    roles' tasks, handlers and vars is ``name | bool`` (or a test for null)."""
    booleans = role_booleans()
    assert "iommu_host_allow_reboot" in booleans and len(booleans) >= 20
    unfiltered = []
    for path in sorted(REPO.glob("roles/*/*/*.yml")):
        if path.parent.name not in ("tasks", "handlers", "vars"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split(" #", 1)[0]
            for name in booleans:
                # A quoted name ('name') is a string, not a use of the variable.
                for m in re.finditer(rf"(?<![\w.'\"]){name}(?![\w'\"])", code):
                    rest = code[m.end() :]
                    # "is none": unset (null: the declaration's), not a truth value.
                    if not re.match(r"\s*(\|\s*bool\b|:|is\s+(not\s+)?none\b)", rest):
                        unfiltered.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert unfiltered == []


@pytest.fixture
def staged_root(host_root, tmp_path: Path) -> Path:
    """A host that owes a reboot for the IOMMU (an AMD VM with it off), with a GRUB defaults file."""
    root = tmp_path / "host"
    shutil.copytree(host_root("ci-host-no-iommu"), root, symlinks=True)
    (root / "etc/default").mkdir(parents=True, exist_ok=True)
    (root / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n')
    return root


def play(tmp_path: Path, root: Path, *extra: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    """The role in check mode on ``root``, with ``-e`` strings: (rc, task name -> result, output)."""
    collections_path()  # the checkout's collection, where ansible.cfg looks for it
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(playbook), "--check"]
    cmd += ["-e", f"iommu_host_root={root}", "-e", f"ansible_python_interpreter={sys.executable}"]
    for item in extra:
        cmd += ["-e", item]
    env = json_playbook_env()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    output = f"$ {' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    try:
        data = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        pytest.fail(f"ansible-playbook printed no JSON (rc {proc.returncode}):\n{output}")
    tasks = {
        t["task"]["name"].split(" : ", 1)[-1]: t["hosts"].get("localhost", {})
        for p in data["plays"]
        for t in p["tasks"]
    }
    return proc.returncode, tasks, output


def test_false_as_a_string_stops_for_the_owed_reboot(tmp_path: Path, staged_root: Path) -> None:
    rc, tasks, output = play(tmp_path, staged_root, "iommu_host_allow_reboot=false")
    assert "derived from value of type" not in output
    stop = tasks["Stop here when a reboot is owed and not allowed"]
    assert rc == 2 and stop.get("failed") and stop["msg"].startswith("reboot required"), output
    assert (staged_root / "etc/default/grub").read_text().startswith('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')


def test_booleans_as_strings_mean_what_they_say(tmp_path: Path, staged_root: Path) -> None:
    rc, tasks, output = play(
        tmp_path,
        staged_root,
        "iommu_host_allow_reboot=no",
        "iommu_host_fail_on_pending_reboot=0",
        "iommu_host_passthrough=False",
        '{"iommu_host_extra_args": ["pcie_aspm=off"]}',
    )
    assert rc == 0 and "derived from value of type" not in output, output
    cmdline = tasks["Turn the IOMMU on at boot (a change of the kernel arguments is tried once first)"]
    assert cmdline["args_after"] == "quiet pcie_aspm=off" and cmdline["reboot_required"] is True
    # a reboot is owed and not allowed: only fail_on_pending_reboot "0" lets the play go on
    assert tasks["Stop here when a reboot is owed and not allowed"].get("skipped"), output
    reboot = next(v for k, v in tasks.items() if k.startswith("Reboot ("))
    assert reboot.get("skipped"), output
