"""playbooks/: one playbook per stage (hosts.yml, vms.yml, guests.yml) that gpu_passthrough.yml
imports, tags per concern across them, the guest stage on its own (for sites whose VMs
another tool manages), and the old name gpu-passthrough.yml for one release. Listed with
ansible-playbook against the checkout's collection."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import collections_path

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
# concern tag -> the role (or module) whose tasks carry it
CONCERNS = {
    "iommu": "gpuprov.kvm.iommu_host",
    "vfio": "gpuprov.kvm.vfio_host",
    "vgpu": "gpuprov.kvm.vgpu_host",
    "vms": "gpuprov.kvm.gpu_vms",
    "guest_driver": "gpuprov.kvm.guest_nvidia_driver",
    "containers": "gpuprov.kvm.guest_container_toolkit",
    "sharing": "gpuprov.kvm.guest_gpu_sharing",
    "verify": None,  # gpu_passthrough's own post_tasks (module gpu_verify)
}
GUESTS = "{{ groups['gpu_guests'] | default([]) }}"  # no pattern warning where the group is not (yet) there
STAGES = {"hosts.yml": ["gpu_hosts"], "vms.yml": ["gpu_hosts"], "guests.yml": [GUESTS]}
# An inventory with both groups, so that every play lists its tasks.
INVENTORY = "all:\n  children:\n    gpu_hosts:\n      hosts: {h1: {}}\n    gpu_guests:\n      hosts: {g1: {}}\n"


def ansible_playbook(tmp_path: Path, playbook: str, *args: str) -> str:
    collections_path()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [str(PLAYBOOK), "-i", str(inventory), f"playbooks/{playbook}", *args]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def listed_tasks(out: str) -> list[tuple[str, set[str]]]:
    """(task name, its tags) of ``--list-tasks`` output."""
    tasks = []
    for line in out.splitlines():
        m = re.match(r"\s{6}(\S.*?)\tTAGS: \[(.*)\]$", line)
        if m:
            tasks.append((m[1], {t.strip() for t in m[2].split(",") if t.strip()}))
    return tasks


def test_gpu_passthrough_imports_one_playbook_per_stage_with_todays_play_settings() -> None:
    main = yaml.safe_load((REPO / "playbooks/gpu_passthrough.yml").read_text())
    assert [p["ansible.builtin.import_playbook"] for p in main] == list(STAGES)
    for stage, hosts in STAGES.items():
        plays = yaml.safe_load((REPO / "playbooks" / stage).read_text())
        assert [p["hosts"] for p in plays] == hosts
        for play in plays:
            assert play["serial"] == "{{ gpuprov_serial | default('25%') }}"
            assert play["max_fail_percentage"] == "{{ gpuprov_max_fail_percentage | default(0) }}"
            assert play["become"] is True


def test_a_correct_inventory_of_hosts_alone_gets_no_warning(tmp_path: Path) -> None:
    """Guests are added by vms.yml at run time (or not at all): the guests' play must not warn then."""
    inventory = tmp_path / "hosts-only.yml"
    inventory.write_text("all:\n  children:\n    gpu_hosts:\n      hosts: {h1: {}}\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    cmd = [str(PLAYBOOK), "-i", str(inventory), "playbooks/gpu_passthrough.yml", "--list-hosts"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "WARNING" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_every_concern_has_its_tag(tmp_path: Path) -> None:
    out = ansible_playbook(tmp_path, "gpu_passthrough.yml", "--list-tags")
    listed = set()
    for line in out.splitlines():
        m = re.search(r"TASK TAGS: \[(.*)\]", line)
        if m:
            listed |= {t.strip() for t in m[1].split(",")}
    assert set(CONCERNS) <= listed, set(CONCERNS) - listed
    tasks = listed_tasks(ansible_playbook(tmp_path, "gpu_passthrough.yml", "--list-tasks"))
    for tag, role in CONCERNS.items():
        if role:
            mine = [tags for name, tags in tasks if name.startswith(f"{role} : ")]
            assert mine and all(tag in tags for tags in mine), (tag, mine)
    assert [name for name, tags in tasks if "verify" in tags] == [
        "Check the driver, the GPUs, their links, the runtimes and a GPU container (gpuprov verify)",
        "Show the checks",
    ]


@pytest.mark.parametrize("tag", ["guest_driver", "iommu"])
def test_a_tag_selects_only_its_concerns_tasks(tmp_path: Path, tag: str) -> None:
    tasks = listed_tasks(ansible_playbook(tmp_path, "gpu_passthrough.yml", "--list-tasks", "--tags", tag))
    role = CONCERNS[tag]
    # Ansible's own argument-spec check of each role is tagged always: it runs with any --tags, changes nothing.
    chosen = [(name, tags) for name, tags in tasks if "Validating arguments against arg spec" not in name]
    # The host-side concerns are planned ahead by host_plan and drained around by host_drain
    # (docs/guides/rolling.md), which run with any of their tags.
    around = ("gpuprov.kvm.host_plan : ", "gpuprov.kvm.host_drain : ", "Start the drained VMs again")
    planned = [name for name, tags in chosen if name.startswith(around)]
    assert bool(planned) == (tag in ("iommu", "vfio", "vgpu")), planned
    chosen = [(name, tags) for name, tags in chosen if name not in planned]
    assert len(chosen) > 3
    assert all(name.startswith(f"{role} : ") and tag in tags for name, tags in chosen), chosen


def test_the_old_hyphenated_name_still_runs_the_whole_flow(tmp_path: Path) -> None:
    """gpu-passthrough.yml (no valid FQCN name) is kept for one release: it imports gpu_passthrough.yml."""
    old = yaml.safe_load((REPO / "playbooks/gpu-passthrough.yml").read_text())
    assert [p["ansible.builtin.import_playbook"] for p in old] == ["gpu_passthrough.yml"]
    # Both listed by one ansible-playbook run: "playbook: NAME" heads each one's tasks.
    out = ansible_playbook(tmp_path, "gpu-passthrough.yml", "playbooks/gpu_passthrough.yml", "--list-tasks")
    old_tasks, new_tasks = out.split("\nplaybook: playbooks/gpu_passthrough.yml\n")
    assert listed_tasks(old_tasks) == listed_tasks(new_tasks) and len(listed_tasks(new_tasks)) > 20


def test_the_guest_stage_runs_on_its_own(tmp_path: Path) -> None:
    ansible_playbook(tmp_path, "guests.yml", "--syntax-check")
    tasks = listed_tasks(ansible_playbook(tmp_path, "guests.yml", "--list-tasks"))
    roles = {name.split(" : ")[0] for name, _tags in tasks if " : " in name}
    assert roles == {CONCERNS["guest_driver"], CONCERNS["containers"], CONCERNS["sharing"]}
