"""``--json`` is indented for a person at a terminal, one line into a pipe, and one line when asked
with ``--compact`` (issue #50, item 7)."""

from __future__ import annotations

import io

import pytest

from gpuprov.report import write_json


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("stream", "compact", "lines"), [(Terminal, False, 6), (Terminal, True, 1), (io.StringIO, False, 1)]
)
def test_indented_on_a_terminal_unless_asked_compact(stream, compact, lines) -> None:
    out = stream()
    write_json({"a": 1, "b": [2]}, out, compact=compact)
    assert len(out.getvalue().splitlines()) == lines


@pytest.mark.parametrize("command", ["inspect", "plan", "verify", "topology", "fleet"])
def test_every_json_command_takes_compact(command) -> None:
    from gpuprov.cli.main import build_parser

    required = {"fleet": ["-i", "x"], "plan": ["vms.yml"]}.get(command, [])
    args = build_parser(command).parse_args([command, "--json", "--compact", *required])
    assert args.json and args.compact
