"""gpuprov verify's container checks: Docker and containerd runtime
configuration and CDI specs in temp roots, the container run through the Docker Engine API
against a fake engine on a unix socket (and against this machine's real engine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprov.facts.containers import parse_cdi
from gpuprov.facts.docker_api import MAX_SUN_PATH, DockerEngine, find_engine
from gpuprov.verify.checks import Check
from gpuprov.verify.container import CONTAINER_PATH, pick_image, run_gpu_container
from tests.fakedocker import FakeDockerd
from tests.fakehost import FakeHost
from tests.verify.test_verify_nvml import ZERO_UUID, FakeGpu, FakeNvml, guest, verify

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


def test_a_shared_gpus_tenant_devices_are_no_gpu_gone_away(fake) -> None:
    """guest_sharing's tenant devices (MPS clients under a tenant's name) are not read as GPUs that went away:
    the toolkit's step would regenerate the spec on that warning, and the two would undo each other."""
    docker_host(fake, DAEMON_NVIDIA)
    client = {"deviceNodes": [{"path": "/dev/nvidia0"}], "env": ["CUDA_MPS_PIPE_DIRECTORY=/run/gpuprov/mps/g/pipe"]}
    devices = [{"name": n, "containerEdits": client} for n in ("0", ZERO_UUID, "all", "g-big", "g-small")]
    fake.write("etc/cdi/nvidia.yaml", json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}))
    check = checks_for(guest(fake))["cdi-spec", None]
    assert check.status == "ok", check.message
    devices.append({"name": "stray", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1"}]}})
    fake.write("etc/cdi/nvidia.yaml", json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices}))
    check = checks_for(guest(fake))["cdi-spec", None]
    assert check.status == "warn" and "stray" in check.message and "g-big" not in check.message


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


# ---------------------------------------------------------------- the container run (a fake engine on a socket)


@pytest.fixture
def dockerd(tmp_path_factory) -> Iterator[Callable[..., FakeDockerd]]:
    made: list[FakeDockerd] = []

    def make(**kwargs: Any) -> FakeDockerd:
        kwargs.setdefault("output", f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {ZERO_UUID})\n")
        engine = FakeDockerd(tmp_path_factory.mktemp("engine") / "docker.sock", **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


def client(engine: FakeDockerd | None) -> DockerEngine | None:
    return None if engine is None else DockerEngine(engine.socket_path, timeout=10)


def test_a_container_that_sees_the_gpu_through_the_nvidia_runtime(fake, dockerd) -> None:
    engine = dockerd()
    docker_host(fake, DAEMON_NVIDIA)
    facts, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine))
    run = checks["container-run", None]
    assert run.status == "ok", run
    assert run.message == (
        "a container from nvidia/cuda:12.4.1-base-ubuntu22.04 sees 1 GPU(s) through the nvidia runtime "
        f"(NVIDIA_VISIBLE_DEVICES=all): {ZERO_UUID} (every GPU here)"
    )
    (created,) = engine.created
    assert created["Cmd"] == ["nvidia-smi", "-L"] and created["NetworkDisabled"] is True
    assert created["HostConfig"]["Runtime"] == "nvidia" and "DeviceRequests" not in created["HostConfig"]
    assert created["Env"] == ["NVIDIA_VISIBLE_DEVICES=all", f"PATH={CONTAINER_PATH}"]
    assert engine.removed == 1
    assert checks["docker-runtime", None].message == "the running Docker engine has the nvidia runtime"
    assert facts.container.uuids == [ZERO_UUID]


def test_native_cdi_when_the_engine_has_no_nvidia_runtime(fake, dockerd) -> None:
    engine = dockerd(runtimes=("runc",), cdi_dirs=["/etc/cdi", "/var/run/cdi"])
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine))
    assert checks["container-run", None].status == "ok"
    (created,) = engine.created
    assert created["HostConfig"]["DeviceRequests"] == [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]
    assert "Runtime" not in created["HostConfig"]


def test_no_engine_is_a_clean_skip(fake) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=None)
    run = checks["container-run", None]
    assert run.status == "skip" and run.message.startswith("no container runtime")


def test_a_socket_nobody_answers_is_a_skip(fake, tmp_path) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=DockerEngine(str(tmp_path / "gone.sock")))
    run = checks["container-run", None]
    assert run.status == "skip" and "no Docker engine answers" in run.message


def test_an_engine_without_the_nvidia_runtime_and_cdi_falls_back_to_gpus_all(fake, dockerd) -> None:
    engine = dockerd(runtimes=("runc",), start_error='could not select device driver "" with capabilities: [[gpu]]')
    docker_host(fake, DAEMON_NVIDIA)  # configured, but the engine was not reloaded
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine))
    run = checks["container-run", None]
    assert run.status == "fail" and "could not select device driver" in run.message
    assert "nvidia-ctk runtime configure --runtime=docker" in run.fix
    assert engine.created[0]["HostConfig"]["DeviceRequests"] == [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
    assert engine.removed == 1
    runtime = checks["docker-runtime", None]
    # No systemd in this root: the fix is dockerd's own reload, not systemctl.
    assert runtime.status == "warn" and runtime.fix.startswith("restart Docker: kill -HUP $(cat /var/run/docker.pid)")


def test_the_fix_names_systemctl_where_systemd_runs(fake, dockerd) -> None:
    engine = dockerd(runtimes=("runc",))
    docker_host(fake, DAEMON_NVIDIA)
    fake.write("run/systemd/system/.keep", "")
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine))
    assert checks["docker-runtime", None].fix == "restart Docker: systemctl restart docker"


def test_a_container_that_sees_fewer_gpus_warns_naming_the_unseen(fake, dockerd) -> None:
    guest(fake)
    fake.pci("0000:00:07.0", cls=0x030200, driver="nvidia", reset="flr")
    nvml = FakeNvml(FakeGpu(), FakeGpu(uuid=UUID1, bus_id="00000000:00:07.0"))
    _, checks = verify(fake.root, nvml=nvml, engine=client(dockerd()))
    run = checks["container-run", None]
    assert run.status == "warn" and f"not seen {UUID1}" in run.message


def test_a_stale_cdi_spec_is_named_with_its_fix(fake, dockerd) -> None:
    engine = dockerd(start_error="unresolvable CDI devices nvidia.com/gpu=all")
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine))
    run = checks["container-run", None]
    assert run.status == "fail" and "it is stale" in run.message
    assert run.fix == "regenerate it: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def test_a_named_image_that_is_not_here_fails_and_nothing_is_pulled(fake, dockerd) -> None:
    engine = dockerd()
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine), image="nvidia/cuda:13.0")
    run = checks["container-run", None]
    assert run.status == "fail" and "nothing is pulled" in run.message and "docker load" in run.fix
    assert engine.created == []


def test_nvidia_smi_failing_in_the_container(fake, dockerd) -> None:
    engine = dockerd(output="Failed to initialize NVML: Unknown Error\n", exit_code=255)
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine))
    run = checks["container-run", None]
    assert run.status == "fail" and "exited 255: Failed to initialize NVML" in run.message


def test_no_local_image_is_a_skip(fake, dockerd) -> None:
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(dockerd(images=[])))
    run = checks["container-run", None]
    assert run.status == "skip" and "--image" in run.message


def test_the_default_image_prefers_cuda_then_a_glibc_distribution() -> None:
    assert pick_image([(4, "busybox:latest"), (100, "debian:12"), (250, "nvidia/cuda:12.4-base")]) == (
        "nvidia/cuda:12.4-base"
    )
    assert pick_image([(4, "busybox:latest"), (80, "ubuntu:24.04"), (100, "debian:12")]) == "ubuntu:24.04"
    assert pick_image([(7, "alpine:3"), (117, "gpuprov-molecule-debian12:abc")]) == "gpuprov-molecule-debian12:abc"
    assert pick_image([(7, "alpine:3")]) is None
    assert pick_image([]) is None


def test_no_container_option_and_no_gpu(fake, dockerd) -> None:
    engine = dockerd()
    _, checks = verify(guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine), run_container=False)
    assert checks["container-run", None].message == "not asked to (--no-container)"
    _, checks = verify(fake.root, nvml=FakeNvml(), engine=client(engine))
    assert "no GPU seen" in checks["container-run", None].message
    assert engine.created == []


# ---------------------------------------------------------------- the bench inside a container


class FakeBackend:
    """A bench backend as gather sees it: (name, module) with a module file to mount."""

    def __init__(self, site: Path) -> None:
        (site / "torch").mkdir(parents=True)
        (site / "torch/__init__.py").write_text("")
        self.__file__ = str(site / "torch/__init__.py")


def test_the_bench_in_a_container_is_set_against_the_guests(fake, dockerd, tmp_path, monkeypatch) -> None:
    from gpuprov.verify import bench as bench_module
    from gpuprov.verify.bench import BenchResult

    uuid = ZERO_UUID.removeprefix("GPU-")
    inside = {"uuid": uuid, "h2d_gbps": 54.0, "d2h_gbps": 50.0, "matmul_tflops": 780.0}
    engine = dockerd(bench_output=json.dumps({"backend": "torch", "results": [inside]}) + "\n")

    calls: list[Any] = []

    def guest_bench(backend: Any, gpus: Any, **kwargs: Any) -> list[BenchResult]:
        calls.append(kwargs)
        figures = {"h2d_gbps": 55.0, "d2h_gbps": 55.0, "matmul_tflops": 785.0}
        return [BenchResult(0, "NVIDIA H100 80GB HBM3", 0, "torch", uuid=uuid, **figures)]

    monkeypatch.setattr(bench_module, "run_bench", guest_bench)
    backend = ("torch", FakeBackend(tmp_path / "site"))
    _facts, checks = verify(
        guest(fake), nvml=FakeNvml(FakeGpu()), engine=client(engine), bench=True, bench_backend=backend
    )
    # The container's bench and the guest's alternate, three rounds each.
    assert len(engine.created) == 4 and len(calls) == 3  # the first guest round is the bench the checks report
    bench_run = engine.created[1]
    assert bench_run["Cmd"] == ["python3", "/opt/gpuprov-bench/bench.py"]
    assert bench_run["HostConfig"]["Runtime"] == "nvidia"
    binds = bench_run["HostConfig"]["Binds"]
    assert binds[1] == f"{tmp_path / 'site'}:{tmp_path / 'site'}:ro" and binds[0].endswith(":/opt/gpuprov-bench:ro")
    check = checks["bench-container", 0]
    # 54/55, 50/55 and 780/785: the device->host copy is 0.91 of the guest's, under the line.
    assert check.status == "warn"
    assert check.message == (
        "GPU 0 in a container / on the guest, medians of 3 alternated rounds: host->device 0.98, device->host 0.91, "
        "matmul 0.99 (goal 0.97)"
    )


def test_the_bench_script_runs_alone_without_gpuprov(tmp_path) -> None:
    """What the container runs: bench.py as a script, no package around it (here: no CUDA, so it says so)."""
    import subprocess
    import sys

    from gpuprov.verify.container import _bench_source

    script = tmp_path / "bench.py"
    script.write_text(_bench_source())
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "nothing")}
    done = subprocess.run([sys.executable, "-I", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {"error": "neither torch with CUDA nor cupy imports here"}


# ---------------------------------------------------------------- a real engine, where one answers


@pytest.mark.slow
def test_a_real_engine_without_nvidia_runtime_refuses_the_gpu() -> None:
    """This machine's Docker engine (scripts/test.sh starts one): no NVIDIA runtime, no CDI, so the
    legacy request is refused as users see it, and the container is removed."""
    engine = find_engine("/")
    if engine is None or not engine.ping():
        pytest.skip("no Docker engine here")
    before = len(engine.call("GET", "/containers/json?all=1"))
    run = run_gpu_container(engine, None, timeout=60)
    if run.image is None:
        pytest.skip("no local image to run")
    if "nvidia" in (run.engine_runtimes or []):
        pytest.skip("this engine has the nvidia runtime")
    assert run.engine and run.status == "fail", run
    assert "could not select device driver" in run.message
    assert len(engine.call("GET", "/containers/json?all=1")) == before, "the container was not removed"


def test_an_engine_socket_deeper_than_sockaddr_un_allows_is_still_reached(tmp_path) -> None:
    """A guest staged under a deep folder: its socket's path is over unix(7)'s 107 bytes."""
    deep = tmp_path.joinpath(*["a-folder-name-of-some-length"] * 5)
    deep.mkdir(parents=True)
    engine = FakeDockerd(deep / "docker.sock")
    try:
        assert len(engine.socket_path) > MAX_SUN_PATH and (deep / "docker.sock").is_socket()
        assert DockerEngine(engine.socket_path, timeout=10).ping() is True
    finally:
        engine.close()
