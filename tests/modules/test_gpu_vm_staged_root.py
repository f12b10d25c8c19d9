"""gpu_vm with a staged root (issue 11, category 7): it plans and reports, and never touches the
live machine. The module runs in process with PATH holding fake qemu-img, mkdir, virsh, the ISO
tools and rmdir that leave a canary, with the libvirt bindings made unimportable and the live
storage folder outside the root: no canary, nothing outside the root changed, what needs the
live machine listed in ``not_run``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuprov.plan.vm.seed import ISO_TOOLS
from tests.conftest import tree_digest
from tests.modrun import run_in_process
from tests.vmhosts import ssh_public_key

TOOLS = ("qemu-img", "mkdir", "rmdir", "virsh", "virt-install", *ISO_TOOLS)


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A tmp dir holding the staged root, the live-machine stand-ins and the fake tools."""
    outside = tmp_path / "outside"
    fakebin = outside / "bin"
    fakebin.mkdir(parents=True)
    canary = tmp_path / "canary"
    for tool in TOOLS:
        script = fakebin / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {canary}\nexit 0\n')
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(fakebin))
    monkeypatch.setitem(sys.modules, "libvirt", None)  # an import of the bindings fails: never reached
    return {"tmp": tmp_path, "outside": outside, "canary": canary, "storage": outside / "images"}


def staged(world: dict[str, Path], host_root, capture: str) -> Path:
    root = world["tmp"] / "root"
    shutil.copytree(host_root(capture), root, symlinks=True)
    base = root / "srv/base.qcow2"
    base.parent.mkdir(parents=True)
    base.write_bytes(b"QFI\xfb")  # the host's base image, as a staged root holds it
    return root


def vm(**kw: Any) -> dict[str, Any]:
    return {
        "name": "vm1",
        "memory_mib": 128,
        "accel": "tcg",
        "firmware": "bios",
        "network": "default",
        "disk": {"base": "/srv/base.qcow2", "size_gib": 1},
        "cloud_init": {"ssh_authorized_keys": [ssh_public_key()]},
        **kw,
    }


SCENARIOS = {
    "gpu-running-check": ("gpu-audio", {"vm": vm(gpus=["0000:01:00.0"])}, True),
    "gpu-running": ("gpu-audio", {"vm": vm(gpus=["0000:01:00.0"]), "wait_for_address": 600}, False),
    "mdev-running": ("mtty-mdev", {"vm": vm(mdevs=[{"parent": "mtty", "type": "mtty-1"}])}, False),
    "shutdown": ("gpu-audio", {"vm": vm(), "state": "shutdown"}, False),
    "absent-remove-storage": ("gpu-audio", {"vm": vm(), "state": "absent", "remove_storage": True}, False),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_staged_root_never_touches_the_live_machine(scenario: str, world, host_root) -> None:
    capture, args, check = SCENARIOS[scenario]
    root = staged(world, host_root, capture)
    outside = tree_digest(world["outside"])
    sysfs = tree_digest(root / "sys")
    args = {"root": str(root), "storage_dir": str(world["storage"]), "reserved_memory_mib": 0, **args}
    result = run_in_process("gpu_vm", args, check=check)
    assert not result["failed"], result.get("msg")
    assert not world["canary"].exists(), world["canary"].read_text()
    assert tree_digest(world["outside"]) == outside and not world["storage"].exists()
    assert tree_digest(root / "sys") == sysfs  # a capture's sysfs files are never written
    assert sorted(p.name for p in world["tmp"].iterdir()) == ["outside", "root"]
    assert any("libvirt (qemu:///system) was not consulted" in w for w in result["warnings"]), result["warnings"]
    if check:
        assert result["changed"] is True and result["not_run"] == []
        return
    live_only = [s for s in result["plan"] if s.startswith(("run ", "write ", "start ", "define ", "shutdown "))]
    live_only += [s for s in result["plan"] if s.startswith(("undefine ", "destroy "))]
    assert set(live_only) <= set(result["not_run"]), result
    assert live_only or args.get("state") == "absent"  # absent: no domain known, no storage below the root
    assert set(result.get("done", [])) <= {s for s in result["plan"] if s.startswith(("create ", "update "))}
    if scenario == "mdev-running":
        assert any("mdev_supported_types/mtty-1/create" in s for s in result["not_run"])
    if args.get("state", "running") == "running":
        user_data = root / str(world["storage"]).lstrip("/") / "vm1-seed/user-data"
        assert "#cloud-config" in user_data.read_text()  # the host's files are the root's


def test_an_absent_vm_with_a_staged_root_removes_only_below_it(world, host_root) -> None:
    root = staged(world, host_root, "gpu-audio")
    made = run_in_process(
        "gpu_vm", {"vm": vm(), "state": "defined", "root": str(root), "storage_dir": str(world["storage"])}
    )
    assert not made["failed"], made.get("msg")
    seed = root / str(world["storage"]).lstrip("/") / "vm1-seed"
    assert (seed / "user-data").exists()
    gone = run_in_process(
        "gpu_vm",
        {
            "vm": vm(),
            "state": "absent",
            "remove_storage": True,
            "root": str(root),
            "storage_dir": str(world["storage"]),
        },
    )
    assert not gone["failed"], gone.get("msg")
    assert not (seed / "user-data").exists() and any(s.startswith("run rmdir") for s in gone["not_run"])
    assert not world["canary"].exists() and not world["storage"].exists()


@pytest.mark.parametrize("check", [True, False])
def test_install_is_planned_first_in_the_vms_own_run(world, host_root, check: bool) -> None:
    # The VMs concern is one module run (issue #14): what the host lacks comes first in gpu_vm's plan.
    root = staged(world, host_root, "gpu-audio")
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/os-release").write_text("ID=debian\n")
    (root / "run/systemd/system").mkdir(parents=True, exist_ok=True)
    before = tree_digest(root / "sys"), tree_digest(world["outside"])
    args = {"vm": vm(), "state": "defined", "install": True, "root": str(root), "storage_dir": str(world["storage"])}
    result = run_in_process("gpu_vm", args, check=check)
    assert not result["failed"], result.get("msg")
    prefix = "would " if check else ""
    assert result["plan"][0].startswith(f"{prefix}run env DEBIAN_FRONTEND=noninteractive apt-get install -y")
    install = [s for s in result["plan"] if "libvirt runs now and from boot" in s or "apt-get install" in s]
    assert result["plan"][: len(install)] == install and len(install) == 2
    assert any(s.startswith(f"{prefix}define domain vm1") for s in result["plan"]), result["plan"]
    assert result["host"]["os_family"] == "debian" and "python3-libvirt" not in result["host"]["packages"]
    if not check:  # commands of another root are never run here: listed, in plan order
        assert result["not_run"][: len(install)] == install
    assert not world["canary"].exists()
    assert (tree_digest(root / "sys"), tree_digest(world["outside"])) == before


def test_an_unknown_os_without_packages_is_refused_before_the_vm(world, host_root) -> None:
    root = staged(world, host_root, "gpu-audio")
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/os-release").write_text("ID=plan9\n")
    before = tree_digest(root)
    args = {"vm": vm(), "state": "defined", "install": True, "root": str(root), "storage_dir": str(world["storage"])}
    result = run_in_process("gpu_vm", args)
    assert result["failed"] and "no package list for this host's OS" in result["msg"]
    assert tree_digest(root) == before and not world["storage"].exists()
