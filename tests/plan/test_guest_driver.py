"""The guest driver: facts (gpuprov.facts.driver_install), the planner (gpuprov.plan.guest.driver)
and the module guest_driver in process (check mode: no python3-apt anywhere).

The device machines' guests (Ubuntu 24.04, kernel 6.18.44-fc-v657-gpu, driver 580.159.04 from
the image, libraries in /usr/local/nvidia/lib64) are the working case: the captures
h100-live/h200-live lack the driver's version files and libraries, so
tests/fixtures/guest-driver/h100-vendor-image holds those, read on the same kind of machine
(its README), laid over the h100-live capture.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuprov.facts.driver_install import read_guest_driver
from gpuprov.facts.files import read_text
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.guest.driver import (
    NOUVEAU_CONF,
    NOUVEAU_TEXT,
    GuestDriverOptions,
    RhelRepo,
    plan_guest_driver,
)
from tests.conftest import collections_path, tree_digest
from tests.fakehost import FakeHost
from tests.modrun import run_in_process
from tests.modules.test_modules import bare_python as bare_python  # a fixture: re-exported for pytest

REPO = Path(__file__).resolve().parents[2]
PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
VENDOR_IMAGE = Path(__file__).parents[1] / "fixtures" / "guest-driver" / "h100-vendor-image"
KERNEL = "6.8.0-45-generic"
GPU = "0000:00:06.0"


def guest(root: Path, *, os_release: str = 'ID=ubuntu\nVERSION_ID="24.04"\nVERSION_CODENAME=noble\n') -> FakeHost:
    fake = FakeHost(root, iommu=False)
    fake.write("proc/version", f"Linux version {KERNEL} (buildd@lcy02) #45-Ubuntu SMP\n")
    fake.write("etc/os-release", os_release)
    fake.write("etc/apt/sources.list", "deb http://archive.ubuntu.com/ubuntu noble main universe\n")
    fake.pci(GPU, cls=0x030200, driver="nvidia")
    return fake


def loaded(fake: FakeHost, version: str, *, open_km: bool = True) -> None:
    kind = "Open Kernel Module" if open_km else "Kernel Module"
    fake.write("proc/driver/nvidia/version", f"NVRM version: NVIDIA UNIX {kind} for x86_64  {version}  Release Build\n")
    fake.write("sys/module/nvidia/version", version + "\n")
    fake.write("proc/modules", "nvidia 14299136 - - Live 0xffffffffc0400000 (O)\n")


def libraries(fake: FakeHost, version: str, directory: str = "usr/lib/x86_64-linux-gnu") -> None:
    for lib in ("libnvidia-ml", "libcuda"):
        fake.write(f"{directory}/{lib}.so.{version}", b"")
        fake.link(f"{directory}/{lib}.so.1", f"{directory}/{lib}.so.{version}")


def dpkg(fake: FakeHost, *packages: tuple[str, str]) -> None:
    stanzas = [f"Package: {n}\nStatus: install ok installed\nVersion: {v}\n" for n, v in packages]
    fake.write(
        "var/lib/dpkg/status", "\n".join(["Package: bash\nStatus: install ok installed\nVersion: 5.2\n", *stanzas])
    )


def plan_for(root: Path, opts: GuestDriverOptions | None = None, **kw):  # type: ignore[no-untyped-def]
    sysfs = Sysfs(str(root))
    facts = read_guest_driver(sysfs, **kw)
    return facts, plan_guest_driver(facts, opts or GuestDriverOptions(), nouveau_before=read_text(sysfs, NOUVEAU_CONF))


# ---------------------------------------------------------------- the device machines' guest


@pytest.fixture
def vendor_image(host_root: Callable[[str], Path], tmp_path: Path) -> Path:
    root = tmp_path / "h100"
    shutil.copytree(host_root("h100-live"), root, symlinks=True)
    shutil.copytree(VENDOR_IMAGE, root, symlinks=True, dirs_exist_ok=True)
    return root


def test_the_device_machines_driver_is_working_and_left_alone(vendor_image: Path) -> None:
    facts, plan = plan_for(vendor_image)
    assert facts.driver.loaded and facts.driver.version == "580.159.04"
    assert facts.install.library_version == "580.159.04"
    assert facts.install.library_versions == ["580.159.04"]
    # cuda-* packages of the image are not the driver's; no .run traces either.
    assert facts.install.packages == [] and facts.install.source == "unknown"
    assert facts.os.family == "debian" and facts.os.kernel == "6.18.44-fc-v657-gpu"
    assert facts.gpus == [GPU]
    assert plan.verdict == "working"
    assert plan.actions == [] and not plan.refused and plan.reboot_reasons == []
    # Even with the branch it has.
    assert plan_for(vendor_image, GuestDriverOptions(branch="580"))[1].verdict == "working"


def test_the_device_machines_driver_is_refused_for_another_branch_and_not_removable(vendor_image: Path) -> None:
    _facts, plan = plan_for(vendor_image, GuestDriverOptions(branch="570"))
    assert plan.verdict == "other" and plan.actions == []
    text = plan.refusal_text()
    assert "branch 570" in text and "580.159.04" in text and "replace_other_driver: true" in text
    _facts, plan = plan_for(vendor_image, GuestDriverOptions(branch="570", replace_other_driver=True))
    # A vendor image's driver: no package, no uninstaller: refused even then, nothing removed.
    assert plan.refused and plan.actions == [] and "the way it was installed" in plan.refusal_text()


@pytest.mark.parametrize("name", ["h100-live", "h200-live", "h200x2-live"])
def test_live_captures_working_from_the_drivers_own_answer(name: str, host_root: Callable[[str], Path]) -> None:
    """The captures lack the version files and /usr/lib; the module is in proc/modules and
    nvidia-smi answered (it does only when libraries and module match): working."""
    from gpuprov.verify.gather import query_gpus

    sysfs = Sysfs(str(host_root(name)))
    gpu_list, error = query_gpus(sysfs, nvml=None, source="nvidia-smi", smi=None)
    assert gpu_list is not None, error
    facts = read_guest_driver(sysfs, reported_version=gpu_list.driver_version)
    assert facts.driver.loaded and facts.driver.version is None and facts.install.library_version is None
    plan = plan_guest_driver(facts, GuestDriverOptions())
    assert plan.verdict == "working" and plan.actions == [] and not plan.refused
    # Without the driver's answer its version is unknown: fail closed, refused, nothing planned.
    bare = plan_guest_driver(read_guest_driver(sysfs), GuestDriverOptions())
    assert bare.refused and bare.actions == [] and "version cannot be read" in bare.refusal_text()


# ---------------------------------------------------------------- the planner on small trees


def test_no_driver_plans_what_the_role_installed(tmp_path: Path) -> None:
    fake = guest(tmp_path)
    dpkg(fake)
    facts, plan = plan_for(tmp_path)
    assert facts.install.source is None and plan.verdict == "missing"
    argvs = [a.argv for a in plan.actions if a.argv]
    assert argvs[0][-2:] == ["apt-get", "update"]
    assert argvs[1][-2:] == [f"linux-headers-{KERNEL}", "ubuntu-drivers-common"]
    assert argvs[2] == ["ubuntu-drivers", "install", "--gpgpu"]
    assert ["update-initramfs", "-u", "-k", "all"] in argvs and argvs[-1] == ["modprobe", "nvidia"]
    assert NOUVEAU_CONF in [a.path for a in plan.actions]
    # A branch: the -server packages; proprietary flavour without -open.
    _f, plan = plan_for(tmp_path, GuestDriverOptions(branch="570", flavor="proprietary"))
    assert [a.argv for a in plan.actions if a.argv][1][-3:] == [
        f"linux-headers-{KERNEL}",
        "nvidia-driver-570-server",
        "dkms",
    ]


def test_debian_refuses_a_branch_and_rhel_uses_the_cuda_repository(tmp_path: Path) -> None:
    guest(tmp_path / "d", os_release="ID=debian\nVERSION_ID=12\nVERSION_CODENAME=bookworm\n")
    _f, plan = plan_for(tmp_path / "d", GuestDriverOptions(branch="535"))
    assert plan.refused and "one driver per release" in plan.refusal_text() and plan.actions == []
    _f, plan = plan_for(tmp_path / "d")
    assert ["nvidia-driver", "nvidia-open-kernel-dkms"] == [a.argv for a in plan.actions if a.argv][1][-2:]
    guest(tmp_path / "r", os_release='ID="rocky"\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.4"\n')
    repo = RhelRepo("cuda-rhel9-x86_64", "https://example.invalid/rhel9/x86_64", "https://example.invalid/k.pub")
    _f, plan = plan_for(tmp_path / "r", GuestDriverOptions(rhel_repo=repo))
    described = plan.describe()
    assert described[0].startswith("create /etc/yum.repos.d/cuda-rhel9-x86_64.repo")
    assert ["dnf", "-y", "module", "enable", "nvidia-driver:open-dkms"] in [a.argv for a in plan.actions]
    assert ["dracut", "-f", "--regenerate-all"] in [a.argv for a in plan.actions]


def test_unknown_distribution_is_refused(tmp_path: Path) -> None:
    guest(tmp_path, os_release="ID=arch\n")
    _f, plan = plan_for(tmp_path)
    assert plan.refused and "unsupported distribution arch" in plan.refusal_text() and plan.actions == []


def test_packages_of_another_branch_refused_unless_replaced(tmp_path: Path) -> None:
    fake = guest(tmp_path)
    loaded(fake, "535.183.01")
    libraries(fake, "535.183.01")
    dpkg(fake, ("nvidia-driver-535-server-open", "535.183.01-0ubuntu1"), ("cuda-toolkit-12-4", "12.4.1-1"))
    facts, plan = plan_for(tmp_path)
    assert facts.install.source == "packages" and plan.verdict == "working"  # no branch asked: left alone
    _f, plan = plan_for(tmp_path, GuestDriverOptions(branch="580"))
    assert plan.refused and plan.actions == []
    assert "nvidia-driver-535-server-open 535.183.01-0ubuntu1" in plan.refusal_text()
    _f, plan = plan_for(tmp_path, GuestDriverOptions(branch="580", replace_other_driver=True))
    assert not plan.refused and plan.verdict == "other"
    assert plan.actions[0].argv[-4:] == ["apt-get", "purge", "-y", "nvidia-driver-535-server-open"]
    assert plan.removes and "535.183.01" in plan.removes[0]
    assert "nvidia-driver-580-server-open" in plan.actions[2].argv
    assert any("loaded until a reboot" in r for r in plan.reboot_reasons)
    assert ["modprobe", "nvidia"] not in [a.argv for a in plan.actions]  # the old module is still loaded


def test_dpkg_status_reading_is_strict(tmp_path: Path) -> None:
    """Only installed driver packages with Debian package names count (a name reaches apt-get's argv)."""
    fake = guest(tmp_path)
    dpkg(fake, ("nvidia-driver-580-server-open", "580.95.05-0ubuntu1"), ("nvidia-driver-580 --allow-remove", "1"))
    fake.write(
        "var/lib/dpkg/status",
        (tmp_path / "var/lib/dpkg/status").read_text()
        + "\nPackage: libnvidia-compute-570\nStatus: deinstall ok config-files\nVersion: 570.1\n",
    )
    facts = read_guest_driver(Sysfs(str(tmp_path)))
    assert [p.name for p in facts.install.packages] == ["nvidia-driver-580-server-open"]
    assert facts.install.dpkg_status and facts.install.source == "packages"


def test_run_installer_driver_replaced_with_its_uninstaller(tmp_path: Path) -> None:
    fake = guest(tmp_path)
    loaded(fake, "550.90.07", open_km=False)
    libraries(fake, "550.90.07", "usr/lib64")
    fake.write("usr/bin/nvidia-installer", b"")
    facts, plan = plan_for(tmp_path, GuestDriverOptions(branch="580", replace_other_driver=True))
    assert facts.install.source == "run" and facts.driver.open_kernel_module is False
    assert plan.actions[0].argv == ["nvidia-installer", "--uninstall", "--silent"]


def test_library_and_module_mismatch_is_a_reboot_not_a_reinstall(tmp_path: Path) -> None:
    fake = guest(tmp_path)
    loaded(fake, "580.82.07")
    libraries(fake, "580.95.05")
    dpkg(fake, ("nvidia-driver-580-server-open", "580.95.05-0ubuntu1"))
    _f, plan = plan_for(tmp_path, GuestDriverOptions(branch="580"))
    assert plan.verdict == "reboot" and plan.actions == [] and not plan.refused
    assert "580.82.07" in plan.reboot_reasons[0] and "580.95.05" in plan.reboot_reasons[0]


def test_two_library_versions_without_a_soname_link_are_unknown(tmp_path: Path) -> None:
    fake = guest(tmp_path)
    loaded(fake, "580.95.05")
    for version in ("570.1.2", "580.95.05"):
        fake.write(f"usr/lib64/libcuda.so.{version}", b"")
    facts, plan = plan_for(tmp_path)
    assert facts.install.library_version is None and facts.install.library_versions == ["570.1.2", "580.95.05"]
    assert plan.refused and plan.actions == []


def test_installed_not_loaded_is_loaded_or_waits_for_a_reboot(tmp_path: Path) -> None:
    fake = guest(tmp_path)
    libraries(fake, "580.95.05")
    dpkg(fake, ("nvidia-driver-580-server-open", "580.95.05-0ubuntu1"))
    fake.write(NOUVEAU_CONF, NOUVEAU_TEXT)
    _f, plan = plan_for(tmp_path)
    assert plan.verdict == "installed"
    assert [a.argv for a in plan.actions if a.argv] == [["modprobe", "nvidia"]]  # no apt, no reinstall
    fake.write("proc/modules", "nouveau 2965504 0 - Live 0x0\n")
    _f, plan = plan_for(tmp_path)
    assert ["modprobe", "nvidia"] not in [a.argv for a in plan.actions]
    assert plan.reboot_reasons and "nouveau" in plan.reboot_reasons[0]


# ---------------------------------------------------------------- the module, in process


def test_module_check_mode_on_the_device_machines_guest_changes_nothing(vendor_image: Path) -> None:
    result = run_in_process("guest_driver", {"root": str(vendor_image)}, check=True)
    assert not result["failed"], result.get("msg")
    assert result["changed"] is False and result["plan"] == [] and result["verdict"] == "working"
    assert result["driver"]["library_version"] == "580.159.04" and result["driver"]["source"] == "unknown"
    assert result["vgpu"] is False  # the capture's nvidia-smi output shows a passthrough GPU


def test_module_check_mode_plans_an_install_and_refuses_with_the_fix(tmp_path: Path) -> None:
    guest(tmp_path)
    result = run_in_process("guest_driver", {"root": str(tmp_path)}, check=True)
    assert not result["failed"] and result["changed"] is True and result["verdict"] == "missing"
    assert any("ubuntu-drivers install --gpgpu" in line for line in result["plan"])
    # The restricted component is added to the distribution's apt entries first.
    assert result["plan"][0].startswith("would update /etc/apt/sources.list")
    assert (tmp_path / "etc/apt/sources.list").read_text().count("restricted") == 0  # check mode: untouched
    fake = FakeHost(tmp_path, iommu=False)
    loaded(fake, "535.183.01")
    libraries(fake, "535.183.01")
    result = run_in_process("guest_driver", {"root": str(tmp_path), "branch": "580"}, check=True)
    assert result["failed"] and "replace_other_driver: true" in result["msg"]
    assert result["refusals"][0]["fix"]


def test_module_rejects_a_malformed_branch(tmp_path: Path) -> None:
    guest(tmp_path)
    result = run_in_process("guest_driver", {"root": str(tmp_path), "branch": "580; rm -rf /"}, check=True)
    assert result["failed"] and "branch" in result["msg"]


# ---------------------------------------------------------------- the role, through ansible-playbook


def play_role(python: str, root: Path, tmp_path: Path, *, check: bool) -> str:
    """The role on ``root`` (localhost, no facts gathered), as the guest stage runs it; its output."""
    collections_path()
    playbook = tmp_path / "driver.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  roles:\n    - role: gpuprov.kvm.guest_nvidia_driver\n"
        f"      guest_nvidia_driver_root: {root}\n"
    )
    cmd = [PLAYBOOK, "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={python}", str(playbook)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    out = subprocess.run(cmd + (["--check"] if check else []), cwd=REPO, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return out.stdout


def recap_changed(output: str) -> int:
    return int(re.search(r"localhost\s*: ok=\d+\s+changed=(\d+)", output).group(1))  # type: ignore[union-attr]


def test_role_leaves_the_device_machines_driver_alone(bare_python: str, vendor_image: Path, tmp_path: Path) -> None:
    """On a target interpreter without python3-apt (or anything else): check mode, then apply, change nothing."""
    before = tree_digest(vendor_image)
    for check in (True, False):
        output = play_role(bare_python, vendor_image, tmp_path, check=check)
        assert recap_changed(output) == 0, output
        assert "working: NVIDIA driver 580.159.04 (loaded)" in output and "nothing to do" in output
    assert tree_digest(vendor_image) == before


def test_role_installs_on_a_guest_without_a_driver_then_changes_nothing(bare_python: str, tmp_path: Path) -> None:
    root = tmp_path / "guest"
    guest(root)
    output = play_role(bare_python, root, tmp_path, check=True)
    assert recap_changed(output) == 1 and "missing: no NVIDIA driver" in output
    assert not (root / NOUVEAU_CONF).exists()
    output = play_role(bare_python, root, tmp_path, check=False)
    # Files are written below the staged root; apt, ubuntu-drivers and modprobe are reported, not run.
    assert (root / NOUVEAU_CONF).read_text() == NOUVEAU_TEXT
    assert "restricted" in (root / "etc/apt/sources.list").read_text()
    assert "ubuntu-drivers install --gpgpu" in output and "not run (root" in output
    assert recap_changed(play_role(bare_python, root, tmp_path, check=False)) == 0
