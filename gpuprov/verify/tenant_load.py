"""A GPU tenant's load for the sharing bench: matmul throughput, kernel latency or a memory grab, as one JSON line.

It runs alone, as a script, in a container of each tenant (gpuprov.verify.sharing_bench mounts it
at /opt/gpuprov-tenant with the guest's torch beside it): the standard library and torch only, and
no gpuprov import. Several containers measure the same window because each sleeps until the wall
clock given with ``--start-at`` after its warm-up (the containers share the guest's clock), so
their start-up time is not part of what they measure.

    python3 tenant_load.py throughput --n 8192 --seconds 8 --start-at 1767225600.0
    python3 tenant_load.py latency --n 1024 --seconds 8 --start-at 1767225600.0
    python3 tenant_load.py alloc --mib 40960

Exit 0 with the figures when the mode ran (a refused allocation is a result, not a failure);
exit 1 with ``{"error": ...}`` when torch with CUDA does not import here, sees no device, or the
mode broke. Each line carries the MPS variables the container was given (``env``), so a log shows
what the tenant asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

# What the tenant's MPS share asked for (the CDI spec or the tenant's env sets them), echoed in each answer.
ENV_KEYS = ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY")
MAX_SAMPLES = 200_000  # latency samples kept: 8 s of a 1024^3 matmul is about 100k
CHUNK_MIB = 256
# The throughput loop syncs once per batch of about this many flops (10 matmuls at least): one
# bubble per ~1.5 ms at an H200's speed keeps the sync's cost near 1% for the small sizes too,
# where a sync every 10 matmuls of 1024^3 (a few microseconds each) would measure the sync.
BATCH_FLOPS = 1e12
MIN_BATCH = 10
WARMUP = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    modes = p.add_subparsers(dest="mode", required=True)
    for name, n, what in (("throughput", 8192, "bf16 NxNxN matmuls"), ("latency", 1024, "one bf16 matmul")):
        m = modes.add_parser(name, help=f"{what} for SECONDS from the wall clock START_AT")
        m.add_argument("--n", type=int, default=n, help=f"matrix size (default {n})")
        m.add_argument("--seconds", type=float, default=8.0, help="measured seconds (default 8)")
        m.add_argument("--start-at", type=float, default=0.0, help="time.time() to start measuring at (0: now)")
    a = modes.add_parser("alloc", help=f"allocate MIB MiB in {CHUNK_MIB} MiB chunks, up to the first refusal")
    a.add_argument("--mib", type=int, required=True)
    args = p.parse_args(argv)
    if getattr(args, "n", 1) < 1 or getattr(args, "seconds", 1.0) <= 0 or getattr(args, "mib", 1) < 1:
        p.error("--n, --seconds and --mib must be positive")
    return args


def _env() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in ENV_KEYS}


def load_torch() -> tuple[Any, str | None]:
    """(torch, None) when torch imports and sees a CUDA device; (None, why) otherwise."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - an ImportError, or a broken install's own error
        return None, f"torch does not import here ({type(exc).__name__}: {exc})"
    try:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            return None, "torch imports but sees no CUDA device"
    except Exception as exc:  # noqa: BLE001 - CUDA's initialisation error (an MPS daemon that refuses)
        return None, f"torch cannot start CUDA ({type(exc).__name__}: {exc})"
    return torch, None


def _sleep_until(start_at: float) -> None:
    while True:
        left = start_at - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.5))


def _matrices(torch: Any, n: int) -> tuple[Any, Any, Any]:
    dev = torch.device("cuda:0")
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(WARMUP):  # cuBLAS picks its kernel and the clocks come up before the window
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    return a, b, c


def throughput(torch: Any, n: int, seconds: float, start_at: float) -> dict[str, Any]:
    a, b, c = _matrices(torch, n)
    flops = 2.0 * n**3
    batch = max(MIN_BATCH, int(BATCH_FLOPS // flops))
    _sleep_until(start_at)
    started, t0, iterations = time.time(), time.perf_counter(), 0
    while True:
        for _ in range(batch):
            torch.matmul(a, b, out=c)
        iterations += batch
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    return {
        "mode": "throughput",
        "n": n,
        "tflops": round(flops * iterations / elapsed / 1e12, 2),
        "iterations": iterations,
        "seconds": round(elapsed, 4),
        "started": round(started, 3),
        "ended": round(started + elapsed, 3),
        "late_s": round(max(0.0, started - start_at), 3) if start_at else 0.0,
    }


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def latency(torch: Any, n: int, seconds: float, start_at: float) -> dict[str, Any]:
    a, b, c = _matrices(torch, n)
    _sleep_until(start_at)
    samples: list[float] = []
    started = time.time()
    end = time.perf_counter() + seconds
    while len(samples) < MAX_SAMPLES:
        t = time.perf_counter()
        if t >= end:
            break
        torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t)
    samples.sort()
    ms = [s * 1e3 for s in samples] or [0.0]
    return {
        "mode": "latency",
        "n": n,
        "samples": len(samples),
        "p50_ms": round(_percentile(ms, 50), 4),
        "p99_ms": round(_percentile(ms, 99), 4),
        "mean_ms": round(sum(ms) / len(ms), 4),
        "started": round(started, 3),
        "late_s": round(max(0.0, started - start_at), 3) if start_at else 0.0,
    }


def alloc(torch: Any, mib: int) -> dict[str, Any]:
    """Grab ``mib`` MiB in chunks up to the first refusal: what a memory cap (MPS's pinned device
    memory limit) lets through, to the chunk. The cap also holds the CUDA context: under a 2 GiB
    limit an H200 client got 1280 MiB."""
    chunks: list[Any] = []
    got, error = 0, None
    try:
        while got < mib:
            size = min(CHUNK_MIB, mib - got)
            try:
                chunks.append(torch.empty(size << 20, dtype=torch.uint8, device="cuda:0"))
            except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is one
                error = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                break
            got += size
        torch.cuda.synchronize()
    finally:
        del chunks[:]
        torch.cuda.empty_cache()
    return {"mode": "alloc", "asked_mib": mib, "got_mib": got, "refused": got < mib, "error": error}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch, why = load_torch()
    if torch is None:
        print(json.dumps({"error": why, "env": _env()}), flush=True)
        return 1
    try:
        if args.mode == "alloc":
            answer = alloc(torch, args.mib)
        else:
            run = throughput if args.mode == "throughput" else latency
            answer = run(torch, args.n, args.seconds, args.start_at)
        answer["device"] = torch.cuda.get_device_name(0)
    except Exception as exc:  # noqa: BLE001 - any CUDA or torch error is the tenant's answer
        print(json.dumps({"error": f"{args.mode} failed: {type(exc).__name__}: {exc}"[:500], "env": _env()}))
        return 1
    answer["env"] = _env()
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
