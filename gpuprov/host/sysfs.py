"""One root-relative reader for sysfs, procfs and a few files under /etc.

Every fact gpuprov knows about a host is read through a :class:`Sysfs`, so a
captured tarball unpacked into a directory, an emulated host or the live
machine (root ``/``) are read the same way. Paths are given relative to the
root (``"sys/bus/pci/devices"``). A missing or unreadable file is ``None``,
never an exception: hosts differ in kernel version, permissions and drivers,
and a fact that cannot be read is reported as unknown by the caller.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

# (op, relpath) recorded when tracing; op is "read", "listdir" or "readlink".
TraceEntry = tuple[str, str]

# sysfs attributes are small; a cap keeps a stray binary file from being slurped.
_MAX_READ = 1 << 20


class Sysfs:
    """Read files, directories and symlinks below ``root``.

    ``trace=True`` records every access in :attr:`trace`; ``gpuprov capture``
    uses that to copy exactly what inspect reads, and the benchmark uses it to
    replay the same reads as a floor.
    """

    def __init__(self, root: str = "/", *, trace: bool = False) -> None:
        self.root = os.path.abspath(root)
        self._prefix = "" if self.root == "/" else self.root
        self.trace: list[TraceEntry] | None = [] if trace else None

    @property
    def live(self) -> bool:
        """True when reading the running machine rather than a capture."""
        return self.root == "/"

    def path(self, rel: str) -> str:
        """Absolute path of ``rel`` below the root."""
        return f"{self._prefix}/{rel}"

    def read(self, rel: str) -> str | None:
        """Text of a file, stripped; ``None`` when absent or unreadable."""
        raw = self.read_bytes(rel)
        if raw is None:
            return None
        return raw.decode("utf-8", "replace").strip()

    def read_bytes(self, rel: str) -> bytes | None:
        if self.trace is not None:
            self.trace.append(("read", rel))
        try:
            with open(f"{self._prefix}/{rel}", "rb") as f:
                return f.read(_MAX_READ)
        except OSError:
            return None

    def read_int(self, rel: str, base: int = 0) -> int | None:
        """An integer attribute (``0x10de``, ``16``, ``-1``); ``None`` if not one."""
        text = self.read(rel)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            return None

    def read_lines(self, rel: str) -> list[str]:
        text = self.read(rel)
        return text.splitlines() if text else []

    def listdir(self, rel: str) -> list[str]:
        """Sorted names in a directory; empty when absent or unreadable."""
        names = self.try_listdir(rel)
        return [] if names is None else names

    def try_listdir(self, rel: str) -> list[str] | None:
        """Like :meth:`listdir`, but ``None`` when the directory cannot be read."""
        if self.trace is not None:
            self.trace.append(("listdir", rel))
        try:
            return sorted(os.listdir(f"{self._prefix}/{rel}"))
        except OSError:
            return None

    def readlink(self, rel: str) -> str | None:
        """Target of a symlink as stored (relative in sysfs); ``None`` if not a link."""
        if self.trace is not None:
            self.trace.append(("readlink", rel))
        try:
            return os.readlink(f"{self._prefix}/{rel}")
        except OSError:
            return None

    def link_name(self, rel: str) -> str | None:
        """Last component of a symlink's target (a driver's or group's name)."""
        target = self.readlink(rel)
        return None if target is None else target.rstrip("/").rsplit("/", 1)[-1]

    def resolve(self, rel: str) -> str:
        """Root-relative canonical path of ``rel``, following every symlink.

        Done component by component through :meth:`readlink`, so that tracing
        sees each link (a capture must hold them all) and an absolute link in a
        capture cannot lead outside the root.
        """
        parts: list[str] = []
        pending = rel.strip("/").split("/")
        hops = 0
        while pending:
            name = pending.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if parts:
                    parts.pop()
                continue
            candidate = "/".join([*parts, name])
            target = self.readlink(candidate) if hops < 64 else None
            if target is None:
                parts.append(name)
                continue
            hops += 1
            if target.startswith("/"):
                parts = []
            pending = target.strip("/").split("/") + pending
        return "/".join(parts)

    def exists(self, rel: str) -> bool:
        if self.trace is not None:
            self.trace.append(("read", rel))
        return os.path.lexists(f"{self._prefix}/{rel}")

    def walk_files(self, rel: str) -> Iterator[str]:
        """Root-relative paths of the regular files below ``rel`` (no symlinks followed)."""
        for entry in self.listdir(rel):
            child = f"{rel}/{entry}"
            full = self.path(child)
            if os.path.islink(full):
                continue
            if os.path.isdir(full):
                yield from self.walk_files(child)
            else:
                yield child
