"""A GPU's health as its host (or guest) shows it, for the fleet report (docs/guides/fleet.md):

- off the bus: its config space reads all ones (``0xffffffff`` where the vendor and device ids
  are), the sign of a device that no longer answers; not read while the device sleeps in D3cold
  (a read would wake it), and a device that is gone from the bus is ``present: False``;
- AER: the kernel's counters of correctable, non-fatal and fatal PCIe errors
  (``aer_dev_correctable``, ``aer_dev_nonfatal``, ``aer_dev_fatal``), each error by name and
  their total;
- the kernel log (``/dev/kmsg`` on the live machine, else ``/var/log/kern.log`` or
  ``/var/log/messages`` below the root, read once): NVIDIA Xid events
  (:func:`gpuprov.facts.multigpu.parse_xids`), resets that failed (``not ready ... after FLR;
  giving up``, ``reset ... failed``) and the driver's own "fallen off the bus" and failed
  initialisation lines, each by PCI address;
- ECC error counts and remapped rows: through NVML where it is asked for and there (a live
  machine with the NVIDIA driver loaded and the ``pynvml`` module), else from a captured
  ``capture/nvidia-smi-q-x`` that still holds them.

Everything is read through :class:`Sysfs`, so a captured or staged root reads the same as the
host. A value that cannot be read is ``None`` (unknown), never a guess. Read-only; what the
values mean is :mod:`gpuprov.verify.health`'s.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from .gpus import SMI_CAPTURE, normalize_bus_id
from .multigpu import KERN_LOGS, MAX_XID_EVENTS, _read_kmsg, parse_xids
from .pci import PCI_DEVICES
from .sysfs import Sysfs, parse_int

# The kernel's AER statistics files (drivers/pci/pcie/aer.c) and the total line each ends with.
AER_FILES = {
    "correctable": ("aer_dev_correctable", "TOTAL_ERR_COR"),
    "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL"),
    "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL"),
}
# Lines of the kernel log kept per device and kind; the text of one line kept up to this.
MAX_EVENTS = MAX_XID_EVENTS
MAX_LINE = 200
# nvidia-smi -q -x's output is tens of KiB a GPU; a larger capture file is not parsed.
MAX_SMI_BYTES = 8 << 20
_ADDRESS = r"(?P<address>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])"
# "pci 0000:41:00.0: not ready 65535ms after FLR; giving up" (drivers/pci/pci.c, pci_dev_wait),
# "vfio-pci 0000:41:00.0: reset of device failed" and the like.
_RESET_FAILED = (
    re.compile(rf"\b{_ADDRESS}: not ready \d+ms after (?P<what>[^;]{{1,40}}); giving up"),
    re.compile(
        rf"\b{_ADDRESS}: [^\n]{{0,80}}?\b(?P<what>(?:bus |secondary bus |function level )?reset|FLR)\b"
        r"[^\n]{0,40}\bfailed\b",
        re.IGNORECASE,
    ),
)
# The driver's own words (NVRM) with the address: "NVRM: GPU at PCI:0000:41:00: GPU has fallen off the bus."
_NVRM_OFF_BUS = re.compile(
    r"NVRM: GPU at PCI:(?P<address>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
    r": GPU has fallen off the bus"
)
_NVRM_INIT = re.compile(rf"NVRM: GPU {_ADDRESS}: RmInitAdapter failed")


@dataclass
class GpuHealth:
    """One device's health as read; ``None``: not known (not shown, not readable, not asked)."""

    address: str
    present: bool = True  # its directory is on the PCI bus
    power_state: str | None = None  # D0, D3hot, D3cold... (the kernel's power_state)
    config: str = "unknown"  # ok | all-ones | asleep (D3cold: not read) | unknown (not readable)
    aer: dict[str, int | None] | None = None  # correctable/nonfatal/fatal totals; None: no AER shown
    aer_errors: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> error name -> count (> 0 only)
    xids: list[dict[str, Any]] = field(default_factory=list)  # {"xid", "line"}
    resets: list[dict[str, Any]] = field(default_factory=list)  # {"what", "line"}: resets that failed
    driver_events: list[dict[str, Any]] = field(default_factory=list)  # {"event", "line"}: off the bus, init failed
    ecc: dict[str, int | None] | None = None  # volatile/aggregate corrected/uncorrected
    remapped_rows: dict[str, Any] | None = None  # corrected, uncorrected, pending, failure

    def as_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "present": self.present,
            "power_state": self.power_state,
            "config": self.config,
            "aer": self.aer,
            "aer_errors": self.aer_errors,
            "xids": self.xids,
            "resets": self.resets,
            "driver_events": self.driver_events,
            "ecc": self.ecc,
            "remapped_rows": self.remapped_rows,
        }


@dataclass
class HealthFacts:
    gpus: dict[str, GpuHealth] = field(default_factory=dict)
    log_source: str | None = None  # where the kernel log was read; None: none could be
    log_error: str | None = None
    memory_source: str | None = None  # "nvml" | "/capture/nvidia-smi-q-x" | None: ECC and rows unknown
    memory_error: str | None = None


# ---------------------------------------------------------------- sysfs


def parse_aer(text: str | None, total_name: str) -> tuple[int | None, dict[str, int]]:
    """An ``aer_dev_*`` file: (its total, the errors counted more than zero by name). The total is
    the file's own ``TOTAL_ERR_*`` line, else the sum of what it lists; (None, {}) when unreadable."""
    if text is None:
        return None, {}
    counts: dict[str, int] = {}
    total = None
    for line in text.splitlines()[:64]:
        name, _sep, value = line.strip().rpartition(" ")
        number = parse_int(value)
        if not name or number is None or number < 0:
            continue
        if name == total_name:
            total = number
        elif number:
            counts[name[:64]] = number
    if total is None and not counts and not text.strip():
        return None, {}
    return (sum(counts.values()) if total is None else total), counts


def read_device_health(sysfs: Sysfs, address: str) -> GpuHealth:
    """What sysfs shows of one device's health: there or not, power state, config space, AER."""
    base = f"{PCI_DEVICES}/{address}"
    health = GpuHealth(address)
    entries = sysfs.try_listdir(base)
    if entries is None:
        health.present = False
        health.config = "unknown"
        return health
    health.power_state = sysfs.read(f"{base}/power_state") if "power_state" in entries else None
    if health.power_state == "D3cold":
        health.config = "asleep"
    elif "config" in entries:
        raw = sysfs.read_bytes(f"{base}/config")
        if raw is None or len(raw) < 4:
            health.config = "unknown"
        else:
            health.config = "all-ones" if raw[:4] == b"\xff\xff\xff\xff" else "ok"
    if any(name in entries for name, _total in AER_FILES.values()):
        health.aer = {}
        for kind, (name, total_name) in AER_FILES.items():
            total, counts = parse_aer(sysfs.read(f"{base}/{name}") if name in entries else None, total_name)
            health.aer[kind] = total
            if counts:
                health.aer_errors[kind] = counts
    return health


# ---------------------------------------------------------------- the kernel log


def read_kernel_log(sysfs: Sysfs) -> tuple[str | None, str | None, str | None]:
    """(text, where it was read, why none could be): /dev/kmsg on the live machine, else a
    kernel log file below the root, as :func:`gpuprov.facts.multigpu.read_xid_log` reads it."""
    problems = []
    if sysfs.live:
        text, problem = _read_kmsg()
        if text is not None:
            return text, "/dev/kmsg", None
        problems.append(problem or "/dev/kmsg: unreadable")
    for rel in KERN_LOGS:
        text = sysfs.read(rel)
        if text is not None:
            return text, f"/{rel}", None
    problems.append("no readable " + " or ".join(f"/{r}" for r in KERN_LOGS))
    return None, None, "; ".join(problems)


def _full(address: str) -> str | None:
    return normalize_bus_id(address if "." in address else f"{address}.0")


def parse_log_events(text: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Address -> {"xids", "resets", "driver_events"} from the kernel log's text, in order."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def add(address: str | None, kind: str, event: dict[str, Any]) -> None:
        if address is None:
            return
        events = out.setdefault(address, {"xids": [], "resets": [], "driver_events": []})[kind]
        if len(events) < MAX_EVENTS:
            events.append(event)

    for event in parse_xids(text):
        add(event["address"], "xids", {"xid": event["xid"], "line": event["line"]})
    for line in text.splitlines():
        if "NVRM" in line:
            m = _NVRM_OFF_BUS.search(line)
            if m:
                add(
                    _full(m.group("address")),
                    "driver_events",
                    {"event": "fallen off the bus", "line": line[m.start() :][:MAX_LINE]},
                )
                continue
            m = _NVRM_INIT.search(line)
            if m:
                add(
                    _full(m.group("address")),
                    "driver_events",
                    {"event": "initialisation failed", "line": line[m.start() :][:MAX_LINE]},
                )
                continue
        if "fail" not in line and "giving up" not in line:
            continue
        for pattern in _RESET_FAILED:
            m = pattern.search(line)
            if m:
                add(
                    _full(m.group("address")),
                    "resets",
                    {"what": m.group("what").strip(), "line": line[m.start() :][:MAX_LINE]},
                )
                break
    return out


# ---------------------------------------------------------------- ECC and remapped rows


def _smi_int(node: ET.Element | None, path: str) -> int | None:
    found = None if node is None else node.find(path)
    text = None if found is None or found.text is None else found.text.strip()
    number = parse_int(text)
    return number if number is not None and number >= 0 else None


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc_of(node: ET.Element | None) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) of one <volatile> or <aggregate>: the newer drivers' sram_/dram_
    fields, or the older ones' single_bit/double_bit totals."""
    if node is None:
        return None, None
    corrected = _sum([_smi_int(node, "sram_correctable"), _smi_int(node, "dram_correctable")])
    uncorrected = _sum(
        [
            _smi_int(node, "sram_uncorrectable_parity"),
            _smi_int(node, "sram_uncorrectable_secded"),
            _smi_int(node, "sram_uncorrectable"),
            _smi_int(node, "dram_uncorrectable"),
        ]
    )
    if corrected is None:
        corrected = _smi_int(node, "single_bit/total")
    if uncorrected is None:
        uncorrected = _smi_int(node, "double_bit/total")
    return corrected, uncorrected


def _yes(node: ET.Element, path: str) -> bool | None:
    found = node.find(path)
    text = (found.text or "").strip().lower() if found is not None else ""
    return True if text == "yes" else False if text == "no" else None


def parse_smi_memory(text: str) -> dict[str, dict[str, Any]]:
    """Address -> {"ecc", "remapped_rows"} from ``nvidia-smi -q -x``; {} when it is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        return {}
    if root.tag != "nvidia_smi_log":
        return {}
    out: dict[str, dict[str, Any]] = {}
    for gpu in root.findall("gpu"):
        bus = gpu.find("pci/pci_bus_id")
        address = normalize_bus_id((bus.text if bus is not None else None) or gpu.get("id"))
        if address is None:
            continue
        ecc = gpu.find("ecc_errors")
        vol_c, vol_u = _ecc_of(None if ecc is None else ecc.find("volatile"))
        agg_c, agg_u = _ecc_of(None if ecc is None else ecc.find("aggregate"))
        counts = {
            "volatile_corrected": vol_c,
            "volatile_uncorrected": vol_u,
            "aggregate_corrected": agg_c,
            "aggregate_uncorrected": agg_u,
        }
        rows = gpu.find("remapped_rows")
        remapped = None
        if rows is not None and _smi_int(rows, "remapped_row_corr") is not None:
            remapped = {
                "corrected": _smi_int(rows, "remapped_row_corr"),
                "uncorrected": _smi_int(rows, "remapped_row_unc"),
                "pending": _yes(rows, "remapped_row_pending"),
                "failure": _yes(rows, "remapped_row_failure"),
            }
        out[address] = {
            "ecc": counts if any(v is not None for v in counts.values()) else None,
            "remapped_rows": remapped,
        }
    return out


def read_nvml_memory(nvml: Any) -> tuple[dict[str, dict[str, Any]], str | None]:
    """Address -> {"ecc", "remapped_rows"} through NVML (the pynvml module), and why not."""
    from .gpus import GpuQueryError, from_nvml
    from .multigpu import read_nvml_probe

    try:
        listed = from_nvml(nvml)
    except GpuQueryError as exc:
        return {}, str(exc)
    if not listed.gpus:
        return {}, None
    values, _pairs, error = read_nvml_probe(nvml, max(g.index for g in listed.gpus) + 1)
    out = {}
    for g in listed.gpus:
        nv = values.get(g.index)
        if g.address and nv is not None:
            ecc = {k: v for k, v in (nv.get("ecc") or {}).items() if k != "mode_current"}
            out[g.address] = {
                "ecc": ecc if any(v is not None for v in ecc.values()) else None,
                "remapped_rows": nv.get("remapped_rows"),
            }
    return out, error


def _nvml_module() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None
    return pynvml


def read_memory(sysfs: Sysfs, nvml: str = "auto") -> tuple[dict[str, dict[str, Any]], str | None, str | None]:
    """(address -> ECC and remapped rows, the source, why unknown). ``nvml``: ``auto`` asks NVML on
    the live machine when the NVIDIA driver is loaded and pynvml importable; ``never`` does not."""
    if sysfs.live:
        if nvml == "never":
            return {}, None, "NVML not asked (nvml: never)"
        if not sysfs.exists("sys/module/nvidia"):
            return {}, None, "the NVIDIA driver is not loaded"
        module = _nvml_module()
        if module is None:
            return {}, None, "pynvml (nvidia-ml-py) is not installed: ECC and remapped rows unknown"
        values, error = read_nvml_memory(module)
        return values, ("nvml" if values else None), error
    raw = sysfs.read_bytes(SMI_CAPTURE)
    if raw is None:
        return {}, None, f"no /{SMI_CAPTURE} under the root"
    if len(raw) > MAX_SMI_BYTES:
        return {}, None, f"/{SMI_CAPTURE} is larger than the {MAX_SMI_BYTES} bytes read"
    values = parse_smi_memory(raw.decode("utf-8", "replace"))
    known = {a: v for a, v in values.items() if v["ecc"] is not None or v["remapped_rows"] is not None}
    if not known:
        return {}, None, f"/{SMI_CAPTURE} holds no ECC counts or remapped rows"
    return known, f"/{SMI_CAPTURE}", None


# ---------------------------------------------------------------- all of it


def read_health(sysfs: Sysfs, addresses: list[str], *, nvml: str = "auto", log: bool = True) -> HealthFacts:
    """The health of each device in ``addresses`` (the GPUs), read once for all of them."""
    facts = HealthFacts()
    for address in addresses:
        facts.gpus[address] = read_device_health(sysfs, address)
    if log:
        text, facts.log_source, facts.log_error = read_kernel_log(sysfs)
        events = parse_log_events(text) if text else {}
        for address, health in facts.gpus.items():
            found = events.get(address) or {}
            health.xids = found.get("xids", [])
            health.resets = found.get("resets", [])
            health.driver_events = found.get("driver_events", [])
    else:
        facts.log_error = "the kernel log was not read (log: false)"
    memory, facts.memory_source, facts.memory_error = read_memory(sysfs, nvml)
    for address, health in facts.gpus.items():
        values = memory.get(address) or {}
        health.ecc = values.get("ecc")
        health.remapped_rows = values.get("remapped_rows")
    return facts
