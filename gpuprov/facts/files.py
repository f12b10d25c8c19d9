"""A file below the root as it is now: its bytes and its mode (a keyring apt_keyring manages)."""

from __future__ import annotations

import os

from .sysfs import Sysfs


def file_state(sysfs: Sysfs, rel: str) -> tuple[bytes | None, int | None]:
    """(bytes, permission bits) of ``rel`` below the root; (None, None) when absent or unreadable."""
    data = sysfs.read_bytes(rel)
    if data is None:
        return None, None
    try:
        return data, os.stat(sysfs.path(rel)).st_mode & 0o7777
    except OSError:
        return None, None
