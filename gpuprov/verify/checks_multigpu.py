"""The multi-GPU and health checks of ``gpuprov verify`` (docs/reference/findings.md):
per pair of GPUs peer access and, with --bench, the P2P copy against the NVLink or PCIe
peak; per GPU its NVLink links, NUMA node against this process's CPUs, BAR1 mapped in
full, ECC errors, retired pages and remapped rows, clock event (throttle) reasons; and
Xid events in the kernel log.

:func:`judge_multigpu` is pure over the probe dict (:mod:`gpuprov.facts.multigpu`,
written as is by ``dev/tools/multigpu_probe.py``), so real machines' probes are test
fixtures. A value the probe could not read is "unknown" (skip), never ok.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from ..facts.numa import parse_cpulist
from .base import Check, link_view, pci_link
from .bench import COPY_OK_FRACTION, NVLINK_GBPS_PER_LINK, nvlink_name, pcie_peak_gbps
from .gather import VerifyFacts

# nvmlGpuP2PStatus_t, as nvidia-smi topo -p2p words them.
P2P_STATUSES = {
    0: "ok",
    1: "chipset not supported",
    2: "GPU not supported",
    3: "IOH topology not supported",
    4: "disabled by regkey",
    5: "not supported",
    6: "unknown",
}
P2P_OK = 0
# nvmlClocksEventReasons bits (nvml.h); the ones that mean the GPU is held below its clocks by
# heat or power trouble, not by idling or a setting.
CLOCK_EVENT_REASONS = {
    0x1: "gpu idle",
    0x2: "applications clocks setting",
    0x4: "sw power cap",
    0x8: "hw slowdown",
    0x10: "sync boost",
    0x20: "sw thermal slowdown",
    0x40: "hw thermal slowdown",
    0x80: "hw power brake slowdown",
    0x100: "display clocks setting",
}
CLOCK_TROUBLE = 0x8 | 0x20 | 0x40 | 0x80
# Xids that say the hardware or its memory failed (NVIDIA's Xid catalog): the GPU needs a
# reset or a look; others (13, 31, 43...) are usually an application's fault.
XID_HARDWARE = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remap",
    64: "ECC page retirement or row remap failure",
    74: "NVLink error",
    79: "GPU fallen off the bus",
    92: "high single-bit ECC rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
GIB = 1 << 30


def multigpu_probe(facts: VerifyFacts) -> dict[str, Any] | None:
    """The probe gather read, with each GPU's PCIe link and its peak (from
    :func:`gpuprov.verify.base.link_view`) added, as the report and the probe tool write it."""
    probe = facts.multigpu
    if probe is None:
        return None
    by_index = {g.index: g for g in facts.gpus}
    gpus = []
    for entry in probe["gpus"]:
        gpu = by_index.get(entry["index"])
        link = link_view(gpu, pci_link(facts, gpu)) if gpu is not None else {}
        peak = pcie_peak_gbps(link.get("max_gen"), link.get("max_width"))
        gpus.append({**entry, "pcie": {**link, "peak_gbps": None if peak is None else round(peak, 2)}})
    bench = probe.get("p2p_bench")
    if facts.p2p_bench is not None:
        bench = [asdict(r) for r in facts.p2p_bench]
    return {**probe, "gpus": gpus, "p2p_bench": bench}


def judge_multigpu(probe: dict[str, Any] | None, *, bench_requested: bool = False) -> list[Check]:
    """Every multi-GPU and health check over a probe dict, in a stable order."""
    if probe is None or not probe.get("gpus"):
        return []
    gpus = probe["gpus"]
    checks = [check_p2p_access(probe, pair) for pair in probe["pairs"]]
    if bench_requested and probe["pairs"]:
        checks += check_p2p_bench(probe)
    for g in gpus:
        checks.append(check_nvlink(g))
    for g in gpus:
        checks.append(check_numa(probe, g))
    for g in gpus:
        checks.append(check_bar1(g))
    checks.append(check_xid(probe))
    for g in gpus:
        checks += [check_ecc(g), check_rows(g), check_clocks(g)]
    return checks


def _nvml(gpu: dict[str, Any]) -> dict[str, Any]:
    return gpu.get("nvml") or {}


def _unknown(what: str) -> str:
    return f"unknown: {what} could not be read"


# ---------------------------------------------------------------- pairs


def _gpu(probe: dict[str, Any], index: int) -> dict[str, Any]:
    return next((g for g in probe["gpus"] if g["index"] == index), {"index": index})


def pair_nvlinks(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, int | None, bool]:
    """(links that join GPU a and b, their NVLink version, whether the links were told
    apart): links from one to the other's address, else, when both reach NVSwitches, the
    fewer of their switch links; else (NVML names no remote, as in some guests) the fewer
    of their active links."""
    la = [x for x in _nvml(a).get("nvlinks") or [] if x.get("active")]
    lb = [x for x in _nvml(b).get("nvlinks") or [] if x.get("active")]
    version = next((x.get("version") for x in la + lb if x.get("version")), None)
    direct = sum(1 for x in la if x.get("remote_address") and x["remote_address"] == b.get("address"))
    if direct:
        return direct, version, True
    sa = sum(1 for x in la if x.get("remote_type") == "switch")
    sb = sum(1 for x in lb if x.get("remote_type") == "switch")
    if sa and sb:
        return min(sa, sb), version, True
    return min(len(la), len(lb)), version, False


def pair_peak(probe: dict[str, Any], a_index: int, b_index: int) -> tuple[float | None, str]:
    """The peak of one direction between two GPUs in GB/s and the link it is of:
    NVLink (links x per-link rate) where NVML says the pair talks over NVLink, else the
    slower of the two PCIe links."""
    a, b = _gpu(probe, a_index), _gpu(probe, b_index)
    pair = next((p for p in probe["pairs"] if sorted(p["gpus"]) == sorted([a_index, b_index])), {})
    if pair.get("nvlink") == P2P_OK:
        links, version, told = pair_nvlinks(a, b)
        rate = NVLINK_GBPS_PER_LINK.get(version or 0)
        if links and rate:
            return links * rate, f"{nvlink_name(version)} x{links}" + ("" if told else " (each GPU's active links)")
        return None, "NVLink (links or version not known)"
    peaks = [(g.get("pcie") or {}).get("peak_gbps") for g in (a, b)]
    if None in peaks:
        return None, "PCIe (link not known)"
    return min(peaks), "PCIe (the slower of the two GPUs' links)"


def check_p2p_access(probe: dict[str, Any], pair: dict[str, Any]) -> Check:
    a, b = pair["gpus"]
    who = f"GPU {a} <-> GPU {b}"
    read, write, nvlink = pair.get("read"), pair.get("write"), pair.get("nvlink")
    if read is None or write is None:
        why = probe.get("nvml_error") or "NVML's P2P status"
        return Check("p2p-access", "skip", f"{who}: peer access unknown ({why})", None, a)
    over = "NVLink" if nvlink == P2P_OK else "PCIe"
    if read == P2P_OK and write == P2P_OK:
        return Check("p2p-access", "ok", f"{who}: peer read and write over {over}", None, a)
    said = f"read {P2P_STATUSES.get(read, read)}, write {P2P_STATUSES.get(write, write)}"
    return Check(
        "p2p-access",
        "warn",
        f"{who}: no peer access ({said}): copies between them go through host memory",
        "NVLink GPUs in a VM: pass them through together and group them (QEMU x-nv-gpudirect-clique); "
        "PCIe GPUs: P2P in a guest needs them behind one virtual switch with ACS off, and a host that allows it",
        a,
    )


def check_p2p_bench(probe: dict[str, Any]) -> list[Check]:
    results = probe.get("p2p_bench")
    if results is None:
        return [Check("bench-p2p", "skip", "no GPU-to-GPU copy measured (one GPU, or no torch/cupy)")]
    checks = []
    for r in results:
        sg, dg = r.get("src_gpu"), r.get("dst_gpu")
        who = f"GPU {sg if sg is not None else '?'} -> GPU {dg if dg is not None else '?'}"
        if r.get("error") or r.get("gbps") is None:
            checks.append(
                Check(
                    "bench-p2p",
                    "fail",
                    f"{who}: the copy failed: {r.get('error')}",
                    "look at `dmesg | grep -i NVRM`",
                    sg,
                )
            )
            continue
        access = {True: "peer access", False: "no peer access", None: "peer access unknown"}[r.get("peer_access")]
        peak, link = (None, "link") if sg is None or dg is None else pair_peak(probe, sg, dg)
        value = f"{who}: {r['gbps']:.1f} GB/s ({access})"
        if peak is None:
            checks.append(Check("bench-p2p", "ok", f"{value}, no peak known for {link}", None, sg))
        elif r["gbps"] >= COPY_OK_FRACTION * peak:
            checks.append(
                Check("bench-p2p", "ok", f"{value}, {r['gbps'] / peak:.0%} of {link} ({peak:.1f} GB/s)", None, sg)
            )
        else:
            checks.append(
                Check(
                    "bench-p2p",
                    "warn",
                    f"{value}, only {r['gbps'] / peak:.0%} of {link} ({peak:.1f} GB/s)",
                    "no peer access: see p2p-access; NVLink: look for links down (nvlink) and Xid 74; "
                    "PCIe: the host's IOMMU mode (iommu=pt) and ACS on the switch between them",
                    sg,
                )
            )
    return checks


# ---------------------------------------------------------------- per GPU


def check_nvlink(gpu: dict[str, Any]) -> Check:
    i = gpu["index"]
    nv = gpu.get("nvml")
    if nv is None:
        return Check("nvlink", "skip", f"GPU {i}: NVLink {_unknown('NVML')}", None, i)
    links = nv.get("nvlinks") or []
    if not links:
        return Check("nvlink", "skip", f"GPU {i}: no NVLink (NVML shows no link: a PCIe-only GPU)", None, i)
    up = [x["link"] for x in links if x.get("active")]
    down = [x["link"] for x in links if not x.get("active")]
    version = next((x.get("version") for x in links if x.get("version")), None)
    what = nvlink_name(version)
    if not down:
        return Check("nvlink", "ok", f"GPU {i}: {len(up)} {what} links up", None, i)
    return Check(
        "nvlink",
        "warn",
        f"GPU {i}: {len(down)} of {len(links)} {what} links down (links {', '.join(map(str, down))})",
        "NVSwitch systems need NVIDIA Fabric Manager running (on the host, or the service VM in "
        "passthrough); links down on a direct-link board: look for Xid 74 and reseat or service the GPU",
        i,
    )


def check_numa(probe: dict[str, Any], gpu: dict[str, Any]) -> Check:
    i = gpu["index"]
    cpus = probe.get("process_cpus")
    node = gpu.get("numa_node")
    local_text = gpu.get("local_cpulist") or gpu.get("node_cpulist")
    local = set(parse_cpulist(local_text))
    if cpus is None:
        return Check(
            "numa-affinity", "skip", f"GPU {i}: unknown: this process's CPUs are only known on a live machine", None, i
        )
    if not local:
        return Check("numa-affinity", "skip", f"GPU {i}: unknown: its local CPUs could not be read", None, i)
    has_node = isinstance(node, int) and node >= 0
    where = f"NUMA node {node}" if has_node else "no NUMA node given (one node)"
    mine = set(cpus)
    if mine <= local:
        return Check("numa-affinity", "ok", f"GPU {i}: {where}; this process runs on its CPUs ({local_text})", None, i)
    if mine & local:
        return Check(
            "numa-affinity",
            "ok",
            f"GPU {i}: {where}, CPUs {local_text}; this process may also run on {len(mine - local)} CPU(s) of "
            "other nodes (pin each GPU's worker to its node: numactl --cpunodebind)",
            None,
            i,
        )
    return Check(
        "numa-affinity",
        "warn",
        f"GPU {i}: {where}, CPUs {local_text}; this process runs only off them (CPUs "
        f"{','.join(map(str, sorted(mine)[:16]))}{'...' if len(mine) > 16 else ''}): every copy crosses nodes",
        f"run the GPU's work on its node (numactl --cpunodebind={node if has_node else 'N'}); "
        "in a VM, give the guest vCPUs and memory on the GPU's host node",
        i,
    )


def bar1_sysfs_bytes(gpu: dict[str, Any]) -> int | None:
    """The size of the GPU's largest prefetchable 64-bit BAR (its BAR1) in sysfs."""
    bars = [b for b in gpu.get("bars") or [] if b.get("prefetchable") and b.get("mem64")]
    return max((b["size_bytes"] for b in bars), default=None)


def check_bar1(gpu: dict[str, Any]) -> Check:
    i = gpu["index"]
    nvml_total = _nvml(gpu).get("bar1_total_bytes")
    sysfs_size = bar1_sysfs_bytes(gpu)
    if nvml_total is None or sysfs_size is None:
        missing = "NVML's BAR1 total" if nvml_total is None else "the BAR sizes in sysfs (resource)"
        return Check("bar1", "skip", f"GPU {i}: BAR1 {_unknown(missing)}", None, i)
    sizes = f"NVML {nvml_total / GIB:g} GiB, PCI BAR {sysfs_size / GIB:g} GiB"
    if nvml_total >= sysfs_size:
        return Check("bar1", "ok", f"GPU {i}: BAR1 mapped in full ({sizes})", None, i)
    return Check(
        "bar1",
        "warn",
        f"GPU {i}: BAR1 smaller than the device's BAR ({sizes}): the VM's MMIO window was too small",
        "give the VM a 64-bit MMIO window above the GPUs' BARs (gpu_vm sizes it from the host facts; "
        "OVMF: X-PciMmio64Mb), then restart the VM",
        i,
    )


def check_ecc(gpu: dict[str, Any]) -> Check:
    i = gpu["index"]
    ecc = _nvml(gpu).get("ecc") or {}
    mode, vol_unc, agg_unc = ecc.get("mode_current"), ecc.get("volatile_uncorrected"), ecc.get("aggregate_uncorrected")
    if mode == 0:
        return Check(
            "ecc", "warn", f"GPU {i}: ECC is off", "turn ECC on (nvidia-smi -e 1, then a GPU reset) unless chosen", i
        )
    if vol_unc is None and agg_unc is None:
        return Check("ecc", "skip", f"GPU {i}: ECC errors {_unknown('NVML ECC counters')}", None, i)
    counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in ecc.items() if k != "mode_current" and v is not None)
    if vol_unc:
        return Check(
            "ecc",
            "fail",
            f"GPU {i}: uncorrected ECC errors since the driver loaded ({counts})",
            "stop the GPU's jobs and reset it (a host-side reset for a passthrough guest); "
            "if they come back, service the GPU",
            i,
        )
    if agg_unc:
        return Check(
            "ecc",
            "warn",
            f"GPU {i}: uncorrected ECC errors in its lifetime ({counts})",
            "watch remapped rows (row-remap) and Xid 48/63/94/95",
            i,
        )
    return Check("ecc", "ok", f"GPU {i}: no uncorrected ECC errors ({counts})", None, i)


def check_rows(gpu: dict[str, Any]) -> Check:
    i = gpu["index"]
    nv = _nvml(gpu)
    rows, pages = nv.get("remapped_rows"), nv.get("retired_pages") or {}
    pages_known = pages.get("single_bit") is not None or pages.get("double_bit") is not None
    if rows is None and not pages_known:
        return Check("row-remap", "skip", f"GPU {i}: remapped rows and retired pages {_unknown('NVML')}", None, i)
    reset = "reset the GPU (a host-side reset for a passthrough guest) so the remap takes effect"
    if rows is not None:
        said = f"remapped rows: {rows.get('corrected')} corrected, {rows.get('uncorrected')} uncorrected"
        if rows.get("failure"):
            return Check(
                "row-remap",
                "fail",
                f"GPU {i}: row remapping failed ({said})",
                "service the GPU: it has no spare rows left",
                i,
            )
        if rows.get("pending"):
            return Check("row-remap", "warn", f"GPU {i}: a row remap is pending ({said})", reset, i)
        return Check("row-remap", "ok", f"GPU {i}: no remap pending or failed ({said})", None, i)
    said = f"retired pages: {pages.get('single_bit')} single-bit, {pages.get('double_bit')} double-bit"
    if pages.get("pending") == 1:
        return Check("row-remap", "warn", f"GPU {i}: a page retirement is pending ({said})", reset, i)
    return Check("row-remap", "ok", f"GPU {i}: no page retirement pending ({said})", None, i)


def check_clocks(gpu: dict[str, Any]) -> Check:
    i = gpu["index"]
    reasons = _nvml(gpu).get("clock_event_reasons")
    if reasons is None:
        return Check("clock-throttle", "skip", f"GPU {i}: clock event reasons {_unknown('NVML')}", None, i)
    active = [word for bit, word in CLOCK_EVENT_REASONS.items() if reasons & bit]
    said = ", ".join(active) or "none"
    if reasons & CLOCK_TROUBLE:
        return Check(
            "clock-throttle",
            "warn",
            f"GPU {i}: clocks held down by {said}",
            "look at the GPU's temperature and power (nvidia-smi -q -d TEMPERATURE,POWER,PERFORMANCE) "
            "and the host's cooling",
            i,
        )
    return Check("clock-throttle", "ok", f"GPU {i}: no thermal or power slowdown (reasons: {said})", None, i)


# ---------------------------------------------------------------- the kernel log


def check_xid(probe: dict[str, Any]) -> Check:
    xid = probe.get("xid") or {}
    if not xid.get("source"):
        return Check(
            "xid",
            "skip",
            f"Xid events unknown: no kernel log readable ({xid.get('error') or 'not read'})",
            "run as root (/dev/kmsg)",
        )
    events = xid.get("events") or []
    if not events:
        return Check("xid", "ok", f"no NVIDIA Xid event in {xid['source']}")
    by_gpu = {g.get("address"): g["index"] for g in probe["gpus"]}
    seen: dict[tuple[Any, int], int] = {}
    for e in events:
        key = (by_gpu.get(e.get("address"), e.get("address")), e["xid"])
        seen[key] = seen.get(key, 0) + 1
    said = "; ".join(
        f"GPU {who}: Xid {code}{' (' + XID_HARDWARE[code] + ')' if code in XID_HARDWARE else ''} x{n}"
        for (who, code), n in sorted(seen.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))
    )
    hardware = any(code in XID_HARDWARE for _who, code in seen)
    return Check(
        "xid",
        "fail" if hardware else "warn",
        f"{len(events)} NVIDIA Xid event(s) in {xid['source']}: {said}",
        "look each Xid up in NVIDIA's Xid catalog; hardware Xids need a GPU reset or service"
        if hardware
        else "application Xids (13, 31, 43...): look at the jobs that ran",
    )
