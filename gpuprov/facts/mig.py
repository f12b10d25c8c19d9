"""NVIDIA MIG state, from ``nvidia-smi`` text outputs.

MIG lives in the driver, not in sysfs: its state is read with five commands,
each over every GPU at once (the first column of each table is the GPU index):

- ``nvidia-smi --query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending --format=csv,noheader``:
  ``0, 00000000:E1:00.0, Enabled, Enabled`` (``[N/A]`` where a GPU has no MIG);
- ``nvidia-smi mig -lgip``: GPU instance profiles, one row per profile
  (``|   0  MIG 1g.10gb        19     7/7        9.75       No     14     1     0   |``:
  GPU, name, profile ID, instances free/total, memory GiB, P2P, SM, DEC, ENC),
  each followed by a row of CE/JPEG/OFA counts that is not needed here;
- ``nvidia-smi mig -lgipp``: where each profile may start on the GPU's slice axis
  (``GPU  0 Profile ID  9 Placements: {0,4}:4``: starts 0 or 4, four slices);
- ``nvidia-smi mig -lgi``: GPU instances (``|   0  MIG 3g.40gb          9        1          4:4     |``:
  GPU, name, profile ID, instance ID, placement start:size);
- ``nvidia-smi mig -lci``: compute instances
  (``|   0      1       MIG 3g.40gb          2         0          0:4     |``:
  GPU, GPU instance ID, name, profile ID, instance ID, placement).

These formats are the ones NVIDIA's MIG user guide shows (drivers R470 to R580);
lines that match none of them (headers, borders, "No MIG-enabled devices found.")
are skipped. The parsers take text, so tests feed captured or synthetic outputs;
:func:`read_mig` runs the commands on the live machine and reads
``capture/nvidia-smi-mig-*`` files under any other root. Standard library only.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

from .sysfs import Sysfs

COMMANDS = {
    "query": [
        "nvidia-smi",
        "--query-gpu=index,pci.bus_id,mig.mode.current,mig.mode.pending",
        "--format=csv,noheader",
    ],
    "lgip": ["nvidia-smi", "mig", "-lgip"],
    "lgipp": ["nvidia-smi", "mig", "-lgipp"],
    "lgi": ["nvidia-smi", "mig", "-lgi"],
    "lci": ["nvidia-smi", "mig", "-lci"],
    "apps": ["nvidia-smi", "--query-compute-apps=gpu_bus_id,pid,process_name", "--format=csv,noheader"],
}
# Under a captured or staged root: capture/nvidia-smi-mig-<key> for each command.
CAPTURE_DIR = "capture"

_PROFILE_ROW = re.compile(
    r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|"
)
_PLACEMENT_ROW = re.compile(r"^\s*GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,\s]*)\}\s*:\s*(\d+)")
_GI_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|")
_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_CI_ROW = re.compile(r"^\|\s*(\d+)\s+(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\b")


@dataclass
class MigProfile:
    profile_id: int
    name: str  # without "MIG ": 1g.10gb, 1g.10gb+me
    free: int
    total: int
    memory_gib: float
    placements: list[int] = field(default_factory=list)  # possible start slices
    size: int | None = None  # slices one instance takes


@dataclass
class GpuInstance:
    gi_id: int
    profile_id: int
    name: str
    start: int
    size: int
    compute_instances: int = 0


@dataclass
class MigGpu:
    index: int
    address: str  # 0000:e1:00.0
    mode_current: str | None  # enabled | disabled | None (no MIG on this GPU)
    mode_pending: str | None
    profiles: dict[str, MigProfile] = field(default_factory=dict)  # by name
    instances: list[GpuInstance] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)  # "name (pid N)" of compute apps

    @property
    def supported(self) -> bool:
        return self.mode_current in ("enabled", "disabled")

    def profile(self, ref: str | int) -> MigProfile | None:
        """A profile by name (``3g.40gb``, ``MIG 3g.40gb``) or numeric ID."""
        if isinstance(ref, int) or str(ref).strip().isdigit():
            wanted = int(ref)
            return next((p for p in self.profiles.values() if p.profile_id == wanted), None)
        name = str(ref).strip()
        name = name[4:].strip() if name.upper().startswith("MIG ") else name
        return self.profiles.get(name) or next((p for n, p in self.profiles.items() if n.lower() == name.lower()), None)


@dataclass
class MigFacts:
    gpus: dict[str, MigGpu] = field(default_factory=dict)  # by PCI address
    error: str | None = None  # why no state could be read (no nvidia-smi, no capture...)


def smi_address(bus_id: str) -> str:
    """``00000000:E1:00.0`` (nvidia-smi) -> ``0000:e1:00.0`` (sysfs)."""
    domain, _sep, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain or '0', 16):04x}:{rest}"


def _mode(text: str) -> str | None:
    value = text.strip().lower()
    return value if value in ("enabled", "disabled") else None


def parse_query(text: str | None) -> dict[int, MigGpu]:
    """index, bus ID, ..., current mode, pending mode: the bus ID is found by its form, so a
    query with more columns (``index,name,pci.bus_id,...``) or a header line reads the same."""
    gpus: dict[int, MigGpu] = {}
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        bus = next((p for p in parts[1:] if _BUS_ID.match(p)), None)
        if len(parts) < 4 or not parts[0].isdigit() or bus is None:
            continue
        index = int(parts[0])
        gpus[index] = MigGpu(index, smi_address(bus), _mode(parts[-2]), _mode(parts[-1]))
    return gpus


def parse_profiles(text: str | None) -> dict[int, list[MigProfile]]:
    out: dict[int, list[MigProfile]] = {}
    for line in (text or "").splitlines():
        m = _PROFILE_ROW.match(line.strip())
        if m:
            out.setdefault(int(m.group(1)), []).append(
                MigProfile(
                    profile_id=int(m.group(3)),
                    name=m.group(2),
                    free=int(m.group(4)),
                    total=int(m.group(5)),
                    memory_gib=float(m.group(6)),
                )
            )
    return out


def parse_placements(text: str | None) -> dict[int, dict[int, tuple[list[int], int]]]:
    """GPU index -> profile ID -> (possible starts, size)."""
    out: dict[int, dict[int, tuple[list[int], int]]] = {}
    for line in (text or "").splitlines():
        m = _PLACEMENT_ROW.match(line)
        if m:
            starts = [int(s) for s in m.group(3).replace(" ", "").split(",") if s]
            out.setdefault(int(m.group(1)), {})[int(m.group(2))] = (starts, int(m.group(4)))
    return out


def parse_gpu_instances(text: str | None) -> dict[int, list[GpuInstance]]:
    out: dict[int, list[GpuInstance]] = {}
    for line in (text or "").splitlines():
        m = _GI_ROW.match(line.strip())
        if m:
            out.setdefault(int(m.group(1)), []).append(
                GpuInstance(
                    gi_id=int(m.group(4)),
                    profile_id=int(m.group(3)),
                    name=m.group(2),
                    start=int(m.group(5)),
                    size=int(m.group(6)),
                )
            )
    return out


def parse_compute_instances(text: str | None) -> dict[tuple[int, int], int]:
    """(GPU index, GPU instance ID) -> how many compute instances it has."""
    out: dict[tuple[int, int], int] = {}
    for line in (text or "").splitlines():
        m = _CI_ROW.match(line.strip())
        if m:
            key = (int(m.group(1)), int(m.group(2)))
            out[key] = out.get(key, 0) + 1
    return out


def parse_apps(text: str | None) -> dict[str, list[str]]:
    """PCI address -> "name (pid N)" of each compute process on that GPU."""
    out: dict[str, list[str]] = {}
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and ":" in parts[0] and parts[1].isdigit():
            out.setdefault(smi_address(parts[0]), []).append(f"{parts[2]} (pid {parts[1]})")
    return out


def parse_mig(outputs: dict[str, str | None]) -> MigFacts:
    """Every GPU's MIG state from the outputs of :data:`COMMANDS` (by key)."""
    by_index = parse_query(outputs.get("query"))
    profiles = parse_profiles(outputs.get("lgip"))
    placements = parse_placements(outputs.get("lgipp"))
    instances = parse_gpu_instances(outputs.get("lgi"))
    computes = parse_compute_instances(outputs.get("lci"))
    apps = parse_apps(outputs.get("apps"))
    facts = MigFacts()
    for index, gpu in sorted(by_index.items()):
        for p in profiles.get(index, []):
            placement = placements.get(index, {}).get(p.profile_id)
            if placement is not None:
                p.placements, p.size = list(placement[0]), placement[1]
            gpu.profiles[p.name] = p
        for gi in instances.get(index, []):
            gi.compute_instances = computes.get((index, gi.gi_id), 0)
            gpu.instances.append(gi)
        gpu.processes = apps.get(gpu.address, [])
        facts.gpus[gpu.address] = gpu
    return facts


Runner = Callable[[list[str]], str]


def run_command(argv: list[str]) -> str:
    """stdout of a command; nvidia-smi exits non-zero for "nothing to list", which is no error here."""
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    return result.stdout


def read_mig(sysfs: Sysfs, run: Runner | None = None) -> MigFacts:
    """MIG state of every NVIDIA GPU: ``run`` the commands on the live machine
    (default: with subprocess, when nvidia-smi is installed), or read the
    captured outputs under any other root."""
    outputs: dict[str, str | None] = {}
    if sysfs.live or run is not None:
        if run is None:
            if shutil.which("nvidia-smi") is None:
                return MigFacts(error="nvidia-smi is not installed (the NVIDIA driver's utilities)")
            run = run_command
        for key, argv in COMMANDS.items():
            try:
                outputs[key] = run(argv)
            except (OSError, subprocess.SubprocessError) as exc:
                return MigFacts(error=f"{' '.join(argv)} failed: {exc}")
    else:
        for key in COMMANDS:
            outputs[key] = sysfs.read(f"{CAPTURE_DIR}/nvidia-smi-mig-{key}")
        if outputs["query"] is None:
            return MigFacts(error=f"this root has no {CAPTURE_DIR}/nvidia-smi-mig-query (no NVIDIA driver captured)")
    return parse_mig(outputs)
