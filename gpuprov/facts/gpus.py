"""The GPUs the NVIDIA driver shows: through NVML (the ``pynvml`` module of the
nvidia-ml-py package) when it is importable, else from ``nvidia-smi -q -x``.

Both give the same :class:`GpuInfo`. NVML is passed in as a module object
(``nvml=``), so tests hand in a fake one; the XML parser takes the text, so
tests feed it captured output (``capture/nvidia-smi-q-x`` in a capture).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

SMI_CAPTURE = "capture/nvidia-smi-q-x"

# NVML_GPU_VIRTUALIZATION_MODE_* and nvidia-smi's words for them.
VIRT_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host-vgpu", 4: "host-vsga"}
_SMI_VIRT = {
    "none": "none",
    "pass-through": "passthrough",
    "passthrough": "passthrough",
    "vgpu": "vgpu",
    "host vgpu": "host-vgpu",
    "host vsga": "host-vsga",
}


class GpuQueryError(RuntimeError):
    """The driver could not be asked (NVML or nvidia-smi failed); the message says why."""


@dataclass
class GpuLinkInfo:
    """The PCIe link as the GPU reports it (NVML / nvidia-smi), by generation."""

    current_gen: int | None = None
    max_gen: int | None = None  # what GPU and host both support
    device_max_gen: int | None = None  # the GPU's own maximum
    current_width: int | None = None
    max_width: int | None = None


@dataclass
class GpuInfo:
    index: int
    name: str | None
    uuid: str | None
    address: str | None  # 0000:41:00.0, as gpuprov names PCI devices
    memory_total_mib: int | None
    memory_reserved_mib: int | None = None
    architecture: str | None = None
    mig_current: str | None = None  # "enabled" / "disabled"; None where not supported
    mig_pending: str | None = None
    mig_devices: int | None = None
    virtualization_mode: str | None = None  # none, passthrough, vgpu, host-vgpu, host-vsga
    vgpu_license: str | None = None  # a vGPU guest's license status, when shown
    vgpu_product: str | None = None  # the licensed product (e.g. NVIDIA Virtual Compute Server)
    link: GpuLinkInfo = field(default_factory=GpuLinkInfo)


@dataclass
class GpuList:
    source: str  # "nvml", "nvidia-smi", "capture"
    driver_version: str | None
    cuda_version: str | None
    gpus: list[GpuInfo]


def normalize_bus_id(bus_id: str | bytes | None) -> str | None:
    """``0000:41:00.0`` from NVML's/nvidia-smi's ``00000000:41:00.0``."""
    if bus_id is None:
        return None
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    m = re.fullmatch(r"\s*([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\s*", bus_id)
    if not m:
        return None
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    value = str(value).strip()
    return value or None


# ---------------------------------------------------------------- NVML


def nvml_asker(nvml: Any, tolerated: tuple[type[BaseException], ...] = ()) -> Any:
    """``ask(name, *args)``: NVML's function ``name`` called, or None where the binding lacks it or
    it fails (NVMLError, and the ``tolerated`` exceptions): a value NVML does not give is unknown."""
    errors = (getattr(nvml, "NVMLError", Exception), *tolerated)

    def ask(fn: str, *args: Any) -> Any:
        func = getattr(nvml, fn, None)
        if func is None:
            return None
        try:
            return func(*args)
        except errors:
            return None

    return ask


def from_nvml(nvml: Any) -> GpuList:
    """Ask NVML. ``nvml`` is the ``pynvml`` module (or a fake with its names).

    Raises :class:`GpuQueryError` when NVML cannot start (no driver, no
    library, a driver/library version mismatch). A value one GPU does not
    support is ``None``.
    """
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as exc:
        raise GpuQueryError(f"NVML: {exc}") from None
    try:
        ask = nvml_asker(nvml)
        driver = _text(ask("nvmlSystemGetDriverVersion"))
        cuda = ask("nvmlSystemGetCudaDriverVersion")
        cuda_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) and cuda > 0 else None
        try:
            count = nvml.nvmlDeviceGetCount()
        except error as exc:
            raise GpuQueryError(f"NVML: {exc}") from None
        gpus = []
        for i in range(count):
            try:
                h = nvml.nvmlDeviceGetHandleByIndex(i)
            except error as exc:
                raise GpuQueryError(f"NVML: GPU {i}: {exc}") from None
            mem = ask("nvmlDeviceGetMemoryInfo", h)
            mem_v2 = None
            if hasattr(nvml, "nvmlMemory_v2"):
                mem_v2 = ask("nvmlDeviceGetMemoryInfo", h, nvml.nvmlMemory_v2)
            pci = ask("nvmlDeviceGetPciInfo", h)
            mig = ask("nvmlDeviceGetMigMode", h)
            virt = ask("nvmlDeviceGetVirtualizationMode", h)
            mig_count = None
            if mig and mig[0] == 1:
                mig_count = 0
                for j in range(ask("nvmlDeviceGetMaxMigDeviceCount", h) or 0):
                    if ask("nvmlDeviceGetMigDeviceHandleByIndex", h, j) is not None:
                        mig_count += 1
            gpus.append(
                GpuInfo(
                    index=i,
                    name=_text(ask("nvmlDeviceGetName", h)),
                    uuid=_text(ask("nvmlDeviceGetUUID", h)),
                    address=normalize_bus_id(getattr(pci, "busId", None)),
                    memory_total_mib=None if mem is None else int(mem.total) // (1 << 20),
                    memory_reserved_mib=(
                        int(mem_v2.reserved) // (1 << 20) if getattr(mem_v2, "reserved", None) is not None else None
                    ),
                    architecture=_nvml_arch(nvml, ask("nvmlDeviceGetArchitecture", h)),
                    mig_current=None if not mig else ("enabled" if mig[0] == 1 else "disabled"),
                    mig_pending=None if not mig else ("enabled" if mig[1] == 1 else "disabled"),
                    mig_devices=mig_count,
                    virtualization_mode=VIRT_MODES.get(virt) if isinstance(virt, int) else None,
                    link=GpuLinkInfo(
                        current_gen=ask("nvmlDeviceGetCurrPcieLinkGeneration", h),
                        max_gen=ask("nvmlDeviceGetMaxPcieLinkGeneration", h),
                        device_max_gen=ask("nvmlDeviceGetGpuMaxPcieLinkGeneration", h),
                        current_width=ask("nvmlDeviceGetCurrPcieLinkWidth", h),
                        max_width=ask("nvmlDeviceGetMaxPcieLinkWidth", h),
                    ),
                )
            )
        return GpuList(source="nvml", driver_version=driver, cuda_version=cuda_version, gpus=gpus)
    finally:
        try:
            nvml.nvmlShutdown()
        except error:
            pass


def _nvml_arch(nvml: Any, value: Any) -> str | None:
    if not isinstance(value, int):
        return None
    for name in dir(nvml):
        if name.startswith("NVML_DEVICE_ARCH_") and getattr(nvml, name) == value and name != "NVML_DEVICE_ARCH_T":
            word = name[len("NVML_DEVICE_ARCH_") :]
            return None if word == "UNKNOWN" else word.capitalize()
    return None


def nvml_link_sampler(nvml: Any) -> Any:
    """A function ``index -> (current_gen, current_width)`` that asks NVML, for
    reading the link while the bench keeps the GPU busy (``None, None`` when NVML cannot say)."""
    error = getattr(nvml, "NVMLError", Exception)

    def sample(index: int) -> tuple[int | None, int | None]:
        try:
            nvml.nvmlInit()
        except error:
            return None, None
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            return nvml.nvmlDeviceGetCurrPcieLinkGeneration(h), nvml.nvmlDeviceGetCurrPcieLinkWidth(h)
        except error:
            return None, None
        finally:
            try:
                nvml.nvmlShutdown()
            except error:
                pass

    return sample


# ---------------------------------------------------------------- nvidia-smi


def _int_prefix(text: str | None) -> int | None:
    """``81559`` from ``81559 MiB``, ``16`` from ``16x``; ``None`` for N/A."""
    if text is None:
        return None
    m = re.match(r"\s*(\d+)", text)
    return int(m.group(1)) if m else None


def _mode(text: str | None) -> str | None:
    value = (text or "").strip().lower()
    return value if value in ("enabled", "disabled") else None


# Every element parse_smi_xml reads, under <nvidia_smi_log> and under each <gpu>: gpuprov
# capture keeps only these (tests/cli/test_capture_privacy.py checks that parsing what it keeps
# gives what parsing all gives).
SMI_LOG_FIELDS = ("driver_version", "cuda_version")
SMI_GPU_FIELDS = (
    "product_name",
    "product_architecture",
    "uuid",
    "pci/pci_bus_id",
    "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
    "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
    "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen",
    "pci/pci_gpu_link_info/link_widths/current_link_width",
    "pci/pci_gpu_link_info/link_widths/max_link_width",
    "fb_memory_usage/total",
    "fb_memory_usage/reserved",
    "mig_mode/current_mig",
    "mig_mode/pending_mig",
    "mig_devices",
    "mig_devices/mig_device",
    "gpu_virtualization_mode/virtualization_mode",
    "vgpu_software_licensed_product/license_status",
    "vgpu_software_licensed_product/licensed_product_name",
)


def parse_smi_xml(text: str, source: str = "nvidia-smi") -> GpuList:
    """Parse ``nvidia-smi -q -x``. Raises :class:`GpuQueryError` on text that is not its XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise GpuQueryError(f"nvidia-smi -q -x printed something that is not XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise GpuQueryError(f"nvidia-smi -q -x: expected <nvidia_smi_log>, got <{root.tag}>")

    def val(node: ET.Element | None, path: str) -> str | None:
        if node is None:
            return None
        found = node.find(path)
        value = None if found is None or found.text is None else found.text.strip()
        return None if value in (None, "", "N/A", "Not Supported", "Unknown Error") else value

    gpus = []
    for i, gpu in enumerate(root.findall("gpu")):
        link = gpu.find("pci/pci_gpu_link_info")
        virt = (val(gpu, "gpu_virtualization_mode/virtualization_mode") or "").lower()
        mig_current = _mode(val(gpu, "mig_mode/current_mig"))
        mig_devices = gpu.find("mig_devices")
        mig_count = None  # as NVML: counted only while MIG is on
        if mig_current == "enabled" and mig_devices is not None:
            mig_count = len(mig_devices.findall("mig_device"))
        gpus.append(
            GpuInfo(
                index=i,
                name=val(gpu, "product_name"),
                uuid=val(gpu, "uuid"),
                address=normalize_bus_id(val(gpu, "pci/pci_bus_id") or gpu.get("id")),
                memory_total_mib=_int_prefix(val(gpu, "fb_memory_usage/total")),
                memory_reserved_mib=_int_prefix(val(gpu, "fb_memory_usage/reserved")),
                architecture=val(gpu, "product_architecture"),
                mig_current=mig_current,
                mig_pending=_mode(val(gpu, "mig_mode/pending_mig")),
                mig_devices=mig_count,
                virtualization_mode=_SMI_VIRT.get(virt) if virt else None,
                vgpu_license=val(gpu, "vgpu_software_licensed_product/license_status"),
                vgpu_product=val(gpu, "vgpu_software_licensed_product/licensed_product_name"),
                link=GpuLinkInfo(
                    current_gen=_int_prefix(val(link, "pcie_gen/current_link_gen")),
                    max_gen=_int_prefix(val(link, "pcie_gen/max_link_gen")),
                    device_max_gen=_int_prefix(val(link, "pcie_gen/max_device_link_gen")),
                    current_width=_int_prefix(val(link, "link_widths/current_link_width")),
                    max_width=_int_prefix(val(link, "link_widths/max_link_width")),
                ),
            )
        )
    return GpuList(
        source=source,
        driver_version=val(root, "driver_version"),
        cuda_version=val(root, "cuda_version"),
        gpus=gpus,
    )


def run_nvidia_smi(timeout: float = 60) -> str:
    """``nvidia-smi -q -x`` on this machine; :class:`GpuQueryError` with its message when it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise GpuQueryError("nvidia-smi is not on the PATH (it comes with the NVIDIA driver's utilities)")
    try:
        proc = subprocess.run([exe, "-q", "-x"], capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise GpuQueryError(f"nvidia-smi -q -x did not answer within {timeout:g} s (a hung GPU or driver)") from None
    except OSError as exc:
        raise GpuQueryError(f"nvidia-smi could not run: {exc}") from None
    if proc.returncode != 0:
        said = (proc.stdout.strip() or proc.stderr.strip() or f"exit status {proc.returncode}").splitlines()[0]
        raise GpuQueryError(f"nvidia-smi failed: {said}")
    return proc.stdout
