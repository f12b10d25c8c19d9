"""gpu_host_plan (planning ahead, docs/concepts/plan-gate.md), run for real by ansible on a target
Python with neither gpuprov nor ansible: its verdict for each concern agrees with what that
concern's own module then does, it fails closed (anything it cannot plan is pending), and it never
changes the root."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tree_digest
from tests.modules.test_modules import bare_python, run_module, staged  # noqa: F401 - fixtures
from tests.modules.test_vgpu_module import LAB_UUID, mtty  # noqa: F401 - mtty is a fixture

PASSTHROUGH = {"version": 1, "gpus": [{"name": "gpu", "address": "0000:01:00.0", "use": "passthrough"}]}
MDEV_HOST = {
    "version": 1,
    "gpus": [
        {
            "name": "mtty",
            "address": "mtty",
            "use": "mdev",
            "instances": [{"name": "s", "type": "mtty-2", "uuid": LAB_UUID}],
        }
    ],
}


def ahead(python: str, **concerns: dict[str, Any]) -> dict[str, Any]:
    """gpu_host_plan on ``concerns`` (module name -> its options), each keyed by its module's name."""
    given = {name: {"options": options, "digest": f"key-{name}"} for name, options in concerns.items()}
    result = run_module(python, "gpu_host_plan", {"concerns": given})
    assert not result["failed"] and result["changed"] is False, result.get("msg")
    return result


def test_vfio_bind_pending_until_the_module_ran_then_converged(bare_python, staged) -> None:  # noqa: F811
    root = staged("gpu-audio")
    options = {"host": PASSTHROUGH, "root": str(root)}
    before = tree_digest(root)
    first = ahead(bare_python, vfio_bind=options)
    assert first["converged"] == [] and "action(s)" in first["pending"]["vfio_bind"]
    assert tree_digest(root) == before  # planning ahead writes nothing
    # The model it returns is gpu_host_model's, so no later role resolves it again.
    model = run_module(bare_python, "gpu_host_model", {"host": PASSTHROUGH, "root": str(root)})
    assert first["ansible_facts"]["gpuprov_model"] == model["ansible_facts"]["gpuprov_model"]
    assert first["model_root"] == str(root)

    assert run_module(bare_python, "vfio_bind", options)["changed"] is True
    second = ahead(bare_python, vfio_bind=options)
    assert second["converged"] == ["key-vfio_bind"] and second["pending"] == {}
    assert run_module(bare_python, "vfio_bind", options, check=True)["changed"] is False


def test_a_declaration_the_modules_warn_on_is_never_converged(bare_python, staged) -> None:  # noqa: F811
    """Without ``version`` vfio_bind warns on every run, check mode too: the gate agrees (round two's cases)."""
    root = staged("gpu-audio")
    unversioned = {k: v for k, v in PASSTHROUGH.items() if k != "version"}
    options = {"host": unversioned, "root": str(root)}
    assert run_module(bare_python, "vfio_bind", options)["changed"] is True
    dry = run_module(bare_python, "vfio_bind", options, check=True)
    assert dry["changed"] is False and "gpuprov_host has no version" in dry["stderr"], dry
    result = ahead(bare_python, vfio_bind=options)
    assert result["converged"] == []
    assert "its module warns: gpuprov_host has no version" in result["pending"]["vfio_bind"]
    assert ahead(bare_python, vfio_bind={**options, "host": PASSTHROUGH})["converged"] == ["key-vfio_bind"]


def test_gpu_vgpu_from_a_declaration_pending_then_converged(bare_python, mtty) -> None:  # noqa: F811
    options = {"host": MDEV_HOST, "root": str(mtty)}
    # Without mdevctl the module warns on every run (the definitions wait for it): never converged.
    assert "mdevctl is not installed" in ahead(bare_python, gpu_vgpu=options)["pending"]["gpu_vgpu"]
    (mtty / "usr/sbin").mkdir(parents=True, exist_ok=True)
    (mtty / "usr/sbin/mdevctl").write_text("#!/bin/sh\n")
    dry = run_module(bare_python, "gpu_vgpu", options, check=True)
    assert not dry["failed"] and dry["changed"] is True and dry["created"] == [LAB_UUID]
    assert ahead(bare_python, gpu_vgpu=options)["pending"]["gpu_vgpu"].startswith("2 action(s)")

    assert run_module(bare_python, "gpu_vgpu", options)["changed"] is True
    assert ahead(bare_python, gpu_vgpu=options)["converged"] == ["key-gpu_vgpu"]
    # The same layout given as gpus (the role without a declaration) plans the same.
    gpus = {"mtty": {"use": "mdev", "mdevs": [{"type": "mtty-2", "uuid": LAB_UUID}]}}
    assert ahead(bare_python, gpu_vgpu={"gpus": gpus, "root": str(mtty)})["converged"] == ["key-gpu_vgpu"]


def test_iommu_boot_with_a_reboot_owed_is_pending(bare_python, staged) -> None:  # noqa: F811
    root = staged("ci-host-no-iommu")
    result = ahead(bare_python, iommu_boot={"root": str(root)})
    assert result["converged"] == [] and "iommu_boot" in result["pending"]
    # What roles/host_drain does with it: the disruption as returned is gpu_host_drain's option
    # (every key; the reboot counts once the play may reboot: iommu_boot's reboot_allowed), and a
    # reboot reaches the drain's libvirt step, refused here for the staged root.
    assert set(result["disruption"]) == {"reboot", "devices", "why", "unknown", "recorded"}, result["disruption"]
    options = {"disruption": {**result["disruption"], "reboot": True}, "root": str(root)}
    drain = run_module(bare_python, "gpu_host_drain", options, check=True)
    assert drain["failed"] and "not /" in drain["msg"] and "Unsupported" not in drain["msg"], drain["msg"]


@pytest.mark.parametrize(
    ("concern", "options", "text"),
    [
        ("vfio_bind", {"devices": ["0000:01:00.0"], "state": "melted"}, "its options are refused"),
        ("vfio_bind", {"devices": ["0000:01:00.0"], "host": PASSTHROUGH}, "its options are refused"),
        (
            "vfio_bind",
            {"host": {"gpus": [{"name": "g", "address": "0000:01:00.0", "use": "passthrough", "expect": "10de:ffff"}]}},
            "does not resolve",
        ),
        ("gpu_vgpu", {"gpus": {"mtty": {"use": "vgpu"}}}, "its options are refused"),
        ("iommu_boot", {"extra_args": ["a b"]}, "refuses"),
    ],
)
def test_what_cannot_be_planned_is_pending(bare_python, staged, concern, options, text) -> None:  # noqa: F811
    """Fail closed: a refusal, a declaration that does not fit, an option the module rejects all leave
    the concern to its module, which says why; nothing is resolved or changed."""
    root = staged("gpu-audio")
    before = tree_digest(root)
    result = ahead(bare_python, **{concern: {**options, "root": str(root)}})
    assert result["converged"] == [] and text in result["pending"][concern]
    assert "ansible_facts" not in result or concern != "vfio_bind" or "resolve" not in text
    assert tree_digest(root) == before


def test_unreadable_evidence_is_pending(bare_python, staged) -> None:  # noqa: F811
    """The vfio binding done, then the IOMMU groups unreadable: not converged (the module refuses)."""
    root = staged("gpu-audio")
    options = {"devices": ["0000:01:00.0"], "root": str(root)}
    run_module(bare_python, "vfio_bind", options)
    assert ahead(bare_python, vfio_bind=options)["converged"] == ["key-vfio_bind"]
    shutil.rmtree(Path(root) / "sys/kernel/iommu_groups")
    assert ahead(bare_python, vfio_bind=options)["pending"]["vfio_bind"]
