"""gpuprov verify's container checks: Docker and containerd runtime
configuration and CDI specs in temp roots, the container run through a fake
docker SDK module (and, where an engine answers here, the real one)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpuprov.facts.containers import parse_cdi, pick_image, run_gpu_container
from gpuprov.verify.checks import Check
from tests.fakehost import FakeHost
from tests.test_verify_nvml import ZERO_UUID, FakeGpu, FakeNvml, guest, verify

UUID1 = "GPU-11111111-1111-1111-1111-111111111111"

# What `nvidia-ctk cdi generate` writes (toolkit 1.17, driver 580), shortened.
CDI_YAML = """---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidiactl
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libnvidia-allocator.so.{v}::/usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so
    hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
  mounts:
  - containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{v}
    hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{v}
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - containerPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}
    hostPath: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{v}
    options:
    - ro
    - nosuid
    - nodev
    - bind
devices:
{devices}kind: nvidia.com/gpu
"""
CDI_DEVICE = """- containerEdits:
    deviceNodes:
    - path: /dev/nvidia{minor}
  name: {name}
"""

CONTAINERD_V2_NVIDIA = """version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]

    [plugins."io.containerd.grpc.v1.cri".containerd]

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
          privileged_without_host_devices = false
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
            BinaryName = "/usr/bin/nvidia-container-runtime"
"""
CONTAINERD_V3_DROPIN = """version = 3
[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]
          runtime_type = "io.containerd.runc.v2"
"""
CONTAINERD_PLAIN = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
"""
CONTAINERD_DOCKER_ONLY = 'disabled_plugins = ["cri"]\n'
DAEMON_NVIDIA = {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}


def cdi_yaml(*devices: tuple[str, int], version: str = "580.159.04") -> str:
    body = "".join(CDI_DEVICE.format(name=name, minor=minor) for name, minor in devices)
    return CDI_YAML.format(v=version, devices=body)


def docker_host(fake: FakeHost, daemon: dict[str, Any] | str | None = None, *, ctk: bool = True) -> None:
    fake.write("usr/bin/dockerd", "")
    if ctk:
        fake.write("usr/bin/nvidia-ctk", "")
    if daemon is not None:
        fake.write("etc/docker/daemon.json", daemon if isinstance(daemon, str) else json.dumps(daemon))


def checks_for(root: Path, **kwargs: Any) -> dict[tuple[str, int | None], Check]:
    kwargs.setdefault("nvml", FakeNvml(FakeGpu()))
    return verify(root, **kwargs)[1]


# ---------------------------------------------------------------- Docker


def test_docker_with_the_nvidia_runtime(fake) -> None:
    docker_host(fake, DAEMON_NVIDIA)
    check = checks_for(guest(fake))["docker-runtime", None]
    assert check.status == "ok" and "nvidia runtime (nvidia-container-runtime)" in check.message


def test_docker_with_cdi_only(fake) -> None:
    docker_host(fake, {"features": {"cdi": True}})
    assert checks_for(guest(fake))["docker-runtime", None].status == "ok"


@pytest.mark.parametrize("ctk", [True, False])
def test_docker_without_the_nvidia_runtime_fails(fake, ctk) -> None:
    docker_host(fake, {"log-driver": "journald"}, ctk=ctk)
    check = checks_for(guest(fake))["docker-runtime", None]
    assert check.status == "fail" and "no NVIDIA runtime" in check.message
    assert "nvidia-ctk runtime configure --runtime=docker" in check.fix
    assert ("install nvidia-container-toolkit" in check.fix) is not ctk


def test_docker_with_no_daemon_json_fails(fake) -> None:
    docker_host(fake)
    check = checks_for(guest(fake))["docker-runtime", None]
    assert check.status == "fail" and "no /etc/docker/daemon.json" in check.message


def test_a_daemon_json_that_does_not_parse(fake) -> None:
    docker_host(fake, '{"runtimes": {"nvidia": ')
    check = checks_for(guest(fake))["docker-runtime", None]
    assert check.status == "fail" and "is not valid JSON" in check.message and "dockerd will not start" in check.message


def test_no_docker_is_a_skip(fake) -> None:
    check = checks_for(guest(fake))["docker-runtime", None]
    assert check.status == "skip" and "no container runtime" in check.message


# ---------------------------------------------------------------- containerd


@pytest.mark.parametrize(
    ("files", "status"),
    [
        ({"etc/containerd/config.toml": CONTAINERD_V2_NVIDIA}, "ok"),
        ({"etc/containerd/config.toml": 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n',
          "etc/containerd/conf.d/99-nvidia.toml": CONTAINERD_V3_DROPIN}, "ok"),
        ({"etc/containerd/config.toml": CONTAINERD_PLAIN + "    enable_cdi = true\n"}, "ok"),
        ({"etc/containerd/config.toml": CONTAINERD_PLAIN}, "warn"),
        ({"etc/containerd/config.toml": CONTAINERD_DOCKER_ONLY}, "skip"),
        ({"usr/bin/containerd": ""}, "skip"),
        ({}, "skip"),
    ],
)  # fmt: skip
def test_containerd_configuration(fake, files, status) -> None:
    for rel, text in files.items():
        fake.write(rel, text)
    check = checks_for(guest(fake))["containerd-runtime", None]
    assert check.status == status, check.message
    if status == "warn":
        assert "nvidia-ctk runtime configure --runtime=containerd" in check.fix


# ---------------------------------------------------------------- CDI


def test_nvidia_ctk_yaml_is_read_without_a_yaml_library() -> None:
    spec = parse_cdi(cdi_yaml(("0", 0), (ZERO_UUID, 0), ("all", 0)), "/etc/cdi/nvidia.yaml")
    assert spec.error is None and spec.kind == "nvidia.com/gpu"
    assert spec.devices == ["0", ZERO_UUID, "all"]
    assert spec.driver_versions == ["580.159.04"]


def test_a_json_cdi_spec() -> None:
    text = json.dumps({"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "0"}, {"name": "all"}]})
    spec = parse_cdi(text, "/var/run/cdi/nvidia.json")
    assert (spec.kind, spec.devices) == ("nvidia.com/gpu", ["0", "all"])


def test_a_cdi_spec_listing_every_gpu(fake) -> None:
    docker_host(fake, DAEMON_NVIDIA)
    fake.write("etc/cdi/nvidia.yaml", cdi_yaml(("0", 0), (ZERO_UUID, 0), ("all", 0)))
    check = checks_for(guest(fake))["cdi-spec", None]
    assert check.status == "ok" and "/etc/cdi/nvidia.yaml lists every GPU seen (1)" in check.message


def test_a_cdi_spec_missing_a_gpu_fails(fake) -> None:
    docker_host(fake, DAEMON_NVIDIA)
    fake.write("var/run/cdi/nvidia.yaml", cdi_yaml(("0", 0), (ZERO_UUID, 0), ("all", 0)))
    guest(fake)
    fake.pci("0000:00:07.0", cls=0x030200, driver="nvidia", reset="flr")
    nvml = FakeNvml(FakeGpu(), FakeGpu(uuid=UUID1, bus_id="00000000:00:07.0"))
    check = checks_for(fake.root, nvml=nvml)["cdi-spec", None]
    assert check.status == "fail" and "no device for GPU 1" in check.message
    assert check.fix.endswith("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")


def test_a_cdi_spec_with_a_gpu_that_went_away_warns(fake) -> None:
    docker_host(fake, DAEMON_NVIDIA)
    fake.write("etc/cdi/nvidia.yaml", cdi_yaml(("0", 0), ("1", 1), (ZERO_UUID, 0), (UUID1, 1), ("all", 0)))
    check = checks_for(guest(fake))["cdi-spec", None]
    assert check.status == "warn" and f"1, {UUID1}" in check.message


def test_a_cdi_spec_for_an_older_driver_fails(fake) -> None:
    docker_host(fake, DAEMON_NVIDIA)
    fake.write("etc/cdi/nvidia.yaml", cdi_yaml(("0", 0), ("all", 0), version="570.133.20"))
    check = checks_for(guest(fake))["cdi-spec", None]
    assert check.status == "fail" and "generated for driver 570.133.20, but 580.159.04 is loaded" in check.message


def test_no_cdi_spec_with_a_runtime_warns(fake) -> None:
    docker_host(fake, DAEMON_NVIDIA)
    check = checks_for(guest(fake))["cdi-spec", None]
    assert check.status == "warn" and check.fix == "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def test_a_file_in_the_cdi_directory_that_is_not_a_spec_fails(fake) -> None:
    docker_host(fake, DAEMON_NVIDIA)
    fake.write("etc/cdi/nvidia.yaml", "hello: world\n")
    check = checks_for(guest(fake))["cdi-spec", None]
    assert check.status == "fail" and "not a CDI spec" in check.message


# ---------------------------------------------------------------- the container run (fake docker SDK)


class DockerException(Exception):
    pass


class APIError(DockerException):
    def __init__(self, message: str, explanation: str | None = None) -> None:
        super().__init__(message)
        self.explanation = explanation


class ImageNotFound(APIError):
    pass


class FakeEngine:
    """The parts of the docker SDK's DockerClient that verify calls."""

    def __init__(self, *, runtimes=("runc", "nvidia"), images=None, output=None, exit_code=0, start_error=None):
        self.runtimes = runtimes
        self.local = images if images is not None else [("nvidia/cuda:12.4.1-base-ubuntu22.04", 250)]
        self.output = output if output is not None else f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {ZERO_UUID})\n"
        self.exit_code, self.start_error = exit_code, start_error
        self.created: list[dict[str, Any]] = []
        self.removed = 0
        self.images = SimpleNamespace(get=self._get, list=self._list)
        self.containers = SimpleNamespace(create=self._create)

    def ping(self) -> bool:
        return True

    def info(self) -> dict[str, Any]:
        return {"ServerVersion": "28.2.2", "Runtimes": {r: {} for r in self.runtimes}}

    def _get(self, name: str) -> Any:
        if name not in [n for n, _ in self.local]:
            raise ImageNotFound(f"404 Client Error: No such image: {name}")
        return SimpleNamespace(tags=[name])

    def _list(self) -> list[Any]:
        return [SimpleNamespace(tags=[n], attrs={"Size": size}) for n, size in self.local]

    def _create(self, image: str, command: list[str], **kwargs: Any) -> Any:
        self.created.append({"image": image, "command": command, **kwargs})
        engine = self

        class Container:
            def start(self) -> None:
                if engine.start_error:
                    raise APIError("500 Server Error", engine.start_error)

            def wait(self, timeout: float) -> dict[str, int]:
                return {"StatusCode": engine.exit_code}

            def logs(self) -> bytes:
                return engine.output.encode()

            def remove(self, force: bool) -> None:
                engine.removed += 1

        return Container()


def fake_docker(engine: FakeEngine | None) -> Any:
    def from_env(timeout: int) -> FakeEngine:
        if engine is None:
            raise DockerException(
                "Error while fetching server API version: ('Connection aborted.', "
                "FileNotFoundError(2, 'No such file or directory'))"
            )
        return engine

    return SimpleNamespace(
        from_env=from_env,
        errors=SimpleNamespace(DockerException=DockerException, APIError=APIError, ImageNotFound=ImageNotFound),
        types=SimpleNamespace(DeviceRequest=lambda **kw: SimpleNamespace(**kw)),
    )


def test_a_container_that_sees_the_gpu(fake) -> None:
    engine = FakeEngine()
    docker_host(fake, DAEMON_NVIDIA)
    facts, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), docker=fake_docker(engine))
    run = checks["container-run", None]
    assert run.status == "ok" and "nvidia/cuda:12.4.1-base-ubuntu22.04 sees 1 GPU(s)" in run.message
    (created,) = engine.created
    assert created["command"] == ["nvidia-smi", "-L"] and created["network_disabled"] is True
    (request,) = created["device_requests"]
    assert (request.count, request.capabilities) == (-1, [["gpu"]])
    assert engine.removed == 1
    assert checks["docker-runtime", None].message == "the running Docker engine has the nvidia runtime"
    assert facts.container.gpus == [f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {ZERO_UUID})"]


def test_no_engine_is_a_clean_skip(fake) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), docker=fake_docker(None))
    run = checks["container-run", None]
    assert run.status == "skip" and run.message.startswith("no container runtime")


def test_an_engine_without_the_nvidia_runtime(fake) -> None:
    engine = FakeEngine(runtimes=("runc",), start_error='could not select device driver "" with capabilities: [[gpu]]')
    docker_host(fake, DAEMON_NVIDIA)  # configured, but the engine was not restarted
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), docker=fake_docker(engine))
    run = checks["container-run", None]
    assert run.status == "fail" and "could not select device driver" in run.message
    assert "nvidia-ctk runtime configure --runtime=docker" in run.fix
    assert engine.removed == 1
    runtime = checks["docker-runtime", None]
    assert runtime.status == "warn" and "restart Docker" in runtime.fix


def test_a_container_that_sees_fewer_gpus_warns(fake) -> None:
    guest(fake)
    fake.pci("0000:00:07.0", cls=0x030200, driver="nvidia", reset="flr")
    nvml = FakeNvml(FakeGpu(), FakeGpu(uuid=UUID1, bus_id="00000000:00:07.0"))
    _, checks = verify(fake.root, nvml=nvml, docker=fake_docker(FakeEngine()))
    assert checks["container-run", None].status == "warn"


def test_a_named_image_that_is_not_here_fails_and_nothing_is_pulled(fake) -> None:
    engine = FakeEngine()
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), docker=fake_docker(engine), image="nvidia/cuda:13.0")
    run = checks["container-run", None]
    assert run.status == "fail" and "nothing is pulled" in run.message and "docker load" in run.fix
    assert engine.created == []


def test_nvidia_smi_failing_in_the_container(fake) -> None:
    engine = FakeEngine(output="Failed to initialize NVML: Unknown Error\n", exit_code=255)
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), docker=fake_docker(engine))
    run = checks["container-run", None]
    assert run.status == "fail" and "exited 255: Failed to initialize NVML" in run.message


def test_no_local_image_is_a_skip(fake) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), docker=fake_docker(FakeEngine(images=[])))
    run = checks["container-run", None]
    assert run.status == "skip" and "--image" in run.message


def test_the_default_image_prefers_cuda_then_a_glibc_distribution() -> None:
    def images(*pairs: tuple[str, int]) -> list[Any]:
        return [SimpleNamespace(tags=[t], attrs={"Size": s}) for t, s in pairs]

    assert pick_image(images(("busybox:latest", 4), ("debian:12", 100), ("nvidia/cuda:12.4-base", 250))) == (
        "nvidia/cuda:12.4-base"
    )
    assert pick_image(images(("busybox:latest", 4), ("ubuntu:24.04", 80), ("debian:12", 100))) == "ubuntu:24.04"
    assert pick_image(images(("alpine:3", 7), ("gpuprov-molecule-debian12:abc", 117))) == (
        "gpuprov-molecule-debian12:abc"
    )
    assert pick_image(images(("alpine:3", 7))) is None
    assert pick_image([SimpleNamespace(tags=[], attrs={})]) is None


def test_no_container_option_and_no_gpu(fake) -> None:
    engine = FakeEngine()
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), docker=fake_docker(engine), run_container=False)
    assert checks["container-run", None].message == "not asked to (--no-container)"
    _, checks = verify(fake.root, nvml=FakeNvml(), docker=fake_docker(engine))
    assert "no GPU seen" in checks["container-run", None].message
    assert engine.created == []


# ---------------------------------------------------------------- a real engine, where one answers


@pytest.mark.slow
def test_a_real_engine_without_nvidia_runtime_refuses_the_gpu() -> None:
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=10)
        client.ping()
        before = len(client.containers.list(all=True))
    except docker.errors.DockerException:
        pytest.skip("no Docker engine here")
    run = run_gpu_container(docker, None, timeout=60)
    if run.image is None:
        pytest.skip("no local image to run")
    if "nvidia" in (run.engine_runtimes or []):
        pytest.skip("this engine has the nvidia runtime")
    assert run.engine and run.status == "fail", run
    assert "could not select device driver" in run.message
    assert len(client.containers.list(all=True)) == before, "the container was not removed"
