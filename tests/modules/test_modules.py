"""The Ansible modules, run for real by ansible (AnsiballZ) on a target
interpreter that has neither gpuprov nor ansible installed: the gpuprov code
travels with the module as module_utils. Roots are writable copies of captured
hosts; every refusal leaves them exactly as they were."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import collections_path, tree_digest
from tests.plan.test_cmdline import sourced

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = shutil.which("ansible", path=str(Path(sys.executable).parent)) or shutil.which("ansible")
GRUB = 'GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n'


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Python with the standard library only, as on a fresh target host."""
    venv = tmp_path_factory.mktemp("target") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    for package in ("gpuprov", "ansible"):
        probe = subprocess.run([python, "-c", f"import {package}"], capture_output=True, cwd="/", check=False)
        assert probe.returncode != 0, f"the target interpreter must not have {package}"
    return python


@pytest.fixture
def staged(host_root, tmp_path):
    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(host_root(name), dest, symlinks=True)
        (dest / "etc/default").mkdir(parents=True, exist_ok=True)
        (dest / "etc/default/grub").write_text(GRUB)
        return dest

    return copy


def run_module(python: str, module: str, args: dict[str, Any], *, check: bool = False) -> dict[str, Any]:
    """Run gpuprov.kvm.``module`` from the checkout's collection (ansible.cfg) on ``python``."""
    assert ANSIBLE, "ansible is not installed: scripts/test.sh installs the test extra"
    collections_path()
    cmd = [ANSIBLE, "localhost", "-c", "local", "-m", f"gpuprov.kvm.{module}", "-a", json.dumps(args)]
    cmd += ["-e", f"ansible_python_interpreter={python}", "--diff"] + (["--check"] if check else [])
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_LOCALHOST_WARNING": "0",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
    }
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    # ad-hoc output: "localhost | CHANGED => {...json...}", after any --diff text
    head = out.stdout.find("localhost | ")
    start = out.stdout.find("{", head)
    try:
        result, _ = json.JSONDecoder().raw_decode(out.stdout[start:])
    except ValueError:
        raise AssertionError(f"ansible printed no result: {out.stdout[-2000:]}\n{out.stderr[-2000:]}") from None
    result["failed"] = out.stdout[head:start].startswith("localhost | FAILED")
    result["stdout"], result["stderr"] = out.stdout, out.stderr  # warnings: "[WARNING]: ..." on stderr
    return result


def test_gpu_host_facts_on_the_h100_capture(bare_python, host_root) -> None:
    result = run_module(bare_python, "gpu_host_facts", {"root": str(host_root("h100-passthrough-guest"))})
    assert not result.get("failed"), result.get("msg")
    (gpu,) = result["ansible_facts"]["gpuprov"]["gpus"]
    assert (gpu["address"], gpu["driver"], gpu["ready"]) == ("0000:00:06.0", "nvidia", False)
    assert result["changed"] is False


@pytest.mark.parametrize(
    ("host", "args", "text"),
    [
        ("boot-vga", {"devices": ["0000:00:02.0"]}, "is the boot display (boot_vga=1)"),
        ("gpu-bridge-nic", {"devices": ["0000:02:01.0"]}, "is NIC eth0, which carries the default route"),
        ("nvme-swap", {"devices": ["0000:03:00.0"]}, "controls block device nvme1n1"),
        ("gpu-alone", {"devices": ["0000:00:1f.3"]}, "is a chipset device (ISA bridge)"),
        ("vfio-bound", {"devices": ["0000:01:00.0"], "state": "unbound"}, "is in use: sleep (pid"),
        ("h100-passthrough-guest", {"devices": ["0000:00:06.0"]}, "the IOMMU is off"),
        ("gpu-alone", {"devices": ["10de:2330"]}, "'10de:2330' is not a PCI address"),
        # Bridges are never passable, whatever the override (docs/concepts/safety-rules.md).
        (
            "gpu-alone",
            {"devices": ["0000:00:01.0"], "allow_unsafe": ["0000:00:01.0"]},
            "0000:00:01.0 is a PCIe root or switch port",
        ),
        (
            "gpu-bridge-nic",
            {"devices": ["0000:01:00.0"], "allow_unsafe": ["0000:01:00.0"]},
            "0000:01:00.0 is a PCI-to-PCI bridge",
        ),
        ("gpu-alone", {"devices": ["0000:00:00.0"], "allow_unsafe": ["0000:00:00.0"]}, "0000:00:00.0 is a host bridge"),
    ],
)
def test_vfio_bind_refuses_and_changes_nothing(bare_python, staged, host, args, text) -> None:
    root = staged(host)
    before = tree_digest(root)
    result = run_module(bare_python, "vfio_bind", {**args, "root": str(root)})
    assert result["failed"] is True
    assert result["msg"].startswith("refused, nothing changed: ") and text in result["msg"]
    assert result["refusals"] and tree_digest(root) == before


def test_vfio_bind_refuses_when_evidence_is_missing(bare_python, staged) -> None:
    """Fail closed: with the IOMMU groups gone, the edu's group (shared with the default-route NIC) is unknown."""
    root = staged("gpu-bridge-nic")
    shutil.rmtree(root / "sys/kernel/iommu_groups")
    before = tree_digest(root)
    result = run_module(bare_python, "vfio_bind", {"devices": ["0000:02:01.0"], "root": str(root)})
    assert result["failed"] is True and "unknown: IOMMU groups could not be read" in result["msg"]
    assert tree_digest(root) == before


@pytest.mark.parametrize(
    ("host", "text"),
    [
        ({"gpus": [{"name": "gpu", "address": "0000:09:00.0", "use": "passthrough"}]}, "0000:09:00.0"),
        ({"gpus": [{"name": "gpu", "address": "0000:01:00.0", "use": "passthrough", "expect": "10de:ffff"}]}, "gpu"),
        ({"gpus": [{"name": "gpu", "address": "0000:01:00.0", "use": "bogus"}]}, "use"),
    ],
)
def test_vfio_bind_refuses_a_declaration_that_does_not_fit_as_gpu_host_model_does(
    bare_python, staged, host, text
) -> None:
    root = staged("gpu-audio")
    before = tree_digest(root)
    bound = run_module(bare_python, "vfio_bind", {"host": host, "root": str(root)})
    model = run_module(bare_python, "gpu_host_model", {"host": host, "root": str(root)})
    assert bound["failed"] and model["failed"] and text in bound["msg"]
    assert bound["refusals"] == model["refusals"]  # one resolution, one verdict
    assert tree_digest(root) == before and "ansible_facts" not in bound


def test_vfio_bind_binds_what_the_declaration_passes_through_and_returns_the_model(bare_python, staged) -> None:
    root = staged("gpu-audio")
    host = {"gpus": [{"name": "gpu", "address": "0000:01:00.0", "use": "passthrough"}]}
    by_host = run_module(bare_python, "vfio_bind", {"host": host, "root": str(root)}, check=True)
    by_list = run_module(bare_python, "vfio_bind", {"devices": ["0000:01:00.0"], "root": str(root)}, check=True)
    assert not by_host["failed"] and by_host["plan"] == by_list["plan"] and by_host["changed"] is True
    model = run_module(bare_python, "gpu_host_model", {"host": host, "root": str(root)})
    assert by_host["ansible_facts"]["gpuprov_model"] == model["ansible_facts"]["gpuprov_model"]
    kept = run_module(
        bare_python, "vfio_bind", {"host": {"gpus": [{**host["gpus"][0], "use": "host"}]}, "root": str(root)}
    )
    assert (
        kept["changed"] is False and kept["plan"] == [] and kept["ansible_facts"]["gpuprov_model"]["vfio_devices"] == []
    )


def test_vfio_bind_check_mode_diff_then_apply_then_idempotent(bare_python, staged) -> None:
    root = staged("gpu-audio")
    before = tree_digest(root)
    args = {"devices": ["0000:01:00.0"], "root": str(root)}

    dry = run_module(bare_python, "vfio_bind", args, check=True)
    assert dry["changed"] is True and tree_digest(root) == before
    assert f"+++ after: {root}/etc/udev/rules.d/61-gpuprov-vfio.rules" in dry["stdout"]
    assert dry["devices"] == ["0000:01:00.0", "0000:01:00.1"]

    first = run_module(bare_python, "vfio_bind", args)
    assert first["changed"] is True
    assert first["previous_drivers"] == {"0000:01:00.0": None, "0000:01:00.1": "snd_hda_intel"}
    assert any("drivers_probe" in s for s in first["not_run"])  # a staged root's sysfs is not written
    assert (root / "etc/udev/rules.d/61-gpuprov-vfio.rules").exists()

    second = run_module(bare_python, "vfio_bind", args)
    assert second["changed"] is False


def test_kernel_cmdline_check_apply_idempotent(bare_python, staged) -> None:
    root = staged("ci-host-no-iommu")
    args = {"arguments": ["intel_iommu=on", "iommu=pt"], "root": str(root)}
    dry = run_module(bare_python, "kernel_cmdline", args, check=True)
    assert dry["changed"] is True and (root / "etc/default/grub").read_text() == GRUB
    assert dry["reboot_required"] is True  # the captured kernel runs without the args

    first = run_module(bare_python, "kernel_cmdline", args)
    assert first["changed"] is True and first["args_after"] == "quiet intel_iommu=on iommu=pt"
    grub = (root / "etc/default/grub").read_text()
    assert grub == GRUB.replace('DEFAULT="quiet"', 'DEFAULT="quiet intel_iommu=on iommu=pt"')
    assert first["not_run"] == ["run update-grub (regenerate the GRUB menu)"]

    assert run_module(bare_python, "kernel_cmdline", args)["changed"] is False


def test_kernel_cmdline_rejects_a_bad_argument(bare_python, staged) -> None:
    root = staged("gpu-alone")
    before = tree_digest(root)
    result = run_module(bare_python, "kernel_cmdline", {"arguments": ["intel iommu"], "root": str(root)})
    assert result["failed"] and result["msg"].startswith("refused, nothing changed: arguments: 'intel iommu' is 2")
    assert "; fix: give each argument as its own item" in result["msg"]
    assert tree_digest(root) == before


@pytest.mark.parametrize(
    ("args", "grub", "text"),
    [
        ({"arguments": ["foo=$(touch CANARY)"]}, GRUB, "holds $ at position 4"),
        ({"arguments": ["quiet"], "variable": "FOO\nrm -rf /"}, GRUB, "variable 'FOO\\nrm -rf /' is not a GRUB"),
        ({"arguments": ["quiet"], "variable": "PATH"}, GRUB, "variable 'PATH' is not a GRUB"),
        ({"arguments": ["iommu=pt"]}, 'GRUB_CMDLINE_LINUX_DEFAULT="$(touch CANARY)"\n', "cannot be edited safely"),
    ],
    ids=["substitution", "variable-newline", "variable-path", "substitution-in-file"],
)
def test_kernel_cmdline_refuses_hostile_input_and_runs_nothing(bare_python, staged, tmp_path, args, grub, text) -> None:
    canary = tmp_path / "canary"
    root = staged("gpu-alone")
    (root / "etc/default/grub").write_text(grub.replace("CANARY", str(canary)))
    before = tree_digest(root)
    args = {k: [a.replace("CANARY", str(canary)) for a in v] if k == "arguments" else v for k, v in args.items()}
    result = run_module(bare_python, "kernel_cmdline", {**args, "root": str(root)})
    assert result["failed"] and result["msg"].startswith("refused, nothing changed: ") and text in result["msg"]
    assert tree_digest(root) == before and not canary.exists()


def test_kernel_cmdline_quoted_value_apply_idempotent_remove(bare_python, staged, tmp_path) -> None:
    root = staged("gpu-alone")
    args = {"arguments": ['acpi_osi="Windows 2015"'], "root": str(root)}
    first = run_module(bare_python, "kernel_cmdline", args)
    assert first["changed"] is True and first["args_after"] == 'quiet acpi_osi="Windows 2015"'
    assert sourced(tmp_path, root) == ["quiet", 'acpi_osi="Windows 2015"']
    assert run_module(bare_python, "kernel_cmdline", args)["changed"] is False
    gone = run_module(bare_python, "kernel_cmdline", {"remove": ["acpi_osi"], "root": str(root)})
    assert gone["changed"] is True and sourced(tmp_path, root) == ["quiet"]
