"""The fleet figures: a facts-only play against a no-op converge and the fleet report, on N hosts.

Each fake host is an inventory entry with ``ansible_connection: local`` (or, with ``--members
ssh``, a host of its own reached over SSH, below) and its own staged root: a copy of a real
capture (``tests/fixtures/hosts``, unpacked by the CLI's own safe reader) plus a GRUB defaults
file that already holds the IOMMU arguments. In the same run, over the same hosts and forks,
three plays are timed (``time.perf_counter`` around ``ansible-playbook``, and the per-task
profile of ``ansible.posix.profile_tasks``):

* facts-only: ``gpuprov.kvm.gpu_host_facts`` on the staged root;
* no-op converge, the host stage of ``playbooks/hosts.yml``: ``gpu_host_plan`` plans
  ``iommu_boot``, ``vfio_bind`` (a ``gpuprov_host`` declaring the capture's GPU ``use:
  passthrough``) and ``gpu_vgpu`` (an empty layout) ahead, each with ``root`` the staged root,
  and each module runs only where that plan found something to do (as the roles do,
  docs/concepts/plan-gate.md). The roots are converged once, unmeasured, first; the measured
  run must change nothing (else exit 1);
* the fleet report, the playbook ``gpuprov.kvm.fleet_report`` (one ``gpu_fleet_facts`` run per
  host: the declaration resolved, each GPU judged, drift and health read; docs/guides/fleet.md).
  Each staged root is a converged host for it (the GPU bound to vfio-pci, GRUB configuring the
  arguments the capture booted with) with a kernel log of ``--kernel-log-kib`` to read, as a
  real host's ``/dev/kmsg``; the run must find every host converged (else exit 1).

Per forks it prints t(N), the ratio, the per-host marginal cost (t(N) - t(1)) / (N - 1) and
the projection t(1) + 999 x marginal to 1,000 hosts; then the three plays of the same run side by
side: t(N) of each, each one's per-host marginal cost (wall, and CPU: user + system of the run's
processes, steadier on a shared machine), the report's and the no-op converge's marginal against
the facts-only play's, and the projections to 1,000 and 10,000 hosts
(docs/development/benchmarks.md); and whether the report met the goal of issue #30 (its per-host
cost within 1.2x the facts-only play's) at the largest fleet measured. It says how long each
size's runs took.

``--members ssh`` reaches each staged host as a remote host instead: its own network namespace on
a bridge, with its own sshd and address, over real SSH (pipelining, a fresh connection per host
each play, ``/usr/bin/python3`` on the member; dev/bench/netns_members.py says how and why, and
tears it all down at the end, error or interrupt included). Root, iproute2 and openssh-server
are needed (it says what is missing). The module still reads the member's staged root. The CPU
figures then hold the controller's side (ansible-playbook and its ssh masters, which the bench
reaps) and the members' (each sshd and what it ran: the shells and modules), and a line splits
each play's per-host CPU into the two.

``--lab`` adds the lab host (``python -m dev.lab up``, which this bench never starts or stops) as
one real member, over SSH, of the facts-only and report plays: ``-i inventories/lab`` (its
host_vars declare it) and the ``-e`` overrides ``python -m dev.lab status --json`` names. Not of
the no-op converge, whose options name the staged roots. Every run says whether the lab host is
in it.

    python dev/bench/fleet.py                          # 1, 10, 50, 200 hosts at forks 10 and 50
    python dev/bench/fleet.py --hosts 1,10 --forks 10
    python dev/bench/fleet.py --no-report              # the no-op figures alone, as before
    python dev/bench/fleet.py --lab                    # the lab host as one more member
    python dev/bench/fleet.py --members ssh            # each host over SSH, in its own namespace
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parents[1]
sys.path.insert(0, str(REPO))

from dev.bench.netns_members import MEMBER_PYTHON, MembersRefused, SshMembers  # noqa: E402

HOSTS = REPO / "tests" / "fixtures" / "hosts"
PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
FLEET_SIZE = 1000
FLEET_SIZES = (1000, 10000)  # the report's projections
REPORT_GOAL = 1.2  # the report's per-host cost against the facts-only play's (issue #30)
LAB_INVENTORY = REPO / "inventories" / "lab"
LAB_HOST = "lab-gpu-host"
# The IOMMU arguments iommu_host sets on an Intel host; the staged GRUB file already has them.
KERNEL_ARGUMENTS = ["intel_iommu=on", "iommu=pt"]
GRUB = (
    "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
    f'GRUB_CMDLINE_LINUX_DEFAULT="quiet {" ".join(KERNEL_ARGUMENTS)}"\nGRUB_CMDLINE_LINUX=""\n'
)

FACTS_PLAY = [
    {
        "name": "facts only",
        "hosts": "all",
        "gather_facts": False,
        # The lab host (--lab) has no gpuprov_root: its own root.
        "tasks": [
            {"name": "gpu_host_facts", "gpuprov.kvm.gpu_host_facts": {"root": "{{ gpuprov_root | default('/') }}"}}
        ],
    }
]
# Each concern's options in one place, as the roles keep them in their vars/main.yml: the gate task
# plans them ahead and the module task passes the same variable (docs/concepts/plan-gate.md).
CONCERN_OPTIONS = {
    # As role iommu_host does (its IOMMU arguments are already in the staged GRUB file).
    "iommu_boot": {"root": "{{ gpuprov_root }}"},
    # As role vfio_host does: the declaration resolved in vfio_bind's own run (issue #14).
    "vfio_bind": {"host": "{{ gpuprov_host }}", "root": "{{ gpuprov_root }}"},
    "gpu_vgpu": {"gpus": {}, "root": "{{ gpuprov_root }}"},
}


def _options_var(concern: str) -> str:
    """The play variable holding the concern's options (a role's ``__<role>_options``)."""
    return f"fleet_{concern}"


def _digest(concern: str) -> str:
    """The Jinja expression of the concern's digest, computed alike by the gate and the module task."""
    return f"{_options_var(concern)} | string | hash('sha1')"


def _gated(concern: str) -> dict[str, Any]:
    """The concern's module, skipped when the plan found its options converged, as each role does. (A
    role also forgets every verdict once its module changed something; a measured run changes
    nothing, and a module that did would make it exit 1.)"""
    return {
        "name": concern,
        f"gpuprov.kvm.{concern}": {key: f"{{{{ {_options_var(concern)}.{key} }}}}" for key in CONCERN_OPTIONS[concern]},
        "when": f"({_digest(concern)}) not in fleet_converged",
    }


# The host stage of playbooks/hosts.yml on a staged root: role host_plan's one planning run, then
# each role's module only where the plan found something to do. A converged host runs one module.
CONVERGE_PLAY = [
    {
        "name": "no-op converge",
        "hosts": "all",
        "gather_facts": False,
        "vars": {_options_var(concern): options for concern, options in CONCERN_OPTIONS.items()},
        "tasks": [
            {
                "name": "gpu_host_plan",
                "gpuprov.kvm.gpu_host_plan": {
                    "concerns": {
                        concern: {
                            "options": f"{{{{ {_options_var(concern)} }}}}",
                            "digest": f"{{{{ {_digest(concern)} }}}}",
                        }
                        for concern in CONCERN_OPTIONS
                    }
                },
                "register": "fleet_plan",
            },
            {"name": "verdicts", "ansible.builtin.set_fact": {"fleet_converged": "{{ fleet_plan.converged }}"}},
            *(_gated(concern) for concern in CONCERN_OPTIONS),
        ],
    }
]

# "h7   : ok=4    changed=0    unreachable=0    failed=0 ..." (the default callback's recap)
RECAP_RE = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
# profile_tasks' recap: "gpu_host_facts ------------------------ 1.62s". The dashes pad the name
# and the time to fixed widths: a long name with a time of 10 s or more gets only "-- 12.35s".
PROFILE_RE = re.compile(r"^(.+?) -+ (\d+(?:\.\d+)?)s$", re.M)


@dataclass
class PlayRun:
    seconds: float
    recap: dict[str, int]
    profile: list[tuple[str, float]] = field(default_factory=list)
    cpu: float = float("nan")  # CPU seconds (user + system) of the run's processes: steadier than wall time under load
    member_cpu: float = 0.0  # the part of ``cpu`` on the members' side (--members ssh: sshd and the modules)
    lab_status: str | None = None  # the lab host's status in the report (--lab)


@dataclass
class Point:
    hosts: int
    forks: int
    facts: PlayRun
    noop: PlayRun
    # The run these figures come from, when forks >= hosts made it the same as another forks.
    same_as_forks: int | None = None
    report: PlayRun | None = None  # the fleet report's play (None: --no-report)
    took: float = 0.0  # wall seconds of this size's measured runs together

    @property
    def ratio(self) -> float:
        return self.noop.seconds / self.facts.seconds if self.facts.seconds else float("nan")


def refuse(message: str) -> NoReturn:
    """Bad input: the message (naming the option and the fix) on stderr, exit 2, no traceback."""
    print(f"fleet.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def marginal(t_n: float, t_1: float, n: int) -> float:
    """Per-host marginal cost: (t(N) - t(1)) / (N - 1); NaN for N = 1."""
    return (t_n - t_1) / (n - 1) if n > 1 else float("nan")


def projection(t_1: float, per_host: float, fleet: int = FLEET_SIZE) -> float:
    """t(1) + (fleet - 1) x marginal: the run time on ``fleet`` hosts, at the same forks."""
    return t_1 + (fleet - 1) * per_host


def not_a_noop(run: PlayRun, hosts: int) -> str | None:
    """The loud message when a measured converge changed anything: its figures are not a no-op's."""
    if not run.recap["changed"]:
        return None
    return (
        f"\n!!! NOT A NO-OP: the measured converge on {hosts} hosts changed {run.recap['changed']} "
        "task result(s): its figures are not a no-op run's\n"
    )


def parse_counts(text: str, option: str) -> list[int]:
    """``"1,10,50"`` -> [1, 10, 50]; exit 2 naming the option on anything else."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        refuse(f"{option} {text!r}: give positive integers separated by commas, e.g. 1,10,50")
    return values


def declaration(gpu: str) -> dict[str, Any]:
    """The ``gpuprov_host`` of every fake host: the capture's GPU, whole, to VMs."""
    return {"version": 1, "gpus": [{"name": "gpu", "address": gpu, "use": "passthrough"}]}


def inventory(
    roots: list[Path], gpu: str, python: str, connection: Callable[[int], dict[str, str]] | None = None
) -> dict[str, Any]:
    """One inventory entry per staged root: local connection (else ``connection(i)``'s variables,
    i from 1: --members ssh), its root, its declaration."""
    hosts = {
        f"fleet{i:04d}": {
            "ansible_connection": "local",
            "ansible_python_interpreter": python,
            **(connection(i) if connection else {}),
            "gpuprov_root": str(root),
            "gpuprov_host": declaration(gpu),
        }
        for i, root in enumerate(roots, 1)
    }
    return {"all": {"hosts": hosts}}


def recap_totals(text: str) -> dict[str, int]:
    """Sums of the PLAY RECAP counters over hosts, plus the number of hosts it lists."""
    totals = {"hosts": 0, "ok": 0, "changed": 0, "unreachable": 0, "failed": 0}
    for m in RECAP_RE.finditer(text):
        totals["hosts"] += 1
        for key, value in zip(("ok", "changed", "unreachable", "failed"), m.groups()[1:], strict=True):
            totals[key] += int(value)
    return totals


def task_profile(text: str) -> list[tuple[str, float]]:
    """profile_tasks' recap: (task, seconds) in task order."""
    recap = text.rsplit("TASKS RECAP", 1)[-1] if "TASKS RECAP" in text else ""
    return [(name.strip(), float(s)) for name, s in PROFILE_RE.findall(recap)]


def kernel_log(kib: int) -> str:
    """A kernel log of about ``kib`` KiB, as a host's /dev/kmsg after some uptime: the kernel's
    usual lines, a few NVIDIA ones (no Xid: a healthy host)."""
    lines = [
        "[{t:>12.6f}] pci 0000:00:{d:02x}.0: [8086:10d3] type 00 class 0x020000 PCIe Endpoint",
        "[{t:>12.6f}] e1000e 0000:02:00.0 eth0: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: None",
        '[{t:>12.6f}] audit: type=1400 audit({t:.3f}:{d}): apparmor="STATUS" operation="profile_load"',
        "[{t:>12.6f}] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 10:00:00 UTC 2025",
        "[{t:>12.6f}] vfio-pci 0000:01:00.0: enabling device (0000 -> 0003)",
    ]
    out, size, i = [], 0, 0
    while size < kib * 1024:
        line = lines[i % len(lines)].format(t=i * 0.37, d=i % 256) + "\n"
        out.append(line)
        size += len(line)
        i += 1
    return "".join(out)


def converged_grub(root: Path) -> str:
    """GRUB's defaults configuring what the capture booted with, plus the IOMMU arguments."""
    booted = (root / "proc/cmdline").read_text().split() if (root / "proc/cmdline").exists() else []
    args = booted + [a for a in KERNEL_ARGUMENTS if a not in booted]
    return f'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="{" ".join(args)}"\nGRUB_CMDLINE_LINUX=""\n'


def stage(capture: Path, dest: Path, count: int, gpu: str | None = None, log_kib: int = 0) -> list[Path]:
    """``count`` copies of the capture under ``dest``, each with the converged GRUB file (and, with
    ``gpu``, that GPU bound to vfio-pci and a kernel log of ``log_kib`` KiB: a converged host for
    the fleet report)."""
    from gpuprov.cli import rootfs

    if dest.exists():  # a kept --workdir from an earlier run
        shutil.rmtree(dest)
    template = dest / "template"
    template.mkdir(parents=True)
    try:
        rootfs.unpack(str(capture), str(template))
    except rootfs.CaptureRefused as exc:
        refuse(f"--capture: {exc}")
    (template / "etc/default").mkdir(parents=True, exist_ok=True)
    (template / "etc/default/grub").write_text(GRUB if gpu is None else converged_grub(template))
    if gpu is not None:
        from tests.fleethosts import bind

        bind(template, gpu, "vfio-pci")
    if log_kib:
        (template / "var/log").mkdir(parents=True, exist_ok=True)
        (template / "var/log/kern.log").write_text(kernel_log(log_kib))
    roots = []
    for i in range(1, count + 1):
        root = dest / f"host{i:04d}"
        shutil.copytree(template, root, symlinks=True)
        roots.append(root)
    return roots


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_CONFIG=str(REPO / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(REPO / "build" / "collections"),
        ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
        PROFILE_TASKS_SORT_ORDER="none",  # task order, not slowest first
        PROFILE_TASKS_TASK_OUTPUT_LIMIT="all",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_HOST_KEY_CHECKING="False",
        ANSIBLE_LOCALHOST_WARNING="0",
        # The modules' own gpuprov is the one AnsiballZ ships from the collection.
        PYTHONPATH=str(REPO),
    )
    return env


def cpu_used() -> float:
    """CPU seconds (user + system) of this process's waited-for children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def host_limit(hosts: int, lab: bool) -> str:
    """``-l``: the first ``hosts`` staged hosts (the staged inventory comes first), and the lab host."""
    return f"all[0:{hosts - 1}]" + (f":{LAB_HOST}" if lab else "")


def timed(
    cmd: list[str], env: dict[str, str], members: SshMembers | None
) -> tuple[subprocess.CompletedProcess[str], float, float, float]:
    """Run ``cmd``: its result, wall seconds, CPU seconds of all its processes and of those on the
    members' side (``members``: each run with its own SSH connections, closed after the timing)."""
    with members.session(env) if members else contextlib.nullcontext(env) as run_env:
        on_members = members.cpu() if members else 0.0
        start, used = time.perf_counter(), cpu_used()
        proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True, check=False, cwd=REPO)
        seconds = time.perf_counter() - start
    # Read once the session is closed: the ssh masters and the sshds count a connection's CPU when it ends.
    used = cpu_used() - used
    on_members = members.cpu() - on_members if members else 0.0
    return proc, seconds, used + on_members, on_members


def play(
    playbook: Path,
    inv: Path,
    hosts: int,
    forks: int,
    env: dict[str, str],
    lab: list[str] | None = None,
    members: SshMembers | None = None,
) -> PlayRun:
    """One timed run of ``playbook`` on the first ``hosts`` hosts of ``inv``; ``lab``: the lab
    host's ansible-playbook arguments (its inventory and overrides, :func:`lab_arguments`), one
    member more; ``members``: the SSH members (--members ssh)."""
    cmd = [
        str(PLAYBOOK),
        "-i",
        str(inv),
        *(lab or []),
        "-f",
        str(forks),
        "-l",
        host_limit(hosts, bool(lab)),
        str(playbook),
    ]
    proc, seconds, used, on_members = timed(cmd, env, members)
    recap = recap_totals(proc.stdout)
    hosts += 1 if lab else 0
    if proc.returncode != 0 or recap["hosts"] != hosts or recap["failed"] or recap["unreachable"]:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"fleet.py: {playbook.name} on {hosts} hosts failed (rc {proc.returncode}):\n{tail}")
    return PlayRun(seconds, recap, task_profile(proc.stdout), used, on_members)


def report_run(
    inv: Path,
    hosts: int,
    forks: int,
    env: dict[str, str],
    lab: list[str] | None = None,
    members: SshMembers | None = None,
) -> PlayRun:
    """One timed ``gpuprov fleet --json`` (the playbook gpuprov.kvm.fleet_report through the json
    callback, and the document put together) on the first ``hosts`` hosts; exit 1 unless every
    host is in the document, converged."""
    limit = host_limit(hosts, bool(lab))
    # gpuprov fleet takes ansible-playbook's -i and -e: the lab's arguments as they are.
    cmd = [
        sys.executable,
        "-m",
        "gpuprov",
        "fleet",
        "-i",
        str(inv),
        *(lab or []),
        "-f",
        str(forks),
        "-l",
        limit,
        "--json",
    ]
    env = {k: v for k, v in env.items() if k != "ANSIBLE_CALLBACKS_ENABLED"}  # stdout is the json callback's
    proc, seconds, used, on_members = timed(cmd, env, members)
    try:
        document = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(
            f"fleet.py: gpuprov fleet on {hosts} hosts failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
        ) from None
    want = hosts + (1 if lab else 0)
    records = {h["host"]: h for h in document.get("hosts") or []}
    lab_record = records.pop(LAB_HOST, None) if lab else None
    statuses = [h["status"] for h in records.values()]
    if proc.returncode != 0 or len(statuses) != hosts or set(statuses) != {"converged"}:
        odd = [h for h in records.values() if h["status"] != "converged"][:2]
        raise SystemExit(
            f"fleet.py: the report on {hosts} staged hosts: {statuses.count('converged')} converged; e.g. {odd}"
        )
    # The lab host is read as it is (drifted or not ready counts: it answered); one that gave no
    # record is no member, and its figures would be a timeout's.
    if lab and (lab_record is None or lab_record["status"] in ("unreachable", "failed")):
        said = lab_record.get("message") if lab_record else "not in the document"
        raise SystemExit(f"fleet.py: the lab host {LAB_HOST} gave no record in the report: {said}")
    recap = {"hosts": want, "ok": want, "changed": 0, "unreachable": 0, "failed": 0}
    return PlayRun(
        seconds, recap, cpu=used, member_cpu=on_members, lab_status=lab_record["status"] if lab_record else None
    )


# What `python -m dev.lab status --json` may put in inventory_overrides (dev/lab/common.py): the
# connection's variables, nothing else; any other key is refused, not passed on as -e.
LAB_OVERRIDES = frozenset({"ansible_host", "ansible_port", "ansible_ssh_private_key_file", "ansible_ssh_common_args"})


def lab_status() -> dict[str, Any]:
    """``python -m dev.lab status --json`` (this bench never starts or stops the lab)."""
    out = subprocess.run(
        [sys.executable, "-m", "dev.lab", "status", "--json"], capture_output=True, text=True, cwd=REPO, check=False
    )
    try:
        status = json.loads(out.stdout)
    except ValueError:
        refuse("--lab: python -m dev.lab status --json printed no JSON")
    if not isinstance(status, dict):
        refuse("--lab: python -m dev.lab status --json printed no JSON object")
    return status


def lab_arguments(status: dict[str, Any]) -> list[str]:
    """The lab host as one more member, from ``status`` (:func:`lab_status`): its inventory, and
    the overrides it names as ``-e`` JSON; exit 2 when the lab is not running or the overrides are
    anything but the connection's variables."""
    if status.get("running") is not True:
        refuse("--lab: the lab host is not running: start it with `python -m dev.lab up`")
    overrides = status.get("inventory_overrides")
    if overrides is None:
        return ["-i", str(LAB_INVENTORY)]
    if not isinstance(overrides, dict) or not overrides or not set(overrides) <= LAB_OVERRIDES:
        refuse(f"--lab: inventory_overrides {overrides!r}: expected a mapping of {', '.join(sorted(LAB_OVERRIDES))}")
    for key, value in overrides.items():
        if not isinstance(value, str | int) or isinstance(value, bool):
            refuse(f"--lab: inventory_overrides.{key} {value!r}: expected a string or a port number")
    return ["-i", str(LAB_INVENTORY), "-e", json.dumps(overrides, sort_keys=True)]


# How the staged members are reached (--members), as every run says.
MEMBERS = {
    "local": "ansible_connection local",
    "ssh": f"ssh to its own network namespace and sshd (dev/bench/netns_members.py), {MEMBER_PYTHON}",
}


def lab_line(lab: list[str] | None, lab_status: str | None = None, members: str = "local") -> str:
    """Whether the lab host is in the figures: said on every run, included or not."""
    if not lab:
        return (
            f"lab host: NOT included (every member is a staged root, {MEMBERS[members]}; "
            f"--lab adds {LAB_HOST}, with python -m dev.lab up running)"
        )
    status = f", its report status {lab_status}" if lab_status else ""
    return (
        f"lab host: {LAB_HOST} included (ssh, inventories/lab) as one more member of the facts-only and report "
        f"plays{status}; not of the no-op converge (its options name the staged roots)"
    )


PLAYS = (("facts", "facts"), ("report", "report"), ("no-op", "noop"))


def fleet_table(points: list[Point]) -> str:
    """The three plays of one run side by side: t(N) of each; each one's per-host marginal cost
    (t(N) - t(1)) / (N - 1), wall and CPU; the report's and the no-op converge's marginal against the
    facts-only play's (the issue's goal for the report: at most REPORT_GOAL); and the projections
    t(1) + (n - 1) x marginal to FLEET_SIZES hosts."""
    wide = 6 + 8 * 3
    head = (
        f"{'hosts':>5} {'forks':>5} | {'t(N) s facts/report/no-op':>{wide - 5}} | {'s/host facts/report/no-op':>23}"
        f" | {'ratio r/n':>11} | {'CPU s/host f/r/n':>17} | {'CPU r/n':>9}"
        + "".join(f" | {'@' + f'{n:,}' + ' s f/r/n':>20}" for n in FLEET_SIZES)
    )
    rows = [head, "-" * len(head)]
    one = {p.forks: p for p in points if p.hosts == 1}
    for p in points:
        base = one.get(p.forks)
        if base is None or p.report is None or base.report is None:
            continue
        runs = _runs(p, base)
        wall = [marginal(r.seconds, b.seconds, p.hosts) for r, b in runs]
        cpu = [marginal(r.cpu, b.cpu, p.hosts) for r, b in runs]
        cells = [
            "/".join(f"{r.seconds:.2f}" for r, _b in runs),
            "/".join(_short(m, 3) for m in wall),
            f"{_short(_div(wall[1], wall[0]), 2)}/{_short(_div(wall[2], wall[0]), 2)}",
            "/".join(_short(m, 3) for m in cpu),
            f"{_short(_div(cpu[1], cpu[0]), 2)}/{_short(_div(cpu[2], cpu[0]), 2)}",
        ]
        for n in FLEET_SIZES:
            cells.append(
                "/".join(_short(projection(b.seconds, m, n), 0) for (_r, b), m in zip(runs, wall, strict=True))
            )
        note = f"  (same run as forks {p.same_as_forks})" if p.same_as_forks else ""
        widths = [wide - 5, 23, 11, 17, 9] + [20] * len(FLEET_SIZES)
        rows.append(
            f"{p.hosts:>5} {p.forks:>5} | " + " | ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)) + note
        )
    return "\n".join(rows)


def cpu_split(points: list[Point]) -> str:
    """--members ssh: each play's per-host CPU marginal split into the controller's side and the
    members' (each sshd, the shells and modules it ran): what a real fleet spreads over its hosts."""
    lines = ["per-host CPU, controller + members' side (s), facts-only / report / no-op:"]
    one = {p.forks: p for p in points if p.hosts == 1}
    for p in points:
        base = one.get(p.forks)
        if base is None or p.hosts == 1 or p.same_as_forks or p.report is None or base.report is None:
            continue
        cells = [
            f"{_short(marginal(r.cpu - r.member_cpu, b.cpu - b.member_cpu, p.hosts), 3)} + "
            f"{_short(marginal(r.member_cpu, b.member_cpu, p.hosts), 3)}"
            for r, b in _runs(p, base)
        ]
        lines.append(f"  {p.hosts} hosts, forks {p.forks}: " + " / ".join(cells))
    return "\n".join(lines)


def _runs(p: Point, base: Point) -> list[tuple[PlayRun, PlayRun]]:
    """Each play's run at ``p`` and at one host (``base``), in PLAYS' order."""
    return [(getattr(p, attr), getattr(base, attr)) for _label, attr in PLAYS]


def _exit_on_signal(signum: int, _frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)


def verdict(points: list[Point]) -> str:
    """Whether the report met the goal at the largest fleet measured, per forks (wall and CPU)."""
    lines = []
    for forks in sorted({p.forks for p in points}):
        base = next((p for p in points if p.forks == forks and p.hosts == 1), None)
        big = max((p for p in points if p.forks == forks and p.report), key=lambda p: p.hosts, default=None)
        if base is None or big is None or big.hosts == 1 or base.report is None or big.report is None:
            continue
        wall = _div(
            marginal(big.report.seconds, base.report.seconds, big.hosts),
            marginal(big.facts.seconds, base.facts.seconds, big.hosts),
        )
        cpu = _div(
            marginal(big.report.cpu, base.report.cpu, big.hosts), marginal(big.facts.cpu, base.facts.cpu, big.hosts)
        )
        met = "met" if wall <= REPORT_GOAL and cpu <= REPORT_GOAL else "NOT met"
        lines.append(
            f"goal (report per host <= {REPORT_GOAL}x facts-only) at {big.hosts} hosts, forks {forks}: {met}"
            f" (wall {_short(wall, 2)}x, CPU {_short(cpu, 2)}x)"
        )
    return "\n".join(lines)


def _short(x: float, digits: int) -> str:
    return "-" if x != x else f"{x:,.{digits}f}" if digits == 0 else f"{x:.{digits}f}"


def _div(a: float, b: float) -> float:
    return a / b if b == b and a == a and b else float("nan")


def _fmt(x: float, width: int, digits: int = 2) -> str:
    return f"{'-':>{width}}" if x != x else f"{x:>{width}.{digits}f}"  # NaN (N = 1) as "-"


def table(points: list[Point]) -> str:
    head = (
        f"{'hosts':>5} {'forks':>5} {'facts s':>8} {'no-op s':>8} {'ratio':>6} {'facts s/host':>12}"
        f" {'no-op s/host':>12} {'facts @1000 s':>13} {'no-op @1000 s':>13}"
    )
    rows = [head, "-" * len(head)]
    one = {p.forks: p for p in points if p.hosts == 1}
    for p in points:
        base = one.get(p.forks)
        mf = marginal(p.facts.seconds, base.facts.seconds, p.hosts) if base else float("nan")
        mn = marginal(p.noop.seconds, base.noop.seconds, p.hosts) if base else float("nan")
        pf = projection(base.facts.seconds, mf) if base else float("nan")
        pn = projection(base.noop.seconds, mn) if base else float("nan")
        note = f"  (same run as forks {p.same_as_forks}: hosts <= forks)" if p.same_as_forks else ""
        rows.append(
            f"{p.hosts:>5} {p.forks:>5} {p.facts.seconds:>8.2f} {p.noop.seconds:>8.2f} {_fmt(p.ratio, 6)}"
            f" {_fmt(mf, 12, 3)} {_fmt(mn, 12, 3)} {_fmt(pf, 13, 0)} {_fmt(pn, 13, 0)}{note}"
        )
    return "\n".join(rows)


def profile_text(point: Point) -> str:
    lines = [f"per-task profile (profile_tasks), {point.hosts} hosts, forks {point.forks}:"]
    for label, run in (("facts-only", point.facts), ("no-op", point.noop)):
        tasks = ", ".join(f"{name} {s:.2f} s" for name, s in run.profile) or "(none printed)"
        lines.append(f"  {label:<10} {tasks}")
    return "\n".join(lines)


def _ansible_version(env: dict[str, str]) -> str:
    out = subprocess.run([str(PLAYBOOK), "--version"], env=env, capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else "ansible-playbook: unknown version"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="facts-only play vs no-op converge and the fleet report on N staged hosts")
    p.add_argument("--hosts", default="1,10,50,200", help="fleet sizes, comma-separated (1 is always run)")
    p.add_argument("--forks", default="10,50", help="ansible forks, comma-separated")
    p.add_argument("--capture", type=Path, default=HOSTS / "gpu-audio.tar.gz", help="the capture every host is")
    p.add_argument("--gpu", default="0000:01:00.0", help="the capture's GPU, declared use: passthrough")
    p.add_argument("--workdir", type=Path, help="stage the roots here (kept); default a temp dir, removed")
    p.add_argument("--no-report", dest="report", action="store_false", help="time the facts and no-op plays alone")
    p.add_argument("--kernel-log-kib", type=int, default=256, help="the kernel log each staged host has (KiB)")
    p.add_argument("--lab", action="store_true", help="the lab host (python -m dev.lab up) as a real member too")
    p.add_argument(
        "--members",
        choices=sorted(MEMBERS),
        default="local",
        help="how the staged hosts are reached: local connection, or ssh to a network namespace each (root)",
    )
    a = p.parse_args(argv)
    sizes = sorted(set(parse_counts(a.hosts, "--hosts")) | {1})
    forks_list = parse_counts(a.forks, "--forks")
    from gpuprov.facts.pci import PciAddressError, normalize_address

    try:
        gpu = normalize_address(a.gpu)
    except PciAddressError as exc:
        refuse(f"--gpu: {exc}")
    if not PLAYBOOK.exists():
        p.error(f"{PLAYBOOK} not found: install the test extra (ansible-core)")
    if a.kernel_log_kib < 0:
        refuse(f"--kernel-log-kib {a.kernel_log_kib}: give a size in KiB, 0 for none")
    lab = lab_arguments(lab_status()) if a.lab else None
    print(lab_line(lab, members=a.members), file=sys.stderr)

    built = subprocess.run(
        [sys.executable, str(REPO / "dev" / "tools" / "build_collection.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise SystemExit(f"fleet.py: dev/tools/build_collection.py failed:\n{built.stdout}{built.stderr}")
    env = _env()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="gpuprov-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    points: list[Point] = []
    members: SshMembers | None = None
    # An interrupted run still tears its members down (the finally below) and removes its roots.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    try:
        began = time.perf_counter()
        roots = stage(a.capture, work / "roots", sizes[-1], gpu if a.report else None, a.kernel_log_kib)
        if a.members == "ssh":
            print(f"starting {sizes[-1]} SSH members (a network namespace and sshd each) ...", file=sys.stderr)
            members = SshMembers(work, sizes[-1])
            try:
                members.start()
            except MembersRefused as exc:
                refuse(str(exc))
        inv = work / "inventory.yml"  # JSON is YAML: the yaml inventory plugin reads it
        connection = members.connection if members else None
        inv.write_text(json.dumps(inventory(roots, gpu, sys.executable, connection), indent=1))
        facts_pb, converge_pb = work / "facts.yml", work / "converge.yml"
        facts_pb.write_text(json.dumps(FACTS_PLAY, indent=1))
        converge_pb.write_text(json.dumps(CONVERGE_PLAY, indent=1))

        print(f"converging {sizes[-1]} staged roots once (not measured) ...", file=sys.stderr)
        play(converge_pb, inv, sizes[-1], max(forks_list), env, members=members)
        setup = time.perf_counter() - began
        done: dict[tuple[int, int], Point] = {}
        for forks in forks_list:
            for n in sizes:
                # With hosts <= forks, a larger forks runs the same way: reuse that run.
                key = (n, min(n, forks))
                if key in done:
                    d = done[key]
                    points.append(Point(n, forks, d.facts, d.noop, same_as_forks=d.forks, report=d.report))
                    continue
                print(f"{n} hosts, forks {forks} ...", file=sys.stderr)
                began = time.perf_counter()
                facts = play(facts_pb, inv, n, forks, env, lab, members)
                noop = play(converge_pb, inv, n, forks, env, members=members)
                report = report_run(inv, n, forks, env, lab, members) if a.report else None
                point = Point(n, forks, facts, noop, report=report, took=time.perf_counter() - began)
                done[key] = point
                points.append(point)
                problem = not_a_noop(noop, n)
                if problem:
                    print(profile_text(point))
                    print(problem)
                    return 1
    finally:
        if members:
            members.close()
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.2f} (1 min, at the end); {_ansible_version(env)}")
    python = sys.version.split()[0]
    print(
        f"capture {a.capture.name}, GPU {gpu} declared passthrough; members: {MEMBERS[a.members]}; "
        f"controller Python {python}"
    )
    lab_report = next((pt.report.lab_status for pt in points if pt.report and pt.report.lab_status), None)
    print(lab_line(lab, lab_report, a.members))
    measured = [pt for pt in points if not pt.same_as_forks]
    took = ", ".join(f"{pt.hosts} hosts forks {pt.forks} {pt.took:.0f} s" for pt in measured)
    print(f"wall time: staging and the unmeasured converge {setup:.0f} s; the three plays per size: {took}")
    print(table(points))
    if a.report:
        print(
            f"\nfacts-only / fleet report (gpuprov fleet --json, every staged host converged; kernel log "
            f"{a.kernel_log_kib} KiB a host) / no-op converge, one run each, same hosts and forks; ratio and CPU: "
            f"the report's and the no-op's per-host marginal against the facts-only play's (goal for the report: "
            f"<= {REPORT_GOAL}); @N: t(1) + (N - 1) x marginal:"
        )
        print(fleet_table(points))
        print(verdict(points))
        if members:
            print(cpu_split(points))
    changed = sum(pt.noop.recap["changed"] for pt in measured)
    results = sum(pt.noop.recap["ok"] for pt in measured)
    print(f"no-op runs: changed={changed} over {results} task results ({len(measured)} measured runs)")
    for forks in sorted({pt.forks for pt in measured}):
        print(profile_text(max((pt for pt in measured if pt.forks == forks), key=lambda pt: pt.hosts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
