"""Containers reaching the GPU: Docker's and containerd's runtime
configuration, CDI specs, and (with the docker SDK) a container that asks for
the GPU and runs ``nvidia-smi -L``.

Configuration files are read through :class:`Sysfs`, so ``--root`` checks a
capture or an image's root. The docker SDK is passed in as a module object.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .sysfs import Sysfs

DAEMON_JSON = "etc/docker/daemon.json"
CONTAINERD_CONFIG = "etc/containerd/config.toml"
CONTAINERD_DROPINS = "etc/containerd/conf.d"
CDI_DIRS = ("etc/cdi", "var/run/cdi")
_BIN_DIRS = ("usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin", "bin", "sbin")

CONFIGURE_DOCKER = "nvidia-ctk runtime configure --runtime=docker && systemctl restart docker"
CONFIGURE_CONTAINERD = "nvidia-ctk runtime configure --runtime=containerd && systemctl restart containerd"
GENERATE_CDI = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def find_binary(sysfs: Sysfs, name: str) -> str | None:
    for d in _BIN_DIRS:
        if sysfs.exists(f"{d}/{name}"):
            return f"/{d}/{name}"
    return None


# ---------------------------------------------------------------- runtimes


@dataclass
class DockerConfig:
    installed: bool  # dockerd or /etc/docker under the root
    daemon_json: str | None  # its path when present
    error: str | None  # daemon.json that does not parse
    nvidia_runtime: str | None  # runtimes.nvidia.path
    default_runtime: str | None
    cdi: bool  # features.cdi
    engine_runtimes: list[str] | None = None  # what a running engine says (docker info), None: not asked


@dataclass
class ContainerdConfig:
    installed: bool
    files: list[str]  # config files read
    cri_disabled: bool  # disabled_plugins has "cri" (Docker's own containerd)
    nvidia_runtime: bool
    cdi: bool  # enable_cdi = true


@dataclass
class Toolkit:
    nvidia_ctk: str | None
    runtime: str | None  # nvidia-container-runtime


def read_docker_config(sysfs: Sysfs) -> DockerConfig:
    installed = find_binary(sysfs, "dockerd") is not None or sysfs.exists("etc/docker")
    text = sysfs.read(DAEMON_JSON)
    if text is None:
        return DockerConfig(installed, None, None, None, None, False)
    path = "/" + DAEMON_JSON
    if not text.strip():
        return DockerConfig(True, path, None, None, None, False)
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return DockerConfig(True, path, f"{path} is not valid JSON ({exc}): dockerd will not start", None, None, False)
    runtimes = data.get("runtimes") if isinstance(data.get("runtimes"), dict) else {}
    nvidia = runtimes.get("nvidia")
    features = data.get("features") if isinstance(data.get("features"), dict) else {}
    return DockerConfig(
        installed=True,
        daemon_json=path,
        error=None,
        nvidia_runtime=(nvidia.get("path") or "?") if isinstance(nvidia, dict) else None,
        default_runtime=data.get("default-runtime") if isinstance(data.get("default-runtime"), str) else None,
        cdi=features.get("cdi") is True,
    )


# [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia] (config v2),
# [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia] (v3, containerd 2).
_CONTAINERD_NVIDIA = re.compile(r"^\s*\[\s*plugins\b[^\]]*\.runtimes\.[\"']?nvidia[\"']?\s*\]", re.M)
_CONTAINERD_CDI = re.compile(r"^\s*enable_cdi\s*=\s*true\b", re.M)
_DISABLED = re.compile(r"^\s*disabled_plugins\s*=\s*\[([^\]]*)\]", re.M)


def read_containerd_config(sysfs: Sysfs) -> ContainerdConfig:
    files, texts = [], []
    for rel in [CONTAINERD_CONFIG] + [
        f"{CONTAINERD_DROPINS}/{n}" for n in sysfs.listdir(CONTAINERD_DROPINS) if n.endswith(".toml")
    ]:
        text = sysfs.read(rel)
        if text is not None:
            files.append("/" + rel)
            texts.append(text)
    whole = "\n".join(texts)
    disabled = _DISABLED.search(whole)
    return ContainerdConfig(
        installed=find_binary(sysfs, "containerd") is not None or bool(files),
        files=files,
        cri_disabled=bool(disabled and re.search(r"[\"'](io\.containerd\.grpc\.v1\.)?cri[\"']", disabled.group(1))),
        nvidia_runtime=bool(_CONTAINERD_NVIDIA.search(whole)),
        cdi=bool(_CONTAINERD_CDI.search(whole)),
    )


def read_toolkit(sysfs: Sysfs) -> Toolkit:
    return Toolkit(nvidia_ctk=find_binary(sysfs, "nvidia-ctk"), runtime=find_binary(sysfs, "nvidia-container-runtime"))


# ---------------------------------------------------------------- CDI


@dataclass
class CdiSpec:
    path: str
    kind: str | None
    devices: list[str]  # device names: "0", "GPU-<uuid>", "all", "0:1" (MIG)
    driver_versions: list[str] = field(default_factory=list)  # from libcuda.so.X / libnvidia-ml.so.X paths
    error: str | None = None


_DRIVER_LIB = re.compile(r"lib(?:cuda|nvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)\b")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse_cdi(text: str, path: str) -> CdiSpec:
    """A CDI spec's kind and device names, from JSON or from the YAML that
    ``nvidia-ctk cdi generate`` writes (block style; no YAML library needed)."""
    versions = sorted(set(_DRIVER_LIB.findall(text)))
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            return CdiSpec(path, None, [], versions, f"not valid JSON ({exc})")
        devices = [str(d.get("name")) for d in data.get("devices") or [] if isinstance(d, dict) and "name" in d]
        return CdiSpec(path, data.get("kind"), devices, versions)
    kind = None
    devices: list[str] = []
    in_devices = False
    item_indent = None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#") or line.strip() == "---":
            continue
        indent = len(line) - len(line.lstrip())
        body = line.strip()
        if indent == 0 and not body.startswith("- "):
            key, _sep, value = body.partition(":")
            in_devices = key == "devices"
            item_indent = None
            if key == "kind":
                kind = _unquote(value)
            continue
        if not in_devices:
            continue
        if body.startswith("- ") and (item_indent is None or indent == item_indent):
            item_indent = indent
            body = body[2:].strip()
            indent += 2
            if body.startswith("name:"):
                devices.append(_unquote(body[5:]))
            continue
        if item_indent is not None and indent == item_indent + 2 and body.startswith("name:"):
            devices.append(_unquote(body[5:]))
    if kind is None and not devices:
        return CdiSpec(path, None, [], versions, "no kind and no devices: not a CDI spec")
    return CdiSpec(path, kind, devices, versions)


def read_cdi_specs(sysfs: Sysfs) -> list[CdiSpec]:
    specs = []
    for d in CDI_DIRS:
        for name in sysfs.listdir(d):
            if name.endswith((".yaml", ".yml", ".json")):
                text = sysfs.read(f"{d}/{name}")
                if text is not None:
                    specs.append(parse_cdi(text, f"/{d}/{name}"))
    return specs


# ---------------------------------------------------------------- a container run


@dataclass
class ContainerRun:
    engine: bool  # a Docker engine answered
    status: str  # "ok", "fail", "skip"
    message: str
    image: str | None = None
    exit_code: int | None = None
    output: str | None = None
    gpus: list[str] = field(default_factory=list)  # nvidia-smi -L lines ("GPU 0: ... (UUID: ...)")
    engine_runtimes: list[str] | None = None
    engine_version: str | None = None


_PREFERRED = ("cuda", "ubuntu", "debian", "rockylinux", "almalinux", "fedora", "centos", "ubi")
_MUSL = ("busybox", "alpine")


def pick_image(images: list[Any]) -> str | None:
    """A local image to run ``nvidia-smi`` in: nvidia/cuda first, then a glibc
    distribution (the injected nvidia-smi needs glibc), then the smallest tagged one."""
    tagged = []
    for img in images:
        tags = [t for t in (getattr(img, "tags", None) or []) if not t.endswith(":<none>")]
        if tags:
            size = (getattr(img, "attrs", None) or {}).get("Size") or 0
            tagged.append((size, sorted(tags)[0]))
    for word in _PREFERRED:
        hits = sorted((s, t) for s, t in tagged if word in t.split(":")[0].lower())
        if hits:
            return hits[0][1]
    glibc = sorted((s, t) for s, t in tagged if not any(m in t.split(":")[0].lower() for m in _MUSL))
    return glibc[0][1] if glibc else None


def _engine_error(exc: BaseException) -> str:
    text = str(getattr(exc, "explanation", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_gpu_container(docker: Any, image: str | None, *, timeout: float = 120) -> ContainerRun:
    """Start a container that asks Docker for every GPU and runs ``nvidia-smi -L``.

    ``docker`` is the docker SDK module. Nothing is pulled: the image must be
    local. The container is removed afterwards, whatever happened.
    """
    errors = docker.errors
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as exc:  # noqa: BLE001 - the SDK raises several kinds for "no engine"
        return ContainerRun(
            False, "skip", f"no container runtime: no Docker engine answers ({_engine_error(exc)})", image
        )
    try:
        info = client.info()
        runtimes = sorted((info.get("Runtimes") or {}).keys())
        version = info.get("ServerVersion")
    except errors.DockerException:
        runtimes, version = None, None
    run = ContainerRun(True, "skip", "", image, engine_runtimes=runtimes, engine_version=version)
    try:
        if image is None:
            image = run.image = pick_image(client.images.list())
            if image is None:
                run.message = "no local image to run nvidia-smi in, and nothing is pulled: give --image NAME"
                return run
        else:
            try:
                client.images.get(image)
            except errors.ImageNotFound:
                run.status = "fail"
                run.message = f"image {image} is not on this machine, and nothing is pulled: `docker load` it first"
                return run
        request = docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])
        container = client.containers.create(
            image, ["nvidia-smi", "-L"], device_requests=[request], network_disabled=True
        )
        try:
            container.start()
            result = container.wait(timeout=timeout)
            run.exit_code = int(result.get("StatusCode", -1)) if isinstance(result, dict) else None
            run.output = container.logs().decode("utf-8", "replace").strip()
        finally:
            try:
                container.remove(force=True)
            except errors.DockerException:
                pass
    except errors.DockerException as exc:
        said = _engine_error(exc)
        run.status = "fail"
        if "could not select device driver" in said or "unknown or invalid runtime" in said:
            run.message = f"Docker cannot hand a GPU to a container ({said}): its NVIDIA runtime is not configured"
        elif "executable file not found" in said or "no such file" in said.lower():
            run.message = f"the container started but has no nvidia-smi ({said}): the NVIDIA runtime did not inject it"
        else:
            run.message = f"the GPU container did not run: {said}"
        return run
    except Exception as exc:  # noqa: BLE001 - a timeout from requests, a broken socket
        run.status = "fail"
        run.message = f"the GPU container did not finish: {type(exc).__name__}: {exc}"
        return run
    run.gpus = [line for line in (run.output or "").splitlines() if line.startswith("GPU ")]
    if run.exit_code == 0 and run.gpus:
        run.status = "ok"
        run.message = f"a container from {image} sees {len(run.gpus)} GPU(s)"
    else:
        run.status = "fail"
        tail = (run.output or "").splitlines()[-1:] or ["no output"]
        run.message = f"nvidia-smi -L in {image} exited {run.exit_code}: {tail[0]}"
    return run
