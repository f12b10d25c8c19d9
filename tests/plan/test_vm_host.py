"""gpu_vms' install step in one module run (gpu_vm_host): the OS family, the installed packages
and libvirt's services are read, and only what is missing is planned (issue #14)."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuprov.facts.driver_install import GuestOs
from gpuprov.facts.packages import Packages, Services
from gpuprov.facts.sysfs import Sysfs
from gpuprov.modules.gpu_vm_host import read_vm_host
from gpuprov.plan.vm.host import PACKAGES, PYTHON_PACKAGES, VmHostFacts, plan_vm_host
from tests.conftest import REPO, tree_digest
from tests.modrun import run_in_process

DEBIAN = GuestOs(id="debian", family="debian", version_id="12", codename="bookworm", kernel=None)
ROCKY = GuestOs(id="rocky", family="redhat", version_id="9.4", codename=None, kernel=None)


def facts(
    os_: GuestOs,
    installed: dict[str, str] | None,
    states: dict[str, tuple[str, str]] | None,
    *,
    systemd: bool = True,
    system_python: bool = True,
) -> VmHostFacts:
    manager = "dpkg" if os_.family == "debian" else "rpm"
    return VmHostFacts(
        os=os_, packages=Packages(manager, installed), services=Services(systemd, states), system_python=system_python
    )


EVERYTHING = {n: "1" for n in PACKAGES["debian"] + PYTHON_PACKAGES["debian"]}
RUNNING = {"libvirtd.service": ("active", "enabled")}


def test_a_prepared_debian_host_plans_nothing() -> None:
    plan = plan_vm_host(facts(DEBIAN, EVERYTHING, RUNNING), [])
    assert not plan.refused and plan.actions == [] and plan.missing == [] and plan.stopped == []


def test_only_the_missing_packages_are_installed_then_libvirt_started() -> None:
    installed = {k: v for k, v in EVERYTHING.items() if k not in ("ovmf", "python3-libvirt")}
    plan = plan_vm_host(facts(DEBIAN, installed, {"libvirtd.service": ("inactive", "enabled")}), [])
    assert [a.argv for a in plan.actions] == [
        ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "ovmf", "python3-libvirt"],
        ["systemctl", "enable", "--now", "libvirtd.service"],
    ]
    # A virtualenv's Python brings its own libvirt bindings.
    venv = plan_vm_host(facts(DEBIAN, installed, RUNNING, system_python=False), [])
    assert [a.argv[-1] for a in venv.actions] == ["ovmf"]


def test_el_gets_dnf_and_the_modular_daemons_and_unknown_counts_as_missing() -> None:
    plan = plan_vm_host(facts(ROCKY, None, None), [])
    argvs = [a.argv for a in plan.actions]
    assert argvs[0] == ["dnf", "-y", "install", *PACKAGES["redhat"], "python3-libvirt"]
    assert ["systemctl", "enable", "--now", "virtqemud.socket"] in argvs and len(argvs) == 5


def test_without_systemd_libvirt_is_the_callers() -> None:
    plan = plan_vm_host(facts(DEBIAN, EVERYTHING, None, systemd=False), [])
    assert plan.actions == [] and plan.stopped is None


def test_an_unknown_family_without_packages_and_a_bad_name_are_refused() -> None:
    other = GuestOs(id="arch", family=None, version_id=None, codename=None, kernel=None)
    plan = plan_vm_host(facts(other, {}, RUNNING), [])
    assert plan.refused and "no package list for this host's OS (arch" in plan.refusals[0].message
    assert "gpu_vms_install: false" in (plan.refusals[0].fix or "")
    given = plan_vm_host(facts(other, {"qemu-kvm": "1"}, RUNNING), ["qemu-kvm"])
    assert not given.refused and given.actions == []
    assert plan_vm_host(facts(DEBIAN, {}, RUNNING), ["ok", "x; rm -rf /"]).refused


def test_read_from_a_staged_root(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text('ID=ubuntu\nID_LIKE=debian\nVERSION_ID="24.04"\n')
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(
        "".join(f"Package: {n}\nStatus: install ok installed\nVersion: 1\n\n" for n in PACKAGES["debian"])
    )
    got = read_vm_host(Sysfs(str(tmp_path)), [], system_python=True)
    assert got.os.family == "debian" and got.packages.missing(PACKAGES["debian"] + ["python3-libvirt"]) == [
        "python3-libvirt"
    ]
    assert not got.services.systemd  # a staged root without /run/systemd/system


def test_the_module_in_check_mode_changes_nothing_and_says_would(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text("ID=debian\n")
    (tmp_path / "run/systemd/system").mkdir(parents=True)
    before = tree_digest(tmp_path)
    result = run_in_process("gpu_vm_host", {"root": str(tmp_path)}, check=True)
    assert not result["failed"], result.get("msg")
    assert result["os_family"] == "debian" and result["changed"] is False  # commands only: not run off "/"
    assert result["plan"][0].startswith(
        "would run env DEBIAN_FRONTEND=noninteractive apt-get install -y libvirt-daemon-system"
    )
    assert result["plan"][-1] == "would run systemctl enable --now libvirtd.service (libvirt runs now and from boot)"
    assert tree_digest(tmp_path) == before
    real = run_in_process("gpu_vm_host", {"root": str(tmp_path)})
    assert real["changed"] is False and real["not_run"] == [line.removeprefix("would ") for line in result["plan"]]


def test_console_checks_run_only_where_asked_and_the_lab_asks() -> None:
    defaults = yaml.safe_load((REPO / "roles/gpu_vms/defaults/main.yml").read_text())
    lab = yaml.safe_load((REPO / "inventories/lab/host_vars/lab-gpu-host.yml").read_text())
    assert defaults["gpu_vms_check_consoles"] is False and lab["gpu_vms_check_consoles"] is True
    tasks = yaml.safe_load((REPO / "roles/gpu_vms/tasks/main.yml").read_text())
    state, checks = [t for t in tasks if "gpuprov.kvm.gpu_vm" in t]
    # Every VM started first (no checks in that run: the guests boot side by side), then the same
    # module run per checked VM (no wait_for/slurp tasks of their own), and only when asked.
    assert "console_checks" not in state["gpuprov.kvm.gpu_vm"]
    assert checks["gpuprov.kvm.gpu_vm"]["console_checks"] == "{{ gpu_vms_console_checks }}"
    assert checks["when"] == "gpu_vms_check_consoles | bool"
    assert tasks.index(state) < tasks.index(checks)
    # The same options otherwise (the YAML merge of the first task's).
    assert {k: v for k, v in checks["gpuprov.kvm.gpu_vm"].items() if k != "console_checks"} == state[
        "gpuprov.kvm.gpu_vm"
    ]
    assert not any("wait_for" in t or "slurp" in str(t) or "include_tasks" in t for t in tasks if "serial" in str(t))
