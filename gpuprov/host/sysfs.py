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
import re
from collections.abc import Iterator

_PCI_DIR = re.compile(r"^(pci)?[0-9a-f]{4,8}:[0-9a-f]{2}(:[0-1][0-9a-f]\.[0-7])?$")

# (op, relpath) recorded when tracing; op is "read", "listdir" or "readlink".
TraceEntry = tuple[str, str]

# sysfs attributes are at most a page (config space 4 KiB): one read gets them.
# procfs files can be long and come a page at a time, so those are read to EOF,
# up to a cap that keeps a stray huge file from being slurped.
_CHUNK = 1 << 16
_MAX_READ = 1 << 24


def parse_int(text: str | None, base: int = 10) -> int | None:
    """``int(text, base)``, or ``None`` for a missing or malformed value."""
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


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
        # Path prefixes already resolved (sysfs does not change during one read).
        self._resolved: dict[str, str] = {}

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
        # os.open/os.read: a buffered file object costs more than the read itself.
        try:
            fd = os.open(f"{self._prefix}/{rel}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, _CHUNK)
            if rel.startswith("sys/"):
                return data
            chunks = [data]
            total = len(data)
            while data and total < _MAX_READ:
                data = os.read(fd, _CHUNK)
                chunks.append(data)
                total += len(data)
            return b"".join(chunks)
        except OSError:
            return None
        finally:
            os.close(fd)

    def read_int(self, rel: str, base: int = 0) -> int | None:
        """An integer attribute (``0x10de``, ``16``, ``-1``); ``None`` if not one."""
        return parse_int(self.read(rel), base)

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
        # Fast path: a link (or entry) in a directory already resolved, the
        # common case of sys/bus/pci/devices/X and sys/class/*/X.
        head, _sep, name = rel.rpartition("/")
        base = self._resolved.get(head)
        if base is not None and name not in ("", ".", ".."):
            target = self.readlink(rel)
            if target is None:
                return f"{base}/{name}"
            if not target.startswith("/") and base.startswith("sys/"):
                parts = base.split("/")
                for comp in target.split("/"):
                    if comp == "..":
                        if parts:
                            parts.pop()
                    elif comp and comp != ".":
                        parts.append(comp)
                return "/".join(parts)
        parts = []
        pending = rel.strip("/").split("/")
        hops = 0
        canonical = 0  # components left from a link's target: sysfs targets are real paths
        while pending:
            name = pending.pop(0)
            from_target = canonical > 0
            canonical -= 1
            if name in ("", "."):
                continue
            if name == "..":
                if parts:
                    parts.pop()
                continue
            candidate = f"{'/'.join(parts)}/{name}" if parts else name
            known = self._resolved.get(candidate)
            if known is not None:
                parts = known.split("/") if known else []
                continue
            # PCI device and host bridge directories under sys/devices are real
            # directories, never links: no need to ask.
            real_dir = len(parts) >= 2 and parts[1] == "devices" and parts[0] == "sys" and _PCI_DIR.match(name)
            target = None if from_target or real_dir or hops >= 64 else self.readlink(candidate)
            if target is None:
                parts.append(name)
                self._resolved[candidate] = candidate
                continue
            hops += 1
            if target.startswith("/"):
                parts = []
            target_parts = target.strip("/").split("/")
            canonical = len(target_parts) if candidate.startswith("sys/") else 0
            pending = target_parts + pending
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
