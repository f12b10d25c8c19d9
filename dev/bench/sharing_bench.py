"""Aggregate matmul TFLOP/s of N tenant containers on one GPU: exclusive turns, time-sliced side by side, and MPS.

Run as root on a GPU guest with Docker and the nvidia runtime (CDI mode), while the guest's GPU is
declared exclusive: the containers name the GPU by its UUID, and its CDI spec must then carry no
MPS plumbing. The bench starts (and stops) its own MPS daemon for the third way, so it refuses to
run (exit 2) while an nvidia-cuda-mps process runs. It never changes a GPU setting (no compute
mode, MIG, clocks or reset).

    python3 dev/bench/sharing_bench.py --image nvidia/cuda:12.4.1-base-ubuntu22.04
    python3 dev/bench/sharing_bench.py --image IMG --counts 1,4 --sizes 2048 --seconds 4 --json /tmp/sharing.json

For each kernel size (bf16 NxNxN matmuls) and each N in --counts, N containers of the image run
gpuprov.verify.tenant_load with the guest's torch (gpuprov.verify.sharing_bench.run_tenants):

- exclusive: the N take turns, each alone for SECONDS/N (a short gap between turns); the others are
  up and warm but idle. Aggregate: every turn's flops over the turns' summed time.
- plain: the N side by side for SECONDS, time-sliced by the driver. Aggregate: the sum of each
  container's TFLOP/s over the common window.
- mps: the same as MPS clients of the bench's daemon (the guest's /dev/shm and the pipe directory
  mounted into each container).

Every round waits LEAD seconds (10 + N by default) for its containers to start and warm up before
the common start, so each costs about LEAD + SECONDS + 2 s: with the defaults (sizes 1024,8192,
counts 1,2,4,8, 6 s) the whole run takes about 9 minutes. Progress goes to stderr, the table to stdout.
Exit 0, 1 when a round gave no figure or an MPS process outlived the bench, 2 when it cannot start.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from gpuprov.facts.docker_api import DockerEngine, EngineError, find_engine, image_present  # noqa: E402
from gpuprov.verify.sharing_bench import STARTUP_S, Tenant, run_tenants, throughput_argv  # noqa: E402

TURN_GAP_S = 0.3  # between exclusive turns: more than one batch of matmuls, so turns never overlap
LATE_S = 0.5  # a container that starts measuring later than this shortens the common window
BEGUN = time.monotonic()


def say(line: str) -> None:
    print(f"[{time.monotonic() - BEGUN:6.0f}s] {line}", file=sys.stderr, flush=True)


def mps_processes() -> list[str]:
    """'pid name' of every running nvidia-cuda-mps-* process (control daemon or server)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv0 = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0", 1)[0].decode("utf-8", "replace")
        except OSError:
            continue
        if os.path.basename(argv0).startswith("nvidia-cuda-mps"):
            found.append(f"{entry} {os.path.basename(argv0)}")
    return found


def gpu_uuid(index: int) -> str:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True, check=True
    ).stdout
    uuids = [line.strip() for line in out.splitlines() if line.strip()]
    if index >= len(uuids):
        raise ValueError(f"nvidia-smi lists {len(uuids)} GPU(s), no index {index}")
    return uuids[index]


def torch_site() -> str:
    """The directory that holds this python's torch: mounted read-only into every container."""
    torch = importlib.import_module("torch")
    return os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))


class MpsDaemon:
    """The bench's own MPS control daemon for one GPU, its pipe and log directories in a fresh temp dir."""

    def __init__(self, uuid: str) -> None:
        self.root = tempfile.mkdtemp(prefix="gpuprov-sharing-mps-")
        self.pipe, self.log = os.path.join(self.root, "pipe"), os.path.join(self.root, "log")
        self.env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": self.pipe, "CUDA_MPS_LOG_DIRECTORY": self.log}
        self.env["CUDA_VISIBLE_DEVICES"] = uuid
        self.left: list[str] = []

    def client(self, name: str, uuid: str) -> Tenant:
        env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe}
        return Tenant(name, uuid, env, binds=["/dev/shm:/dev/shm", f"{self.pipe}:{self.pipe}"])

    def log_tail(self, lines: int = 5) -> str:
        tails = []
        for name in ("control.log", "server.log"):
            with contextlib.suppress(OSError):
                tails += [f"{name}: {x}" for x in Path(self.log, name).read_text().splitlines()[-lines:]]
        return "\n".join(tails)

    @contextlib.contextmanager
    def running(self) -> Iterator[MpsDaemon]:
        try:
            os.makedirs(self.pipe)
            os.makedirs(self.log)
            subprocess.run(["nvidia-cuda-mps-control", "-d"], env=self.env, check=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            self.left = mps_processes()  # -d that failed half-way may still have left a daemon
            if not self.left:
                shutil.rmtree(self.root, ignore_errors=True)
            raise
        say(f"MPS control daemon started (pipe {self.pipe})")
        try:
            yield self
        finally:
            subprocess.run(
                ["nvidia-cuda-mps-control"], input="quit\n", text=True, env=self.env, timeout=60, check=False
            )
            deadline = time.monotonic() + 30
            while (left := mps_processes()) and time.monotonic() < deadline:
                time.sleep(0.5)
            self.left = left
            if left:
                say(f"MPS processes still run after quit: {', '.join(left)} (their files: {self.root})")
            else:
                say("MPS control daemon stopped")
                shutil.rmtree(self.root, ignore_errors=True)


def _round(
    engine: DockerEngine, image: str, site: str, tenants: list[Tenant], n: int, seconds: float, lead: float, turns: bool
) -> dict[str, Any]:
    """One round of the N tenants: side by side from a common start, or (turns) one after another."""
    window = seconds / len(tenants) if turns else seconds
    index = {t.name: i for i, t in enumerate(tenants)}
    start_at = time.time() + lead

    def argv(t: Tenant) -> list[str]:
        return throughput_argv(n, window, start_at + (index[t.name] * (window + TURN_GAP_S) if turns else 0.0))

    timeout = lead + seconds + len(tenants) * TURN_GAP_S + STARTUP_S
    got = run_tenants(engine, image, site, tenants, argv, timeout=timeout)
    answers = [a for a in got.values() if isinstance(a, dict)]
    errors = [a for a in got.values() if isinstance(a, str)]
    result: dict[str, Any] = {"tflops": None, "tenants": list(got.values()), "errors": errors}
    if errors or not answers:
        return result
    if turns:  # every turn's flops over the turns' time: the gaps and the waits are nobody's
        flops = sum(a["tflops"] * a["seconds"] for a in answers)
        result["tflops"] = round(flops / sum(a["seconds"] for a in answers), 1)
    else:
        result["tflops"] = round(sum(a["tflops"] for a in answers), 1)
        result["overlap_s"] = round(min(a["ended"] for a in answers) - max(a["started"] for a in answers), 2)
    result["late_s"] = max(a.get("late_s", 0.0) for a in answers)
    return result


def _report(row: dict[str, Any], way: str) -> None:
    got = row[way]
    figure = f"{got['tflops']:.1f} TFLOP/s" if got["tflops"] is not None else "no figure"
    say(f"n={row['n']} N={row['tenants']} {way}: {figure}")
    for error in got["errors"]:
        say(f"  {error}")
    if got.get("late_s", 0.0) > LATE_S:
        say(f"  a container started {got['late_s']:.1f} s late: raise --lead")


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def table(rows: list[dict[str, Any]]) -> str:
    def cell(x: float | None, width: int, digits: int) -> str:
        return f"{x:{width}.{digits}f}" if x is not None else f"{'-':>{width}}"

    lines = [f"{'size':>6} {'N':>3} {'exclusive':>10} {'plain':>8} {'mps':>8} {'mps/plain':>10} {'mps/excl':>9}"]
    for r in rows:
        ex, plain, mps = (r[w]["tflops"] if w in r else None for w in ("exclusive", "plain", "mps"))
        lines.append(
            f"{r['n']:>6} {r['tenants']:>3} {cell(ex, 10, 1)} {cell(plain, 8, 1)} {cell(mps, 8, 1)} "
            f"{cell(r.get('mps/plain'), 10, 2)} {cell(r.get('mps/exclusive'), 9, 2)}"
        )
    return "\n".join([*lines, "(aggregate TFLOP/s of bf16 NxNxN matmuls)"])


def _ints(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"a comma-separated list of positive integers, not {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--image", required=True, help="a local image with python3 (nothing is pulled)")
    p.add_argument("--counts", type=_ints, default=[1, 2, 4, 8], help="numbers of tenants (default 1,2,4,8)")
    p.add_argument("--sizes", type=_ints, default=[1024, 8192], help="matmul sizes N (default 1024,8192)")
    p.add_argument("--seconds", type=float, default=6.0, help="measured seconds per round (default 6)")
    p.add_argument("--lead", type=float, default=0.0, help="seconds to start and warm up (default 10 + N)")
    p.add_argument("--gpu-index", type=int, default=0, help="the GPU, as nvidia-smi numbers it (default 0)")
    p.add_argument("--json", type=Path, help="also write every figure here")
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("run it as root: the MPS daemon and the containers' clients must be the same user", file=sys.stderr)
        return 2
    if mps_processes():
        print(f"an MPS daemon already runs ({', '.join(mps_processes())}): declare the GPU exclusive", file=sys.stderr)
        return 2
    try:
        uuid, site = gpu_uuid(a.gpu_index), torch_site()
        engine = find_engine("/")
        if engine is None or not engine.ping():
            raise OSError("no Docker engine answers on /var/run/docker.sock")
        if not image_present(engine, a.image):
            raise OSError(f"image {a.image} is not on this machine, and nothing is pulled")
    except (OSError, ValueError, ImportError, EngineError, subprocess.SubprocessError) as exc:
        print(f"cannot start: {exc}", file=sys.stderr)
        return 2
    say(f"GPU {uuid}, torch from {site}, image {a.image}")
    rows = [{"n": n, "tenants": k} for n in a.sizes for k in a.counts]

    def tenants(k: int, mps: MpsDaemon | None = None) -> list[Tenant]:
        return [mps.client(f"t{i}", uuid) if mps else Tenant(f"t{i}", uuid) for i in range(k)]

    for row in rows:
        k, lead = row["tenants"], a.lead or 10.0 + row["tenants"]
        for way, turns in (("exclusive", True), ("plain", False)):
            row[way] = _round(engine, a.image, site, tenants(k), row["n"], a.seconds, lead, turns)
            _report(row, way)
    daemon = MpsDaemon(uuid)
    try:
        with daemon.running():
            for row in rows:
                lead = a.lead or 10.0 + row["tenants"]
                row["mps"] = _round(
                    engine, a.image, site, tenants(row["tenants"], daemon), row["n"], a.seconds, lead, False
                )
                _report(row, "mps")
                if row["mps"]["errors"]:
                    say(daemon.log_tail())
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"no MPS figures: {exc}")
    for row in rows:
        row["mps/plain"] = _ratio(row.get("mps", {}).get("tflops"), row["plain"]["tflops"])
        row["mps/exclusive"] = _ratio(row.get("mps", {}).get("tflops"), row["exclusive"]["tflops"])
    print(table(rows))
    if a.json:
        meta = {"gpu": uuid, "image": a.image, "seconds": a.seconds, "counts": a.counts, "sizes": a.sizes}
        a.json.write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    failed = any(row.get(w, {"tflops": None})["tflops"] is None for row in rows for w in ("exclusive", "plain", "mps"))
    return 1 if failed or daemon.left else 0


if __name__ == "__main__":
    sys.exit(main())
