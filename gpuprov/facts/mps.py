"""What GPU sharing in a guest stands on: the GPUs (nvidia-smi), NVIDIA's MPS binaries, the service
manager, and per declared GPU entry the MPS daemon gpuprov keeps (its folder, supervisor, control
daemon, server and limits).

Files and processes are read through :class:`Sysfs` (a staged root reads the same, and shows no
process); the GPUs and the limits only the live guest can say: ``nvidia-smi --query-gpu`` and the MPS
control daemon's ``get_*`` commands, both read-only and bounded in time (:data:`QUERIES` is the whole
list). :mod:`gpuprov.plan.guest.sharing` plans from these facts.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from .boundedjson import BoundedJsonError, loads_bounded
from .sysfs import Sysfs

CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"
BIN_DIRS = ("usr/local/nvidia/bin", "usr/local/bin", "usr/bin", "usr/sbin", "bin", "opt/nvidia/bin")
GPU_FIELDS = "index,uuid,pci.bus_id,memory.total,compute_mode,compute_cap,name,driver_version"
# The only questions put to a control daemon: each reads, none changes it.
QUERIES = ("get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0", "get_server_list")
SERVER_QUERIES = ("get_active_thread_percentage {pid}", "get_device_pinned_mem_limit {pid} 0")
TIMEOUT = 10.0
STATE_FILE = "etc/gpuprov/guest-sharing.json"  # the sharing gpuprov applied: what gpuprov verify checks against
MAX_PIDS = 4096  # processes looked at under /proc
GPU_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@dataclass
class GpuRow:
    index: int
    uuid: str
    address: str  # normalized full PCI address (0000:00:06.0)
    memory_mib: int | None
    compute_mode: str  # nvidia-smi's words: Default, Exclusive_Process, Prohibited
    compute_cap: float | None  # 9.0 for an H200; None when the driver cannot say
    name: str
    driver: str


@dataclass
class MpsState:
    """One declared GPU entry's daemon, as the guest shows it."""

    folder: bool = False
    control_socket: bool = False
    shm_mounted: bool = False
    supervisor_pid: int | None = None  # the supervisor that keeps the daemon running, when it runs
    daemon_pids: list[int] = field(default_factory=list)  # control daemons of this entry's pipe folder
    server_pids: list[int] = field(default_factory=list)
    default_sm: float | None = None
    default_mem_mib: int | None = None
    server_limits: dict[int, tuple[float | None, int | None]] = field(default_factory=dict)
    query_error: str | None = None


@dataclass
class SharingFacts:
    gpus: list[GpuRow] | None = None  # None: unknown (gpus_error says why)
    gpus_error: str | None = None
    control: str | None = None  # absolute path (as on the guest) of nvidia-cuda-mps-control
    server: str | None = None
    systemd: bool | None = None  # PID 1 is systemd
    states: dict[str, MpsState] = field(default_factory=dict)
    folders: list[str] = field(default_factory=list)  # entries gpuprov has a folder for under mps_root
    files: dict[str, str | None] = field(default_factory=dict)  # root-relative path -> text (None: absent)


def pci_from_smi(text: str) -> str:
    """nvidia-smi's ``00000000:00:06.0`` -> ``0000:00:06.0``."""
    value = text.strip().lower()
    domain, _colon, rest = value.partition(":")
    if len(domain) == 8 and domain.startswith("0000"):
        domain = domain[4:]
    return f"{domain}:{rest}"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and abs(value) < 1e12 else None


def parse_gpu_rows(text: str) -> list[GpuRow]:
    """``nvidia-smi --query-gpu=GPU_FIELDS --format=csv,noheader,nounits`` -> rows; a line that does not
    read is skipped (the GPU is then not found, and the planner refuses what names it)."""
    rows = []
    for line in text.splitlines()[:MAX_PIDS]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 8 or not cells[0].isascii() or not cells[0].isdigit() or len(cells[0]) > 4:
            continue
        if not GPU_UUID.fullmatch(cells[1]):
            continue  # a UUID goes into the supervisor script and the CDI spec: only the form NVIDIA writes
        memory = _number(cells[3])
        rows.append(
            GpuRow(
                index=int(cells[0]),
                uuid=cells[1][:64],
                address=pci_from_smi(cells[2])[:32],
                memory_mib=int(memory) if memory is not None and memory >= 0 else None,
                compute_mode=cells[4][:32],
                compute_cap=_number(cells[5]),
                name=cells[6][:96],
                driver=cells[7][:32],
            )
        )
    return rows


def query_gpus(timeout: float = 60) -> tuple[list[GpuRow] | None, str | None]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, "nvidia-smi is not on the PATH (it comes with the NVIDIA driver's utilities)"
    argv = [exe, f"--query-gpu={GPU_FIELDS}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi did not answer within {timeout:g} s (a hung GPU or driver)"
    except OSError as exc:
        return None, f"nvidia-smi could not run: {exc}"
    if proc.returncode != 0:
        said = (proc.stdout.strip() or proc.stderr.strip() or f"exit status {proc.returncode}").splitlines()[0]
        return None, f"nvidia-smi --query-gpu failed: {said[:300]}"
    return parse_gpu_rows(proc.stdout), None


def find_binary(sysfs: Sysfs, name: str) -> str | None:
    for folder in BIN_DIRS:
        if sysfs.exists(f"{folder}/{name}"):
            return f"/{folder}/{name}"
    return None


def mib(text: str) -> int | None:
    """A size as the control daemon writes it (``4G``, ``4096M``, ``35000.0M``, bytes) -> MiB."""
    m = re.fullmatch(r"\s*([0-9]{1,15}(?:\.[0-9]{1,6})?)\s*([KMGT]?)i?B?\s*", text.strip().upper())
    if m is None:
        return None
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[m.group(2)]
    return round(float(m.group(1)) * scale)


def ask(control: str, pipe: str, command: str, timeout: float = TIMEOUT) -> str:
    """One read-only command (from :data:`QUERIES`) to the control daemon of ``pipe``; its answer."""
    if command.split()[0] not in {q.split()[0] for q in QUERIES + SERVER_QUERIES}:
        raise ValueError(f"{command!r} is not a read-only MPS query")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CUDA_MPS_PIPE_DIRECTORY": pipe}
    proc = subprocess.run(
        [control], input=command + "\n", capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if proc.returncode != 0:
        raise OSError(f"{command}: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:200]}")
    return proc.stdout.strip()


def _processes(sysfs: Sysfs) -> list[tuple[int, str, str]]:
    """(pid, CONTROL or SERVER, environment) of each MPS daemon and server (the comm, truncated to 15
    characters, names both: the command line tells them apart), bounded; none below a staged root."""
    if not sysfs.live:
        return []
    out = []
    for name in sysfs.listdir("proc")[: MAX_PIDS * 4]:
        if not name.isdigit() or not (sysfs.read_text(f"proc/{name}/comm") or "").startswith("nvidia-cuda-mps"):
            continue
        argv = (sysfs.read_text(f"proc/{name}/cmdline") or "").split("\0")
        if any(os.path.basename(a) == SERVER for a in argv[:2]):
            kind = SERVER
        elif "-f" in argv[1:3] or "-d" in argv[1:3]:
            kind = CONTROL
        else:
            continue  # the control program in its client mode: a question on its way, not a daemon
        out.append((int(name), kind, sysfs.read_text(f"proc/{name}/environ") or ""))
        if len(out) >= MAX_PIDS:
            break
    return out


def script_path(name: str) -> str:
    """Root-relative path of an entry's supervisor script (the one place its lifecycle is written)."""
    return f"usr/local/libexec/gpuprov/gpuprov-mps-{name}"


def read_state(
    sysfs: Sysfs,
    folder: str,
    name: str,
    control: str | None,
    procs: list[tuple[int, str, str]],
    script: str | None = None,
) -> MpsState:
    """Entry ``name``'s daemon: ``folder`` is its folder (absolute, under mps_root); ``script`` its
    supervisor (default: where gpuprov writes it)."""
    rel = folder.lstrip("/")
    state = MpsState(folder=sysfs.exists(rel))
    state.control_socket = sysfs.exists(f"{rel}/pipe/control")
    mounts = sysfs.read_text("proc/self/mounts") or ""
    state.shm_mounted = any(line.split(" ")[1:2] == [f"{folder}/shm"] for line in mounts.splitlines())
    pipe_env = f"CUDA_MPS_PIPE_DIRECTORY={folder}/pipe"
    script = script or "/" + script_path(name)
    pid_text = (sysfs.read_text(f"{rel}/supervisor.pid") or "").strip()
    if pid_text.isascii() and pid_text.isdigit() and len(pid_text) < 10:
        cmdline = sysfs.read_text(f"proc/{pid_text}/cmdline") or ""
        if script in cmdline.split("\0"):
            state.supervisor_pid = int(pid_text)
    for pid, kind, environ in procs:
        if pipe_env in environ.split("\0"):
            (state.server_pids if kind == SERVER else state.daemon_pids).append(pid)
    if control is None or not sysfs.live or not state.control_socket or not state.daemon_pids:
        return state
    pipe = f"{folder}/pipe"
    try:
        state.default_sm = _number(ask(control, pipe, QUERIES[0]))
        state.default_mem_mib = mib(ask(control, pipe, QUERIES[1]))
        for word in ask(control, pipe, QUERIES[2]).split()[:64]:
            if word.isascii() and word.isdigit() and len(word) < 10:
                sm = _number(ask(control, pipe, SERVER_QUERIES[0].format(pid=word)))
                mem = mib(ask(control, pipe, SERVER_QUERIES[1].format(pid=word)))
                state.server_limits[int(word)] = (sm, mem)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        state.query_error = str(exc)[:300]
    return state


def read_sharing(sysfs: Sysfs, mps_root: str, names: list[str], *, gpus: bool = True) -> SharingFacts:
    """The facts for entries ``names`` under ``mps_root`` (the managed files' text is the caller's to add)."""
    facts = SharingFacts()
    if gpus and sysfs.live:
        facts.gpus, facts.gpus_error = query_gpus()
    elif gpus:
        facts.gpus_error = "a staged root has no GPU to ask: plan on the live guest"
    facts.control = find_binary(sysfs, CONTROL)
    facts.server = find_binary(sysfs, SERVER)
    comm = sysfs.read_text("proc/1/comm")
    facts.systemd = None if comm is None else comm.strip() == "systemd"
    root_rel = mps_root.lstrip("/")
    facts.folders = sorted(n for n in (sysfs.try_listdir(root_rel) or []) if re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", n))
    procs = _processes(sysfs)
    for name in sorted(set(names) | set(facts.folders)):
        facts.states[name] = read_state(sysfs, f"{mps_root}/{name}", name, facts.control, procs)
    return facts


def read_record(sysfs: Sysfs) -> dict[str, Any] | None:
    """The record guest_sharing wrote, read through ``sysfs`` (:func:`parse_record`)."""
    return parse_record(sysfs.read_text(STATE_FILE))


def parse_record(text: str | None) -> dict[str, Any] | None:
    """The record's text (untrusted on read: bounded, and each field checked by its reader); None when
    there is none or it does not read as a JSON object."""
    if not text:
        return None
    try:
        value = loads_bounded(text, max_chars=1 << 20)
    except BoundedJsonError:
        return None
    return value if isinstance(value, dict) else None
