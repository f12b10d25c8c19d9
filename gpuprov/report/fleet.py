"""The fleet report as plain data (schema ``gpuprov.fleet/v1``, docs/guides/fleet.md).

:func:`host_record` is what one host says of itself, in one read (the module gpu_fleet_facts
runs it on each host; a staged root reads the same): its facts, its declaration resolved on them,
each GPU's verdict for its declared use and its health, the drift from the declaration
(:mod:`gpuprov.plan.drift`), and a status:

- ``not ready``: a reason stops a declared use (each reason listed): a GPU's blocker, a failing
  GPU (off the bus, failed resets, fatal PCIe errors, hardware Xids, uncorrected ECC...), a
  declaration that does not fit the host;
- ``drifted``: ready, but the host differs from its declaration (each difference listed, with
  the declared entry it differs from);
- ``unknown``: neither, but something the verdict rests on could not be read (listed under
  ``unknown``): fail closed, never ``converged``;
- ``converged``: none of these.

:func:`fleet_document` puts the hosts' records together on the controller, with the hosts that
gave none (``unreachable``, ``failed``: each listed, never dropped). Each answer is untrusted: one
that does not follow the host part of the schema (gpuprov/schemas/fleet.v1.json) makes that host
``unknown`` with the first problems named, and the other hosts are reported. :func:`prometheus_text` is
the same as metrics for node_exporter's textfile collector. Standard library only.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path
from typing import Any

from .. import __version__
from ..facts.domains import read_running
from ..facts.fleet import read_fleet_facts
from ..facts.health import read_health
from ..facts.host import HostFacts, cpu_count, gather
from ..facts.sysfs import Sysfs
from ..model.host_model import HostModel
from ..model.resolve import resolve
from ..plan.drift import Declared, drift
from ..rules.assess import GpuAssessment, assess
from ..rules.intent import judge
from ..verify.health import judge as judge_health
from ..verify.health import status as health_status

SCHEMA = "gpuprov.fleet/v1"
HOST_SCHEMA = "gpuprov.fleet-host/v1"
STATUSES = ("converged", "drifted", "unknown", "not ready", "unreachable", "failed")


def _entries(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each GPU entry as written, by how resolve names it (for the entry's ``expect``)."""
    out: dict[str, dict[str, Any]] = {}
    host = doc.get("gpuprov_host") or {}
    layouts = doc.get("gpuprov_layouts") or {}
    name = host.get("layout") if isinstance(host, dict) else None
    picked = layouts.get(name) if isinstance(layouts, dict) and name is not None else None
    if isinstance(picked, dict):
        for i, e in enumerate(picked.get("gpus") or []):
            if isinstance(e, dict):
                out[f"gpuprov_layouts.{name}.gpus[{i}] {e.get('name')!r}"] = e
    for i, e in enumerate((host.get("gpus") if isinstance(host, dict) else None) or []):
        if isinstance(e, dict):
            out[f"gpuprov_host.gpus[{i}] {e.get('name')!r}"] = e
    return out


def _declared(model: HostModel, doc: dict[str, Any]) -> Declared:
    derived = model.derived()
    return Declared(
        declared=model.declared,
        layout=model.layout,
        instances=derived["instances"],
        vms=model.vm_list,
        vm_path=model.vm_path,
        refusals=list(model.refusals),
        entries=_entries(doc),
    )


def _verdict(a: GpuAssessment) -> str:
    if a.intended_use in (None, "not declared"):
        return "not declared"
    if not a.ready:
        return "not ready"
    if a.state:
        return a.state
    use = a.intended_use
    if use == "host":
        return "kept by the host"
    if use in ("mdev", "sriov_vgpu", "mig"):
        return "vGPU-ready"
    if use == "passthrough":
        return "passthrough-ready"
    return "not declared"


def status_of(not_ready: list[Any], drift_found: list[Any], unknown: list[Any]) -> str:
    """A host's status from its lists: the worst that applies; unknown is never converged."""
    return "not ready" if not_ready else "drifted" if drift_found else "unknown" if unknown else "converged"


def _finding(f: Any) -> dict[str, Any]:
    return {"code": f.code, "message": f.message, "fix": f.fix, "device": f.device}


def host_record(root: str, doc: dict[str, Any] | None, *, nvml: str = "auto", log: bool = True) -> dict[str, Any]:
    """What the host under ``root`` is, against its declaration ``doc`` (a host_vars dict with
    ``gpuprov_host``, or the old variables; None: nothing declared)."""
    sysfs = Sysfs(root)
    facts: HostFacts = gather(sysfs)
    running = read_running(sysfs)
    model = resolve(doc, facts, cpu_limit=cpu_count(facts)) if doc else None
    broken = model is not None and bool(model.problems)
    declared = {} if model is None or broken else model.declared
    mig = any(d.get("use") == "mig" for d in declared.values())
    fleet = read_fleet_facts(sysfs, mig=mig)
    gpus = assess(facts, extra=[a for a in declared if a in facts.pci])
    for gpu in gpus:
        entry = declared.get(gpu.address)
        judge(facts, gpu, entry and entry["use"], entry and entry["entry"], running)
    health = read_health(sysfs, [g.address for g in gpus], nvml=nvml, log=log)
    found = drift(facts, fleet, _declared(model, doc or {})) if model is not None and not broken else None

    not_ready: list[dict[str, Any]] = []
    if model is not None:
        for p in model.problems:
            not_ready.append({"code": "declaration", "device": None, "entry": None, "message": p.message, "fix": p.fix})
    if found is not None:
        from ..plan.drift import entry_of

        for r in found.refusals:
            not_ready.append(
                {
                    "code": "declaration-refused",
                    "device": r.device,
                    "entry": entry_of(r.message),
                    "message": r.message,
                    "fix": r.fix,
                }
            )
    records = []
    for gpu in gpus:
        h = health.gpus[gpu.address]
        findings = judge_health(h)
        use = gpu.intended_use or "not declared"
        if use != "not declared":
            for f in gpu.blockers:
                not_ready.append(
                    {
                        "code": f.code,
                        "device": f.device or gpu.address,
                        "entry": gpu.declared_as,
                        "message": f.message,
                        "fix": f.fix,
                    }
                )
        for f in findings:
            if f["severity"] == "fail":
                not_ready.append(
                    {
                        "code": f"health:{f['code']}",
                        "device": gpu.address,
                        "entry": gpu.declared_as,
                        "message": f["message"],
                        "fix": f["fix"],
                    }
                )
        records.append(
            {
                "address": gpu.address,
                "name": gpu.name,
                "vendor_device": gpu.vendor_device,
                "driver": gpu.driver,
                "iommu_group": gpu.iommu_group,
                "use": use,
                "entry": gpu.declared_as,
                "ready": gpu.ready,
                "verdict": _verdict(gpu),
                "state": gpu.state,
                "findings": [_finding(f) for f in gpu.findings],
                "health": {"status": health_status(findings), "findings": findings, **h.as_dict()},
            }
        )
    drift_findings = found.findings if found is not None else []
    unknown = found.unknown if found is not None else []
    status = status_of(not_ready, drift_findings, unknown)
    return {
        "schema": HOST_SCHEMA,
        "gpuprov_version": __version__,
        "status": status,
        "root": root,
        "kernel": facts.kernel,
        "os": facts.os_name,
        "declaration": {
            "given": bool(doc),
            "legacy": bool(model and model.legacy),
            "warnings": list(model.warnings) if model else [],
        },
        "gpus": records,
        "drift": drift_findings,
        "not_ready": not_ready,
        "unknown": unknown,
        "health": {
            "log_source": health.log_source,
            "log_error": health.log_error,
            "memory_source": health.memory_source,
            "memory_error": health.memory_error,
        },
    }


# ---------------------------------------------------------------- the fleet


@functools.lru_cache(maxsize=1)
def _host_evaluator() -> Any:
    """The published schema's evaluator: a host's answer is held to its ``$defs/host``."""
    from ..inputs.schema_eval import Evaluator

    schema = Path(__file__).resolve().parents[1] / "schemas" / "fleet.v1.json"  # the controller's copy
    return Evaluator(json.loads(schema.read_text(encoding="utf-8")), "")


def has_record(host: dict[str, Any]) -> bool:
    """Whether the host gave its own record (unreachable, failed and a bad answer did not)."""
    return "message" not in host


def unanswered(host: str, status: str, message: str) -> dict[str, Any]:
    """The record of a host that gave none: ``unreachable`` or ``failed`` (or ``unknown``: its answer
    was not a record), with why."""
    return {
        "host": host,
        "status": status,
        "message": message,
        "gpus": [],
        "drift": [],
        "not_ready": [],
        "unknown": [],
    }


def _checked(name: str, record: Any) -> dict[str, Any]:
    """The host's entry: its answer when it follows the schema (its status recomputed from its
    lists: what the host says of itself is not taken), else ``unknown`` naming the first problems."""
    if not isinstance(record, dict):
        return {"host": name, **unanswered(name, "unknown", "its answer is not a fleet record: not a mapping")}
    entry = {"host": name, **{k: v for k, v in record.items() if k not in ("schema", "gpuprov_version", "host")}}
    problems = _host_evaluator().check(entry, f"host {name}", "host").items
    if problems:
        said = "; ".join(p.message for p in problems[:3])
        if len(problems) > 3:
            said += f" (and {len(problems) - 3} more)"
        return {"host": name, **unanswered(name, "unknown", f"its answer is not a fleet record: {said}")}
    if has_record(entry):
        entry["status"] = status_of(entry["not_ready"], entry["drift"], entry["unknown"])
    return entry


def fleet_document(
    records: dict[str, dict[str, Any]], *, inventory: str | None = None, forks: int | None = None
) -> dict[str, Any]:
    """Host name -> its record (from :func:`host_record`, or :func:`unanswered`) -> the document."""
    hosts = [_checked(name, records[name]) for name in sorted(records)]
    counts = {s: sum(1 for h in hosts if h["status"] == s) for s in STATUSES}
    gpus = [g for h in hosts for g in h.get("gpus") or []]
    return {
        "schema": SCHEMA,
        "gpuprov_version": __version__,
        "inventory": inventory,
        "forks": forks,
        "summary": {
            "hosts": len(hosts),
            **{s.replace(" ", "_"): n for s, n in counts.items()},
            "gpus": len(gpus),
            "gpus_not_ready": sum(1 for g in gpus if not g["ready"]),
            "gpus_failing": sum(1 for g in gpus if g["health"]["status"] == "fail"),
        },
        "hosts": hosts,
    }


# ---------------------------------------------------------------- Prometheus


_LABEL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}


def _label(value: object) -> str:
    return re.sub(r'[\\"\n]', lambda m: _LABEL_ESCAPES[m.group()], str(value))


def _labels(**labels: object) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


METRICS = {
    "gpuprov_fleet_host_status": (
        "gauge",
        "1 for the host's status (converged, drifted, unknown, not ready, unreachable, failed)",
    ),
    "gpuprov_fleet_host_drift_findings": ("gauge", "How many ways the host differs from its declaration"),
    "gpuprov_fleet_host_not_ready_reasons": ("gauge", "How many reasons stop a declared use on the host"),
    "gpuprov_gpu_ready": ("gauge", "1 when the GPU is ready for its declared use"),
    "gpuprov_gpu_health_status": ("gauge", "1 for the GPU's health status (ok, warn, fail)"),
    "gpuprov_gpu_config_all_ones": ("gauge", "1 when the GPU's PCI config space reads all ones (off the bus)"),
    "gpuprov_gpu_aer_errors": ("gauge", "PCIe AER errors the kernel counted since boot, by severity"),
    "gpuprov_gpu_xid_events": ("gauge", "NVIDIA Xid events in the kernel log, by Xid"),
    "gpuprov_gpu_reset_failures": ("gauge", "Failed resets of the GPU in the kernel log"),
    "gpuprov_gpu_ecc_errors": ("gauge", "ECC error counts (NVML or nvidia-smi), by counter and type"),
    "gpuprov_gpu_remapped_rows": ("gauge", "Remapped rows, by kind (corrected, uncorrected)"),
    "gpuprov_gpu_remapped_rows_pending": ("gauge", "1 when a row remap waits for a GPU reset"),
    "gpuprov_gpu_remapped_rows_failure": ("gauge", "1 when row remapping failed"),
}


def prometheus_text(document: dict[str, Any]) -> str:
    """The fleet document as Prometheus text exposition (node_exporter's textfile collector):
    HELP and TYPE for each metric, labels ``host`` and ``gpu`` (its PCI address)."""
    samples: dict[str, list[str]] = {m: [] for m in METRICS}

    def add(metric: str, value: object, **labels: object) -> None:
        # A sample value is a number or nothing: text from a host never reaches the exposition.
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        samples[metric].append(f"{metric}{_labels(**labels)} {value}")

    for h in document["hosts"]:
        host = h["host"]
        for s in STATUSES:
            add("gpuprov_fleet_host_status", h["status"] == s, host=host, status=s)
        if not has_record(h):
            continue
        add("gpuprov_fleet_host_drift_findings", len(h["drift"]), host=host)
        add("gpuprov_fleet_host_not_ready_reasons", len(h["not_ready"]), host=host)
        for g in h["gpus"]:
            gpu, health = g["address"], g["health"]
            add("gpuprov_gpu_ready", g["ready"], host=host, gpu=gpu, use=g["use"])
            for s in ("ok", "warn", "fail"):
                add("gpuprov_gpu_health_status", health["status"] == s, host=host, gpu=gpu, status=s)
            if health["config"] in ("ok", "all-ones"):
                add("gpuprov_gpu_config_all_ones", health["config"] == "all-ones", host=host, gpu=gpu)
            for kind, total in (health["aer"] or {}).items():
                if total is not None:
                    add("gpuprov_gpu_aer_errors", total, host=host, gpu=gpu, severity=kind)
            xids: dict[int, int] = {}
            for e in health["xids"]:
                xids[e["xid"]] = xids.get(e["xid"], 0) + 1
            for xid, n in sorted(xids.items()):
                add("gpuprov_gpu_xid_events", n, host=host, gpu=gpu, xid=xid)
            if (h.get("health") or {}).get("log_source"):
                add("gpuprov_gpu_reset_failures", len(health["resets"]), host=host, gpu=gpu)
            for key, value in (health["ecc"] or {}).items():
                if value is not None:
                    counter, _sep, kind = key.partition("_")
                    add("gpuprov_gpu_ecc_errors", value, host=host, gpu=gpu, counter=counter, type=kind)
            rows = health["remapped_rows"]
            if rows:
                for kind in ("corrected", "uncorrected"):
                    if rows.get(kind) is not None:
                        add("gpuprov_gpu_remapped_rows", rows[kind], host=host, gpu=gpu, kind=kind)
                if rows.get("pending") is not None:
                    add("gpuprov_gpu_remapped_rows_pending", bool(rows["pending"]), host=host, gpu=gpu)
                if rows.get("failure") is not None:
                    add("gpuprov_gpu_remapped_rows_failure", bool(rows["failure"]), host=host, gpu=gpu)
    lines = []
    for metric, (kind, text) in METRICS.items():
        if samples[metric]:
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}", *samples[metric]]
    return "\n".join(lines) + "\n"
