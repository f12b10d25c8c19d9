"""No test skips in CI for lack of something the test command can install or start.

scripts/test.sh installs every package the tests use and starts the Docker engine before
pytest, so on a fresh CI machine a skip means the run did not test what it claims. With
CI=true, any skip whose reason is not in ALLOWED_SKIPS fails the run (exit 1) and is listed;
elsewhere (a developer's machine) the same list is printed as a warning.
Loaded from tests/conftest.py (pytest_plugins).
"""

from __future__ import annotations

import os

import pytest

# Skip reason (exactly as the test gives it) -> why no test command can make that test run here.
ALLOWED_SKIPS: dict[str, str] = {
    "this machine has an NVIDIA driver": (
        "tests/verify/test_verify.py and tests/modules/test_gpu_verify_module.py check the live machine's"
        " 'no NVIDIA driver' verdict; on a GPU host the driver is there, and unloading it is no test's business"
    ),
    "this engine has the nvidia runtime": (
        "tests/verify/test_verify_containers.py checks the refusal by an engine without the nvidia runtime; on a GPU"
        " host the engine has it, and reconfiguring someone's engine is no test's business"
    ),
}


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    # A skip's longrepr is (path, line, "Skipped: <reason>").
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipPolicy:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.unexpected: list[tuple[str, str]] = []

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is not a skip
            reason = _reason(report)
            if reason not in ALLOWED_SKIPS:
                self.unexpected.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.unexpected and self.strict and exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.unexpected:
            return
        title = "unexpected skips: FAILED (CI=true)" if self.strict else "unexpected skips (CI fails on these)"
        terminalreporter.section(title, sep="=", red=self.strict, yellow=not self.strict)
        for nodeid, reason in self.unexpected:
            terminalreporter.write_line(f"{nodeid}: {reason}")
        terminalreporter.write_line(
            "scripts/test.sh installs and starts what the tests need; a skip that no command can avoid "
            "belongs in ALLOWED_SKIPS (tests/skip_policy.py) with the reason why."
        )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipPolicy(strict=os.environ.get("CI") == "true"), "gpuprov-skip-policy")
