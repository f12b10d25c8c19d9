"""The ``gpuprov verify`` report as plain data (schema ``gpuprov.verify/v1``,
docs/reference/verify-json.md), and the gpu_verify module's result made from it."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .. import __version__
from ..facts.gpus import GpuInfo
from ..facts.pci import PciLink
from ..facts.vgpu_profile import parse_profile
from ..verify.base import STATUSES, Check, pci_link
from ..verify.checks_bench import bench_figures, container_ratios
from ..verify.checks_multigpu import multigpu_probe
from ..verify.gather import VerifyFacts

SCHEMA = "gpuprov.verify/v1"
SCHEMA_VERSION = 1


def _pci_link_dict(link: PciLink | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {
        "current_speed": link.current_speed,
        "current_width": link.current_width,
        "max_speed": link.max_speed,
        "max_width": link.max_width,
    }


def _gpu_dict(facts: VerifyFacts, g: GpuInfo) -> dict[str, Any]:
    profile = parse_profile(g.name) if g.virtualization_mode == "vgpu" else None
    return {
        "index": g.index,
        "name": g.name,
        "uuid": g.uuid,
        "address": g.address,
        "architecture": g.architecture,
        "memory_total_mib": g.memory_total_mib,
        "memory_reserved_mib": g.memory_reserved_mib,
        "virtualization_mode": g.virtualization_mode,
        "vgpu": None
        if g.virtualization_mode != "vgpu"
        else {
            "profile": profile.name if profile else None,
            "profile_framebuffer_mib": profile.framebuffer_mib if profile else None,
            "license": g.vgpu_license,
            "licensed_product": g.vgpu_product,
        },
        "mig": {"current": g.mig_current, "pending": g.mig_pending, "devices": g.mig_devices},
        "link": asdict(g.link),
        "pci_link": _pci_link_dict(pci_link(facts, g)),
    }


def build_report(facts: VerifyFacts, checks: list[Check]) -> dict[str, Any]:
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    d = facts.driver
    gl = facts.gpu_list
    run = facts.container
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "gpuprov_version": __version__,
        "host": {"root": facts.root, "kernel": facts.kernel, "os": facts.os_name, "hypervisor": facts.hypervisor},
        "driver": {
            "loaded": d.loaded,
            "version": d.version,
            "source": d.source,
            "open_kernel_module": d.open_kernel_module,
            "nouveau": d.nouveau,
            "library_version": gl.driver_version if gl else None,
            "cuda_version": gl.cuda_version if gl else None,
        },
        "gpus_from": gl.source if gl else None,
        "gpu_error": facts.gpu_error,
        "gpus": [_gpu_dict(facts, g) for g in facts.gpus],
        "pci_gpus": [
            {"address": a, "device_id": f"{p.device_id:04x}" if p.device_id is not None else None, "driver": p.driver}
            for a, p in facts.pci_gpus.items()
        ],
        "containers": {
            "docker": asdict(facts.docker),
            "containerd": asdict(facts.containerd),
            "toolkit": {"nvidia_ctk": facts.toolkit.nvidia_ctk, "nvidia_container_runtime": facts.toolkit.runtime},
            "cdi_specs": [asdict(s) for s in facts.cdi],
            "run": None
            if run is None
            else {
                "engine": run.engine,
                "engine_version": run.engine_version,
                "image": run.image,
                "exit_code": run.exit_code,
                "gpus": run.gpus,
                "uuids": run.uuids,
                "how": run.how,
                "output": run.output,
                "bench": run.bench,
                "bench_error": run.bench_error,
                "bench_ratios": container_ratios(facts),
            },
        },
        "bench": None
        if not facts.bench_requested
        else {
            "backend": facts.bench_backend,
            "results": [{**asdict(r), **bench_figures(facts, r)} for r in facts.bench],
        },
        "multigpu": multigpu_probe(facts),
        "checks": [asdict(c) for c in checks],
        "summary": summary(counts, checks),
    }


# The checks that judge the GPUs themselves: with one of them skipped (a capture without NVML's
# answers, no kernel log readable) the verdict is "incomplete", never "passed" (fail closed).
JUDGES = ("driver", "gpus", "pcie-link", "xid", "ecc", "row-remap")


def summary(counts: dict[str, int], checks: list[Check]) -> dict[str, Any]:
    not_run = sorted({c.id for c in checks if c.id in JUDGES and c.status == "skip"})
    return {
        **counts,
        "passed": counts["fail"] == 0 and not not_run,
        "incomplete": counts["fail"] == 0 and bool(not_run),
        "not_run": not_run,
    }


def _summary(check: dict[str, Any]) -> str:
    where = "" if check["gpu"] is None else f" (GPU {check['gpu']})"
    fix = f"; fix: {check['fix']}" if check["fix"] else ""
    return f"{check['id']}{where} {check['status']}: {check['message']}{fix}"


def module_result(report: dict[str, Any], fail_on: list[str]) -> tuple[dict[str, Any], str | None]:
    """The gpu_verify module's result from ``report``, and its failure message when a
    check has a status in ``fail_on`` (``None`` when none has)."""
    checks = report["checks"]
    failed = [c for c in checks if c["status"] in fail_on]
    result = {
        "changed": False,
        "checks": checks,
        "failed_checks": failed,
        "passed": report["summary"]["passed"],
        "summary": report["summary"],
        "report": report,
    }
    if not failed:
        return result, None
    statuses = "/".join(fail_on)
    return result, f"gpuprov verify: {len(failed)} check(s) {statuses}: " + " | ".join(_summary(c) for c in failed)
