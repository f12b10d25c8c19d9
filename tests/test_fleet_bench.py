"""dev/bench/fleet.py: its arithmetic, inventory and output parsing, its SSH members' commands, a tiny real run."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dev.bench import netns_members as members
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
        assert h["gpuprov_host"] == {
            "version": 1,
            "gpus": [{"name": "gpu", "address": "0000:01:00.0", "use": "passthrough"}],
        }


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


# --members ssh: dev/bench/netns_members.py, the commands and files it makes (no root needed).


def test_each_member_has_its_own_namespace_veth_and_address() -> None:
    assert members.names(1) == ("gpf-m0001", "gpf-h0001")
    assert all(len(name) <= 15 for name in members.names(9999))  # the kernel's interface name limit
    assert members.address(1) == "10.213.0.2"  # the bridge has 10.213.0.1
    assert members.address(200) == "10.213.0.201"
    assert members.address(300) == "10.213.1.45"
    assert len({members.address(i) for i in range(1, 1001)}) == 1000
    for bad in (0, 65534):
        with pytest.raises(ValueError):
            members.address(bad)


def test_the_network_batch_makes_a_bridge_and_a_veth_pair_into_each_namespace() -> None:
    up = members.network_up(2).splitlines()
    assert up[:3] == ["link add gpf-br0 type bridge", "addr add 10.213.0.1/16 dev gpf-br0", "link set gpf-br0 up"]
    assert up[3:] == [
        "netns add gpf-m0001",
        "link add gpf-h0001 type veth peer name eth0 netns gpf-m0001",
        "link set gpf-h0001 master gpf-br0 up",
        "netns add gpf-m0002",
        "link add gpf-h0002 type veth peer name eth0 netns gpf-m0002",
        "link set gpf-h0002 master gpf-br0 up",
    ]
    assert members.member_link(2).splitlines() == [
        "link set lo up",
        "addr add 10.213.0.3/16 dev eth0",
        "link set eth0 up",
    ]
    # The teardown deletes whatever the set-up added, the bridge last.
    down = members.network_down(2).splitlines()
    made = {" ".join(line.split()[:3]) for line in up if " add " in f" {line} "}
    deleted = {line.replace(" del ", " add ") for line in down}
    assert made - {"addr add 10.213.0.1/16"} == deleted
    assert down[-1] == "link del gpf-br0"


def test_each_sshd_runs_in_its_namespace_on_its_address_with_the_bench_keys(tmp_path: Path) -> None:
    cmd = members.sshd_command(3, tmp_path / "sshd_config")
    assert cmd[:4] == ["ip", "netns", "exec", "gpf-m0003"]
    assert cmd[4] == members.SSHD and "-D" in cmd  # foreground: its pid is the bench's to end
    assert cmd[-2:] == ["-o", "ListenAddress=10.213.0.4"]
    config = dict(line.split(" ", 1) for line in members.sshd_config(tmp_path).splitlines())
    assert config["HostKey"] == str(tmp_path / "host_key")
    assert config["AuthorizedKeysFile"] == str(tmp_path / "authorized_keys")
    assert config["PasswordAuthentication"] == "no" and config["KbdInteractiveAuthentication"] == "no"
    assert config["PermitRootLogin"] == "prohibit-password"


def test_an_ssh_member_in_the_inventory_keeps_its_root_and_uses_the_system_python(tmp_path: Path) -> None:
    """What ansible-inventory makes of the bench's inventory with SSH members."""
    inv = tmp_path / "inventory.yml"
    key = tmp_path / "client_key"
    roots = [tmp_path / "r1", tmp_path / "r2"]
    inv.write_text(
        json.dumps(fleet.inventory(roots, "0000:01:00.0", sys.executable, lambda i: members.connection(i, key)))
    )
    env = {k: v for k, v in fleet._env().items() if k != "ANSIBLE_CALLBACKS_ENABLED"}
    tool = fleet.PLAYBOOK.with_name("ansible-inventory")
    proc = subprocess.run([str(tool), "-i", str(inv), "--list"], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    hostvars = json.loads(proc.stdout)["_meta"]["hostvars"]
    for i, (name, root) in enumerate(zip(("fleet0001", "fleet0002"), roots, strict=True), 1):
        host = hostvars[name]
        assert host["ansible_connection"] == "ssh" and host["ansible_host"] == members.address(i)
        assert host["ansible_user"] == "root" and host["ansible_ssh_private_key_file"] == str(key)
        assert host["ansible_python_interpreter"] == "/usr/bin/python3"
        assert "UserKnownHostsFile=/dev/null" in host["ansible_ssh_common_args"]
        assert host["gpuprov_root"] == str(root)


def test_ssh_members_say_what_the_machine_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(members.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(members.shutil, "which", lambda _tool: None)
    said = members.missing()
    assert said[0].startswith("run as root")
    assert said[1] == "apt-get install iproute2 openssh-client openssh-server"
    assert "ssh to its own network namespace" in fleet.lab_line(None, members="ssh")
    assert "ansible_connection local" in fleet.lab_line(None)


# sshd -t wants its privilege separation dir: made here as the bench makes it (as root; scripts/
# bootstrap.sh installs openssh-server for the tests, whose service may not run in a container).
@pytest.mark.skipif(
    not Path(members.SSHD).exists() or (os.geteuid() != 0 and not Path("/run/sshd").is_dir()),
    reason="needs sshd (apt-get install openssh-server) and /run/sshd or root",
)
def test_sshd_accepts_the_members_config(tmp_path: Path) -> None:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "host_key")], check=True)
    (tmp_path / "sshd_config").write_text(members.sshd_config(tmp_path))
    proc = subprocess.run(
        [members.SSHD, "-t", "-f", str(tmp_path / "sshd_config")], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_the_cpu_split_puts_the_members_side_apart() -> None:
    def run(cpu: float, on_members: float) -> Any:
        return fleet.PlayRun(1.0, {"hosts": 1}, cpu=cpu, member_cpu=on_members)

    one = fleet.Point(1, 10, run(1.0, 0.5), run(1.0, 0.5), report=run(1.0, 0.5))
    ten = fleet.Point(10, 10, run(10.0, 5.0), run(19.0, 10.0), report=run(10.9, 5.9))
    # facts: controller (5 - 0.5) / 9 = 0.5, members (5 - 0.5) / 9 = 0.5; report: (5 - 0.5) / 9, (5.9 - 0.5) / 9
    assert (
        fleet.cpu_split([one, ten]).splitlines()[1]
        == "  10 hosts, forks 10: 0.500 + 0.500 / 0.500 + 0.600 / 0.944 + 1.056"
    )


def test_children_lists_a_process_s_live_children() -> None:
    with subprocess.Popen(["sleep", "30"]) as child:
        try:
            assert child.pid in members.children(os.getpid())
        finally:
            child.kill()
    assert child.pid not in members.children(os.getpid())
    assert members.children(2**22 + 1) == []  # no such process
