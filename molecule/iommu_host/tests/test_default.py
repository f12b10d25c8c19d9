"""iommu_host after converge and idempotence, on captured hosts laid out at /srv/host.

Instances (molecule.yml): gpuprov-iommu-intel (gpu-alone: GenuineIntel, already
booted with intel_iommu=on iommu=pt) and gpuprov-iommu-amd-off (ci-host-no-iommu:
AuthenticAMD, IOMMU off, none of the args on /proc/cmdline). Helpers and
fixtures: molecule/conftest.py.
"""

from __future__ import annotations

import pytest
from role_checks import RoleChecks

VFIO_MODULES = ["vfio", "vfio_iommu_type1", "vfio_pci"]
GRUB_KEY = "GRUB_CMDLINE_LINUX_DEFAULT="


def config_lines(text: str) -> list[str]:
    """The lines of a config file that are neither blank nor comments."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.fixture
def vendor(host, root) -> str:
    return host.check_output("sed -n 's/^vendor_id[[:space:]]*: //p' %s/proc/cpuinfo | head -n1", root)


def expected_args(vendor: str) -> list[str]:
    # AMD IOMMUs are on by default (amd_iommu=on is not needed); iommu=pt for both.
    return ["intel_iommu=on", "iommu=pt"] if vendor == "GenuineIntel" else ["iommu=pt"]


def grub_var(host, root: str, name: str) -> str:
    """A variable's value after sourcing the grub defaults file, as update-grub does."""
    return host.check_output(". %s/etc/default/grub && printf '%%s' \"$%s\"", root, name)


def test_grub_default_gets_the_iommu_args_and_keeps_quiet(host, root, vendor):
    args = grub_var(host, root, "GRUB_CMDLINE_LINUX_DEFAULT").split()
    assert args[0] == "quiet", args
    for arg in expected_args(vendor):
        assert args.count(arg) == 1, (arg, args)
    if vendor != "GenuineIntel":
        assert "intel_iommu=on" not in args, args
    assert len(args) == len(set(args)), f"an argument twice: {args}"
    assert grub_var(host, root, "GRUB_CMDLINE_LINUX") == ""


def test_grub_default_keeps_every_other_line(host, root, shared_file):
    stock = shared_file("grub.default").splitlines()
    now = host.file(f"{root}/etc/default/grub").content_string.splitlines()
    assert [ln for ln in now if not ln.startswith(GRUB_KEY)] == [ln for ln in stock if not ln.startswith(GRUB_KEY)]
    assert sum(ln.startswith(GRUB_KEY) for ln in now) == 1
    # update-grub sources the file with sh: it must still parse.
    host.run_expect([0], "sh -n %s/etc/default/grub", root)


def test_grub_default_owner_and_mode(host, root):
    f = host.file(f"{root}/etc/default/grub")
    assert f.is_file and f.user == "root" and f.mode == 0o644


def test_modules_load_d_lists_the_vfio_modules(host, root):
    f = host.file(f"{root}/etc/modules-load.d/gpuprov-vfio.conf")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    assert config_lines(f.content_string) == VFIO_MODULES


def test_initramfs_modules_adds_vfio_and_keeps_the_rest(host, root, shared_file):
    f = host.file(f"{root}/etc/initramfs-tools/modules")
    assert f.is_file and f.user == "root" and f.mode == 0o644
    stock = shared_file("initramfs-modules").splitlines()
    lines = f.content_string.splitlines()
    assert [ln for ln in lines if ln in stock] == stock, "a stock line went missing or moved"
    modules = [ln.split()[0] for ln in config_lines(f.content_string)]
    assert [m for m in modules if m in VFIO_MODULES] == VFIO_MODULES, modules


def test_pending_reboot_fails_by_default(host, root, vendor, converge, scratch_root):
    """A host whose running kernel lacks the args fails with 'reboot required' unless told not to."""
    running = host.file(f"{root}/proc/cmdline").content_string.split()
    owed = [a for a in expected_args(vendor) if a not in running]
    scratch = scratch_root("/srv/reboot")
    run = converge({"iommu_host_root": scratch, "iommu_host_fail_on_pending_reboot": True})
    if owed:
        assert run.failures > 0, run.output
        assert any("reboot required" in msg.lower() for msg in run.failed_msgs), run.failed_msgs
    else:
        assert run.failures == 0, run.output


class TestSharedChecks(RoleChecks):
    """Only under the staged root, check mode right (molecule/_shared/role_checks.py)."""
