"""JSON from an untrusted file, bounded in size, depth and time.

``json.loads`` recurses once per nesting level (a 50,000-deep ``[[[...`` is a
RecursionError, not a ValueError) and turns a 1,000,000-digit number into an int in
quadratic time on the Pythons that have no digit limit. :func:`loads_bounded` checks the
size, then the nesting depth with one linear scan that skips strings, then parses with
numbers capped: whatever the text holds, it returns a value or raises
:class:`BoundedJsonError` (a ``ValueError``, so ``except ValueError`` around a
``json.loads`` keeps working).

Read the file through :class:`~gpuprov.facts.sysfs.Sysfs` first (its reads stop at
``MAX_READ_BYTES``); the limits here are per format and smaller.
"""

from __future__ import annotations

import json
import re
from typing import Any

# A configuration file gpuprov reads is a few KiB (daemon.json, a boot record) to a few
# hundred KiB (a CDI spec for eight GPUs with MIG): 1 MiB is far above any of them.
MAX_JSON_CHARS = 1 << 20
# Deeper than any configuration nests (daemon.json: 4, a CDI spec: 6), far below the
# interpreter's recursion limit.
MAX_JSON_DEPTH = 64
# Digits in one number (Python 3.11's own int limit is 4300).
MAX_NUMBER_DIGITS = 64

_TOKEN = re.compile(r'["\[\]{}]')
# The rest of a string after its opening quote: disjoint alternatives, so it never backtracks.
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)


class BoundedJsonError(ValueError):
    """The text is too large, nested too deep (``over_limit``), or not JSON."""

    def __init__(self, message: str, *, over_limit: bool = False) -> None:
        super().__init__(message)
        self.over_limit = over_limit


def json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> int:
    """Deepest nesting of ``[`` and ``{`` outside strings, counting stops once past ``limit``
    (then ``limit + 1`` is returned). One pass, each character looked at once; an unclosed
    string ends the scan (``json.loads`` reports it)."""
    depth = deepest = 0
    pos = 0
    search, rest = _TOKEN.search, _STRING_REST.match
    while True:
        m = search(text, pos)
        if m is None:
            return deepest
        c = m.group()
        pos = m.end()
        if c == '"':
            s = rest(text, pos)
            if s is None:
                return deepest
            pos = s.end()
        elif c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        else:
            depth -= 1


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise BoundedJsonError(f"a number of {len(digits)} digits", over_limit=True)
    return int(digits)


def _parse_float(digits: str) -> float:
    if len(digits) > MAX_NUMBER_DIGITS * 4:
        raise BoundedJsonError(f"a number of {len(digits)} characters", over_limit=True)
    return float(digits)


def loads_bounded(text: str, *, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(text)`` for untrusted text: raises :class:`BoundedJsonError` (a ValueError)
    when ``text`` is over ``max_chars`` characters, nests ``[``/``{`` deeper than ``max_depth``,
    or is not JSON; never RecursionError, never a quadratic number conversion."""
    if len(text) > max_chars:
        raise BoundedJsonError(f"{len(text)} characters, over the {max_chars} read", over_limit=True)
    if json_depth(text, max_depth) > max_depth:
        raise BoundedJsonError(f"nested deeper than {max_depth} levels", over_limit=True)
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float)
    except BoundedJsonError:
        raise
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise BoundedJsonError(str(exc)) from None
