"""Plain-data reports: the JSON documents gpuprov writes (inspect, plan, verify).

:func:`write_json` is the one way they are written (docs/output.md, "JSON").
"""

from __future__ import annotations

import json
from typing import Any, TextIO


def write_json(document: Any, stream: TextIO, *, compact: bool = False) -> None:
    """Write ``document`` to ``stream`` as one JSON text and a newline.

    Indented for a person at a terminal; compact (and 5x faster) into a pipe, or when asked
    (``--compact``). ASCII
    only: every control and non-ASCII character is escaped, so a consumer gets the
    exact value and a terminal is never sent one (docs/output.md).
    """
    indent = 2 if stream.isatty() and not compact else None
    stream.write(json.dumps(document, indent=indent, ensure_ascii=True) + "\n")
