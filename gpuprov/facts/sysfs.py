"""One root-relative reader for sysfs, procfs and a few files under /etc.

Every fact gpuprov knows about a host is read through a :class:`Sysfs`, so a
captured tarball unpacked into a directory, an emulated host or the live
machine (root ``/``) are read the same way. Paths are given relative to the
root (``"sys/bus/pci/devices"``). A missing or unreadable file is ``None``,
never an exception: hosts differ in kernel version, permissions and drivers,
and a fact that cannot be read is reported as unknown by the caller.

A root other than ``/`` is untrusted (a capture from anywhere, docs/concepts/captures.md):
every path is resolved inside it, as if it were ``/`` (a link to ``/etc/passwd`` or
``../../..`` stays in the root; a loop reads as missing), and only regular files are
opened, never a FIFO or a device. The live root is the kernel's own sysfs and procfs: the
kernel resolves its paths, and only the few files outside them are checked.

How an untrusted root is read: a directory is opened once (the MAX_OPEN_DIRS used last stay
open, and those a reader holds, :meth:`Sysfs.hold`) and what is in it is opened relative to it,
one name at a time with ``O_NOFOLLOW``, after its type is known (from the directory's listing,
else ``fstatat``): a final link is read and followed here, by name. The directory itself is
resolved by the kernel with openat2's ``RESOLVE_IN_ROOT`` (:mod:`gpuprov.facts.openat2`), as is
a link read in a directory not open (``O_PATH | O_NOFOLLOW``, then ``readlinkat``); where the
kernel lacks openat2 (before 5.6, or a seccomp filter refuses it, or ``GPUPROV_NO_OPENAT2`` is
set), by a walk in Python, every link read and followed inside the root, the directory then
opened one component at a time with ``O_NOFOLLOW``. Both give the same answers (tests/facts/test_sysfs_openat2.py).
"""

from __future__ import annotations

import itertools
import operator
import os
import re
import stat
from collections.abc import Collection, Iterable, Iterator

from .openat2 import Opener, opener

_PCI_DIR = re.compile(r"^(pci)?[0-9a-f]{4,8}:[0-9a-f]{2}(:[0-1][0-9a-f]\.[0-7])?$")

# (op, relpath) recorded when tracing; op is "read", "listdir" or "readlink".
TraceEntry = tuple[str, str]

# sysfs attributes are at most a page (config space 4 KiB): one read gets them.
# procfs files can be long and come a page at a time, so those are read to EOF,
# up to a cap that keeps a stray huge file from being slurped.
_CHUNK = 1 << 16
MAX_READ_BYTES = 1 << 24
# Entries one listing of an untrusted root may hold (a real /proc or PCI bus has thousands).
MAX_DIR_ENTRIES = 1 << 18
# Symlinks followed in one path, as the kernel's MAXSYMLINKS.
MAX_LINK_HOPS = 40
# Directories of an untrusted root kept open (the oldest is closed first): inspect reads a
# device directory at a time, and a few readers may be alive at once.
MAX_OPEN_DIRS = 16
# Directories held open beside those (Sysfs.hold): a bridge whose devices are read later, after
# those of the bridges before it in address order.
MAX_HELD_DIRS = 64
# Components of a directory opened by the walk (a path of PATH_MAX has at most 2048).
_MAX_DEPTH = 2048
# Regular files only, and opening never waits (a FIFO opens at once, then fstat refuses it).
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
_OPEN_CONFINED = _OPEN_FLAGS | os.O_NOFOLLOW
# A directory, to list it or open below it (O_DIRECTORY: nothing else is ever opened).
_DIR_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY
# A link itself, not followed (readlinkat of "" reads it).
_LINK_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_SPECIAL = ("", ".", "..")
_NAME = operator.attrgetter("name")


MAX_INT_CHARS = 24  # a 64-bit counter is 20 digits (a sign, "0x" and spaces around): a longer one is no host's


def parse_int(text: str | None, base: int = 10) -> int | None:
    """``int(text, base)`` for a number a host wrote (sysfs, procfs, nvidia-smi), or ``None`` for a
    missing or malformed one: ASCII only (``isdigit`` takes superscripts, which ``int`` refuses) and
    bounded in length (a 5,000-digit counter is over Python's int limit; a 400-digit one overflows a float)."""
    if text is None or len(text) > MAX_INT_CHARS * 4:
        return None
    value = text.strip()
    if not value or len(value) > MAX_INT_CHARS or not value.isascii():
        return None
    try:
        return int(value, base)
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
        # Untrusted roots, all opened at first use: the root's descriptor (-1: unusable)...
        self._root_fd: int | None = None
        # ...how its directories are resolved (openat2, else None: the walk below)...
        self._open_in_root: Opener | None = None
        # ...directories kept open, by key: the path as asked (openat2) or its real path (walk)...
        self._fds: dict[str, int] = {}
        # ...those of them held open (Sysfs.hold), not closed to make room...
        self._held: set[str] = set()
        # ...a listed directory's entries (their types, from d_type), by the same key...
        self._listed: dict[str, dict[str, os.DirEntry[str]]] = {}
        # ...and, for the walk, root-relative path -> its real path inside the root.
        self._real: dict[str, str] = {}

    @property
    def live(self) -> bool:
        """True when reading the running machine rather than a capture."""
        return self.root == "/"

    @property
    def kernel_confined(self) -> bool:
        """True when the kernel resolves this untrusted root's paths (openat2), False when gpuprov
        walks them or the root is the live one."""
        return bool(self._prefix) and self._root() >= 0 and self._open_in_root is not None

    def close(self) -> None:
        """Close the directories kept open (reading again opens them again)."""
        fds = list(self._fds.values())
        self._fds.clear()
        self._held.clear()
        self._listed.clear()
        if self._root_fd is not None and self._root_fd >= 0:
            fds.append(self._root_fd)
        self._root_fd = None
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit os may be gone; the fds go with the process
            pass

    def path(self, rel: str) -> str:
        """Absolute path of ``rel`` below the root, as written: its links are not resolved inside
        the root, so read through the methods below, never by opening this path."""
        return f"{self._prefix}/{rel}"

    def write_path(self, rel: str) -> str:
        """Absolute path at which to write, replace or remove ``rel``: on a root other than ``/``
        its directory is resolved inside the root (a link in a staged root cannot send a write
        outside it), and its last component is taken as named (replaced or removed, never followed)."""
        if not self._prefix:
            return self.path(rel)
        head, _sep, name = rel.strip("/").rpartition("/")
        return self.path(f"{self.resolve(head)}/{name}".lstrip("/") if head else name)

    def read(self, rel: str) -> str | None:
        """Text of a file, stripped; ``None`` when absent or unreadable."""
        raw = self.read_bytes(rel)
        if raw is None:
            return None
        return raw.decode("utf-8", "replace").strip()

    def read_text(self, rel: str) -> str | None:
        """A managed file's exact text (not stripped), None when absent or unreadable."""
        raw = self.read_bytes(rel)
        return None if raw is None else raw.decode("utf-8", "replace")

    def read_bytes(self, rel: str) -> bytes | None:
        if self.trace is not None:
            self.trace.append(("read", rel))
        # os.open/os.read: a buffered file object costs more than the read itself.
        try:
            if not self._prefix:
                fd = self._open_live(rel)
            else:
                # The type before the open: opening a device node can act (a watchdog, a tape).
                # The common case inline: a regular file its open directory's listing shows.
                head, _sep, name = rel.rpartition("/")
                dir_fd = self._fds.get(head)
                listed = self._listed.get(head) if dir_fd is not None else None
                entry = listed.get(name) if listed is not None else None
                if entry is None or not entry.is_file(follow_symlinks=False):
                    found = self._locate(rel)
                    if found is None or found[2] != stat.S_IFREG:
                        return None
                    dir_fd, name = found[0], found[1]
                fd = _open_regular(name, dir_fd)
                if fd < 0:
                    return None
        except (OSError, ValueError):  # ValueError: a NUL in a path built from read data
            return None
        return _read_fd(fd, not rel.startswith("sys/"))

    def read_in(self, rel: str, names: Iterable[str]) -> dict[str, str]:
        """``{name: text}`` of each of ``names`` in the directory ``rel`` that reads, each text as
        :meth:`read` gives it (and traced as it would be). A directory of an untrusted root just
        listed and still open reads its regular files by name with no lookup each: a device's
        attributes, thousands of times on a host with thousands of VFs."""
        out: dict[str, str] = {}
        dir_fd = self._fds.get(rel, -1) if self._prefix and rel.startswith("sys/") else -1
        listed = self._listed.get(rel) if dir_fd >= 0 else None
        trace = self.trace
        for name in names:
            entry = listed.get(name) if listed is not None else None
            if entry is None or not entry.is_file(follow_symlinks=False):
                text = self.read(f"{rel}/{name}")  # anything else: the one general way
                if text is not None:
                    out[name] = text
                continue
            if trace is not None:
                trace.append(("read", f"{rel}/{name}"))
            try:
                fd = _open_regular(name, dir_fd)
            except (OSError, ValueError):
                continue
            raw = None if fd < 0 else _read_fd(fd, False)
            if raw is not None:
                out[name] = raw.decode("utf-8", "replace").strip()
        return out

    def _open_live(self, rel: str) -> int:
        """Open a file of the running machine. sysfs and procfs hold no FIFOs or devices, so
        only the few files elsewhere (``etc/os-release``...) pay for a check."""
        if rel.startswith(("sys/", "proc/")):
            return os.open(f"/{rel}", _OPEN_FLAGS)
        if not stat.S_ISREG(os.stat(f"/{rel}").st_mode):
            raise OSError(f"/{rel} is not a regular file")
        fd = os.open(f"/{rel}", _OPEN_FLAGS)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"/{rel} is not a regular file")
        return fd

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
        names = self._list(rel)
        return None if names is None else sorted(names)

    def names(self, rel: str) -> Collection[str]:
        """The names in a directory, unsorted (for ``in`` tests: no sort, no list to search);
        empty when absent or unreadable. Traced as a listing."""
        names = self._list(rel)
        return () if names is None else names

    def _list(self, rel: str) -> Collection[str] | None:
        if self.trace is not None:
            self.trace.append(("listdir", rel))
        try:
            if not self._prefix:
                return set(os.listdir(f"/{rel}"))
            found = self._dir(rel)
            if found is None:
                return None
            # The kept descriptor itself: scandir reads a copy, and rewinds it when done.
            with os.scandir(found[0]) as entries:
                listed = list(itertools.islice(entries, MAX_DIR_ENTRIES + 1))
            kinds = dict(zip(map(_NAME, listed), listed))  # no Python loop: thousands of listings
        except (OSError, ValueError):
            return None
        if len(kinds) > MAX_DIR_ENTRIES:
            return None  # more than a real host has: unknown, not a partial answer
        self._listed[found[1]] = kinds
        return kinds.keys()

    def readlink(self, rel: str) -> str | None:
        """Target of a symlink as stored (relative in sysfs); ``None`` if not a link."""
        if self.trace is not None:
            self.trace.append(("readlink", rel))
        try:
            if not self._prefix:
                return os.readlink(f"/{rel}")
            head, _sep, name = rel.rpartition("/")
            if name in _SPECIAL:
                return None  # a directory
            dir_fd = self._fds.pop(head, None)
            if dir_fd is not None:
                self._fds[head] = dir_fd  # kept as the newest: a directory of links stays open
                return os.readlink(name, dir_fd=dir_fd)
            root = self._root()
            if head and root >= 0 and self._open_in_root is not None:
                # A directory not open: the link itself, its directories resolved by the kernel (one
                # call, and one only when it is missing, as a net device's `master` mostly is).
                fd = self._open_in_root(root, rel, _LINK_FLAGS)
                try:
                    return os.readlink("", dir_fd=fd)
                finally:
                    os.close(fd)
            found = self._dir(head)
            return None if found is None else os.readlink(name, dir_fd=found[0])
        except (OSError, ValueError):
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
        if base is not None and name not in _SPECIAL:
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

    def stat(self, rel: str) -> os.stat_result | None:
        """``os.stat`` of ``rel``, its links followed inside the root; None when absent."""
        try:
            if not self._prefix:
                return os.stat(f"/{rel}")
            found = self._locate(rel)
            if found is None:
                return None
            return os.stat(found[1], dir_fd=found[0], follow_symlinks=False) if found[1] else os.fstat(found[0])
        except (OSError, ValueError):
            return None

    def mtime(self, rel: str) -> float | None:
        """Modification time of a file (links followed inside the root); None when absent."""
        if self.trace is not None:
            self.trace.append(("read", rel))
        found = self.stat(rel)
        return None if found is None else found.st_mtime

    def exists(self, rel: str) -> bool:
        if self.trace is not None:
            self.trace.append(("read", rel))
        return self.kind(rel) != 0

    def kind(self, rel: str) -> int:
        """``stat.S_IFMT`` of ``rel`` itself (a final link is ``S_IFLNK``, not followed); 0 when
        missing. No system call for an entry of a directory just listed (its d_type). Not traced:
        a capture holds what the listing or read that follows names."""
        try:
            if not self._prefix:
                return stat.S_IFMT(os.lstat(f"/{rel}").st_mode)
            head, _sep, name = rel.rpartition("/")
            if name in _SPECIAL:
                return 0 if self._dir(rel) is None else stat.S_IFDIR
            found = self._dir(head)
            return 0 if found is None else self._kind(found, name)
        except (OSError, ValueError):
            return 0

    def walk_files(self, rel: str) -> Iterator[str]:
        """Root-relative paths of the regular files below ``rel`` (no symlinks followed)."""
        for entry in self.listdir(rel):
            child = f"{rel}/{entry}"
            if self._prefix:
                try:
                    found = self._dir(rel)
                    mode = 0 if found is None else self._kind(found, entry)
                except (OSError, ValueError):
                    continue
            else:
                try:
                    mode = os.lstat(f"/{child}").st_mode
                except (OSError, ValueError):
                    continue
            if stat.S_ISDIR(mode):
                yield from self.walk_files(child)
            elif stat.S_ISREG(mode):
                yield child

    # ------------------------------------------------------------ untrusted roots
    # Every name is opened (or listed, or read as a link) relative to its directory's descriptor,
    # never followed by the kernel when it is a link: a final link is read and followed here, at
    # most MAX_LINK_HOPS of them, its target resolved inside the root like any other path. A
    # directory is resolved by openat2(RESOLVE_IN_ROOT) or, without it, by _real_dir's walk.
    # Errors are raised (OSError, ValueError), and the public methods above make them None.

    def _root(self) -> int:
        """The root's descriptor, opened at first use; -1 when the root cannot be opened."""
        fd = self._root_fd
        if fd is None:
            self._open_in_root = opener()
            try:
                fd = os.open(self.root, _DIR_FLAGS)
            except OSError:
                fd = -1
            self._root_fd = fd
        return fd

    def _locate(self, rel: str) -> tuple[int, str, int] | None:
        """(directory descriptor, name, file type) of what ``rel`` names, every link followed
        inside the root; ``None`` when missing, looping or past MAX_LINK_HOPS. The name is
        never a link, or is "" for a directory named with ``.``, ``..`` or a trailing ``/``
        (the descriptor is then the directory's own)."""
        for _hop in range(MAX_LINK_HOPS + 1):
            head, _sep, name = rel.rpartition("/")
            if name in _SPECIAL:
                found = self._dir(rel)
                return None if found is None else (found[0], "", stat.S_IFDIR)
            found = self._dir(head)
            if found is None:
                return None
            kind = self._kind(found, name)
            if kind != stat.S_IFLNK:
                return (found[0], name, kind) if kind else None
            target = os.readlink(name, dir_fd=found[0])
            # Relative: from the link's directory (as asked, or its real path); absolute: from the root.
            rel = target if target.startswith("/") or not found[1] else f"{found[1]}/{target}"
        return None  # a loop, or a chain longer than the kernel follows

    def _kind(self, found: tuple[int, str], name: str) -> int:
        """``stat.S_IFMT`` of ``name`` in the directory ``found`` (its descriptor and key), not
        following it: from the directory's listing when it was listed, else fstatat; 0 when missing."""
        listed = self._listed.get(found[1])
        if listed is not None:
            entry = listed.get(name)
            if entry is not None:
                return _kind(entry)
        try:
            return stat.S_IFMT(os.stat(name, dir_fd=found[0], follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return 0

    def _dir(self, rel: str) -> tuple[int, str] | None:
        """(descriptor, key) of the directory ``rel``, every link in it followed inside the root;
        None when it is missing, not a directory, or loops. The key names it in the caches."""
        fd = self._fds.pop(rel, None)
        if fd is not None:
            self._fds[rel] = fd  # kept as the newest (the oldest is closed first)
            return fd, rel
        root = self._root()
        if root < 0:
            return None
        if not rel:
            return root, ""
        if "\0" in rel:
            raise ValueError("embedded null byte")
        open_in_root = self._open_in_root
        if open_in_root is not None:
            head, _sep, name = rel.rpartition("/")
            parent = self._fds.pop(head, None) if name not in _SPECIAL else None
            try:
                if parent is None:
                    fd = open_in_root(root, rel, _DIR_FLAGS)
                else:
                    self._fds[head] = parent  # kept as the newest: a bridge's directory outlives its devices'
                    # One name in a directory already resolved, not followed: the kernel's walk in
                    # the root, without ctypes. A link there (ELOOP, ENOTDIR) is left to openat2.
                    try:
                        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
                    except FileNotFoundError:
                        return None
                    except OSError:
                        fd = open_in_root(root, rel, _DIR_FLAGS)
            except OSError:
                return None
            self._keep(rel, fd)
            return fd, rel
        real = self._real_dir(rel)
        if real is None:
            return None
        if not real:
            return root, ""
        fd = self._fds.get(real)
        if fd is None:
            fd = self._open_real(real)
            if fd is None:
                return None
        return fd, real

    def hold(self, rel: str) -> None:
        """Keep the directory ``rel`` open (when it is, and fewer than MAX_HELD_DIRS are held) until
        :meth:`release`: what is in it is read later, after other directories."""
        # Only a directory kept under the path asked (always with openat2; a real path on the walk).
        if len(self._held) < MAX_HELD_DIRS and rel in self._fds:
            self._held.add(rel)

    def release(self, rel: str) -> None:
        """Let :meth:`hold`'s directory be closed again to make room."""
        self._held.discard(rel)

    def _keep(self, key: str, fd: int) -> None:
        """Keep ``fd`` open as ``key``, closing the oldest kept one past MAX_OPEN_DIRS (its listing
        goes with it: an entry of unknown type is looked up through its directory's descriptor);
        held ones (:meth:`hold`) are not closed, nor counted."""
        fds = self._fds
        held = self._held
        while len(fds) - len(held) >= MAX_OPEN_DIRS:  # a loop: down to the limit once released
            old = next(k for k in fds if k not in held)
            self._listed.pop(old, None)
            os.close(fds.pop(old))
        fds[key] = fd

    def _open_real(self, real: str) -> int | None:
        """Descriptor of a real directory (as :meth:`_real_dir` gives), opened from its nearest
        open ancestor one component at a time with ``O_NOFOLLOW``: a link swapped in since the
        walk is refused, not followed. Each directory opened is kept, and the ancestor used is
        kept as if just opened (the oldest is closed first, so shared parents stay open)."""
        parts = real.split("/")
        if len(parts) > _MAX_DEPTH:
            return None
        keys = list(itertools.accumulate(parts, lambda a, b: f"{a}/{b}"))
        fd = -1
        start = len(parts)
        while start > 0:
            start -= 1
            fd = self._fds.pop(keys[start], -1)
            if fd >= 0:  # kept again as the newest: a bridge's directory outlives its devices'
                self._fds[keys[start]] = fd
                start += 1
                break
        if fd < 0:
            fd = self._root()
        for i in range(start, len(parts)):
            try:
                fd = os.open(parts[i], _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                return None
            self._keep(keys[i], fd)
        return fd

    # The walk, without openat2: paths are resolved as the kernel would were the root `/`
    # (RESOLVE_IN_ROOT): every link is read and followed here, with absolute targets and `..`
    # kept inside. Each directory is resolved once (self._real), and a directory's listing gives
    # its entries' types without an lstat each (self._listed, by real path).

    def _type(self, real: str) -> int:
        """``stat.S_IFMT`` of a root-relative real path, not following it; 0 when missing."""
        folder, _sep, name = real.rpartition("/")
        listed = self._listed.get(folder)
        entry = listed.get(name) if listed is not None else None
        if entry is not None:
            return _kind(entry)
        try:
            return stat.S_IFMT(os.lstat(f"{self.root}/{real}").st_mode)
        except (OSError, ValueError):
            return 0

    def _real_dir(self, rel: str) -> str | None:
        """Root-relative real path of ``rel`` (every link followed inside the root); ``None``
        when missing or looping. Found paths are cached, misses are not (they stay cheap)."""
        known = self._real.get(rel)
        if known is not None:
            return known
        head, _sep, name = rel.rpartition("/")
        if head.count("/") > 64:  # not a path gpuprov builds: no deep recursion, walk it
            result = self._walk([], rel.split("/"))
        else:
            base = self._real_dir(head) if head else ""
            if base is None:
                return None
            here = f"{base}/{name}" if base else name
            # The common case, a real directory: one type check, no walk.
            if name not in _SPECIAL and self._type(here) == stat.S_IFDIR:
                result = here
            else:
                result = self._walk(base.split("/") if base else [], [name])
        if result is not None:
            self._real[rel] = result
        return result

    def _walk(self, real: list[str], names: list[str]) -> str | None:
        """Resolve ``names`` from the real directory ``real``, as the kernel would in a root."""
        pending = names[::-1]
        hops = 0
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            if name == "..":
                if real:  # `..` at the top stays at the top, as at `/`
                    real.pop()
                continue
            here = f"{'/'.join(real)}/{name}" if real else name
            known = self._real.get(here)
            if known is not None:  # a real directory met before, or a path asked for
                real = known.split("/") if known else []
                continue
            kind = self._type(here)
            if kind == stat.S_IFLNK:
                hops += 1
                if hops > MAX_LINK_HOPS:
                    return None  # a loop: reads as missing
                try:
                    target = os.readlink(f"{self.root}/{here}")
                except (OSError, ValueError):
                    return None
                if target.startswith("/"):
                    real = []  # absolute: from the root's top, never the machine's
                pending.extend(reversed(target.split("/")))
                continue
            if kind != stat.S_IFDIR:
                return None  # missing, or a file taken for a directory
            real.append(name)
            self._real[here] = here
        return "/".join(real)


def _kind(entry: os.DirEntry[str]) -> int:
    """An entry's file type from its listing (d_type): no syscall on the filesystems that give it."""
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    return stat.S_IFLNK if entry.is_symlink() else stat.S_IFIFO  # FIFO stands for "anything else"


def _open_regular(name: str, dir_fd: int) -> int:
    """``name`` in ``dir_fd`` opened for reading, never followed and never waiting; -1 when it is
    not a regular file (swapped since its type was checked)."""
    fd = os.open(name, _OPEN_CONFINED, dir_fd=dir_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    return fd


def _read_fd(fd: int, whole: bool) -> bytes | None:
    """The bytes of an open file, which is closed: one read of a sysfs attribute (a page at
    most), or with ``whole`` to EOF up to MAX_READ_BYTES (procfs comes a page at a time)."""
    try:
        data = os.read(fd, _CHUNK)
        if not whole:
            return data
        chunks = [data]
        total = len(data)
        while data and total < MAX_READ_BYTES:
            data = os.read(fd, _CHUNK)
            chunks.append(data)
            total += len(data)
        return b"".join(chunks)
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
