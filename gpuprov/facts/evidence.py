"""Evidence the safety rules need that could not be read.

Every reader that gathers such evidence records here what it could not read,
instead of reading it as "none": a missing ``/proc/swaps`` is not "no swap".
``HostFacts.missing`` maps an evidence name ("swap list", "IOMMU group of
0000:41:00.0") to a :class:`Missing`; :mod:`gpuprov.rules.assess` turns each one into
an "unknown" blocker. The rules and the evidence each needs:
docs/concepts/safety-rules.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sysfs import Sysfs

_LIVE_FIX = "run gpuprov as root on the host itself, where /proc and /sys are the host's own"
_CAPTURE_FIX = (
    "capture the host again with `gpuprov capture` run as root there, and use that tarball whole "
    "(this copy lacks the file or holds something else in it)"
)


# The rule each piece of evidence serves (docs/concepts/safety-rules.md).
GROUPS = "groups"  # IOMMU groups and who is in them
DISPLAY = "display"  # boot display, framebuffer console
STORAGE = "storage"  # mounted, swap or held block devices
NETWORK = "network"  # NICs with addresses or routes
CHIPSET = "chipset"  # device classes: chipset functions, bridges
IN_USE = "in-use"  # device files held open, devices of running domains
RESOURCES = "resources"  # host CPUs and memory: the VM planner's fit check, not readiness


@dataclass(frozen=True)
class Missing:
    """One piece of evidence that could not be read."""

    path: str  # where it was looked for, as on the host ("/proc/swaps")
    problem: str  # "absent", "unreadable", "line 3 is not a route: '...'"
    fix: str  # how to get it
    rule: str  # GROUPS, DISPLAY, ...: the rule that needs it
    devices: tuple[str, ...] = ()  # PCI devices whose verdict it decides; () for every device


MissingEvidence = dict[str, Missing]


def how_to_read(live: bool) -> str:
    """The usual fix: root on the live host, a fresh whole capture otherwise."""
    return _LIVE_FIX if live else _CAPTURE_FIX


def note(
    missing: MissingEvidence | None,
    sysfs: Sysfs,
    name: str,
    rel: str,
    problem: str | None = None,
    *,
    rule: str,
    fix: str | None = None,
    devices: tuple[str, ...] = (),
) -> None:
    """Record that evidence ``name`` (root-relative ``rel``) could not be read.

    ``problem`` defaults to "absent" or "unreadable", whichever it is. The first
    record of a name is kept: it names the first thing that went wrong."""
    if missing is None or name in missing:
        return
    if problem is None:
        problem = "unreadable" if sysfs.exists(rel) else "absent"
    missing[name] = Missing(
        path=f"/{rel}", problem=problem, fix=fix or how_to_read(sysfs.live), rule=rule, devices=devices
    )


def garbled(line_no: int, line: str, what: str) -> str:
    """Problem text for an unparseable line; the line is quoted with escapes, short."""
    text = line if len(line) <= 60 else line[:57] + "..."
    return f"line {line_no} is not {what}: {text!r}"
