"""What a host record imports (issue #30, the fleet at scale): every module run of the fleet report
and the planners is a fresh interpreter, so code a host's declaration does not need is not loaded.
A host declaring passthrough GPUs alone reads no vGPU planner, no layout-file parser, no VM-list
checks and no boot-trial code; one declaring an mdev layout still gets its UUIDs (vgpu_host's one
scheme)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import fleethosts
from tests.conftest import REPO

PASSTHROUGH = {"gpuprov_host": {"gpus": [{"name": "gpu", "address": fleethosts.EDU, "use": "passthrough"}]}}
# Imported only for the declarations that need them.
NOT_FOR_PASSTHROUGH = [
    "gpuprov.plan.vgpu.mdev",
    "gpuprov.plan.vgpu.sriov",
    "gpuprov.inputs.vgpu_request",
    "gpuprov.model.formats",
    "gpuprov.inputs.boundary",
    "gpuprov.facts.bootloader",
    # The VM list's checks and uuid (the host settings are checked apart), and the kernel
    # arguments' planner and rules (drift reads GRUB through plan.host.grubvar).
    "gpuprov.inputs.vm_list",
    "uuid",
    "gpuprov.plan.host.cmdline",
    "gpuprov.inputs.kernel_args",
]
SCRIPT = """
import json, sys
from gpuprov.report.fleet import host_record
record = host_record(sys.argv[1], json.loads(sys.argv[2]), nvml="never")
print(json.dumps({"status": record["status"], "not_ready": record["not_ready"],
                  "loaded": [m for m in json.loads(sys.argv[3]) if m in sys.modules]}))
"""


def _record(root: Path, doc: dict[str, object]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(root), json.dumps(doc), json.dumps(NOT_FOR_PASSTHROUGH)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(proc.stdout)


def test_a_passthrough_host_record_loads_no_vgpu_layout_or_vm_code(tmp_path: Path) -> None:
    root = fleethosts.unpack("gpu-audio", tmp_path / "root")
    fleethosts.grub_as_booted(root)
    fleethosts.bind(root, fleethosts.EDU, "vfio-pci")
    out = _record(root, PASSTHROUGH)
    assert out["loaded"] == []
    assert out["status"] == "converged", out


def test_a_declaration_with_vms_and_a_layout_file_is_still_checked(tmp_path: Path) -> None:
    root = fleethosts.unpack("gpu-audio", tmp_path / "root")
    # CPUs the host does not have: the VM list's own check (the schema cannot know the host).
    vm = {"name": "vm1", "memory_mib": 4096, "vcpus": 2, "cpuset": "4000-4001", "gpus": ["gpu"]}
    out = _record(root, {"gpuprov_host": dict(PASSTHROUGH["gpuprov_host"], vms=[vm])})
    assert "gpuprov.inputs.boundary" in out["loaded"]
    assert any("cpuset" in r["message"] for r in out["not_ready"]), out["not_ready"]
    layouts = {"version": "v1", "mig-configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}]}}
    out = _record(root, {"gpuprov_host": PASSTHROUGH["gpuprov_host"], "gpuprov_layouts": layouts})
    assert "gpuprov.model.formats" in out["loaded"]  # a mig-parted file is converted
