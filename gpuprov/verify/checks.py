"""``gpuprov verify``: does the GPU work here? Runs inside a guest, or on any
GPU machine, and checks, each with ok/warn/fail/skip and a fix:

- the NVIDIA driver is loaded, and its version;
- the GPUs it shows (NVML through pynvml when importable, else ``nvidia-smi -q -x``),
  each matched with the PCI device the kernel lists;
- each GPU's PCIe link, current vs max (a plain PCI bus and a downgraded link are flagged);
- a vGPU's framebuffer vs its profile (a vGPU that reports more than it has kills jobs);
- MIG state, when MIG is on;
- Docker's and containerd's NVIDIA runtime, CDI specs vs the GPUs seen;
- with a Docker engine: a container that asks for every GPU (CDI first) runs ``nvidia-smi -L``,
  each GPU's UUID against the container's; with ``--bench`` the same bench inside it;
- per pair of GPUs, peer access (NVML); per GPU its NVLink links, NUMA node against this
  process's CPUs, BAR1 mapped in full; health: Xid events, ECC errors, remapped rows or
  retired pages, clock event reasons (:mod:`.checks_multigpu`);
- ``--bench``: pinned host<->device bandwidth and a bf16 matmul (torch or cupy),
  as fractions of the link's and the GPU's peak, and each GPU-to-GPU copy against the
  NVLink or PCIe peak between them.

:func:`gpuprov.verify.gather.gather` reads the facts; :func:`evaluate` is a pure
function from facts to checks (by area: :mod:`.checks_gpu`, :mod:`.checks_containers`,
:mod:`.checks_bench`); :mod:`gpuprov.report.verify` makes the report (schema
``gpuprov.verify/v1``, docs/reference/verify-json.md) and :mod:`gpuprov.cli.verify` prints it.
"""

from __future__ import annotations

from .base import Check
from .checks_bench import check_bench, check_container_bench
from .checks_containers import check_cdi, check_container, check_containerd, check_docker
from .checks_gpu import check_driver, check_gpus, check_link, check_mig, check_vgpu, check_vgpu_license
from .checks_multigpu import judge_multigpu, multigpu_probe
from .checks_sharing import check_sharing
from .gather import VerifyFacts


def evaluate(facts: VerifyFacts) -> list[Check]:
    """Every check, in a stable order. Pure: reads only ``facts``."""
    checks = [check_driver(facts), check_gpus(facts)]
    for gpu in facts.gpus:
        checks.append(check_link(facts, gpu))
    for gpu in facts.gpus:
        mig = check_mig(gpu)
        if mig:
            checks.append(mig)
    vgpus = [g for g in facts.gpus if g.virtualization_mode == "vgpu"]
    for gpu in vgpus:
        checks.append(check_vgpu(gpu))
        lic = check_vgpu_license(gpu)
        if lic:
            checks.append(lic)
    if not vgpus:
        modes = ", ".join(f"GPU {g.index}: {g.virtualization_mode or 'unknown'}" for g in facts.gpus)
        checks.append(Check("vgpu-memory", "skip", f"no vGPU here ({modes or 'no GPU seen'})"))
    checks += [check_docker(facts), check_containerd(facts), check_cdi(facts), check_container(facts)]
    checks += check_bench(facts)
    checks += check_container_bench(facts)
    checks += check_sharing(facts)
    checks += judge_multigpu(multigpu_probe(facts), bench_requested=facts.bench_requested)
    return checks
