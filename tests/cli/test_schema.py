"""inspect --json matches its published schema on every captured host."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

import gpuprov
from gpuprov.cli.main import main
from tests.conftest import captured_hosts

SCHEMA = json.loads((Path(gpuprov.__file__).parent / "schemas" / "inspect.v1.json").read_text())


@pytest.mark.parametrize("name", captured_hosts())
def test_report_matches_schema(name, host_root, capsys) -> None:
    assert main(["inspect", "--json", "--root", str(host_root(name))]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), SCHEMA)


def test_schema_rejects_a_report_missing_a_key(host_root, capsys) -> None:
    main(["inspect", "--json", "--root", str(host_root("h100-passthrough-guest"))])
    report = json.loads(capsys.readouterr().out)
    del report["gpus"][0]["ready"]
    with pytest.raises(jsonschema.ValidationError, match="'ready' is a required property"):
        jsonschema.validate(report, SCHEMA)
