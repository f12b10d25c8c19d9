"""Plans: what would change, or why not (the words every layer speaks).

facts -> plan -> apply -> verify. A planner is a pure function from facts
(and the current text of the files it manages) to a :class:`Plan`: concrete
actions, or refusals with reasons. ``gpuprov plan``, Ansible check mode and
``--diff`` all show the same list. :func:`gpuprov.apply.actions.apply` executes a plan step by step
against a root; actions on the running kernel (sysfs writes, commands) run
only against the live root ``/``: against a captured or staged root they are
reported as skipped, so a dry run over a capture never touches the capture's
sysfs files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WRITE_FILE, REMOVE_FILE, WRITE_SYSFS, COMMAND = "file", "remove", "sysfs", "command"


@dataclass
class Action:
    kind: str  # file | remove | sysfs | command
    why: str
    path: str | None = None  # root-relative
    content: str | bytes | None = None  # new file content (bytes: a binary file), or the value written to sysfs
    before: str | bytes | None = None  # current file content (None: absent), for --diff
    mode: int = 0o644
    argv: list[str] | None = None
    # --diff shows one line for it, not its text (a copy of gpuprov's own source: thousands of lines).
    brief_diff: bool = False
    # What --diff shows instead of the content, (before, after): for a binary file (a keyring).
    shown: tuple[str, str] | None = None

    @property
    def live_only(self) -> bool:
        """Acts on the running kernel or system, not on files below the root."""
        return self.kind in (WRITE_SYSFS, COMMAND)

    def describe(self) -> str:
        if self.kind == WRITE_FILE:
            verb = "create" if self.before is None else "update"
            return f"{verb} /{self.path} ({self.why})"
        if self.kind == REMOVE_FILE:
            return f"remove /{self.path} ({self.why})"
        if self.kind == WRITE_SYSFS:
            return f"write '{(self.content or '').strip()}' to /{self.path} ({self.why})"
        return f"run {' '.join(self.argv or [])} ({self.why})"


@dataclass
class Refusal:
    message: str
    fix: str | None = None
    device: str | None = None
    # "in-use" (gpuprov.facts.evidence.IN_USE): refused only because something holds ``device``, which
    # a running VM may (a drain frees it: docs/guides/rolling.md).
    code: str | None = None

    def describe(self) -> str:
        return self.message + (f"; fix: {self.fix}" if self.fix else "")


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def refused(self) -> bool:
        return bool(self.refusals)

    def refusal_text(self) -> str:
        return "refused, nothing changed: " + "; ".join(r.describe() for r in self.refusals)

    def diff(self, root: str = "/") -> list[dict[str, str]]:
        """Ansible's diff format, one entry per action; paths as below ``root``.

        Runtime actions (sysfs writes, commands) get an entry too, so ``--diff`` shows every
        action without ``-v``: the attribute and the value written, or the command line.
        """
        out = []
        prefix = root.rstrip("/")
        for a in self.actions:
            if a.live_only:
                out.append(runtime_diff(a, prefix))
            elif a.kind in (WRITE_FILE, REMOVE_FILE):
                before, after = a.before or "", (a.content or "") if a.kind == WRITE_FILE else ""
                if a.shown is not None:
                    before, after = a.shown
                elif a.brief_diff:
                    before, after = (_brief(t) for t in (before, after))
                out.append(
                    {
                        "before_header": f"{prefix}/{a.path}",
                        "after_header": f"{prefix}/{a.path}",
                        "before": before,
                        "after": after,
                    }
                )
        return out

    def describe(self) -> list[str]:
        return [a.describe() for a in self.actions]


def runtime_diff(action: Action, prefix: str = "") -> dict[str, str]:
    """The --diff entry of a runtime action: Ansible shows it as ``--- before: HEADER`` /
    ``+++ after: HEADER (why)`` and the value written (sysfs) or the command line as an added line."""
    if action.kind == WRITE_SYSFS:
        header = f"{prefix}/{action.path} (sysfs write, now)"
        after = (action.content or "").strip()
    else:
        header = "command (run now)"
        after = " ".join(action.argv or [])
    return {"before_header": header, "after_header": f"{header}: {action.why}", "before": "", "after": after + "\n"}


def _brief(text: str) -> str:
    if not text:
        return ""
    import hashlib  # here, not at import: OpenSSL's load is a few ms of every run that never diffs

    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"({len(text.splitlines())} lines, sha256 {digest}...)\n"


def sysfs_write(path: str, value: str, why: str) -> Action:
    """Write ``value`` to a sysfs (or procfs) attribute: live-only, not run on other roots."""
    return Action(WRITE_SYSFS, why, path=path, content=value)


def file_action(path: str, content: str | None, before: str | None, why: str, mode: int = 0o644) -> Action | None:
    """The action that makes ``path`` hold ``content`` (None: absent); None when it already does."""
    if content is None:
        return None if before is None else Action(REMOVE_FILE, why, path=path, before=before)
    if before == content:
        return None
    return Action(WRITE_FILE, why, path=path, content=content, before=before, mode=mode)
