"""Role host_model resolves the declaration once per run: each play of gpu_passthrough.yml pulls
it in (a dependency of vfio_host, vgpu_host and gpu_vms), and later plays reuse gpuprov_model
without another module run; another root is resolved again (issue #14)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ansible.jsonplay import json_playbook_env
from tests.conftest import REPO, collections_path

RESOLVE = "Resolve the host's declaration against its facts"


def two_plays(second_root: str) -> list[dict]:
    def one(name: str, root: str) -> dict:
        return {
            "name": name,
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"host_model_root": root},
            "roles": [{"role": "gpuprov.kvm.host_model"}],
            "tasks": [{"name": f"{name}: the model", "ansible.builtin.debug": {"var": "gpuprov_model.vfio_devices"}}],
        }

    return [one("first", "{{ first_root }}"), one("second", second_root)]


def run(tmp_path: Path, plays: list[dict], first: Path) -> list[tuple[str, dict]]:
    collections_path()
    playbook = tmp_path / "play.yml"
    playbook.write_text(json.dumps(plays))
    host = {"version": 1, "gpus": [{"name": "gpu", "address": "0000:01:00.0", "use": "passthrough"}]}
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(playbook)]
    cmd += [
        "-e",
        json.dumps({"gpuprov_host": host, "first_root": str(first), "ansible_python_interpreter": sys.executable}),
    ]
    env = json_playbook_env()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        data = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        pytest.fail(
            f"ansible-playbook printed no JSON (rc {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        )
    assert proc.returncode == 0, proc.stdout[-3000:]
    return [(t["task"]["name"].split(" : ", 1)[-1], t["hosts"]["localhost"]) for p in data["plays"] for t in p["tasks"]]


@pytest.fixture
def roots(host_root, tmp_path: Path) -> tuple[Path, Path]:
    pair = (tmp_path / "a", tmp_path / "b")
    for root in pair:
        shutil.copytree(host_root("gpu-audio"), root, symlinks=True)
    return pair


def test_the_second_play_reuses_the_model_and_another_root_is_resolved_again(tmp_path: Path, roots) -> None:
    first, other = roots
    tasks = run(tmp_path, two_plays("{{ first_root }}"), first)
    resolved = [result for name, result in tasks if name == RESOLVE]
    assert [r.get("skipped", False) for r in resolved] == [False, True]
    models = [result["gpuprov_model.vfio_devices"] for name, result in tasks if name.endswith(": the model")]
    assert models == [["0000:01:00.0"], ["0000:01:00.0"]]  # the second play still has it
    again = run(tmp_path, two_plays(str(other)), first)
    assert [r.get("skipped", False) for name, r in again if name == RESOLVE] == [False, False]


def test_vfio_host_resolves_the_declaration_in_vfio_binds_own_run(tmp_path: Path, roots) -> None:
    # issue #14: one module run for the model and the binding, and the roles after it reuse the model.
    first, _ = roots
    play = {
        "name": "hosts",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"host_model_root": "{{ first_root }}", "vfio_host_root": "{{ first_root }}"},
        "roles": [{"role": "gpuprov.kvm.vfio_host"}, {"role": "gpuprov.kvm.host_model"}],
        "tasks": [{"name": "hosts: the model", "ansible.builtin.debug": {"var": "gpuprov_model.vfio_devices"}}],
    }
    tasks = run(tmp_path, [{**play, "check_mode": True}], first)
    resolved = [result for name, result in tasks if name == RESOLVE]
    assert resolved and all(r.get("skipped") for r in resolved)  # gpu_host_model never ran
    (bind,) = [result for name, result in tasks if name.startswith("Bind the devices to vfio-pci")]
    assert bind["ansible_facts"]["gpuprov_model"]["vfio_devices"] == ["0000:01:00.0"]
    assert "0000:01:00.0" in bind["devices"] and any(line.startswith("would ") for line in bind["plan"])
    assert [r["gpuprov_model.vfio_devices"] for name, r in tasks if name == "hosts: the model"] == [["0000:01:00.0"]]


def hosts_stage(root: str) -> dict:
    """playbooks/hosts.yml's roles after the IOMMU (a staged root owes a reboot: iommu_boot always runs)."""
    return {
        "name": "hosts",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "vars": {"host_model_root": root, "vfio_host_root": root, "vgpu_host_root": root},
        "roles": [
            {"role": "gpuprov.kvm.host_plan"},
            {"role": "gpuprov.kvm.vfio_host"},
            {"role": "gpuprov.kvm.vgpu_host"},
            {"role": "gpuprov.kvm.host_model"},
        ],
    }


BIND = "Bind the devices to vfio-pci (or give them back)"
VGPU = "Give each GPU its vGPU instances (mdevctl installed first where an mdev entry needs it)"


def test_a_converged_host_runs_one_module_and_a_change_reopens_the_rest(tmp_path: Path, roots) -> None:
    # issue #14 (docs/concepts/plan-gate.md): the roles skip what host_plan planned with nothing to do.
    first, _ = roots
    ran = run(tmp_path, [hosts_stage("{{ first_root }}")], first)
    by_name = dict(ran)
    assert (
        by_name[BIND]["changed"] is True
        and "vfio_bind"
        in by_name["Plan the host-side concerns ahead (a converged host runs no other module)"]["pending"]
    )
    assert not by_name[VGPU].get("skipped")  # its module ran after a change
    assert by_name[RESOLVE].get("skipped")  # host_plan resolved the model: no gpu_host_model run

    again = dict(run(tmp_path, [hosts_stage("{{ first_root }}")], first))
    assert again[BIND].get("skipped") and again[VGPU].get("skipped")  # one module run: gpu_host_plan's
    assert again[RESOLVE].get("skipped")

    # The binding's udev rule removed: vfio_bind runs and changes it, and gpu_vgpu after it runs too.
    (first / "etc/udev/rules.d/61-gpuprov-vfio.rules").unlink()
    reopened = dict(run(tmp_path, [hosts_stage("{{ first_root }}")], first))
    assert reopened[BIND]["changed"] is True and not reopened[VGPU].get("skipped")
