"""The input boundary of kernel arguments and of the boot options given with them
(gpuprov.inputs.kernel_args): kernel_cmdline's options, iommu_boot's, and PCI addresses through
the one rule every input's address meets (gpuprov.inputs.validate.pci_address)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuprov.inputs.kernel_args import (
    GRUB_VARIABLES,
    MAX_LINE,
    TrialOptions,
    argument_problem,
    cmdline_options,
    trial_options,
)
from gpuprov.inputs.validate import Problems, pci_address
from gpuprov.plan.host.boot_trial import BootRequest, checked_request


@pytest.mark.parametrize(
    ("arg", "words"),
    [
        ("intel_iommu=on", None),
        ('a="b c"', None),
        ("", "is empty"),
        ("a" * (MAX_LINE + 1), "characters long"),
        ("a=$(reboot)", "holds $"),
        ("a='b'", "holds '"),
        ("a b", "is 2 kernel arguments"),
        ("a=b;c", "in an unquoted value"),
        ("-s", "not a kernel parameter name"),
        ("a=\u00e9", "non-ASCII"),
        (3, "is a int, not text"),
    ],
)
def test_argument_problem_names_what_is_wrong_and_the_fix(arg: Any, words: str | None) -> None:
    problem = argument_problem(arg)
    if words is None:
        assert problem is None
    else:
        assert problem is not None and words in problem[0] and problem[1]


def test_cmdline_options_keep_one_value_per_name_and_refuse_every_problem() -> None:
    options, refusals = cmdline_options(["iommu=pt", "iommu=pt", "quiet"], ["splash"], GRUB_VARIABLES[1])
    assert not refusals
    assert (options.add, options.remove, options.variable) == (["iommu=pt", "quiet"], ["splash"], GRUB_VARIABLES[1])
    _options, refusals = cmdline_options(["iommu=pt", "iommu=off", "a;b", 7], ["iommu"], "PATH")
    messages = [r.message for r in refusals]
    assert messages[0].startswith("variable 'PATH' is not a GRUB kernel command-line variable")
    assert "arguments: iommu is given twice ('iommu=pt', 'iommu=off')" in messages
    assert any(m.startswith("arguments: 'a;b' ") for m in messages)
    assert any(m.startswith("arguments: '7' is a int") for m in messages)
    assert "iommu is both in arguments and in remove" in messages
    assert all(r.fix for r in refusals)


def test_trial_options_normalise_addresses_as_every_input_does() -> None:
    checked, refusals = trial_options(TrialOptions(expect_vfio=["41:00.0", "0000:0A:00.1 "]))
    assert not refusals and checked.expect_vfio == ["0000:41:00.0", "0000:0a:00.1"]
    # The planner's wrapper gives the request back normalised, the rest untouched.
    request, refusals = checked_request(BootRequest(expect_vfio=["41:00.0"], extra_args=["quiet"]))
    assert not refusals and request.expect_vfio == ["0000:41:00.0"] and request.extra_args == ["quiet"]


@pytest.mark.parametrize("value", ["../../etc", "41:00", "10de:2330", "0000:41:00.0\n", "{{ gpu }}", "x" * 40])
def test_an_address_is_refused_in_the_same_words_wherever_it_comes_in(value: str) -> None:
    """One rule, one message: iommu_boot's expect_vfio says what any other input's address says."""
    problems = Problems()
    assert pci_address(problems, "expect_vfio[0]", value) is None
    checked, refusals = trial_options(TrialOptions(expect_vfio=[value]))
    assert [(r.message, r.fix) for r in refusals] == [(r.message, r.fix) for r in problems.items]
    assert checked.expect_vfio == [value]  # kept as given: the plan refuses it


def test_trial_options_refuse_module_names_and_ranges_with_the_fix() -> None:
    options = TrialOptions(
        extra_args=["a=$(x)"],
        vfio_modules=["vfio", "x;reboot"],
        watchdog_module="../wd",
        panic_seconds=0,
        watchdog_seconds=59,
    )
    _checked, refusals = trial_options(options)
    assert [r.message.split(" ", 2)[:2] for r in refusals] == [
        ["extra_args:", "'a=$(x)'"],
        ["'x;reboot'", "is"],
        ["'../wd'", "is"],
        ["panic_seconds", "0"],
        ["watchdog_seconds", "59"],
    ]
    assert [r.fix for r in refusals][-2:] == ["give 1 to 3600", "give 60 to 7200"]
    assert not trial_options(TrialOptions(vfio_modules=["vfio_pci"], panic_seconds=3600, watchdog_seconds=7200))[1]
