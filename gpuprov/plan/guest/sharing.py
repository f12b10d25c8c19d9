"""How a guest's GPUs are shared among tenants: plan the MPS daemons, their limits, the tenants' CDI
devices and the record ``gpuprov verify`` checks against (docs/guides/sharing.md). Pure.

Per GPU entry of ``gpuprov_guest`` (:mod:`gpuprov.inputs.sharing`):

- ``mps``: a supervisor script (the one place the daemon's lifecycle is written: ``run``, ``stop``,
  ``limits``, ``clean``) keeps ``nvidia-cuda-mps-control -f`` running for that GPU alone, restarts it
  after a crash and applies the limits after each start; systemd runs it as a unit where PID 1 is
  systemd, ``setsid`` starts it where there is none. The daemon runs in a mount namespace of its own
  whose ``/dev/shm`` is the entry's ``shm`` folder: MPS clients share the server's /dev/shm, and the
  tenants' containers get that folder, the pipe folder and ``CUDA_MPS_PIPE_DIRECTORY`` from the CDI
  spec (every device of that GPU, and one device per named tenant). The limits live in the server
  (``set_default_active_thread_percentage``, ``set_default_device_pinned_mem_limit``), where a tenant
  cannot raise them; CDI's environment is applied after Docker's ``-e``, so a container's own
  ``-e CUDA_MPS_PIPE_DIRECTORY`` does not lead it past MPS either. With ``compute_mode:
  exclusive_process`` the GPU takes only the MPS server, so a process that leaves MPS is refused.
- ``exclusive`` and ``shared``: no daemon; one gpuprov kept before is stopped and its folder, script and
  unit removed, and the compute mode it set put back to Default.

Refused, with nothing changed: MPS without its binaries, on a GPU the guest does not show, one whose
compute capability is below 7.0 (no limits before Volta) or unknown, memory shares above the GPU's
memory less the reserve, the CDI spec owed without nvidia-ctk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ...core.plan import COMMAND, Action, Plan, Refusal, file_action
from ...facts.boundedjson import BoundedJsonError, loads_bounded
from ...facts.mps import STATE_FILE, GpuRow, MpsState, SharingFacts, parse_record, script_path
from ...inputs.sharing import GpuSharing, GuestSharing
from .toolkit import CDI_STAGING

MIN_COMPUTE_CAP = 7.0  # MPS limits (active thread percentage, pinned memory) need Volta or later
MIN_SHARE_MIB = 1024
GIB = 1024  # MiB: the unit MPS memory limits are held in
EXCLUSIVE_PROCESS = "Exclusive_Process"


def unit_name(name: str) -> str:
    return f"gpuprov-mps-{name}.service"


def unit_path(name: str) -> str:
    return f"etc/systemd/system/{unit_name(name)}"


def wants_path(name: str) -> str:
    return f"etc/systemd/system/multi-user.target.wants/{unit_name(name)}"


@dataclass
class Limits:
    """What the server holds every client of one GPU to, and each tenant's share."""

    sm_percent: int
    memory_mib: int
    tenants: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SharingPlan:
    plan: Plan = field(default_factory=Plan)
    report: list[dict[str, Any]] = field(default_factory=list)
    staging: Action | None = None  # nvidia-ctk's JSON spec, to be made before the CDI spec can be planned
    record: dict[str, Any] | None = None


def find_gpu(gpu: GpuSharing, rows: list[GpuRow]) -> GpuRow | None:
    for row in rows:
        if (gpu.address and row.address == gpu.address) or (gpu.uuid and row.uuid.lower() == gpu.uuid.lower()):
            return row
    return None


def limits_of(gpu: GpuSharing, row: GpuRow, p: Plan) -> Limits | None:
    """The server's limits and the tenants' shares, or a refusal when the GPU cannot hold them."""
    where = f"gpuprov_guest.gpus[{gpu.name}]"
    if row.memory_mib is None:
        p.refusals.append(Refusal(f"{where}: GPU {row.uuid}'s memory is unknown", "check nvidia-smi", row.address))
        return None
    room = row.memory_mib - gpu.memory_reserve_mib
    if gpu.equal_tenants is not None:
        # Whole GiB: the control daemon keeps and shows its memory limit in G (35430M reads back "34G").
        share = (room // gpu.equal_tenants) // GIB * GIB if room > 0 else 0
        if share < MIN_SHARE_MIB:
            p.refusals.append(
                Refusal(
                    f"{where}: {gpu.equal_tenants} tenants get {max(share, 0)} MiB each of {row.uuid}'s "
                    f"{row.memory_mib} MiB less the {gpu.memory_reserve_mib} MiB reserve",
                    f"fewer tenants or a smaller memory_reserve_mib (each needs {MIN_SHARE_MIB} MiB at least)",
                    row.address,
                )
            )
            return None
        sm = 100 // gpu.equal_tenants
        tenants = [
            {"name": f"tenant-{i}", "sm_percent": sm, "memory_mib": share, "enforced": True, "device": row.uuid}
            for i in range(gpu.equal_tenants)
        ]
        return Limits(sm, share, tenants)
    total = sum(t.memory_mib or 0 for t in gpu.tenants)
    if total > room:
        p.refusals.append(
            Refusal(
                f"{where}: the tenants' memory shares add up to {total} MiB, more than {row.uuid}'s {row.memory_mib} "
                f"MiB less the {gpu.memory_reserve_mib} MiB reserve ({room} MiB)",
                "lower the tenants' memory_mib or memory_reserve_mib",
                row.address,
            )
        )
        return None
    uneven = [t.name for t in gpu.tenants if (t.memory_mib or 0) % GIB]
    if uneven:
        p.refusals.append(
            Refusal(
                f"{where}: the memory shares of {', '.join(uneven)} are not whole GiB: MPS holds memory limits in GiB",
                "give each tenant's memory_mib as a multiple of 1024",
                row.address,
            )
        )
        return None
    sm = max(t.sm_percent for t in gpu.tenants)
    mem = max(t.memory_mib or 0 for t in gpu.tenants)
    tenants = [
        {
            "name": t.name,
            "sm_percent": t.sm_percent,
            "memory_mib": t.memory_mib,
            "enforced": (t.sm_percent, t.memory_mib) == (sm, mem),
            "device": f"nvidia.com/gpu={gpu.name}-{t.name}",  # the CDI device its containers ask for
        }
        for t in gpu.tenants
    ]
    return Limits(sm, mem, tenants)


def supervisor_script(gpu: GpuSharing, row: GpuRow, limits: Limits, folder: str, control: str) -> str:
    """The entry's supervisor: every value in it comes from the validated declaration or a GPU's UUID
    checked against its pattern, so nothing read from the guest is run."""
    bindir = control.rsplit("/", 1)[0]
    # Who may connect: the control socket and the server's shared memory are reached through these folders.
    if gpu.clients_group:
        group = gpu.clients_group
        access = f'chgrp {group} "$DIR/pipe" "$DIR/shm" && chmod 0750 "$DIR/pipe" && chmod 1770 "$DIR/shm" || exit 1'
    else:
        access = 'chmod 0755 "$DIR/pipe" && chmod 1777 "$DIR/shm" || exit 1'
    mounted_mode = "1770" if gpu.clients_group else "1777"
    return f"""#!/bin/sh
# gpuprov: the MPS daemon of GPU entry {gpu.name} ({row.uuid}); written by gpuprov.kvm.guest_sharing, do not edit.
#   run     keep nvidia-cuda-mps-control running for this GPU alone (started again after a crash), with
#           the limits below applied after each start, in a mount namespace of its own whose /dev/shm is
#           $DIR/shm (the tenants' containers mount the same folder: MPS clients share the server's /dev/shm)
#   stop    end it (the daemon is told to quit; its server ends with it)
#   limits  apply the limits now, to the daemon and to every running server
#   clean   stop, then remove $DIR
set -u
DIR={folder}
CONTROL={control}
SM={limits.sm_percent}
MEM={limits.memory_mib // GIB}G
PATH={bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH CUDA_VISIBLE_DEVICES={row.uuid} CUDA_MPS_PIPE_DIRECTORY=$DIR/pipe CUDA_MPS_LOG_DIRECTORY=$DIR/log

say() {{ echo "$(date '+%F %T') $*" >>"$DIR/log/supervisor.log"; }}

limits() {{  # tried until the daemon answers (a socket left by a killed one may be there before it listens)
  i=0
  until set_limits 2>/dev/null; do
    [ "${{stopping:-0}}" = 1 ] && return 1  # told to stop meanwhile
    i=$((i + 1)); [ $i -gt 200 ] && {{ say "the daemon did not answer in 20 s: limits not applied"; return 1; }}
    sleep 0.1
  done
  say "limits: $SM% of SMs, $MEM of memory per client"
}}

set_limits() {{
  [ -S "$DIR/pipe/control" ] || return 1
  echo "set_default_active_thread_percentage $SM" | timeout 10 "$CONTROL" >/dev/null || return 1
  echo "set_default_device_pinned_mem_limit 0 $MEM" | timeout 10 "$CONTROL" >/dev/null || return 1
  for s in $(echo get_server_list | timeout 10 "$CONTROL"); do
    echo "set_active_thread_percentage $s $SM" | timeout 10 "$CONTROL" >/dev/null || return 1
    echo "set_device_pinned_mem_limit $s 0 $MEM" | timeout 10 "$CONTROL" >/dev/null || return 1
  done
}}

leftovers() {{  # control daemons and servers of this pipe folder (a supervisor killed hard leaves them)
  for e in /proc/[0-9]*/environ; do
    p=${{e#/proc/}}; p=${{p%/environ}}
    case "$(cat /proc/$p/comm 2>/dev/null)" in nvidia-cuda-mps*) ;; *) continue ;; esac
    tr '\\0' '\\n' <"$e" 2>/dev/null | grep -qx "CUDA_MPS_PIPE_DIRECTORY=$DIR/pipe" && echo "$p"
  done
}}

stop() {{
  pid=$(cat "$DIR/supervisor.pid" 2>/dev/null || true)
  case "$pid" in ''|*[!0-9]*) pid= ;; esac
  # Only this script's supervisor: a pid file left by a killed one may name another process by now.
  [ -n "$pid" ] && ! tr '\\0' '\\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qx "$0" && pid=
  [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
  i=0
  while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 300 ]; do i=$((i + 1)); sleep 0.1; done
  [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null  # still there after 30 s: a stop always ends it
  [ -S "$DIR/pipe/control" ] && echo quit | timeout 10 "$CONTROL" >/dev/null 2>&1
  i=0
  while [ -n "$(leftovers)" ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.1; done
  for p in $(leftovers); do kill -KILL "$p" 2>/dev/null; done
  rm -f "$DIR/supervisor.pid"
}}

run() {{
  mkdir -p "$DIR/pipe" "$DIR/log" "$DIR/shm" || exit 1
  chmod 0755 "$DIR" || exit 1
  {access}
  if [ "${{GPUPROV_MPS_NAMESPACE:-}}" != 1 ]; then
    exec >>"$DIR/log/supervisor.log" 2>&1 </dev/null
    mountpoint -q "$DIR/shm" || mount -t tmpfs -o mode={mounted_mode},nosuid,nodev tmpfs "$DIR/shm" || exit 1
    {access}
    GPUPROV_MPS_NAMESPACE=1 exec unshare --mount --propagation private "$0" run
  fi
  mount --bind "$DIR/shm" /dev/shm || {{ say "cannot mount $DIR/shm on /dev/shm"; exit 1; }}
  echo $$ >"$DIR/supervisor.pid"
  for p in $(leftovers); do kill -KILL "$p" 2>/dev/null; done  # a daemon of a supervisor killed hard
  rm -f "$DIR/pipe/control"
  stopping=0
  trap 'stopping=1; echo quit | timeout 10 "$CONTROL" >/dev/null 2>&1' TERM INT
  while :; do
    rm -f "$DIR/pipe/control"
    "$CONTROL" -f &
    daemon=$!
    say "nvidia-cuda-mps-control started (pid $daemon)"
    limits
    while kill -0 "$daemon" 2>/dev/null; do wait "$daemon"; done
    [ "$stopping" = 1 ] && break
    [ -d "$DIR/log" ] || exit 1  # the folder removed under it: nothing to serve, nothing to log to
    say "nvidia-cuda-mps-control ended: starting it again"
    sleep 1
  done
  rm -f "$DIR/supervisor.pid"
  say "stopped"
}}

case "${{1:-}}" in
  run) run ;;
  stop) stop ;;
  limits) limits ;;
  clean) stop; mountpoint -q "$DIR/shm" && umount "$DIR/shm"; rm -rf "$DIR" ;;
  *) echo "usage: $0 run|stop|limits|clean" >&2; exit 2 ;;
esac
"""


def unit_text(name: str, script: str) -> str:
    return f"""# gpuprov: the MPS daemon of GPU entry {name}; written by gpuprov.kvm.guest_sharing, do not edit.
[Unit]
Description=gpuprov: NVIDIA MPS for GPU entry {name}
After=local-fs.target

[Service]
Type=simple
ExecStart=/{script} run
ExecStop=/{script} stop
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def client_edits(folder: str, env: dict[str, str]) -> dict[str, Any]:
    """What makes a container an MPS client of the daemon in ``folder``."""
    return {
        "env": [f"CUDA_MPS_PIPE_DIRECTORY={folder}/pipe", *(f"{k}={v}" for k, v in env.items())],
        "mounts": [
            {
                "hostPath": f"{folder}/pipe",
                "containerPath": f"{folder}/pipe",
                "options": ["rbind", "rw", "nosuid", "nodev"],
            },
            {"hostPath": f"{folder}/shm", "containerPath": "/dev/shm", "options": ["rbind", "rw", "nosuid", "nodev"]},
        ],
    }


def share_env(sm: int, mem: int) -> dict[str, str]:
    return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(sm), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={mem // GIB}G"}


def _merge(edits: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    out = dict(edits)
    for key in ("env", "mounts"):
        out[key] = [*(edits.get(key) or []), *more[key]]
    return out


def derive_cdi(base: dict[str, Any], entries: list[tuple[GpuSharing, GpuRow, Limits, str]]) -> str:
    """nvidia-ctk's spec (``base``) with each MPS GPU's devices made MPS clients and a device per named
    tenant (``<entry>-<tenant>``). ``all`` stays only where it is one GPU: a container asking for every
    GPU of a guest whose GPUs are shared apart must name them."""
    devices = [d for d in base.get("devices") or [] if isinstance(d, dict) and isinstance(d.get("name"), str)]
    by_gpu: dict[str, tuple[GpuSharing, GpuRow, Limits, str]] = {}
    for entry in entries:
        by_gpu[str(entry[1].index)] = entry
        by_gpu[entry[1].uuid] = entry
    single = sum(d["name"].isdigit() for d in devices) == 1  # "all" is one GPU
    out: list[dict[str, Any]] = []
    for device in devices:
        name = device["name"]
        edits = device.get("containerEdits") if isinstance(device.get("containerEdits"), dict) else {}
        key = name.split(":", 1)[0]
        if name == "all" and entries:
            if single and len(entries) == 1:
                gpu, _row, limits, folder = entries[0]
                out.append(
                    {
                        **device,
                        "containerEdits": _merge(
                            edits, client_edits(folder, share_env(limits.sm_percent, limits.memory_mib))
                        ),
                    }
                )
            continue
        if key in by_gpu:
            gpu, row, limits, folder = by_gpu[key]
            out.append(
                {
                    **device,
                    "containerEdits": _merge(
                        edits, client_edits(folder, share_env(limits.sm_percent, limits.memory_mib))
                    ),
                }
            )
            if name == row.uuid:
                for t in gpu.tenants:
                    own = client_edits(folder, share_env(t.sm_percent, t.memory_mib or limits.memory_mib))
                    out.append({"name": f"{gpu.name}-{t.name}", "containerEdits": _merge(edits, own)})
            continue
        out.append(device)
    return json.dumps({**base, "devices": out}, indent=2) + "\n"


def _has_mps_edits(text: str | None) -> bool:
    return bool(text) and "CUDA_MPS_PIPE_DIRECTORY=" in (text or "")


def plan_sharing(
    facts: SharingFacts,
    decl: GuestSharing,
    *,
    cdi: bool = True,
    cdi_output: str = "etc/cdi/nvidia.yaml",
    nvidia_ctk: str | None = None,
    staged_now: bool = False,
) -> SharingPlan:
    """Facts + declaration -> what to do (``staged_now``: nvidia-ctk's JSON spec was made in this run)."""
    out = SharingPlan()
    p = out.plan
    old_record = parse_record(facts.files.get(STATE_FILE)) or {}
    set_by_us = set(old_record.get("compute_mode_set") or [])
    mps: list[tuple[GpuSharing, GpuRow, Limits, str]] = []
    declared_mps = [g for g in decl.gpus if g.sharing == "mps"]
    if declared_mps:
        if facts.control is None or facts.server is None:
            p.refusals.append(
                Refusal(
                    "MPS is declared but nvidia-cuda-mps-control or nvidia-cuda-mps-server is not installed",
                    "install the NVIDIA driver's utilities (they come with it), or declare sharing: exclusive",
                )
            )
        if facts.gpus is None:
            p.refusals.append(Refusal(f"the guest's GPUs are unknown: {facts.gpus_error}", "check nvidia-smi"))
    rows = facts.gpus or []
    for gpu in decl.gpus:
        row = find_gpu(gpu, rows) if facts.gpus is not None else None
        report: dict[str, Any] = {"name": gpu.name, "sharing": gpu.sharing, "gpu": gpu.selector}
        out.report.append(report)
        if row is None and facts.gpus is not None:
            shown = ", ".join(f"{r.address} ({r.uuid})" for r in rows) or "none"
            p.refusals.append(
                Refusal(
                    f"gpuprov_guest.gpus[{gpu.name}]: {gpu.selector} is not a GPU of this guest",
                    f"the guest has: {shown}",
                )
            )
            continue
        if row is None:
            continue
        report.update(uuid=row.uuid, address=row.address, index=row.index, compute_mode=row.compute_mode)
        if gpu.sharing != "mps":
            continue
        if row.compute_cap is None or row.compute_cap < MIN_COMPUTE_CAP:
            cap = "unknown" if row.compute_cap is None else f"{row.compute_cap:g}"
            p.refusals.append(
                Refusal(
                    f"gpuprov_guest.gpus[{gpu.name}]: {row.uuid} ({row.name}) has compute capability {cap}: MPS limits "
                    "need 7.0 (Volta) or later, and the driver must say so",
                    "declare sharing: shared (time-sliced, no limits) or exclusive for this GPU",
                    row.address,
                )
            )
            continue
        limits = limits_of(gpu, row, p)
        if limits is None:
            continue
        folder = f"{decl.mps_root}/{gpu.name}"
        mps.append((gpu, row, limits, folder))
        report.update(
            server_limits={"sm_percent": limits.sm_percent, "memory_mib": limits.memory_mib},
            tenants=limits.tenants,
            folder=folder,
            enforced=all(t["enforced"] for t in limits.tenants),
            exclusive_process=gpu.compute_mode == "exclusive_process",
        )
    if p.refused:
        return out
    mps_names = {g.name for g, _r, _l, _f in mps}
    # What is no longer MPS: stopped and removed first (a GPU may move from one entry to another).
    for name, state in sorted(facts.states.items()):
        if name in mps_names:
            continue
        _remove(p, facts, name, state)
    for uuid in sorted(set_by_us - {row.uuid for g, row, _l, _f in mps if g.compute_mode == "exclusive_process"}):
        if any(r.uuid == uuid for r in rows):
            p.actions.append(
                _command(
                    ["nvidia-smi", "-i", uuid, "-c", "DEFAULT"],
                    f"{uuid} is no longer shared by MPS: compute mode back to Default",
                )
            )
    for gpu, row, limits, folder in mps:
        _keep(p, facts, gpu, row, limits, folder)
    if cdi:
        _cdi(out, facts, mps, cdi_output, nvidia_ctk, staged_now)
    record = {
        "version": 1,
        "declaration": decl.as_dict(),
        "gpus": [{k: v for k, v in entry.items() if k != "compute_mode"} for entry in out.report],  # not live state
        "compute_mode_set": sorted(row.uuid for g, row, _l, _f in mps if g.compute_mode == "exclusive_process"),
        "cdi_output": "/" + cdi_output,
    }
    out.record = record
    text = json.dumps(record, indent=2, sort_keys=True) + "\n" if (mps or decl.gpus or old_record) else None
    action = file_action(
        STATE_FILE, text, facts.files.get(STATE_FILE), "what gpuprov verify checks the sharing against"
    )
    if action is not None:
        p.actions.append(action)
    return out


def _command(argv: list[str], why: str) -> Action:
    return Action(COMMAND, why, argv=argv)


def _remove(p: Plan, facts: SharingFacts, name: str, state: MpsState) -> None:
    script = script_path(name)
    unit = facts.files.get(unit_path(name))
    if unit is not None and facts.systemd:
        p.actions.append(
            _command(["systemctl", "disable", "--now", unit_name(name)], f"{name} is no longer shared by MPS")
        )
    if facts.files.get(script) is not None:
        p.actions.append(
            _command([f"/{script}", "clean"], f"{name} is no longer shared by MPS: daemon stopped, folder removed")
        )
    elif state.folder or state.daemon_pids:
        p.warnings.append(f"{name}: a folder or daemon of gpuprov's is left without its script; remove it by hand")
    for rel in (unit_path(name), script):
        action = file_action(rel, None, facts.files.get(rel), f"{name} is no longer shared by MPS")
        if action is not None:
            p.actions.append(action)
    if unit is not None and facts.systemd:
        p.actions.append(_command(["systemctl", "daemon-reload"], f"the unit of {name} is removed"))


def _keep(p: Plan, facts: SharingFacts, gpu: GpuSharing, row: GpuRow, limits: Limits, folder: str) -> None:
    state = facts.states.get(gpu.name) or MpsState()
    script = script_path(gpu.name)
    why = f"GPU entry {gpu.name} ({row.uuid}) shared by MPS"
    if gpu.compute_mode == "exclusive_process" and row.compute_mode != EXCLUSIVE_PROCESS:
        p.actions.append(
            _command(
                ["nvidia-smi", "-i", row.uuid, "-c", "EXCLUSIVE_PROCESS"],
                f"{why}: the GPU takes only the MPS server (a process that leaves MPS is refused)",
            )
        )
    text = supervisor_script(gpu, row, limits, folder, facts.control or "")
    script_action = file_action(script, text, facts.files.get(script), f"{why}: its supervisor", mode=0o755)
    running = state.supervisor_pid is not None
    broken = running and (not state.control_socket or not state.shm_mounted)
    restart = running and (script_action is not None or broken)
    if script_action is not None:
        p.actions.append(script_action)
    if facts.systemd:
        unit_action = file_action(
            unit_path(gpu.name), unit_text(gpu.name, script), facts.files.get(unit_path(gpu.name)), f"{why}: its unit"
        )
        if unit_action is not None:
            p.actions += [unit_action, _command(["systemctl", "daemon-reload"], f"{why}: the unit changed")]
        unit = unit_name(gpu.name)
        if restart:
            p.actions.append(
                _command(
                    ["systemctl", "restart", unit], f"{why}: {'drift repaired' if broken else 'its supervisor changed'}"
                )
            )
        elif not running or facts.files.get(wants_path(gpu.name)) is None:
            p.actions.append(_command(["systemctl", "enable", "--now", unit], f"{why}: daemon started"))
    else:
        if restart:
            p.actions.append(
                _command([f"/{script}", "stop"], f"{why}: {'drift repaired' if broken else 'its supervisor changed'}")
            )
        if restart or not running:
            p.actions.append(
                _command(["setsid", "-f", f"/{script}", "run"], f"{why}: daemon started (no systemd here)")
            )
    if running and not restart and _limits_drift(state, limits):
        p.actions.append(
            _command(
                [f"/{script}", "limits"],
                f"{why}: limits as declared ({limits.sm_percent}% of SMs, {limits.memory_mib} MiB per client)",
            )
        )


def _limits_drift(state: MpsState, limits: Limits) -> bool:
    if state.query_error is not None or state.default_sm is None or state.default_mem_mib is None:
        return True
    wanted = (float(limits.sm_percent), limits.memory_mib)
    if (state.default_sm, state.default_mem_mib) != wanted:
        return True
    return any(sm != wanted[0] or mem != wanted[1] for sm, mem in state.server_limits.values())


def _cdi(
    out: SharingPlan,
    facts: SharingFacts,
    mps: list[tuple[GpuSharing, GpuRow, Limits, str]],
    cdi_output: str,
    nvidia_ctk: str | None,
    staged_now: bool,
) -> None:
    current = facts.files.get(cdi_output)
    if not mps and not _has_mps_edits(current):
        return
    try:
        base = loads_bounded(facts.files.get(CDI_STAGING) or "", max_chars=16 << 20)
    except BoundedJsonError:
        base = None
    wanted = derive_cdi(base, mps) if isinstance(base, dict) else None
    if wanted is not None and wanted == current:
        return
    if not staged_now:
        if nvidia_ctk is None:
            out.plan.refusals.append(
                Refusal(
                    "the CDI spec owes the MPS clients' settings but nvidia-ctk is not installed",
                    "run the container toolkit stage first (role guest_container_toolkit)",
                )
            )
            return
        out.staging = _command(
            [nvidia_ctk, "cdi", "generate", "--format=json", f"--output=/{CDI_STAGING}"],
            "nvidia-ctk's spec of every GPU, which the MPS clients' devices are made from (then the CDI spec)",
        )
        out.plan.actions.append(out.staging)
        return
    if wanted is None:
        out.plan.refusals.append(
            Refusal(f"/{CDI_STAGING} (nvidia-ctk's spec) could not be read", "check nvidia-ctk cdi generate")
        )
        return
    why = "the MPS clients' settings on their GPUs' devices" if mps else "no GPU is shared by MPS any more"
    action = file_action(cdi_output, wanted, current, why)
    if action is not None:
        out.plan.actions.append(action)
