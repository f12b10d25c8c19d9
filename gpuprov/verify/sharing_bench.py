"""How a shared GPU splits between tenant containers: matmul throughput alone and side by side, memory, latency.

Each tenant is a container from one local image that runs gpuprov.verify.tenant_load with the
guest's own torch mounted read-only (as ``gpuprov verify --bench`` runs bench.py). A tenant's
share is its ``NVIDIA_VISIBLE_DEVICES`` value: the ``nvidia`` runtime in CDI mode injects those
devices, and the CDI spec of a GPU shared with MPS brings the client's plumbing (pipe directory,
the daemon's /dev/shm), so nothing here knows MPS paths. Containers that are measured together
start together: each warms up, then sleeps until a common wall-clock time, so one container's
slower start-up does not shorten another's window. Only the standard library and gpuprov: this
ships to targets as module_utils (torch lives in the containers only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..facts.docker_api import ContainerSpec, DockerEngine, EngineError, run_container
from .container import CONTAINER_PATH, module_source

TENANT_MOUNT = "/opt/gpuprov-tenant"
# A tenant's device as the sharing record names it: a GPU's UUID, or a CDI name (nvidia.com/gpu=ENTRY-TENANT).
CDI_DEVICE = re.compile(r"(?:[a-z0-9.-]{1,63}/[a-z0-9.-]{1,63}=)?[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
SCRIPT = "tenant_load.py"
STARTUP_S = 180.0  # a container's start, torch's import and CUDA's start-up, on top of what it measures


@dataclass
class Tenant:
    """One tenant container: ``visible`` is its NVIDIA_VISIBLE_DEVICES value ("all", "0", a UUID, or
    CDI names such as "nvidia.com/gpu=0,nvidia.com/gpu=mps-a"); ``env`` is added to its environment
    (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, say); ``binds`` are extra "host:container[:ro]" mounts, for a
    bench that runs its own MPS daemon outside any CDI spec (dev/bench/sharing_bench.py)."""

    name: str
    visible: str
    env: dict[str, str] = field(default_factory=dict)
    binds: list[str] = field(default_factory=list)


def tenant_source() -> str:
    """gpuprov.verify.tenant_load's own source: what each tenant container runs."""
    return module_source("tenant_load")


def last_json(output: str) -> dict[str, Any] | None:
    """The last line of ``output`` that is a JSON object (torch's warnings may come before it)."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            return answer if isinstance(answer, dict) else None
    return None


def _spec(image: str, site: str, staged: str, tenant: Tenant, argv: list[str]) -> ContainerSpec:
    env = {"PATH": CONTAINER_PATH, "PYTHONPATH": site, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the mounts are read-only
    env.update(tenant.env)
    env["NVIDIA_VISIBLE_DEVICES"] = tenant.visible  # ``visible`` is the share: ``env`` cannot widen it
    binds = [f"{staged}:{TENANT_MOUNT}:ro", f"{site}:{site}:ro", *tenant.binds]
    return ContainerSpec(image, ["python3", f"{TENANT_MOUNT}/{SCRIPT}", *argv], env, runtime="nvidia", binds=binds)


def _run_one(engine: DockerEngine, spec: ContainerSpec, name: str, timeout: float) -> dict[str, Any] | str:
    try:
        done = run_container(engine, spec, timeout=timeout)
    except EngineError as exc:
        return f"{name}: the container did not run: {str(exc).splitlines()[0] if str(exc) else 'no message'}"
    if done.timed_out:
        return f"{name}: the container did not finish in {timeout:.0f} s (stopped)"
    answer = last_json(done.output)
    if done.exit_code != 0 or answer is None or "mode" not in answer:  # {"error": ...}: no torch, no GPU
        said = answer.get("error") if answer else None
        tail = said or (done.output.strip().splitlines() or ["no output"])[-1][:300]
        return f"{name}: the container exited {done.exit_code}: {tail}"
    return answer


def run_tenants(
    engine: DockerEngine,
    image: str,
    site: str,
    tenants: Sequence[Tenant],
    argv_for: Callable[[Tenant], list[str]],
    *,
    timeout: float,
) -> dict[str, dict[str, Any] | str]:
    """One container per tenant, all at once (a thread each: every engine call opens its own
    connection), running tenant_load.py with ``argv_for(tenant)``; each tenant's JSON answer, or a
    line that says why there is none. ``site`` is the guest's directory that holds torch, mounted
    read-only at the same path. Every container is removed (run_container), timed out or not."""
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError(f"tenant names must differ: {names}")
    staged = tempfile.mkdtemp(prefix="gpuprov-tenant-")
    try:
        with open(os.path.join(staged, SCRIPT), "w", encoding="utf-8") as f:
            f.write(tenant_source())
        os.chmod(staged, 0o755)  # the container's user reads it through the read-only mount
        specs = [(t.name, _spec(image, site, staged, t, argv_for(t))) for t in tenants]
        with ThreadPoolExecutor(max_workers=max(1, len(specs))) as pool:
            futures = {name: pool.submit(_run_one, engine, spec, name, timeout) for name, spec in specs}
            return {name: future.result() for name, future in futures.items()}
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def throughput_argv(n: int, seconds: float, start_at: float = 0.0) -> list[str]:
    return ["throughput", "--n", str(n), "--seconds", f"{seconds:g}", "--start-at", f"{start_at:.3f}"]


def latency_argv(n: int, seconds: float, start_at: float = 0.0) -> list[str]:
    return ["latency", "--n", str(n), "--seconds", f"{seconds:g}", "--start-at", f"{start_at:.3f}"]


@dataclass
class TenantFigures:
    alone: float | None = None  # TFLOP/s with no other tenant running
    side_by_side: float | None = None  # TFLOP/s while every tenant runs
    errors: list[str] = field(default_factory=list)


@dataclass
class SharingFigures:
    """What measure_sharing found. ``whole`` is the unrestricted reference's TFLOP/s alone (None
    without a reference): the denominator of each tenant's share (share_error)."""

    whole: float | None
    tenants: dict[str, TenantFigures]
    overlap_s: float | None = None  # how long every side-by-side window ran together
    errors: list[str] = field(default_factory=list)  # the reference's


def _tflops(answer: dict[str, Any] | str) -> float | None:
    value = answer.get("tflops") if isinstance(answer, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def measure_sharing(
    engine: DockerEngine,
    image: str,
    site: str,
    tenants: Sequence[Tenant],
    *,
    reference: Tenant | None = None,
    n: int = 8192,
    seconds: float = 8.0,
    lead: float = 20.0,
) -> SharingFigures:
    """The reference alone (when given), each tenant alone one after another, then every tenant side
    by side from a common start ``lead`` seconds ahead (enough for all of them to start and warm up).
    Alone says what a tenant's cap allows; side by side says what it keeps when the others push."""
    timeout = lead + seconds + STARTUP_S
    figures = SharingFigures(whole=None, tenants={t.name: TenantFigures() for t in tenants})

    def alone(tenant: Tenant) -> dict[str, Any] | str:  # starts measuring as soon as it is warm
        got = run_tenants(engine, image, site, [tenant], lambda t: throughput_argv(n, seconds), timeout=timeout)
        return got[tenant.name]

    if reference is not None:
        got = alone(reference)
        figures.whole = _tflops(got)
        figures.errors += [got] if isinstance(got, str) else []
    for tenant in tenants:
        got = alone(tenant)
        figures.tenants[tenant.name].alone = _tflops(got)
        figures.tenants[tenant.name].errors += [got] if isinstance(got, str) else []
    start_at = time.time() + lead
    together = run_tenants(
        engine, image, site, tenants, lambda t: throughput_argv(n, seconds, start_at), timeout=timeout
    )
    for name, got in together.items():
        figures.tenants[name].side_by_side = _tflops(got)
        figures.tenants[name].errors += [got] if isinstance(got, str) else []
    figures.overlap_s = overlap(list(together.values()))
    return figures


def overlap(answers: Sequence[dict[str, Any] | str]) -> float | None:
    """Seconds during which every throughput window was open (None when one is missing): a late
    container shortens it, and the side-by-side figures mean less."""
    spans = [(a.get("started"), a.get("ended")) for a in answers if isinstance(a, dict)]
    if not spans or len(spans) != len(answers) or not all(isinstance(x, (int, float)) for s in spans for x in s):
        return None
    return round(max(0.0, min(end for _start, end in spans) - max(start for start, _end in spans)), 3)


def measure_memory(engine: DockerEngine, image: str, site: str, tenant: Tenant, ask_mib: int) -> dict[str, Any]:
    """What the tenant gets when it asks for ``ask_mib`` MiB (tenant_load's alloc answer:
    ``got_mib``, ``refused``, ``error``), or ``{"error": why}`` when the container gave none."""
    got = run_tenants(engine, image, site, [tenant], lambda t: ["alloc", "--mib", str(ask_mib)], timeout=STARTUP_S)
    answer = got[tenant.name]
    return answer if isinstance(answer, dict) else {"error": answer}


def _quantiles(answer: dict[str, Any] | str) -> dict[str, float] | None:
    if not isinstance(answer, dict) or not isinstance(answer.get("p99_ms"), (int, float)):
        return None
    return {"p50_ms": float(answer.get("p50_ms") or 0.0), "p99_ms": float(answer["p99_ms"])}


def measure_isolation(
    engine: DockerEngine,
    image: str,
    site: str,
    quiet: Tenant,
    noisy: Tenant,
    *,
    n_small: int = 1024,
    n_noisy: int = 8192,
    seconds: float = 8.0,
    lead: float = 20.0,
) -> dict[str, Any]:
    """The quiet tenant's small-kernel latency alone, then while the noisy one runs big matmuls over
    the same window: ``{"alone": {p50_ms, p99_ms}, "beside": {...}, "p99_ratio": beside/alone,
    "noisy_tflops": ..., "errors": [...]}`` (None where a run gave no figure)."""
    if quiet.name == noisy.name:
        raise ValueError("the quiet and the noisy tenant need different names")
    timeout = lead + seconds + STARTUP_S
    alone = run_tenants(engine, image, site, [quiet], lambda t: latency_argv(n_small, seconds), timeout=timeout)
    start_at = time.time() + lead

    def argv(t: Tenant) -> list[str]:
        return latency_argv(n_small, seconds, start_at) if t is quiet else throughput_argv(n_noisy, seconds, start_at)

    beside = run_tenants(engine, image, site, [quiet, noisy], argv, timeout=timeout)
    before, after = _quantiles(alone[quiet.name]), _quantiles(beside[quiet.name])
    ratio = after["p99_ms"] / before["p99_ms"] if before and after and before["p99_ms"] > 0 else None
    errors = [a for a in (alone[quiet.name], beside[quiet.name], beside[noisy.name]) if isinstance(a, str)]
    return {
        "alone": before,
        "beside": after,
        "p99_ratio": round(ratio, 3) if ratio is not None else None,
        "noisy_tflops": _tflops(beside[noisy.name]),
        "errors": errors,
    }


def share_error(measured_tflops: float, whole_tflops: float, declared_percent: float) -> float:
    """How far a tenant's share of the whole GPU is from the share declared for it, relative to the
    declared share: (measured/whole - declared) / declared. Negative: it got less than declared."""
    if whole_tflops <= 0 or not 0 < declared_percent <= 100:
        raise ValueError(
            f"a share needs a positive whole ({whole_tflops}) and a percent in (0, 100] ({declared_percent})"
        )
    declared = declared_percent / 100.0
    return (measured_tflops / whole_tflops - declared) / declared


def within(error: float, tolerance: float = 0.10) -> bool:
    """A share_error small enough, either way, to call the declared split kept."""
    return abs(error) <= tolerance


def measure_declared(
    engine: DockerEngine, image: str, site: str, entry: dict[str, Any], whole: float | None, *, seconds: float = 6.0
) -> dict[str, Any]:
    """``gpuprov verify --bench`` on one GPU entry of the sharing record: its tenants (each through the CDI
    device the record names for it) alone and side by side, the first one asking for 2 GiB past its memory
    share, and with two tenants or more the first one's small-kernel latency beside the second one's big
    matmuls. ``whole``: the guest's own matmul on that GPU (8192^3, unrestricted), each share's denominator."""
    tenants = [
        t
        for t in (entry.get("tenants") or [])[:64]
        if isinstance(t, dict) and isinstance(t.get("device"), str) and CDI_DEVICE.fullmatch(t["device"])
    ]
    chosen = [Tenant(str(t.get("name")), t["device"]) for t in tenants[:8]]
    out: dict[str, Any] = {"name": entry.get("name"), "whole": whole, "tenants": {}}
    if not chosen:
        out["error"] = "the record names no tenant device"
        return out
    figures = measure_sharing(engine, image, site, chosen, seconds=seconds, lead=10.0 + len(chosen))
    for t, tenant in zip(tenants, chosen):
        got = figures.tenants[tenant.name]
        out["tenants"][tenant.name] = {
            "declared_percent": t.get("sm_percent"),
            "memory_mib": t.get("memory_mib"),
            "enforced": t.get("enforced"),
            "alone": got.alone,
            "side_by_side": got.side_by_side,
            "errors": got.errors,
        }
    out["overlap_s"] = figures.overlap_s
    share = tenants[0].get("memory_mib")
    if isinstance(share, int):
        out["memory"] = {"share_mib": share, **measure_memory(engine, image, site, chosen[0], share + 2048)}
    if len(chosen) > 1:
        out["isolation"] = measure_isolation(engine, image, site, chosen[0], chosen[1], seconds=seconds, lead=12.0)
    return out
