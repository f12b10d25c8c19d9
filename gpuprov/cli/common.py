"""What every command shares: exit codes, the usage error, the host root to read, PCI addresses
and YAML inputs from the command line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXIT_OK, EXIT_BAD_INPUT, EXIT_NOT_READY = 0, 2, 3


class UsageError(Exception):
    """Bad input: the message names the problem and the fix."""


@contextmanager
def host_root(root: str) -> Iterator[str]:
    """A directory to read the host from: ``/``, a directory, or a capture tarball.

    A tarball is unpacked by :mod:`gpuprov.cli.rootfs` (the one safe way into a capture) into a
    temporary directory, removed afterwards whatever happens.
    """
    from ..inputs.hostroot import is_capture_file, root_problem

    if is_capture_file(root):
        from . import rootfs  # tarfile, tempfile...: only for a capture

        try:
            with rootfs.unpacked(root) as tmp:
                yield tmp
        except rootfs.CaptureRefused as exc:
            raise UsageError(str(exc)) from None
        return
    problem = root_problem(root, "--root")  # the one check, the modules' `root` too
    if problem:
        raise UsageError(problem)
    yield root


def addresses(values: list[str], option: str) -> list[str]:
    from ..facts.pci import PciAddressError, normalize_address

    out = []
    for value in values:
        try:
            out.append(normalize_address(value))
        except PciAddressError as exc:
            raise UsageError(f"{option}: {exc}") from None
    return out


def read_input(path: str) -> Any:
    """A YAML input file (a host_vars file, a declaration), or exit 2 naming what is wrong with it."""
    from .yamlread import YamlInputError, read_yaml

    try:
        return read_yaml(path)
    except YamlInputError as exc:
        raise UsageError(str(exc)) from None


def add_json_arguments(parser: Any, what: str, schema: str) -> None:
    """``--json`` (the document, indented on a terminal, one line into a pipe) and ``--compact``."""
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON (schema {schema})")
    parser.add_argument("--compact", action="store_true", help="with --json: one line, even on a terminal")
