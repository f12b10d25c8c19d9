"""Values from hosts and files, made safe to show on a terminal (docs/output.md).

A device name, a driver from a uevent, a VM name or a line from nvidia-smi may
hold terminal control sequences (ESC [ 2 J, an OSC 52 clipboard write, BEL, a
CR that overwrites the line, U+202E that reverses it). :func:`safe_text` shows
each such character as a visible escape (``\\x1b``, ``\\u202e``) instead.
Escaping Rich markup is the table code's part (gpuprov/table.py): it never lets
Rich parse a value. JSON output needs neither: ``json.dumps`` escapes control
characters itself and carries the exact value.

Standard library only: the Ansible-side code may use it too.
"""

from __future__ import annotations

import re
from typing import Any

# C0 (with TAB and LF: a value is one line), DEL, C1, the Unicode bidi and line
# controls, and lone surrogates (an undecodable file name; printing one raises).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_KEEP_LF = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe_text(value: object, *, keep_newlines: bool = False) -> str:
    """``str(value)`` with every control character shown as an escape.

    ``keep_newlines`` leaves LF alone, for text gpuprov itself split into lines
    (a table cell of several devices, a message and its fix). Idempotent: an
    escape is printable, so escaping twice changes nothing.
    """
    pattern = _UNSAFE_KEEP_LF if keep_newlines else _UNSAFE
    return pattern.sub(_escape, str(value))


def safe_data(value: Any) -> Any:
    """A copy of a JSON-like report with every string (keys too) through :func:`safe_text`.

    The table printers render from this copy, so a new column cannot show a raw value.
    """
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_data(k): safe_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [safe_data(v) for v in value]
    return value
