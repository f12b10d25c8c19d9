"""The no-op figure of issue #14 on the lab: a facts-only play against the whole playbook with
nothing to do, on the same host, in one run.

Against a lab host already up (``python -m dev.lab up``; ``python -m dev.lab status --json``
says where, and the ``-e`` overrides its inventory needs), with ``inventories/lab``:

1. ``playbooks/gpu_passthrough.yml`` once, unmeasured, to converge the lab (skipped with
   ``--converged``);
2. a facts-only play (``gather_facts`` on ``gpu_hosts``, no task), timed ``--facts-runs`` times,
   and the playbook with nothing to do, timed ``--noop-runs`` times, alternating (facts, no-op,
   facts, ...: the lab's speed drifts); a measured run that changes anything makes it say so and
   exit 1;
3. the fleet figure: dev/bench/fleet.py's facts-only and no-op plays on ``--fleet-hosts`` local
   staged hosts (its functions, imported), whose per-host marginal projects the lab's one-host
   times to 1,000 hosts (``--fleet-hosts 0`` skips it).

It prints each time, the ratio no-op / facts-only (median over median; the issue's goal is at
most 2), the no-op run's per-task profile (``ansible.posix.profile_tasks``, task order) with
the tasks that ran a module on the host, and the projection (docs/development/benchmarks.md).

    python dev/bench/lab_noop.py                       # 3 facts-only runs, 1 no-op run, fleet at 10 hosts
    python dev/bench/lab_noop.py --converged --noop-runs 3 --fleet-hosts 0
    python dev/bench/lab_noop.py -e gpu_vms_check_consoles=false   # extra vars for every play
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parents[1]
sys.path.insert(0, str(BENCH))

import fleet  # noqa: E402  (dev/bench/fleet.py: its plays, parsers and arithmetic, one copy)

INVENTORY = REPO / "inventories" / "lab"
PLAYBOOK = REPO / "playbooks" / "gpu_passthrough.yml"
# become as the playbook's plays: the same connection and privilege escalation.
FACTS_PLAY = [{"name": "facts only", "hosts": "gpu_hosts", "become": True, "gather_facts": True, "tasks": []}]
# The recap's skipped counter (dev/bench/fleet.py's RECAP_RE reads ok/changed/unreachable/failed).
SKIPPED_RE = re.compile(r"^\S+\s+:\s+ok=\d+.*?\bskipped=(\d+)", re.M)
# A task that takes this long ran something on the host (a skipped or controller task: milliseconds).
MODULE_RUN_S = 0.3


@dataclass
class Timed:
    seconds: list[float]
    last: fleet.PlayRun

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def refuse(message: str) -> NoReturn:
    """Bad input or no lab: the message on stderr, exit 2, no traceback."""
    print(f"lab_noop.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def lab_overrides(status_json: str) -> dict[str, Any]:
    """The ``-e`` overrides ``inventories/lab`` needs, from ``python -m dev.lab status --json``;
    exit 2 when the lab is not running or the answer is not the status object."""
    try:
        status = json.loads(status_json)
    except ValueError:
        refuse("python -m dev.lab status --json printed no JSON: is the checkout's dev.lab importable?")
    if not isinstance(status, dict):
        refuse("python -m dev.lab status --json printed no status object")
    if not status.get("running"):
        refuse("the lab host is not running: start it with `python -m dev.lab up` (this bench never does)")
    extra = status.get("inventory_overrides") or {}
    if not isinstance(extra, dict):
        refuse("python -m dev.lab status --json: inventory_overrides is not a mapping")
    return extra


def extra_vars(pairs: list[str]) -> dict[str, Any]:
    """``-e KEY=VALUE`` (VALUE read as YAML/JSON scalar where it parses: true, 3) -> a mapping."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            refuse(f"-e {pair!r}: give KEY=VALUE with a variable name, e.g. -e gpu_vms_check_consoles=false")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def skipped(text: str) -> int:
    return sum(int(m) for m in SKIPPED_RE.findall(text))


def module_tasks(profile: list[tuple[str, float]], threshold: float = MODULE_RUN_S) -> list[tuple[str, float]]:
    """The profile's tasks that ran something on the host: those that took ``threshold`` or more
    (a skipped task or a controller-side one takes milliseconds)."""
    return [(name, s) for name, s in profile if s >= threshold]


def ratio(noop: float, facts: float) -> float:
    return noop / facts if facts else float("nan")


def report(facts: Timed, noop: Timed, noop_skipped: int, fleet_points: list[fleet.Point]) -> str:
    """What the bench prints: times, ratio, the no-op profile, the fleet table and projection."""
    lines = [
        "facts-only play (gather_facts): "
        + ", ".join(f"{s:.2f}" for s in facts.seconds)
        + f" s; median {facts.median:.2f} s",
        "no-op gpu_passthrough.yml: " + ", ".join(f"{s:.2f}" for s in noop.seconds) + f" s; median {noop.median:.2f} s",
        f"ratio no-op / facts-only: {ratio(noop.median, facts.median):.2f} (median over median; goal <= 2.00)"
        f"; best over best {ratio(min(noop.seconds), min(facts.seconds)):.2f}",
        f"no-op recap: ok={noop.last.recap['ok']} changed={noop.last.recap['changed']} skipped={noop_skipped}",
    ]
    ran = module_tasks(noop.last.profile)
    lines.append(
        f"per-task profile of the last no-op run ({len(noop.last.profile)} tasks listed, {len(ran)} took "
        f">= {MODULE_RUN_S} s: a run on the host; sum {sum(s for _, s in noop.last.profile):.2f} s):"
    )
    width = max((len(name) for name, _ in noop.last.profile), default=10)
    for name, s in noop.last.profile:
        mark = "*" if s >= MODULE_RUN_S else " "
        lines.append(f"  {mark} {name:<{width}} {s:7.2f} s")
    if fleet_points:
        lines.append("fleet (dev/bench/fleet.py's plays on local staged hosts, same controller):")
        lines.append(fleet.table(fleet_points))
        lines.extend(projection_lines(facts, noop, fleet_points))
    return "\n".join(lines)


def projection_lines(facts: Timed, noop: Timed, points: list[fleet.Point]) -> list[str]:
    """The lab's one-host medians plus 999 x the fleet's per-host marginal, per forks."""
    out = []
    one = {p.forks: p for p in points if p.hosts == 1}
    for p in points:
        base = one.get(p.forks)
        if base is None or p.hosts == 1:
            continue
        mf = fleet.marginal(p.facts.seconds, base.facts.seconds, p.hosts)
        mn = fleet.marginal(p.noop.seconds, base.noop.seconds, p.hosts)
        out.append(
            f"projected to {fleet.FLEET_SIZE} hosts at forks {p.forks} (lab t(1) + {fleet.FLEET_SIZE - 1} x the "
            f"marginal of {p.hosts} hosts): facts-only {fleet.projection(facts.median, mf):.0f} s, "
            f"no-op {fleet.projection(noop.median, mn):.0f} s"
        )
    return out


def ansible(playbook: Path, extra: dict[str, Any], env: dict[str, str]) -> tuple[fleet.PlayRun, int]:
    cmd = [str(fleet.PLAYBOOK), "-i", str(INVENTORY), str(playbook)]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=REPO)
    seconds = time.perf_counter() - start
    recap = fleet.recap_totals(proc.stdout)
    if proc.returncode != 0 or not recap["hosts"] or recap["failed"] or recap["unreachable"]:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise SystemExit(f"lab_noop.py: {playbook.name} failed (rc {proc.returncode}):\n{tail}")
    return fleet.PlayRun(seconds, recap, fleet.task_profile(proc.stdout)), skipped(proc.stdout)


def interleaved(
    plays: list[tuple[Path, int, str, bool]], extra: dict[str, Any], env: dict[str, str]
) -> tuple[list[Timed], list[int]]:
    """Each (playbook, runs, label, noop) run in turn, round by round (facts, no-op, facts, ...):
    the lab's speed drifts (its guest VM's own work, the machine's neighbours), and alternating
    puts both plays under the same drift. A no-op run that changed anything stops the bench (exit 1)."""
    seconds: list[list[float]] = [[] for _ in plays]
    last: list[fleet.PlayRun | None] = [None for _ in plays]
    skips = [0 for _ in plays]
    for i in range(max(runs for _, runs, _, _ in plays)):
        for k, (playbook, runs, label, noop) in enumerate(plays):
            if i >= runs:
                continue
            print(f"{label} {i + 1}/{runs} ...", file=sys.stderr)
            run, skips[k] = ansible(playbook, extra, env)
            seconds[k].append(run.seconds)
            last[k] = run
            if noop:
                problem = fleet.not_a_noop(run, run.recap["hosts"])
                if problem:
                    print(problem)
                    raise SystemExit(1)
    return [Timed(s, run) for s, run in zip(seconds, last, strict=True) if run is not None], skips


def fleet_run(hosts: int, forks: int, work: Path, env: dict[str, str]) -> list[fleet.Point]:
    """dev/bench/fleet.py's two plays on 1 and ``hosts`` staged hosts at ``forks``."""
    roots = fleet.stage(fleet.HOSTS / "gpu-audio.tar.gz", work / "roots", hosts)
    inv = work / "inventory.yml"
    inv.write_text(json.dumps(fleet.inventory(roots, "0000:01:00.0", sys.executable), indent=1))
    facts_pb, converge_pb = work / "facts.yml", work / "converge.yml"
    facts_pb.write_text(json.dumps(fleet.FACTS_PLAY, indent=1))
    converge_pb.write_text(json.dumps(fleet.CONVERGE_PLAY, indent=1))
    fleet.play(converge_pb, inv, hosts, forks, env)  # converge once, unmeasured
    points = []
    for n in sorted({1, hosts}):
        print(f"fleet: {n} hosts, forks {forks} ...", file=sys.stderr)
        noop = fleet.play(converge_pb, inv, n, forks, env)
        if fleet.not_a_noop(noop, n):
            raise SystemExit(fleet.not_a_noop(noop, n))
        points.append(fleet.Point(n, forks, fleet.play(facts_pb, inv, n, forks, env), noop))
    return points


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="facts-only play vs the no-op gpu_passthrough.yml on the lab host")
    p.add_argument("--facts-runs", type=int, default=3, help="timed facts-only runs (default 3)")
    p.add_argument("--noop-runs", type=int, default=1, help="timed no-op runs (default 1)")
    p.add_argument("--converged", action="store_true", help="the lab is converged already: no unmeasured run")
    p.add_argument(
        "--fleet-hosts", type=int, default=10, help="local staged hosts for the projection (default 10; 0 or 1: none)"
    )
    p.add_argument("--forks", type=int, default=10, help="forks of the fleet runs (default 10)")
    p.add_argument("-e", dest="extra", action="append", default=[], help="KEY=VALUE for every play (repeatable)")
    a = p.parse_args(argv)
    for option, value, low in (
        ("--facts-runs", a.facts_runs, 1),
        ("--noop-runs", a.noop_runs, 1),
        ("--fleet-hosts", a.fleet_hosts, 0),
        ("--forks", a.forks, 1),
    ):
        if value < low:
            refuse(f"{option} {value}: give an integer >= {low}")
    extra = extra_vars(a.extra)
    if not fleet.PLAYBOOK.exists():
        refuse(f"{fleet.PLAYBOOK} not found: install the test extra (ansible-core)")
    status = subprocess.run(
        [sys.executable, "-m", "dev.lab", "status", "--json"], capture_output=True, text=True, check=False, cwd=REPO
    )
    extra = {**lab_overrides(status.stdout), **extra}
    built = subprocess.run(
        [sys.executable, str(REPO / "dev" / "tools" / "build_collection.py")],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        raise SystemExit(f"lab_noop.py: dev/tools/build_collection.py failed:\n{built.stdout}{built.stderr}")
    env = fleet._env()
    with tempfile.TemporaryDirectory(prefix="gpuprov-lab-noop-") as tmp:
        work = Path(tmp)
        facts_pb = work / "facts.yml"
        facts_pb.write_text(json.dumps(FACTS_PLAY, indent=1))
        if not a.converged:
            print("converging the lab once (not measured) ...", file=sys.stderr)
            ansible(PLAYBOOK, extra, env)
        (facts, noop), (_, noop_skipped) = interleaved(
            [(facts_pb, a.facts_runs, "facts-only", False), (PLAYBOOK, a.noop_runs, "no-op", True)], extra, env
        )
        points = fleet_run(a.fleet_hosts, a.forks, work / "fleet", env) if a.fleet_hosts > 1 else []
    load = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} cores, load average {load:.2f} (1 min, at the end); {fleet._ansible_version(env)}"
    )
    print(f"lab: inventories/lab, playbooks/gpu_passthrough.yml{'; -e ' + json.dumps(extra) if extra else ''}")
    print(report(facts, noop, noop_skipped, points))
    return 0


if __name__ == "__main__":
    sys.exit(main())
