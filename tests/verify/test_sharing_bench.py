"""The sharing bench without a GPU: the share arithmetic, tenant_load.py run as a script against a
stand-in torch, and the tenant containers against a fake Docker engine on a unix socket."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprov.facts.docker_api import DockerEngine
from gpuprov.verify import tenant_load
from gpuprov.verify.sharing_bench import (
    Tenant,
    measure_isolation,
    measure_memory,
    measure_sharing,
    overlap,
    run_tenants,
    share_error,
    tenant_source,
    throughput_argv,
    within,
)
from tests.fakedocker import FakeDockerd

# Measured on an H200 guest (bf16 8192^3): the whole GPU, 75%/25% side by side, 25% alone.
WHOLE = 666.7

# ---------------------------------------------------------------- the arithmetic


def test_a_share_near_its_declared_percent_is_within_ten_percent() -> None:
    assert share_error(499.4, WHOLE, 75) == pytest.approx(-0.00125, abs=1e-4)  # 0.7491 of the whole
    assert share_error(167.9, WHOLE, 25) == pytest.approx(0.00735, abs=1e-4)  # 0.2518
    assert within(share_error(499.4, WHOLE, 75)) and within(share_error(167.9, WHOLE, 25))


def test_a_quarter_of_the_sms_alone_gives_more_than_a_quarter() -> None:
    """231.7 of 666.7 is 0.348 of the GPU: 39% over a 25% share, so alone is no test of the split."""
    error = share_error(231.7, WHOLE, 25)
    assert error == pytest.approx(0.390, abs=1e-3)
    assert not within(error) and within(error, tolerance=0.4)


def test_within_is_symmetric_and_inclusive() -> None:
    assert within(-0.10) and within(0.10) and not within(-0.1001) and not within(0.11)


@pytest.mark.parametrize(("whole", "percent"), [(0.0, 50), (-1.0, 50), (WHOLE, 0), (WHOLE, 101)])
def test_a_share_of_nothing_is_refused(whole: float, percent: float) -> None:
    with pytest.raises(ValueError, match="a share needs"):
        share_error(100.0, whole, percent)


def test_overlap_is_the_window_every_tenant_measured_in() -> None:
    assert overlap([{"started": 100.0, "ended": 110.0}, {"started": 102.0, "ended": 111.0}]) == 8.0
    assert overlap([{"started": 100.0, "ended": 101.0}, {"started": 102.0, "ended": 103.0}]) == 0.0
    assert overlap([{"started": 100.0, "ended": 110.0}, "b: the container exited 1"]) is None


# ---------------------------------------------------------------- tenant_load.py, the script


def test_the_modes_and_their_defaults() -> None:
    args = tenant_load.parse_args(["throughput", "--n", "4096", "--seconds", "2.5", "--start-at", "1767225600.25"])
    assert (args.mode, args.n, args.seconds, args.start_at) == ("throughput", 4096, 2.5, 1767225600.25)
    args = tenant_load.parse_args(["latency"])
    assert (args.mode, args.n, args.seconds, args.start_at) == ("latency", 1024, 8.0, 0.0)
    assert tenant_load.parse_args(["alloc", "--mib", "40960"]).mib == 40960
    assert tenant_load.parse_args(throughput_argv(8192, 8.0, 12.0)).start_at == 12.0


@pytest.mark.parametrize("argv", [[], ["alloc"], ["alloc", "--mib", "0"], ["throughput", "--seconds", "-1"], ["nap"]])
def test_bad_arguments_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        tenant_load.parse_args(argv)
    assert stop.value.code == 2


@pytest.fixture
def script(tmp_path: Path) -> Path:
    """What the containers run: the source tenant_source() stages, alone in a folder."""
    path = tmp_path / "alone" / "tenant_load.py"
    path.parent.mkdir()
    path.write_text(tenant_source())
    assert path.read_text() == Path(tenant_load.__file__).read_text()
    return path


def _run(argv: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(argv, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=60)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, (done.stdout, done.stderr)
    return done.returncode, json.loads(lines[0])


def test_without_torch_it_says_so_and_exits_1(script: Path) -> None:
    """-I -S: no site-packages and no PYTHONPATH, so torch does not import even where it is installed."""
    env = {"PYTHONPATH": "", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}
    code, answer = _run([sys.executable, "-I", "-S", str(script), "throughput", "--seconds", "1"], env)
    assert code == 1
    assert answer["error"].startswith("torch does not import here (ModuleNotFoundError")
    assert answer["env"] == {
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": None,
        "CUDA_MPS_PIPE_DIRECTORY": None,
    }


# A stand-in torch: CUDA "works", kernels take no time, memory runs out past FAKE_LIMIT_MIB.
FAKE_TORCH = """
import os
bfloat16, uint8 = "bfloat16", "uint8"
LIMIT = int(os.environ.get("FAKE_LIMIT_MIB", "1000000")) << 20
held = [0]

class OutOfMemoryError(RuntimeError):
    pass

class cuda:
    OutOfMemoryError = OutOfMemoryError
    is_available = staticmethod(lambda: not os.environ.get("FAKE_NO_CUDA"))
    device_count = staticmethod(lambda: 1)
    get_device_name = staticmethod(lambda i: "NVIDIA H200 (stand-in)")
    synchronize = staticmethod(lambda: None)
    empty_cache = staticmethod(lambda: None)

class Tensor:
    def __init__(self, nbytes=0):
        self.nbytes = nbytes
        held[0] += nbytes
    def __del__(self):
        held[0] -= self.nbytes

def device(name):
    return name

def randn(*shape, device=None, dtype=None):
    return Tensor()

def empty(*shape, device=None, dtype=None):
    nbytes = shape[0] if dtype == uint8 else 0
    if held[0] + nbytes > LIMIT:
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 256.00 MiB.\\nGPU 0 has a total capacity...")
    return Tensor(nbytes)

def matmul(a, b, out=None):
    return out
"""


@pytest.fixture
def fake_torch(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "site" / "torch").mkdir(parents=True)
    (tmp_path / "site" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return {"PYTHONPATH": str(tmp_path / "site")}


def test_alloc_stops_at_the_first_refused_chunk(script: Path, fake_torch: dict[str, str]) -> None:
    code, answer = _run(
        [sys.executable, "-S", str(script), "alloc", "--mib", "2000"], {**fake_torch, "FAKE_LIMIT_MIB": "1000"}
    )
    assert code == 0  # a refusal is the figure, not a failure
    assert (answer["asked_mib"], answer["got_mib"], answer["refused"]) == (2000, 768, True)  # 3 chunks of 256
    assert answer["error"] == "CUDA out of memory. Tried to allocate 256.00 MiB."
    assert answer["device"] == "NVIDIA H200 (stand-in)"


def test_alloc_takes_a_last_partial_chunk(script: Path, fake_torch: dict[str, str]) -> None:
    code, answer = _run([sys.executable, "-S", str(script), "alloc", "--mib", "600"], fake_torch)
    assert code == 0 and (answer["got_mib"], answer["refused"], answer["error"]) == (600, False, None)


def test_throughput_waits_for_the_common_start(script: Path, fake_torch: dict[str, str]) -> None:
    start_at = time.time() + 1.0
    argv = [sys.executable, "-S", str(script), *throughput_argv(8192, 0.2, start_at)]
    code, answer = _run(argv, {**fake_torch, "CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps"})
    assert code == 0 and answer["mode"] == "throughput" and answer["n"] == 8192
    assert answer["started"] >= round(start_at, 3) - 0.001 and answer["late_s"] < 0.5
    assert answer["seconds"] >= 0.2 and answer["ended"] == pytest.approx(
        answer["started"] + answer["seconds"], abs=0.01
    )
    assert answer["iterations"] % 10 == 0 and answer["tflops"] > 0  # 8192^3 is over a batch's flops: 10 a sync
    assert answer["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"


def test_latency_gives_quantiles(script: Path, fake_torch: dict[str, str]) -> None:
    code, answer = _run([sys.executable, "-S", str(script), "latency", "--seconds", "0.2"], fake_torch)
    assert code == 0 and answer["mode"] == "latency" and answer["n"] == 1024
    assert 0 < answer["samples"] <= tenant_load.MAX_SAMPLES
    assert 0 <= answer["p50_ms"] <= answer["p99_ms"]


def test_torch_without_a_device_exits_1(script: Path, fake_torch: dict[str, str]) -> None:
    code, answer = _run([sys.executable, "-S", str(script), "latency"], {**fake_torch, "FAKE_NO_CUDA": "1"})
    assert code == 1 and answer["error"] == "torch imports but sees no CUDA device"


# ---------------------------------------------------------------- the containers, against a fake engine


class TenantDockerd(FakeDockerd):
    """The fake engine, one request at a time (its container ids come from a count that concurrent
    creates would race on); with ``together``, no container's wait answers before that many have
    started, so a run that starts them one after another never finishes."""

    def __init__(self, socket_path: Path, *, together: int = 0, **kwargs: Any) -> None:
        super().__init__(socket_path, **kwargs)
        self._lock = threading.Lock()
        self._barrier = threading.Barrier(together, timeout=10) if together else None

    def route(self, h: Any, method: str) -> None:
        if self._barrier is not None and h.path.endswith("/wait"):
            self._barrier.wait()
        with self._lock:
            super().route(h, method)


@pytest.fixture
def dockerd(tmp_path: Path) -> Iterator[Any]:
    made: list[TenantDockerd] = []

    def make(**kwargs: Any) -> tuple[TenantDockerd, DockerEngine]:
        fake = TenantDockerd(tmp_path / f"docker{len(made)}.sock", **kwargs)
        made.append(fake)
        return fake, DockerEngine(fake.socket_path, timeout=20)

    yield make
    for fake in made:
        fake.close()


def _env(created: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in created["Env"])


def _by_devices(fake: FakeDockerd) -> dict[str, dict[str, Any]]:
    return {_env(c)["NVIDIA_VISIBLE_DEVICES"]: c for c in fake.created}


TP = {"mode": "throughput", "n": 8192, "tflops": 333.3, "started": 100.0, "ended": 108.0, "seconds": 8.0}
SITE = "/usr/lib/python3/dist-packages"


def test_one_container_per_tenant_at_once_each_removed(dockerd: Any) -> None:
    fake, engine = dockerd(together=2, bench_output="a torch warning\n" + json.dumps(TP) + "\n")
    tenants = [
        Tenant("a", "nvidia.com/gpu=0,nvidia.com/gpu=mps-a", {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "75"}),
        Tenant("b", "nvidia.com/gpu=mps-b", {"NVIDIA_VISIBLE_DEVICES": "all"}),  # env cannot widen it
    ]
    got = run_tenants(engine, "cuda:12", SITE, tenants, lambda t: throughput_argv(8192, 8.0, 42.0), timeout=30)
    assert got == {"a": TP, "b": TP}
    assert len(fake.created) == 2 and fake.removed == 2
    by = _by_devices(fake)
    assert set(by) == {"nvidia.com/gpu=0,nvidia.com/gpu=mps-a", "nvidia.com/gpu=mps-b"}
    a = by["nvidia.com/gpu=0,nvidia.com/gpu=mps-a"]
    assert a["Image"] == "cuda:12" and a["HostConfig"]["Runtime"] == "nvidia" and a["NetworkDisabled"] is True
    assert a["Cmd"] == ["python3", "/opt/gpuprov-tenant/tenant_load.py", *throughput_argv(8192, 8.0, 42.0)]
    env = _env(a)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75" and env["PYTHONPATH"] == SITE
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["PYTHONDONTWRITEBYTECODE"] == "1"
    staged, mount, ro = a["HostConfig"]["Binds"][0].split(":")
    assert (mount, ro) == ("/opt/gpuprov-tenant", "ro") and a["HostConfig"]["Binds"][1:] == [f"{SITE}:{SITE}:ro"]
    assert not os.path.exists(staged)  # the staged script is gone with the run


def test_a_failed_tenant_is_a_line_that_says_why(dockerd: Any) -> None:
    fake, engine = dockerd(exit_code=1, bench_output='{"error": "torch imports but sees no CUDA device"}\n')
    got = run_tenants(engine, "cuda:12", SITE, [Tenant("a", "0")], lambda t: ["latency"], timeout=30)
    assert got == {"a": "a: the container exited 1: torch imports but sees no CUDA device"}
    assert fake.removed == 1


def test_a_refused_container_is_removed(dockerd: Any) -> None:
    fake, engine = dockerd(start_error="unresolvable CDI devices nvidia.com/gpu=mps-c")
    got = run_tenants(engine, "cuda:12", SITE, [Tenant("c", "nvidia.com/gpu=mps-c")], lambda t: ["latency"], timeout=30)
    assert got == {"c": "c: the container did not run: unresolvable CDI devices nvidia.com/gpu=mps-c"}
    assert len(fake.created) == 1 and fake.removed == 1


def test_tenants_need_their_own_names(dockerd: Any) -> None:
    fake, engine = dockerd()
    with pytest.raises(ValueError, match="tenant names must differ"):
        run_tenants(engine, "cuda:12", SITE, [Tenant("a", "0"), Tenant("a", "1")], lambda t: [], timeout=30)
    assert fake.created == []


def test_measure_sharing_runs_alone_then_together(dockerd: Any) -> None:
    fake, engine = dockerd(bench_output=json.dumps(TP) + "\n")
    tenants = [Tenant("a", "nvidia.com/gpu=mps-a"), Tenant("b", "nvidia.com/gpu=mps-b")]
    before = time.time()
    figures = measure_sharing(engine, "cuda:12", SITE, tenants, reference=Tenant("whole", "0"), seconds=8.0, lead=30)
    assert figures.whole == 333.3 and figures.overlap_s == 8.0 and figures.errors == []
    assert {k: (v.alone, v.side_by_side, v.errors) for k, v in figures.tenants.items()} == {
        "a": (333.3, 333.3, []),
        "b": (333.3, 333.3, []),
    }
    assert len(fake.created) == 5 and fake.removed == 5  # the reference, a and b alone, a and b together
    starts = [float(c["Cmd"][c["Cmd"].index("--start-at") + 1]) for c in fake.created]
    assert starts[:3] == [0.0, 0.0, 0.0]  # alone: as soon as warm
    assert starts[3] == starts[4] and before + 30 <= starts[3] <= time.time() + 30


def test_measure_memory_and_isolation(dockerd: Any) -> None:
    alloc = {"mode": "alloc", "asked_mib": 4096, "got_mib": 2048, "refused": True, "error": "CUDA out of memory."}
    fake, engine = dockerd(bench_output=json.dumps(alloc) + "\n")
    assert measure_memory(engine, "cuda:12", SITE, Tenant("a", "nvidia.com/gpu=mps-a"), 4096) == alloc
    assert fake.created[0]["Cmd"][2:] == ["alloc", "--mib", "4096"]

    latency = {"mode": "latency", "n": 1024, "samples": 9000, "p50_ms": 0.02, "p99_ms": 0.05, "tflops": 1.0}
    fake, engine = dockerd(bench_output=json.dumps(latency) + "\n")
    quiet, noisy = Tenant("q", "nvidia.com/gpu=mps-a"), Tenant("n", "nvidia.com/gpu=mps-b")
    found = measure_isolation(engine, "cuda:12", SITE, quiet, noisy, seconds=4.0, lead=5)
    assert found["alone"] == found["beside"] == {"p50_ms": 0.02, "p99_ms": 0.05}
    assert found["p99_ratio"] == 1.0 and found["errors"] == []
    alone, *together = fake.created
    assert alone["Cmd"][2:] == ["latency", "--n", "1024", "--seconds", "4", "--start-at", "0.000"]
    by = {c["Cmd"][2]: c["Cmd"] for c in together}
    assert by["latency"][-1] == by["throughput"][-1] != "0.000"  # the same window
    assert by["throughput"][3:5] == ["--n", "8192"]
