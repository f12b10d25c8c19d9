"""Time ``gpuprov inspect --json`` against ``lspci -nnk``, ``lspci -nnk -vvv`` and a bare read loop.

For each host size (synthetic roots from ``synth_host.py``), these commands
are started the same way, as subprocesses of this interpreter, interleaved, and
the best of ``--runs`` wall times (and, apart, of CPU times: user + system) is kept:

* gpuprov:   ``python -m gpuprov inspect --json --root ROOT``, the root's paths
  resolved by the kernel (openat2 with RESOLVE_IN_ROOT) where it can
* walk:      the same with ``GPUPROV_NO_OPENAT2=1``: the fallback, gpuprov resolving
  the root's paths itself (a kernel before 5.6, or a seccomp filter refusing openat2)
* lspci-nnk: ``lspci -A linux-sysfs -O sysfs.path=ROOT/sys/bus/pci -nnk``
* lspci-vvv: the same with ``-vvv`` (every capability decoded from config space)
* floor:     ``python -c LOOP`` replaying the exact reads gpuprov makes (taken
  from ``Sysfs(root, trace=True)`` after ``gather``) with plain ``open().read()``,
  ``os.listdir`` and ``os.readlink``, plus the pci.ids file gpuprov names devices
  from. It is what any Python tool reading the same files must pay.
* floor/2p:  the same replay split in two halves, one per process (a fork): what the
  reads alone would cost a Python reader spread over two cores

Targets (from the issues): gpuprov no slower than ``lspci -nnk``, within 2x of the
floor, and a per-device cost that stays flat as the host grows.

    python dev/bench/inspect_bench.py                  # ~550, ~1,100, ~2,100 devices, best of 5
    python dev/bench/inspect_bench.py --scales 1,2,4 --runs 3 --json
    python dev/bench/inspect_bench.py --profile        # cProfile of gpuprov on the largest root
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parents[1]
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from synth_host import make_host_root  # noqa: E402

# The floor: every traced access, no parsing, no objects, no output; with a third argument, split
# in that many consecutive parts, one per process.
FLOOR = """
import os, sys
root, trace = sys.argv[1], sys.argv[2]
procs = int(sys.argv[3]) if len(sys.argv) > 3 else 1
with open(trace) as f:
    ops = [line.rstrip("\\n").split("\\t", 1) for line in f]
part = -(-len(ops) // procs)
children, child = [], False
for i in range(1, procs):
    pid = os.fork()
    if pid == 0:
        ops, child = ops[i * part:(i + 1) * part], True
        break
    children.append(pid)
else:
    ops = ops[:part]
for op, rel in ops:
    path = rel if rel.startswith("/") else root + "/" + rel
    try:
        if op == "read":
            with open(path, "rb") as fh:
                fh.read()
        elif op == "listdir":
            os.listdir(path)
        else:
            os.readlink(path)
    except OSError:
        pass
if child:
    os._exit(0)
for pid in children:
    os.waitpid(pid, 0)
"""

ADDR_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$")


@dataclass
class Size:
    scale: float
    devices: int
    gpuprov_s: float = 0.0
    walk_s: float = 0.0
    lspci_nnk_s: float = 0.0
    lspci_s: float = 0.0  # -nnk -vvv
    floor_s: float = 0.0
    floor2_s: float = 0.0  # the floor over two processes
    cpu_s: dict[str, float] = field(default_factory=dict)  # best user + system time of each command
    trace_ops: dict[str, int] = field(default_factory=dict)
    lspci_devices: int = 0
    gpuprov_devices: int = 0
    gpuprov_rc: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def vs_lspci_nnk(self) -> float:
        return self.gpuprov_s / self.lspci_nnk_s if self.lspci_nnk_s else float("nan")

    @property
    def cpu_vs_lspci_nnk(self) -> float:
        gp, nnk = self.cpu_s.get("gpuprov", 0.0), self.cpu_s.get("lspci_nnk", 0.0)
        return gp / nnk if nnk else float("nan")

    @property
    def vs_lspci(self) -> float:
        return self.gpuprov_s / self.lspci_s if self.lspci_s else float("nan")

    @property
    def vs_floor(self) -> float:
        return self.gpuprov_s / self.floor_s if self.floor_s else float("nan")

    def per_device_us(self, seconds: float) -> float:
        return seconds / self.devices * 1e6


def _env() -> dict[str, str]:
    # The working tree's gpuprov, whatever is installed; same env for all of them. Bytecode is
    # written (the checked run before the timed ones leaves it): with PYTHONDONTWRITEBYTECODE set,
    # every run of a changed tree would time compiling gpuprov's modules too.
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["LC_ALL"] = "C"
    return env


# The columns, in the order they run: (key, label).
PEERS = (
    ("gpuprov", "gpuprov"),
    ("walk", "walk"),
    ("lspci_nnk", "lspci-nnk"),
    ("lspci", "lspci-vvv"),
    ("floor", "floor"),
    ("floor2", "floor/2p"),
)
# The fallback: gpuprov resolving the root's paths itself (gpuprov/facts/openat2.py).
WALK_ENV = {"GPUPROV_NO_OPENAT2": "1"}


def _commands(root: Path, trace_file: Path) -> dict[str, list[str]]:
    gpuprov = [sys.executable, "-m", "gpuprov", "inspect", "--json", "--root", str(root)]
    lspci = ["lspci", "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci", "-nnk"]
    return {
        "gpuprov": gpuprov,
        "walk": gpuprov,
        "lspci_nnk": lspci,
        "lspci": [*lspci, "-vvv"],
        "floor": [sys.executable, "-c", FLOOR, str(root), str(trace_file)],
        "floor2": [sys.executable, "-c", FLOOR, str(root), str(trace_file), "2"],
    }


def _time_once(cmd: list[str], env: dict[str, str]) -> float:
    return _time_cpu(cmd, env)[0]


def _time_cpu(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU: user + system) seconds of one run of ``cmd``."""
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    elapsed = time.perf_counter() - start
    after = os.times()
    if proc.returncode not in (0, 3):  # 3: inspect's "a GPU is not ready", still a full run
        raise RuntimeError(f"{cmd[0]} exited {proc.returncode}: {' '.join(cmd)}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return elapsed, cpu


def write_trace(root: Path, out: Path) -> dict[str, int]:
    """gpuprov's own list of accesses for ``root``, one ``op<TAB>relpath`` per line."""
    from gpuprov.facts.host import gather
    from gpuprov.facts.sysfs import Sysfs

    try:
        sysfs = Sysfs(str(root), trace=True)
    except TypeError as exc:
        raise SystemExit(f"gpuprov's Sysfs has no trace=True ({exc}): the floor needs it") from None
    gather(sysfs)
    trace = getattr(sysfs, "trace", None)
    if not trace:
        raise SystemExit("Sysfs(trace=True).trace is empty or missing after gather(): the floor needs it")
    lines = [f"{op}\t{rel}" for op, rel in trace]
    # gpuprov also reads pci.ids (outside the root) to name devices; so must the floor.
    ids = _pci_ids_path()
    if ids:
        lines.append(f"read\t{ids}")
    out.write_text("\n".join(lines) + "\n")
    counts: dict[str, int] = {}
    for op, _ in trace:
        counts[op] = counts.get(op, 0) + 1
    if ids:
        counts["pci.ids"] = 1
    return counts


def _pci_ids_path() -> str | None:
    try:
        from gpuprov.facts.names import PCI_IDS_PATHS
    except ImportError:
        return None
    return next((p for p in PCI_IDS_PATHS if os.path.isfile(p)), None)


def _lspci_count(text: str) -> int:
    # One unindented header line per function ("00:1f.4 SMBus ..." or "0000:00:1f.4 ...").
    return sum(1 for line in text.splitlines() if line and not line[0].isspace())


def _expected(root: Path) -> dict[str, dict[str, Any]]:
    """What the tree says about each PCI function, read independently of gpuprov."""
    base = root / "sys/bus/pci/devices"
    out: dict[str, dict[str, Any]] = {}
    for addr in sorted(os.listdir(base)):
        d = base / addr
        real = os.path.realpath(d)
        parent = os.path.basename(os.path.dirname(real))

        def link(name: str, d: Path = d) -> str | None:
            p = d / name
            return os.path.basename(os.readlink(p)) if os.path.islink(p) else None

        out[addr] = {
            "vendor_id": (d / "vendor").read_text().strip()[2:],
            "device_id": (d / "device").read_text().strip()[2:],
            "class": (d / "class").read_text().strip()[2:],
            "driver": link("driver"),
            "iommu_group": link("iommu_group"),
            "numa_node": int((d / "numa_node").read_text()),
            "parent": parent if ADDR_RE.match(parent) else None,
            "boot_vga": (d / "boot_vga").exists() and (d / "boot_vga").read_text().strip() == "1",
            "physfn": link("physfn"),
            "virtfns": sum(1 for e in os.listdir(d) if e.startswith("virtfn")),
        }
    return out


def verify(root: Path, report: dict[str, Any]) -> tuple[int, list[str]]:
    """Count of PCI devices in gpuprov's JSON, and every disagreement with the tree."""
    problems: list[str] = []
    devices = report.get("pci_devices")
    if not isinstance(devices, list):
        return 0, ["report has no pci_devices list"]
    got: dict[str, dict[str, Any]] = {str(d.get("address")): d for d in devices if isinstance(d, dict)}
    want = _expected(root)
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing:
        problems.append(f"{len(missing)} devices missing from gpuprov, e.g. {missing[:3]}")
    if extra:
        problems.append(f"{len(extra)} devices gpuprov lists that the tree lacks, e.g. {extra[:3]}")
    wrong: dict[str, list[str]] = {}
    for addr in sorted(set(want) & set(got)):
        g, w = got[addr], want[addr]
        sriov = g.get("sriov") or {}
        seen = {**g, "physfn": sriov.get("physfn"), "virtfns": len(sriov.get("virtfns") or [])}
        for key, value in w.items():
            if seen.get(key) != value:
                wrong.setdefault(key, []).append(f"{addr}: gpuprov {seen.get(key)!r}, tree {value!r}")
    for key, rows in wrong.items():
        problems.append(f"{key} differs on {len(rows)} devices, e.g. {rows[0]}")
    groups = (report.get("iommu") or {}).get("groups")
    n_groups = len(os.listdir(root / "sys/kernel/iommu_groups"))
    if isinstance(groups, list) and len(groups) != n_groups:
        problems.append(f"gpuprov lists {len(groups)} IOMMU groups, the tree has {n_groups}")
    return len(got), problems


def measure(size: Size, root: Path, work: Path, runs: int, env: dict[str, str]) -> None:
    trace_file = work / f"trace-{size.scale:g}.tsv"
    size.trace_ops = write_trace(root, trace_file)
    cmds = _commands(root, trace_file)

    # One checked run of each, outputs kept, before timing.
    g = subprocess.run(cmds["gpuprov"], env=env, capture_output=True, text=True, check=False)
    size.gpuprov_rc = g.returncode
    if g.returncode not in (0, 3):
        raise SystemExit(f"gpuprov inspect failed (rc {g.returncode}) on {root}:\n{g.stderr}")
    size.gpuprov_devices, problems = verify(root, json.loads(g.stdout))
    size.problems += problems
    walk = subprocess.run(cmds["walk"], env={**env, **WALK_ENV}, capture_output=True, text=True, check=False)
    if walk.stdout != g.stdout:
        size.problems.append("gpuprov's report differs without openat2 (GPUPROV_NO_OPENAT2=1)")
    for key in ("lspci_nnk", "lspci"):
        lp = subprocess.run(cmds[key], env=env, capture_output=True, text=True, check=False)
        size.lspci_devices = _lspci_count(lp.stdout)
        if size.lspci_devices != size.devices:
            size.problems.append(
                f"{' '.join(cmds[key][-2:])} listed {size.lspci_devices} of {size.devices} devices: {lp.stderr[-300:]}"
            )
    if size.gpuprov_devices != size.devices:
        size.problems.append(f"gpuprov listed {size.gpuprov_devices} of {size.devices} devices")

    # Interleaved so that drift (cache, CPU clock, the neighbours' load) hits all alike; best of N.
    best = {name: float("inf") for name in cmds}
    cpu = {name: float("inf") for name in cmds}
    for _ in range(runs):
        for name, cmd in cmds.items():
            wall, used = _time_cpu(cmd, {**env, **WALK_ENV} if name == "walk" else env)
            best[name] = min(best[name], wall)
            cpu[name] = min(cpu[name], used)
    size.gpuprov_s, size.walk_s, size.lspci_nnk_s = best["gpuprov"], best["walk"], best["lspci_nnk"]
    size.lspci_s, size.floor_s, size.floor2_s = best["lspci"], best["floor"], best["floor2"]
    size.cpu_s = cpu


def _fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope (s/device) and intercept (s): the fixed cost and the marginal one."""
    n = len(xs)
    if n < 2:
        return float("nan"), float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else float("nan")
    return slope, my - slope * mx


def _startup(env: dict[str, str], runs: int) -> float:
    """Bare interpreter start (``python -c pass``): paid by gpuprov and the floor alike."""
    return min(_time_once([sys.executable, "-c", "pass"], env) for _ in range(max(runs, 3)))


def profile(root: Path, env: dict[str, str], top: int) -> str:
    """cProfile of one full ``gpuprov inspect --json`` run, top functions by own time and cumulative."""
    import pstats
    from io import StringIO

    with tempfile.TemporaryDirectory(prefix="gpuprov-prof-") as tmp:
        prof = Path(tmp) / "inspect.prof"
        cmd = [
            sys.executable,
            "-m",
            "cProfile",
            "-o",
            str(prof),
            "-m",
            "gpuprov",
            "inspect",
            "--json",
            "--root",
            str(root),
        ]
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=False)
        buf = StringIO()
        stats = pstats.Stats(str(prof), stream=buf)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)
        return buf.getvalue()


def _table(sizes: list[Size], startup: float) -> str:
    head = (
        f"{'devices':>8} {'gpuprov s':>10} {'walk s':>7} {'lspci-nnk s':>11} {'lspci-vvv s':>11} {'floor s':>8}"
        f" {'floor/2p s':>10} {'gp/nnk':>7} {'gp/vvv':>7} {'gp/floor':>8} {'cpu gp/nnk':>10}"
        f" {'gp us/dev':>9} {'nnk us/dev':>10}"
    )
    rows = [head, "-" * len(head)]
    for s in sizes:
        rows.append(
            f"{s.devices:>8} {s.gpuprov_s:>10.3f} {s.walk_s:>7.3f} {s.lspci_nnk_s:>11.3f} {s.lspci_s:>11.3f}"
            f" {s.floor_s:>8.3f} {s.floor2_s:>10.3f} {s.vs_lspci_nnk:>7.2f} {s.vs_lspci:>7.2f} {s.vs_floor:>8.2f}"
            f" {s.cpu_vs_lspci_nnk:>10.2f} {s.per_device_us(s.gpuprov_s):>9.1f} {s.per_device_us(s.lspci_nnk_s):>10.1f}"
        )
    xs = [s.devices for s in sizes]
    rows.append("")
    rows.append(
        "CPU s (user + system, best of the runs): "
        + "; ".join(
            f"{s.devices} devices: "
            + ", ".join(f"{label} {s.cpu_s.get(key, float('nan')):.3f}" for key, label in PEERS)
            for s in sizes
        )
    )
    rows.append(f"python startup (python -c pass): {startup:.3f} s, in gpuprov, walk and floor")
    for key, label in PEERS:
        slope, icept = _fit(xs, [getattr(s, f"{key}_s") for s in sizes])
        rows.append(f"linear fit {label:>9}: {slope * 1e6:7.1f} us/device marginal + {icept:.3f} s fixed")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="gpuprov inspect vs lspci -nnk (and -vvv) vs a bare read loop")
    p.add_argument("--scales", default="0.25,0.5,1", help="host sizes as --scale factors (1 = ~2,100 devices)")
    p.add_argument("--runs", type=int, default=5, help="best of this many runs per command")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    p.add_argument("--workdir", type=Path, help="generate roots here (kept); default a temp dir, removed")
    p.add_argument("--profile", action="store_true", help="also cProfile gpuprov on the largest root")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 unless, at the largest size, gpuprov <= lspci -nnk, <= 2x floor and counts agree",
    )
    a = p.parse_args(argv)
    if shutil.which("lspci") is None:
        p.error("lspci not found: install pciutils")
    scales = sorted(float(x) for x in a.scales.split(","))

    work = a.workdir or Path(tempfile.mkdtemp(prefix="gpuprov-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    env = _env()
    sizes: list[Size] = []
    prof_text = ""
    try:
        for scale in scales:
            root = work / f"host-{scale:g}"
            if root.exists():
                shutil.rmtree(root)
            n = make_host_root(root, scale=scale)
            size = Size(scale=scale, devices=n)
            print(f"scale {scale:g}: {n} devices, timing best of {a.runs} ...", file=sys.stderr)
            measure(size, root, work, a.runs, env)
            sizes.append(size)
        startup = _startup(env, a.runs)
        if a.profile:
            prof_text = profile(work / f"host-{scales[-1]:g}", env, 25)
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    lspci_version = subprocess.run(["lspci", "--version"], capture_output=True, text=True).stdout.strip()
    if a.json:
        out = {
            "python": sys.version.split()[0],
            "lspci": lspci_version,
            "runs": a.runs,
            "startup_s": startup,
            "sizes": [
                {
                    **asdict(s),
                    "gpuprov_vs_lspci_nnk": s.vs_lspci_nnk,
                    "gpuprov_cpu_vs_lspci_nnk": s.cpu_vs_lspci_nnk,
                    "gpuprov_vs_lspci": s.vs_lspci,
                    "gpuprov_vs_floor": s.vs_floor,
                    "us_per_device": {k: s.per_device_us(getattr(s, f"{k}_s")) for k, _label in PEERS},
                }
                for s in sizes
            ],
            "fit_us_per_device": {
                k: _fit([s.devices for s in sizes], [getattr(s, f"{k}_s") for s in sizes])[0] * 1e6
                for k, _label in PEERS
            },
        }
        print(json.dumps(out, indent=2))
    else:
        print(f"best of {a.runs} runs; {lspci_version}; Python {sys.version.split()[0]}")
        print(_table(sizes, startup))
        for s in sizes:
            ops = ", ".join(f"{v} {k}" for k, v in s.trace_ops.items())
            print(f"{s.devices} devices: floor replays {ops}")
            for problem in s.problems:
                print(f"  PROBLEM: {problem}")
        if prof_text:
            print(prof_text)

    if a.check:
        big = sizes[-1]
        ok = big.vs_lspci_nnk <= 1.0 and big.vs_floor <= 2.0 and not big.problems
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
