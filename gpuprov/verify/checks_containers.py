"""The container checks of ``gpuprov verify``: Docker's and containerd's NVIDIA
runtime, the CDI specs against the GPUs and the driver, and the GPU container run."""

from __future__ import annotations

from ..facts.containers import GENERATE_CDI, configure_text, restart_text
from .base import INSTALL_TOOLKIT, Check
from .gather import VerifyFacts


def _here(facts: VerifyFacts) -> str:
    return "here" if facts.live else "under this root"


def check_docker(facts: VerifyFacts) -> Check:
    d = facts.docker
    engine = d.engine_runtimes
    if not d.installed and engine is None:
        return Check("docker-runtime", "skip", f"no container runtime: no Docker {_here(facts)}")
    if d.error:
        return Check("docker-runtime", "fail", d.error, f"fix the JSON, then {configure_text('docker', facts.systemd)}")
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
                f"restart Docker: {restart_text('docker', facts.systemd)}",
            )
        return Check("docker-runtime", "ok", f"{d.daemon_json} has {how}")
    where = d.daemon_json or "no /etc/docker/daemon.json"
    configure = configure_text("docker", facts.systemd)
    fix = configure if facts.toolkit.nvidia_ctk else INSTALL_TOOLKIT + configure
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
    if c.error:
        # A configuration gpuprov could not read in full (too large, too many drop-ins): unknown, not fine.
        return Check(
            "containerd-runtime", "warn", f"containerd's configuration was not read: {c.error}", "check those files"
        )
    if not c.files:
        return Check("containerd-runtime", "skip", "containerd has no config file: it serves Docker only")
    if c.cri_disabled:
        return Check("containerd-runtime", "skip", "containerd's CRI plugin is disabled: it serves Docker only")
    if facts.containerd_running is False:
        return Check(
            "containerd-runtime",
            "skip",
            "containerd is installed but no containerd service runs (Docker's own is not one): nothing uses its CRI",
        )
    if c.nvidia_runtime or c.cdi:
        how = "the nvidia runtime" if c.nvidia_runtime else "CDI enabled (enable_cdi)"
        return Check("containerd-runtime", "ok", f"containerd (CRI) has {how} ({', '.join(c.files)})")
    configure = configure_text("containerd", facts.systemd)
    fix = configure if facts.toolkit.nvidia_ctk else INSTALL_TOOLKIT + configure
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
    tenants = {n for s in specs for n in s.mps_clients}  # a shared GPU's tenant devices: no GPU of their own
    extra = sorted(n for n in names if n != "all" and ":" not in n and n not in known and n not in tenants)
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
            configure = configure_text("docker", facts.systemd)
            fix = configure if facts.toolkit.nvidia_ctk else INSTALL_TOOLKIT + configure
        elif "stale" in run.message:
            fix = f"regenerate it: {GENERATE_CDI}"
        elif "not on this machine" in run.message:
            fix = "`docker load -i IMAGE.tar` (or build one locally), or give --image NAME of a local image"
        else:
            fix = (
                f"run it by hand: docker run --rm --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=all {run.image} "
                "nvidia-smi -L"
            )
        return Check("container-run", "fail", run.message, fix)
    if run.status != "ok":
        return Check("container-run", run.status, run.message)
    # Each GPU of this machine, by UUID, against what the container saw.
    known = [g.uuid for g in facts.gpus if g.uuid]
    unseen = [u for u in known if u not in run.uuids]
    if unseen or len(run.gpus) < len(facts.gpus):
        return Check(
            "container-run",
            "warn",
            f"{run.message}, but this machine has {len(facts.gpus)}: not seen {', '.join(unseen) or 'by UUID'}",
            "check NVIDIA_VISIBLE_DEVICES in the image and the runtime's configuration, and regenerate the CDI spec: "
            + GENERATE_CDI,
        )
    every = " (every GPU here)" if known else ""
    return Check("container-run", "ok", f"{run.message}: {', '.join(run.uuids) or 'no UUID shown'}{every}")
