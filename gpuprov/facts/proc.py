"""When processes started, from /proc below a root: the host's boot (``btime`` in /proc/stat) and a
process's start (field 22 of /proc/PID/stat, clock ticks since that boot), in seconds since the epoch.
Read through :class:`Sysfs`; a staged root without them reads as unknown (None).

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import os

from .sysfs import Sysfs, parse_int


def boot_time(sysfs: Sysfs) -> float | None:
    """When the host booted (``btime``), None when unreadable."""
    for line in sysfs.read_lines("proc/stat"):
        if line.startswith("btime "):
            seconds = parse_int(line.split()[1]) if len(line.split()) > 1 else None
            return None if seconds is None or seconds < 0 else float(seconds)
    return None


def process_started(sysfs: Sysfs, pid: str, boot: float | None = None) -> float | None:
    """When process ``pid`` (digits) started; ``boot``: the host's boot time, read when not given.
    None when the pid is not a number or anything is unreadable."""
    if not pid.isdigit():
        return None
    boot = boot_time(sysfs) if boot is None else boot
    text = sysfs.read(f"proc/{pid}/stat")
    if boot is None or not text or ")" not in text:
        return None
    # After the command name (which may hold spaces and parentheses): fields[0] is field 3.
    fields = text.rsplit(")", 1)[1].split()
    ticks = parse_int(fields[19]) if len(fields) > 19 else None
    if ticks is None or ticks < 0:
        return None
    try:
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return None
