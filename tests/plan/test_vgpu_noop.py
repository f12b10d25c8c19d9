"""vgpu_host in one module call: gpu_vgpu plans mdevctl's install from the host's own state (its
binary, dpkg's status file, rpm) and says whether the installed boot runner is the role's (by sha256),
so a converged host runs no package module and no copy (issue #14)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpuprov.apply import vgpu as apply_vgpu
from gpuprov.apply.actions import Applied
from gpuprov.apply.vgpu import plan_host
from gpuprov.core.plan import COMMAND, Action
from gpuprov.facts.packages import Packages, dpkg_installed, read_packages, read_services
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.vgpu import VgpuPlan, VgpuRequest
from tests import vgpuhosts as vh
from tests.modrun import run_in_process

MTTY_LAYOUT = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": "5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01"}]}}
DPKG = "var/lib/dpkg/status"


def stanza(name: str, status: str = "install ok installed", version: str = "1.2.0-1") -> str:
    return f"Package: {name}\nStatus: {status}\nArchitecture: amd64\nVersion: {version}\nDescription: x\n more\n"


@pytest.fixture
def mtty(host_root, tmp_path: Path) -> Path:
    dest = tmp_path / "mtty"
    shutil.copytree(host_root("mtty-mdev"), dest, symlinks=True)
    return dest


def write(root: Path, rel: str, text: str) -> None:
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_text(text)


def plan_of(root: Path, gpus: Any, **kw: Any) -> VgpuPlan:
    return plan_host(Sysfs(str(root)), VgpuRequest(gpus=gpus, **kw))


def commands(plan: VgpuPlan) -> list[list[str]]:
    return [a.argv or [] for a in plan.actions if a.kind == COMMAND]


def test_missing_mdevctl_is_installed_first_by_the_plan(mtty: Path) -> None:
    assert not (mtty / "usr/bin/mdevctl").exists() and not (mtty / DPKG).exists()
    write(mtty, DPKG, stanza("libc6") + "\n" + stanza("mdevctl", "deinstall ok config-files"))
    plan = plan_of(mtty, MTTY_LAYOUT, install_mdevctl=True)
    assert not plan.refused
    assert plan.install is plan.actions[0]
    assert plan.actions[0].argv == ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "mdevctl"]
    assert not any("mdevctl is not installed" in w for w in plan.warnings)  # it will be
    # Asked not to install it: no command, and the warning says the definitions wait for it.
    quiet = plan_of(mtty, MTTY_LAYOUT)
    assert quiet.install is None and ["apt-get"] not in [c[2:3] for c in commands(quiet)]
    assert any("mdevctl is not installed" in w for w in quiet.warnings)


def test_installed_mdevctl_plans_no_install(mtty: Path) -> None:
    write(mtty, DPKG, stanza("mdevctl"))
    assert plan_of(mtty, MTTY_LAYOUT, install_mdevctl=True).install is None  # dpkg says so
    (mtty / DPKG).unlink()
    write(mtty, "usr/sbin/mdevctl", "#!/bin/sh\n")
    assert plan_of(mtty, MTTY_LAYOUT, install_mdevctl=True).install is None  # its binary says so
    # No mdev entry: mdevctl is not needed at all.
    (mtty / "usr/sbin/mdevctl").unlink()
    assert plan_of(mtty, {"mtty": {"use": "host"}}, install_mdevctl=True).install is None


def test_an_rpm_host_whose_database_cannot_be_read_gets_dnf(mtty: Path) -> None:
    """rpm's database is no file: on a staged root it is unknown, so the install is planned (fail closed)."""
    write(mtty, "usr/bin/rpm", "#!/bin/sh\n")
    plan = plan_of(mtty, MTTY_LAYOUT, install_mdevctl=True)
    assert plan.actions[0].argv == ["dnf", "-y", "install", "mdevctl"]


def test_a_refused_plan_installs_nothing(mtty: Path) -> None:
    plan = plan_of(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-9"}]}}, install_mdevctl=True)
    assert plan.refused and plan.actions == [] and plan.install is None


def test_the_boot_runner_is_compared_by_sha256(tmp_path: Path) -> None:
    root = tmp_path / "nvidia"
    vh.build(root, boot_runner=True).finish()
    installed = hashlib.sha256((root / "usr/lib/gpuprov/gpuprov-vgpu.pyz").read_bytes()).hexdigest()
    sriov = {vh.SRIOV_PF: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}]}}
    assert plan_of(root, sriov, runner_sha256=installed).runner == "current"
    other = plan_of(root, sriov, runner_sha256="0" * 64)
    assert other.runner == "install" and not any("gpuprov-vgpu.pyz" in w for w in other.warnings)
    assert other.result()["runner"] == "install"
    (root / "usr/lib/gpuprov/gpuprov-vgpu.pyz").unlink()
    assert plan_of(root, sriov, runner_sha256=installed).runner == "install"
    # Not compared: no sha given, no boot unit needed, or not persistent.
    assert plan_of(root, sriov).runner is None
    assert plan_of(root, sriov, runner_sha256=installed, persistent=False).runner is None


def test_the_module_refuses_a_runner_sha256_that_is_none(mtty: Path) -> None:
    result = run_in_process("gpu_vgpu", {"gpus": MTTY_LAYOUT, "runner_sha256": "abc", "root": str(mtty)}, check=True)
    assert result["failed"] and "runner_sha256: 'abc' is not a sha256" in result["msg"]


def test_the_module_in_check_mode_says_it_would_install_mdevctl(mtty: Path) -> None:
    result = run_in_process("gpu_vgpu", {"gpus": MTTY_LAYOUT, "install_mdevctl": True, "root": str(mtty)}, check=True)
    assert not result["failed"], result.get("msg")
    assert result["plan"][0].startswith("would run env DEBIAN_FRONTEND=noninteractive apt-get install -y mdevctl")
    assert result["diff"][0]["after"] == "env DEBIAN_FRONTEND=noninteractive apt-get install -y mdevctl\n"


# ---------------------------------------------------------------- the package and service facts


def test_dpkg_status_is_read_as_a_file(tmp_path: Path) -> None:
    write(tmp_path, DPKG, stanza("a", version="1") + "\n" + stanza("b", "deinstall ok config-files") + "\n")
    assert dpkg_installed(Sysfs(str(tmp_path))) == {"a": "1"}
    assert read_packages(Sysfs(str(tmp_path)), ["a", "b"]).missing(["a", "b"]) == ["b"]
    assert dpkg_installed(Sysfs(str(tmp_path / "none"))) is None
    assert Packages(None, None).missing(["x"]) == ["x"]  # unknown: missing


def test_rpm_answers_through_the_runner(tmp_path: Path) -> None:
    write(tmp_path, "usr/bin/rpm", "")
    asked: list[list[str]] = []

    def run(argv: list[str]) -> str:
        asked.append(argv)
        return "libvirt-client 9.0.0-1.el9\npackage qemu-img is not installed\n"

    packages = read_packages(Sysfs(str(tmp_path)), ["libvirt-client", "qemu-img"], run)
    assert packages.manager == "rpm" and packages.missing(["libvirt-client", "qemu-img"]) == ["qemu-img"]
    assert asked[0][:2] == ["rpm", "--query"]


def test_services_from_one_systemctl_show(tmp_path: Path) -> None:
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    out = (
        "Id=libvirtd.service\nActiveState=active\nUnitFileState=enabled\n\n"
        "Id=virtlogd.socket\nActiveState=inactive\nUnitFileState=enabled\n\n"
        "Id=virtqemud.socket\nActiveState=active\nUnitFileState=disabled\n\n"
        "Id=virtnodedevd.socket\nActiveState=activating\nUnitFileState=static\n"
    )
    units = ["libvirtd.service", "virtlogd.socket", "virtqemud.socket", "absent.socket"]
    assert (
        read_services(Sysfs(str(tmp_path)), ["virtnodedevd.socket"], lambda argv: out).not_running(
            ["virtnodedevd.socket"]
        )
        == []
    )
    services = read_services(Sysfs(str(tmp_path)), units, lambda argv: out)
    assert services.systemd and services.not_running(units) == units[1:]
    # A staged root: systemd is not asked, so nothing is known to run.
    assert read_services(Sysfs(str(tmp_path)), units).not_running(units) == units
    assert not read_services(Sysfs(str(tmp_path / "none")), units).systemd


def test_on_the_live_root_mdevctl_is_installed_then_the_host_planned_again(monkeypatch) -> None:
    """What the module does before applying: run the install alone, then plan again (mdevctl's udev
    rule can only be checked once it is there); the new plan is the one applied."""
    install = Action(COMMAND, "mdevs persist as its definitions", argv=["apt-get", "install", "-y", "mdevctl"])
    first_plan = VgpuPlan(actions=[install], install=install)
    replanned = VgpuPlan()
    ran: list[list[str]] = []

    class Live:
        def __init__(self, root: str) -> None:
            self.live = True

    def fake_apply(plan, root):
        ran.append([a.describe() for a in plan.actions])
        return Applied(done=[a.describe() for a in plan.actions])

    monkeypatch.setattr(apply_vgpu, "Sysfs", Live)
    monkeypatch.setattr(apply_vgpu, "apply", fake_apply)
    monkeypatch.setattr(apply_vgpu, "plan_host", lambda sysfs, request, run=None: replanned)
    request = VgpuRequest(gpus=MTTY_LAYOUT, install_mdevctl=True)
    plan, first = apply_vgpu.first_pass("/", request, first_plan)
    assert plan is replanned and ran == [[install.describe()]]
    assert first is not None and first.done == [install.describe()]
    # Check mode runs nothing.
    ran.clear()
    assert apply_vgpu.first_pass("/", request, first_plan, check=True) == (first_plan, None) and ran == []
