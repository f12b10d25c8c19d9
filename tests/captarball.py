"""Build capture tarballs, good and hostile, for the tests of gpuprov.rootfs and Sysfs.

Members are ``(TarInfo, data)`` pairs: a real capture's members (read from our own
fixtures with tarfile, never extracted) plus whatever a hostile archive adds.
"""

from __future__ import annotations

import copy
import gzip
import io
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Optional

Entry = tuple[tarfile.TarInfo, Optional[bytes]]  # Optional: evaluated here, and 3.9 has no `bytes | None`

_cache: dict[str, list[Entry]] = {}


def members_of(tarball: Path) -> list[Entry]:
    """Every member of one of our own fixture captures, with its data (copies: safe to change)."""
    key = str(tarball)
    if key not in _cache:
        entries: list[Entry] = []
        with tarfile.open(tarball) as tar:
            for info in tar.getmembers():
                data = tar.extractfile(info).read() if info.isreg() else None  # type: ignore[union-attr]
                entries.append((info, data))
        _cache[key] = entries
    return [(copy.copy(info), data) for info, data in _cache[key]]


def reg(name: str, data: bytes = b"x\n") -> Entry:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o444
    return info, data


def sym(name: str, target: str) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    return info, None


def hard(name: str, target: str) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.LNKTYPE, target
    return info, None


def directory(name: str) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def node(name: str, kind: bytes, major: int = 0, minor: int = 0) -> Entry:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = kind, major, minor
    return info, None


def without(entries: Iterable[Entry], *names: str) -> list[Entry]:
    """``entries`` less the members named, and everything below them."""
    drop = tuple(names)
    return [(i, d) for i, d in entries if i.name not in drop and not i.name.startswith(tuple(n + "/" for n in drop))]


def with_pax(entry: Entry, **headers: str) -> Entry:
    entry[0].pax_headers.update(headers)
    return entry


def tar_bytes(entries: Iterable[Entry], *, end: bool = True) -> bytes:
    """The tar stream; ``end=False`` leaves off the end-of-archive marker (to append raw headers)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8") as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
        stop = tar.offset
    return buf.getvalue() if end else buf.getvalue()[:stop]


def header_offsets(raw: bytes) -> list[int]:
    """Where each member's header starts in the tar stream ``raw``."""
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return [m.offset for m in tar.getmembers()]


def write(path: Path, entries: Iterable[Entry], *, gz: bool = True) -> Path:
    raw = tar_bytes(entries)
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    return path
