"""What every planner module reports (gpuprov.modules.common): "would ..." in check mode, and --diff entries for every
action, runtime ones (sysfs writes, commands, libvirt ops) included (gpuprov.modules.common.finish)."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpuprov.core.plan import COMMAND, Action, Plan, file_action, sysfs_write
from gpuprov.modules.common import planned
from gpuprov.plan.vm.plan import START, DomainOp, VmPlan
from tests.conftest import tree_digest
from tests.modrun import run_in_process


def test_check_mode_lines_say_would_and_a_real_run_says_what_it_does() -> None:
    lines = ["create /etc/x (why)", "run update-grub (boot)"]
    assert planned(lines, True) == ["would create /etc/x (why)", "would run update-grub (boot)"]
    assert planned(lines, False) == lines


def test_diff_has_an_entry_per_action_runtime_ones_named_with_their_value() -> None:
    plan = Plan(
        actions=[
            sysfs_write("sys/bus/pci/devices/0000:01:00.0/driver_override", "vfio-pci", "give it to vfio-pci"),
            Action(COMMAND, "the new arguments", argv=["update-grub"]),
            file_action("etc/x", "new\n", None, "a file"),
        ]
    )
    sysfs_entry, command, file_entry = plan.diff("/srv/root/")
    header = "/srv/root/sys/bus/pci/devices/0000:01:00.0/driver_override (sysfs write, now)"
    assert sysfs_entry == {
        "before_header": header,
        "after_header": f"{header}: give it to vfio-pci",
        "before": "",
        "after": "vfio-pci\n",
    }
    assert command["after_header"] == "command (run now): the new arguments" and command["after"] == "update-grub\n"
    assert file_entry["before_header"] == "/srv/root/etc/x" and file_entry["after"] == "new\n"


def test_a_vm_plans_diff_shows_sysfs_steps_runtime_ops_and_clean_up() -> None:
    plan = VmPlan(
        name="vm1",
        sysfs=[sysfs_write("sys/x", "1", "a sysfs step")],
        ops=[DomainOp(START, "state running", "vm1")],
        cleanup=[Action(COMMAND, "clean up", argv=["rm", "-f", "/x"])],
    )
    entries = plan.diff()
    assert [e["after"] for e in entries] == ["1\n", "start domain vm1\n", "rm -f /x\n"]
    assert entries[1]["before_header"] == "libvirt domain vm1 (now)"


def test_vfio_bind_in_check_mode_says_would_and_diffs_its_unbinds(host_root, tmp_path: Path) -> None:
    root = tmp_path / "gpu-audio"
    shutil.copytree(host_root("gpu-audio"), root, symlinks=True)
    before = tree_digest(root)
    args = {"devices": ["0000:01:00.0"], "root": str(root)}
    dry = run_in_process("vfio_bind", args, check=True)
    assert not dry["failed"], dry.get("msg")
    assert dry["changed"] is True and tree_digest(root) == before
    assert dry["plan"] and all(line.startswith("would ") for line in dry["plan"])
    assert any(
        line.startswith("would write '0000:01:00.1' to /sys/bus/pci/drivers/snd_hda_intel/unbind")
        for line in dry["plan"]
    )
    unbind = [
        d
        for d in dry["diff"]
        if d["before_header"].endswith("/sys/bus/pci/drivers/snd_hda_intel/unbind (sysfs write, now)")
    ]
    assert unbind and unbind[0]["after"] == "0000:01:00.1\n"
    assert len(dry["diff"]) == len(dry["plan"])  # every action, file or runtime, has its entry
    real = run_in_process("vfio_bind", args)
    assert not real["failed"] and not any(line.startswith("would ") for line in real["plan"])
