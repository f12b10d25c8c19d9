"""``gpuprov verify``'s GPU container, through the Docker DockerEngine API (gpuprov.facts.docker_api).

How the container asks for the GPUs follows what the engine offers, CDI first
(docs/guides/guests-and-containers.md): the ``nvidia`` runtime (in CDI mode it injects the CDI
devices named by ``NVIDIA_VISIBLE_DEVICES``), else native CDI (Docker >= 25 with CDI on:
``nvidia.com/gpu=all``), else the legacy ``--gpus all`` request that only the legacy hook serves.
Nothing is pulled: the image must be local. With ``--bench`` the same copy and matmul as on the
guest run inside a second container, with the guest's own torch (or cupy) mounted read-only, so
the ratio compares the same code with and without the container.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ..facts.docker_api import (
    ContainerSpec,
    DockerEngine,
    EngineError,
    EngineInfo,
    engine_info,
    image_present,
    local_images,
    run_container,
)

ALL_GPUS = "nvidia.com/gpu=all"
# The injected nvidia-smi is where the guest's driver has it (a CDI spec mounts it at the same path):
# /usr/bin on a distribution's driver, /usr/local/nvidia/bin on NVIDIA's images and these GPU guests.
# NVIDIA's CUDA images set the same PATH; an imported rootfs has none.
CONTAINER_PATH = (
    "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
_UUID = re.compile(r"\(UUID: (GPU-[0-9a-fA-F-]{36})\)")
BENCH_MOUNT = "/opt/gpuprov-bench"
_PREFERRED = ("cuda", "ubuntu", "debian", "rockylinux", "almalinux", "fedora", "centos", "ubi")
_MUSL = ("busybox", "alpine")


@dataclass
class ContainerRun:
    engine: bool  # a Docker engine answered
    status: str  # "ok", "fail", "skip"
    message: str
    image: str | None = None
    exit_code: int | None = None
    output: str | None = None
    gpus: list[str] = field(default_factory=list)  # nvidia-smi -L lines ("GPU 0: ... (UUID: ...)")
    uuids: list[str] = field(default_factory=list)  # the GPUs' UUIDs the container saw
    how: str | None = None  # how the container asked for the GPUs
    engine_runtimes: list[str] | None = None
    engine_version: str | None = None
    bench: list[dict[str, Any]] | None = None  # --bench: the results inside the container (its last round)
    bench_rounds: list[list[dict[str, Any]]] = field(default_factory=list)  # every round's
    bench_error: str | None = None


def pick_image(tagged: list[tuple[int, str]]) -> str | None:
    """A local image to run ``nvidia-smi`` in, from (size, tag) pairs: nvidia/cuda first, then a glibc
    distribution (the injected nvidia-smi needs glibc), then the smallest tagged one not musl-based."""
    for word in _PREFERRED:
        hits = sorted((s, t) for s, t in tagged if word in t.split(":")[0].lower())
        if hits:
            return hits[0][1]
    glibc = sorted((s, t) for s, t in tagged if not any(m in t.split(":")[0].lower() for m in _MUSL))
    return glibc[0][1] if glibc else None


def gpu_request(info: EngineInfo) -> tuple[ContainerSpec, str]:
    """The container's GPU request for this engine, and how it is made (for the report)."""
    spec = ContainerSpec(image="", argv=[], env={"PATH": CONTAINER_PATH})
    if "nvidia" in info.runtimes:
        spec.runtime = "nvidia"
        spec.env["NVIDIA_VISIBLE_DEVICES"] = "all"
        return spec, "the nvidia runtime (NVIDIA_VISIBLE_DEVICES=all)"
    if info.cdi_spec_dirs is not None:
        spec.cdi_devices = [ALL_GPUS]
        return spec, f"native CDI ({ALL_GPUS})"
    spec.legacy_gpus = True
    return spec, "--gpus all (the legacy hook)"


def _refused(said: str) -> str:
    if "could not select device driver" in said or "unknown or invalid runtime" in said:
        return f"Docker cannot hand a GPU to a container ({said}): its NVIDIA runtime is not configured"
    if "unresolvable CDI devices" in said:
        return f"the CDI spec does not name the GPUs asked for ({said}): it is stale"
    if "executable file not found" in said or "no such file" in said.lower():
        return f"the container started but has no nvidia-smi ({said}): the NVIDIA runtime did not inject it"
    return f"the GPU container did not run: {said}"


def run_gpu_container(engine: DockerEngine, image: str | None, *, timeout: float = 120) -> ContainerRun:
    """A container that asks for every GPU and runs ``nvidia-smi -L``; removed afterwards."""
    try:
        info = engine_info(engine)
    except EngineError as exc:
        return ContainerRun(False, "skip", f"no container runtime: no Docker engine answers ({exc})", image)
    run = ContainerRun(True, "skip", "", image, engine_runtimes=info.runtimes, engine_version=info.version)
    spec, run.how = gpu_request(info)
    try:
        if image is None:
            image = run.image = pick_image(local_images(engine))
            if image is None:
                run.message = "no local image to run nvidia-smi in, and nothing is pulled: give --image NAME"
                return run
        elif not image_present(engine, image):
            run.status = "fail"
            run.message = f"image {image} is not on this machine, and nothing is pulled: `docker load` it first"
            return run
        spec.image, spec.argv = image, ["nvidia-smi", "-L"]
        done = run_container(engine, spec, timeout=timeout)
    except EngineError as exc:
        run.status, run.message = "fail", _refused(str(exc).splitlines()[0] if str(exc) else "no message")
        return run
    run.exit_code, run.output = done.exit_code, done.output.strip()
    run.gpus = [line for line in run.output.splitlines() if line.startswith("GPU ")]
    run.uuids = [m.group(1) for line in run.gpus for m in [_UUID.search(line)] if m]
    if done.timed_out:
        run.status, run.message = "fail", f"nvidia-smi -L in {image} did not finish in {timeout:.0f} s"
    elif run.exit_code == 0 and run.gpus:
        run.status = "ok"
        run.message = f"a container from {image} sees {len(run.gpus)} GPU(s) through {run.how}"
    else:
        run.status = "fail"
        tail = run.output.splitlines()[-1:] or ["no output"]
        run.message = f"nvidia-smi -L in {image} exited {run.exit_code}: {tail[0]}"
    return run


def _bench_source() -> str:
    """gpuprov.verify.bench's own source (also from inside a module's zip), run in the container as a script."""
    return module_source("bench")


def module_source(module: str) -> str:
    """The source of gpuprov.verify's ``module`` through its loader (also from inside an AnsiballZ zip):
    what a container runs as a script."""
    name = __name__.rsplit(".", 1)[0] + "." + module
    spec = importlib.util.find_spec(name)
    loader = spec.loader if spec is not None else None
    source = loader.get_source(name) if loader is not None and hasattr(loader, "get_source") else None
    if not source:
        raise OSError(f"cannot read {name}'s source")
    return source


def run_bench_container(engine: DockerEngine, run: ContainerRun, backend: Any, *, timeout: float = 600) -> bool:
    """The bench in a container from ``run.image`` with the same GPU request, the guest's backend
    (torch or cupy) mounted read-only at its own path; adds a round to ``run.bench_rounds`` (True), or
    says why not in ``run.bench_error`` (False)."""
    module = backend[1]
    site = os.path.dirname(os.path.dirname(os.path.abspath(module.__file__)))
    info = engine_info(engine)
    spec, _how = gpu_request(info)
    spec.image = run.image or ""
    tmp = tempfile.mkdtemp(prefix="gpuprov-bench-")
    try:
        with open(os.path.join(tmp, "bench.py"), "w", encoding="utf-8") as f:
            f.write(_bench_source())
        os.chmod(tmp, 0o755)
        spec.binds = [f"{tmp}:{BENCH_MOUNT}:ro", f"{site}:{site}:ro"]
        spec.env.update({"PYTHONPATH": site, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONDONTWRITEBYTECODE": "1"})
        spec.argv = ["python3", f"{BENCH_MOUNT}/bench.py"]
        done = run_container(engine, spec, timeout=timeout)
    except (EngineError, OSError) as exc:
        run.bench_error = f"the bench container did not run: {exc}"
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines = [line for line in done.output.splitlines() if line.startswith("{")]
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if done.exit_code != 0 or not isinstance(answer, dict) or not isinstance(answer.get("results"), list):
        tail = (done.output.strip().splitlines() or ["no output"])[-1][:300]
        run.bench_error = f"the bench in {run.image} exited {done.exit_code}: {tail}"
        return False
    run.bench = [r for r in answer["results"] if isinstance(r, dict)]
    run.bench_rounds.append(run.bench)
    return True
