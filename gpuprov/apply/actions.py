"""Carrying out a plan's actions against a root: files, sysfs, commands (docs/development/layout.md).

Actions on the running kernel (sysfs writes, commands) run only against the live root ``/``;
below any other root they are reported as not run.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass, field

from ..core.plan import COMMAND, REMOVE_FILE, WRITE_FILE, WRITE_SYSFS, Plan
from ..facts.sysfs import Sysfs


@dataclass
class Applied:
    done: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)  # live-only actions on a non-live root

    @property
    def changed(self) -> bool:
        return bool(self.done)


class ApplyError(RuntimeError):
    """A step failed; ``applied`` says what had been done before it."""

    def __init__(self, message: str, applied: Applied) -> None:
        super().__init__(message)
        self.applied = applied


def write_file_atomic(full: str, content: str | bytes, mode: int) -> None:
    """Write beside, then rename: a reader never sees half a file."""
    data = content.encode() if isinstance(content, str) else content
    directory = os.path.dirname(full)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".gpuprov-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, full)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def make_parent(root: str, path: str) -> None:
    """The directory ``path`` (root-relative) goes in, and its parents, below ``root`` (0755, as
    ``mkdir -p``): where a command the plan runs writes a file it does not create the directory of
    (nvidia-ctk's CDI spec in its staging place)."""
    os.makedirs(os.path.dirname(Sysfs(root).write_path(path)), mode=0o755, exist_ok=True)


def apply(plan: Plan, root: str = "/") -> Applied:
    """Execute ``plan`` in order. Refuses a refused plan; stops at the first failure."""
    if plan.refused:
        raise ApplyError(plan.refusal_text(), Applied())
    sysfs = Sysfs(root)
    applied = Applied()
    for action in plan.actions:
        text = action.describe()
        if action.live_only and not sysfs.live:
            applied.not_run.append(text)
            continue
        try:
            if action.kind == WRITE_FILE:
                write_file_atomic(sysfs.write_path(action.path or ""), action.content or "", action.mode)
            elif action.kind == REMOVE_FILE:
                os.unlink(sysfs.write_path(action.path or ""))
            elif action.kind == WRITE_SYSFS:
                with open(sysfs.write_path(action.path or ""), "w", encoding="ascii") as f:
                    f.write(action.content or "")
            elif action.kind == COMMAND:
                result = subprocess.run(action.argv or [], capture_output=True, text=True, check=False)
                if result.returncode != 0:
                    raise OSError(f"exit {result.returncode}: {(result.stderr or result.stdout).strip()[-2000:]}")
        except OSError as exc:
            raise ApplyError(f"{text} failed: {exc}", applied) from exc
        applied.done.append(text)
    return applied
