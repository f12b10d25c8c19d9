"""``gpuprov completion bash|zsh``: a completion script made from the argument parser itself,
run here by bash as its completion would run it (COMP_WORDS, COMP_CWORD): every command,
every option of each, the choices where the parser has them, the shell's file names elsewhere.
zsh gets the same function through its bash completion layer."""

from __future__ import annotations

import argparse
import shlex
import subprocess

import pytest

from gpuprov.cli.main import _subcommands, build_parser, completion_script, main

PARSER = build_parser()
COMMANDS = _subcommands(PARSER)


@pytest.fixture(scope="module")
def script() -> str:
    return completion_script(build_parser(), "bash")


def complete(script: str, *words: str) -> list[str]:
    """What the completion function offers for ``gpuprov WORDS`` (the last word being completed)."""
    line = " ".join(shlex.quote(w) for w in ("gpuprov", *words))
    program = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _gpuprov; printf "%s\\n" "${{COMPREPLY[@]}}"'
    proc = subprocess.run(["bash", "--norc", "-c", program], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return [w for w in proc.stdout.splitlines() if w]


def test_the_command_prints_each_script(capsys: pytest.CaptureFixture[str]) -> None:
    for shell in ("bash", "zsh"):
        assert main(["completion", shell]) == 0
        assert capsys.readouterr().out == completion_script(build_parser(), shell)


def test_bash_reads_it_and_registers_the_function(script: str) -> None:
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    out = subprocess.run(
        ["bash", "--norc", "-c", f"{script}\ncomplete -p gpuprov"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "complete -o default -F _gpuprov gpuprov"


def test_every_command_and_every_option_of_each(script: str) -> None:
    assert complete(script, "") == ["-h", "--help", "--version", *COMMANDS]
    assert set(complete(script, "in")) == {c for c in COMMANDS if c.startswith("in")}
    for name, sub in COMMANDS.items():
        options = [o for action in sub._actions for o in action.option_strings]
        assert complete(script, name, "-") == options, name


def test_choices_where_the_parser_has_them_and_file_names_elsewhere(script: str) -> None:
    checked = 0
    for name, sub in COMMANDS.items():
        for action in sub._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            offered = complete(script, name, action.option_strings[-1], "")
            # No words: bash's own file name completion runs (complete -o default).
            assert offered == [str(c) for c in action.choices or ()], (name, action.option_strings)
            checked += 1
    assert checked > 10
    assert complete(script, "verify", "--gpu-source", "n") == ["nvml", "nvidia-smi"]
    assert complete(script, "completion", "") == ["bash", "zsh"]
    assert complete(script, "plan", "--root", "cap.tar.gz", "--re") == ["--reserved-memory-mib", "--reserved-cpus"]


def test_zsh_gets_the_same_function_through_bashcompinit(script: str) -> None:
    zsh = completion_script(build_parser(), "zsh")
    assert zsh.startswith("#compdef gpuprov\n")
    assert "autoload -U +X bashcompinit && bashcompinit\n_gpuprov() {" in zsh
    function = script[script.index("_gpuprov() {") :]
    assert zsh.endswith(function)


def test_a_word_a_shell_would_split_is_refused() -> None:
    parser = argparse.ArgumentParser(prog="gpuprov")
    sub = parser.add_subparsers()
    sub.add_parser("x").add_argument("--mode", choices=["a b"])
    with pytest.raises(ValueError, match="words a shell would split"):
        completion_script(parser, "bash")
