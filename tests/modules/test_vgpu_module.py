"""gpu_vgpu run for real by ansible on a target Python with neither gpuprov nor
ansible (the code travels as module_utils), over the mtty capture and the
synthetic NVIDIA host; and the zipapp the boot unit runs (built into the
assembled collection, installed by the role), on that same bare Python. Every
refusal leaves the root as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuprov.plan.vgpu import BOOT_PYZ, STATE_FILE, derived_uuid
from tests import vgpuhosts as vh
from tests.conftest import build_collection_tool, collections_path, tree_digest
from tests.modules.test_modules import bare_python, run_module  # noqa: F401 - bare_python is a fixture

LAB_UUID = "5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01"
MTTY = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}, {"type": "Single port serial"}]}}


@pytest.fixture
def mtty(host_root, tmp_path) -> Path:
    dest = tmp_path / "mtty"
    shutil.copytree(host_root("mtty-mdev"), dest, symlinks=True)
    return dest


def built_pyz() -> Path:
    """The boot zipapp of the checkout's assembled collection (roles/vgpu_host/files/)."""
    collections_path()
    tool = build_collection_tool()
    return tool.TREE / tool.BOOT_PYZ


@pytest.fixture
def nvidia(tmp_path) -> Path:
    """The synthetic NVIDIA host with the boot zipapp installed where the role vgpu_host puts it."""
    root = tmp_path / "nvidia"
    vh.build(root).finish()
    (root / BOOT_PYZ).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(built_pyz(), root / BOOT_PYZ)
    return root


def test_mdevs_check_mode_diff_then_apply_then_idempotent(bare_python, mtty) -> None:  # noqa: F811
    before = tree_digest(mtty)
    args = {"gpus": MTTY, "root": str(mtty)}
    dry = run_module(bare_python, "gpu_vgpu", args, check=True)
    assert not dry["failed"] and dry["changed"] is True and tree_digest(mtty) == before
    assert f"+++ after: {mtty}/etc/mdevctl.d/mtty/{LAB_UUID}" in dry["stdout"]
    derived = derived_uuid("mtty", "mtty-1", 0)
    assert dry["created"] == [LAB_UUID, derived]

    first = run_module(bare_python, "gpu_vgpu", args)
    assert first["changed"] is True and first["created"] == [LAB_UUID, derived]
    assert any("mtty-2/create" in s for s in first["not_run"])  # a staged root's sysfs is not written
    assert json.loads((mtty / f"etc/mdevctl.d/mtty/{derived}").read_text())["mdev_type"] == "mtty-1"

    second = run_module(bare_python, "gpu_vgpu", args)
    assert second["changed"] is False, second["plan"]


@pytest.mark.parametrize(
    ("gpus", "text"),
    [
        ({"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-9"}]}}, "mdev type 'mtty-9' is not offered by mtty"),
        ({"mtty": {"use": "vgpu"}}, "use 'vgpu' is not one of"),
        ({"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2"}] * 12}}, "available_instances is 11"),
    ],
)
def test_refusals_change_nothing(bare_python, mtty, gpus, text) -> None:  # noqa: F811
    before = tree_digest(mtty)
    result = run_module(bare_python, "gpu_vgpu", {"gpus": gpus, "root": str(mtty)})
    assert result["failed"] is True
    assert result["msg"].startswith("refused, nothing changed: ") and text in result["msg"]
    assert result["refusals"] and tree_digest(mtty) == before


def test_nvidia_host_layout_scheduler_and_boot_unit(bare_python, nvidia) -> None:  # noqa: F811
    gpus = {
        vh.MDEV_GPU: {"use": "mdev", "mdevs": [{"type": "GRID V100-8Q"}]},
        vh.SRIOV_PF: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}, {"type": 557}]},
        "0000:e1:00.0": {"use": "mig", "mig": {"3g.40gb": 1, "1g.10gb": 2}},
    }
    args = {"gpus": gpus, "scheduler": "fixed_share", "root": str(nvidia)}
    dry = run_module(bare_python, "gpu_vgpu", args, check=True)
    assert not dry["failed"] and f"+++ after: {nvidia}/etc/systemd/system/gpuprov-vgpu.service" in dry["stdout"]
    assert "gpuprov/plan/vgpu" not in dry["stdout"]  # the module writes no code: the unit runs the zipapp
    first = run_module(bare_python, "gpu_vgpu", args)
    assert not first["failed"], first.get("msg")
    assert [(v["vf"], v["type"]) for v in first["vgpus"]] == [(vh.SRIOV_VFS[0], 557), (vh.SRIOV_VFS[1], 557)]
    assert first["mig"]["0000:e1:00.0"]["created"] == ["1g.10gb"]
    assert first["scheduler"]["RmPVMRL"] == "0x11" and first["reboot_required"] is False
    assert "run nvidia-smi mig -i 3 -cgi 19 -C" in " ".join(first["not_run"])
    assert (nvidia / "etc/systemd/system/gpuprov-vgpu.service").exists()
    unit = (nvidia / "etc/systemd/system/gpuprov-vgpu.service").read_text()
    assert f"ExecStart=/usr/bin/python3 /{BOOT_PYZ} --state /{STATE_FILE}" in unit
    assert not (nvidia / "usr/lib/gpuprov/gpuprov").exists()
    again = run_module(bare_python, "gpu_vgpu", args)
    assert again["changed"] is False, again["plan"]


def test_missing_boot_zipapp_is_said(bare_python, nvidia) -> None:  # noqa: F811
    (nvidia / BOOT_PYZ).unlink()
    before = tree_digest(nvidia)
    gpus = {vh.SRIOV_PF: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}]}}
    result = run_module(bare_python, "gpu_vgpu", {"gpus": gpus, "root": str(nvidia)}, check=True)
    assert result["failed"] is False
    assert result["changed"] is True  # the unit and state are still planned: the role installs the runner next
    assert tree_digest(nvidia) == before


def test_boot_zipapp_is_deterministic_and_runs_on_a_bare_python(bare_python, nvidia, tmp_path) -> None:  # noqa: F811
    """What gpuprov-vgpu.service runs: the installed zipapp, the saved layout, nothing else installed."""
    tool = build_collection_tool()
    assert tool.boot_pyz(tool.plan_copies()) == built_pyz().read_bytes()  # same bytes on every build
    pyz = str(nvidia / BOOT_PYZ)
    help_run = subprocess.run([bare_python, "-I", pyz, "--help"], capture_output=True, text=True, cwd="/", check=False)
    assert help_run.returncode == 0 and "--state" in help_run.stdout, help_run.stderr
    gpus = {vh.SRIOV_PF: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}, {"type": 557}]}}
    assert not run_module(bare_python, "gpu_vgpu", {"gpus": gpus, "root": str(nvidia)})["failed"]
    env = {"PATH": os.environ.get("PATH", "")}
    argv = [bare_python, "-I", pyz, "--root", str(nvidia), "--state", str(nvidia / STATE_FILE)]
    check = subprocess.run([*argv, "--check"], env=env, capture_output=True, text=True, cwd="/", check=False)
    assert check.returncode == 0, check.stderr
    vf_types = [line for line in check.stdout.splitlines() if "current_vgpu_type" in line]
    assert len(vf_types) == 2 and all("write '557'" in line for line in vf_types), check.stdout
    before = tree_digest(nvidia)
    run = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/", check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("not run (root is not /): write '557'") == 2, run.stdout
    assert tree_digest(nvidia) == before  # boot mode writes no file
    assert run_module(bare_python, "gpu_vgpu", {"gpus": gpus, "root": str(nvidia)})["changed"] is False
    (nvidia / STATE_FILE).write_text("{garbled")
    broken = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/", check=False)
    assert broken.returncode == 1 and "cannot read" in broken.stderr


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mdevctl") or not shutil.which("unshare"),
    reason="needs root, mdevctl and unshare (mdevctl reads only /etc/mdevctl.d: a private mount stands in)",
)
def test_mdevctl_reads_the_definitions(bare_python, mtty) -> None:  # noqa: F811
    assert not run_module(bare_python, "gpu_vgpu", {"gpus": MTTY, "root": str(mtty)})["failed"]
    conf = mtty / "etc/mdevctl.d"
    for sub in ("scripts.d/callouts", "scripts.d/notifiers"):
        (conf / sub).mkdir(parents=True, exist_ok=True)
    script = f"mount --bind {conf} /etc/mdevctl.d && mdevctl list --defined --dumpjson"
    out = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, check=False)
    if out.returncode != 0 and "Operation not permitted" in out.stderr:
        pytest.skip("no mount namespace here")
    assert out.returncode == 0, out.stderr
    defined = {uuid: d for parent in json.loads(out.stdout) for p in parent["mtty"] for uuid, d in p.items()}
    assert defined == {
        LAB_UUID: {"mdev_type": "mtty-2", "start": "auto", "attrs": []},
        derived_uuid("mtty", "mtty-1", 0): {"mdev_type": "mtty-1", "start": "auto", "attrs": []},
    }
