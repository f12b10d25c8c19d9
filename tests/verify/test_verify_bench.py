"""gpuprov verify --bench: the peaks it compares with and the checks it makes
from measured figures (the measuring itself runs on a GPU machine: see
test_verify.py's live fixture)."""

from __future__ import annotations

import pytest

from gpuprov.facts.gpus import GpuInfo
from gpuprov.verify.bench import BenchResult, _match, gpu_peak, pcie_gen, pcie_peak_gbps
from gpuprov.verify.checks import evaluate
from gpuprov.verify.checks_bench import bench_figures
from tests.verify.test_verify_nvml import FakeGpu, FakeNvml, guest, verify


@pytest.mark.parametrize(
    ("gen", "width", "gbps"),
    [(1, 1, 0.25), (2, 16, 8.0), (3, 16, 15.75), (4, 16, 31.51), (5, 16, 63.02), (6, 16, 121.0), (5, 8, 31.51)],
)
def test_pcie_peaks(gen, width, gbps) -> None:
    assert pcie_peak_gbps(gen, width) == pytest.approx(gbps, abs=0.01)


def test_pcie_peak_unknown() -> None:
    assert pcie_peak_gbps(None, 16) is None and pcie_peak_gbps(5, None) is None and pcie_peak_gbps(7, 16) is None
    assert pcie_gen(32.0) == 5 and pcie_gen(2.5) == 1 and pcie_gen(3.0) is None and pcie_gen(None) is None


@pytest.mark.parametrize(
    ("name", "label", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756),
        ("NVIDIA H100 NVL", "H100 NVL", 835),
        ("NVIDIA H200", "H200 SXM", 989),
        ("NVIDIA A100-SXM4-80GB", "A100", 312),
        ("NVIDIA A100 80GB PCIe", "A100", 312),
        ("NVIDIA L40S", "L40S", 362),
        ("NVIDIA L4", "L4", 121),
        ("GRID A100-4C", "A100", 312),
    ],
)
def test_gpu_peaks(name, label, tflops) -> None:
    assert gpu_peak(name) == (label, tflops)


def test_unknown_gpu_has_no_peak() -> None:
    assert gpu_peak("NVIDIA GeForce RTX 4090") is None and gpu_peak(None) is None


def bench_checks(fake, result: BenchResult, gpu: FakeGpu | None = None) -> dict:
    facts, _ = verify(guest(fake), nvml=FakeNvml(gpu or FakeGpu()))
    facts.bench_requested, facts.bench_backend, facts.bench = True, result.backend, [result]
    return {(c.id, c.gpu): c for c in evaluate(facts)}, facts


def probe_like(**changes) -> BenchResult:
    """The figures measured on a real H100 passthrough guest (tests/fixtures/outputs/*.probe.json)."""
    r = BenchResult(0, "NVIDIA H100 80GB HBM3", 0, "torch", 1 << 30, 10, 50.5, 55.0, 8192, "bfloat16", 784.0)
    for k, v in changes.items():
        setattr(r, k, v)
    return r


def test_h100_guest_figures_are_ok(fake) -> None:
    checks, facts = bench_checks(fake, probe_like())
    assert checks["bench-h2d", 0].status == "ok" and "50.5 GB/s host->device, 80% of PCIe gen5 x16" in (
        checks["bench-h2d", 0].message
    )
    assert checks["bench-d2h", 0].status == "ok" and "87%" in checks["bench-d2h", 0].message
    m = checks["bench-matmul", 0]
    assert m.status == "ok" and "784 TFLOP/s bfloat16 matmul (8192^3), 79% of the H100 SXM's 989 dense" in m.message
    f = bench_figures(facts, facts.bench[0])
    assert f["link_peak_gbps"] == 63.02 and f["h2d_fraction"] == 0.801 and f["matmul_fraction"] == 0.793


def test_slow_copies_and_a_slow_matmul_warn(fake) -> None:
    checks, _ = bench_checks(fake, probe_like(h2d_gbps=20.0, matmul_tflops=300.0))
    assert checks["bench-h2d", 0].status == "warn" and "only 32%" in checks["bench-h2d", 0].message
    assert "iommu=pt" in checks["bench-h2d", 0].fix
    assert checks["bench-d2h", 0].status == "ok"
    assert checks["bench-matmul", 0].status == "warn" and "only 30%" in checks["bench-matmul", 0].message


def test_an_unknown_gpu_gets_its_number_without_a_fraction(fake) -> None:
    checks, _ = bench_checks(fake, probe_like(name="NVIDIA GeForce RTX 4090"), FakeGpu(name="NVIDIA GeForce RTX 4090"))
    m = checks["bench-matmul", 0]
    assert m.status == "ok" and "no peak on file for NVIDIA GeForce RTX 4090" in m.message


def test_a_mig_backed_vgpu_is_not_compared_with_the_whole_gpu(fake) -> None:
    vgpu = FakeGpu(name="NVIDIA H100-1-10C", memory_mib=10240, virtualization=2)
    checks, _ = bench_checks(fake, probe_like(name="NVIDIA H100-1-10C", matmul_tflops=120.0), vgpu)
    assert checks["bench-matmul", 0].status == "ok" and "no peak on file" in checks["bench-matmul", 0].message


def test_a_failed_bench_fails(fake) -> None:
    checks, _ = bench_checks(fake, probe_like(error="RuntimeError: CUDA error: out of memory"))
    assert checks["bench", 0].status == "fail" and "out of memory" in checks["bench", 0].message


def test_no_torch_or_cupy_is_a_skip(fake) -> None:
    facts, _ = verify(guest(fake), nvml=FakeNvml(FakeGpu()), bench=True, bench_backend=None)
    (check,) = [c for c in evaluate(facts) if c.id == "bench"]
    assert check.status == "skip" and "torch or cupy" in check.message


def test_cuda_devices_are_matched_to_gpus_by_uuid_then_address(monkeypatch) -> None:
    gpus = [
        GpuInfo(0, "A", "GPU-aaaaaaaa-0000-0000-0000-000000000000", "0000:41:00.0", 1),
        GpuInfo(1, "B", "GPU-bbbbbbbb-0000-0000-0000-000000000000", "0000:c1:00.0", 1),
    ]
    assert _match(gpus, "BBBBBBBB-0000-0000-0000-000000000000", None, 0) is gpus[1]
    assert _match(gpus, None, "0000:41:00.0", 1) is gpus[0]
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert _match(gpus, None, None, 1) is None  # CUDA's default order is not NVML's
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert _match(gpus, None, None, 1) is gpus[1]
