"""vGPU planning over the mtty capture (a real mdev parent) and the synthetic
NVIDIA host of tests/vgpuhosts.py: every refusal with its text, its fix and
nothing changed; mdevs, SR-IOV VF types, MIG layouts, the scheduler and the
files that keep them across reboots; idempotence."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuprov.apply.actions import ApplyError, apply
from gpuprov.apply.vgpu import converge, plan_host, wait_for_vfs
from gpuprov.facts.sysfs import Sysfs
from gpuprov.plan.vgpu import (
    BOOT_UNIT,
    MDEVCTL_RULE,
    SCHEDULER_CONF,
    STATE_FILE,
    VgpuPlan,
    VgpuRequest,
    derived_uuid,
    mdevctl_definition,
    registry_value,
)
from tests import vgpuhosts as vh
from tests.conftest import tree_digest

MTTY_EXISTING = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"  # an mtty-2 the capture holds, in IOMMU group 9
LAB_UUID = "5e2bb1d2-6a4b-4c4e-9b1a-0f0e2d1c0b01"
V100 = vh.MDEV_GPU
A100 = vh.SRIOV_PF
VF4, VF5, VF6, VF7 = vh.SRIOV_VFS


@pytest.fixture
def mtty(host_root, tmp_path) -> Path:
    dest = tmp_path / "mtty"
    shutil.copytree(host_root("mtty-mdev"), dest, symlinks=True)
    return dest


@pytest.fixture
def nvidia(tmp_path):
    """build(**kw) -> the synthetic NVIDIA host's root (a new one per call)."""
    count = [0]

    def make(setup: Any = None, **kw: Any) -> Path:
        count[0] += 1
        root = tmp_path / f"nvidia{count[0]}"
        fake = vh.build(root, **{"boot_runner": True, **kw})
        if setup:
            setup(fake)
        fake.finish()
        return root

    return make


def plan_of(root: Path, gpus: Any, **kw: Any) -> VgpuPlan:
    return plan_host(Sysfs(str(root)), VgpuRequest(gpus=gpus, **kw))


def state_file(root: Path, gpus: dict[str, Any], names: dict[str, str] | None = None) -> None:
    """A saved layout as an earlier run wrote it: these instances are gpuprov's."""
    doc = {"schema": "gpuprov.vgpu-state/v1", "gpus": gpus, "vgpu_type_names": names or {}}
    (root / STATE_FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / STATE_FILE).write_text(json.dumps(doc))


def assert_refused(root: Path, gpus: Any, text: str, fix: str | None = None, **kw: Any) -> VgpuPlan:
    before = tree_digest(root)
    plan = plan_of(root, gpus, **kw)
    assert plan.refused, plan.describe()
    assert not plan.actions
    assert text in plan.refusal_text(), plan.refusal_text()
    if fix is not None:
        assert any(fix in (r.fix or "") for r in plan.refusals), [r.fix for r in plan.refusals]
    with pytest.raises(ApplyError, match="refused, nothing changed"):
        converge(str(root), VgpuRequest(gpus=gpus, **kw))
    assert tree_digest(root) == before
    return plan


def sysfs_writes(plan: VgpuPlan) -> list[tuple[str, str]]:
    return [(a.path or "", a.content or "") for a in plan.actions if a.kind == "sysfs"]


def commands(plan: VgpuPlan) -> list[list[str]]:
    return [a.argv or [] for a in plan.actions if a.kind == "command"]


def files(plan: VgpuPlan) -> dict[str, str | None]:
    return {a.path or "": a.content for a in plan.actions if a.kind in ("file", "remove")}


# ------------------------------------------------------------------ refusals: the config itself


@pytest.mark.parametrize(
    ("gpus", "text", "fix"),
    [
        (["mtty"], "gpuprov_gpus must be a mapping keyed by PCI address, not a list", None),
        ({"mtty": "mdev"}, "gpuprov_gpus['mtty'] must be a mapping with use", "use is one of passthrough, host, mdev"),
        ({V100: {"use": "vgpu"}}, "use 'vgpu' is not one of passthrough, host, mdev, sriov_vgpu, mig", None),
        ({"mtty": {"use": "mdev", "mdevs": [], "count": 2}}, "unknown keys count", "known keys here: use, mdevs"),
        ({"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "name": "a"}]}}, "mdevs[0]: unknown keys name", None),
        ({"mtty": {"use": "mdev", "mdevs": "mtty-2"}}, "mtty: mdevs: must be a list, not the string 'mtty-2'", None),
        ({"mtty": {"use": "mdev", "mdevs": [{"uuid": LAB_UUID}]}}, "mdevs[0] must be a mapping with a type", None),
        (
            {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": "5e2bb1d2"}]}},
            "uuid: '5e2bb1d2' is not a UUID",
            None,
        ),
        ({"0000:81:00": {"use": "mig", "mig": []}}, "'0000:81:00' is not a PCI address", "full PCI address"),
        ({"gpu1": {"use": "sriov_vgpu", "vgpus": []}}, "key 'gpu1' is not a PCI address", "only use: mdev takes"),
        ({A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557, "vf": "c1:00"}]}}, "vgpus[0]: vf: 'c1:00' is not", None),
        (
            {A100: {"use": "sriov_vgpu", "vgpus": [{"type": [557]}]}},
            "type [557] must be a vGPU type name or numeric",
            None,
        ),
        ({"0000:e1:00.0": {"use": "mig", "mig": {"1g.10gb": "seven"}}}, "count 'seven' for 1g.10gb", None),
        (
            {"81:00.0": {"use": "mdev", "mdevs": []}, V100: {"use": "mdev", "mdevs": []}},
            f"{V100} is declared twice in gpuprov_gpus ('81:00.0' and '{V100}')",
            "keep one entry",
        ),
    ],
)
def test_bad_config_is_refused_with_the_fix(nvidia, gpus, text, fix) -> None:
    assert_refused(nvidia(), gpus, text, fix)


def test_scheduler_values_are_checked(nvidia) -> None:
    root = nvidia()
    assert_refused(root, {}, "scheduler 'round_robin' is not one of best_effort, equal_share", scheduler="round_robin")
    assert_refused(root, {}, "scheduler_timeslice_ms 40 needs", scheduler="fixed_share", scheduler_timeslice_ms=40)
    assert_refused(root, {}, "scheduler_timeslice_ms 8 needs", scheduler="best_effort", scheduler_timeslice_ms=8)
    assert_refused(root, {}, "scheduler_timeslice_ms is set but scheduler is not", scheduler_timeslice_ms=8)


def test_passthrough_and_host_entries_are_not_ours(nvidia) -> None:
    plan = plan_of(nvidia(), {A100: {"use": "passthrough", "rom": "off"}, V100: {"use": "host"}})
    assert not plan.refused and plan.actions == []


# ------------------------------------------------------------------ refusals: mdev


@pytest.mark.parametrize(
    ("gpus", "text", "fix"),
    [
        (
            {"mtty2": {"use": "mdev", "mdevs": [{"type": "mtty-1"}]}},
            "no mdev parent mtty2 on this host (mdev parents here: mtty)",
            "load the parent's driver",
        ),
        (
            {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-3"}]}},
            "mtty: mdevs[0]: mdev type 'mtty-3' is not offered by mtty "
            "(offered: mtty-1 (Single port serial), mtty-2 (Dual port serial))",
            "use one of the offered types",
        ),
        (
            {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2"}] * 12}},
            "12 new mtty-2 mdevs on mtty but available_instances is 11",
            "declare fewer or smaller vGPUs",
        ),
        (
            {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-1", "uuid": MTTY_EXISTING}]}},
            f"mdev {MTTY_EXISTING} exists already as mtty-2 on mtty, not mtty-1 on mtty, and gpuprov did not make it",
            "give this entry another UUID",
        ),
        (
            {
                "mtty": {
                    "use": "mdev",
                    "mdevs": [{"type": "mtty-1", "uuid": LAB_UUID}, {"type": "mtty-2", "uuid": LAB_UUID}],
                }
            },
            f"mdev {LAB_UUID} is declared twice",
            "give each mdev its own UUID",
        ),
    ],
)
def test_mdev_refusals_on_the_mtty_capture(mtty, gpus, text, fix) -> None:
    assert_refused(mtty, gpus, text, fix)


def test_mdev_refusals_on_nvidia_parents(nvidia) -> None:
    root = nvidia()
    assert_refused(
        root,
        {"0000:e1:00.0": {"use": "mdev", "mdevs": [{"type": "nvidia-259"}]}},
        "0000:e1:00.0 offers no mdev types (driver nvidia; mdev parents here: 0000:81:00.0)",
        "use: sriov_vgpu",
    )
    assert_refused(
        root,
        {V100: {"use": "mdev", "mdevs": [{"type": "nvidia-259"}, {"type": "GRID V100-16Q"}]}},
        f"mixed vGPU types on {V100} (nvidia-259 for mdev ",
        "set mixed_vgpu_types",
    )
    plan = plan_of(
        root, {V100: {"use": "mdev", "mdevs": [{"type": "nvidia-259"}, {"type": "nvidia-260"}]}}, mixed_vgpu_types=True
    )
    assert not plan.refused


def test_mixed_types_count_the_mdevs_already_there(nvidia) -> None:
    root = nvidia(lambda fake: vh.mdev_instance(fake, V100, "nvidia-260", LAB_UUID, 300))
    assert_refused(root, {V100: {"use": "mdev", "mdevs": [{"type": "nvidia-259"}]}}, f"existing mdev {LAB_UUID}")


@pytest.mark.parametrize("user", ["domain", "open"])
def test_removing_an_mdev_in_use_is_refused(mtty, user) -> None:
    # The capture's mtty-2 is gpuprov's (saved layout) and the config no longer names it.
    state_file(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": MTTY_EXISTING}]}})
    if user == "domain":
        fake_domain = (
            "<domstatus><domain><name>vm1</name><devices><hostdev type='mdev'><source>"
            f"<address uuid='{MTTY_EXISTING.upper()}'/></source></hostdev></devices></domain></domstatus>"
        )
        (mtty / "run/libvirt/qemu").mkdir(parents=True)
        (mtty / "run/libvirt/qemu/vm1.xml").write_text(fake_domain)
        text = "in use by running domain vm1"
    else:
        (mtty / "proc/4242/fd").mkdir(parents=True)
        (mtty / "proc/4242/comm").write_text("qemu-system-x86\n")
        (mtty / "proc/4242/fd/7").symlink_to("/dev/vfio/9")
        text = "in use by qemu-system-x86 (pid 4242) has /dev/vfio/9 open"
    assert_refused(
        mtty,
        {"mtty": {"use": "mdev", "mdevs": []}},
        f"removing mdev {MTTY_EXISTING} (mtty-2 on mtty): {text}",
        "shut the domain down",
    )
    # Changing its type is refused the same way.
    assert_refused(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-1", "uuid": MTTY_EXISTING}]}}, text)


def _garbled_domain_status(root: Path) -> None:
    (root / "run/libvirt/qemu").mkdir(parents=True)
    (root / "run/libvirt/qemu/vm1.xml").write_text("<domstatus><broken")


def _process_with_unreadable_fds(root: Path) -> None:
    (root / "proc/4242").mkdir(parents=True)  # its fd/ cannot be listed


def _unknown_drm_card_open(root: Path) -> None:
    (root / "proc/4242/fd").mkdir(parents=True)
    (root / "proc/4242/fd/3").symlink_to("/dev/dri/card9")


@pytest.mark.parametrize(
    ("setup", "text"),
    [
        (_garbled_domain_status, "unknown: running libvirt domains could not be read (/run/libvirt/qemu/vm1.xml"),
        (_process_with_unreadable_fds, "unknown: open device files could not be read (/proc/4242/fd"),
        (_unknown_drm_card_open, "unknown: the device behind /dev/dri/card9 could not be read"),
    ],
    ids=["domain-status-garbage", "fd-dir-unreadable", "unknown-drm-card"],
)
def test_removing_an_mdev_whose_users_are_unknown_is_refused(mtty, setup, text) -> None:
    """Fail closed (docs/concepts/safety-rules.md): in-use evidence that cannot be read counts as in use."""
    state_file(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": MTTY_EXISTING}]}})
    setup(mtty)
    assert_refused(
        mtty, {"mtty": {"use": "mdev", "mdevs": []}}, f"removing mdev {MTTY_EXISTING} (mtty-2 on mtty): {text}"
    )


# ------------------------------------------------------------------ mdev: create, keep, remove


def test_mdevs_on_mtty_are_created_persisted_and_idempotent(mtty) -> None:
    gpus = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}, {"type": "Single port serial"}]}}
    plan = plan_of(mtty, gpus)
    derived = derived_uuid("mtty", "mtty-1", 0)
    assert sysfs_writes(plan) == [
        ("sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create", LAB_UUID),
        ("sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1/create", derived),
    ]
    assert [(m["uuid"], m["type"], m["state"]) for m in plan.mdevs] == [
        (LAB_UUID, "mtty-2", "created"),
        (derived, "mtty-1", "created"),
    ]
    assert plan.result()["created"] == [LAB_UUID, derived]
    before_sys = tree_digest(mtty / "sys")
    applied = apply(plan, str(mtty))
    assert tree_digest(mtty / "sys") == before_sys  # a captured root's sysfs is never written
    assert len(applied.not_run) == 2
    definition = json.loads((mtty / f"etc/mdevctl.d/mtty/{LAB_UUID}").read_text())
    assert definition == {"mdev_type": "mtty-2", "start": "auto", "attrs": []}
    assert (mtty / f"etc/mdevctl.d/mtty/{derived}").read_text() == mdevctl_definition("mtty-1")
    saved = json.loads((mtty / STATE_FILE).read_text())
    assert saved["gpus"] == {
        "mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}, {"type": "mtty-1", "uuid": derived}]}
    }
    # mdevs only: no boot unit, no copy of the planner, no scheduler file.
    assert not (mtty / BOOT_UNIT).exists() and not (mtty / "usr/lib/gpuprov").exists()
    assert not (mtty / SCHEDULER_CONF).exists()
    again = plan_of(mtty, gpus)
    assert files(again) == {} and derived in {m["uuid"] for m in again.mdevs}


def test_derived_uuids_do_not_move_when_entries_are_added(mtty) -> None:
    one = plan_of(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-1"}]}})
    two = plan_of(
        mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2"}, {"type": "mtty-1"}, {"type": "mtty-1"}]}}
    )
    first = one.mdevs[0]["uuid"]
    assert first == two.mdevs[1]["uuid"] and two.mdevs[2]["uuid"] not in (first, two.mdevs[0]["uuid"])


def test_an_existing_mdev_of_the_same_type_is_adopted(mtty) -> None:
    plan = plan_of(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": MTTY_EXISTING}]}})
    assert sysfs_writes(plan) == [] and plan.mdevs[0]["state"] == "present"
    assert f"etc/mdevctl.d/mtty/{MTTY_EXISTING}" in files(plan)


def test_only_mdevs_gpuprov_made_are_removed_unless_prune(mtty) -> None:
    gone = {"mtty": {"use": "mdev", "mdevs": []}}
    assert sysfs_writes(plan_of(mtty, gone)) == []  # not ours: left alone
    pruned = plan_of(mtty, gone, prune=True)
    assert sysfs_writes(pruned) == [(f"sys/bus/mdev/devices/{MTTY_EXISTING}/remove", "1")]
    assert pruned.result()["removed"] == [MTTY_EXISTING]
    # Ours (in the saved layout, with its mdevctl definition): removed with the definition.
    state_file(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": MTTY_EXISTING}]}})
    (mtty / "etc/mdevctl.d/mtty").mkdir(parents=True)
    (mtty / f"etc/mdevctl.d/mtty/{MTTY_EXISTING}").write_text(mdevctl_definition("mtty-2"))
    (mtty / f"etc/mdevctl.d/mtty/{LAB_UUID}").write_text(mdevctl_definition("mtty-1"))  # someone else's
    plan = plan_of(mtty, gone)
    assert sysfs_writes(plan) == [(f"sys/bus/mdev/devices/{MTTY_EXISTING}/remove", "1")]
    assert files(plan)[f"etc/mdevctl.d/mtty/{MTTY_EXISTING}"] is None
    apply(plan, str(mtty))
    assert (mtty / f"etc/mdevctl.d/mtty/{LAB_UUID}").exists()
    assert not (mtty / f"etc/mdevctl.d/mtty/{MTTY_EXISTING}").exists()
    assert json.loads((mtty / STATE_FILE).read_text())["gpus"] == {"mtty": {"use": "mdev", "mdevs": []}}
    # Nothing declared at all: the saved layout goes too.
    assert files(plan_of(mtty, {})) == {STATE_FILE: None}


def test_a_managed_mdev_changes_type_by_remove_then_create(mtty) -> None:
    state_file(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": MTTY_EXISTING}]}})
    plan = plan_of(mtty, {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-1", "uuid": MTTY_EXISTING}]}})
    assert sysfs_writes(plan) == [
        (f"sys/bus/mdev/devices/{MTTY_EXISTING}/remove", "1"),
        ("sys/class/mdev_bus/mtty/mdev_supported_types/mtty-1/create", MTTY_EXISTING),
    ]
    assert plan.mdevs[0]["replaces"] == "mtty-2 on mtty" and plan.result()["removed"] == []


def test_a_garbled_saved_layout_removes_nothing(mtty) -> None:
    (mtty / STATE_FILE).parent.mkdir(parents=True)
    (mtty / STATE_FILE).write_text("{not json")
    plan = plan_of(mtty, {"mtty": {"use": "mdev", "mdevs": []}})
    assert sysfs_writes(plan) == [] and any("unreadable" in w for w in plan.warnings)


def test_debian_mdevctl_rule_is_overridden_with_the_real_path(mtty) -> None:
    # The rule Debian 12's mdevctl 1.2.0-3+b1 ships: it runs /usr/sbin/mdevctl, the package has /usr/bin/mdevctl.
    rule = (Path(__file__).parents[1] / "fixtures/vgpu/debian12-60-mdevctl.rules").read_text()
    (mtty / "usr/lib/udev/rules.d").mkdir(parents=True)
    (mtty / "usr/lib/udev/rules.d/60-mdevctl.rules").write_text(rule)
    (mtty / "usr/bin").mkdir(parents=True, exist_ok=True)
    (mtty / "usr/bin/mdevctl").write_text("")
    gpus = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}]}}
    plan = plan_of(mtty, gpus)
    fixed = files(plan)[MDEVCTL_RULE] or ""
    assert "/usr/bin/mdevctl start-parent-mdevs %k" in fixed and "/usr/sbin/mdevctl start" not in fixed
    assert ["udevadm", "control", "--reload"] in commands(plan)
    assert not any("mdevctl is not installed" in w for w in plan.warnings)
    # Where the packaged path is right, nothing is written.
    (mtty / "usr/sbin").mkdir(parents=True, exist_ok=True)
    (mtty / "usr/bin/mdevctl").rename(mtty / "usr/sbin/mdevctl")
    assert MDEVCTL_RULE not in files(plan_of(mtty, gpus))


# ------------------------------------------------------------------ SR-IOV vGPU


def test_vf_types_by_name_and_pinned_id(nvidia) -> None:
    root = nvidia()
    gpus = {A100: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}, {"type": 557, "vf": VF7}]}}
    plan = plan_of(root, gpus)
    assert [(p.rsplit("/", 3)[-3], v) for p, v in sysfs_writes(plan)] == [(VF4, "557"), (VF7, "557")]
    assert [(v["vf"], v["type"], v["name"], v["state"]) for v in plan.vgpus] == [
        (VF4, 557, "NVIDIA A100-4C", "set"),
        (VF7, 557, "NVIDIA A100-4C", "set"),
    ]
    saved = json.loads(files(plan)[STATE_FILE] or "")
    assert saved["gpus"][A100]["vgpus"] == [{"type": 557, "vf": VF4}, {"type": 557, "vf": VF7}]
    assert saved["vgpu_type_names"] == {"557": "NVIDIA A100-4C"}
    unit = files(plan)[BOOT_UNIT] or ""
    assert "ExecStart=/usr/bin/python3 /usr/lib/gpuprov/gpuprov-vgpu.pyz --state /etc/gpuprov/vgpu.json" in unit
    assert "Environment=PYTHONDONTWRITEBYTECODE=1" in unit and "After=" in unit and "nvidia-vgpu-mgr" in unit
    # The unit runs the installed zipapp: the module writes no code.
    assert not [p for p in files(plan) if p.startswith("usr/lib/gpuprov")]
    assert ["systemctl", "enable", "gpuprov-vgpu.service"] in commands(plan)


def test_vf_types_already_set_plan_no_sysfs_write(nvidia) -> None:
    root = nvidia(current={VF4: 557})
    state_file(root, {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557, "vf": VF4}]}}, {"557": "NVIDIA A100-4C"})
    plan = plan_of(root, {A100: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}]}})
    assert sysfs_writes(plan) == [] and plan.vgpus[0]["state"] == "present"


def test_a_managed_vf_changes_type_and_one_no_longer_declared_is_cleared(nvidia) -> None:
    root = nvidia(current={VF4: 557, VF5: 557})
    state_file(root, {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557, "vf": VF4}, {"type": 557, "vf": VF5}]}})
    plan = plan_of(root, {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 558}]}})
    assert [(p.rsplit("/", 3)[-3], v) for p, v in sysfs_writes(plan)] == [(VF4, "0"), (VF4, "558"), (VF5, "0")]
    assert plan.cleared_vfs == [{"vf": VF5, "type": 557}]


def test_vfs_gpuprov_did_not_set_are_left_alone_unless_prune(nvidia) -> None:
    root = nvidia(current={VF6: 557})
    gpus = {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}}
    assert [v for _, v in sysfs_writes(plan_of(root, gpus))] == ["557"]
    pruned = plan_of(root, gpus, prune=True)
    assert pruned.cleared_vfs == [{"vf": VF6, "type": 557}]


def test_vfs_not_enabled_yet_are_enabled_then_typed_in_a_second_pass(nvidia) -> None:
    root = nvidia()
    gpus = {vh.NEW_PF: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}]}}
    plan = plan_of(root, gpus)
    assert commands(plan)[0] == ["/usr/lib/nvidia/sriov-manage", "-e", vh.NEW_PF]
    assert plan.second_pass == [vh.NEW_PF] and plan.vgpus[0]["state"] == "pending"
    assert any("checked and set once its VFs exist" in w for w in plan.warnings)
    # No sriov-manage: sriov_numvfs.
    bare = nvidia(sriov_manage=False)
    plan = plan_of(bare, gpus)
    assert sysfs_writes(plan) == [(f"sys/devices/pci0000:41/{vh.NEW_PF}/sriov_numvfs", "16")]


def timed(call: Any) -> float:
    start = time.monotonic()
    call()
    return time.monotonic() - start


def test_wait_for_vfs_returns_once_their_vgpu_files_exist(nvidia) -> None:
    root = nvidia()
    sysfs = Sysfs(str(root))
    # Every VF has its file: at once, far inside the timeout (a wait that never sees them takes all 10 s).
    assert timed(lambda: wait_for_vfs(sysfs, [A100], timeout=10)) < 5
    # One VF without it yet: the whole timeout.
    late = root / f"sys/bus/pci/devices/{A100}/virtfn1/nvidia/current_vgpu_type"
    late.unlink()
    assert timed(lambda: wait_for_vfs(sysfs, [A100], timeout=0.6)) >= 0.6
    # A PF with no VF at all (none enabled yet) is not ready either.
    assert timed(lambda: wait_for_vfs(sysfs, [vh.NEW_PF], timeout=0.6)) >= 0.6
    # The driver adds the file while it waits: it returns at its next look, not at the timeout.
    driver = threading.Timer(0.3, late.write_text, args=("0\n",))
    driver.start()
    try:
        assert 0.3 <= timed(lambda: wait_for_vfs(sysfs, [A100], timeout=10)) < 5
    finally:
        driver.join()


@pytest.mark.parametrize(
    ("current", "gpus", "text", "fix"),
    [
        ({}, {V100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}}, f"{V100} (", "older GPUs give vGPUs as mdevs"),
        ({}, {"0000:99:00.0": {"use": "sriov_vgpu", "vgpus": []}}, "no PCI device 0000:99:00.0 on this host", None),
        (
            {},
            {VF4: {"use": "sriov_vgpu", "vgpus": []}},
            f"{VF4} is itself a VF (of {A100})",
            f"the physical GPU {A100}",
        ),
        (
            {},
            {A100: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-40C"}]}},
            "vGPU type 'NVIDIA A100-40C' is not offered by 0000:c1:00.0 "
            "(types: 557 (NVIDIA A100-4C), 558 (NVIDIA A100-8C))",
            "use one of these names or IDs",
        ),
        (
            {},
            {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}] * 5}},
            "the GPU has 4 VFs, no VF number 4",
            "declare fewer",
        ),
        (
            {},
            {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557, "vf": "0000:c1:01.0"}]}},
            "0000:c1:01.0 is not a VF of",
            None,
        ),
        (
            {},
            {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}, {"type": 557, "vf": VF4}]}},
            f"VF {VF4} is taken by vgpus[0] too",
            None,
        ),
        (
            {},
            {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}, {"type": 558}]}},
            f"mixed vGPU types on {A100} (557 for {VF4}; 558 for {VF5})",
            "mixed_vgpu_types",
        ),
        ({VF6: 558}, {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}}, f"mixed vGPU types on {A100}", None),
        (
            {VF4: 558},
            {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}},
            f"VF {VF4} holds vGPU type 558 (NVIDIA A100-8C), which gpuprov did not set",
            "pin this vGPU to a free VF",
        ),
    ],
)
def test_sriov_refusals(nvidia, current, gpus, text, fix) -> None:
    assert_refused(nvidia(current=current), gpus, text, fix)


def test_a_type_not_creatable_now_is_refused(nvidia) -> None:
    def full(fake):  # VF5 already lists only the type the others hold: 557 no longer fits
        fake.vgpu_vf(VF5, {558: "NVIDIA A100-8C"}, 0)

    root = nvidia(full)
    assert_refused(
        root,
        {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}, {"type": 557}]}},
        f"vgpus[1]: vGPU type 557 (NVIDIA A100-4C) is not creatable on VF {VF5} now (creatable: 558 (NVIDIA A100-8C))",
        "declare fewer or smaller vGPUs",
    )


def test_an_unreadable_vf_type_is_refused_not_overwritten(nvidia) -> None:
    def garbled(fake):
        fake.write(f"{fake.paths[VF4]}/nvidia/current_vgpu_type", "\x00\xff?\n")

    assert_refused(
        nvidia(garbled),
        {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}},
        f"VF {VF4}'s nvidia/current_vgpu_type is unreadable",
        "nvidia-smi vgpu",
    )


def test_sriov_on_a_vfio_bound_or_driverless_gpu_is_refused(tmp_path) -> None:
    from tests.fakehost import FakeHost

    for driver, text in (("vfio-pci", "is bound to vfio-pci (passthrough)"), (None, "is on driver none, not nvidia")):
        root = tmp_path / str(driver)
        fake = FakeHost(root)
        fake.pci(A100, cls=0x030200, group=99, driver=driver, sriov_totalvfs=16)
        fake.finish()
        assert_refused(root, {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}}, f"{A100} {text}")


@pytest.mark.parametrize("user", ["domain", "open"])
def test_clearing_or_changing_a_vf_in_use_is_refused(nvidia, user) -> None:
    def in_use(fake):
        if user == "domain":
            vh.running_domain(fake, "vm7", pci=(VF5,))
        else:
            fake.open_file(4242, "qemu-system-x86", f"/dev/vfio/{vh.VF_GROUPS[VF5]}")

    root = nvidia(in_use, current={VF4: 557, VF5: 557})
    state_file(root, {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557, "vf": VF4}, {"type": 557, "vf": VF5}]}})
    text = "running domain vm7" if user == "domain" else "qemu-system-x86 (pid 4242)"
    assert_refused(
        root,
        {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}},
        f"clearing vGPU type 557 from VF {VF5}: in use by {text}",
    )
    assert_refused(
        root,
        {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 558, "vf": VF5}]}},
        f"changing VF {VF5} from vGPU type 557 to 558: in use by {text}",
        "shut the domain down",
    )


def test_a_vf_offering_mdev_types_points_to_use_mdev(nvidia) -> None:
    def old_driver(fake):  # drivers before the vendor-specific VFIO framework: VFs are mdev parents
        for name in ("creatable_vgpu_types", "current_vgpu_type"):
            (fake.root / fake.paths[VF4] / "nvidia" / name).unlink()
        fake.mdev_types(VF4, {"nvidia-471": ("NVIDIA A100-4C", 1)})

    assert_refused(
        nvidia(old_driver),
        {A100: {"use": "sriov_vgpu", "vgpus": [{"type": 557}]}},
        f"VF {VF4} offers vGPUs as mdev types",
        f'address: "{VF4}", use: mdev',
    )


# ------------------------------------------------------------------ MIG

MIG = "0000:e1:00.0"


def test_a_layout_already_there_plans_nothing(nvidia) -> None:
    plan = plan_of(nvidia(), {MIG: {"use": "mig", "mig": ["1g.10gb", "MIG 3g.40gb"]}})
    assert [c for c in commands(plan) if c[:2] == ["nvidia-smi", "mig"]] == []
    assert plan.mig[MIG] == {"index": 3, "profiles": ["1g.10gb", "3g.40gb"], "created": [], "destroyed": []}


def test_instances_that_fit_beside_the_kept_ones_are_only_added(nvidia) -> None:
    plan = plan_of(nvidia(), {MIG: {"use": "mig", "mig": {"3g.40gb": 1, "1g.10gb": 2}}})
    mig = [c for c in commands(plan) if c[:2] == ["nvidia-smi", "mig"]]
    assert mig == [["nvidia-smi", "mig", "-i", "3", "-cgi", "19", "-C"]]


def test_a_layout_that_needs_the_space_rebuilds_largest_first(nvidia) -> None:
    # 3g.40gb + 2g.20gb + 2 x 1g.10gb fits an empty A100 (3g at 4, 2g at 0, 1g at 2 and 3), not beside the
    # 1g.10gb the GPU holds at slice 6: everything is destroyed and created again.
    plan = plan_of(nvidia(), {MIG: {"use": "mig", "mig": ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]}})
    assert [c[5:] for c in commands(plan) if c[:2] == ["nvidia-smi", "mig"]] == [
        ["2", "-dci"],
        ["2", "-dgi"],
        ["13", "-dci"],
        ["13", "-dgi"],
        ["9,14,19,19", "-C"],
    ]
    assert plan.mig[MIG]["destroyed"] == [{"gi": 2, "profile": "3g.40gb"}, {"gi": 13, "profile": "1g.10gb"}]


def test_a_gpu_instance_without_compute_instance_is_made_again(nvidia) -> None:
    outputs = vh.mig_outputs(lci=vh.render_lci(3, [(2, "3g.40gb")]))
    plan = plan_of(nvidia(mig=outputs), {MIG: {"use": "mig", "mig": ["3g.40gb", "1g.10gb"]}})
    assert [c[5:] for c in commands(plan) if c[:2] == ["nvidia-smi", "mig"]] == [["13", "-dgi"], ["19", "-C"]]


def test_mig_mode_is_switched_on_only_when_allowed(nvidia) -> None:
    outputs = vh.mig_outputs(query=vh.mig_outputs()["query"].replace("Enabled, Enabled", "Disabled, Disabled"))
    root = nvidia(mig=outputs)
    gpus = {MIG: {"use": "mig", "mig": ["7g.80gb"]}}
    assert_refused(
        root, gpus, f"{MIG} (GPU 3): MIG mode is off", "enable it with nvidia-smi -i 3 -mig 1 (needs a GPU reset"
    )
    plan = plan_of(root, gpus, allow_mig_mode_change=True)
    assert commands(plan)[0] == ["nvidia-smi", "-i", "3", "-mig", "1"]
    assert plan.reboot_required and any("after a GPU reset" in w for w in plan.warnings)


@pytest.mark.parametrize(
    ("mig", "gpus", "text", "fix"),
    [
        (None, {"0000:c1:00.0": {"use": "mig", "mig": ["1g.10gb"]}}, "0000:c1:00.0 (GPU 2): MIG mode is off", None),
        (
            None,
            {vh.NEW_PF: {"use": "mig", "mig": ["1g.10gb"]}},
            f"{vh.NEW_PF} (GPU 0) does not support MIG",
            "use sriov_vgpu",
        ),
        (
            {"query": "3, 00000000:E1:00.0, Disabled, Enabled\n"},
            {MIG: {"use": "mig", "mig": ["1g.10gb"]}},
            "MIG mode is enabled but pending",
            "nvidia-smi -r -i 3",
        ),
        (
            None,
            {MIG: {"use": "mig", "mig": ["5g.50gb"]}},
            "MIG profile '5g.50gb' is unknown (profiles: 1g.10gb, 1g.10gb+me",
            None,
        ),
        (
            None,
            {MIG: {"use": "mig", "mig": {"3g.40gb": 3}}},
            "3 x 3g.40gb but the GPU holds at most 2",
            "declare fewer",
        ),
        (
            None,
            {MIG: {"use": "mig", "mig": ["4g.40gb", "3g.40gb", "1g.10gb"]}},
            "MIG layout 4g.40gb, 3g.40gb, 1g.10gb does not fit (9 slices asked",
            "nvidia-smi mig -lgipp",
        ),
        (
            {"apps": "00000000:E1:00.0, 4242, python3\n"},
            {MIG: {"use": "mig", "mig": ["7g.80gb"]}},
            f"destroying MIG GPU instances 2, 13 on {MIG}: in use by python3 (pid 4242)",
            None,
        ),
        ({"query": ""}, {MIG: {"use": "mig", "mig": ["7g.80gb"]}}, f"{MIG}: nvidia-smi does not show this GPU", None),
    ],
)
def test_mig_refusals(nvidia, mig, gpus, text, fix) -> None:
    assert_refused(nvidia(mig=vh.mig_outputs(**(mig or {}))), gpus, text, fix)


def test_mig_without_nvidia_smi_output_is_refused(nvidia) -> None:
    root = nvidia(mig={})
    assert_refused(
        root,
        {MIG: {"use": "mig", "mig": ["7g.80gb"]}},
        "the MIG state cannot be read: this root has no capture/nvidia-smi-mig-query",
    )


def test_mig_destroy_is_refused_while_the_gpu_serves_vgpus(nvidia) -> None:
    # A MIG-backed vGPU: the GPU's instances are in use through a VF.
    from tests.fakehost import FakeHost

    def vf_on_mig(fake: FakeHost) -> None:
        fake.pci("0000:e1:00.4", cls=0x030200, group=230, physfn=MIG, driver="nvidia")
        fake.vgpu_vf("0000:e1:00.4", {}, 700)

    assert_refused(nvidia(vf_on_mig), {MIG: {"use": "mig", "mig": ["7g.80gb"]}}, "in use by vGPU on VF 0000:e1:00.4")


# ------------------------------------------------------------------ scheduler


@pytest.mark.parametrize(
    ("policy", "ms", "value"),
    [
        ("best_effort", None, "0x00"),
        ("equal_share", None, "0x01"),
        ("fixed_share", None, "0x11"),
        ("fixed_share", 8, "0x00080011"),
        ("equal_share", 30, "0x001e0001"),
    ],
)
def test_registry_values_follow_nvidias_table(policy, ms, value) -> None:
    assert registry_value(policy, ms) == value


def test_scheduler_file_and_reboot_required(nvidia) -> None:
    root = nvidia()
    plan = plan_of(root, {}, scheduler="equal_share")
    text = files(plan)[SCHEDULER_CONF] or ""
    assert text.splitlines()[-1] == 'options nvidia NVreg_RegistryDwords="RmPVMRL=0x01"'
    assert plan.reboot_required is False  # the synthetic host shows no loaded module's params
    assert plan.scheduler == {"policy": "equal_share", "RmPVMRL": "0x01", "file": "/" + SCHEDULER_CONF}
    # No scheduler: the file is not managed.
    assert SCHEDULER_CONF not in files(plan_of(root, {}))
    loaded = nvidia(nvidia_params='ResmanDebugLevel: 4294967295\nRegistryDwords: ""\n')
    assert plan_of(loaded, {}, scheduler="equal_share").reboot_required is True
    same = nvidia(nvidia_params='RegistryDwords: "RmPVMRL=0x01"\n')
    assert plan_of(same, {}, scheduler="equal_share").reboot_required is False
    assert plan_of(same, {}, scheduler="fixed_share").reboot_required is True


def test_another_registry_dwords_file_is_warned_about(nvidia) -> None:
    def other(fake):
        fake.write("etc/modprobe.d/nvidia.conf", 'options nvidia NVreg_RegistryDwords="PerfLevelSrc=0x2222"\n')

    plan = plan_of(nvidia(other), {}, scheduler="fixed_share")
    assert any("/etc/modprobe.d/nvidia.conf sets NVreg_RegistryDwords" in w for w in plan.warnings)


# ------------------------------------------------------------------ the whole host: apply, idempotence, boot


def full_layout() -> dict[str, Any]:
    return {
        V100: {"use": "mdev", "mdevs": [{"type": "GRID V100-8Q"}, {"type": "nvidia-259"}]},
        A100: {"use": "sriov_vgpu", "vgpus": [{"type": "NVIDIA A100-4C"}, {"type": 557, "vf": VF6}]},
        MIG: {"use": "mig", "mig": ["3g.40gb", "1g.10gb", "1g.10gb"]},
        vh.NEW_PF: {"use": "passthrough"},
    }


def test_whole_host_applies_then_plans_no_file_change(nvidia) -> None:
    root = nvidia()
    plan, applied, first = converge(str(root), VgpuRequest(gpus=full_layout(), scheduler="fixed_share"))
    assert first is None and not plan.refused
    assert any(BOOT_UNIT in d for d in applied.done)
    assert all(a.startswith(("write", "run")) for a in applied.not_run)
    again = plan_of(root, full_layout(), scheduler="fixed_share")
    assert files(again) == {}, list(files(again))
    # Without the SR-IOV and MIG entries the boot unit goes, the unit is disabled; so does the
    # planner copy an earlier version wrote under usr/lib/gpuprov/gpuprov.
    (root / "usr/lib/gpuprov/gpuprov").mkdir(parents=True)
    (root / "usr/lib/gpuprov/gpuprov/vgpu.py").write_text("# an earlier copy\n")
    (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
    (root / "etc/systemd/system/multi-user.target.wants/gpuprov-vgpu.service").symlink_to("../gpuprov-vgpu.service")
    mdev_only = {V100: full_layout()[V100]}
    plan = plan_of(root, mdev_only)
    removed = [p for p, c in files(plan).items() if c is None]
    assert BOOT_UNIT in removed and "usr/lib/gpuprov/gpuprov/vgpu.py" in removed
    assert ["systemctl", "disable", "gpuprov-vgpu.service"] in commands(plan)
    assert [(v["vf"], v["type"]) for v in plan.cleared_vfs] == []  # the VFs never got their type (not live)


def test_missing_boot_runner_is_said_where_the_boot_unit_needs_it(nvidia) -> None:
    """The role installs the runner after the plan is applied (a refused plan writes nothing):
    the plan says it is missing, loudly, and still plans the unit."""
    root = nvidia(boot_runner=False)
    plan = plan_of(root, {A100: full_layout()[A100]})
    assert not plan.refused and plan.actions
    assert any("/usr/lib/gpuprov/gpuprov-vgpu.pyz is not installed" in w for w in plan.warnings)
    # Without persistence, or with mdevs only, no boot unit runs it: nothing to say.
    assert not any(
        "gpuprov-vgpu.pyz" in w for w in plan_of(root, {A100: full_layout()[A100]}, persistent=False).warnings
    )
    assert not any("gpuprov-vgpu.pyz" in w for w in plan_of(root, {V100: full_layout()[V100]}).warnings)
    # An earlier version's planner copy goes even when the layout needs the zipapp again.
    (root / "usr/lib/gpuprov/gpuprov/plan").mkdir(parents=True)
    (root / "usr/lib/gpuprov/gpuprov/plan/vgpu.py").write_text("# an earlier copy\n")
    (root / "usr/lib/gpuprov/gpuprov-vgpu.pyz").write_text("stand-in\n")
    assert files(plan_of(root, {A100: full_layout()[A100]}))["usr/lib/gpuprov/gpuprov/plan/vgpu.py"] is None


def test_boot_mode_reapplies_vf_types_and_mig_only(nvidia) -> None:
    root = nvidia(mig=vh.mig_outputs(lgi=vh.render_lgi(3, []), lci=vh.render_lci(3, [])))
    plan = plan_host(Sysfs(str(root)), VgpuRequest(gpus=full_layout(), boot=True))
    assert files(plan) == {} and sysfs_writes(plan) == [
        (f"sys/devices/pci0000:c1/{VF4}/nvidia/current_vgpu_type", "557"),
        (f"sys/devices/pci0000:c1/{VF6}/nvidia/current_vgpu_type", "557"),
    ]
    assert commands(plan) == [["nvidia-smi", "mig", "-i", "3", "-cgi", "9,19,19", "-C"]]
    assert plan.mdevs == []  # mdevctl starts those


# ------------------------------------------------------------------ a real GPU: the H100 guest capture


@pytest.fixture
def h100(host_root, tmp_path) -> Path:
    """The captured H100 passthrough guest with the nvidia-smi MIG outputs of a real H100 (MIG off)."""
    dest = tmp_path / "h100"
    shutil.copytree(host_root("h100-passthrough-guest"), dest, symlinks=True)
    real = Path(__file__).parents[1] / "fixtures/vgpu/h100-mig-disabled"
    for key, name in (("query", "mig-mode.csv"), ("lgip", "mig-lgip.txt"), ("lgipp", "mig-lgipp.txt")):
        (dest / f"capture/nvidia-smi-mig-{key}").write_text((real / name).read_text())
    for key in ("lgi", "lci"):
        (dest / f"capture/nvidia-smi-mig-{key}").write_text("No MIG-enabled devices found.\n")
    (dest / "usr/lib/gpuprov").mkdir(parents=True)  # the boot unit's zipapp, as the role installs it
    (dest / "usr/lib/gpuprov/gpuprov-vgpu.pyz").write_text("stand-in\n")
    return dest


def test_the_real_h100_is_refused_until_mig_mode_is_on(h100) -> None:
    gpu = "0000:00:06.0"
    assert_refused(
        h100, {gpu: {"use": "mig", "mig": ["3g.40gb"]}}, f"{gpu} (GPU 0): MIG mode is off", "nvidia-smi -i 0 -mig 1"
    )
    plan = plan_of(h100, {gpu: {"use": "mig", "mig": ["3g.40gb"]}}, allow_mig_mode_change=True)
    assert commands(plan)[0] == ["nvidia-smi", "-i", "0", "-mig", "1"] and plan.reboot_required
    assert_refused(
        h100, {gpu: {"use": "sriov_vgpu", "vgpus": [{"type": 1}]}}, f"{gpu} (", "older GPUs give vGPUs as mdevs"
    )
    assert_refused(h100, {gpu: {"use": "mdev", "mdevs": [{"type": "nvidia-1"}]}}, f"{gpu} offers no mdev types")


def test_declared_mdevs_are_what_the_role_creates(mtty) -> None:
    from gpuprov.facts.host import gather
    from gpuprov.plan.vgpu import declared_mdevs

    gpus = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}, {"type": "Single port serial"}]}}
    declared, problems = declared_mdevs(gather(Sysfs(str(mtty))), gpus)
    plan = plan_of(mtty, gpus)
    assert problems == [] and declared == {m["uuid"]: {"parent": "mtty", "type": m["type"]} for m in plan.mdevs}
    _, problems = declared_mdevs(gather(Sysfs(str(mtty))), {"mtty": {"use": "mdev", "mdevs": [{"type": "x"}]}})
    assert "mdev type 'x' is not offered by mtty" in problems[0].message
