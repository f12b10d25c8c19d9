"""A VM's serial console checked from the host: wait for a line, then match patterns.

For guests with no network (the lab's nested guest) or to check them from inside before SSH:
``gpu_vm``'s ``console_checks`` (role gpu_vms: ``gpu_vms_console_checks``, run only with
``gpu_vms_check_consoles``). The log is libvirt's serial log file of the domain, read through
:class:`~gpuprov.facts.sysfs.Sysfs` (confined to the module's root, at most its first
``MAX_READ_BYTES``: the log restarts with each boot of the domain). The checks are in the
same module run as the VM (issue #14: one module call per concern), read only, never a change.

Standard library only (ships to targets with the modules).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.vm_spec import ConsoleCheck
from ..facts.sysfs import Sysfs

POLL_SECONDS = 2.0
TAIL_LINES = 20
# How much of the log a failure message quotes.
QUOTE_CHARS = 1500


@dataclass
class ConsoleResult:
    log: str
    tail: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"log": self.log, "tail": self.tail, "problems": self.problems}


def check_console(
    sysfs: Sysfs,
    log_path: str,
    checks: list[ConsoleCheck],
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> ConsoleResult:
    """Wait for each check's line in the log at ``log_path`` (absolute, as libvirt names it), each
    for its own ``timeout``, then match its patterns against the log as written (``\\r`` kept);
    every problem is named with the end of the log. A log that is absent or unreadable matches
    nothing (fail closed)."""
    rel = log_path.lstrip("/")
    text = ""
    problems: list[str] = []
    for check in checks:
        start = clock()
        while True:
            text = sysfs.read_text(rel) or ""
            if check.wait_for.search(text):
                break
            if clock() - start >= check.timeout:
                problems.append(
                    f"no line matching {check.wait_for.pattern!r} in {log_path} within {check.timeout} s"
                    + ("" if text else " (the log is absent, empty or unreadable)")
                )
                break
            sleep(POLL_SECONDS)
        problems += [
            f"nothing matching {pattern.pattern!r} in {log_path}"
            for pattern in check.expect
            if not pattern.search(text)
        ]
    shown = text.replace("\r", "")
    if problems:
        problems = [f"{problem}; the log ends with: {shown[-QUOTE_CHARS:]!r}" for problem in problems]
    return ConsoleResult(log=log_path, tail=shown.splitlines()[-TAIL_LINES:], problems=problems)
