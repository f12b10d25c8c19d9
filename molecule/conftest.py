"""Helpers for the molecule scenarios' testinfra tests (molecule/*/tests).

molecule's testinfra verifier runs pytest from the repo root with the scenario's
inventory and environment (MOLECULE_INVENTORY_FILE, MOLECULE_SCENARIO_DIRECTORY,
ANSIBLE_CONFIG for molecule's generated ansible.cfg), so a test can run the
scenario's converge.yml again, with other variables, in check mode or against a
scratch host root laid out by /usr/local/sbin/gpuprov-molecule-root (installed
by molecule/_shared/prepare.yml).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parent / "_shared"
SHARED_FILES = SHARED / "files"
# The scenarios' tests import the shared checks (molecule/_shared/role_checks.py) by name.
sys.path.insert(0, str(SHARED))


@dataclass
class PlaybookRun:
    """What one ansible-playbook run did to one host (from the json callback)."""

    rc: int
    stats: dict
    failed_msgs: list[str] = field(default_factory=list)
    changed_tasks: list[str] = field(default_factory=list)
    output: str = ""

    @property
    def changed(self) -> int:
        return self.stats.get("changed", 0)

    @property
    def failures(self) -> int:
        return self.stats.get("failures", 0) + self.stats.get("unreachable", 0)


def _result_msgs(result: dict) -> list[str]:
    msgs = []
    for key in ("msg", "stderr", "module_stderr"):
        if result.get(key):
            msgs.append(str(result[key]))
    for item in result.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            msgs.extend(_result_msgs(item))
    return msgs


def run_converge(
    hostname: str,
    extra_vars: dict | None = None,
    check: bool = False,
    inventory: str | None = None,
    timeout: float = 600,
) -> PlaybookRun:
    """Run this scenario's converge.yml on one instance; return what it did. ``inventory``: the
    scenario's inventory file by default (the lab scenarios give their linked inventory's folder)."""
    scenario = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
    playbook_bin = Path(sys.executable).with_name("ansible-playbook")
    cmd = [
        str(playbook_bin if playbook_bin.exists() else "ansible-playbook"),
        "-i",
        inventory or os.environ["MOLECULE_INVENTORY_FILE"],
        "--limit",
        hostname,
        str(scenario / "converge.yml"),
    ]
    if extra_vars:
        cmd += ["--extra-vars", json.dumps(extra_vars)]
    if check:
        cmd += ["--check", "--diff"]
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_FORCE_COLOR="0")
    # Only the JSON callback writes stdout: one enabled from the environment (profile_tasks, to time a
    # lab run) breaks the document read below (2026-11-28).
    for name in ("ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_CALLBACK_WHITELIST"):
        env.pop(name, None)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    output = f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    try:
        data = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        pytest.fail(f"ansible-playbook printed no JSON (rc {proc.returncode}):\n{output}")
    run = PlaybookRun(rc=proc.returncode, stats=data["stats"].get(hostname, {}), output=output)
    for play in data["plays"]:
        for task in play["tasks"]:
            result = task["hosts"].get(hostname)
            if not result:
                continue
            name = task["task"]["name"]
            if result.get("failed") and not result.get("ignore_errors"):
                run.failed_msgs.extend(_result_msgs(result) or [f"{name}: failed"])
            if result.get("changed"):
                run.changed_tasks.append(name)
    return run


def converge_killed_in(task: str, after: float = 3.0) -> bool:
    """Run this scenario's converge.yml with its linked inventory (the lab scenarios) and SIGKILL
    the controller's whole process group ``after`` seconds into ``task`` (issue #14: a run killed
    at a task boundary); False when the run ended without reaching it."""
    inventory = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    scenario = Path(os.environ["MOLECULE_SCENARIO_DIRECTORY"])
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", inventory, str(scenario / "converge.yml")]
    env = dict(
        os.environ,
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
        ANSIBLE_DISPLAY_SKIPPED_HOSTS="true",
        ANSIBLE_DISPLAY_OK_HOSTS="true",
        ANSIBLE_NOCOLOR="1",
    )
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("TASK [") and task in line:
            time.sleep(after)
            os.killpg(proc.pid, 9)
            proc.wait()
            return True
    proc.wait()
    return False


def lay_out_root(host, path: str) -> str:
    """Lay out a scratch host root at path from this instance's capture."""
    capture = host.ansible.get_variables()["gpuprov_molecule_capture"]
    host.run_expect([0], "/usr/local/sbin/gpuprov-molecule-root %s %s", capture, path)
    return path


def tree_digest(host, path: str, mtimes: bool = True) -> str:
    """One hash of every name, type, mode, link target, content (and mtime) under path."""
    fmt = "%y %p %m %l %T@\\n" if mtimes else "%y %p %m %l\\n"
    cmd = (
        f"cd {path} && {{ find . -printf '{fmt}' | LC_ALL=C sort; "
        "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum; } | sha256sum"
    )
    return host.check_output(cmd).split()[0]


def written_outside_root(host, root: str) -> list[str]:
    """Files changed after prepare outside the role's root and Ansible's own temp dirs."""
    out = host.check_output(
        "find / -xdev -newer /srv/prepared.stamp ! -type d "
        "! -path '/srv/*' ! -path '/tmp/*' ! -path '/var/tmp/*' ! -path '/root/.ansible/*' "
        "! -path '/proc/*' ! -path '/sys/*' ! -path '/dev/*' ! -path '/run/*' "
        "! -name '*.pyc' -print"
    )
    return [line for line in out.splitlines() if line and not line.startswith(root)]


@pytest.fixture
def hostname(host) -> str:
    """The instance's inventory name."""
    return host.backend.get_hostname()


@pytest.fixture
def hostvars(host) -> dict:
    """The instance's inventory variables (molecule.yml host_vars)."""
    return host.ansible.get_variables()


@pytest.fixture
def converge(hostname):
    """converge(extra_vars=None, check=False) -> PlaybookRun on this instance."""
    return lambda extra_vars=None, check=False: run_converge(hostname, extra_vars, check)


@pytest.fixture
def lab_converge(hostname):
    """lab_converge(extra_vars=None) -> PlaybookRun: the scenario's converge.yml on the lab host with its
    linked inventory (its folder: inventories/lab's hosts, group_vars and host_vars), as the lab
    scenarios run Ansible. A failed trial is two boots and a watchdog's wait under TCG: up to ten
    minutes on a busy machine."""
    inventory = os.path.dirname(os.environ["MOLECULE_INVENTORY_FILE"])
    return lambda extra_vars=None: run_converge(hostname, extra_vars, inventory=inventory, timeout=1800)


@pytest.fixture
def scratch_root(host):
    """scratch_root(path) lays out a fresh host root from this instance's capture."""
    return lambda path: lay_out_root(host, path)


@pytest.fixture
def digest(host):
    """digest(path, mtimes=True) -> one hash of the tree."""
    return lambda path, mtimes=True: tree_digest(host, path, mtimes)


@pytest.fixture
def outside_root(host):
    """outside_root(root) -> files written after prepare outside root (and Ansible's temp dirs)."""
    return lambda root: written_outside_root(host, root)


@pytest.fixture
def root_var() -> str:
    """The role's host-root variable: the scenario is named after its role (vfio_host -> vfio_host_root)."""
    return f"{os.environ['MOLECULE_SCENARIO_NAME']}_root"


@pytest.fixture
def root(hostvars, root_var) -> str:
    """The staged host root this instance's converge ran against."""
    return hostvars[root_var]


@pytest.fixture
def fresh_root(scratch_root):
    """fresh_root(path) -> a fresh host root like the one converge started from (a scenario may override)."""
    return scratch_root


@pytest.fixture
def shared_file():
    """shared_file(name) -> text of molecule/_shared/files/name (the stock files)."""
    return lambda name: (SHARED_FILES / name).read_text()
