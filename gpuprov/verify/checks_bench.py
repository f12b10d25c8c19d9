"""The bench checks of ``gpuprov verify --bench``: copies against the link's peak and
the matmul against the GPU's, and the figures the report carries for each result."""

from __future__ import annotations

from typing import Any

from ..facts.vgpu_profile import parse_profile
from .base import Check, gen_text, link_view, pci_link
from .bench import COPY_OK_FRACTION, MATMUL_OK_FRACTION, BenchResult, gpu_peak, pcie_peak_gbps
from .gather import VerifyFacts

# In a container the same copy and matmul should give the guest's figures (containers in VMs at
# near bare-metal speed): the goal is 0.97 of the guest's; below this, a warning (one run's copies
# vary by a few per cent between rounds).
CONTAINER_OK_RATIO = 0.95
_FIGURES = (("h2d_gbps", "host->device"), ("d2h_gbps", "device->host"), ("matmul_tflops", "matmul"))


def bench_figures(facts: VerifyFacts, result: BenchResult) -> dict[str, Any]:
    """Peaks and fractions for one bench result (``None`` where no peak is known)."""
    gpu = next((g for g in facts.gpus if g.index == result.gpu_index), None)
    peak = None
    link: dict[str, int | None] = {}
    if gpu is not None:
        link = link_view(gpu, pci_link(facts, gpu))
        peak = pcie_peak_gbps(link["max_gen"], link["max_width"])
    name = result.name or (gpu.name if gpu else None)
    profile = parse_profile(gpu.name) if gpu is not None and gpu.virtualization_mode == "vgpu" else None
    # A MIG slice or a MIG-backed vGPU has a part of the GPU's SMs: its peak is not on file.
    part = gpu is not None and (gpu.mig_current == "enabled" or (profile is not None and profile.mig_slices))
    top = None if part else gpu_peak(name)

    def frac(value: float | None, of: float | None) -> float | None:
        return None if value is None or not of else round(value / of, 3)

    return {
        "link_gen": link.get("max_gen"),
        "link_width": link.get("max_width"),
        "link_peak_gbps": None if peak is None else round(peak, 2),
        "h2d_fraction": frac(result.h2d_gbps, peak),
        "d2h_fraction": frac(result.d2h_gbps, peak),
        "gpu_peak_label": top[0] if top else None,
        "gpu_peak_tflops": top[1] if top else None,
        "matmul_fraction": frac(result.matmul_tflops, top[1] if top else None),
    }


def check_bench(facts: VerifyFacts) -> list[Check]:
    if not facts.bench_requested:
        return []
    if not facts.gpus:
        return [Check("bench", "skip", "no GPU seen: nothing to measure")]
    if facts.bench_backend is None:
        return [
            Check(
                "bench",
                "skip",
                "--bench needs torch or cupy with CUDA, and neither imports here",
                "pip install torch (or cupy-cuda12x / cupy-cuda13x to match the driver's CUDA)",
            )
        ]
    checks = []
    for r in facts.bench:
        gi = r.gpu_index
        who = f"GPU {gi}" if gi is not None else f"CUDA device {r.device}"
        if r.error:
            checks.append(
                Check("bench", "fail", f"{who}: the bench failed: {r.error}", "look at `dmesg | grep -i NVRM`", gi)
            )
            continue
        f = bench_figures(facts, r)
        link = f"PCIe {gen_text(f['link_gen'], f['link_width'])}" if f["link_gen"] else "the link"
        for cid, value, fraction, what in (
            ("bench-h2d", r.h2d_gbps, f["h2d_fraction"], "host->device"),
            ("bench-d2h", r.d2h_gbps, f["d2h_fraction"], "device->host"),
        ):
            if fraction is None:
                checks.append(Check(cid, "ok", f"{who}: {value:.1f} GB/s {what} (no link peak known)", None, gi))
            elif fraction >= COPY_OK_FRACTION:
                checks.append(
                    Check(
                        cid,
                        "ok",
                        f"{who}: {value:.1f} GB/s {what}, {fraction:.0%} of {link} ({f['link_peak_gbps']:.1f} GB/s)",
                        None,
                        gi,
                    )
                )
            else:
                checks.append(
                    Check(
                        cid,
                        "warn",
                        f"{who}: {value:.1f} GB/s {what}, only {fraction:.0%} of {link} "
                        f"({f['link_peak_gbps']:.1f} GB/s; pinned copies reach 80-90%)",
                        "check the link under load (pcie-link above), the host's IOMMU mode (iommu=pt) and that "
                        "the VM's memory and vCPUs sit on the GPU's NUMA node",
                        gi,
                    )
                )
        what = f"{r.matmul_tflops:.0f} TFLOP/s {r.matmul_dtype} matmul ({r.matmul_n}^3)"
        if f["matmul_fraction"] is None:
            checks.append(Check("bench-matmul", "ok", f"{who}: {what} (no peak on file for {r.name})", None, gi))
        elif f["matmul_fraction"] >= MATMUL_OK_FRACTION:
            checks.append(
                Check(
                    "bench-matmul",
                    "ok",
                    f"{who}: {what}, {f['matmul_fraction']:.0%} of the {f['gpu_peak_label']}'s "
                    f"{f['gpu_peak_tflops']:.0f} dense",
                    None,
                    gi,
                )
            )
        else:
            checks.append(
                Check(
                    "bench-matmul",
                    "warn",
                    f"{who}: {what}, only {f['matmul_fraction']:.0%} of the {f['gpu_peak_label']}'s "
                    f"{f['gpu_peak_tflops']:.0f} dense",
                    "look for other processes on the GPU (nvidia-smi), clocks held low (nvidia-smi -q -d "
                    "PERFORMANCE), or a time-sliced vGPU sharing the GPU",
                    gi,
                )
            )
    return checks


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if isinstance(v, (int, float)) and v > 0)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def container_ratios(facts: VerifyFacts) -> list[dict[str, Any]]:
    """Per GPU measured in both places (tied by UUID): the median of the container's rounds over the
    median of the guest's, for each figure."""
    run = facts.container
    if run is None or not run.bench_rounds:
        return []
    guest_rounds = facts.bench_rounds or [facts.bench]
    out = []
    for guest in facts.bench:
        if not guest.uuid or guest.error:
            continue
        key_uuid = guest.uuid.lower()
        mine = [r for rnd in guest_rounds for r in rnd if (r.uuid or "").lower() == key_uuid and not r.error]
        theirs = [r for rnd in run.bench_rounds for r in rnd if str(r.get("uuid") or "").lower() == key_uuid]
        if not theirs:
            continue
        row: dict[str, Any] = {"gpu_index": guest.gpu_index, "uuid": guest.uuid, "rounds": len(theirs)}
        for key, _what in _FIGURES:
            a = _median([getattr(r, key) for r in mine])
            b = _median([r.get(key) for r in theirs])
            row[key] = round(b / a, 3) if a and b else None
            row[f"guest_{key}"] = None if a is None else round(a, 2)
            row[f"container_{key}"] = None if b is None else round(b, 2)
        out.append(row)
    return out


def check_container_bench(facts: VerifyFacts) -> list[Check]:
    """--bench with a container that ran: the same bench inside it, against the guest's figures."""
    run = facts.container
    if not facts.bench_requested or not facts.bench or run is None or run.status != "ok":
        return []
    if facts.sharing_mps:
        why = "a GPU here is shared by MPS: a container is a tenant held to its share (sharing-share measures it)"
        return [Check("bench-container", "skip", why)]
    if run.bench_error:
        return [
            Check(
                "bench-container",
                "warn",
                run.bench_error,
                "give --image of a local image with python3 of the guest's version and glibc (the guest's "
                "torch or cupy is mounted into it read-only)",
            )
        ]
    rows = container_ratios(facts)
    if not rows:
        return [Check("bench-container", "warn", "the bench in a container measured no GPU the guest measured")]
    checks = []
    for row in rows:
        who = f"GPU {row['gpu_index']}" if row["gpu_index"] is not None else f"GPU-{row['uuid']}"
        parts = [f"{what} {row[key]:.2f}" for key, what in _FIGURES if row[key] is not None]
        low = min((row[key] for key, _what in _FIGURES if row[key] is not None), default=None)
        text = (
            f"{who} in a container / on the guest, medians of {row['rounds']} alternated rounds: "
            f"{', '.join(parts)} (goal 0.97)"
        )
        if low is not None and low >= CONTAINER_OK_RATIO:
            checks.append(Check("bench-container", "ok", text, None, row["gpu_index"]))
        else:
            checks.append(
                Check(
                    "bench-container",
                    "warn",
                    text,
                    "compare the container's cgroup limits (CPU, memory) and its pinned memory with the guest's",
                    row["gpu_index"],
                )
            )
    return checks
