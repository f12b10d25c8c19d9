"""The CLI's contract: help on every command, clear errors that change nothing."""

from __future__ import annotations

import argparse

import pytest

from gpuprov.cli.main import build_parser, main
from tests.conftest import tree_digest


def test_every_command_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert sub.choices, "no commands registered"
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, command in sub.choices.items():
        assert helps.get(name), f"{name} has no one-line help"
        assert command.description, f"{name} has no description"
        for action in command._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.option_strings or action.dest} has no help"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["inspect", "--device", "41:00"], "'41:00' is not a PCI address"),
        (["inspect", "--require-ready", "0000:zz:00.0"], "use the full form DOMAIN:BUS:SLOT.FUNCTION"),
        (["inspect", "--device", "0000:41:00.0"], "no PCI device 0000:41:00.0 on this host"),
    ],
)
def test_bad_input_is_named_with_its_fix(args, message, host_root, capsys) -> None:
    root = host_root("h100-passthrough-guest")
    before = tree_digest(root)
    assert main([*args, "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert tree_digest(root) == before


def test_root_that_is_not_a_host(tmp_path, capsys) -> None:
    assert main(["inspect", "--root", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["inspect", "--root", str(tmp_path)]) == 2
    assert "has no sys/ directory" in capsys.readouterr().err


def test_root_may_be_the_tarball_itself(capsys) -> None:
    from tests.conftest import HOSTS

    assert main(["inspect", "--json", "--root", str(HOSTS / "h100-passthrough-guest.tar.gz")]) == 0
    assert '"0000:00:06.0"' in capsys.readouterr().out


def test_short_address_is_accepted(host_root, capsys) -> None:
    assert main(["inspect", "--root", str(host_root("h100-passthrough-guest")), "--device", "00:06.0"]) == 0
