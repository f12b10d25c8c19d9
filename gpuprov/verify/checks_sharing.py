"""verify's sharing checks: each GPU as the guest's declaration shares it (the record guest_sharing keeps,
/etc/gpuprov/guest-sharing.json), against the guest as it is, and with ``--bench`` the tenants measured
(docs/guides/sharing.md).

- ``sharing``: per GPU entry - under MPS its daemon up (supervisor, control daemon, pipe, shared memory)
  and its limits as declared in the daemon and in every running server; otherwise no daemon of gpuprov's.
- ``sharing-cdi``: the CDI spec makes the containers of each MPS GPU its clients.
- ``sharing-isolation``: what holds a tenant - the compute mode (Exclusive_Process refuses a process that
  leaves MPS; Default does not), and each share that is only advice.
- ``sharing-share``, ``sharing-memory``, ``sharing-latency`` (``--bench``): each tenant's throughput alone
  and side by side against its declared share (within :data:`SHARE_TOLERANCE`), a tenant allocating past
  its memory share refused, and a quiet tenant's p99 latency beside a noisy one against it alone.

Pure: reads the :class:`~gpuprov.verify.gather.VerifyFacts` only.
"""

from __future__ import annotations

from typing import Any

from ..facts.mps import MpsState
from .base import Check

SHARE_TOLERANCE = 0.10
P99_GOAL = 1.5  # the quiet tenant's p99 beside a noisy one, against alone
FIX = "run the role guest_gpu_sharing (playbooks/guests.yml --tags sharing)"


def _entries(record: dict[str, Any] | None) -> list[dict[str, Any]]:
    gpus = record.get("gpus") if isinstance(record, dict) else None
    return (
        [g for g in gpus[:64] if isinstance(g, dict) and isinstance(g.get("name"), str)]
        if isinstance(gpus, list)
        else []
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40 else None


def check_sharing(facts: Any) -> list[Check]:
    record = facts.sharing_record
    if record is None:
        return []  # no sharing declared here (no /etc/gpuprov/guest-sharing.json): nothing to check
    if isinstance(record.get("error"), str):
        return [Check("sharing", "fail", f"the sharing record does not read: {record['error']}", FIX)]
    states: dict[str, MpsState] = facts.sharing.states if facts.sharing is not None else {}
    checks = []
    cdi_text = facts.sharing_cdi or ""
    for entry in _entries(record):
        name = entry["name"]
        state = states.get(name) or MpsState()
        index = _int(entry.get("index"))
        if entry.get("sharing") != "mps":
            if state.supervisor_pid or state.daemon_pids:
                checks.append(
                    Check(
                        "sharing",
                        "fail",
                        f"{name}: declared {entry.get('sharing')}, but an MPS daemon of gpuprov's runs",
                        FIX,
                        index,
                    )
                )
            else:
                checks.append(Check("sharing", "ok", f"{name}: {entry.get('sharing')}, no MPS daemon", None, index))
            continue
        checks.append(_daemon(name, entry, state, index))
        folder = entry.get("folder")
        wanted = f"CUDA_MPS_PIPE_DIRECTORY={folder}/pipe"
        if isinstance(folder, str) and wanted in cdi_text:
            checks.append(
                Check(
                    "sharing-cdi", "ok", f"{name}: the CDI spec makes its containers clients of {folder}", None, index
                )
            )
        else:
            checks.append(
                Check(
                    "sharing-cdi",
                    "fail",
                    f"{name}: the CDI spec does not make its containers MPS clients (they get the GPU outside MPS)",
                    FIX,
                    index,
                )
            )
        checks.append(_isolation(name, entry, facts, index))
        measured = (facts.sharing_bench or {}).get(name)
        if isinstance(measured, dict):
            checks += _bench(name, measured, index)
    return checks


def _bench(name: str, m: dict[str, Any], index: int | None) -> list[Check]:
    """The tenants measured: side by side each within SHARE_TOLERANCE of its declared share of what they
    all got together (their aggregate; the guest's own matmul, unrestricted, shown beside as the whole)."""
    whole = m.get("whole")
    checks = []
    if m.get("error"):
        return [Check("sharing-share", "fail", f"{name}: {m['error']}", FIX, index)]
    tenants = m.get("tenants") or {}
    measured = {k: t for k, t in tenants.items() if isinstance(t.get("side_by_side"), (int, float))}
    aggregate = sum(t["side_by_side"] for t in measured.values())
    declared_all = sum(t.get("declared_percent") or 0 for t in measured.values())
    for tenant, t in tenants.items():
        declared, alone, side = t.get("declared_percent"), t.get("alone"), t.get("side_by_side")
        if tenant not in measured or not declared or aggregate <= 0 or len(measured) != len(tenants):
            why = "; ".join(t.get("errors") or []) or "a tenant gave no figure"
            checks.append(Check("sharing-share", "fail", f"{name}/{tenant}: not measured: {why}", None, index))
            continue
        share, wanted = side / aggregate, declared / declared_all
        error = (share - wanted) / wanted
        of_whole = f", {side / whole:.2f} of the guest's unrestricted {whole:.0f}" if whole else ""
        alone_text = f"; alone {alone:.0f} TFLOP/s" if isinstance(alone, (int, float)) else ""
        how = "enforced" if t.get("enforced") else "advised"
        text = (
            f"{name}/{tenant} ({how} {declared}% of SMs): side by side {side:.0f} of the tenants' {aggregate:.0f} "
            f"TFLOP/s, {share:.3f} for a declared {wanted:.3f} ({error:+.1%}; within {SHARE_TOLERANCE:.0%} is the "
            f"goal){of_whole}{alone_text}"
        )
        ok = abs(error) <= SHARE_TOLERANCE
        checks.append(Check("sharing-share", "ok" if ok else "fail", text, None if ok else FIX, index))
    mem = m.get("memory")
    if isinstance(mem, dict):
        share, got, refused = mem.get("share_mib"), mem.get("got_mib"), mem.get("refused")
        if refused is True and isinstance(got, int) and isinstance(share, int) and got <= share:
            asked = mem.get("asked_mib")
            text = f"{name}: a tenant asking for {asked} MiB got {got} MiB, then was refused (share {share} MiB)"
            checks.append(Check("sharing-memory", "ok", text, None, index))
        else:
            text = f"{name}: a tenant asking past its {share} MiB share: {mem}"
            checks.append(Check("sharing-memory", "fail", text[:600], FIX, index))
    iso = m.get("isolation")
    if isinstance(iso, dict):
        ratio, alone, beside = iso.get("p99_ratio"), iso.get("alone") or {}, iso.get("beside") or {}
        if isinstance(ratio, (int, float)):
            text = (
                f"{name}: a quiet tenant's small kernel, p50/p99 alone {alone.get('p50_ms', 0):.3f}/"
                f"{alone.get('p99_ms', 0):.3f} ms, beside a noisy one {beside.get('p50_ms', 0):.3f}/"
                f"{beside.get('p99_ms', 0):.3f} ms: p99 x{ratio:.2f} (goal at most x{P99_GOAL})"
            )
            checks.append(Check("sharing-latency", "ok" if ratio <= P99_GOAL else "warn", text, None, index))
        else:
            checks.append(Check("sharing-latency", "warn", f"{name}: not measured: {iso.get('errors')}", None, index))
    return checks


def _daemon(name: str, entry: dict[str, Any], state: MpsState, index: int | None) -> Check:
    limits = entry.get("server_limits") if isinstance(entry.get("server_limits"), dict) else {}
    sm, mem = _int(limits.get("sm_percent")), _int(limits.get("memory_mib"))
    wrong = []
    if state.supervisor_pid is None:
        wrong.append("its supervisor does not run")
    if not state.daemon_pids:
        wrong.append("no nvidia-cuda-mps-control runs for it")
    if not state.control_socket:
        wrong.append("its pipe folder has no control socket")
    if not state.shm_mounted:
        wrong.append("its shared memory folder is not mounted")
    if state.query_error:
        wrong.append(f"the daemon did not answer: {state.query_error}")
    elif state.daemon_pids and (state.default_sm != sm or state.default_mem_mib != mem):
        wrong.append(f"its limits are {state.default_sm}% / {state.default_mem_mib} MiB, declared {sm}% / {mem} MiB")
    for pid, (s_sm, s_mem) in sorted(state.server_limits.items()):
        if (s_sm, s_mem) != (sm, mem):
            wrong.append(f"server {pid} holds its clients to {s_sm}% / {s_mem} MiB, declared {sm}% / {mem} MiB")
    if wrong:
        return Check("sharing", "fail", f"{name}: MPS: " + "; ".join(wrong), FIX, index)
    servers = len(state.server_limits)
    return Check(
        "sharing",
        "ok",
        f"{name}: MPS daemon up, every client held to {sm}% of SMs and {mem} MiB ({servers} server(s) running)",
        None,
        index,
    )


def _isolation(name: str, entry: dict[str, Any], facts: Any, index: int | None) -> Check:
    rows = facts.sharing.gpus if facts.sharing is not None and facts.sharing.gpus else []
    mode = next((r.compute_mode for r in rows if r.uuid == entry.get("uuid")), None)
    advised = [t for t in entry.get("tenants") or [] if isinstance(t, dict) and t.get("enforced") is False]
    notes = []
    status = "ok"
    if mode == "Exclusive_Process":
        notes.append("compute mode Exclusive_Process: a process that leaves MPS is refused")
    else:
        status = "warn"
        notes.append(
            f"compute mode {mode or 'unknown'}: a process that leaves MPS by itself (its own CUDA_MPS_PIPE_DIRECTORY "
            "inside the container, or the device nodes given without the runtime) gets the GPU time-sliced beside "
            "the tenants; set compute_mode: exclusive_process where the GPU's settings may change"
        )
    for t in advised:
        status = "warn"
        share = f"{t.get('sm_percent')}%, {t.get('memory_mib')} MiB"
        notes.append(f"tenant {t.get('name')}'s share ({share}) is advice: MPS holds it to the largest share")
    return Check("sharing-isolation", status, f"{name}: " + "; ".join(notes), None, index)
