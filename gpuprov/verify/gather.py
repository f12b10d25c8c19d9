"""What ``gpuprov verify`` reads: the driver, the GPUs it shows, the NVIDIA GPUs on
the PCI bus, the container runtimes' configuration, and (when asked) one GPU
container and the bench. :func:`gather` is the one place that runs anything; the
checks (:mod:`gpuprov.verify.checks`) only read the :class:`VerifyFacts` it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..facts.containers import (
    SYSTEMD_RUNNING,
    CdiSpec,
    ContainerdConfig,
    DockerConfig,
    Toolkit,
    read_cdi_specs,
    read_containerd_config,
    read_docker_config,
    read_toolkit,
)
from ..facts.docker_api import find_engine
from ..facts.driver import DriverInfo, read_driver
from ..facts.gpus import (
    SMI_CAPTURE,
    GpuInfo,
    GpuList,
    GpuQueryError,
    from_nvml,
    nvml_link_sampler,
    parse_smi_xml,
    run_nvidia_smi,
)
from ..facts.guest_toolkit import read_engines
from ..facts.mps import SharingFacts, read_record, read_sharing
from ..facts.multigpu import read_multigpu
from ..facts.pci import PciDevice, read_pci_device, read_pci_devices
from ..facts.sysfs import Sysfs
from ..inputs.sharing import parse_guest
from .bench import BenchResult, P2pResult
from .container import ContainerRun

NVIDIA = 0x10DE
AUTO = "auto"  # import the optional module if it is there
NO_CONTAINER = "not asked to (--no-container)"
BENCH_ROUNDS = 3  # --bench with a container: guest and container alternate this many times


@dataclass
class VerifyFacts:
    root: str
    live: bool
    kernel: str | None
    os_name: str | None
    hypervisor: bool
    driver: DriverInfo
    pci_gpus: dict[str, PciDevice]  # NVIDIA display-class PCI devices under the root
    gpu_list: GpuList | None
    gpu_error: str | None
    docker: DockerConfig
    containerd: ContainerdConfig
    toolkit: Toolkit
    cdi: list[CdiSpec]
    # The service manager and the engines' processes (live roots; a capture has no processes: None).
    systemd: bool = False
    containerd_running: bool | None = None  # a containerd service (not Docker's own) runs
    container: ContainerRun | None = None
    container_skip: str | None = None  # why no container was run
    bench_requested: bool = False
    bench_backend: str | None = None
    bench: list[BenchResult] = field(default_factory=list)
    multigpu: dict[str, Any] | None = None  # the probe (gpuprov.facts.multigpu), None when no GPU is seen
    p2p_bench: list[P2pResult] | None = None  # --bench with two GPUs or more
    bench_rounds: list[list[BenchResult]] = field(default_factory=list)  # the guest's, alternated with a container's
    # GPU sharing (docs/guides/sharing.md): the record guest_sharing keeps, the daemons as they are, the CDI
    # spec's text, and with --bench the tenants measured (gpuprov.verify.sharing_bench).
    sharing_record: dict[str, Any] | None = None
    sharing: SharingFacts | None = None
    sharing_cdi: str | None = None
    sharing_bench: dict[str, Any] | None = None

    @property
    def sharing_mps(self) -> bool:
        """A GPU here is shared by MPS: a container is a tenant, held to its share."""
        gpus = (self.sharing_record or {}).get("gpus")
        return isinstance(gpus, list) and any(isinstance(g, dict) and g.get("sharing") == "mps" for g in gpus)

    @property
    def gpus(self) -> list[GpuInfo]:
        return self.gpu_list.gpus if self.gpu_list else []

    @property
    def gpus_from(self) -> str | None:
        return self.gpu_list.source if self.gpu_list else None


# ---------------------------------------------------------------- gathering


def import_optional(name: str) -> Any:
    try:
        return __import__(name)
    except ImportError:
        return None
    except Exception:  # noqa: BLE001 - a broken optional package counts as absent
        return None


def _host(sysfs: Sysfs) -> tuple[str | None, str | None, bool]:
    version = (sysfs.read("proc/version") or "").split()
    os_name = None
    for line in sysfs.read_lines("etc/os-release"):
        if line.startswith("PRETTY_NAME="):
            os_name = line.split("=", 1)[1].strip().strip('"')
    hypervisor = False
    for line in sysfs.read_lines("proc/cpuinfo"):
        if line.startswith("flags"):
            hypervisor = "hypervisor" in line.split(":", 1)[-1].split()
            break
    return (version[2] if len(version) > 2 else None), os_name, hypervisor


def query_gpus(sysfs: Sysfs, *, nvml: Any, source: str, smi: Any) -> tuple[GpuList | None, str | None]:
    """The GPU list and, when it could not be had, why.

    ``source``: auto, nvml, nvidia-smi. ``nvml`` is the pynvml module or ``None``;
    ``smi`` returns ``nvidia-smi -q -x`` output, or is ``None`` to read the
    capture's ``capture/nvidia-smi-q-x`` under the root instead.
    """
    errors = []
    if source in ("auto", "nvml") and nvml is not None:
        try:
            return from_nvml(nvml), None
        except GpuQueryError as exc:
            errors.append(str(exc))
    if source in ("auto", "nvidia-smi"):
        if smi is None:
            text = sysfs.read(SMI_CAPTURE)
            if text is None:
                errors.append(f"this root has no {SMI_CAPTURE} (captured without the driver, or with --no-commands)")
            else:
                try:
                    return parse_smi_xml(text, source="capture"), None
                except GpuQueryError as exc:
                    errors.append(str(exc))
        else:
            try:
                return parse_smi_xml(smi()), None
            except GpuQueryError as exc:
                errors.append(str(exc))
    return None, "; ".join(errors) or "no way to ask the driver (no pynvml, no nvidia-smi)"


def _link_sampler(sysfs: Sysfs, facts: VerifyFacts, nvml: Any) -> Any:
    """index -> the link as seen right now, from NVML and from sysfs."""
    by_index = {g.index: g for g in facts.gpus}
    nvml_sample = nvml_link_sampler(nvml) if nvml is not None and facts.gpus_from == "nvml" else None

    def sample(index: int) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        if nvml_sample is not None:
            seen["current_gen"], seen["current_width"] = nvml_sample(index)
        gpu = by_index.get(index)
        if gpu is not None and gpu.address in facts.pci_gpus:
            link = read_pci_device(sysfs, gpu.address).link
            if link.known:
                seen["sysfs_speed"], seen["sysfs_width"] = link.current_speed, link.current_width
        return seen

    return sample


def _gather_sharing(sysfs: Sysfs, facts: VerifyFacts) -> None:
    """The sharing record and what it names; a record whose declaration does not validate is not used."""
    record = read_record(sysfs)
    if record is None:
        return
    decl, problems = parse_guest(record.get("declaration"), "the record's declaration")
    if decl is None or problems:
        facts.sharing_record = {"gpus": [], "error": "; ".join(r.describe() for r in problems)[:500]}
        return
    facts.sharing_record = record
    facts.sharing = read_sharing(sysfs, decl.mps_root, [g.name for g in decl.gpus], gpus=facts.live)
    cdi = record.get("cdi_output")
    if isinstance(cdi, str) and cdi.startswith("/") and ".." not in cdi and len(cdi) < 256:
        facts.sharing_cdi = sysfs.read_text(cdi.lstrip("/"))


def gather(
    sysfs: Sysfs,
    *,
    nvml: Any = AUTO,
    gpu_source: str = "auto",
    smi: Any = None,
    engine: Any = AUTO,
    run_container: bool = True,
    image: str | None = None,
    bench: bool = False,
    bench_backend: Any = AUTO,
    no_container_reason: str = NO_CONTAINER,
) -> VerifyFacts:
    """Read everything the checks need. Read-only, except that it may start one
    container (removed afterwards) and, with ``bench``, use the GPU for a few seconds.

    Optional modules are passed in (``nvml``, ``bench_backend`` as ``(name, module)``)
    and so is the Docker ``engine`` (:class:`gpuprov.facts.docker_api.DockerEngine`);
    ``"auto"`` imports them or finds the engine's socket when they are there, ``None``
    does without; on a root other than ``/`` nothing is imported or run unless
    passed in. ``smi`` returns ``nvidia-smi -q -x`` output (default: run it on
    the live machine, read ``capture/nvidia-smi-q-x`` under any other root).
    ``no_container_reason`` is what the report says when ``run_container`` is false.
    """
    live = sysfs.live
    if nvml == AUTO:
        nvml = import_optional("pynvml") if live and gpu_source != "nvidia-smi" else None
    kernel, os_name, hypervisor = _host(sysfs)
    if smi is None and live:
        smi = run_nvidia_smi
    gpu_list, gpu_error = query_gpus(sysfs, nvml=nvml, source=gpu_source, smi=smi)
    pci_gpus = {a: d for a, d in read_pci_devices(sysfs).items() if d.vendor_id == NVIDIA and d.base_class == 0x03}
    facts = VerifyFacts(
        root=sysfs.root,
        live=live,
        kernel=kernel,
        os_name=os_name,
        hypervisor=hypervisor,
        driver=read_driver(sysfs),
        pci_gpus=pci_gpus,
        gpu_list=gpu_list,
        gpu_error=gpu_error,
        docker=read_docker_config(sysfs),
        containerd=read_containerd_config(sysfs),
        toolkit=read_toolkit(sysfs),
        cdi=read_cdi_specs(sysfs),
        bench_requested=bench,
        systemd=sysfs.exists(SYSTEMD_RUNNING),
    )
    if live:
        facts.containerd_running = read_engines(sysfs, facts.docker, facts.containerd)["containerd"].started is not None

    _gather_sharing(sysfs, facts)
    if facts.gpus:
        facts.multigpu = read_multigpu(sysfs, facts.gpus, nvml=nvml if facts.gpus_from == "nvml" else None)

    if not run_container:
        facts.container_skip = no_container_reason
    elif not live and engine == AUTO:
        facts.container_skip = "reading a captured root: no container is run"
    elif not facts.gpus:
        facts.container_skip = "no GPU seen here, so none to hand to a container"
    else:
        if engine == AUTO:
            engine = find_engine(sysfs.root)
        if engine is None:
            facts.container_skip = "no container runtime: no Docker engine socket (/var/run/docker.sock)"
        else:
            from .container import run_gpu_container

            facts.container = run_gpu_container(engine, image)
            facts.docker.engine_runtimes = facts.container.engine_runtimes

    if bench and facts.gpus:
        from .bench import load_backend, run_bench, run_p2p_bench

        backend = (load_backend() if live else None) if bench_backend == AUTO else bench_backend
        if backend is not None:
            facts.bench_backend = backend[0]
            facts.bench = run_bench(backend, facts.gpus, sample_link=_link_sampler(sysfs, facts, nvml))
            if len(facts.gpus) > 1:
                facts.p2p_bench = run_p2p_bench(backend, facts.gpus)
            if facts.container is not None and facts.container.status == "ok" and not facts.sharing_mps:
                # The same bench inside a container: near bare-metal means the same figures. One copy varies
                # by 10-20% from run to run on a guest (2x H100: 48.0, 48.7, 54.4 GB/s), so the two alternate,
                # BENCH_ROUNDS each, and the medians are compared.
                from .container import run_bench_container

                facts.bench_rounds = [facts.bench]
                for round_ in range(BENCH_ROUNDS):
                    if round_:
                        facts.bench_rounds.append(run_bench(backend, facts.gpus))
                    if not run_bench_container(engine, facts.container, backend):
                        break
            if facts.sharing_mps and facts.container is not None and facts.container.status == "ok":
                _bench_sharing(facts, engine, backend)
    return facts


def _bench_sharing(facts: VerifyFacts, engine: Any, backend: Any) -> None:
    """Each MPS GPU's tenants measured in containers, against the guest's own matmul on that GPU."""
    import os

    from .sharing_bench import measure_declared

    site = os.path.dirname(os.path.dirname(os.path.abspath(backend[1].__file__)))
    whole = {(r.uuid or "").lower().removeprefix("gpu-"): r.matmul_tflops for r in facts.bench if not r.error}
    facts.sharing_bench = {}
    for entry in (facts.sharing_record or {}).get("gpus") or []:
        if isinstance(entry, dict) and entry.get("sharing") == "mps":
            uuid = str(entry.get("uuid") or "").lower().removeprefix("gpu-")
            image = facts.container.image if facts.container is not None else None
            facts.sharing_bench[str(entry.get("name"))] = measure_declared(
                engine, image or "", site, entry, whole.get(uuid)
            )
