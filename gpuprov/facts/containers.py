"""Containers reaching the GPU: Docker's and containerd's runtime configuration and the CDI
specs (the GPU container itself: gpuprov.verify.container, through gpuprov.facts.docker_api).

Configuration files are read through :class:`Sysfs`, so ``--root`` checks a
capture or an image's root.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .boundedjson import MAX_JSON_CHARS, BoundedJsonError, loads_bounded
from .sysfs import Sysfs

DAEMON_JSON = "etc/docker/daemon.json"
CONTAINERD_CONFIG = "etc/containerd/config.toml"
CONTAINERD_DROPINS = "etc/containerd/conf.d"
CDI_DIRS = ("etc/cdi", "var/run/cdi")
_BIN_DIRS = ("usr/bin", "usr/sbin", "usr/local/bin", "usr/local/sbin", "bin", "sbin")

SYSTEMD_RUNNING = "run/systemd/system"  # systemd's own test of "booted with systemd" (sd_booted)
DOCKER_PIDFILE = "/var/run/docker.pid"


def restart_text(engine: str, systemd: bool) -> str:
    """How to make a running engine read its configuration again, on this guest's service manager."""
    if systemd:
        return f"systemctl restart {engine}"
    if engine == "docker":
        # No systemd (a microVM's PID 1, a container): dockerd reloads its runtimes on SIGHUP.
        return f"kill -HUP $(cat {DOCKER_PIDFILE}) (no systemd here: dockerd reloads its runtimes on SIGHUP)"
    return f"restart {engine} (no systemd here: stop its process and start it again)"


def configure_text(runtime: str, systemd: bool) -> str:
    return f"nvidia-ctk runtime configure --runtime={runtime} && {restart_text(runtime, systemd)}"


GENERATE_CDI = "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def find_binary(sysfs: Sysfs, name: str) -> str | None:
    for d in _BIN_DIRS:
        if sysfs.exists(f"{d}/{name}"):
            return f"/{d}/{name}"
    return None


# ---------------------------------------------------------------- runtimes

# Files larger than these are not read as configuration: what each is at most on a real
# guest, many times over (daemon.json and containerd's config.toml are a few KiB; a CDI
# spec nvidia-ctk writes for eight GPUs with MIG a few hundred). The read itself stops at
# Sysfs's MAX_READ_BYTES. Everything below is one linear pass over at most this much.
MAX_CONFIG_CHARS = MAX_JSON_CHARS
MAX_CDI_CHARS = 4 * MAX_JSON_CHARS
MAX_DROPINS = 64  # containerd drop-ins read (conf.d/*.toml)
MAX_CDI_FILES = 64  # spec files read per CDI directory
MAX_CDI_DEVICES = 4096  # eight GPUs with every MIG instance, by index and UUID, is a few hundred


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
    # A config file that could not be judged (too large, too many drop-ins), with its path and
    # the fix; what the files say is then unknown, and read as "no nvidia runtime, no CDI".
    error: str | None = None


@dataclass
class Toolkit:
    nvidia_ctk: str | None
    runtime: str | None  # nvidia-container-runtime


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else "null"


def _daemon_json_types(data: dict[str, object]) -> str | None:
    """The first field gpuprov reads whose type dockerd refuses (it will not start), or None.
    A null is Go's zero value: dockerd takes it as absent, and so does this."""
    wanted: list[tuple[str, object, type]] = [
        ("runtimes", data.get("runtimes"), dict),
        ("default-runtime", data.get("default-runtime"), str),
        ("features", data.get("features"), dict),
    ]
    runtimes = data.get("runtimes")
    if isinstance(runtimes, dict):
        wanted.append(("runtimes.nvidia", runtimes.get("nvidia"), dict))
        nvidia = runtimes.get("nvidia")
        if isinstance(nvidia, dict):
            wanted.append(("runtimes.nvidia.path", nvidia.get("path"), str))
    features = data.get("features")
    if isinstance(features, dict):
        wanted.append(("features.cdi", features.get("cdi"), bool))
    for name, value, kind in wanted:
        if value is not None and not isinstance(value, kind):
            expected = {dict: "an object", str: "a string", bool: "a boolean"}[kind]
            return f"{name} is {_json_type(value)}, not {expected}"
    return None


def read_docker_config(sysfs: Sysfs) -> DockerConfig:
    installed = find_binary(sysfs, "dockerd") is not None or sysfs.exists("etc/docker")
    text = sysfs.read(DAEMON_JSON)
    if text is None:
        return DockerConfig(installed, None, None, None, None, False)
    path = "/" + DAEMON_JSON
    if not text.strip():
        return DockerConfig(True, path, None, None, None, False)
    try:
        data = loads_bounded(text, max_chars=MAX_CONFIG_CHARS)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        wrong = _daemon_json_types(data)
    except BoundedJsonError as exc:
        if exc.over_limit:
            error = f"{path} is not read as JSON ({exc}; a daemon.json is a few KiB): check it, dockerd may not start"
        else:
            error = f"{path} is not valid JSON ({exc}): dockerd will not start"
        return DockerConfig(True, path, error, None, None, False)
    except ValueError as exc:
        return DockerConfig(True, path, f"{path} is not valid JSON ({exc}): dockerd will not start", None, None, False)
    if wrong:
        error = f"{path} is not what dockerd reads ({wrong}): dockerd will not start"
        return DockerConfig(True, path, error, None, None, False)
    runtimes = data.get("runtimes") or {}
    nvidia = runtimes.get("nvidia")
    features = data.get("features") or {}
    return DockerConfig(
        installed=True,
        daemon_json=path,
        error=None,
        nvidia_runtime=(nvidia.get("path") or "?") if isinstance(nvidia, dict) else None,
        default_runtime=data.get("default-runtime"),
        cdi=features.get("cdi") is True,
    )


# Read a line at a time (each pattern stays inside one stripped line: linear in the file).
# [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia] (config v2),
# [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia] (v3, containerd 2).
_CONTAINERD_NVIDIA = re.compile(r"\[[ \t]*plugins\b[^\]]*\.runtimes\.[\"']?nvidia[\"']?[ \t]*\]")
_CONTAINERD_CDI = re.compile(r"enable_cdi[ \t]*=[ \t]*true\b")
_DISABLED = re.compile(r"disabled_plugins[ \t]*=[ \t]*\[([^\]]*)(\]?)")
_CRI = re.compile(r"[\"'](?:io\.containerd\.grpc\.v1\.)?cri[\"']")


@dataclass
class _TomlFacts:
    nvidia_runtime: bool = False
    cdi: bool = False
    disabled: str | None = None  # the first disabled_plugins array's inside


def _scan_containerd(text: str, facts: _TomlFacts) -> None:
    """What matters in one containerd TOML file, line by line: table headers, enable_cdi and the
    first ``disabled_plugins = [...]`` (which may run over several lines)."""
    lines = iter(text.splitlines())
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        first = line[0]
        if first == "[":
            if not facts.nvidia_runtime and _CONTAINERD_NVIDIA.match(line):
                facts.nvidia_runtime = True
        elif first == "e":
            if not facts.cdi and _CONTAINERD_CDI.match(line):
                facts.cdi = True
        elif first == "d" and facts.disabled is None:
            m = _DISABLED.match(line)
            if m is None:
                continue
            parts = [m.group(1)]
            closed = bool(m.group(2))
            while not closed:
                more = next(lines, None)
                if more is None:
                    break
                inside, bracket, _rest = more.partition("]")
                parts.append(inside)
                closed = bool(bracket)
            if closed:
                facts.disabled = "\n".join(parts)


def read_containerd_config(sysfs: Sysfs) -> ContainerdConfig:
    dropins = [n for n in sysfs.listdir(CONTAINERD_DROPINS) if n.endswith(".toml")]
    errors = []
    if len(dropins) > MAX_DROPINS:
        errors.append(
            f"/{CONTAINERD_DROPINS} has {len(dropins)} drop-in files, only the first {MAX_DROPINS} are read: "
            "merge them (nvidia-ctk writes one)"
        )
    files: list[str] = []
    facts = _TomlFacts()
    for rel in [CONTAINERD_CONFIG] + [f"{CONTAINERD_DROPINS}/{n}" for n in dropins[:MAX_DROPINS]]:
        text = sysfs.read(rel)
        if text is None:
            continue
        files.append("/" + rel)
        if len(text) > MAX_CONFIG_CHARS:
            errors.append(
                f"/{rel} is not read ({len(text)} characters, over the {MAX_CONFIG_CHARS} read; containerd's "
                "config is a few KiB): check it, or write it again with `containerd config default`"
            )
            continue
        _scan_containerd(text, facts)
    return ContainerdConfig(
        installed=find_binary(sysfs, "containerd") is not None or bool(files),
        files=files,
        cri_disabled=bool(facts.disabled is not None and _CRI.search(facts.disabled)),
        nvidia_runtime=facts.nvidia_runtime,
        cdi=facts.cdi,
        error="; ".join(errors) or None,
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
    # Devices that make a container an MPS client (their env sets CUDA_MPS_PIPE_DIRECTORY): gpuprov's tenant
    # devices of a shared GPU (docs/guides/sharing.md), each a GPU's device nodes under a tenant's name.
    mps_clients: list[str] = field(default_factory=list)


_DRIVER_LIB = re.compile(r"lib(?:cuda|nvidia-ml)\.so\.(\d+\.\d+(?:\.\d+)?)\b")
# CDI's own rules (containers/cdi pkg/parser): kind is vendor/class, a device name is
# letters, digits and _ . : - (one line, nothing a terminal acts on).
_CDI_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}/[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_CDI_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,255}")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _shown(value: object) -> str:
    """A value from the file, for a message: repr (control characters escaped), at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _cdi_error(kind: object, devices: list[object]) -> str | None:
    """What in a spec's kind or device names a CDI runtime refuses, or None."""
    if kind is not None and not (isinstance(kind, str) and _CDI_KIND.fullmatch(kind)):
        what = "" if isinstance(kind, str) else f" ({_json_type(kind)})"
        return f"kind {_shown(kind)}{what} is not vendor/class: a CDI runtime refuses the spec"
    if len(devices) > MAX_CDI_DEVICES:
        return f"{len(devices)} devices, over the {MAX_CDI_DEVICES} read: not a spec nvidia-ctk writes"
    for i, name in enumerate(devices):
        if not (isinstance(name, str) and _CDI_DEVICE.fullmatch(name)):
            return f"devices[{i}].name {_shown(name)} is not a CDI device name: a CDI runtime refuses the spec"
    return None


def _parse_cdi_json(text: str, path: str, versions: list[str]) -> CdiSpec:
    try:
        data = loads_bounded(text, max_chars=MAX_CDI_CHARS)
    except BoundedJsonError as exc:
        why = f"not read as JSON ({exc}): not a spec nvidia-ctk writes" if exc.over_limit else f"not valid JSON ({exc})"
        return CdiSpec(path, None, [], versions, why)
    if not isinstance(data, dict):
        return CdiSpec(path, None, [], versions, f"{_json_type(data)}, not a JSON object: not a CDI spec")
    listed = data.get("devices")
    if listed is None:
        listed = []
    if not isinstance(listed, list):
        return CdiSpec(path, None, [], versions, f"devices is {_json_type(listed)}, not an array: not a CDI spec")
    names: list[object] = []
    clients: list[str] = []
    for i, d in enumerate(listed):
        if not isinstance(d, dict):
            return CdiSpec(path, None, [], versions, f"devices[{i}] is {_json_type(d)}, not an object")
        names.append(d.get("name"))
        edits = d.get("containerEdits")
        env = edits.get("env") if isinstance(edits, dict) else None
        if isinstance(env, list) and any(isinstance(e, str) and e.startswith("CUDA_MPS_PIPE_DIRECTORY=") for e in env):
            clients.append(str(d.get("name")))
    kind = data.get("kind")
    if kind is None and not names:
        return CdiSpec(path, None, [], versions, "no kind and no devices: not a CDI spec")
    error = _cdi_error(kind, names)
    if error:
        return CdiSpec(path, None, [], versions, error)
    return CdiSpec(path, kind, [str(n) for n in names], versions, mps_clients=clients)  # type: ignore[arg-type]


def _parse_cdi_yaml(text: str, path: str, versions: list[str]) -> CdiSpec:
    # One pass over the lines, each looked at once: the block style nvidia-ctk writes
    # (top-level keys at column 0, the devices as a list of mappings), nothing recursive.
    kind = None
    devices: list[object] = []
    in_devices = False
    item_indent = None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        body = line.lstrip()
        if not body or body[0] == "#" or body == "---":
            continue
        indent = len(line) - len(body)
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
            if body.startswith("name:"):
                devices.append(_unquote(body[5:]))
            continue
        if item_indent is not None and indent == item_indent + 2 and body.startswith("name:"):
            devices.append(_unquote(body[5:]))
    if kind is None and not devices:
        return CdiSpec(path, None, [], versions, "no kind and no devices: not a CDI spec")
    error = _cdi_error(kind, devices)
    if error:
        return CdiSpec(path, None, [], versions, error)
    return CdiSpec(path, kind, [str(d) for d in devices], versions)


def parse_cdi(text: str, path: str) -> CdiSpec:
    """A CDI spec's kind and device names, from JSON or from the YAML that
    ``nvidia-ctk cdi generate`` writes (block style; no YAML library needed).

    Whatever the text holds, a spec comes back: one that cannot be read (too large, too
    deep, a field of the wrong type, a kind or device name CDI refuses) has ``error`` set."""
    if len(text) > MAX_CDI_CHARS:
        return CdiSpec(
            path, None, [], [], f"{len(text)} characters, over the {MAX_CDI_CHARS} read: not a spec nvidia-ctk writes"
        )
    versions = sorted(set(_DRIVER_LIB.findall(text)))
    if text.lstrip()[:1] in ("{", "["):
        return _parse_cdi_json(text, path, versions)
    return _parse_cdi_yaml(text, path, versions)


def read_cdi_specs(sysfs: Sysfs) -> list[CdiSpec]:
    specs = []
    for d in CDI_DIRS:
        names = [n for n in sysfs.listdir(d) if n.endswith((".yaml", ".yml", ".json"))]
        if len(names) > MAX_CDI_FILES:
            specs.append(
                CdiSpec(
                    f"/{d}",
                    None,
                    [],
                    error=f"{len(names)} spec files, only the first {MAX_CDI_FILES} are read: "
                    "remove the ones no runtime needs",
                )
            )
        for name in names[:MAX_CDI_FILES]:
            text = sysfs.read(f"{d}/{name}")
            if text is not None:
                specs.append(parse_cdi(text, f"/{d}/{name}"))
    return specs
