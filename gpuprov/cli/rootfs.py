"""Reading a capture tarball safely: the one way every ``--root x.tar.gz`` is unpacked.

A capture comes from anywhere (a bug report, a stranger), so it is read as hostile
(docs/concepts/captures.md): members are read one by one, never with ``extractall``
(its filters are absent on Debian 12's Python 3.11.2, and even the "tar" filter lets a
hard link to a path outside be overwritten through). Only regular files, directories
and symlinks whose targets stay inside the capture (resolved as if the capture were
``/``) are kept; every count and size is capped while the bytes stream past; a
refusal names the member and the fix, and leaves nothing behind.

Stdlib only.
"""

from __future__ import annotations

import gzip
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

# Caps (docs/concepts/captures.md). A real capture is ~10k members and a few MB.
MAX_MEMBERS = 200_000
# Sysfs reads at most 16 MiB of a file (host/sysfs.py MAX_READ_BYTES): a bigger one is useless.
MAX_FILE_BYTES = 16 << 20
# Expanded file contents, all members together.
MAX_TOTAL_BYTES = 256 << 20
# The whole decompressed stream (contents + headers + padding): the gzip-bomb bound,
# counted as bytes come out of the decompressor, whatever the headers claim.
MAX_STREAM_BYTES = 512 << 20
# A pax or GNU long-name header is read into memory whole: keep it small.
MAX_HEADER_BYTES = 64 << 10
# Linux's own limits: path and link target length, one name, symlink hops (MAXSYMLINKS).
MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_LINK_HOPS = 40
# Path components walked to check every link (a real capture needs well under 1M).
MAX_LINK_STEPS = 4_000_000

_CHUNK = 1 << 16
_RECAPTURE = "re-run `gpuprov capture` on the host"
_REFUSED_TYPES = {
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}
_METADATA_TYPES = (
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
)


class CaptureRefused(ValueError):
    """The archive is not a capture gpuprov can read safely; the message names the fix."""


def printable(text: str, limit: int = 200) -> str:
    """``text`` with control characters and undecodable bytes shown as escapes, cut at ``limit``."""
    out = "".join(c if c.isprintable() else _escape(c) for c in text[:limit])
    return out + "..." if len(text) > limit else out


def _escape(char: str) -> str:
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, as surrogateescape keeps it
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class _Counted:
    """A read-only stream that refuses to give more than ``MAX_STREAM_BYTES`` in all."""

    def __init__(self, raw: object) -> None:
        self._raw = raw
        self.total = 0

    def read(self, size: int = -1) -> bytes:
        want = _CHUNK if size is None or size < 0 else size
        if self.total + want > MAX_STREAM_BYTES:
            want = MAX_STREAM_BYTES - self.total + 1  # one byte over: proof it is too big
        data = self._raw.read(want)  # type: ignore[attr-defined]
        self.total += len(data)
        if self.total > MAX_STREAM_BYTES:
            raise CaptureRefused(
                f"expands past {MAX_STREAM_BYTES >> 20} MiB (a real capture is a few MB): "
                f"it is not a gpuprov capture; {_RECAPTURE}"
            )
        return data


def _never(what: str, name: str) -> CaptureRefused:
    return CaptureRefused(f"holds {what} '{printable(name)}' (gpuprov captures never do): {_RECAPTURE}")


class _BadHeader(Exception):
    """A member header tarfile would skip silently (it ends the archive early instead)."""


class _CheckedInfo(tarfile.TarInfo):
    """TarInfo that refuses what tarfile would read blindly: truncated or damaged headers,
    oversized pax/GNU long-name headers (read into memory whole), sparse members."""

    @classmethod
    def frombuf(cls, buf: bytes, encoding: str, errors: str) -> tarfile.TarInfo:
        try:
            info = super().frombuf(buf, encoding, errors)
        except tarfile.EOFHeaderError:
            raise  # the end-of-archive marker: a normal end
        except tarfile.EmptyHeaderError:
            raise _BadHeader("ends without the end-of-archive marker: it is truncated") from None
        except tarfile.TruncatedHeaderError:
            raise _BadHeader("ends in the middle of a member header: it is truncated") from None
        except tarfile.HeaderError:
            raise _BadHeader("has a damaged member header: it is corrupt, or not a tar archive") from None
        _check_size(info)
        if info.type in _METADATA_TYPES and info.size > MAX_HEADER_BYTES:
            raise CaptureRefused(
                f"holds an extended header of {info.size} bytes (the cap is {MAX_HEADER_BYTES >> 10} KiB): {_RECAPTURE}"
            )
        if info.type == tarfile.GNUTYPE_SPARSE:  # before tarfile reads its sparse map
            raise _never("a sparse file", info.name)
        return info


def _check_size(info: tarfile.TarInfo) -> None:
    """Checked on the header, and again once a pax record may have changed the size."""
    if info.size < 0 or info.size > MAX_FILE_BYTES:
        raise CaptureRefused(
            f"holds a member '{printable(info.name)}' of {info.size} bytes (the cap is {MAX_FILE_BYTES >> 20} MiB "
            f"a file): {_RECAPTURE}"
        )


def _check_text(what: str, text: str, member: str) -> None:
    if not text:
        raise CaptureRefused(f"holds {what} that is empty (member '{printable(member)}'): {_RECAPTURE}")
    if not text.isprintable():  # C's loop: this runs on every member name and link target
        raise CaptureRefused(
            f"holds {what} '{printable(text)}' with a control character or undecodable bytes "
            f"(gpuprov captures never do): {_RECAPTURE}"
        )
    if len(text.encode()) > MAX_PATH_BYTES:
        raise CaptureRefused(f"holds {what} '{printable(text)}' longer than {MAX_PATH_BYTES} bytes: {_RECAPTURE}")


def _member_path(info: tarfile.TarInfo) -> str | None:
    """The member's root-relative path (``None`` for the capture's own top ``.``), or a refusal."""
    name = info.name
    _check_text("a member name", name, name)
    while name.startswith("./"):  # `tar czf x.tgz -C dir .` writes ./sys/...
        name = name[2:]
    if name in ("", "."):
        if info.isdir():
            return None
        raise CaptureRefused(f"holds a member named '{printable(info.name)}' that is not a directory: {_RECAPTURE}")
    if name.startswith("/"):
        raise CaptureRefused(
            f"holds a member with an absolute name '{printable(name)}' (capture members are relative): {_RECAPTURE}"
        )
    parts = name.split("/")
    if ".." in parts:
        raise CaptureRefused(
            f"holds a member '{printable(name)}' with a '..' component (it would land outside): {_RECAPTURE}"
        )
    if "" in parts or "." in parts:
        raise CaptureRefused(f"holds a member '{printable(name)}' with an empty or '.' component: {_RECAPTURE}")
    if len(name.encode()) > MAX_NAME_BYTES and any(len(p.encode()) > MAX_NAME_BYTES for p in parts):
        raise CaptureRefused(
            f"holds a member '{printable(name)}' with a name over {MAX_NAME_BYTES} bytes: {_RECAPTURE}"
        )
    return name


def _link_refusal(name: str, target: str, why: str) -> CaptureRefused:
    return CaptureRefused(
        f"holds a symlink '{printable(name)}' -> '{printable(target)}' that {why} (gpuprov captures keep every "
        f"link inside): {_RECAPTURE}"
    )


def _check_links(kinds: dict[str, str], links: dict[str, str]) -> None:
    """Refuse a link whose target leaves the capture or loops, resolved as if the capture were ``/``.

    Absolute targets start at the capture's top; ``..`` may not climb above it; links met on
    the way are followed (at most ``MAX_LINK_HOPS`` per link, ``MAX_LINK_STEPS`` in all). A
    target that does not exist is fine: a process's ``fd/N -> /dev/vfio/6`` is data, kept as is.
    """
    steps = 0
    for name, first in links.items():
        parts = [] if first.startswith("/") else name.split("/")[:-1]
        pending = [c for c in reversed(first.split("/")) if c not in ("", ".")]
        hops = 0
        while pending:
            steps += 1
            if steps > MAX_LINK_STEPS:
                raise _link_refusal(name, first, "ends a chain of links too long to follow")
            comp = pending.pop()
            if comp == "..":
                if not parts:
                    raise _link_refusal(name, first, "climbs above the capture's top")
                parts.pop()
                continue
            parts.append(comp)
            kind = kinds.get("/".join(parts))
            if kind == "link":
                hops += 1
                if hops > MAX_LINK_HOPS:
                    raise _link_refusal(name, first, f"loops (more than {MAX_LINK_HOPS} links deep)")
                target = links["/".join(parts)]
                parts = [] if target.startswith("/") else parts[:-1]
                pending.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
            elif kind == "file" and pending:
                break  # a file taken for a directory: the link dangles, harmlessly


def _open_archive(path: str) -> tuple[BinaryIO, BinaryIO]:
    """The tarball opened for streaming: (the file, the tar stream: itself or its gzip)."""
    try:
        # O_NONBLOCK: a FIFO given as the tarball must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise CaptureRefused(f"cannot be read ({exc.strerror}): check the path and its permissions") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise CaptureRefused("is not a regular file: give the .tar.gz that `gpuprov capture` wrote")
    if st.st_size == 0:
        os.close(fd)
        raise CaptureRefused(f"is an empty file: {_RECAPTURE}")
    raw = os.fdopen(fd, "rb")
    magic = raw.read(2)
    raw.seek(0)
    # By content, not by name: a .tar.gz that is really a plain tar still reads.
    return raw, gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw


def _next_member(tar: tarfile.TarFile) -> tarfile.TarInfo | None:
    """``tar.next()``, and None after an archive whose first block ended it (an end marker only):
    there Python 3.9 and 3.10 seek back to re-read that block, which a stream cannot (StreamError,
    "seeking backwards is not allowed"); 3.11 returns None, as here."""
    if tar.offset == 0 and tar.fileobj is not None and tar.fileobj.tell() != 0:
        return None
    return tar.next()


def unpack(tarball: str, dest: str) -> int:
    """Unpack the capture ``tarball`` into the empty directory ``dest``; returns the member count.

    Raises :class:`CaptureRefused` (the message names the member and the fix) for anything
    a capture never holds; ``dest`` may then hold a partial tree: the caller removes it.
    """
    try:
        return _unpack(tarball, dest)
    except CaptureRefused as exc:
        raise CaptureRefused(f"capture '{printable(tarball)}' {exc}") from None


def _unpack(tarball: str, dest: str) -> int:
    raw, stream = _open_archive(tarball)
    counted = _Counted(stream)
    kinds: dict[str, str] = {}  # root-relative path -> "file", "dir", "implicit" (a parent), "link"
    links: dict[str, str] = {}
    last: str | None = None
    count = total = 0
    try:
        tar = tarfile.open(  # type: ignore[call-overload]
            fileobj=counted, mode="r|", tarinfo=_CheckedInfo, encoding="utf-8", errors="surrogateescape"
        )
        while (info := _next_member(tar)) is not None:
            tar.members.clear()  # stream mode keeps every TarInfo otherwise
            count += 1
            if count > MAX_MEMBERS:
                raise CaptureRefused(
                    f"holds more than {MAX_MEMBERS} members (a real capture has about 10,000): {_RECAPTURE}"
                )
            total += _member(tar, info, dest, kinds, links, total)
            last = info.name
        # Read on to the end: a gzip stream cut after the tar end marker is still truncated,
        # and its CRC is checked only there.
        while counted.read(_CHUNK):
            pass
        _check_links(kinds, links)
        for name, target in links.items():  # last: nothing is ever written through a link
            os.symlink(target, os.path.join(dest, name))
    except _BadHeader as exc:
        where = f"after member '{printable(last)}'" if last else "at its start"
        raise CaptureRefused(f"{exc} ({where}): {_RECAPTURE}") from None
    except (tarfile.TarError, EOFError, zlib.error, UnicodeError, gzip.BadGzipFile) as exc:
        raise _unreadable(exc, last) from None
    except OSError as exc:  # reading the file or writing the temp dir (full, say): not the archive's fault
        raise CaptureRefused(
            f"cannot be unpacked ({exc.strerror or exc}, after member '{printable(last or '')}'): check that "
            f"it is readable and that the temp dir ({printable(os.path.dirname(dest) or dest)}, TMPDIR) has room"
        ) from None
    finally:
        stream.close()
        raw.close()
    if kinds.get("sys") not in ("dir", "implicit"):
        nested = sorted(n for n, k in kinds.items() if n.endswith("/sys") and n.count("/") == 1 and k != "link")
        hint = f" (it has '{printable(nested[0])}': pack it from inside that folder)" if nested else ""
        raise CaptureRefused(f"has no sys/ directory at its top{hint}: {_RECAPTURE}")
    return count


def _unreadable(exc: BaseException, last: str | None) -> CaptureRefused:
    where = f"after member '{printable(last)}'" if last else "at its start"
    reason = printable(str(exc)) or type(exc).__name__
    return CaptureRefused(
        f"is not a readable .tar.gz or .tar ({reason}, {where}): it is truncated or corrupt; {_RECAPTURE}"
    )


def _member(
    tar: tarfile.TarFile, info: tarfile.TarInfo, dest: str, kinds: dict[str, str], links: dict[str, str], total: int
) -> int:
    """Write one member under ``dest``; returns the bytes written."""
    if info.type in _REFUSED_TYPES:
        raise _never(_REFUSED_TYPES[info.type], info.name)
    if info.sparse is not None or any(k.startswith("GNU.sparse") for k in info.pax_headers):
        raise _never("a sparse file", info.name)
    _check_size(info)
    if not (info.isreg() or info.isdir() or info.issym()):
        kind = printable(info.type.decode("latin-1"))
        raise CaptureRefused(
            f"holds a member '{printable(info.name)}' of tar type '{kind}' (gpuprov captures hold only files, "
            f"directories and symlinks): {_RECAPTURE}"
        )
    name = _member_path(info)
    if name is None:
        return 0
    seen = kinds.get(name)
    if seen is not None and not (seen == "implicit" and info.isdir()):
        raise CaptureRefused(
            f"holds '{printable(name)}' twice (a later member would overwrite an earlier one): {_RECAPTURE}"
        )
    _make_parents(name, dest, kinds)
    path = os.path.join(dest, name)
    if info.isdir():
        if seen is None:
            os.mkdir(path, 0o700)
        kinds[name] = "dir"
        return 0
    if info.issym():
        _check_text("a symlink target", info.linkname, name)
        kinds[name] = "link"
        links[name] = info.linkname
        return 0
    if total + info.size > MAX_TOTAL_BYTES:
        raise CaptureRefused(
            f"expands past {MAX_TOTAL_BYTES >> 20} MiB of files at member '{printable(name)}' "
            f"(a real capture is a few MB): {_RECAPTURE}"
        )
    kinds[name] = "file"
    src = tar.extractfile(info)
    if src is None:  # not reachable for a regular member; refuse rather than guess
        raise CaptureRefused(f"holds an unreadable member '{printable(name)}': {_RECAPTURE}")
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    written = 0
    try:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            if written > info.size:  # never trust the header alone
                raise CaptureRefused(f"member '{printable(name)}' holds more than its header says: {_RECAPTURE}")
            os.write(out, chunk)
    finally:
        os.close(out)
    return written


def _make_parents(name: str, dest: str, kinds: dict[str, str]) -> None:
    """Create the member's missing parent directories; refuse a parent that is a file or a link."""
    parts = name.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        parent = "/".join(parts[:i])
        kind = kinds.get(parent)
        if kind in ("dir", "implicit"):
            continue
        if kind is not None:
            what = "a symlink" if kind == "link" else "a file"
            raise CaptureRefused(
                f"holds '{printable(name)}' below '{printable(parent)}', which is {what} (members are never "
                f"written through links): {_RECAPTURE}"
            )
        os.mkdir(os.path.join(dest, parent), 0o700)
        kinds[parent] = "implicit"


@contextmanager
def unpacked(tarball: str) -> Iterator[str]:
    """A temporary directory holding the unpacked capture; removed on exit, error or Ctrl-C."""
    tmp = tempfile.mkdtemp(prefix="gpuprov-root-")
    try:
        unpack(tarball, tmp)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
