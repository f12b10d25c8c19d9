"""The host root a command or a module is given: the one ``--root``/``root`` rule, and a value
shown bounded in its messages.

Apart from :mod:`gpuprov.inputs.validate` so that ``gpuprov inspect --root DIR`` checks its root
without importing every input rule (and the plan and VM types those import): a few ms of each run.
Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import os
import reprlib
from typing import Any

CAPTURE_SUFFIXES = (".tar.gz", ".tgz", ".tar")  # what `gpuprov capture` writes (gpuprov.cli.rootfs)

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60
_repr.maxlist = _repr.maxdict = _repr.maxtuple = _repr.maxset = 4
_repr.maxlevel = 2


def shown(value: Any) -> str:
    """``repr(value)``, bounded: a value from a file can be huge or deeply nested."""
    return _repr.repr(value)


def is_capture_file(path: str) -> bool:
    """True when ``path`` names a capture tarball rather than an unpacked directory."""
    return path.endswith(CAPTURE_SUFFIXES) and not os.path.isdir(path)


def root_problem(root: str, option: str = "--root", *, captures: bool = True, host: bool = True) -> str | None:
    """Why ``root`` cannot be read as a host, or None: the check of the CLI's ``--root`` and of
    every module's ``root`` (no answer without evidence: a root that is not there reads as a host
    with no devices, and "0 PCI devices" is not a host). ``captures``: a capture tarball is fine
    (the CLI unpacks it; a module reads a directory only). ``host``: it must hold sys/ (a module that
    reads only files, such as an apt source, takes any directory)."""
    is_capture = is_capture_file(root)
    if is_capture and captures:
        return None
    name = shown(root)
    if is_capture and os.path.exists(root):
        return (
            f"{option} {name} is a capture tarball, not a directory: unpack it (tar -xzf) and give the folder "
            "that holds sys/ and proc/, or read it with `gpuprov inspect --root`"
        )
    if os.path.exists(root) and not os.path.isdir(root):
        return (
            f"{option} {name} is neither a directory nor a capture: give the .tar.gz, .tgz or .tar "
            "that `gpuprov capture` wrote, or the folder it was unpacked into"
        )
    if not os.path.isdir(root):
        wanted = "a directory or a capture .tar.gz" if captures else "a directory (/, or an unpacked capture)"
        return f"{option} {name} does not exist: give {wanted}"
    if host and not os.path.isdir(os.path.join(root, "sys")):
        return (
            f"{option} {name} has no sys/ directory: point it at the top of an unpacked capture "
            "(the folder holding sys/ and proc/)" + (", or at the .tar.gz itself" if captures else "")
        )
    return None
