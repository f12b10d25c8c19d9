"""``gpuprov verify``: does the GPU work here? Runs inside a guest, or on any
GPU machine, and checks, each with ok/warn/fail/skip and a fix:

- the NVIDIA driver is loaded, and its version;
- the GPUs it shows (NVML through pynvml when importable, else ``nvidia-smi -q -x``),
  each matched with the PCI device the kernel lists;
- each GPU's PCIe link, current vs max (a plain PCI bus and a downgraded link are flagged);
- a vGPU's framebuffer vs its profile (a vGPU that reports more than it has kills jobs);
- MIG state, when MIG is on;
- Docker's and containerd's NVIDIA runtime, CDI specs vs the GPUs seen;
- with the docker SDK and an engine: a container that asks for the GPU runs ``nvidia-smi -L``;
- ``--bench``: pinned host<->device bandwidth and a bf16 matmul (torch or cupy),
  as fractions of the link's and the GPU's peak.

The report is plain data (schema ``gpuprov.verify/v1``, docs/reference/verify-json.md);
:func:`evaluate` is a pure function from facts to checks. Exit 0 when no
check fails, 1 when one does, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import __version__
from ..facts.containers import (
    CONFIGURE_CONTAINERD,
    CONFIGURE_DOCKER,
    GENERATE_CDI,
    CdiSpec,
    ContainerdConfig,
    ContainerRun,
    DockerConfig,
    Toolkit,
    read_cdi_specs,
    read_containerd_config,
    read_docker_config,
    read_toolkit,
)
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
from ..facts.pci import PciDevice, PciLink, read_pci_device, read_pci_devices
from ..facts.sysfs import Sysfs
from ..facts.vgpu_profile import parse_profile
from .bench import (
    COPY_OK_FRACTION,
    MATMUL_OK_FRACTION,
    PCIE_GTS,
    BenchResult,
    gpu_peak,
    pcie_gen,
    pcie_peak_gbps,
)

SCHEMA = "gpuprov.verify/v1"
SCHEMA_VERSION = 1
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
STATUSES = ("ok", "warn", "fail", "skip")
NVIDIA = 0x10DE
INSTALL_DRIVER = (
    "install the NVIDIA driver (role guest_nvidia_driver, or the distribution's nvidia-driver package), "
    "then `modprobe nvidia`"
)
INSTALL_TOOLKIT = "install nvidia-container-toolkit (role guest_container_toolkit), then "
PCIE_ROOT_PORT = (
    "give the VM a q35 machine with a pcie-root-port per GPU and put the GPU's hostdev on that port's bus "
    "(libvirt: <controller type='pci' model='pcie-root-port'/>)"
)

_AUTO = "auto"  # import the optional module if it is there


@dataclass
class Check:
    id: str
    status: str  # ok, warn, fail, skip
    message: str
    fix: str | None = None
    gpu: int | None = None  # the GPU's index, for per-GPU checks


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
    container: ContainerRun | None = None
    container_skip: str | None = None  # why no container was run
    bench_requested: bool = False
    bench_backend: str | None = None
    bench: list[BenchResult] = field(default_factory=list)

    @property
    def gpus(self) -> list[GpuInfo]:
        return self.gpu_list.gpus if self.gpu_list else []

    @property
    def gpus_from(self) -> str | None:
        return self.gpu_list.source if self.gpu_list else None


# ---------------------------------------------------------------- gathering


def _import(name: str) -> Any:
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


def gather(
    sysfs: Sysfs,
    *,
    nvml: Any = _AUTO,
    gpu_source: str = "auto",
    smi: Any = None,
    docker: Any = _AUTO,
    run_container: bool = True,
    image: str | None = None,
    bench: bool = False,
    bench_backend: Any = _AUTO,
) -> VerifyFacts:
    """Read everything the checks need. Read-only, except that it may start one
    container (removed afterwards) and, with ``bench``, use the GPU for a few seconds.

    Optional modules are passed in (``nvml``, ``docker``, ``bench_backend`` as
    ``(name, module)``); ``"auto"`` imports them when they are there, ``None``
    does without; on a root other than ``/`` nothing is imported or run unless
    passed in. ``smi`` returns ``nvidia-smi -q -x`` output (default: run it on
    the live machine, read ``capture/nvidia-smi-q-x`` under any other root).
    """
    live = sysfs.live
    if nvml == _AUTO:
        nvml = _import("pynvml") if live and gpu_source != "nvidia-smi" else None
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
    )

    if not run_container:
        facts.container_skip = "not asked to (--no-container)"
    elif not live and docker == _AUTO:
        facts.container_skip = "reading a captured root: no container is run"
    elif not facts.gpus:
        facts.container_skip = "no GPU seen here, so none to hand to a container"
    else:
        if docker == _AUTO:
            docker = _import("docker")
        if docker is None or not hasattr(docker, "from_env"):
            if sysfs.exists("var/run/docker.sock") or sysfs.exists("run/docker.sock"):
                facts.container_skip = (
                    "a Docker engine socket is here but the docker Python package is not: pip install docker"
                )
            else:
                facts.container_skip = "no container runtime: no Docker engine socket, no docker Python package"
        else:
            from ..facts.containers import run_gpu_container

            facts.container = run_gpu_container(docker, image)
            facts.docker.engine_runtimes = facts.container.engine_runtimes

    if bench and facts.gpus:
        from .bench import load_backend, run_bench

        backend = (load_backend() if live else None) if bench_backend == _AUTO else bench_backend
        if backend is not None:
            facts.bench_backend = backend[0]
            facts.bench = run_bench(backend, facts.gpus, sample_link=_link_sampler(sysfs, facts, nvml))
    return facts


# ---------------------------------------------------------------- checks


def _gen_text(gen: int | None, width: int | None) -> str:
    g = "gen?" if gen is None else f"gen{gen}"
    rate = "" if gen not in PCIE_GTS else f" ({PCIE_GTS[gen]:g} GT/s)"
    w = "" if width is None else f" x{width}"
    return f"{g}{rate}{w}" if width is None else f"{g}{w}{rate}"


def _link_view(gpu: GpuInfo, pci: PciLink | None) -> dict[str, int | None]:
    """Current/max generation and width: the GPU's own report first (in a guest it
    is the physical link), sysfs where the GPU says nothing."""
    sys_ = pci or PciLink()
    return {
        "current_gen": gpu.link.current_gen or pcie_gen(sys_.current_speed),
        "max_gen": gpu.link.max_gen or pcie_gen(sys_.max_speed),
        "current_width": gpu.link.current_width or sys_.current_width,
        "max_width": gpu.link.max_width or sys_.max_width,
    }


def _pci_link(facts: VerifyFacts, gpu: GpuInfo) -> PciLink | None:
    dev = facts.pci_gpus.get(gpu.address or "")
    return None if dev is None else dev.link


def _bench_for(facts: VerifyFacts, gpu: GpuInfo) -> BenchResult | None:
    return next((b for b in facts.bench if b.gpu_index == gpu.index and b.error is None), None)


def _here(facts: VerifyFacts) -> str:
    return "here" if facts.live else "under this root"


def check_driver(facts: VerifyFacts) -> Check:
    d = facts.driver
    user = facts.gpu_list.driver_version if facts.gpu_list else None
    if d.loaded or (d.version is None and user):
        version = d.version or user
        kind = {True: " (open kernel module)", False: " (proprietary kernel module)", None: ""}[d.open_kernel_module]
        if d.version and user and d.version != user:
            return Check(
                "driver",
                "fail",
                f"the kernel module is {d.version} but the driver's libraries are {user} "
                "(NVML: Driver/library version mismatch): CUDA will not start",
                "reboot after a driver upgrade (or unload and reload the nvidia modules)",
            )
        where = f" (from {d.source})" if d.source else f" (from {facts.gpu_list.source})" if facts.gpu_list else ""
        if not d.loaded:
            return Check(
                "driver",
                "ok",
                f"NVIDIA driver {version} answers{where}; its kernel module is not visible under /proc or /sys here "
                "(a container or a sandbox)",
            )
        if version is None:
            return Check(
                "driver",
                "warn",
                "the nvidia module is loaded but its version is not readable and the driver does not answer",
                "look at `dmesg | grep -i NVRM`: the module may have failed to initialise the GPU",
            )
        if d.nouveau:
            return Check(
                "driver",
                "warn",
                f"NVIDIA driver {version}{kind} is loaded, and so is nouveau",
                "blacklist nouveau (`blacklist nouveau` and `options nouveau modeset=0` in /etc/modprobe.d), "
                "regenerate the initramfs and reboot",
            )
        return Check("driver", "ok", f"NVIDIA driver {version}{kind} loaded{where}")
    if d.nouveau:
        fix = (
            "nouveau holds the GPU: blacklist it (`blacklist nouveau`, `options nouveau modeset=0` in "
            "/etc/modprobe.d), regenerate the initramfs, " + INSTALL_DRIVER + ", and reboot"
        )
    elif facts.pci_gpus:
        fix = INSTALL_DRIVER
    else:
        fix = (
            "no NVIDIA GPU is on this machine's PCI bus either: pass one through to it "
            "(`gpuprov inspect` on the host says whether it can be)"
        )
    where = "/proc/driver/nvidia/version" if facts.live else f"{facts.root}/proc/driver/nvidia/version"
    return Check("driver", "fail", f"no NVIDIA driver: {where} is absent and the nvidia module is not loaded", fix)


def check_gpus(facts: VerifyFacts) -> Check:
    gl = facts.gpu_list
    if gl is None:
        if not facts.driver.loaded:
            pci = ", ".join(facts.pci_gpus) or "none"
            return Check("gpus", "skip", f"no NVIDIA driver, so no GPU to list (NVIDIA GPUs on the PCI bus: {pci})")
        error = facts.gpu_error or "unknown error"
        if "mismatch" in error.lower():
            fix = "reboot after a driver upgrade (or unload and reload the nvidia modules)"
        elif "not on the PATH" in error:
            fix = "install the driver's utilities (nvidia-utils) or pip install nvidia-ml-py"
        else:
            fix = "look at `dmesg | grep -i NVRM` for why the driver cannot reach the GPU"
        return Check("gpus", "fail", f"the driver does not list GPUs: {error}", fix)
    if not gl.gpus:
        return Check(
            "gpus",
            "fail",
            f"the driver is loaded but {gl.source} shows no GPU",
            "look at `dmesg | grep -i NVRM` (an unsupported GPU, or one that fell off the bus)",
        )
    parts = []
    for g in gl.gpus:
        mem = "?" if g.memory_total_mib is None else f"{g.memory_total_mib} MiB"
        parts.append(f"{g.index}: {g.name or '?'} ({mem}) at {g.address or '?'}")
    cuda = f"; CUDA {gl.cuda_version}" if gl.cuda_version else ""
    message = f"{len(gl.gpus)} GPU(s) from {gl.source}: {'; '.join(parts)}{cuda}"
    seen = {g.address for g in gl.gpus}
    unseen = [d for a, d in facts.pci_gpus.items() if a not in seen]
    if unseen:
        names = ", ".join(f"{d.address} (driver {d.driver or 'none'})" for d in unseen)
        if any(d.driver == "vfio-pci" for d in unseen):
            fix = "a GPU bound to vfio-pci is kept for passthrough: unbind it and clear driver_override to use it here"
        else:
            fix = "look at `dmesg | grep -i NVRM`: the driver did not take it (unsupported, or failed to initialise)"
        return Check("gpus", "fail", f"{message}; but not {names}, which the PCI bus shows", fix)
    return Check("gpus", "ok", message)


def check_link(facts: VerifyFacts, gpu: GpuInfo) -> Check:
    pci = _pci_link(facts, gpu)
    v = _link_view(gpu, pci)
    own = f" (the GPU reports {_gen_text(v['current_gen'], v['current_width'])})" if v["current_gen"] else ""
    if pci is not None and not pci.known:
        return Check(
            "pcie-link",
            "warn",
            f"GPU {gpu.index} sits on a plain PCI bus here: sysfs shows no PCIe link{own}",
            PCIE_ROOT_PORT,
            gpu.index,
        )
    if v["current_gen"] is None and v["current_width"] is None:
        return Check(
            "pcie-link", "skip", f"GPU {gpu.index}: neither the driver nor sysfs reports its link", None, gpu.index
        )
    now = _gen_text(v["current_gen"], v["current_width"])
    top = _gen_text(v["max_gen"], v["max_width"])
    narrow = v["current_width"] is not None and v["max_width"] is not None and v["current_width"] < v["max_width"]
    slow = v["current_gen"] is not None and v["max_gen"] is not None and v["current_gen"] < v["max_gen"]
    if pci is not None and pci.degraded and not (narrow or slow) and gpu.link.current_gen is not None:
        return Check(
            "pcie-link",
            "warn",
            f"GPU {gpu.index} reports {now}, its max, but the PCI port above it in this machine shows "
            f"{pci.describe()}: an emulated port that claims a slower link than the GPU's",
            "harmless for bandwidth (the GPU's own link carries the data), but tools that read sysfs see a slow "
            "link: give the VM's pcie-root-port the GPU's speed and width (QEMU: x-speed, x-width)",
            gpu.index,
        )
    if pci is not None and pci.degraded and not (narrow or slow):
        narrow = pci.current_width is not None and pci.max_width is not None and pci.current_width < pci.max_width
        slow = not narrow
    if narrow:
        return Check(
            "pcie-link",
            "warn",
            f"GPU {gpu.index} link runs at x{v['current_width']} of x{v['max_width']} ({now}, max {top}): "
            "copies get a fraction of the bandwidth, under load too",
            "seat the GPU in a full-width slot, check risers and the BIOS bifurcation setting; on a VM host, "
            "`gpuprov inspect` there shows the host's link",
            gpu.index,
        )
    bench = _bench_for(facts, gpu)
    loaded = bench.link_under_load if bench else {}
    if slow:
        gen_load = loaded.get("current_gen") or pcie_gen(loaded.get("sysfs_speed"))
        if gen_load is not None and v["max_gen"] is not None and gen_load >= v["max_gen"]:
            return Check(
                "pcie-link",
                "ok",
                f"GPU {gpu.index} link {_gen_text(gen_load, v['current_width'])} under load, its max "
                f"({now} when idle: power saving)",
                None,
                gpu.index,
            )
        if gen_load is not None:
            return Check(
                "pcie-link",
                "warn",
                f"GPU {gpu.index} link still at {_gen_text(gen_load, v['current_width'])} while copying, max {top}: "
                "not power saving",
                "check the slot, riser and BIOS PCIe settings, and the host's link (`gpuprov inspect` on the host)",
                gpu.index,
            )
        return Check(
            "pcie-link",
            "warn",
            f"GPU {gpu.index} link at {now}, max {top}: an idle GPU lowers its link speed to save power",
            "re-check under load: `gpuprov verify --bench` reads the link while it copies",
            gpu.index,
        )
    return Check("pcie-link", "ok", f"GPU {gpu.index} link {now}, its max", None, gpu.index)


def check_vgpu(gpu: GpuInfo) -> Check:
    profile = parse_profile(gpu.name)
    if profile is None:
        return Check(
            "vgpu-memory",
            "warn",
            f"GPU {gpu.index} is a vGPU, but its name '{gpu.name}' names no profile to compare its memory with",
            "compare `nvidia-smi -q` Total FB memory with the profile the host assigned (nvidia/current_vgpu_type)",
            gpu.index,
        )
    have = gpu.memory_total_mib
    if have is None:
        return Check(
            "vgpu-memory", "skip", f"GPU {gpu.index} ({profile.name}) does not report its memory", None, gpu.index
        )
    if have > profile.framebuffer_mib:
        return Check(
            "vgpu-memory",
            "fail",
            f"vGPU {gpu.index} ({profile.name}) reports {have} MiB but its profile has {profile.framebuffer_mib} MiB: "
            "jobs that allocate past the profile die without a clear error",
            "match the guest driver to the host's vGPU manager release and recreate the vGPU with its type "
            "(on the host: nvidia/current_vgpu_type or the mdev type); cap jobs at the profile's size meanwhile",
            gpu.index,
        )
    return Check(
        "vgpu-memory",
        "ok",
        f"vGPU {gpu.index} ({profile.name}) reports {have} MiB of its profile's {profile.framebuffer_mib} MiB",
        None,
        gpu.index,
    )


def check_vgpu_license(gpu: GpuInfo) -> Check | None:
    if not gpu.vgpu_license:
        return None
    product = f" ({gpu.vgpu_product})" if gpu.vgpu_product else ""
    if gpu.vgpu_license.lower().startswith("licensed"):
        return Check("vgpu-license", "ok", f"vGPU {gpu.index}: {gpu.vgpu_license}{product}", None, gpu.index)
    return Check(
        "vgpu-license",
        "warn",
        f"vGPU {gpu.index}: {gpu.vgpu_license}{product}: an unlicensed vGPU is restricted after a grace period",
        "put the client configuration token in /etc/nvidia/ClientConfigToken/, set FeatureType in "
        "/etc/nvidia/gridd.conf, restart nvidia-gridd",
        gpu.index,
    )


def check_mig(gpu: GpuInfo) -> Check | None:
    if gpu.mig_current != "enabled" and gpu.mig_pending != "enabled":
        return None
    if gpu.mig_current != gpu.mig_pending:
        return Check(
            "mig",
            "warn",
            f"GPU {gpu.index}: MIG is {gpu.mig_current}, {gpu.mig_pending} once the GPU resets",
            "reset the GPU (`nvidia-smi -r -i INDEX` with no process on it) or reboot",
            gpu.index,
        )
    if not gpu.mig_devices:
        return Check(
            "mig",
            "warn",
            f"GPU {gpu.index}: MIG is on but no MIG device exists: CUDA sees nothing on this GPU",
            "create instances: `nvidia-smi mig -cgi PROFILES -C` (list them with `nvidia-smi mig -lgip`)",
            gpu.index,
        )
    return Check("mig", "ok", f"GPU {gpu.index}: MIG on, {gpu.mig_devices} MIG device(s)", None, gpu.index)


def check_docker(facts: VerifyFacts) -> Check:
    d = facts.docker
    engine = d.engine_runtimes
    if not d.installed and engine is None:
        return Check("docker-runtime", "skip", f"no container runtime: no Docker {_here(facts)}")
    if d.error:
        return Check("docker-runtime", "fail", d.error, f"fix the JSON, then {CONFIGURE_DOCKER}")
    has = d.nvidia_runtime is not None or d.cdi
    if engine is not None and "nvidia" in engine:
        default = " (the default runtime)" if d.default_runtime == "nvidia" else ""
        return Check("docker-runtime", "ok", f"the running Docker engine has the nvidia runtime{default}")
    if has:
        how = f"the nvidia runtime ({d.nvidia_runtime})" if d.nvidia_runtime else "CDI enabled (features.cdi)"
        if engine is not None and d.nvidia_runtime:
            return Check(
                "docker-runtime",
                "warn",
                f"{d.daemon_json} has {how}, but the running engine does not (runtimes: {', '.join(engine)})",
                "restart Docker: systemctl restart docker",
            )
        return Check("docker-runtime", "ok", f"{d.daemon_json} has {how}")
    where = d.daemon_json or "no /etc/docker/daemon.json"
    fix = CONFIGURE_DOCKER if facts.toolkit.nvidia_ctk else INSTALL_TOOLKIT + CONFIGURE_DOCKER
    return Check(
        "docker-runtime",
        "fail",
        f"Docker is here but has no NVIDIA runtime and CDI is off ({where}): containers cannot get the GPU",
        fix,
    )


def check_containerd(facts: VerifyFacts) -> Check:
    c = facts.containerd
    if not c.installed:
        return Check("containerd-runtime", "skip", f"no containerd {_here(facts)}")
    if not c.files:
        return Check("containerd-runtime", "skip", "containerd has no config file: it serves Docker only")
    if c.cri_disabled:
        return Check("containerd-runtime", "skip", "containerd's CRI plugin is disabled: it serves Docker only")
    if c.nvidia_runtime or c.cdi:
        how = "the nvidia runtime" if c.nvidia_runtime else "CDI enabled (enable_cdi)"
        return Check("containerd-runtime", "ok", f"containerd (CRI) has {how} ({', '.join(c.files)})")
    fix = CONFIGURE_CONTAINERD if facts.toolkit.nvidia_ctk else INSTALL_TOOLKIT + CONFIGURE_CONTAINERD
    return Check(
        "containerd-runtime",
        "warn",
        f"containerd's CRI (Kubernetes, nerdctl) has no nvidia runtime and no CDI ({', '.join(c.files)})",
        fix,
    )


def check_cdi(facts: VerifyFacts) -> Check:
    broken = [s for s in facts.cdi if s.error]
    if broken:
        s = broken[0]
        return Check("cdi-spec", "fail", f"{s.path}: {s.error}", f"regenerate it: {GENERATE_CDI}")
    specs = [s for s in facts.cdi if s.kind == "nvidia.com/gpu"]
    runtime = facts.docker.installed or facts.containerd.installed or facts.docker.engine_runtimes is not None
    if not specs:
        if not runtime and not facts.toolkit.nvidia_ctk:
            return Check("cdi-spec", "skip", "no container runtime and no CDI spec (/etc/cdi, /var/run/cdi)")
        return Check(
            "cdi-spec",
            "warn",
            "no CDI spec for nvidia.com/gpu in /etc/cdi or /var/run/cdi: Podman, containerd's CDI and "
            "`docker run --device nvidia.com/gpu=all` cannot find the GPU",
            GENERATE_CDI,
        )
    names = {n for s in specs for n in s.devices}
    paths = ", ".join(s.path for s in specs)
    driver = facts.driver.version or (facts.gpu_list.driver_version if facts.gpu_list else None)
    stale = sorted({v for s in specs for v in s.driver_versions if driver and v != driver})
    if stale:
        return Check(
            "cdi-spec",
            "fail",
            f"{paths} was generated for driver {', '.join(stale)}, but {driver} is loaded: "
            "containers would get the old libraries",
            f"regenerate it after every driver change: {GENERATE_CDI}",
        )
    if not facts.gpus:
        return Check(
            "cdi-spec", "ok", f"{paths} lists {', '.join(sorted(names)) or 'no device'} (no GPU seen to compare)"
        )
    missing = [g for g in facts.gpus if str(g.index) not in names and (g.uuid or "") not in names]
    if missing:
        which = ", ".join(f"GPU {g.index}" for g in missing)
        return Check(
            "cdi-spec",
            "fail",
            f"{paths} lists no device for {which} (it has: {', '.join(sorted(names)) or 'none'})",
            f"regenerate it: {GENERATE_CDI}",
        )
    known = {str(g.index) for g in facts.gpus} | {g.uuid for g in facts.gpus if g.uuid}
    extra = sorted(n for n in names if n != "all" and ":" not in n and n not in known)
    if extra:
        return Check(
            "cdi-spec",
            "warn",
            f"{paths} lists devices this machine does not have: {', '.join(extra)} (a GPU went away)",
            f"regenerate it: {GENERATE_CDI}",
        )
    return Check("cdi-spec", "ok", f"{paths} lists every GPU seen ({len(facts.gpus)}), by index and UUID")


def check_container(facts: VerifyFacts) -> Check:
    run = facts.container
    if run is None:
        return Check("container-run", "skip", facts.container_skip or "not run")
    if run.status == "fail":
        if "runtime" in run.message:
            fix = CONFIGURE_DOCKER if facts.toolkit.nvidia_ctk else INSTALL_TOOLKIT + CONFIGURE_DOCKER
        elif "not on this machine" in run.message:
            fix = "`docker load -i IMAGE.tar` (or build one locally), or give --image NAME of a local image"
        else:
            fix = f"run it by hand: docker run --rm --gpus all {run.image} nvidia-smi -L"
        return Check("container-run", "fail", run.message, fix)
    if run.status == "ok" and len(run.gpus) < len(facts.gpus):
        return Check(
            "container-run",
            "warn",
            f"{run.message}, but this machine has {len(facts.gpus)}",
            "check NVIDIA_VISIBLE_DEVICES in the image and the runtime's configuration",
        )
    return Check("container-run", run.status, run.message)


def bench_figures(facts: VerifyFacts, result: BenchResult) -> dict[str, Any]:
    """Peaks and fractions for one bench result (``None`` where no peak is known)."""
    gpu = next((g for g in facts.gpus if g.index == result.gpu_index), None)
    peak = None
    link: dict[str, int | None] = {}
    if gpu is not None:
        link = _link_view(gpu, _pci_link(facts, gpu))
        peak = pcie_peak_gbps(link["max_gen"], link["max_width"])
    name = result.name or (gpu.name if gpu else None)
    profile = parse_profile(gpu.name) if gpu is not None and gpu.virtualization_mode == "vgpu" else None
    # A MIG slice or a MIG-backed vGPU has a part of the GPU's SMs: its peak is not on file.
    part = gpu is not None and (gpu.mig_current == "enabled" or (profile is not None and profile.mig_slices))
    top = None if part else gpu_peak(name)

    def frac(value: float | None, of: float | None) -> float | None:
        return None if value is None or not of else round(value / of, 3)

    return {
        "link_gen": link.get("max_gen"),
        "link_width": link.get("max_width"),
        "link_peak_gbps": None if peak is None else round(peak, 2),
        "h2d_fraction": frac(result.h2d_gbps, peak),
        "d2h_fraction": frac(result.d2h_gbps, peak),
        "gpu_peak_label": top[0] if top else None,
        "gpu_peak_tflops": top[1] if top else None,
        "matmul_fraction": frac(result.matmul_tflops, top[1] if top else None),
    }


def check_bench(facts: VerifyFacts) -> list[Check]:
    if not facts.bench_requested:
        return []
    if not facts.gpus:
        return [Check("bench", "skip", "no GPU seen: nothing to measure")]
    if facts.bench_backend is None:
        return [
            Check(
                "bench",
                "skip",
                "--bench needs torch or cupy with CUDA, and neither imports here",
                "pip install torch (or cupy-cuda12x / cupy-cuda13x to match the driver's CUDA)",
            )
        ]
    checks = []
    for r in facts.bench:
        gi = r.gpu_index
        who = f"GPU {gi}" if gi is not None else f"CUDA device {r.device}"
        if r.error:
            checks.append(
                Check("bench", "fail", f"{who}: the bench failed: {r.error}", "look at `dmesg | grep -i NVRM`", gi)
            )
            continue
        f = bench_figures(facts, r)
        link = f"PCIe {_gen_text(f['link_gen'], f['link_width'])}" if f["link_gen"] else "the link"
        for cid, value, fraction, what in (
            ("bench-h2d", r.h2d_gbps, f["h2d_fraction"], "host->device"),
            ("bench-d2h", r.d2h_gbps, f["d2h_fraction"], "device->host"),
        ):
            if fraction is None:
                checks.append(Check(cid, "ok", f"{who}: {value:.1f} GB/s {what} (no link peak known)", None, gi))
            elif fraction >= COPY_OK_FRACTION:
                checks.append(
                    Check(
                        cid,
                        "ok",
                        f"{who}: {value:.1f} GB/s {what}, {fraction:.0%} of {link} ({f['link_peak_gbps']:.1f} GB/s)",
                        None,
                        gi,
                    )
                )
            else:
                checks.append(
                    Check(
                        cid,
                        "warn",
                        f"{who}: {value:.1f} GB/s {what}, only {fraction:.0%} of {link} "
                        f"({f['link_peak_gbps']:.1f} GB/s; pinned copies reach 80-90%)",
                        "check the link under load (pcie-link above), the host's IOMMU mode (iommu=pt) and that "
                        "the VM's memory and vCPUs sit on the GPU's NUMA node",
                        gi,
                    )
                )
        what = f"{r.matmul_tflops:.0f} TFLOP/s {r.matmul_dtype} matmul ({r.matmul_n}^3)"
        if f["matmul_fraction"] is None:
            checks.append(Check("bench-matmul", "ok", f"{who}: {what} (no peak on file for {r.name})", None, gi))
        elif f["matmul_fraction"] >= MATMUL_OK_FRACTION:
            checks.append(
                Check(
                    "bench-matmul",
                    "ok",
                    f"{who}: {what}, {f['matmul_fraction']:.0%} of the {f['gpu_peak_label']}'s "
                    f"{f['gpu_peak_tflops']:.0f} dense",
                    None,
                    gi,
                )
            )
        else:
            checks.append(
                Check(
                    "bench-matmul",
                    "warn",
                    f"{who}: {what}, only {f['matmul_fraction']:.0%} of the {f['gpu_peak_label']}'s "
                    f"{f['gpu_peak_tflops']:.0f} dense",
                    "look for other processes on the GPU (nvidia-smi), clocks held low (nvidia-smi -q -d "
                    "PERFORMANCE), or a time-sliced vGPU sharing the GPU",
                    gi,
                )
            )
    return checks


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
    return checks


# ---------------------------------------------------------------- report


def _pci_link_dict(link: PciLink | None) -> dict[str, Any] | None:
    if link is None:
        return None
    return {
        "current_speed": link.current_speed,
        "current_width": link.current_width,
        "max_speed": link.max_speed,
        "max_width": link.max_width,
    }


def _gpu_dict(facts: VerifyFacts, g: GpuInfo) -> dict[str, Any]:
    profile = parse_profile(g.name) if g.virtualization_mode == "vgpu" else None
    return {
        "index": g.index,
        "name": g.name,
        "uuid": g.uuid,
        "address": g.address,
        "architecture": g.architecture,
        "memory_total_mib": g.memory_total_mib,
        "memory_reserved_mib": g.memory_reserved_mib,
        "virtualization_mode": g.virtualization_mode,
        "vgpu": None
        if g.virtualization_mode != "vgpu"
        else {
            "profile": profile.name if profile else None,
            "profile_framebuffer_mib": profile.framebuffer_mib if profile else None,
            "license": g.vgpu_license,
            "licensed_product": g.vgpu_product,
        },
        "mig": {"current": g.mig_current, "pending": g.mig_pending, "devices": g.mig_devices},
        "link": asdict(g.link),
        "pci_link": _pci_link_dict(_pci_link(facts, g)),
    }


def build_report(facts: VerifyFacts, checks: list[Check]) -> dict[str, Any]:
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    d = facts.driver
    gl = facts.gpu_list
    run = facts.container
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "gpuprov_version": __version__,
        "host": {"root": facts.root, "kernel": facts.kernel, "os": facts.os_name, "hypervisor": facts.hypervisor},
        "driver": {
            "loaded": d.loaded,
            "version": d.version,
            "source": d.source,
            "open_kernel_module": d.open_kernel_module,
            "nouveau": d.nouveau,
            "library_version": gl.driver_version if gl else None,
            "cuda_version": gl.cuda_version if gl else None,
        },
        "gpus_from": gl.source if gl else None,
        "gpu_error": facts.gpu_error,
        "gpus": [_gpu_dict(facts, g) for g in facts.gpus],
        "pci_gpus": [
            {"address": a, "device_id": f"{p.device_id:04x}" if p.device_id is not None else None, "driver": p.driver}
            for a, p in facts.pci_gpus.items()
        ],
        "containers": {
            "docker": asdict(facts.docker),
            "containerd": asdict(facts.containerd),
            "toolkit": {"nvidia_ctk": facts.toolkit.nvidia_ctk, "nvidia_container_runtime": facts.toolkit.runtime},
            "cdi_specs": [asdict(s) for s in facts.cdi],
            "run": None
            if run is None
            else {
                "engine": run.engine,
                "engine_version": run.engine_version,
                "image": run.image,
                "exit_code": run.exit_code,
                "gpus": run.gpus,
                "output": run.output,
            },
        },
        "bench": None
        if not facts.bench_requested
        else {
            "backend": facts.bench_backend,
            "results": [{**asdict(r), **bench_figures(facts, r)} for r in facts.bench],
        },
        "checks": [asdict(c) for c in checks],
        "summary": {**counts, "passed": counts["fail"] == 0},
    }


# ---------------------------------------------------------------- table

_STYLE = {"ok": ("✓", "green"), "warn": ("!", "yellow"), "fail": ("✗", "bold red"), "skip": ("-", "dim")}


def print_report(report: dict[str, Any], console: Any = None) -> None:
    from rich.text import Text

    from ..cli.table import ValueTable, make_console
    from ..cli.textsafe import safe_data

    report = safe_data(report)  # every value escaped before it is laid out (docs/output.md)
    console = console or make_console()
    host, drv = report["host"], report["driver"]
    console.print(Text(f"Host: {host['os'] or 'unknown OS'}, kernel {host['kernel'] or '?'} (root {host['root']})"))
    version = drv["version"] or drv["library_version"]
    cuda = f", CUDA {drv['cuda_version']}" if drv["cuda_version"] else ""
    source = f"; GPUs from {report['gpus_from']}" if report["gpus_from"] else ""
    console.print(Text(f"NVIDIA driver: {version or 'none'}{cuda}{source}"))
    if report["gpus"]:
        table = ValueTable(title="GPUs", title_justify="left")
        for col in ("#", "Address", "Name", "Memory", "PCIe link (GPU)", "PCIe link (sysfs)", "Virtualization", "MIG"):
            table.add_column(col, overflow="fold")
        for g in report["gpus"]:
            link = g["link"]
            own = (
                f"gen{link['current_gen']} x{link['current_width']} (max gen{link['max_gen']} x{link['max_width']})"
                if link["current_gen"]
                else "-"
            )
            pl = g["pci_link"]
            if pl is None:
                sys_link = "-"
            elif pl["max_speed"] is None and pl["current_speed"] is None:
                sys_link = "none (plain PCI)"
            else:
                sys_link = PciLink(**pl).describe()
            virt = g["virtualization_mode"] or "-"
            if g["vgpu"] and g["vgpu"]["profile"]:
                virt += f" {g['vgpu']['profile']}"
            mem = "-" if g["memory_total_mib"] is None else f"{g['memory_total_mib']} MiB"
            table.add_row(
                str(g["index"]),
                g["address"] or "-",
                g["name"] or "-",
                mem,
                own,
                sys_link,
                virt,
                g["mig"]["current"] or "-",
            )
        console.print(table)
    checks = ValueTable(title="Checks", title_justify="left")
    for col in ("", "Check", "GPU", "Result"):
        checks.add_column(col, overflow="fold")
    for c in report["checks"]:
        mark, style = _STYLE[c["status"]]
        result = Text(c["message"])
        if c["fix"] and c["status"] != "ok":
            result.append(f"\nfix: {c['fix']}", "cyan")
        checks.add_row(
            Text(f"{mark} {c['status']}", style), c["id"], "-" if c["gpu"] is None else str(c["gpu"]), result
        )
    console.print(checks)
    bench = report["bench"]
    if bench and bench["results"]:
        table = ValueTable(title=f"Bench ({bench['backend']})", title_justify="left")
        for col in ("Device", "Name", "H2D GB/s", "D2H GB/s", "Link peak", "Matmul TFLOP/s", "GPU peak"):
            table.add_column(col, overflow="fold")

        def pct(value: float | None, frac: float | None, digits: int = 1) -> str:
            if value is None:
                return "-"
            return f"{value:.{digits}f}" + ("" if frac is None else f" ({frac:.0%})")

        for r in bench["results"]:
            table.add_row(
                f"cuda:{r['device']}",
                r["name"] or "-",
                pct(r["h2d_gbps"], r["h2d_fraction"]),
                pct(r["d2h_gbps"], r["d2h_fraction"]),
                "-" if r["link_peak_gbps"] is None else f"{r['link_peak_gbps']:.1f}",
                pct(r["matmul_tflops"], r["matmul_fraction"], 0),
                "-" if r["gpu_peak_tflops"] is None else f"{r['gpu_peak_tflops']:.0f} ({r['gpu_peak_label']})",
            )
        console.print(table)
    s = report["summary"]
    verdict = Text("PASSED", "bold green") if s["passed"] else Text("FAILED", "bold red")
    console.print(Text.assemble(f"{s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['skip']} skip: ", verdict))


# ---------------------------------------------------------------- command line


def option_error(live: bool, *, bench: bool, image: str | None, gpu_source: str) -> str | None:
    """Why these options cannot go together (``None`` when they can). Shared by the
    command line and the gpu_verify Ansible module; the words are the CLI's."""
    if not live and bench:
        return "--bench measures this machine's GPU: it cannot run on a --root capture; drop one of them"
    if not live and image:
        return "--image runs a container on this machine: it cannot go with --root; drop one of them"
    if not live and gpu_source == "nvml":
        return "--gpu-source nvml asks this machine's driver: it cannot go with --root"
    return None


def cmd_verify(args: argparse.Namespace) -> int:
    from ..cli.main import UsageError, host_root

    live = args.root == "/"
    error = option_error(live, bench=args.bench, image=args.image, gpu_source=args.gpu_source)
    if error:
        raise UsageError(error)
    nvml: Any = _AUTO
    if args.gpu_source == "nvml":
        nvml = _import("pynvml")
        if nvml is None:
            raise UsageError("--gpu-source nvml: pynvml is not importable here; pip install nvidia-ml-py")
    with host_root(args.root) as root:
        facts = gather(
            Sysfs(root),
            nvml=nvml,
            gpu_source=args.gpu_source,
            run_container=not args.no_container,
            image=args.image,
            bench=args.bench,
        )
    checks = evaluate(facts)
    report = build_report(facts, checks)
    report["host"]["root"] = args.root
    if args.json:
        sys.stdout.write(json.dumps(report, indent=2 if sys.stdout.isatty() else None) + "\n")
    else:
        print_report(report)
    return EXIT_OK if report["summary"]["passed"] else EXIT_FAILED


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``gpuprov verify``."""
    p = sub.add_parser(
        "verify",
        help="check that the GPUs work here: driver, GPUs, PCIe link, vGPU memory, container runtime (--bench: speed)",
        description="Run inside a guest, or on any GPU machine: checks the NVIDIA driver, the GPUs it shows, "
        "each GPU's PCIe link, a vGPU's memory against its profile, Docker/containerd/CDI configuration and "
        "(with the docker SDK) a container that asks for the GPU. Each check says ok/warn/fail/skip and the fix. "
        "Exit 0 when nothing fails, 1 when a check fails, 2 on bad input.",
    )
    p.add_argument(
        "--root",
        default="/",
        help="read this root (an unpacked capture, or its .tar.gz) instead of /; runs no NVML, container or bench",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema gpuprov.verify/v1)")
    p.add_argument(
        "--bench",
        action="store_true",
        help="also measure pinned host<->device bandwidth and a bf16 matmul (needs torch or cupy; uses the GPU "
        "for a few seconds and about 2 GiB of host and GPU memory)",
    )
    p.add_argument(
        "--image",
        metavar="IMAGE",
        help="local Docker image to run nvidia-smi in (default: a local nvidia/cuda or distribution image; "
        "nothing is pulled)",
    )
    p.add_argument("--no-container", action="store_true", help="do not start a container")
    p.add_argument(
        "--gpu-source",
        choices=("auto", "nvml", "nvidia-smi"),
        default="auto",
        help="how to ask the driver for its GPUs: NVML (pynvml) when importable, else nvidia-smi -q -x (default auto)",
    )
    p.set_defaults(func=cmd_verify)
