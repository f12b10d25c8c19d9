"""A GPU's health as read (gpuprov/facts/health.py) and what it says (gpuprov/verify/health.py): config
space all ones, asleep or gone; AER counters; Xids, failed resets and the driver's failures in the
kernel log; ECC and remapped rows from nvidia-smi's XML (both forms) and NVML."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprov.facts import health
from gpuprov.facts.health import GpuHealth, parse_aer, parse_log_events, parse_smi_memory, read_health
from gpuprov.facts.sysfs import Sysfs
from gpuprov.verify.health import judge, status
from tests import fleethosts

GPU = "0000:41:00.0"


def test_aer_files_as_the_kernel_writes_them() -> None:
    names = ("RxErr 3", "BadTLP 0", "BadDLLP 1", "Rollover 0", "Timeout 0", "NonFatalErr 0", "CorrIntErr 0")
    text = "\n".join(names) + "\nHeaderOF 0\nTOTAL_ERR_COR 4\n"
    assert parse_aer(text, "TOTAL_ERR_COR") == (4, {"RxErr": 3, "BadDLLP": 1})
    assert parse_aer("Undefined 0\nDLP 2\n", "TOTAL_ERR_FATAL") == (2, {"DLP": 2})  # no total line: the sum
    assert parse_aer(None, "TOTAL_ERR_FATAL") == (None, {})
    assert parse_aer("", "TOTAL_ERR_FATAL") == (None, {})
    assert parse_aer("garbage\nDLP -1\nDLP x\n", "TOTAL_ERR_FATAL") == (0, {})


def test_config_space_all_ones_asleep_gone_or_unread(tmp_path: Path) -> None:
    root, _host = fleethosts.converged("host", tmp_path / "root")
    gpu = fleethosts.H100
    assert health.read_device_health(Sysfs(str(root)), gpu).config == "ok"
    fleethosts.off_the_bus(root, gpu)
    h = health.read_device_health(Sysfs(str(root)), gpu)
    assert (h.present, h.config, h.aer) == (True, "all-ones", None)
    dev = fleethosts.device_dir(root, gpu)
    (dev / "power_state").write_text("D3cold\n")
    assert health.read_device_health(Sysfs(str(root)), gpu).config == "asleep"  # not read: it would wake it
    (dev / "power_state").write_text("D0\n")
    (dev / "config").write_bytes(b"\xff")
    assert health.read_device_health(Sysfs(str(root)), gpu).config == "unknown"
    gone = health.read_device_health(Sysfs(str(root)), "0000:99:00.0")
    assert (gone.present, gone.config) == (False, "unknown")
    assert [f["code"] for f in judge(gone)] == ["gone"]


def test_aer_counters_of_a_device(tmp_path: Path) -> None:
    root, _host = fleethosts.converged("host", tmp_path / "root")
    fleethosts.aer(root, fleethosts.H100, 3)
    h = health.read_device_health(Sysfs(str(root)), fleethosts.H100)
    assert h.aer == {"correctable": 0, "nonfatal": 0, "fatal": 3}
    assert h.aer_errors == {"fatal": {"SurpriseDown": 3}}


KMSG = (
    "4,1201,5000000,-;NVRM: Xid (PCI:0000:41:00): 48, pid=1234, name=python, DBE (0x1,0x2)\n"
    "4,1202,5000001,-;NVRM: Xid (PCI:0000:41:00): 13, pid=1234, Graphics Exception\n"
    "4,1203,5000002,-;NVRM: Xid (PCI:0000:81:00): 31, pid=99, MMU Fault\n"
    "3,1204,5000003,-;NVRM: GPU at PCI:0000:41:00: GPU-00000000-0000-0000-0000-000000000000\n"
    "3,1205,5000004,-;NVRM: GPU at PCI:0000:41:00: GPU has fallen off the bus.\n"
    "3,1206,5000005,-;NVRM: GPU 0000:41:00.0: RmInitAdapter failed! (0x22:0x56:742)\n"
    "6,1207,5000006,-;vfio-pci 0000:41:00.0: not ready 1023ms after bus reset; giving up\n"
    "6,1208,5000007,-;vfio-pci 0000:41:00.0: not ready 1023ms after FLR; waiting\n"
    "6,1209,5000008,-;vfio-pci 0000:81:00.0: secondary bus reset failed\n"
    "6,1210,5000009,-;nvme 0000:02:00.0: reset failed: nothing to do with a GPU\n"
)


def test_the_kernel_log_by_device() -> None:
    events = parse_log_events(KMSG)
    mine = events[GPU]
    assert [e["xid"] for e in mine["xids"]] == [48, 13]
    assert [e["event"] for e in mine["driver_events"]] == ["fallen off the bus", "initialisation failed"]
    assert [r["what"] for r in mine["resets"]] == ["bus reset"]  # "waiting" is not giving up
    assert [r["what"] for r in events["0000:81:00.0"]["resets"]] == ["secondary bus reset"]
    assert [e["xid"] for e in events["0000:81:00.0"]["xids"]] == [31]
    assert events["0000:02:00.0"]["resets"][0]["line"].startswith("0000:02:00.0: reset failed")
    assert all(len(e["line"]) <= health.MAX_LINE for d in events.values() for k in d.values() for e in k)


def test_events_per_device_are_bounded() -> None:
    text = "".join(f"NVRM: Xid (PCI:0000:41:00): 13, n={i}\n" for i in range(health.MAX_EVENTS + 50))
    assert len(parse_log_events(text)[GPU]["xids"]) == health.MAX_EVENTS


SMI_NEW = """<?xml version="1.0" ?>
<nvidia_smi_log><gpu id="00000000:41:00.0"><pci><pci_bus_id>00000000:41:00.0</pci_bus_id></pci>
<ecc_errors><volatile><sram_correctable>2</sram_correctable><sram_uncorrectable_parity>0</sram_uncorrectable_parity>
<sram_uncorrectable_secded>1</sram_uncorrectable_secded><dram_correctable>5</dram_correctable>
<dram_uncorrectable>0</dram_uncorrectable></volatile>
<aggregate><sram_correctable>N/A</sram_correctable><dram_correctable>N/A</dram_correctable></aggregate></ecc_errors>
<remapped_rows><remapped_row_corr>3</remapped_row_corr><remapped_row_unc>1</remapped_row_unc>
<remapped_row_pending>Yes</remapped_row_pending><remapped_row_failure>No</remapped_row_failure></remapped_rows>
</gpu></nvidia_smi_log>"""
SMI_OLD = """<nvidia_smi_log><gpu id="00000000:81:00.0">
<ecc_errors><volatile><single_bit><total>7</total></single_bit><double_bit><total>0</total></double_bit></volatile>
<aggregate><single_bit><total>9</total></single_bit><double_bit><total>2</total></double_bit></aggregate></ecc_errors>
<remapped_rows>N/A</remapped_rows></gpu></nvidia_smi_log>"""


def test_ecc_and_remapped_rows_from_nvidia_smi() -> None:
    new = parse_smi_memory(SMI_NEW)[GPU]
    assert new["ecc"] == {
        "volatile_corrected": 7,
        "volatile_uncorrected": 1,
        "aggregate_corrected": None,
        "aggregate_uncorrected": None,
    }
    assert new["remapped_rows"] == {"corrected": 3, "uncorrected": 1, "pending": True, "failure": False}
    old = parse_smi_memory(SMI_OLD)["0000:81:00.0"]
    assert old["ecc"] == {
        "volatile_corrected": 7,
        "volatile_uncorrected": 0,
        "aggregate_corrected": 9,
        "aggregate_uncorrected": 2,
    }
    assert old["remapped_rows"] is None
    assert parse_smi_memory("<not xml") == {} and parse_smi_memory("<other/>") == {}


class FakeNvml:
    """pynvml's calls health reads through (gpuprov.facts.gpus.from_nvml, multigpu.read_nvml_probe)."""

    NVMLError = RuntimeError

    def __getattr__(self, name: str) -> Any:
        values: dict[str, Any] = {
            "nvmlDeviceGetCount": 1,
            "nvmlDeviceGetPciInfo": SimpleNamespace(busId=b"00000000:41:00.0"),
            "nvmlDeviceGetTotalEccErrors": 4,
            "nvmlDeviceGetRemappedRows": (1, 0, False, True),
        }
        if name in ("nvmlInit", "nvmlShutdown"):
            return lambda *a: None
        if name in values:
            return lambda *a: values[name]
        if name.startswith("nvmlDeviceGet") or name.startswith("nvmlSystemGet"):
            return lambda *a: "h" if name == "nvmlDeviceGetHandleByIndex" else None
        raise AttributeError(name)


def test_ecc_and_rows_through_nvml() -> None:
    values, error = health.read_nvml_memory(FakeNvml())
    assert error is None
    assert values[GPU]["ecc"]["volatile_uncorrected"] == 4
    assert values[GPU]["remapped_rows"] == {"corrected": 1, "uncorrected": 0, "pending": False, "failure": True}


def test_nvml_is_asked_only_on_a_live_host_with_the_driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    live = Sysfs("/")
    assert health.read_memory(live, "never") == ({}, None, "NVML not asked (nvml: never)")
    monkeypatch.setattr(Sysfs, "exists", lambda self, rel: rel == "sys/module/nvidia" or Sysfs.exists(self, rel))
    monkeypatch.setattr(health, "_nvml_module", lambda: FakeNvml())
    values, source, error = health.read_memory(live, "auto")
    assert (source, error) == ("nvml", None) and values[GPU]["ecc"]["volatile_uncorrected"] == 4
    root, _host = fleethosts.converged("passthrough", tmp_path / "root")
    assert health.read_memory(Sysfs(str(root)))[2] == "no /capture/nvidia-smi-q-x under the root"


def test_read_health_reads_the_log_once_for_every_gpu(tmp_path: Path) -> None:
    root, _host = fleethosts.converged("host", tmp_path / "root")
    fleethosts.kernel_log(root, fleethosts.XID_LOG)
    facts = read_health(Sysfs(str(root)), [fleethosts.H100])
    h = facts.gpus[fleethosts.H100]
    assert facts.log_source == "/var/log/kern.log" and [e["xid"] for e in h.xids] == [79]
    assert facts.memory_source == "/capture/nvidia-smi-q-x" and h.ecc is not None
    quiet = read_health(Sysfs(str(root)), [fleethosts.H100], log=False)
    assert quiet.gpus[fleethosts.H100].xids == [] and "not read" in (quiet.log_error or "")


def test_the_hardware_xids_are_verifys() -> None:
    from gpuprov.facts import bootloader, fleet
    from gpuprov.verify import checks_multigpu
    from gpuprov.verify import health as verify_health

    assert verify_health.XID_HARDWARE == checks_multigpu.XID_HARDWARE
    assert fleet.KERNEL_CMDLINE == bootloader.KERNEL_CMDLINE


@pytest.mark.parametrize(
    ("values", "codes", "worst"),
    [
        ({}, [], "ok"),
        ({"config": "all-ones"}, ["off-the-bus"], "fail"),
        ({"aer": {"correctable": 5, "nonfatal": 0, "fatal": 0}}, ["aer-correctable"], "warn"),
        ({"aer": {"correctable": 0, "nonfatal": 1, "fatal": 1}}, ["aer-fatal", "aer-nonfatal"], "fail"),
        ({"xids": [{"xid": 13, "line": "x"}, {"xid": 31, "line": "y"}]}, ["xid"], "warn"),
        ({"xids": [{"xid": 13, "line": "x"}, {"xid": 95, "line": "y"}]}, ["xid-hardware"], "fail"),
        ({"resets": [{"what": "FLR", "line": "z"}]}, ["reset-failed"], "fail"),
        ({"ecc": {"volatile_uncorrected": 1, "aggregate_uncorrected": 1}}, ["ecc-uncorrected"], "fail"),
        ({"ecc": {"volatile_uncorrected": 0, "aggregate_uncorrected": 3}}, ["ecc-uncorrected-lifetime"], "warn"),
        (
            {"remapped_rows": {"corrected": 1, "uncorrected": 0, "pending": True, "failure": False}},
            ["row-remap-pending"],
            "warn",
        ),
        (
            {"remapped_rows": {"corrected": 1, "uncorrected": 9, "pending": False, "failure": True}},
            ["row-remap-failed"],
            "fail",
        ),
        ({"driver_events": [{"event": "fallen off the bus", "line": "l"}]}, ["driver-fallen-off-the-bus"], "fail"),
    ],
)
def test_what_health_says(values: dict[str, Any], codes: list[str], worst: str) -> None:
    h = GpuHealth(GPU, config="ok")
    for key, value in values.items():
        setattr(h, key, value)
    found = judge(h)
    assert sorted(f["code"] for f in found) == sorted(codes)
    assert status(found) == worst
    assert all(f["fix"] for f in found if f["severity"] == "fail")


@pytest.mark.parametrize(
    "count", ["\u00b2", "9" * 5000, "-1", "0x10"], ids=["superscript", "5000 digits", "neg", "hex"]
)
def test_a_hostile_counter_is_unknown_never_an_exception(count: str) -> None:
    """Superscript digits pass isdigit() and crash int(); 5,000 digits exceed Python's int limit (issue 49)."""
    text = SMI_OLD.replace("<single_bit><total>7</total>", f"<single_bit><total>{count}</total>")
    assert parse_smi_memory(text)["0000:81:00.0"]["ecc"]["volatile_corrected"] is None
