"""What the checks of ``gpuprov verify`` share: the :class:`Check` result, the fixes
more than one area names, and the GPU's PCIe link as the checks and the bench see it."""

from __future__ import annotations

from dataclasses import dataclass

from ..facts.gpus import GpuInfo
from ..facts.pci import PciLink
from .bench import PCIE_GTS, pcie_gen
from .gather import VerifyFacts

STATUSES = ("ok", "warn", "fail", "skip")
INSTALL_DRIVER = (
    "install the NVIDIA driver (role guest_nvidia_driver, or the distribution's nvidia-driver package), "
    "then `modprobe nvidia`"
)
INSTALL_TOOLKIT = "install nvidia-container-toolkit-base (role guest_container_toolkit), then "


@dataclass
class Check:
    id: str
    status: str  # ok, warn, fail, skip
    message: str
    fix: str | None = None
    gpu: int | None = None  # the GPU's index, for per-GPU checks


def gen_text(gen: int | None, width: int | None) -> str:
    g = "gen?" if gen is None else f"gen{gen}"
    rate = "" if gen not in PCIE_GTS else f" ({PCIE_GTS[gen]:g} GT/s)"
    w = "" if width is None else f" x{width}"
    return f"{g}{rate}{w}" if width is None else f"{g}{w}{rate}"


def link_view(gpu: GpuInfo, pci: PciLink | None) -> dict[str, int | None]:
    """Current/max generation and width: the GPU's own report first (in a guest it
    is the physical link), sysfs where the GPU says nothing."""
    sys_ = pci or PciLink()
    return {
        "current_gen": gpu.link.current_gen or pcie_gen(sys_.current_speed),
        "max_gen": gpu.link.max_gen or pcie_gen(sys_.max_speed),
        "current_width": gpu.link.current_width or sys_.current_width,
        "max_width": gpu.link.max_width or sys_.max_width,
    }


def pci_link(facts: VerifyFacts, gpu: GpuInfo) -> PciLink | None:
    dev = facts.pci_gpus.get(gpu.address or "")
    return None if dev is None else dev.link
