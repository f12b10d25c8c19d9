"""Kernel arguments by name in GRUB's defaults file, grubby, and the reboot verdict."""

from __future__ import annotations

import pytest

from gpuprov.cmdline import CmdlineRequest, edit_args, parse_args, plan_grub, plan_grubby, reboot_owed

GRUB = """# If you change this file, run 'update-grub' afterwards.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null || echo Debian`
GRUB_CMDLINE_LINUX_DEFAULT="quiet splash intel_iommu=off"
GRUB_CMDLINE_LINUX="console=ttyS0,115200"
"""
IOMMU = CmdlineRequest(add={"intel_iommu": "on", "iommu": "pt"})


def test_edit_keeps_every_other_argument_in_place() -> None:
    assert edit_args("quiet splash intel_iommu=off", {"intel_iommu": "on", "iommu": "pt"}, []) == (
        "quiet splash intel_iommu=on iommu=pt"
    )
    assert edit_args("a iommu=pt b iommu=pt", {"iommu": "pt"}, []) == "a iommu=pt b"
    assert edit_args("quiet pcie_acs_override=downstream", {}, ["pcie_acs_override"]) == "quiet"


def test_grub_plan_changes_only_the_variable() -> None:
    plan = plan_grub(GRUB, "BOOT_IMAGE=/vmlinuz quiet splash", IOMMU, ["update-grub"])
    new = plan.actions[0].content or ""
    assert new == GRUB.replace('"quiet splash intel_iommu=off"', '"quiet splash intel_iommu=on iommu=pt"')
    assert plan.describe()[1] == "run update-grub (regenerate the GRUB menu)"
    assert plan.reboot_required
    assert plan.diff()[0]["before"] == GRUB


def test_grub_plan_is_idempotent_and_knows_when_no_reboot_is_owed() -> None:
    first = plan_grub(GRUB, "quiet", IOMMU, ["update-grub"]).actions[0].content
    again = plan_grub(first, "BOOT_IMAGE=/vmlinuz quiet splash intel_iommu=on iommu=pt", IOMMU, ["update-grub"])
    assert again.actions == [] and not again.reboot_required


def test_missing_variable_is_appended_and_single_quotes_kept() -> None:
    plan = plan_grub("GRUB_TIMEOUT=5\n", "", IOMMU, ["update-grub"])
    assert plan.actions[0].content == 'GRUB_TIMEOUT=5\nGRUB_CMDLINE_LINUX_DEFAULT="intel_iommu=on iommu=pt"\n'
    quoted = plan_grub("GRUB_CMDLINE_LINUX_DEFAULT='quiet'\n", "", IOMMU, ["update-grub"])
    assert quoted.actions[0].content == "GRUB_CMDLINE_LINUX_DEFAULT='quiet intel_iommu=on iommu=pt'\n"


def test_no_grub_defaults_file_is_refused() -> None:
    plan = plan_grub(None, "", IOMMU, ["update-grub"])
    assert "/etc/default/grub does not exist" in plan.refusal_text() and "grubby" in plan.refusal_text()


def test_grubby_plan() -> None:
    plan = plan_grubby(
        "ro crashkernel=auto intel_iommu=off rhgb", "ro", CmdlineRequest(add={"intel_iommu": "on"}, remove=["rhgb"])
    )
    assert plan.describe() == [
        "run grubby --update-kernel=ALL --args=intel_iommu=on (kernel arguments for every entry)",
        "run grubby --update-kernel=ALL --remove-args=rhgb (drop kernel arguments)",
    ]
    assert plan.args_after == "ro crashkernel=auto intel_iommu=on"


@pytest.mark.parametrize("bad", ["intel iommu", "=on", "a;b=1"])
def test_bad_argument_names(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a kernel argument"):
        parse_args([bad])


def test_reboot_owed_for_removed_args_too() -> None:
    assert reboot_owed("quiet pcie_acs_override=downstream", CmdlineRequest(remove=["pcie_acs_override"]))
    assert not reboot_owed("quiet", CmdlineRequest(remove=["pcie_acs_override"]))
