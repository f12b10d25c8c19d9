"""gpuprov verify's multi-GPU and health checks (gpuprov/verify/checks_multigpu.py) over
probe dicts (gpuprov/facts/multigpu.py, written by dev/tools/multigpu_probe.py).

No multi-GPU machine is here: the probes are made by hand after real outputs, the 4x H200
passthrough guest (../shared/fixtures/toolkit-h200x4: 0000:00:06.0-09.0, NV18 between every
pair, driver 580.159.04) and the H100 guest capture (BAR1 131072 MiB, remapped rows 0,
clocks idle, local CPUs 0-15, numa_node -1), with NVML's constants from nvml.h. Real probes
dropped in tests/fixtures/multigpu/ are judged too. NVML is faked at its boundary, as in
test_verify_nvml.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuprov.facts.gpus import GpuInfo
from gpuprov.facts.multigpu import parse_resource, parse_xids, read_multigpu, read_nvml_probe, read_sysfs_gpu
from gpuprov.facts.sysfs import Sysfs
from gpuprov.report.verify import build_report
from gpuprov.verify.bench import P2pResult
from gpuprov.verify.checks import evaluate
from gpuprov.verify.checks_multigpu import judge_multigpu, multigpu_probe, pair_peak
from tests.verify.test_verify_nvml import FakeGpu, FakeNvml, NVMLError_NotSupported, guest, verify

SCHEMA = json.loads((Path(__file__).parents[2] / "gpuprov/schemas/verify.v1.json").read_text())
PROBE_SCHEMA = SCHEMA["properties"]["multigpu"]
REAL_PROBES = sorted((Path(__file__).parents[1] / "fixtures" / "multigpu").glob("*.probe.json"))
GIB = 1 << 30
H200_ADDRESSES = ["0000:00:06.0", "0000:00:07.0", "0000:00:08.0", "0000:00:09.0"]
# The `resource` file of an H100/H200 as Linux writes it: BAR0 16 MiB (32-bit), BAR1 the large
# prefetchable 64-bit one, BAR3 32 MiB prefetchable 64-bit; unused BARs, then the ROM, all zero.
ZERO = "0x0000000000000000 0x0000000000000000 0x0000000000000000"


def resource(bar1_bytes: int) -> str:
    bar1_start = 0x380000000000
    return "\n".join(
        [
            "0x00000000fd000000 0x00000000fdffffff 0x0000000000040200",
            f"0x{bar1_start:016x} 0x{bar1_start + bar1_bytes - 1:016x} 0x000000000014220c",
            ZERO,
            f"0x{bar1_start + bar1_bytes:016x} 0x{bar1_start + bar1_bytes + (32 << 20) - 1:016x} 0x000000000014220c",
            ZERO,
            ZERO,
            ZERO,
        ]
    )


def h200_gpu(index: int, *, bar1: int = 256 * GIB) -> dict[str, Any]:
    return {
        "index": index,
        "name": "NVIDIA H200",
        "address": H200_ADDRESSES[index],
        "numa_node": -1,
        "local_cpulist": "0-15",
        "node_cpulist": None,
        "bars": parse_resource(resource(bar1)),
        "nvml": {
            "nvlinks": [
                {"link": n, "active": True, "version": 6, "remote_address": None, "remote_type": "switch"}
                for n in range(18)
            ],
            "bar1_total_bytes": bar1,
            "ecc": {
                "mode_current": 1,
                "volatile_corrected": 0,
                "volatile_uncorrected": 0,
                "aggregate_corrected": 0,
                "aggregate_uncorrected": 0,
            },
            "retired_pages": {"single_bit": None, "double_bit": None, "pending": None},  # Hopper remaps rows
            "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": False, "failure": False},
            "clock_event_reasons": 0x1,  # idle
        },
        "pcie": {"current_gen": 5, "max_gen": 5, "current_width": 16, "max_width": 16, "peak_gbps": 63.02},
    }


def h200x4() -> dict[str, Any]:
    return {
        "schema": "gpuprov.multigpu-probe/v1",
        "live": True,
        "nvml_error": None,
        "process_cpus": list(range(16)),
        "gpus": [h200_gpu(i) for i in range(4)],
        "pairs": [{"gpus": [a, b], "read": 0, "write": 0, "nvlink": 0} for a in range(4) for b in range(a + 1, 4)],
        "xid": {"source": "/dev/kmsg", "error": None, "events": []},
        "p2p_bench": None,
    }


def judged(probe: dict[str, Any], bench: bool = False) -> dict[tuple[str, Any], Any]:
    out = {}
    for c in judge_multigpu(probe, bench_requested=bench):
        key = (c.id, c.gpu)
        if c.id in ("p2p-access", "bench-p2p"):
            key = (c.id, c.message.split(":")[0])
        out[key] = c
    return out


# ---------------------------------------------------------------- a healthy 4x H200 guest


def test_the_h200x4_guest_is_ok_everywhere() -> None:
    probe = h200x4()
    jsonschema.validate(probe, PROBE_SCHEMA)
    checks = judged(probe)
    assert {c.status for c in checks.values()} == {"ok"}
    assert len([k for k in checks if k[0] == "p2p-access"]) == 6
    assert checks["p2p-access", "GPU 0 <-> GPU 3"].message == "GPU 0 <-> GPU 3: peer read and write over NVLink"
    assert checks["nvlink", 2].message == "GPU 2: 18 NVLink 4.0 links up"
    assert checks["bar1", 1].message == "GPU 1: BAR1 mapped in full (NVML 256 GiB, PCI BAR 256 GiB)"
    assert "no NUMA node given" in checks["numa-affinity", 0].message
    assert checks["xid", None].message == "no NVIDIA Xid event in /dev/kmsg"
    assert "(reasons: gpu idle)" in checks["clock-throttle", 3].message


def test_nvlink_peak_is_links_times_the_per_link_rate() -> None:
    # H100/H200 SXM: 18 links, 900 GB/s both ways: 450 GB/s each way.
    assert pair_peak(h200x4(), 0, 1) == (450.0, "NVLink 4.0 x18")


def test_direct_links_are_counted_per_pair() -> None:
    probe = h200x4()
    for g, other in ((0, 1), (1, 0)):
        links = probe["gpus"][g]["nvml"]["nvlinks"]
        for n, link in enumerate(links):
            link["remote_type"] = "gpu"
            link["remote_address"] = H200_ADDRESSES[other] if n < 6 else H200_ADDRESSES[2]
    assert pair_peak(probe, 0, 1) == (150.0, "NVLink 4.0 x6")


def test_links_nvml_names_no_remote_for_count_as_each_gpus_active_links() -> None:
    probe = h200x4()
    for g in probe["gpus"]:
        for link in g["nvml"]["nvlinks"]:
            link["remote_type"] = None
    probe["gpus"][1]["nvml"]["nvlinks"][0]["active"] = False
    assert pair_peak(probe, 0, 1) == (425.0, "NVLink 4.0 x17 (each GPU's active links)")


def test_retired_pages_from_a_binding_whose_list_fails_late_are_unknown() -> None:
    class LateFailing(MultiNvml):
        def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> Any:
            return map(int, [1, 2], [5, 5])  # int(1, 5) raises TypeError once listed: a binding bug

    got, _pairs, error = read_nvml_probe(LateFailing(FakeGpu()), 1)
    assert error is None and got[0]["retired_pages"]["single_bit"] is None
    assert got[0]["bar1_total_bytes"] == 128 * GIB


def test_pcie_pairs_take_the_slower_link() -> None:
    probe = h200x4()
    probe["pairs"][0]["nvlink"] = 5
    probe["gpus"][1]["pcie"]["peak_gbps"] = 31.51
    assert pair_peak(probe, 0, 1) == (31.51, "PCIe (the slower of the two GPUs' links)")
    probe["gpus"][1]["pcie"]["peak_gbps"] = None
    assert pair_peak(probe, 0, 1) == (None, "PCIe (link not known)")


# ---------------------------------------------------------------- P2P


def bench(gbps: float | None, *, error: str | None = None, access: bool | None = True) -> list[dict[str, Any]]:
    return [
        vars(P2pResult(0, 1, 0, 1, "torch", access, 1 << 28, 20, gbps, error)),
        vars(P2pResult(1, 0, 1, 0, "torch", access, 1 << 28, 20, 380.0, None)),
    ]


def test_p2p_copies_against_the_nvlink_peak() -> None:
    probe = h200x4()
    probe["p2p_bench"] = bench(385.2)
    jsonschema.validate(probe, PROBE_SCHEMA)
    checks = judged(probe, bench=True)
    c = checks["bench-p2p", "GPU 0 -> GPU 1"]
    assert c.status == "ok" and c.message == (
        "GPU 0 -> GPU 1: 385.2 GB/s (peer access), 86% of NVLink 4.0 x18 (450.0 GB/s)"
    )
    probe["p2p_bench"] = bench(120.0, access=False)
    c = judged(probe, bench=True)["bench-p2p", "GPU 0 -> GPU 1"]
    assert c.status == "warn" and "only 27% of NVLink 4.0 x18" in c.message and "no peer access" in c.message


def test_a_failed_p2p_copy_fails() -> None:
    probe = h200x4()
    probe["p2p_bench"] = bench(None, error="RuntimeError: CUDA error: peer access is not supported")
    c = judged(probe, bench=True)["bench-p2p", "GPU 0 -> GPU 1"]
    assert c.status == "fail" and "peer access is not supported" in c.message


def test_no_p2p_bench_is_a_skip_and_no_bench_asked_is_no_check() -> None:
    checks = judged(h200x4(), bench=True)
    assert checks["bench-p2p", "no GPU-to-GPU copy measured (one GPU, or no torch/cupy)"].status == "skip"
    assert not [k for k in judged(h200x4()) if k[0] == "bench-p2p"]


@pytest.mark.parametrize(("status", "word"), [(1, "chipset not supported"), (3, "IOH topology not supported")])
def test_no_peer_access_warns_with_nvml_reason(status, word) -> None:
    probe = h200x4()
    probe["pairs"][0].update(read=status, write=status, nvlink=5)
    c = judged(probe)["p2p-access", "GPU 0 <-> GPU 1"]
    assert c.status == "warn" and f"read {word}, write {word}" in c.message and "x-nv-gpudirect-clique" in c.fix


def test_peer_access_not_read_is_unknown() -> None:
    probe = h200x4()
    probe["nvml_error"] = "NVML: Driver Not Loaded"
    probe["pairs"][2].update(read=None, write=None)
    c = judged(probe)["p2p-access", "GPU 0 <-> GPU 3"]
    assert c.status == "skip" and "unknown (NVML: Driver Not Loaded)" in c.message


# ---------------------------------------------------------------- per GPU


def test_links_down_warn_and_name_them() -> None:
    probe = h200x4()
    for n in (4, 17):
        probe["gpus"][1]["nvml"]["nvlinks"][n]["active"] = False
    c = judged(probe)["nvlink", 1]
    assert c.status == "warn" and c.message == "GPU 1: 2 of 18 NVLink 4.0 links down (links 4, 17)"
    assert "Fabric Manager" in c.fix
    # A pair's peak counts the links that are up.
    assert pair_peak(probe, 0, 1) == (400.0, "NVLink 4.0 x16")


def test_a_pcie_only_gpu_and_one_without_nvml() -> None:
    probe = h200x4()
    probe["gpus"][0]["nvml"]["nvlinks"] = []
    probe["gpus"][1]["nvml"] = None
    checks = judged(probe)
    assert checks["nvlink", 0].status == "skip" and "PCIe-only" in checks["nvlink", 0].message
    for cid in ("nvlink", "bar1", "ecc", "row-remap", "clock-throttle"):
        assert checks[cid, 1].status == "skip" and "unknown" in checks[cid, 1].message, cid


@pytest.mark.parametrize(
    ("cpus", "status", "words"),
    [
        ([0, 1, 2], "ok", "this process runs on its CPUs (0-7)"),
        ([6, 7, 8, 9], "ok", "may also run on 2 CPU(s) of other nodes"),
        ([8, 9], "warn", "this process runs only off them (CPUs 8,9)"),
    ],
)
def test_numa_node_against_the_process_cpus(cpus, status, words) -> None:
    probe = h200x4()
    probe["process_cpus"] = cpus
    probe["gpus"][2].update(numa_node=0, local_cpulist="0-7", node_cpulist="0-7")
    c = judged(probe)["numa-affinity", 2]
    assert c.status == status and words in c.message and "NUMA node 0" in c.message
    if status == "warn":
        assert "numactl --cpunodebind=0" in c.fix


def test_numa_unknown_without_a_process_or_local_cpus() -> None:
    probe = h200x4()
    probe["gpus"][0]["local_cpulist"] = None
    assert judged(probe)["numa-affinity", 0].status == "skip"
    probe["gpus"][1]["local_cpulist"] = None
    probe["gpus"][1].update(numa_node=1, node_cpulist="16-31")  # the node's list stands in
    probe["process_cpus"] = [16]
    assert judged(probe)["numa-affinity", 1].status == "ok"
    probe["process_cpus"] = None
    assert judged(probe)["numa-affinity", 1].status == "skip"


def test_bar1_smaller_than_the_device_bar_warns() -> None:
    probe = h200x4()
    probe["gpus"][3]["nvml"]["bar1_total_bytes"] = 256 << 20
    c = judged(probe)["bar1", 3]
    assert c.status == "warn" and "(NVML 0.25 GiB, PCI BAR 256 GiB)" in c.message and "MMIO" in c.fix


def test_bar1_without_the_resource_file_is_unknown() -> None:
    probe = h200x4()
    probe["gpus"][0]["bars"] = None
    c = judged(probe)["bar1", 0]
    assert c.status == "skip" and "BAR sizes in sysfs" in c.message


def test_resource_file_bars() -> None:
    bars = parse_resource(resource(128 * GIB))
    assert bars == [
        {"bar": 0, "size_bytes": 16 << 20, "prefetchable": False, "mem64": False},
        {"bar": 1, "size_bytes": 128 * GIB, "prefetchable": True, "mem64": True},
        {"bar": 3, "size_bytes": 32 << 20, "prefetchable": True, "mem64": True},
    ]
    assert parse_resource("garbage\n0x10 0x0 0x200\n0xzz 0x1 0x200") == [] and parse_resource(None) == []


@pytest.mark.parametrize(
    ("ecc", "status", "words"),
    [
        ({"volatile_uncorrected": 2}, "fail", "uncorrected ECC errors since the driver loaded"),
        ({"aggregate_uncorrected": 1}, "warn", "in its lifetime"),
        ({"mode_current": 0}, "warn", "ECC is off"),
        ({"volatile_corrected": 5}, "ok", "volatile corrected 5"),
        (
            dict.fromkeys(
                ("volatile_corrected", "volatile_uncorrected", "aggregate_corrected", "aggregate_uncorrected")
            ),
            "skip",
            "unknown",
        ),
    ],
)
def test_ecc(ecc, status, words) -> None:
    probe = h200x4()
    probe["gpus"][0]["nvml"]["ecc"].update(ecc)
    c = judged(probe)["ecc", 0]
    assert c.status == status and words in c.message


@pytest.mark.parametrize(
    ("rows", "pages", "status", "words"),
    [
        ({"pending": True, "uncorrected": 1}, None, "warn", "a row remap is pending"),
        ({"failure": True}, None, "fail", "row remapping failed"),
        ({"corrected": 3}, None, "ok", "3 corrected, 0 uncorrected"),
        (None, {"single_bit": 2, "double_bit": 0, "pending": 1}, "warn", "a page retirement is pending"),
        (None, {"single_bit": 0, "double_bit": 0, "pending": 0}, "ok", "no page retirement pending"),
        (None, None, "skip", "unknown"),
    ],
)
def test_remapped_rows_and_retired_pages(rows, pages, status, words) -> None:
    probe = h200x4()
    nv = probe["gpus"][0]["nvml"]
    nv["remapped_rows"] = None if rows is None else {**nv["remapped_rows"], **rows}
    if pages is not None:
        nv["retired_pages"] = pages
    c = judged(probe)["row-remap", 0]
    assert c.status == status and words in c.message


@pytest.mark.parametrize(
    ("reasons", "status", "words"),
    [(0, "ok", "reasons: none"), (0x4, "ok", "sw power cap"), (0x40 | 0x1, "warn", "gpu idle, hw thermal slowdown")],
)
def test_clock_event_reasons(reasons, status, words) -> None:
    probe = h200x4()
    probe["gpus"][0]["nvml"]["clock_event_reasons"] = reasons
    c = judged(probe)["clock-throttle", 0]
    assert c.status == status and words in c.message


# ---------------------------------------------------------------- Xid


KMSG = (
    "4,1201,2345678901,-;NVRM: Xid (PCI:0000:00:07): 79, pid='<unknown>', name=<unknown>, "
    "GPU has fallen off the bus.\n"
    "6,1202,2345678950,-;nvidia-modeset: something else\n"
    "4,1203,2345679000,-;NVRM: Xid (PCI:0000:00:08): 13, pid=4242, name=python3, Graphics Exception\n"
    "4,1204,2345679100,-;NVRM: Xid (PCI:0000:00:08): 13, pid=4242, name=python3, Graphics Exception\n"
)


def test_xid_lines_are_parsed() -> None:
    events = parse_xids(KMSG)
    assert [(e["address"], e["xid"]) for e in events] == [
        ("0000:00:07.0", 79),
        ("0000:00:08.0", 13),
        ("0000:00:08.0", 13),
    ]
    assert events[0]["line"].startswith("NVRM: Xid (PCI:0000:00:07): 79")


def test_a_hardware_xid_fails_and_application_xids_warn() -> None:
    probe = h200x4()
    probe["xid"]["events"] = parse_xids(KMSG)
    c = judged(probe)["xid", None]
    assert c.status == "fail"
    assert c.message == (
        "3 NVIDIA Xid event(s) in /dev/kmsg: GPU 1: Xid 79 (GPU fallen off the bus) x1; GPU 2: Xid 13 x2"
    )
    probe["xid"]["events"] = parse_xids(KMSG.split("\n", 2)[2])
    assert judged(probe)["xid", None].status == "warn"


def test_an_unreadable_kernel_log_is_unknown() -> None:
    probe = h200x4()
    probe["xid"] = {"source": None, "error": "/dev/kmsg: Permission denied", "events": []}
    c = judged(probe)["xid", None]
    assert c.status == "skip" and "Permission denied" in c.message and "root" in c.fix


# ---------------------------------------------------------------- reading


class MultiNvml(FakeNvml):
    """FakeNvml with the NVML calls the multi-GPU probe makes, for GPUs joined by NVSwitch."""

    NVML_FEATURE_ENABLED = 1

    def __init__(self, *gpus: FakeGpu, links: int = 18, down: tuple[int, ...] = ()) -> None:
        super().__init__(*gpus)
        self.links, self.down = links, down
        self.calls: list[str] = []

    def _h(self, h: Any, fn: str) -> FakeGpu:
        self.calls.append(fn)
        return self._gpu(h, fn)

    def nvmlDeviceGetNvLinkState(self, h: Any, link: int) -> int:
        self._h(h, "nvmlDeviceGetNvLinkState")
        if link >= self.links:
            raise NVMLError_NotSupported()
        return 0 if link in self.down else 1

    def nvmlDeviceGetNvLinkVersion(self, h: Any, link: int) -> int:
        self._h(h, "nvmlDeviceGetNvLinkVersion")
        return 6  # NVML_NVLINK_VERSION_4_0: what a real H200 answers (tests/fixtures/multigpu/h200x2-guest)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: Any, link: int) -> int:
        self._h(h, "nvmlDeviceGetNvLinkRemoteDeviceType")
        return 2

    def nvmlDeviceGetNvLinkRemotePciInfo_v2(self, h: Any, link: int) -> Any:
        raise NVMLError_NotSupported()  # a guest does not see the switches

    def nvmlDeviceGetP2PStatus(self, a: Any, b: Any, cap: int) -> int:
        self._h(a, "nvmlDeviceGetP2PStatus")
        return 0

    def nvmlDeviceGetBAR1MemoryInfo(self, h: Any) -> Any:
        self._h(h, "nvmlDeviceGetBAR1MemoryInfo")
        return type("Bar1", (), {"bar1Total": 128 * GIB, "bar1Used": 1 << 20, "bar1Free": 128 * GIB - (1 << 20)})()

    def nvmlDeviceGetEccMode(self, h: Any) -> list[int]:
        return [1, 1]

    def nvmlDeviceGetTotalEccErrors(self, h: Any, kind: int, counter: int) -> int:
        return 7 if (kind, counter) == (0, 1) else 0  # aggregate corrected

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        raise NVMLError_NotSupported()

    def nvmlDeviceGetRemappedRows(self, h: Any) -> list[int]:
        return [0, 0, 0, 0]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return 1


def two_h100s(fake, *, bar1: int = 128 * GIB):
    root = guest(fake)
    fake.pci("0000:00:07.0", cls=0x030200, driver="nvidia", link=(32.0, 16, 32.0, 16), reset="flr")
    for addr in ("0000:00:06.0", "0000:00:07.0"):
        fake.write(f"sys/bus/pci/devices/{addr}/numa_node", "-1\n")
        fake.write(f"sys/bus/pci/devices/{addr}/local_cpulist", "0-15\n")
        fake.write(f"sys/bus/pci/devices/{addr}/resource", resource(bar1) + "\n")
    fake.write("var/log/kern.log", "Nov 22 kernel: [  1.0] NVRM: loading NVIDIA UNIX Open Kernel Module\n")
    gpus = (FakeGpu(), FakeGpu(bus_id="00000000:00:07.0", uuid="GPU-00000000-0000-0000-0000-000000000001"))
    return root, gpus


def test_gather_reads_nvml_sysfs_and_the_log_into_a_schema_valid_report(fake) -> None:
    root, gpus = two_h100s(fake)
    nvml = MultiNvml(*gpus, down=(5,))
    facts, checks = verify(root, nvml=nvml)
    probe = multigpu_probe(facts)
    jsonschema.validate(probe, PROBE_SCHEMA)
    jsonschema.validate(build_report(facts, evaluate(facts)), SCHEMA)
    assert probe["pairs"] == [{"gpus": [0, 1], "read": 0, "write": 0, "nvlink": 0}]
    g0 = probe["gpus"][0]
    assert len(g0["nvml"]["nvlinks"]) == 18 and g0["nvml"]["nvlinks"][5]["active"] is False
    assert g0["nvml"]["retired_pages"] == {"single_bit": None, "double_bit": None, "pending": None}
    assert g0["pcie"]["peak_gbps"] == 63.02 and g0["numa_node"] == -1
    assert checks["p2p-access", 0].status == "ok"
    assert (
        checks["nvlink", 0].status == "warn"
        and "1 of 18 NVLink 4.0 links down (links 5)" in checks["nvlink", 0].message
    )
    assert checks["bar1", 1].status == "ok" and "aggregate corrected 7," in checks["ecc", 0].message
    assert checks["row-remap", 0].status == "ok" and checks["clock-throttle", 1].status == "ok"
    assert checks["xid", None].status == "ok" and "/var/log/kern.log" in checks["xid", None].message
    # A captured root is not this process: its CPUs are unknown.
    assert checks["numa-affinity", 0].status == "skip"
    assert nvml.initialised == 0  # every nvmlInit was shut down


def test_nvml_that_fails_every_new_call_leaves_unknowns_not_a_crash(fake) -> None:
    root, gpus = two_h100s(fake)
    facts, checks = verify(root, nvml=FakeNvml(*gpus))  # knows none of the multi-GPU calls
    assert facts.multigpu is not None
    for cid in ("nvlink", "bar1", "ecc", "row-remap", "clock-throttle"):
        assert checks[cid, 0].status == "skip", cid
    assert checks["p2p-access", 0].status == "skip"


def test_a_capture_read_through_nvidia_smi_has_no_nvml_values(fake, host_root) -> None:
    root = guest(fake)
    fake.write("capture/nvidia-smi-q-x", (host_root("h100-passthrough-guest") / "capture/nvidia-smi-q-x").read_text())
    facts, checks = verify(root, nvml=None)
    assert facts.gpus_from == "capture" and facts.multigpu["nvml_error"].startswith(
        "the GPUs were not read through NVML"
    )
    assert facts.multigpu["gpus"][0]["nvml"] is None and checks["xid", None].status == "skip"


def test_nvml_that_cannot_start_names_why() -> None:
    gpus = [GpuInfo(0, "A", None, None, 1), GpuInfo(1, "B", None, None, 1)]
    nvml = FakeNvml(loaded=False)
    got, pairs, error = read_nvml_probe(nvml, 2)
    assert (got, pairs) == ({}, []) and error == "NVML: Driver Not Loaded"
    probe = read_multigpu(Sysfs("/nonexistent-root"), gpus, nvml=nvml)
    assert probe["pairs"] == [{"gpus": [0, 1], "read": None, "write": None, "nvlink": None}]
    assert probe["gpus"][0]["numa_node"] is None and probe["gpus"][0]["bars"] is None


def test_sysfs_values_of_a_gpu(fake) -> None:
    root = guest(fake)
    base = "sys/bus/pci/devices/0000:00:06.0"
    fake.write(f"{base}/numa_node", "1\n")
    fake.write(f"{base}/local_cpulist", "16-31\n")
    fake.write(f"{base}/resource", resource(64 * GIB) + "\n")
    fake.write("sys/devices/system/node/node1/cpulist", "16-31\n")
    got = read_sysfs_gpu(Sysfs(str(root)), "0000:00:06.0")
    assert got["numa_node"] == 1 and got["node_cpulist"] == "16-31" and got["local_cpulist"] == "16-31"
    assert [b["size_bytes"] for b in got["bars"]] == [16 << 20, 64 * GIB, 32 << 20]


# ---------------------------------------------------------------- probe files


def probe_files() -> list[Any]:
    return [pytest.param(p, id=p.name) for p in REAL_PROBES] + [pytest.param(None, id="hand-made-h200x4")]


@pytest.mark.parametrize("path", probe_files())
def test_probe_files_are_judged(path: Path | None, tmp_path: Path) -> None:
    """A probe as dev/tools/multigpu_probe.py writes it: schema-valid, and judged with every
    pair and every GPU named (the real ones come from the device machine)."""
    if path is None:
        path = tmp_path / "h200x4.probe.json"
        probe = copy.deepcopy(h200x4())
        probe["p2p_bench"] = bench(385.0)
        probe.update(bench_requested=True, nvidia_smi_topo={"m": None, "p2p_r": None})
        path.write_text(json.dumps(probe))
    probe = json.loads(path.read_text())
    jsonschema.validate(probe, PROBE_SCHEMA)
    checks = judge_multigpu(probe, bench_requested=probe.get("bench_requested", False))
    n = len(probe["gpus"])
    ids = [c.id for c in checks]
    assert ids.count("p2p-access") == n * (n - 1) // 2
    for cid in ("nvlink", "numa-affinity", "bar1", "ecc", "row-remap", "clock-throttle"):
        assert sorted(c.gpu for c in checks if c.id == cid) == sorted(g["index"] for g in probe["gpus"]), cid
    assert ids.count("xid") == 1
    if probe.get("p2p_bench"):
        assert ids.count("bench-p2p") == len(probe["p2p_bench"])
    # A live probe of a working guest read NVML: nothing it judges is unknown there.
    if probe["live"] and probe["nvml_error"] is None:
        assert not [c for c in checks if c.id in ("p2p-access", "ecc", "clock-throttle") and c.status == "skip"]


def test_the_real_2x_h200_guest() -> None:
    """The probe of a device machine (2x H200, NV18, a passthrough guest), with its measured P2P copies."""
    (path,) = [p for p in REAL_PROBES if p.name == "h200x2-guest.probe.json"]
    probe = json.loads(path.read_text())
    assert pair_peak(probe, 0, 1) == (450.0, "NVLink 4.0 x18")
    checks = judged(probe, bench=True)
    assert checks["nvlink", 0].message == "GPU 0: 18 NVLink 4.0 links up"
    assert checks["p2p-access", "GPU 0 <-> GPU 1"].status == "ok"
    copy_0_1 = checks["bench-p2p", "GPU 0 -> GPU 1"]
    assert copy_0_1.status == "ok" and "of NVLink 4.0 x18 (450.0 GB/s)" in copy_0_1.message, copy_0_1.message
    assert checks["bar1", 1].message == "GPU 1: BAR1 mapped in full (NVML 256 GiB, PCI BAR 256 GiB)"
