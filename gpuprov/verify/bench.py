"""``gpuprov verify --bench``: pinned host<->device bandwidth and a matmul,
measured with torch (or cupy) and set against the PCIe link's and the GPU's
peak, so a guest can tell whether it gets the GPU at bare-metal speed.

Peaks:

- PCIe: per-lane rate x width x encoding (8b/10b for gen1-2, 128b/130b for
  gen3-5, FLIT 242/256 for gen6), in GB/s (10^9 bytes): gen5 x16 = 63.0 GB/s.
  Pinned copies reach about 80-90% of it on a good link.
- GPU: dense bf16 tensor-core TFLOP/s from NVIDIA's datasheets (no sparsity).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the module also runs alone, as a script in a container (gpuprov.verify.container)
    from ..facts.gpus import GpuInfo

PCIE_GTS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}

# (pattern on the product name, label, dense bf16 TFLOP/s). First match wins: the
# specific names come before the family.
GPU_PEAKS: list[tuple[re.Pattern[str], str, float]] = [
    (re.compile(r"\bGH200\b"), "GH200", 989.0),
    (re.compile(r"\bH200 NVL\b"), "H200 NVL", 835.0),
    (re.compile(r"\bH200\b"), "H200 SXM", 989.0),
    (re.compile(r"\bH100 NVL\b"), "H100 NVL", 835.0),
    (re.compile(r"\bH100 PCIe\b"), "H100 PCIe", 756.0),
    (re.compile(r"\bH100\b"), "H100 SXM", 989.0),
    (re.compile(r"\bA100\b"), "A100", 312.0),
    (re.compile(r"\bL40S\b"), "L40S", 362.0),
    (re.compile(r"\bL40\b"), "L40", 181.0),
    (re.compile(r"\bL4\b"), "L4", 121.0),
    (re.compile(r"\bA30\b"), "A30", 165.0),
    (re.compile(r"\bA10\b"), "A10", 125.0),
]

# A measured copy at or above this fraction of the link's peak is "ok"; below it, a warning.
# Pinned copies on a good link give 0.8-0.9 (gen5 x16 guests: 50-55 GB/s of 63); a 2x H100
# guest's 43.1 GB/s (68%) is worth a look, and a link at half width or one generation down
# gives 0.5 or less.
COPY_OK_FRACTION = 0.8
# A matmul at or above this fraction of the GPU's dense peak is "ok" (H100s run 0.75-0.85).
MATMUL_OK_FRACTION = 0.6


def pcie_gen(speed_gts: float | None) -> int | None:
    """The generation of a link speed in GT/s (``32.0`` -> 5)."""
    if speed_gts is None:
        return None
    for gen, rate in PCIE_GTS.items():
        if abs(rate - speed_gts) < 0.01:
            return gen
    return None


def pcie_peak_gbps(gen: int | None, width: int | None) -> float | None:
    """Data rate of a PCIe link in GB/s, per direction (gen5 x16: 63.0)."""
    if gen not in PCIE_GTS or not width:
        return None
    encoding = 0.8 if gen <= 2 else 128 / 130 if gen <= 5 else 242 / 256
    return PCIE_GTS[gen] * width * encoding / 8


def gpu_peak(name: str | None) -> tuple[str, float] | None:
    """(label, dense bf16 TFLOP/s) for a product name; ``None`` when none is on file."""
    if not name:
        return None
    for pattern, label, tflops in GPU_PEAKS:
        if pattern.search(name):
            return label, tflops
    return None


@dataclass
class BenchResult:
    device: int  # the CUDA device index
    name: str | None
    gpu_index: int | None  # the GPU (NVML / nvidia-smi index) it is, when matched
    backend: str
    buffer_bytes: int = 0
    iterations: int = 0
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    matmul_n: int = 0
    matmul_dtype: str | None = None
    matmul_tflops: float | None = None
    link_under_load: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    uuid: str | None = None  # as CUDA gives it (no "GPU-"): ties a container's result to the guest's


LinkSampler = Callable[[int], dict[str, Any]]


def _match(gpus: list[GpuInfo], uuid: str | None, address: str | None, index: int) -> GpuInfo | None:
    if uuid:  # torch gives the UUID without NVML's "GPU-"
        bare = uuid.lower().removeprefix("gpu-")
        for g in gpus:
            if g.uuid and g.uuid.lower().removeprefix("gpu-") == bare:
                return g
    if address:
        for g in gpus:
            if g.address == address:
                return g
    # CUDA_DEVICE_ORDER=PCI_BUS_ID (set before CUDA starts) numbers devices as NVML does.
    return gpus[index] if index < len(gpus) and os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" else None


def load_backend() -> tuple[str, Any] | None:
    """torch, else cupy, as (name, module); ``None`` when neither imports."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import torch

        if torch.cuda.is_available():
            return "torch", torch
    except ImportError:
        pass
    try:
        import cupy

        return "cupy", cupy
    except ImportError:
        return None


def _buffer_size(gpu: GpuInfo | None, size: int) -> int:
    total = gpu.memory_total_mib if gpu else None
    if total:
        size = min(size, (total << 20) // 4)
    return max(size, 1 << 20)


def run_bench(
    backend: tuple[str, Any],
    gpus: list[GpuInfo],
    *,
    sample_link: LinkSampler | None = None,
    size: int = 1 << 30,
    iterations: int = 10,
    matmul_n: int = 8192,
) -> list[BenchResult]:
    """Measure every CUDA device the backend sees. A device that fails gets its ``error``."""
    name, mod = backend
    results = []
    count = mod.cuda.device_count() if name == "torch" else mod.cuda.runtime.getDeviceCount()
    for dev in range(count):
        uuid, address, dev_name = _device_ids(name, mod, dev)
        gpu = _match(gpus, uuid, address, dev)
        result = BenchResult(dev, dev_name, None if gpu is None else gpu.index, name, uuid=uuid)
        sampler = None if sample_link is None or gpu is None else (lambda g=gpu.index: sample_link(g))
        try:
            buf = _buffer_size(gpu, size)
            if name == "torch":
                _torch_bench(mod, dev, result, buf, iterations, matmul_n, sampler)
            else:
                _cupy_bench(mod, dev, result, buf, iterations, matmul_n, sampler)
        except Exception as exc:  # noqa: BLE001 - a CUDA error of any kind is this device's result
            result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        results.append(result)
    return results


def _device_ids(name: str, mod: Any, dev: int) -> tuple[str | None, str | None, str | None]:
    if name == "torch":
        props = mod.cuda.get_device_properties(dev)
        uuid = str(getattr(props, "uuid", "") or "") or None
        address = None
        if hasattr(props, "pci_bus_id") and hasattr(props, "pci_device_id"):
            address = f"{getattr(props, 'pci_domain_id', 0):04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        return uuid, address, props.name
    runtime = mod.cuda.runtime
    props = runtime.getDeviceProperties(dev)
    raw = props.get("name", b"")
    dev_name = raw.decode() if isinstance(raw, bytes) else str(raw)
    address = None
    try:
        from ..facts.gpus import normalize_bus_id

        address = normalize_bus_id(runtime.deviceGetPCIBusId(dev))
    except Exception:  # noqa: BLE001 - older cupy: no bus id, fall back to the order
        address = None
    return None, address, dev_name


def _sample_while_busy(sampler: Callable[[], dict[str, Any]] | None) -> dict[str, Any]:
    if sampler is None:
        return {}
    time.sleep(0.05)  # let the link retrain up from its idle speed
    return sampler()


def _torch_bench(
    torch: Any,
    dev: int,
    result: BenchResult,
    size: int,
    iterations: int,
    n: int,
    sampler: Callable[[], dict[str, Any]] | None,
) -> None:
    device = torch.device("cuda", dev)
    with torch.cuda.device(device):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(size, dtype=torch.uint8, device=device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def timed(copy: Callable[[], Any], sample: bool) -> tuple[float, dict[str, Any]]:
            copy()
            torch.cuda.synchronize(device)
            start.record()
            for _round in range(iterations):
                copy()
            end.record()
            seen = _sample_while_busy(sampler) if sample else {}
            end.synchronize()
            return size * iterations / (start.elapsed_time(end) / 1e3) / 1e9, seen

        result.buffer_bytes, result.iterations = size, iterations
        result.h2d_gbps, result.link_under_load = timed(lambda: gpu.copy_(host, non_blocking=True), True)
        result.d2h_gbps, _no_sample = timed(lambda: host.copy_(gpu, non_blocking=True), False)
        host = gpu = None  # give the 2 x 1 GiB back before the matmul
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        for _warmup in range(3):
            torch.matmul(a, b)
        torch.cuda.synchronize(device)
        reps = 10
        start.record()
        for _rep in range(reps):
            torch.matmul(a, b)
        end.record()
        end.synchronize()
        result.matmul_n, result.matmul_dtype = n, "bfloat16"
        result.matmul_tflops = 2 * n**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12
        del a, b
        torch.cuda.empty_cache()


def _cupy_bench(
    cp: Any,
    dev: int,
    result: BenchResult,
    size: int,
    iterations: int,
    n: int,
    sampler: Callable[[], dict[str, Any]] | None,
) -> None:
    rt = cp.cuda.runtime
    with cp.cuda.Device(dev):
        host = cp.cuda.alloc_pinned_memory(size)
        gpu = cp.cuda.alloc(size)
        stream = cp.cuda.Stream(non_blocking=True)
        start, end = cp.cuda.Event(), cp.cuda.Event()

        def timed(dst: int, src: int, kind: int, sample: bool) -> tuple[float, dict[str, Any]]:
            rt.memcpyAsync(dst, src, size, kind, stream.ptr)
            stream.synchronize()
            start.record(stream)
            for _round in range(iterations):
                rt.memcpyAsync(dst, src, size, kind, stream.ptr)
            end.record(stream)
            seen = _sample_while_busy(sampler) if sample else {}
            end.synchronize()
            return size * iterations / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e9, seen

        result.buffer_bytes, result.iterations = size, iterations
        result.h2d_gbps, result.link_under_load = timed(gpu.ptr, host.ptr, rt.memcpyHostToDevice, True)
        result.d2h_gbps, _no_sample = timed(host.ptr, gpu.ptr, rt.memcpyDeviceToHost, False)
        host = gpu = None
        # cupy has no bfloat16: float16 runs on the same tensor cores at the same dense peak.
        a = cp.random.random((n, n), dtype=cp.float32).astype(cp.float16)
        b = cp.random.random((n, n), dtype=cp.float32).astype(cp.float16)
        for _warmup in range(3):
            cp.matmul(a, b)
        cp.cuda.Device(dev).synchronize()
        reps = 10
        start.record()
        for _rep in range(reps):
            cp.matmul(a, b)
        end.record()
        end.synchronize()
        result.matmul_n, result.matmul_dtype = n, "float16"
        result.matmul_tflops = 2 * n**3 * reps / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e12


# ---------------------------------------------------------------- GPU to GPU

# NVML's nvmlNvlinkVersion_t (what nvmlDeviceGetNvLinkVersion returns: an H200 says 6, NVLink
# 4.0) -> the NVLink generation and its data rate per link and direction in GB/s (NVIDIA's
# datasheets: P100 4 links 160 GB/s, V100 6 links 300 GB/s, A100 12 links 600 GB/s, H100/H200 SXM
# 18 links 900 GB/s, B200 18 links 1.8 TB/s, each the total of both directions).
NVLINK_VERSIONS = {
    1: ("1.0", 20.0),
    2: ("2.0", 25.0),
    3: ("2.2", 25.0),
    4: ("3.0", 25.0),
    5: ("3.1", 25.0),
    6: ("4.0", 25.0),
    7: ("5.0", 50.0),
}
NVLINK_GBPS_PER_LINK = {enum: rate for enum, (_name, rate) in NVLINK_VERSIONS.items()}


def nvlink_name(version: int | None) -> str:
    """NVLink's generation as people say it (NVLink 4.0) from NVML's version enum."""
    known = NVLINK_VERSIONS.get(version or 0)
    return f"NVLink {known[0]}" if known else f"NVLink (NVML version {version if version else '?'})"


@dataclass
class P2pResult:
    src_device: int  # CUDA device indexes
    dst_device: int
    src_gpu: int | None  # the GPUs (NVML / nvidia-smi index) they are, when matched
    dst_gpu: int | None
    backend: str
    peer_access: bool | None = None  # what CUDA says (cudaDeviceCanAccessPeer)
    buffer_bytes: int = 0
    iterations: int = 0
    gbps: float | None = None
    error: str | None = None


def run_p2p_bench(
    backend: tuple[str, Any], gpus: list[GpuInfo], *, size: int = 1 << 28, iterations: int = 20
) -> list[P2pResult]:
    """Copy ``size`` bytes from each CUDA device to each other one, timed with CUDA events
    on the source device (where CUDA runs a peer copy); a pair that fails gets its ``error``."""
    name, mod = backend
    count = mod.cuda.device_count() if name == "torch" else mod.cuda.runtime.getDeviceCount()
    matched = []
    for dev in range(count):
        uuid, address, _name = _device_ids(name, mod, dev)
        gpu = _match(gpus, uuid, address, dev)
        matched.append(None if gpu is None else gpu.index)
    results = []
    for src in range(count):
        for dst in range(count):
            if src == dst:
                continue
            result = P2pResult(src, dst, matched[src], matched[dst], name)
            try:
                if name == "torch":
                    _torch_p2p(mod, result, size, iterations)
                else:
                    _cupy_p2p(mod, result, size, iterations)
            except Exception as exc:  # noqa: BLE001 - a CUDA error of any kind is this pair's result
                said = str(exc).strip()
                result.error = f"{type(exc).__name__}: {said.splitlines()[0] if said else ''}"
            results.append(result)
    return results


def _torch_p2p(torch: Any, result: P2pResult, size: int, iterations: int) -> None:
    src, dst = torch.device("cuda", result.src_device), torch.device("cuda", result.dst_device)
    result.peer_access = bool(torch.cuda.can_device_access_peer(result.src_device, result.dst_device))
    with torch.cuda.device(src):
        a = torch.empty(size, dtype=torch.uint8, device=src)
        b = torch.empty(size, dtype=torch.uint8, device=dst)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        b.copy_(a, non_blocking=True)  # warm-up: enables peer access, wakes both links
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        start.record()
        for _round in range(iterations):
            b.copy_(a, non_blocking=True)
        end.record()
        end.synchronize()
        torch.cuda.synchronize(dst)
        result.buffer_bytes, result.iterations = size, iterations
        result.gbps = size * iterations / (start.elapsed_time(end) / 1e3) / 1e9
        del a, b
    for dev in (src, dst):
        with torch.cuda.device(dev):
            torch.cuda.empty_cache()


def _cupy_p2p(cp: Any, result: P2pResult, size: int, iterations: int) -> None:
    rt = cp.cuda.runtime
    s, d = result.src_device, result.dst_device
    result.peer_access = bool(rt.deviceCanAccessPeer(s, d))
    with cp.cuda.Device(d):
        b = cp.cuda.alloc(size)
    with cp.cuda.Device(s):
        if result.peer_access:
            try:
                rt.deviceEnablePeerAccess(d)
            except rt.CUDARuntimeError:  # already enabled by an earlier run
                pass
        a = cp.cuda.alloc(size)
        stream = cp.cuda.Stream(non_blocking=True)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        rt.memcpyPeerAsync(b.ptr, d, a.ptr, s, size, stream.ptr)
        stream.synchronize()
        start.record(stream)
        for _round in range(iterations):
            rt.memcpyPeerAsync(b.ptr, d, a.ptr, s, size, stream.ptr)
        end.record(stream)
        end.synchronize()
        result.buffer_bytes, result.iterations = size, iterations
        result.gbps = size * iterations / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e9


def main() -> None:
    """Run alone (``python3 bench.py``, as gpuprov verify does inside a container): every CUDA device's
    figures as one JSON line."""
    import json
    import sys
    from dataclasses import asdict

    backend = load_backend()
    if backend is None:
        sys.stdout.write(json.dumps({"error": "neither torch with CUDA nor cupy imports here"}) + "\n")
        raise SystemExit(1)
    results = [asdict(r) for r in run_bench(backend, [])]
    sys.stdout.write(json.dumps({"backend": backend[0], "results": results}) + "\n")


if __name__ == "__main__":
    main()
