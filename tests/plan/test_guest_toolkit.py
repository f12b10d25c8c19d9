"""The guest's container toolkit: facts (gpuprov.facts.guest_toolkit), the planner
(gpuprov.plan.guest.toolkit) on small fake guests, and the module guest_toolkit in process
(tests/modrun.py; staged roots: commands are reported, never run)."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuprov.core.plan import COMMAND
from gpuprov.facts.containers import GENERATE_CDI, parse_cdi
from gpuprov.facts.guest_toolkit import (
    APT_SOURCE,
    OFFLINE_SOURCE,
    GuestToolkitFacts,
    read_guest_toolkit,
)
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.guest.toolkit import (
    GuestToolkitOptions,
    GuestToolkitPlan,
    Key,
    apt_source_text,
    deb_architecture,
    filter_cdi_spec,
    plan_guest_toolkit,
)
from tests.conftest import tree_digest
from tests.fakedocker import FakeDockerd
from tests.fakehost import FakeHost
from tests.modrun import run_in_process

GPU = "0000:00:06.0"
DRIVER = "580.159.04"
KEYRING = "etc/apt/keyrings/nvidia-container-toolkit.gpg"
REPO_URL = "https://nvidia.github.io/libnvidia-container/stable"
RUNTIME_CONFIG = "etc/nvidia-container-runtime/config.toml"
CDI_MODE = '[nvidia-container-runtime]\nmode = "cdi"\n'
DAEMON_JSON = '{"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}\n'
CONTAINERD_TOML = (
    'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n  runtime_type = "x"\n'
)
KeyData = dict[str, Any]  # armored, binary (bytes), fpr (str)
CONTAINERD_PLAIN = 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "overlayfs"\n'


def cdi_spec(devices: list[str], version: str = DRIVER) -> str:
    lines = ["cdiVersion: 0.5.0", "kind: nvidia.com/gpu", "devices:"]
    for name in devices:
        lines += [f'- name: "{name}"', "  containerEdits:", "    deviceNodes:", "    - path: /dev/nvidia0"]
    lines += ["containerEdits:", "  mounts:", f"  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.{version}"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def key(gpg_key: KeyData) -> KeyData:
    """The repository key made by gpg (tests/plan/conftest.py)."""
    return gpg_key


def guest(
    root: Path,
    *,
    os_release: str = 'ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n',
    packages: tuple[str, ...] = (),
    driver: bool = True,
) -> FakeHost:
    fake = FakeHost(root, iommu=False)
    fake.write("etc/os-release", os_release)
    fake.pci(GPU, cls=0x030200, driver="nvidia" if driver else None)
    if driver:
        fake.write("proc/driver/nvidia/version", f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {DRIVER}\n")
        fake.write("sys/module/nvidia/version", DRIVER + "\n")
        fake.write("proc/modules", "nvidia 14299136 - - Live 0xffffffffc0400000 (O)\n")
    dpkg(fake, *packages)
    return fake


def dpkg(fake: FakeHost, *names: str) -> None:
    versions = [[*n.split("=", 1), "1.17.8-1"][:2] for n in names]  # "name" or "name=version"
    stanzas = [f"Package: {n}\nStatus: install ok installed\nVersion: {v}\n" for n, v in versions]
    fake.write(
        "var/lib/dpkg/status", "\n".join(["Package: bash\nStatus: install ok installed\nVersion: 5.2\n", *stanzas])
    )


def binary(fake: FakeHost, name: str) -> None:
    fake.write(f"usr/bin/{name}", "#!/bin/sh\n")


def converged(root: Path, key: KeyData) -> FakeHost:
    """A guest the role has converged: repository, Docker and containerd configured, a current CDI spec."""
    fake = guest(root, packages=("nvidia-container-toolkit-base", "docker.io"))
    for name in ("dockerd", "containerd", "nvidia-ctk", "nvidia-container-runtime", "iptables"):
        binary(fake, name)
    fake.write(RUNTIME_CONFIG, CDI_MODE)
    fake.write(KEYRING, key["binary"])
    fake.write(APT_SOURCE, apt_source_text(REPO_URL, "amd64", KEYRING))
    fake.write("etc/docker/daemon.json", DAEMON_JSON)
    fake.write("etc/containerd/config.toml", CONTAINERD_TOML)
    fake.write("etc/cdi/nvidia.yaml", cdi_spec(["0", "all"]))
    for rel in (KEYRING, APT_SOURCE):
        os.chmod(root / rel, 0o644)
    return fake


def opts_for(key: KeyData, **kw: Any) -> GuestToolkitOptions:
    return GuestToolkitOptions(key=Key(key["binary"], [key["fpr"]]), **kw)


def plan_for(root: Path, opts: GuestToolkitOptions, **kw: Any) -> tuple[GuestToolkitFacts, GuestToolkitPlan]:
    facts = read_guest_toolkit(
        Sysfs(str(root)), managed=[KEYRING, APT_SOURCE, OFFLINE_SOURCE], architecture="amd64", **kw
    )
    return facts, plan_guest_toolkit(facts, opts)


def commands(plan: GuestToolkitPlan) -> list[str]:
    return [" ".join(a.argv) for a in plan.actions if a.kind == COMMAND]


# ---------------------------------------------------------------- the planner


def test_a_converged_guest_owes_nothing(tmp_path: Path, key: KeyData) -> None:
    converged(tmp_path, key)
    facts, plan = plan_for(tmp_path, opts_for(key))
    assert facts.engines["docker"].binary == "/usr/bin/dockerd" and facts.toolkit.nvidia_ctk == "/usr/bin/nvidia-ctk"
    assert plan.actions == [] and not plan.refused and plan.installs == []
    assert {c["id"]: c["status"] for c in plan.checks} == {
        "docker-runtime": "ok",
        "containerd-runtime": "ok",
        "cdi-spec": "ok",
    }


def test_a_fresh_guest_plans_everything_the_role_did_in_order(tmp_path: Path, key: KeyData) -> None:
    guest(tmp_path)
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert not plan.refused, plan.refusal_text()
    assert plan.describe()[:2] == [
        f"create /{KEYRING} (apt keyring, key {key['fpr']})",
        f"create /{APT_SOURCE} (NVIDIA's repository, signed by that key only)",
    ]
    assert commands(plan) == [
        "env DEBIAN_FRONTEND=noninteractive apt-get update",
        "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -- docker.io",
        "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -- "
        "nvidia-container-toolkit-base",
        # CDI first: the nvidia runtime in CDI mode; Docker comes with this plan, so its runtime is owed
        # too; the CDI spec (driver loaded, none there).
        "nvidia-ctk config --in-place --set nvidia-container-runtime.mode=cdi",
        "nvidia-ctk runtime configure --runtime=docker",
        "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
    ]
    assert plan.installs == ["docker.io", "nvidia-container-toolkit-base"]
    assert plan.configure == ["docker"] and plan.cdi is not None and "no CDI spec" in plan.cdi
    source = next(a for a in plan.actions if a.path == APT_SOURCE).content
    assert f"URIs: {REPO_URL}/deb/amd64\n" in source and f"Signed-By: /{KEYRING}\n" in source


def test_a_key_rotated_upstream_rewrites_the_keyring_only(tmp_path: Path, key: KeyData) -> None:
    fake = converged(tmp_path, key)
    fake.write(KEYRING, b"\x99old key bytes")
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert plan.describe() == [f"update /{KEYRING} (apt keyring, key {key['fpr']})"]
    # A keyring of another mode is written again too (apt reads it as _apt).
    converged(tmp_path, key)
    os.chmod(tmp_path / KEYRING, 0o600)
    assert len(plan_for(tmp_path, opts_for(key))[1].actions) == 1


@pytest.mark.parametrize(
    ("daemon", "containerd", "configure"),
    [
        ("{}\n", CONTAINERD_TOML, ["docker"]),
        (DAEMON_JSON, CONTAINERD_PLAIN, ["containerd"]),
        ('{"features": {"cdi": true}}\n', CONTAINERD_PLAIN, ["containerd"]),  # Docker's CDI is enough
        ("{}\n", CONTAINERD_PLAIN.replace("version = 2", 'disabled_plugins = ["cri"]'), ["docker"]),  # Docker's own
    ],
)
def test_runtimes_are_configured_as_gpuprov_verify_judges_them(
    tmp_path: Path, key: KeyData, daemon: str, containerd: str, configure: list[str]
) -> None:
    fake = converged(tmp_path, key)
    fake.write("etc/docker/daemon.json", daemon)
    fake.write("etc/containerd/config.toml", containerd)
    _facts, plan = plan_for(tmp_path, opts_for(key, runtimes=["docker", "containerd"]))
    assert plan.configure == configure
    assert commands(plan) == [f"nvidia-ctk runtime configure --runtime={rt}" for rt in configure]
    # By default only the engines the guest runs or is given: Docker is here; no containerd service runs.
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert plan.configure == [rt for rt in configure if rt == "docker"]
    # Only those asked for.
    _facts, plan = plan_for(tmp_path, opts_for(key, runtimes=["containerd"]))
    assert plan.configure == [rt for rt in configure if rt == "containerd"]


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        (None, "no CDI spec for nvidia.com/gpu"),
        (cdi_spec(["0", "all"], version="535.54.03"), "was generated for driver 535.54.03"),
        ('{"kind": "nvidia.com/gpu", "devices": [', "/etc/cdi/nvidia.yaml: not valid JSON"),
    ],
)
def test_the_cdi_spec_is_generated_when_gpuprov_verify_finds_it_wrong(
    tmp_path: Path, key: KeyData, spec: str | None, why: str
) -> None:
    converged(tmp_path, key)
    if spec is None:
        (tmp_path / "etc/cdi/nvidia.yaml").unlink()
    else:
        (tmp_path / "etc/cdi/nvidia.yaml").write_text(spec)
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert commands(plan) == [GENERATE_CDI] and why in (plan.cdi or "")
    assert plan_for(tmp_path, opts_for(key, cdi=False))[1].actions == []


def test_a_gpu_missing_from_the_spec_regenerates_it(tmp_path: Path, key: KeyData) -> None:
    from gpuprov.facts.gpus import GpuInfo, GpuList

    converged(tmp_path, key)
    gpus = GpuList(
        "nvml", DRIVER, "13.0", [GpuInfo(i, "H100", f"GPU-{i}", GPU, memory_total_mib=81559) for i in (0, 1)]
    )
    _facts, plan = plan_for(tmp_path, opts_for(key), gpu_list=gpus)
    assert commands(plan) == [GENERATE_CDI] and "no device for GPU 1" in (plan.cdi or "")


HOST_GPUS = ("0000:41:00.0", "0000:81:00.0")  # the first kept for the host's containers, the second for vGPU


def host_gpu_list() -> Any:
    from gpuprov.facts.gpus import GpuInfo, GpuList

    return GpuList("nvml", DRIVER, "13.0", [GpuInfo(i, "H100", f"GPU-{i}", a, 81559) for i, a in enumerate(HOST_GPUS)])


def test_a_host_keeps_only_its_own_gpus_in_the_cdi_spec(tmp_path: Path, key: KeyData) -> None:
    """Issue 25: on a GPU host the spec holds only the GPUs declared use: host, never a vGPU or passthrough one."""
    converged(tmp_path, key)  # its spec names GPU 0 and "all"
    opts = opts_for(key, cdi_gpus=["41:00.0"])
    _facts, plan = plan_for(tmp_path, opts, gpu_list=host_gpu_list())
    assert commands(plan) == [] and plan.cdi is None  # GPU 0 is the host's and is in the spec; GPU 1 is not
    # A spec that holds the vGPU host's GPU too is regenerated: every GPU to a staging file, then only the host's.
    (tmp_path / "etc/cdi/nvidia.yaml").write_text(cdi_spec(["0", "1", "all"]))
    _facts, plan = plan_for(tmp_path, opts, gpu_list=host_gpu_list())
    assert "holds GPU 1 (0000:81:00.0), which this host does not keep" in (plan.cdi or "")
    assert commands(plan) == ["nvidia-ctk cdi generate --format=json --output=/var/lib/gpuprov/cdi/nvidia-all.json"]
    assert plan.cdi_keep == ["0", "GPU-0"] and plan.cdi_drop == ["1", "GPU-1"]
    # A guest (cdi_gpus unset) wants every GPU the driver shows.
    _facts, plan = plan_for(tmp_path, opts_for(key), gpu_list=host_gpu_list())
    assert plan.cdi is None
    # An address that is not one is refused at the boundary.
    _facts, plan = plan_for(tmp_path, opts_for(key, cdi_gpus=["0000:41:00.0\n"]), gpu_list=host_gpu_list())
    assert plan.refused and "cdi_gpus: '0000:41:00.0\\n' is not a PCI address" in plan.refusal_text()


def test_the_host_spec_keeps_the_host_gpus_and_all_stands_for_them_only() -> None:
    def node(n: int) -> dict[str, Any]:
        return {"path": f"/dev/nvidia{n}", "major": 195, "minor": n}

    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": "0", "containerEdits": {"deviceNodes": [node(0)]}},
            {"name": "1", "containerEdits": {"deviceNodes": [node(1)]}},
            {"name": "0:1", "containerEdits": {"deviceNodes": [node(0)]}},  # a MIG device of GPU 0
            {"name": "GPU-0", "containerEdits": {"deviceNodes": [node(0)]}},
            {"name": "GPU-1", "containerEdits": {"deviceNodes": [node(1)]}},
            {"name": "all", "containerEdits": {"deviceNodes": [node(0), node(1)]}},
        ],
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }
    out = json.loads(filter_cdi_spec(json.dumps(spec), ["0", "GPU-0"], ["1", "GPU-1"]))
    assert [d["name"] for d in out["devices"]] == ["0", "0:1", "GPU-0", "all"]
    assert out["devices"][-1]["containerEdits"]["deviceNodes"] == [node(0)]
    assert out["containerEdits"] == spec["containerEdits"] and out["kind"] == "nvidia.com/gpu"
    # What gpuprov verify reads of it: the host's GPU, by index and UUID.
    parsed = parse_cdi(json.dumps(out), "/etc/cdi/nvidia.yaml")
    assert parsed.error is None and sorted(parsed.devices) == ["0", "0:1", "GPU-0", "all"]
    with pytest.raises(ValueError):
        filter_cdi_spec("[" * 100_000, ["0"], [])
    with pytest.raises(ValueError):
        filter_cdi_spec('{"devices": 5}', ["0"], [])


def test_cdi_owed_without_the_driver_is_refused_and_nothing_else_runs(tmp_path: Path, key: KeyData) -> None:
    fake = guest(tmp_path, driver=False)
    binary(fake, "dockerd")
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert plan.refused and plan.actions == []
    assert (
        "the NVIDIA driver is not loaded, so nvidia-ctk cannot list the GPUs; fix: run the guest_nvidia_driver role "
        "first (and reboot if it says so), then this role again" in plan.refusal_text()
    )


def test_the_runtime_part_without_nvidia_ctk_refuses_naming_the_fix(tmp_path: Path, key: KeyData) -> None:
    fake = guest(tmp_path)
    binary(fake, "dockerd")
    _facts, plan = plan_for(tmp_path, opts_for(key, parts=["runtime"], cdi=False))
    assert plan.refused and plan.actions == []
    assert plan.refusal_text() == (
        "refused, nothing changed: nvidia-ctk is not on this guest although nvidia-container-toolkit-base should be "
        "installed; fix: check that the package provides /usr/bin/nvidia-ctk (nvidia-container-toolkit-base), "
        "or install it by hand"
    )
    # With nvidia-ctk there: the runtime in CDI mode, Docker as the checks judge it (no daemon.json: fail), and
    # this guest has no iptables: Docker's daemon.json without netfilter and bridge, written before nvidia-ctk.
    binary(fake, "nvidia-ctk")
    _facts, plan = plan_for(tmp_path, opts_for(key, parts=["runtime"], cdi=False))
    assert commands(plan) == [
        "nvidia-ctk config --in-place --set nvidia-container-runtime.mode=cdi",
        "nvidia-ctk runtime configure --runtime=docker",
    ]
    daemon = plan.actions[0]
    assert daemon.path == "etc/docker/daemon.json" and json.loads(daemon.content) == {
        "bridge": "none",
        "ip6tables": False,
        "iptables": False,
    }
    # With iptables, nothing to say about netfilter; with the legacy hook, the runtime's mode is left alone.
    binary(fake, "iptables")
    _facts, plan = plan_for(tmp_path, opts_for(key, parts=["runtime"], cdi=False, legacy_hook=True))
    assert commands(plan) == ["nvidia-ctk runtime configure --runtime=docker"] and len(plan.actions) == 1


def test_invalid_daemon_json_is_refused_not_handed_to_nvidia_ctk(tmp_path: Path, key: KeyData) -> None:
    fake = converged(tmp_path, key)
    fake.write("etc/docker/daemon.json", "{not json")
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert plan.refused and "/etc/docker/daemon.json is not valid JSON" in plan.refusal_text()
    assert "fix the JSON" in plan.refusal_text()


def running(fake: FakeHost, pid: int, comm: str, started_ago: float, *, pidfile: str | None = None) -> None:
    """A running process that started ``started_ago`` seconds ago (/proc/<pid>/stat's starttime)."""
    ticks = os.sysconf("SC_CLK_TCK")
    boot = int(time.time()) - 100_000
    fake.write("proc/stat", f"cpu  1 2 3\nbtime {boot}\n")
    start = int((time.time() - started_ago - boot) * ticks)
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10
    fake.write(f"proc/{pid}/stat", f"{pid} ({comm}) {' '.join(fields)}\n")
    fake.write(f"proc/{pid}/comm", comm + "\n")
    if pidfile:
        fake.write(pidfile, f"{pid}\n")


def test_a_restart_is_owed_from_state_not_from_a_notification(tmp_path: Path, key: KeyData) -> None:
    """A run killed between nvidia-ctk and the restart: daemon.json is right, the engine older than it."""
    fake = converged(tmp_path, key)
    running(fake, 812, "dockerd", 3600, pidfile="run/docker.pid")
    running(fake, 640, "containerd", 3600)
    old = time.time() - 7200
    os.utime(tmp_path / "etc/containerd/config.toml", (old, old))
    facts, plan = plan_for(tmp_path, opts_for(key))
    assert (
        facts.engines["docker"].config_newer_than_process and not facts.engines["containerd"].config_newer_than_process
    )
    # No systemd here: dockerd reloads its runtimes on SIGHUP (no container stops); with systemd, its reload.
    assert commands(plan) == ["start-stop-daemon --stop --signal HUP --pidfile /var/run/docker.pid"]
    assert plan.restart == ["docker"] and plan.wait_for == ["docker"]
    fake.write("run/systemd/system/.keep", "")
    assert commands(plan_for(tmp_path, opts_for(key))[1]) == ["systemctl reload -- docker"]
    # What the running engine says is in force wins over the times: it has the nvidia runtime.
    facts.docker_engine_runtimes = ["nvidia", "runc"]
    assert plan_guest_toolkit(facts, opts_for(key)).actions == []
    # Configured before the engine started: nothing owed.
    os.utime(tmp_path / "etc/docker/daemon.json", (old, old))
    assert plan_for(tmp_path, opts_for(key))[1].actions == []
    # restart: false says it waits instead.
    os.utime(tmp_path / "etc/docker/daemon.json", None)
    _facts, plan = plan_for(tmp_path, opts_for(key, restart=False))
    assert plan.actions == [] and plan.restart_pending == ["docker"]


def test_dockers_own_containerd_is_not_the_containerd_service(tmp_path: Path, key: KeyData) -> None:
    fake = converged(tmp_path, key)
    running(fake, 640, "containerd", 3600)
    fake.write("proc/640/cmdline", "containerd\0--config\0/var/run/docker/containerd/containerd.toml\0")
    facts, plan = plan_for(tmp_path, opts_for(key))
    assert facts.engines["containerd"].started is None and plan.actions == []
    fake.write("proc/640/cmdline", "/usr/bin/containerd\0")
    facts, plan = plan_for(tmp_path, opts_for(key))
    # No systemd: no pid file to restart containerd by, so it waits, said.
    assert facts.engines["containerd"].config_newer_than_process and plan.restart_pending == ["containerd"]
    fake.write("run/systemd/system/.keep", "")
    assert commands(plan_for(tmp_path, opts_for(key))[1]) == ["systemctl restart -- containerd"]


def test_a_configured_running_engine_is_restarted_after_nvidia_ctk(tmp_path: Path, key: KeyData) -> None:
    fake = converged(tmp_path, key)
    fake.write("etc/containerd/config.toml", CONTAINERD_PLAIN)
    running(fake, 640, "containerd", 10)
    old = time.time() - 7200
    os.utime(tmp_path / "etc/containerd/config.toml", (old, old))
    fake.write("run/systemd/system/.keep", "")
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert commands(plan) == ["nvidia-ctk runtime configure --runtime=containerd", "systemctl restart -- containerd"]


def test_rhel_without_docker_and_without_an_offline_directory_is_refused(tmp_path: Path, key: KeyData) -> None:
    guest(tmp_path, os_release='ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n')
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert plan.refused and plan.actions == []
    assert "Docker is not installed and the RHEL family's repositories do not have it" in plan.refusal_text()
    assert "guest_container_toolkit_install_docker: false" in plan.refusal_text()
    # Without Docker asked for: NVIDIA's .repo file, the toolkit by dnf.
    armored = str(key["armored"], "ascii")
    opts = GuestToolkitOptions(
        key=Key(key["binary"], [key["fpr"]], armored), install_docker=False, cdi=False, parts=["repository", "toolkit"]
    )
    _facts, plan = plan_for(tmp_path, opts)
    assert plan.describe()[:2] == [
        "create /etc/pki/rpm-gpg/nvidia-container-toolkit.asc (the repository's signing key, from the controller)",
        "create /etc/yum.repos.d/nvidia-container-toolkit.repo (NVIDIA's repository (its metadata signed))",
    ]
    repo = plan.actions[1].content
    assert f"baseurl={REPO_URL}/rpm/$basearch\n" in repo and "repo_gpgcheck=1\n" in repo
    assert "gpgkey=file:///etc/pki/rpm-gpg/nvidia-container-toolkit.asc\n" in repo
    assert commands(plan) == ["dnf -y install -- nvidia-container-toolkit-base"]


def test_an_unknown_distribution_is_refused(tmp_path: Path, key: KeyData) -> None:
    guest(tmp_path, os_release="ID=alpine\n")
    _facts, plan = plan_for(tmp_path, opts_for(key))
    assert plan.refused and "unsupported distribution alpine" in plan.refusal_text()


# ---------------------------------------------------------------- offline


DEST = "var/lib/gpuprov/offline-packages"


def offline_guest(root: Path, names: list[str]) -> FakeHost:
    fake = guest(root, packages=("libc6=2.39-0ubuntu8.6",))
    for name in names:
        fake.write(f"{DEST}/{name}", f"package {name}\n")
    return fake


def stanza(name: str, version: str = "1.0", depends: str = "") -> str:
    """One package of an offline directory's index, as the lookup offline_index gives it."""
    deps = f"Depends: {depends}\n" if depends else ""
    file = f"{name}_{version.replace(':', '%3a')}_amd64.deb"  # as apt names the files it downloads
    return f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n{deps}Filename: ./{file}\n"


# Debian 12's engine and the toolkit's base package, with what a bare guest lacks of their dependencies.
ENGINE_INDEX = "\n".join(
    [
        stanza("docker.io", "20.10.24", "containerd (>= 1.6), runc, tini, libdevmapper1.02.1 (>= 2:1.02.97), iptables"),
        stanza("containerd", "1.6.20", "runc"),
        stanza("runc", "1.1.5"),
        stanza("tini", "0.19.0"),
        stanza("libdevmapper1.02.1", "2:1.02.185-2", "dmsetup (>= 2:1.02.185-2)"),
        stanza("dmsetup", "2:1.02.185-2"),
        stanza("iptables", "1.8.9-2"),
        stanza("nvidia-container-toolkit-base", "1.19.0~src.d34b3046-1", "libc6 (>= 2.34)"),
    ]
)
ENGINE_FILES = [f"{line.split('./', 1)[1]}" for line in ENGINE_INDEX.splitlines() if line.startswith("Filename:")]


def test_offline_installs_from_the_local_repository(tmp_path: Path, key: KeyData) -> None:
    offline_guest(tmp_path, ENGINE_FILES)
    parts = ["docker", "toolkit", "runtime"]  # the role's main entry point leaves the repository out offline
    opts = opts_for(
        key, parts=parts, offline_names=ENGINE_FILES, offline_source="files/debs", offline_index=ENGINE_INDEX, cdi=False
    )
    _facts, plan = plan_for(tmp_path, opts, offline_dir=DEST)
    assert not plan.refused, plan.refusal_text()
    assert plan.describe()[:2] == [
        f"create /{DEST}/Packages (index the offline packages for apt)",
        f"create /{OFFLINE_SOURCE} (serve them to apt)",
    ]
    assert plan.actions[0].content == ENGINE_INDEX
    assert plan.actions[1].content.endswith(f"deb [trusted=yes] file:/{DEST} ./\n")
    assert commands(plan)[:2] == [
        "env DEBIAN_FRONTEND=noninteractive apt-get update -o Dir::Etc::sourcelist=sources.list.d/gpuprov-offline.list "
        "-o Dir::Etc::sourceparts=- -o APT::Get::List-Cleanup=0",
        "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -- docker.io "
        "nvidia-container-toolkit-base",
    ]


def test_every_dependency_the_guest_and_the_directory_lack_is_named_in_one_refusal(
    tmp_path: Path, key: KeyData
) -> None:
    """Issue 25: Debian's docker.io on a guest that lacks libdevmapper1.02.1 and iptables, the directory without
    them: one refusal naming both, before anything is written."""
    index = "\n\n".join(
        stanza
        for stanza in ENGINE_INDEX.split("\n\n")
        if not stanza.startswith(("Package: iptables", "Package: libdev"))
    )
    files = [f for f in ENGINE_FILES if not f.startswith(("iptables", "libdev"))]
    offline_guest(tmp_path, files)
    opts = opts_for(
        key,
        parts=["docker", "toolkit", "runtime"],
        offline_names=files,
        offline_source="files/debs",
        offline_index=index,
    )
    _facts, plan = plan_for(tmp_path, opts, offline_dir=DEST)
    assert plan.refused and plan.actions == [] and len(plan.refusals) == 1
    text = plan.refusal_text()
    assert "the offline directory files/debs lacks what this guest lacks too: " in text
    assert (
        "iptables (needed by docker.io)" in text and "libdevmapper1.02.1 (>= 2:1.02.97) (needed by docker.io)" in text
    )
    assert "scripts/offline-debs.sh --status <this guest's /var/lib/dpkg/status>" in text
    assert text.index("iptables") < text.index("fix:")
    # What the guest has already is not asked of the directory.
    status = tmp_path / "var/lib/dpkg/status"
    status.write_text(
        status.read_text() + "\nPackage: iptables\nStatus: install ok installed\nVersion: 1.8.10\n"
        "\nPackage: libdevmapper1.02.1\nStatus: install ok installed\nVersion: 2:1.02.185-1\n"
    )
    assert not plan_for(tmp_path, opts, offline_dir=DEST)[1].refused


@pytest.mark.parametrize(
    ("names", "docker", "expected"),
    [
        (
            ["docker.io_20.10.24_amd64.deb"],
            False,
            "nvidia-container-toolkit-base is not in the offline directory files/debs (it holds docker.io): "
            "NVIDIA's container toolkit is on no distribution's repository, only on NVIDIA's; fix: download "
            "nvidia-container-toolkit, nvidia-container-toolkit-base, libnvidia-container-tools and "
            "libnvidia-container1 (deb, for amd64) from https://nvidia.github.io/libnvidia-container/stable/deb/amd64/ "
            "into it",
        ),
        (
            ["nvidia-container-toolkit-base_1.17.8-1_amd64.deb"],
            True,
            "Docker is not installed and the offline directory files/debs has no docker.io package; fix: add Docker's",
        ),
        ([], False, "the offline directory files/debs holds no .deb file on the controller; fix: put the packages"),
        (
            ["-oDPkg::Pre-Invoke::=x_1_amd64.deb"],
            False,
            "the offline directory has files whose names are not package file names: "
            "'-oDPkg::Pre-Invoke::=x_1_amd64.deb'",
        ),
    ],
)
def test_an_offline_directory_without_what_is_needed_is_refused(
    tmp_path: Path, key: KeyData, names: list[str], docker: bool, expected: str
) -> None:
    fake = guest(tmp_path)
    if not docker:
        binary(fake, "dockerd")
    opts = opts_for(key, offline_names=names, offline_source="files/debs", offline_index="")
    _facts, plan = plan_for(tmp_path, opts, offline_dir=DEST)
    assert plan.refused and plan.actions == []
    assert expected in plan.refusal_text()


def test_deb_architecture() -> None:
    assert [deb_architecture(m) for m in ("x86_64", "aarch64", "ppc64le", "s390x")] == [
        "amd64",
        "arm64",
        "ppc64el",
        "s390x",
    ]


# ---------------------------------------------------------------- the module, in process


def module_args(root: Path, key: KeyData, **kw: Any) -> dict[str, Any]:
    return {"root": str(root), "gpg_key_data": base64.b64encode(key["armored"]).decode(), "architecture": "amd64", **kw}


def test_module_on_a_converged_guest_changes_nothing(tmp_path: Path, key: KeyData) -> None:
    converged(tmp_path, key)
    before = tree_digest(tmp_path)
    for check in (True, False):
        result = run_in_process("guest_toolkit", module_args(tmp_path, key), check=check)
        assert not result["failed"], result.get("msg")
        assert result["changed"] is False and result["plan"] == [] and result["not_run"] == []
        assert result["engines"]["docker"] == {"binary": "/usr/bin/dockerd", "running": False, "config_newer": False}
    assert tree_digest(tmp_path) == before


def test_module_check_mode_shows_every_action_and_writes_nothing(tmp_path: Path, key: KeyData) -> None:
    guest(tmp_path)
    before = tree_digest(tmp_path)
    result = run_in_process("guest_toolkit", module_args(tmp_path, key), check=True)
    assert not result["failed"], result.get("msg")
    assert result["changed"] is True  # its files would be written (its commands would not run here)
    assert len(result["plan"]) == 9 and result["installs"] == ["docker.io", "nvidia-container-toolkit-base"]
    # --diff shows every action: the files, and the commands under "command (run now)".
    headers = [d["after_header"] for d in result["diff"]]
    assert headers[:2] == [f"{tmp_path}/{KEYRING}", f"{tmp_path}/{APT_SOURCE}"]
    assert f"{tmp_path}/etc/docker/daemon.json" in headers  # no iptables here: Docker without netfilter
    commands_shown = [h for h in headers if h.startswith("command (run now)")]
    assert len(headers) == 9 and len(commands_shown) == 6, headers
    assert tree_digest(tmp_path) == before


def test_module_applies_files_on_a_staged_root_and_reports_the_commands(tmp_path: Path, key: KeyData) -> None:
    guest(tmp_path)
    result = run_in_process("guest_toolkit", module_args(tmp_path, key))
    assert not result["failed"], result.get("msg")
    assert result["changed"] is True and len(result["not_run"]) == 6
    assert (tmp_path / KEYRING).read_bytes() == key["binary"]
    assert (tmp_path / KEYRING).stat().st_mode & 0o777 == 0o644
    again = run_in_process("guest_toolkit", module_args(tmp_path, key))
    assert again["changed"] is False and len(again["plan"]) == 6  # only the commands (never run here) remain


def test_module_refuses_a_key_with_another_fingerprint(tmp_path: Path, key: KeyData) -> None:
    guest(tmp_path)
    before = tree_digest(tmp_path)
    result = run_in_process("guest_toolkit", module_args(tmp_path, key, gpg_fingerprint="00" * 20))
    assert result["failed"] and result["fingerprints"] == [key["fpr"]]
    assert f"has fingerprint {key['fpr']}, not the expected {'00' * 20}, nothing changed" in result["msg"]
    assert tree_digest(tmp_path) == before


def test_module_says_where_the_key_could_not_be_fetched(tmp_path: Path) -> None:
    guest(tmp_path)
    url = f"file://{tmp_path}/no-such-key"
    result = run_in_process("guest_toolkit", {"root": str(tmp_path), "gpg_key_url": url})
    assert result["failed"]
    assert result["msg"].startswith(f"could not fetch the key from {url}: ")
    assert "nothing changed; check the guest reaches it, or give the key as a file on the controller" in result["msg"]


def test_module_offline_refusal_changes_nothing(tmp_path: Path, key: KeyData) -> None:
    offline_guest(tmp_path, ["docker.io_20.10.24_amd64.deb"])
    before = tree_digest(tmp_path)
    index = stanza("docker.io", "20.10.24", "containerd")
    args = {"offline_dir": "files/debs", "offline_files": ["docker.io_20.10.24_amd64.deb"], "offline_index": index}
    result = run_in_process("guest_toolkit", module_args(tmp_path, key, **args))
    assert (
        result["failed"] and "nvidia-container-toolkit-base is not in the offline directory files/debs" in result["msg"]
    )
    assert tree_digest(tmp_path) == before
    # With the toolkit there, the dependency the guest and the directory lack is refused, still nothing written.
    args["offline_files"].append("nvidia-container-toolkit-base_1.19.0_amd64.deb")
    args["offline_index"] += "\n" + stanza("nvidia-container-toolkit-base", "1.19.0")
    result = run_in_process("guest_toolkit", module_args(tmp_path, key, parts=["docker", "toolkit", "runtime"], **args))
    assert result["failed"] and "containerd (needed by docker.io)" in result["msg"], result["msg"]
    assert tree_digest(tmp_path) == before


# ---------------------------------------------------------------- the module's live path, simulated


class FilesOnly:
    """Writes files under a root (FakeHost would lay a new host out)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, text: str) -> None:
        (self.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (self.root / rel).write_text(text)


class FakeGuest:
    """``apply`` standing in for the running guest: each command has its effect on the staged root."""

    def __init__(self, root: Path, *, ctk_works: bool = True) -> None:
        self.root, self.ctk_works, self.ran = root, ctk_works, []
        self.engines: list[FakeDockerd] = []

    def __call__(self, plan: Any, root: str = "/") -> Any:
        from gpuprov.apply import actions

        sysfs_files = Path(root)
        applied = actions.Applied()
        for action in plan.actions:
            if action.kind == COMMAND:
                argv = " ".join(action.argv)
                self.ran.append(argv)
                if "apt-get install" in argv:
                    for name in action.argv[action.argv.index("--") + 1 :]:
                        status = sysfs_files / "var/lib/dpkg/status"
                        status.write_text(status.read_text() + f"\nPackage: {name}\nStatus: install ok installed\n")
                        bin_name = {"docker.io": "dockerd", "nvidia-container-toolkit-base": "nvidia-ctk"}[name]
                        (sysfs_files / "usr/bin").mkdir(parents=True, exist_ok=True)
                        (sysfs_files / "usr/bin" / bin_name).write_text("#!/bin/sh\n")
                if "apt-get install" in argv and "docker.io" in argv:  # Debian's docker.io brings containerd (CRI on)
                    (sysfs_files / "usr/bin/containerd").write_text("#!/bin/sh\n")
                    (sysfs_files / "etc/containerd").mkdir(parents=True, exist_ok=True)
                    (sysfs_files / "etc/containerd/config.toml").write_text(CONTAINERD_PLAIN)
                if argv == "nvidia-ctk runtime configure --runtime=containerd" and self.ctk_works:
                    (sysfs_files / "etc/containerd/config.toml").write_text(CONTAINERD_TOML)
                if argv == "nvidia-ctk runtime configure --runtime=docker" and self.ctk_works:
                    daemon = sysfs_files / "etc/docker/daemon.json"  # nvidia-ctk merges into what is there
                    daemon.parent.mkdir(parents=True, exist_ok=True)
                    merged = {**(json.loads(daemon.read_text()) if daemon.exists() else {}), **json.loads(DAEMON_JSON)}
                    daemon.write_text(json.dumps(merged))
                if argv == "nvidia-ctk config --in-place --set nvidia-container-runtime.mode=cdi":
                    (sysfs_files / "etc/nvidia-container-runtime").mkdir(parents=True, exist_ok=True)
                    (sysfs_files / RUNTIME_CONFIG).write_text(CDI_MODE)
                if "start-stop-daemon --start" in argv:  # dockerd runs: its process, its pid file, its socket
                    running(FilesOnly(sysfs_files), 4242, "dockerd", 0, pidfile="run/docker.pid")
                    (sysfs_files / "var/run").mkdir(parents=True, exist_ok=True)
                    self.engines.append(FakeDockerd(sysfs_files / "var/run/docker.sock"))
                if argv.startswith("nvidia-ctk cdi generate"):
                    (sysfs_files / "etc/cdi").mkdir(parents=True, exist_ok=True)
                    (sysfs_files / "etc/cdi/nvidia.yaml").write_text(cdi_spec(["0", "all"]))
            else:
                actions.write_file_atomic(str(sysfs_files / (action.path or "")), action.content or "", action.mode)
            applied.done.append(action.describe())
        return applied


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> Callable[[FakeGuest], None]:
    """The staged root taken as the running guest, its commands simulated (the module is loaded per run).
    Its run lock goes into a folder of the test's own, outside the root: the live root's /run is the
    machine's (read-only in scripts/py39.sh's chroot), never the test's to write."""
    from gpuprov.apply import actions, lock
    from gpuprov.facts import sysfs as sysfs_module

    def use(fake: FakeGuest) -> None:
        monkeypatch.setattr(sysfs_module.Sysfs, "live", property(lambda self: True))
        monkeypatch.setattr(lock, "LOCK_DIR", str(tmp_path_factory.mktemp("run-gpuprov")))
        monkeypatch.setattr(actions, "apply", fake)

    return use


def test_module_installs_then_plans_the_runtime_part_on_what_the_packages_brought(
    tmp_path: Path, key: KeyData, live: Callable[[FakeGuest], None]
) -> None:
    """A guest like the device machines': no systemd, no engine, no iptables; start-stop-daemon is there."""
    binary(guest(tmp_path), "start-stop-daemon")
    fake = FakeGuest(tmp_path)
    live(fake)
    try:
        result = run_in_process("guest_toolkit", module_args(tmp_path, key))
        assert not result["failed"], result.get("msg")
        assert fake.ran == [
            "env DEBIAN_FRONTEND=noninteractive apt-get update",
            "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -- docker.io",
            "env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -- "
            "nvidia-container-toolkit-base",
            # Planned again on the new state: dockerd and nvidia-ctk are there now; the containerd Docker brought
            # runs as no service, so it is not configured. The engine starts last, on its final configuration.
            "nvidia-ctk config --in-place --set nvidia-container-runtime.mode=cdi",
            "nvidia-ctk runtime configure --runtime=docker",
            "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml",
            "/usr/bin/start-stop-daemon --start --background --oknodo --pidfile /var/run/docker.pid "
            "--output /var/log/gpuprov-dockerd.log --exec /usr/bin/dockerd -- --pidfile /var/run/docker.pid",
        ]
        assert json.loads((tmp_path / "etc/docker/daemon.json").read_text())["iptables"] is False
        assert result["changed"] is True and result["installs"] == ["docker.io", "nvidia-container-toolkit-base"]
        assert result["configure"] == ["docker"] and len(result["plan"]) == 10
        # The next run owes nothing.
        fake.ran.clear()
        again = run_in_process("guest_toolkit", module_args(tmp_path, key))
        assert not again["failed"], again.get("msg")
        assert again["changed"] is False and fake.ran == [], fake.ran
    finally:
        for engine in fake.engines:
            engine.close()


def test_module_fails_when_nvidia_ctk_did_not_fix_what_it_was_to(
    tmp_path: Path, key: KeyData, live: Callable[[FakeGuest], None]
) -> None:
    fake_host = converged(tmp_path, key)
    fake_host.write("etc/docker/daemon.json", "{}\n")
    live(FakeGuest(tmp_path, ctk_works=False))
    # (Docker is not running in this staged guest; starting it is another test's.)
    result = run_in_process("guest_toolkit", module_args(tmp_path, key, start=False))
    assert result["failed"] and result["done"] == [
        "run nvidia-ctk runtime configure --runtime=docker (Docker is here but has no NVIDIA runtime and CDI is off "
        "(/etc/docker/daemon.json): containers cannot get the GPU)"
    ]
    assert result["msg"].startswith("after nvidia-ctk: docker-runtime: Docker is here but has no NVIDIA runtime")
