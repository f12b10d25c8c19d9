"""A file below the root as it is now: its bytes and its mode (a keyring apt_keyring manages); and a
file given by path, read only when it is a regular one (never a FIFO or device: they block or stream)."""

from __future__ import annotations

import os
import stat

from .sysfs import Sysfs


def file_state(sysfs: Sysfs, rel: str) -> tuple[bytes | None, int | None]:
    """(bytes, permission bits) of ``rel`` below the root; (None, None) when absent or unreadable."""
    data = sysfs.read_bytes(rel)
    info = None if data is None else sysfs.stat(rel)  # links followed inside the root, as the read did
    if info is None or not stat.S_ISREG(info.st_mode):
        return None, None
    return data, info.st_mode & 0o7777


class NotRegular(ValueError):
    """Not a regular file (a FIFO, a device, a directory, or a link where links are refused)."""


class TooLarge(ValueError):
    """Over the size limit; ``size`` is what fstat said (None when it grew while being read)."""

    def __init__(self, size: int | None) -> None:
        super().__init__(f"over the limit ({size} bytes)")
        self.size = size


def read_regular(path: str, limit: int, *, follow_links: bool = True) -> bytes:
    """A regular file's bytes, at most ``limit``: opened non-blocking, checked with fstat before any read
    (a FIFO named like a package or a YAML file would block for ever). Raises OSError, NotRegular, TooLarge."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(path)
        if info.st_size > limit:
            raise TooLarge(info.st_size)
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise TooLarge(None)
    return data


def read_text(sysfs: Sysfs, rel: str) -> str | None:
    """A managed file's exact text (not stripped), None when absent (:meth:`Sysfs.read_text`)."""
    return sysfs.read_text(rel)
