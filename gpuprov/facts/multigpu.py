"""What verify's multi-GPU and health checks read, as one plain JSON-able dict (the
"probe"): per GPU its NVLink links, BAR1, ECC counts, retired pages and remapped rows,
clock event (throttle) reasons (NVML), its NUMA node, local CPUs and BAR sizes (sysfs);
per pair of GPUs NVML's P2P status; the CPUs this process may run on; Xid events from
the kernel log. ``dev/tools/multigpu_probe.py`` writes the same dict to a file, so a real
machine's values become a test fixture (tests/verify/test_verify_multigpu.py).

Every value that cannot be read is ``None`` (the checks say "unknown"), never an
exception: NVML is asked through the ``pynvml`` module passed in (as in
:mod:`gpuprov.facts.gpus`), one call at a time, each failure its own ``None``.
NVML's constants are written out here (NVML's nvml.h), not taken from the module,
so a fake or an older nvidia-ml-py reads the same.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .gpus import GpuInfo, normalize_bus_id, nvml_asker
from .pci import IORESOURCE_MEM_64, IORESOURCE_PREFETCH, PCI_DEVICES, bar_lines
from .sysfs import Sysfs, parse_int

PROBE_SCHEMA = "gpuprov.multigpu-probe/v1"

NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS
FEATURE_ENABLED = 1  # NVML_FEATURE_ENABLED
# nvmlGpuP2PCapsIndex_t
P2P_READ, P2P_WRITE, P2P_NVLINK = 0, 1, 2
# nvmlMemoryErrorType_t, nvmlEccCounterType_t
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1
ECC_VOLATILE, ECC_AGGREGATE = 0, 1
# nvmlPageRetirementCause_t
RETIRED_SBE, RETIRED_DBE = 0, 1
# nvmlIntNvLinkDeviceType_t
NVLINK_REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}

# The kernel log is read up to this much (the ring buffer is 128 KiB-16 MiB); Xid lines kept up to this many.
KMSG_MAX_BYTES = 1 << 24
MAX_XID_EVENTS = 200
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d{1,4})\b")
KERN_LOGS = ("var/log/kern.log", "var/log/messages")


# ---------------------------------------------------------------- NVML


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, bool)) else None


def _count(pages: Any) -> int | None:
    """How many retired pages NVML listed (some bindings hand back a lazy map that fails late)."""
    if pages is None:
        return None
    try:
        return len(list(pages))
    except (TypeError, ValueError):
        return None


def _nvlinks(ask: Any, h: Any) -> list[dict[str, Any]]:
    """One entry per link NVML knows on this GPU (none on a GPU without NVLink)."""
    links = []
    for link in range(NVLINK_MAX_LINKS):
        state = _int(ask("nvmlDeviceGetNvLinkState", h, link))
        if state is None:
            continue  # no such link, or not supported
        remote = ask("nvmlDeviceGetNvLinkRemotePciInfo_v2", h, link) or ask("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        rtype = _int(ask("nvmlDeviceGetNvLinkRemoteDeviceType", h, link))
        links.append(
            {
                "link": link,
                "active": state == FEATURE_ENABLED,
                "version": _int(ask("nvmlDeviceGetNvLinkVersion", h, link)),
                "remote_address": normalize_bus_id(getattr(remote, "busId", None)),
                "remote_type": None if rtype is None else NVLINK_REMOTE_TYPES.get(rtype, "unknown"),
            }
        )
    return links


def _nvml_gpu(ask: Any, h: Any) -> dict[str, Any]:
    bar1 = ask("nvmlDeviceGetBAR1MemoryInfo", h)
    ecc_mode = ask("nvmlDeviceGetEccMode", h)
    rows = ask("nvmlDeviceGetRemappedRows", h)
    sbe = ask("nvmlDeviceGetRetiredPages", h, RETIRED_SBE)
    dbe = ask("nvmlDeviceGetRetiredPages", h, RETIRED_DBE)
    reasons = ask("nvmlDeviceGetCurrentClocksEventReasons", h)
    if reasons is None:
        reasons = ask("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    rows_ok = isinstance(rows, (list, tuple)) and len(rows) == 4
    return {
        "nvlinks": _nvlinks(ask, h),
        "bar1_total_bytes": _int(getattr(bar1, "bar1Total", None)),
        "ecc": {
            "mode_current": _int(ecc_mode[0]) if isinstance(ecc_mode, (list, tuple)) and ecc_mode else None,
            "volatile_corrected": _int(ask("nvmlDeviceGetTotalEccErrors", h, ECC_CORRECTED, ECC_VOLATILE)),
            "volatile_uncorrected": _int(ask("nvmlDeviceGetTotalEccErrors", h, ECC_UNCORRECTED, ECC_VOLATILE)),
            "aggregate_corrected": _int(ask("nvmlDeviceGetTotalEccErrors", h, ECC_CORRECTED, ECC_AGGREGATE)),
            "aggregate_uncorrected": _int(ask("nvmlDeviceGetTotalEccErrors", h, ECC_UNCORRECTED, ECC_AGGREGATE)),
        },
        "retired_pages": {
            "single_bit": _count(sbe),
            "double_bit": _count(dbe),
            "pending": _int(ask("nvmlDeviceGetRetiredPagesPendingStatus", h)),
        },
        "remapped_rows": None
        if not rows_ok
        else {
            "corrected": _int(rows[0]),
            "uncorrected": _int(rows[1]),
            "pending": bool(rows[2]),
            "failure": bool(rows[3]),
        },
        "clock_event_reasons": _int(reasons),
    }


def read_nvml_probe(nvml: Any, count: int) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]], str | None]:
    """Per GPU index its NVML values, per pair of GPUs the P2P status, and why NVML
    could not be asked at all (``None`` when it could)."""
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as exc:
        return {}, [], f"NVML: {exc}"
    try:
        ask = nvml_asker(nvml, (TypeError, ValueError, AttributeError))  # an older binding: another signature
        handles = {i: ask("nvmlDeviceGetHandleByIndex", i) for i in range(count)}
        gpus = {i: _nvml_gpu(ask, h) for i, h in handles.items() if h is not None}
        pairs = []
        for a in range(count):
            for b in range(a + 1, count):
                ha, hb = handles[a], handles[b]
                known = ha is not None and hb is not None

                def status(cap: int, ha: Any = ha, hb: Any = hb, known: bool = known) -> int | None:
                    return _int(ask("nvmlDeviceGetP2PStatus", ha, hb, cap)) if known else None

                pairs.append(
                    {"gpus": [a, b], "read": status(P2P_READ), "write": status(P2P_WRITE), "nvlink": status(P2P_NVLINK)}
                )
        return gpus, pairs, None
    finally:
        try:
            nvml.nvmlShutdown()
        except error:
            pass


# ---------------------------------------------------------------- sysfs


def parse_resource(text: str | None) -> list[dict[str, Any]]:
    """A PCI device's ``resource`` file: its standard memory BARs that are assigned, as
    ``{"bar", "size_bytes", "prefetchable", "mem64"}``. Malformed lines are skipped."""
    return [
        {
            "bar": region.index,
            "size_bytes": region.size,
            "prefetchable": bool(region.flags & IORESOURCE_PREFETCH),
            "mem64": bool(region.flags & IORESOURCE_MEM_64),
        }
        for region in bar_lines(text)
        if region is not None and region.memory
    ]


def read_sysfs_gpu(sysfs: Sysfs, address: str | None) -> dict[str, Any]:
    """The GPU's NUMA node (``-1``: none given), its local CPUs, its node's CPUs and its BARs."""
    if not address:
        return {"numa_node": None, "local_cpulist": None, "node_cpulist": None, "bars": None}
    base = f"{PCI_DEVICES}/{address}"
    node = parse_int(sysfs.read(f"{base}/numa_node"))
    resource = sysfs.read(f"{base}/resource")
    return {
        "numa_node": node,
        "local_cpulist": sysfs.read(f"{base}/local_cpulist"),
        "node_cpulist": sysfs.read(f"sys/devices/system/node/node{node}/cpulist")
        if node is not None and node >= 0
        else None,
        "bars": None if resource is None else parse_resource(resource),
    }


def process_cpus(live: bool) -> list[int] | None:
    """The CPUs this process may run on (live only: a capture's are not this process's)."""
    if not live or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return sorted(os.sched_getaffinity(0))
    except OSError:
        return None


# ---------------------------------------------------------------- kernel log


def parse_xids(text: str) -> list[dict[str, Any]]:
    """``NVRM: Xid (PCI:0000:00:06): 79, pid=..., GPU has fallen off the bus.`` lines, in order."""
    events = []
    for line in text.splitlines():
        m = XID_LINE.search(line)
        if m is None:
            continue
        address = m.group(1) if "." in m.group(1) else f"{m.group(1)}.0"
        events.append({"address": normalize_bus_id(address), "xid": int(m.group(2)), "line": line[m.start() :][:200]})
        if len(events) >= MAX_XID_EVENTS:
            break
    return events


def _read_kmsg() -> tuple[str | None, str | None]:
    """The kernel ring buffer through /dev/kmsg (records since boot; root, or
    kernel.dmesg_restrict=0). Read without blocking: it ends at EAGAIN."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"/dev/kmsg: {exc.strerror or exc}"
    chunks, total = [], 0
    try:
        while total < KMSG_MAX_BYTES:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # a record overwritten while reading: go on with the next
                continue
            except OSError as exc:
                return None, f"/dev/kmsg: {exc.strerror or exc}"
            if not record:
                break
            chunks.append(record)
            total += len(record)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace"), None


def read_xid_log(sysfs: Sysfs) -> dict[str, Any]:
    """Xid events and where they were read from; ``source`` ``None`` when no kernel log
    could be read (then nothing is known: the checks say unknown)."""
    problems = []
    if sysfs.live:
        text, problem = _read_kmsg()
        if text is not None:
            return {"source": "/dev/kmsg", "error": None, "events": parse_xids(text)}
        problems.append(problem or "/dev/kmsg: unreadable")
    for rel in KERN_LOGS:
        text = sysfs.read(rel)
        if text is not None:
            return {"source": f"/{rel}", "error": None, "events": parse_xids(text)}
    problems.append("no readable " + " or ".join(f"/{r}" for r in KERN_LOGS))
    return {"source": None, "error": "; ".join(problems), "events": []}


# ---------------------------------------------------------------- the probe


def read_multigpu(sysfs: Sysfs, gpus: list[GpuInfo], *, nvml: Any) -> dict[str, Any]:
    """The probe dict for these GPUs. ``nvml``: the pynvml module, or ``None`` when the
    GPUs did not come from NVML (a capture, nvidia-smi): then every NVML value is unknown."""
    nvml_gpus: dict[int, dict[str, Any]] = {}
    pairs: list[dict[str, Any]] = []
    nvml_error = "the GPUs were not read through NVML (pynvml): NVML's values are unknown"
    if nvml is not None and gpus:
        nvml_gpus, pairs, nvml_error = read_nvml_probe(nvml, max(g.index for g in gpus) + 1)
    if not pairs:
        indexes = sorted(g.index for g in gpus)
        pairs = [
            {"gpus": [a, b], "read": None, "write": None, "nvlink": None}
            for n, a in enumerate(indexes)
            for b in indexes[n + 1 :]
        ]
    return {
        "schema": PROBE_SCHEMA,
        "live": sysfs.live,
        "nvml_error": nvml_error,
        "process_cpus": process_cpus(sysfs.live),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "address": g.address,
                **read_sysfs_gpu(sysfs, g.address),
                "nvml": nvml_gpus.get(g.index),
            }
            for g in gpus
        ],
        "pairs": pairs,
        "xid": read_xid_log(sysfs),
        "p2p_bench": None,
    }
