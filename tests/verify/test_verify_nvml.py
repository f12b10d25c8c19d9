"""gpuprov verify's GPU checks over NVML values and nvidia-smi XML.

NVML is faked at its boundary: :class:`FakeNvml` stands in for the ``pynvml``
module (nvidia-ml-py) with the names and behaviour verify uses (module-level
functions, ``NVMLError``, handles, structs with attributes). The XML is the real
``nvidia-smi -q -x`` of the captured H100 guest, edited where a case needs it.
Sysfs and procfs come from small fake roots (tests/fakehost.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprov.facts.gpus import GpuQueryError, from_nvml, normalize_bus_id, nvml_link_sampler, parse_smi_xml
from gpuprov.facts.sysfs import Sysfs
from gpuprov.facts.vgpu_profile import parse_profile
from gpuprov.report.verify import build_report
from gpuprov.verify.bench import BenchResult
from gpuprov.verify.checks import Check, evaluate
from gpuprov.verify.gather import VerifyFacts, gather
from tests.fakehost import FakeHost

NVML_DEVICE_ARCH_AMPERE = 7
NVML_DEVICE_ARCH_HOPPER = 9
ZERO_UUID = "GPU-00000000-0000-0000-0000-000000000000"


class NVMLError(Exception):
    def __init__(self, value: int, text: str) -> None:
        super().__init__(text)
        self.value = value


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(9, "Driver Not Loaded")


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3, "Not Supported")


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ZERO_UUID
    bus_id: str = "00000000:00:06.0"
    memory_mib: int = 81559
    arch: int = NVML_DEVICE_ARCH_HOPPER
    link: tuple[int, int, int, int] = (5, 5, 16, 16)  # current gen, max gen, current width, max width
    mig: tuple[int, int] | None = (0, 0)
    virtualization: int = 1  # NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    unsupported: set[str] = field(default_factory=set)  # functions that raise NotSupported


class FakeNvml:
    """Build with GPUs, then pass the instance where verify takes the ``pynvml`` module."""

    NVMLError = NVMLError
    NVML_DEVICE_ARCH_AMPERE = NVML_DEVICE_ARCH_AMPERE
    NVML_DEVICE_ARCH_HOPPER = NVML_DEVICE_ARCH_HOPPER

    def __init__(self, *gpus: FakeGpu, driver: str = "580.159.04", cuda: int = 13000, loaded: bool = True) -> None:
        self.gpus = list(gpus)
        self.driver, self.cuda, self.loaded = driver, cuda, loaded
        self.initialised = 0

    def _gpu(self, handle: Any, fn: str) -> FakeGpu:
        if self.initialised <= 0:
            raise NVMLError(1, "Uninitialized")
        gpu = self.gpus[handle.index]
        if fn in gpu.unsupported:
            raise NVMLError_NotSupported()
        return gpu

    def nvmlInit(self) -> None:
        if not self.loaded:
            raise NVMLError_DriverNotLoaded()
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if index >= len(self.gpus):
            raise NVMLError(2, "Invalid Argument")
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._gpu(h, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: Any = None) -> Any:
        total = self._gpu(h, "nvmlDeviceGetMemoryInfo").memory_mib << 20
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        # Older nvidia-ml-py returns the char array as bytes.
        return SimpleNamespace(busId=self._gpu(h, "nvmlDeviceGetPciInfo").bus_id.encode())

    def nvmlDeviceGetArchitecture(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetArchitecture").arch

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        mig = self._gpu(h, "nvmlDeviceGetMigMode").mig
        if mig is None:
            raise NVMLError_NotSupported()
        return list(mig)

    def nvmlDeviceGetVirtualizationMode(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetVirtualizationMode").virtualization

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkGeneration").link[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkGeneration").link[1]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetGpuMaxPcieLinkGeneration").link[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetCurrPcieLinkWidth").link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: Any) -> int:
        return self._gpu(h, "nvmlDeviceGetMaxPcieLinkWidth").link[3]


# ---------------------------------------------------------------- helpers


def guest(
    fake: FakeHost,
    *,
    address: str = "0000:00:06.0",
    link: tuple[float, int, float, int] | None = (32.0, 16, 32.0, 16),
    driver: str | None = "580.159.04",
    gpu_driver: str | None = "nvidia",
) -> Path:
    """A guest root: one NVIDIA GPU on the PCI bus and, unless ``driver=None``, the driver loaded."""
    fake.pci(address, cls=0x030200, driver=gpu_driver, link=link, reset="flr")
    if driver:
        fake.write(
            "proc/driver/nvidia/version",
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {driver}  Release Build  (dvs-builder@U22)  \n"
            "GCC version:  gcc version 12.3.0\n",
        )
        fake.write("proc/modules", "nvidia_uvm 1966080 0 - Live 0x0\nnvidia 14376960 1 nvidia_uvm, Live 0x0\n")
    return fake.root


def verify(root: Path, **kwargs: Any) -> tuple[VerifyFacts, dict[tuple[str, int | None], Check]]:
    kwargs.setdefault("engine", None)
    facts = gather(Sysfs(str(root)), **kwargs)
    checks = evaluate(facts)
    return facts, {(c.id, c.gpu): c for c in checks}


def no_smi() -> str:
    raise GpuQueryError("nvidia-smi is not on the PATH (it comes with the NVIDIA driver's utilities)")


@pytest.fixture(scope="module")
def h100_xml(host_root) -> str:
    return (host_root("h100-passthrough-guest") / "capture" / "nvidia-smi-q-x").read_text()


def as_vgpu(xml: str, name: str, fb_mib: int, license: str | None = None) -> str:
    """The H100 guest's XML turned into a vGPU guest's."""
    xml = xml.replace("<product_name>NVIDIA H100 80GB HBM3</product_name>", f"<product_name>{name}</product_name>")
    xml = xml.replace(
        "<virtualization_mode>Pass-Through</virtualization_mode>", "<virtualization_mode>VGPU</virtualization_mode>"
    )
    xml = re.sub(r"(<fb_memory_usage>\s*<total>)\d+ MiB", rf"\g<1>{fb_mib} MiB", xml)
    if license:
        xml = xml.replace(
            "<gpu_virtualization_mode>",
            "<vgpu_software_licensed_product><licensed_product_name>NVIDIA Virtual Compute Server"
            f"</licensed_product_name><license_status>{license}</license_status></vgpu_software_licensed_product>"
            "<gpu_virtualization_mode>",
        )
    return xml


# ---------------------------------------------------------------- reading NVML and nvidia-smi


def test_nvml_values_are_read_like_pynvml_gives_them() -> None:
    nvml = FakeNvml(
        FakeGpu(),
        FakeGpu(name="NVIDIA A100-SXM4-80GB", bus_id="00000000:C1:00.0", arch=NVML_DEVICE_ARCH_AMPERE, mig=None),
        cuda=12040,
    )
    gl = from_nvml(nvml)
    assert (gl.source, gl.driver_version, gl.cuda_version) == ("nvml", "580.159.04", "12.4")
    h100, a100 = gl.gpus
    assert (h100.index, h100.name, h100.uuid, h100.address) == (0, "NVIDIA H100 80GB HBM3", ZERO_UUID, "0000:00:06.0")
    assert (h100.memory_total_mib, h100.architecture, h100.virtualization_mode) == (81559, "Hopper", "passthrough")
    assert (h100.link.current_gen, h100.link.max_gen, h100.link.current_width, h100.link.max_width) == (5, 5, 16, 16)
    assert (h100.mig_current, h100.mig_pending) == ("disabled", "disabled")
    assert a100.address == "0000:c1:00.0" and a100.architecture == "Ampere"
    assert a100.mig_current is None  # not supported: unknown, not an error
    assert nvml.initialised == 0, "nvmlShutdown after every nvmlInit"


def test_an_unsupported_nvml_value_is_none_not_an_error() -> None:
    gpu = FakeGpu(unsupported={"nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetVirtualizationMode"})
    (info,) = from_nvml(FakeNvml(gpu)).gpus
    assert info.link.current_gen is None and info.virtualization_mode is None
    assert info.link.max_gen == 5


def test_nvml_and_nvidia_smi_read_the_same_gpu(h100_xml) -> None:
    (smi,) = parse_smi_xml(h100_xml).gpus
    (nvml,) = from_nvml(FakeNvml(FakeGpu())).gpus
    # The fake gives no memory_v2 (reserved) and no vGPU licence: those are nvidia-smi's extras here.
    assert replace(smi, memory_reserved_mib=None) == nvml
    assert smi.memory_reserved_mib == 480


def test_nvidia_smi_xml_of_the_h100_guest(h100_xml) -> None:
    gl = parse_smi_xml(h100_xml)
    assert (gl.driver_version, gl.cuda_version) == ("580.159.04", "13.0")
    (gpu,) = gl.gpus
    assert gpu.address == "0000:00:06.0" and gpu.uuid == ZERO_UUID
    assert gpu.link.device_max_gen == 5 and gpu.mig_devices is None


@pytest.mark.parametrize("text", ["", "not xml", "<other/>"])
def test_output_that_is_not_nvidia_smi_xml_is_named(text: str) -> None:
    with pytest.raises(GpuQueryError, match="nvidia-smi -q -x"):
        parse_smi_xml(text)


@pytest.mark.parametrize(
    ("bus_id", "address"),
    [("00000000:41:00.0", "0000:41:00.0"), (b"0000:C1:00.1", "0000:c1:00.1"), ("00010000:e1:00.0", "10000:e1:00.0")],
)
def test_bus_ids_become_gpuprov_addresses(bus_id, address) -> None:
    assert normalize_bus_id(bus_id) == address
    assert normalize_bus_id("garbage") is None


# ---------------------------------------------------------------- driver and GPUs


def test_passthrough_guest_with_nvml_passes(fake) -> None:
    facts, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()))
    assert checks["driver", None].status == "ok"
    assert "580.159.04 (open kernel module)" in checks["driver", None].message
    assert checks["gpus", None].status == "ok" and "from nvml" in checks["gpus", None].message
    assert checks["pcie-link", 0].status == "ok"
    assert checks["vgpu-memory", None].status == "skip"
    summary = build_report(facts, list(checks.values()))["summary"]
    # A staged root has no kernel log to read for Xids and this fake NVML no ECC answers: nothing fails,
    # but the verdict is "incomplete", naming them, not "passed".
    assert summary["fail"] == 0 and summary["passed"] is False and summary["incomplete"] is True
    assert summary["not_run"] == ["ecc", "row-remap", "xid"]


def test_nvml_without_a_driver_falls_back_to_nvidia_smi(fake, h100_xml) -> None:
    facts, checks = verify(guest(fake), nvml=FakeNvml(loaded=False), smi=lambda: h100_xml)
    assert facts.gpu_list.source == "nvidia-smi"
    assert checks["gpus", None].status == "ok"


def test_neither_nvml_nor_nvidia_smi_answers(fake) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(loaded=False), smi=no_smi)
    gpus = checks["gpus", None]
    assert gpus.status == "fail"
    assert "NVML: Driver Not Loaded" in gpus.message and "nvidia-smi is not on the PATH" in gpus.message


def test_driver_and_library_versions_that_differ_fail(fake) -> None:
    _, checks = verify(guest(fake, driver="570.133.20"), nvml=FakeNvml(FakeGpu(), driver="580.159.04"))
    driver = checks["driver", None]
    assert driver.status == "fail" and "570.133.20" in driver.message and "mismatch" in driver.message
    assert "reboot" in driver.fix


def test_no_driver_at_all(fake) -> None:
    # A CI machine: no NVIDIA GPU, no driver, no nvidia-smi.
    facts, checks = verify(fake.root, nvml=FakeNvml(loaded=False), smi=no_smi)
    driver = checks["driver", None]
    assert driver.status == "fail" and driver.message.startswith("no NVIDIA driver")
    assert "no NVIDIA GPU is on this machine's PCI bus" in driver.fix
    assert checks["gpus", None].status == "skip"
    assert checks["container-run", None].status == "skip"
    assert build_report(facts, list(checks.values()))["summary"]["passed"] is False


def test_a_gpu_held_by_nouveau(fake) -> None:
    guest(fake, driver=None, gpu_driver="nouveau")
    fake.write("proc/modules", "nouveau 2961408 0 - Live 0x0\n")
    _, checks = verify(fake.root, nvml=FakeNvml(loaded=False), smi=no_smi)
    driver = checks["driver", None]
    assert driver.status == "fail" and "blacklist nouveau" in driver.fix
    assert "0000:00:06.0" in checks["gpus", None].message


def test_a_gpu_on_the_bus_that_the_driver_does_not_show(fake) -> None:
    guest(fake)
    fake.pci("0000:00:07.0", cls=0x030200, driver="vfio-pci", reset="flr")
    _, checks = verify(fake.root, nvml=FakeNvml(FakeGpu()))
    gpus = checks["gpus", None]
    assert gpus.status == "fail" and "0000:00:07.0 (driver vfio-pci)" in gpus.message
    assert "vfio-pci" in gpus.fix


# ---------------------------------------------------------------- PCIe link


def test_an_idle_downclocked_link_warns_and_asks_for_a_check_under_load(fake) -> None:
    _, checks = verify(guest(fake, link=(2.5, 16, 32.0, 16)), nvml=FakeNvml(FakeGpu(link=(1, 5, 16, 16))))
    link = checks["pcie-link", 0]
    assert link.status == "warn"
    assert "gen1 x16 (2.5 GT/s), max gen5 x16 (32 GT/s)" in link.message and "idle" in link.message
    assert "--bench" in link.fix


def _with_load_sample(fake: FakeHost, sample: dict[str, Any]) -> Check:
    facts, _ = verify(guest(fake, link=(2.5, 16, 32.0, 16)), nvml=FakeNvml(FakeGpu(link=(1, 5, 16, 16))))
    facts.bench_requested, facts.bench_backend = True, "torch"
    facts.bench = [
        BenchResult(0, "NVIDIA H100 80GB HBM3", 0, "torch", 1 << 30, 10, 50.5, 55.0, 8192, "bfloat16", 784.0)
    ]
    facts.bench[0].link_under_load = sample
    return {(c.id, c.gpu): c for c in evaluate(facts)}["pcie-link", 0]


def test_nvml_reads_the_link_again_while_the_bench_runs() -> None:
    nvml = FakeNvml(FakeGpu(link=(4, 5, 16, 16)))
    sample = nvml_link_sampler(nvml)
    assert sample(0) == (4, 16) and nvml.initialised == 0
    assert sample(3) == (None, None) and nvml.initialised == 0
    assert nvml_link_sampler(FakeNvml(loaded=False))(0) == (None, None)


def test_a_link_that_reaches_its_max_under_load_is_ok(fake) -> None:
    link = _with_load_sample(fake, {"current_gen": 5, "current_width": 16, "sysfs_speed": 32.0, "sysfs_width": 16})
    assert link.status == "ok" and "under load" in link.message and "power saving" in link.message


def test_a_link_still_slow_under_load_warns(fake) -> None:
    link = _with_load_sample(fake, {"sysfs_speed": 8.0, "sysfs_width": 16})
    assert link.status == "warn" and "still at gen3" in link.message and "not power saving" in link.message


def test_a_narrow_link_warns_whatever_the_load(fake) -> None:
    _, checks = verify(guest(fake, link=(32.0, 8, 32.0, 16)), nvml=FakeNvml(FakeGpu(link=(5, 5, 8, 16))))
    link = checks["pcie-link", 0]
    assert link.status == "warn" and "x8 of x16" in link.message and "slot" in link.fix


def test_a_gpu_on_a_plain_pci_bus_is_flagged(fake) -> None:
    _, checks = verify(guest(fake, link=None), nvml=FakeNvml(FakeGpu()))
    link = checks["pcie-link", 0]
    assert link.status == "warn" and "plain PCI bus" in link.message
    assert "the GPU reports gen5 x16" in link.message
    assert "pcie-root-port" in link.fix


def test_an_emulated_port_slower_than_the_gpu_says_is_flagged(fake) -> None:
    _, checks = verify(guest(fake, link=(2.5, 1, 32.0, 16)), nvml=FakeNvml(FakeGpu()))
    link = checks["pcie-link", 0]
    assert link.status == "warn" and "2.5 GT/s x1 (max 32 GT/s x16)" in link.message and "x-speed" in link.fix


# ---------------------------------------------------------------- vGPU and MIG


@pytest.mark.parametrize(
    ("name", "mib", "slices"),
    [
        ("GRID A100-4C", 4096, None),
        ("NVIDIA A100-4C", 4096, None),
        ("NVIDIA H100-1-10C", 10240, 1),
        ("NVIDIA A100-1-5CME", 5120, 1),
        ("NVIDIA L40S-48Q", 49152, None),
        ("GRID M60-0B", 512, None),
    ],
)
def test_profile_sizes_from_names(name, mib, slices) -> None:
    profile = parse_profile(name)
    assert profile is not None and (profile.framebuffer_mib, profile.mig_slices) == (mib, slices)


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe", "", None])
def test_names_that_are_no_profile(name) -> None:
    assert parse_profile(name) is None


def test_a_vgpu_that_reports_more_memory_than_its_profile_fails(fake) -> None:
    vgpu = FakeGpu(name="GRID A100-4C", memory_mib=8192, virtualization=2, arch=NVML_DEVICE_ARCH_AMPERE)
    facts, checks = verify(guest(fake), nvml=FakeNvml(vgpu))
    check = checks["vgpu-memory", 0]
    assert check.status == "fail"
    assert "reports 8192 MiB but its profile has 4096 MiB" in check.message and "die" in check.message
    report = build_report(facts, list(checks.values()))
    assert report["gpus"][0]["vgpu"]["profile_framebuffer_mib"] == 4096
    assert report["summary"]["passed"] is False


def test_a_vgpu_within_its_profile_passes(fake) -> None:
    vgpu = FakeGpu(name="NVIDIA H100-1-10C", memory_mib=10240, virtualization=2)
    _, checks = verify(guest(fake), nvml=FakeNvml(vgpu))
    assert checks["vgpu-memory", 0].status == "ok"


def test_a_vgpu_from_nvidia_smi_with_its_license(fake, h100_xml) -> None:
    xml = as_vgpu(h100_xml, "GRID A100-4C", 8192, license="Unlicensed (Restricted)")
    _, checks = verify(guest(fake), nvml=None, smi=lambda: xml)
    assert checks["vgpu-memory", 0].status == "fail"
    lic = checks["vgpu-license", 0]
    assert lic.status == "warn" and "Unlicensed (Restricted)" in lic.message and "gridd.conf" in lic.fix
    licensed = as_vgpu(h100_xml, "GRID A100-4C", 4096, license="Licensed (Expiry: 2027-1-1 0:0:0 GMT)")
    _, checks = verify(guest(fake), nvml=None, smi=lambda: licensed)
    assert checks["vgpu-memory", 0].status == "ok" and checks["vgpu-license", 0].status == "ok"


def test_mig_on_without_mig_devices_warns(fake) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu(mig=(1, 1))))
    mig = checks["mig", 0]
    assert mig.status == "warn" and "no MIG device" in mig.message


def test_a_pending_mig_change_warns(fake) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu(mig=(0, 1))))
    assert checks["mig", 0].status == "warn" and "once the GPU resets" in checks["mig", 0].message
