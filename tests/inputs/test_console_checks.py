"""gpu_vm's console_checks: validation at the boundary and the check of a serial log
(gpuprov/verify/console.py), on files written under a root as libvirt writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuprov.core.vm_spec import ConsoleCheck
from gpuprov.facts.sysfs import Sysfs
from gpuprov.inputs.boundary import validate_gpu_vm_options
from gpuprov.verify.console import check_console

LOG = "/var/log/libvirt/qemu/vm1-serial.log"


def options(checks: list, **kw) -> dict:
    vm = {"name": "vm1", "memory_mib": 1024, "vcpus": 1, "network": None}
    return {"vm": vm, "host_vms": [vm, {**vm, "name": "vm2"}], "console_checks": checks, **kw}


def parsed(checks: list) -> list[ConsoleCheck]:
    given, problems = validate_gpu_vm_options(options(checks))
    assert problems == [] and given is not None
    return given.console_checks


def write_log(root: Path, text: str) -> None:
    path = root / LOG.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


class Clock:
    """A clock that moves only when the check sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1


def test_each_vm_keeps_its_own_checks() -> None:
    checks = parsed(
        [
            {"vm": "vm1", "wait_for": "END", "expect": ["A"]},
            {"vm": "vm2", "wait_for": "OTHER"},
            {"wait_for": "^login:", "timeout": 5},
        ]
    )
    assert [(c.wait_for.pattern, c.timeout, [e.pattern for e in c.expect]) for c in checks] == [
        ("END", 600, ["A"]),
        ("^login:", 5, []),
    ]


@pytest.mark.parametrize(
    ("checks", "field", "text"),
    [
        ([{"vm": "vm9", "wait_for": "x"}], "console_checks[0].vm", "is not a VM of host_vms"),
        ([{"wait_for": "("}], "console_checks[0].wait_for", "is not a regular expression"),
        ([{"wait_for": "x", "expect": ["ok", "[z"]}], "console_checks[0].expect[1]", "is not a regular expression"),
        ([{"wait_for": "x", "timeout": 0}], "console_checks[0].timeout", "out of range"),
        ([{"wait_for": "x", "tail": 3}], "console_checks[0]", "unknown keys tail"),
        ([{"wait_for": "x" * 2000}], "console_checks[0].wait_for", ""),
        ([{"wait_for": "x"}] * 17, "console_checks", "more than 16"),
        ("x", "console_checks", "must be a list"),
    ],
)
def test_bad_checks_are_refused_naming_the_field(checks, field: str, text: str) -> None:
    given, problems = validate_gpu_vm_options(options(checks))
    assert given is None
    assert any(r.message.startswith(field) and text in r.message for r in problems), problems


def test_the_check_passes_once_the_line_is_there_and_every_pattern_matches(tmp_path: Path) -> None:
    write_log(tmp_path, "boot\r\nBEGIN\r\nPCI 0000:01:00.0 1234:11e8\r\nEND\r\n")
    (check,) = parsed([{"wait_for": "^END", "expect": [r"BEGIN\r?\nPCI \S+ 1234:11e8\r?\nEND"]}])
    clock = Clock()
    result = check_console(Sysfs(str(tmp_path)), LOG, [check], clock=clock, sleep=clock.sleep)
    assert result.problems == [] and clock.sleeps == 0
    assert result.tail == ["boot", "BEGIN", "PCI 0000:01:00.0 1234:11e8", "END"]


def test_a_pattern_that_does_not_match_is_named_with_the_end_of_the_log(tmp_path: Path) -> None:
    write_log(tmp_path, "BEGIN\nPCI 0000:02:00.0 4348:3253\nEND\n")
    (check,) = parsed([{"wait_for": "END", "expect": ["4348:3253", "1234:11e8"]}])
    result = check_console(Sysfs(str(tmp_path)), LOG, [check], sleep=lambda s: None)
    (problem,) = result.problems
    assert "'1234:11e8'" in problem and "the log ends with" in problem and "4348:3253" in problem


@pytest.mark.parametrize("log", [None, "booting\n"])
def test_no_line_within_the_timeout_fails_after_waiting_for_it(tmp_path: Path, log: str | None) -> None:
    if log is not None:
        write_log(tmp_path, log)
    (check,) = parsed([{"wait_for": "END", "timeout": 10}])
    clock = Clock()
    result = check_console(Sysfs(str(tmp_path)), LOG, [check], clock=clock, sleep=clock.sleep)
    (problem,) = result.problems
    assert "within 10 s" in problem and clock.now >= 10
    assert ("absent, empty or unreadable" in problem) is (log is None)


def test_a_log_that_arrives_later_is_waited_for(tmp_path: Path) -> None:
    (check,) = parsed([{"wait_for": "END", "timeout": 60}])
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.sleeps == 3:
            write_log(tmp_path, "END\n")

    result = check_console(Sysfs(str(tmp_path)), LOG, [check], clock=clock, sleep=sleep)
    assert result.problems == [] and clock.sleeps == 3


def test_a_log_that_links_out_of_the_root_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside.log"
    outside.write_text("END\n")
    root = tmp_path / "root"
    (root / "var/log/libvirt/qemu").mkdir(parents=True)
    (root / LOG.lstrip("/")).symlink_to(outside)
    (check,) = parsed([{"wait_for": "END", "timeout": 1}])
    clock = Clock()
    result = check_console(Sysfs(str(root)), LOG, [check], clock=clock, sleep=clock.sleep)
    assert result.problems and "absent, empty or unreadable" in result.problems[0]
