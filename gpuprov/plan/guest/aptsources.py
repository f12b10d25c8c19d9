"""Archive components on a Debian or Ubuntu guest's apt sources.

The NVIDIA driver is in Debian's ``contrib``/``non-free``/``non-free-firmware``
and Ubuntu's ``restricted`` components, which a fresh install may not list.
:func:`plan_components` adds them, in place, to the distribution's own entries
(those whose suite is the release's codename or ``codename-*`` and that carry
``main``), in whichever format the guest has: one-line ``sources.list`` /
``*.list`` files, or deb822 ``*.sources`` (Debian 12's ``debian.sources``,
Ubuntu 24.04's ``ubuntu.sources``). Third-party entries, disabled stanzas and
comments are left as they are. Standard library only: the guest_nvidia_driver
role's module ships it to the target.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...core.plan import Plan, Refusal, file_action
from ...facts.files import read_text
from ...facts.sysfs import Sysfs

SOURCES_LIST = "etc/apt/sources.list"
SOURCES_DIR = "etc/apt/sources.list.d"
_WORD = re.compile(r"^[a-z0-9][a-z0-9.+-]*$")


@dataclass
class Entry:
    """One distribution entry found: where, its suites, the components it had."""

    path: str  # root-relative
    suites: list[str]
    components: list[str]
    added: list[str]


def _ours(suite: str, codename: str) -> bool:
    return suite == codename or suite.startswith(codename + "-")


def _missing(have: list[str], wanted: list[str]) -> list[str]:
    return [c for c in wanted if c not in have]


def _split_one_line(line: str) -> tuple[str, str] | None:
    """(body, trailing comment) of an active one-line entry; None for anything else."""
    stripped = line.strip()
    if not stripped.startswith(("deb ", "deb-src ", "deb\t", "deb-src\t")):
        return None
    body, hash_, comment = line.partition("#")
    return body.rstrip(), (hash_ + comment) if hash_ else ""


def edit_one_line(text: str, path: str, codename: str, wanted: list[str]) -> tuple[str, list[Entry]]:
    """``sources.list`` format: ``deb [options] URI SUITE COMPONENT...``."""
    out, entries = [], []
    for line in text.splitlines(keepends=True):
        newline = "\n" if line.endswith("\n") else ""
        parts = _split_one_line(line.rstrip("\n"))
        if parts is None:
            out.append(line)
            continue
        body, comment = parts
        # The options in [...] may hold spaces; what follows is URI SUITE COMPONENTS.
        rest = body
        if "[" in body and "]" in body and body.index("[") < body.index("]"):
            rest = body[body.index("]") + 1 :]
        fields = rest.split()
        if rest is body:
            fields = fields[1:]  # drop deb / deb-src
        if len(fields) < 3 or not _ours(fields[1], codename) or "main" not in fields[2:]:
            out.append(line)
            continue
        have = fields[2:]
        add = _missing(have, wanted)
        entries.append(Entry(path, [fields[1]], have, add))
        if add:
            body = body + " " + " ".join(add)
            line = body + (" " + comment if comment else "") + newline
        out.append(line)
    return "".join(out), entries


def edit_deb822(text: str, path: str, codename: str, wanted: list[str]) -> tuple[str, list[Entry]]:
    """deb822 format: stanzas of ``Field: value`` lines separated by blank lines."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    entries: list[Entry] = []
    stanza: list[str] = []

    def flush() -> None:
        fields: dict[str, tuple[int, str]] = {}  # lowercase name -> (line index, value)
        current = None
        for i, raw in enumerate(stanza):
            if raw.startswith("#"):
                continue
            if raw[:1] in (" ", "\t") and current:
                idx, value = fields[current]
                fields[current] = (idx, value + " " + raw.strip())
                continue
            name, colon, value = raw.partition(":")
            if colon:
                current = name.strip().lower()
                fields[current] = (i, value.strip())
        types = fields.get("types", (0, ""))[1].split()
        suites = fields.get("suites", (0, ""))[1].split()
        components = fields.get("components", (0, ""))[1].split()
        enabled = fields.get("enabled", (0, "yes"))[1].lower() not in ("no", "false", "0")
        ours = (
            enabled
            and any(t in ("deb", "deb-src") for t in types)
            and suites
            and all(_ours(s, codename) for s in suites)
            and "main" in components
        )
        if ours:
            add = _missing(components, wanted)
            entries.append(Entry(path, suites, components, add))
            if add:
                idx = fields["components"][0]
                # Rewrite the field as one line (a continuation line, if any, is folded in).
                original = stanza[idx]
                name = original.partition(":")[0]
                newline = "\n" if original.endswith("\n") else ""
                end = idx + 1
                while end < len(stanza) and stanza[end][:1] in (" ", "\t"):
                    end += 1
                if end > idx + 1 and not newline:
                    newline = "\n"
                stanza[idx:end] = [f"{name}: {' '.join(components + add)}{newline}"]
        out.extend(stanza)
        stanza.clear()

    for line in lines:
        if line.strip() == "":
            flush()
            out.append(line)
        else:
            stanza.append(line)
    flush()
    return "".join(out), entries


def source_files(sysfs: Sysfs) -> list[str]:
    """The apt source files under the root, root-relative, in apt's reading order."""
    files = [SOURCES_LIST] if sysfs.exists(SOURCES_LIST) else []
    files += [f"{SOURCES_DIR}/{n}" for n in sysfs.listdir(SOURCES_DIR) if n.endswith((".list", ".sources"))]
    return files


def plan_components(sysfs: Sysfs, codename: str, components: list[str]) -> tuple[Plan, list[Entry]]:
    """The file edits that give the distribution's entries ``components``; a
    refusal when no entry of the distribution is found or the input is bad."""
    plan = Plan()
    bad = [c for c in components if not _WORD.match(c)]
    if not _WORD.match(codename or ""):
        plan.refusals.append(
            Refusal(f"'{codename}' is not a release codename", "give the release's codename, e.g. bookworm or noble")
        )
    if bad:
        plan.refusals.append(
            Refusal(
                f"{', '.join(repr(c) for c in bad)} is not an archive component",
                "give component names such as contrib, non-free, non-free-firmware or restricted",
            )
        )
    if plan.refused:
        return plan, []
    entries: list[Entry] = []
    for rel in source_files(sysfs):
        text = read_text(sysfs, rel)
        if text is None:
            continue
        edit = edit_deb822 if rel.endswith(".sources") else edit_one_line
        new, found = edit(text, rel, codename, components)
        entries += found
        added = sorted({c for e in found for c in e.added})
        action = file_action(rel, new, text, f"add {' '.join(added)} to the {codename} entries", mode=0o644)
        if action is not None:
            plan.actions.append(action)
    if not entries:
        seen = ", ".join("/" + f for f in source_files(sysfs)) or "no source files"
        plan.actions.clear()
        plan.refusals.append(
            Refusal(
                f"no apt entry for {codename} with the main component in /{SOURCES_LIST} or /{SOURCES_DIR}/ "
                f"(read: {seen}), so there is nothing to add {', '.join(components)} to",
                f"add the distribution's own entry (e.g. a {codename} stanza with Components: main) "
                "and run the role again",
            )
        )
    return plan, entries
