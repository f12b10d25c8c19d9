"""The GPU checks of ``gpuprov verify``: the driver, the GPUs it lists against the PCI
bus, each GPU's PCIe link, a vGPU's memory and license, MIG state."""

from __future__ import annotations

from ..facts.gpus import GpuInfo
from ..facts.vgpu_profile import parse_profile
from .base import INSTALL_DRIVER, Check, gen_text, link_view, pci_link
from .bench import BenchResult, pcie_gen
from .gather import VerifyFacts

PCIE_ROOT_PORT = (
    "give the VM a q35 machine with a pcie-root-port per GPU and put the GPU's hostdev on that port's bus "
    "(libvirt: <controller type='pci' model='pcie-root-port'/>)"
)


def _bench_for(facts: VerifyFacts, gpu: GpuInfo) -> BenchResult | None:
    return next((b for b in facts.bench if b.gpu_index == gpu.index and b.error is None), None)


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
    pci = pci_link(facts, gpu)
    v = link_view(gpu, pci)
    own = f" (the GPU reports {gen_text(v['current_gen'], v['current_width'])})" if v["current_gen"] else ""
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
    now = gen_text(v["current_gen"], v["current_width"])
    top = gen_text(v["max_gen"], v["max_width"])
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
                f"GPU {gpu.index} link {gen_text(gen_load, v['current_width'])} under load, its max "
                f"({now} when idle: power saving)",
                None,
                gpu.index,
            )
        if gen_load is not None:
            return Check(
                "pcie-link",
                "warn",
                f"GPU {gpu.index} link still at {gen_text(gen_load, v['current_width'])} while copying, max {top}: "
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
