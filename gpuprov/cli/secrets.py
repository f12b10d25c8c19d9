"""Vaulted values read from an inventory stay secret (docs/reference/inputs.md, "Ansible inventories").

gpuprov needs a vaulted value decrypted to plan with it (a VM named by a secret), but no command
prints or writes it: the inventory's reader hands over each decrypted value with its ciphertext;
:func:`mark` makes each such value a :class:`Vaulted` string (``init`` writes it back as the same
``!vault`` ciphertext), and :func:`redact_output` puts a filter on stdout and stderr for the rest of
the run that writes ``<vaulted>`` in place of any secret, wherever a message or a table would show it.
"""

from __future__ import annotations

import io
import re
import sys
from typing import Any, TextIO

SHOWN = "<vaulted>"
# A secret this long is hidden wherever it appears; a shorter one where it stands as a word of its own
# (a vaulted "8" must not turn every 8 of a table into <vaulted>).
SUBSTRING_LENGTH = 8


class Vaulted(str):
    """A decrypted vaulted value, with the ciphertext it came from (written back as ``!vault``)."""

    ciphertext: str

    def __new__(cls, plain: str, ciphertext: str) -> Vaulted:
        made = super().__new__(cls, plain)
        made.ciphertext = ciphertext
        return made


def mark(value: Any, secrets: dict[str, str]) -> Any:
    """``value`` with each string that is a vaulted value (``secrets``: plaintext -> ciphertext) :class:`Vaulted`."""
    if isinstance(value, dict):
        return {k: mark(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [mark(v, secrets) for v in value]
    if isinstance(value, str) and value in secrets:
        return Vaulted(value, secrets[value])
    return value


def _pattern(secrets: list[str]) -> re.Pattern[str] | None:
    parts = []
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        escaped = re.escape(secret)
        parts.append(escaped if len(secret) >= SUBSTRING_LENGTH else rf"(?<![\w.-]){escaped}(?![\w.-])")
    return re.compile("|".join(parts)) if parts else None


class _Redacting(io.TextIOBase):
    """A text stream writing through to ``stream`` with every secret replaced, a line at a time (a secret
    is never split between two writes it would escape in)."""

    def __init__(self, stream: TextIO, pattern: re.Pattern[str]) -> None:
        self.stream = stream
        self.pattern = pattern
        self.pending = ""

    def write(self, text: str) -> int:
        self.pending += text
        head, sep, self.pending = self.pending.rpartition("\n")
        if sep:
            self.stream.write(self.pattern.sub(SHOWN, head + sep))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(self.pattern.sub(SHOWN, self.pending))
            self.pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.stream, "encoding", "utf-8")


_HIDDEN: set[str] = set()


def redact_output(secrets: list[str]) -> None:
    """From now on in this run, stdout and stderr never show one of ``secrets`` (nor of any given before)."""
    _HIDDEN.update(secrets)
    pattern = _pattern(sorted(_HIDDEN))
    if pattern is None:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Redacting):
            stream.flush()
            stream = stream.stream
        setattr(sys, name, _Redacting(stream, pattern))


def end_redaction() -> None:
    """Flush what waits for its line end and give stdout and stderr back (the end of a run: :func:`main`)."""
    _HIDDEN.clear()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Redacting):
            stream.flush()
            setattr(sys, name, stream.stream)
