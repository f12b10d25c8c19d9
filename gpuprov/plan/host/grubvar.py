"""/etc/default/grub, read as the shell reads it: a variable's one assignment (:func:`read_grub_variable`).

Apart from :mod:`.cmdline`, which edits the file, so that what only reads it (the fleet report's
drift, :mod:`gpuprov.plan.drift`) loads no planner and no argument rules on each host.
Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...facts.iommu import kernel_split


@dataclass
class GrubVariable:
    """The one assignment of a variable in /etc/default/grub, as shell gives it back."""

    args: list[str]  # kernel_split of its value
    line: int | None = None  # 1-based; None: not assigned in the file
    span: tuple[int, int] | None = None  # of the quoted value in the text
    quote: str = '"'


def _scan_shell(text: str) -> tuple[str, list[bool]]:
    """(``text`` with comments blanked, for each line whether it starts outside every quote,
    substitution and continuation). Raises ValueError on what this small scanner does not
    follow: an unterminated quote or substitution, a here-document, $'...'."""
    code = list(text)
    starts = [True]
    stack: list[str] = []  # open ' " ` and $( (
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        state = stack[-1] if stack else ""
        if c == "\n":
            starts.append(not stack)
        elif state == "'":
            if c == "'":
                stack.pop()
        elif c == "\\":
            if text[i + 1 : i + 2] == "\n":
                starts.append(False)
            i += 2
            continue
        elif state == "`":
            if c == "`":
                stack.pop()
        elif c == "$" and text[i + 1 : i + 2] == "(":
            stack.append("(")
            i += 2
            continue
        elif state == '"':
            if c == '"':
                stack.pop()
            elif c == "`":
                stack.append(c)
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n;&|()"):
            end = text.find("\n", i)
            end = n if end < 0 else end
            code[i:end] = " " * (end - i)
            i = end
            continue
        elif c in "'\"`(":
            stack.append(c)
        elif c == ")":
            if state != "(":
                raise ValueError(f"line {len(starts)} has a ')' that closes nothing")
            stack.pop()
        elif text.startswith("<<", i):
            raise ValueError(f"line {len(starts)} has a here-document (<<)")
        elif text.startswith("$'", i):
            raise ValueError(f"line {len(starts)} has $'...' quoting")
        i += 1
    if stack:
        raise ValueError(f"it ends inside an open {stack[-1]!r} (an unterminated quote or substitution)")
    return "".join(code), starts


def _word(name: str) -> str:
    return rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])"


_RHS = r""""(?P<dq>(?:[^"$`\\\n]|\\")*)"|'(?P<sq>[^'\n]*)'|(?P<bare>[A-Za-z0-9_.,:=/+@%-]*)"""


def read_grub_variable(text: str, variable: str) -> GrubVariable:
    """The variable's one assignment, parsed exactly as shell would; raises ValueError (with the
    line) when the file assigns or uses it in any other form: ``+=``, a substitution, an escape
    other than \\", a continuation, a second assignment, anything after the value but a comment."""
    code, starts = _scan_shell(text)
    assignment = re.compile(
        rf"(?P<lead>[ \t]*(?:export[ \t]+)?){re.escape(variable)}=(?:{_RHS})(?:[ \t]+#.*|[ \t]*)", re.ASCII
    )
    lines = text.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    found: GrubVariable | None = None
    for m in re.finditer(_word(variable), code):
        number = text.count("\n", 0, m.start())
        line = lines[number]
        a = assignment.fullmatch(line)
        if not (starts[number] and a and offsets[number] + a.end("lead") == m.start()):
            from ...inputs.kernel_args import show  # the error's path alone: a host read needs no argument rules

            raise ValueError(
                f"line {number + 1} ({show(line)}) sets or uses {variable} in a form gpuprov cannot read "
                f"safely; only {variable}=\"...\", '...' or a plain word, alone on its line, is edited"
            )
        if found is not None:
            raise ValueError(f"{variable} is assigned twice (lines {found.line} and {number + 1})")
        quoted = a.group("dq")
        value = quoted.replace('\\"', '"') if quoted is not None else a.group("sq") or a.group("bare") or ""
        kind = "dq" if quoted is not None else "sq" if a.group("sq") is not None else "bare"
        start, end = a.span(kind)
        if kind != "bare":
            start, end = start - 1, end + 1
        found = GrubVariable(
            kernel_split(value),
            number + 1,
            (offsets[number] + start, offsets[number] + end),
            "'" if kind == "sq" else '"',
        )
    return found or GrubVariable([])
