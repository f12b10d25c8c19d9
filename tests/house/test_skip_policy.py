"""tests/skip_policy.py: in CI a skip the test command could have avoided fails the run."""

from __future__ import annotations

import pytest

from tests.skip_policy import ALLOWED_SKIPS

pytest_plugins = ["pytester"]

ALLOWED = next(iter(ALLOWED_SKIPS))
SUITE = f"""
import pytest

def test_runs():
    pass

@pytest.mark.skipif(True, reason="no mdevctl here")
def test_marked():
    pass

def test_in_body():
    pytest.skip("no Docker engine here")

@pytest.mark.skipif(True, reason={ALLOWED!r})
def test_allowed():
    pass

@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False
"""


def run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None, **files: str):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    pytester.makepyfile(**files)
    return pytester.runpytest_inprocess("-p", "tests.skip_policy", "-p", "no:cacheprovider")


@pytest.mark.parametrize(("ci", "code"), [("true", 1), (None, 0), ("false", 0)])
def test_unexpected_skips_are_listed_and_fail_only_in_ci(pytester, monkeypatch, ci, code) -> None:
    result = run(pytester, monkeypatch, ci, test_suite=SUITE)
    assert result.ret == code
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    text = result.stdout.str()
    assert "test_suite.py::test_marked: no mdevctl here" in text
    assert "test_suite.py::test_in_body: no Docker engine here" in text
    assert "test_allowed" not in text.split("unexpected skips")[1]  # allowlisted: not listed
    assert "test_xfail" not in text.split("unexpected skips")[1]  # an xfail is not a skip


def test_a_skipped_module_fails_in_ci(pytester, monkeypatch) -> None:
    body = 'import pytest\npytest.importorskip("gpuprov_no_such_module")\n\ndef test_x():\n    pass\n'
    result = run(pytester, monkeypatch, "true", test_mod=body, test_other="def test_y():\n    pass\n")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["test_mod.py: could not import 'gpuprov_no_such_module'*"])


def test_only_allowed_skips_pass_in_ci(pytester, monkeypatch) -> None:
    body = f"import pytest\n\n@pytest.mark.skipif(True, reason={ALLOWED!r})\ndef test_x():\n    pass\n"
    result = run(pytester, monkeypatch, "true", test_ok=body)
    assert result.ret == 0
    assert "unexpected skips" not in result.stdout.str()


def test_a_failure_stays_a_failure(pytester, monkeypatch) -> None:
    body = "import pytest\n\ndef test_x():\n    pytest.skip('no gpg')\n\ndef test_y():\n    assert False\n"
    result = run(pytester, monkeypatch, "true", test_bad=body)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1, skipped=1)


def test_every_allowed_skip_says_why() -> None:
    assert all(len(why) > 40 for why in ALLOWED_SKIPS.values())
