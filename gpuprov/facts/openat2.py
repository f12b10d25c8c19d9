"""openat2(2) with ``RESOLVE_IN_ROOT``: the kernel resolves a path inside a directory as if it were ``/``.

Python has no ``os.openat2``; this calls the system call through ctypes (Linux 5.6 and later). With
``RESOLVE_IN_ROOT`` an absolute link's target starts at the directory given, ``..`` never climbs
above it, and with ``RESOLVE_NO_MAGICLINKS`` procfs's ``/proc/*/fd`` links are refused: one system
call does what :class:`~gpuprov.facts.sysfs.Sysfs` otherwise does component by component in Python.

:func:`opener` gives ``None`` where the call is missing (an older kernel: ``ENOSYS``), filtered
(seccomp: ``EPERM``), on an architecture whose number is not known here, without ctypes, or when
``GPUPROV_NO_OPENAT2`` is set in the environment; the caller then walks the path itself.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
# The generic syscall table's number (one for every architecture since Linux 5.1, but alpha's,
# ia64's and mips'): machines where it is known to be 437.
_NR_OPENAT2 = 437
_MACHINES = {
    "x86_64",
    "amd64",
    "i386",
    "i486",
    "i586",
    "i686",
    "aarch64",
    "arm64",
    "armv7l",
    "armv8l",
    "riscv64",
    "ppc64le",
    "ppc64",
    "s390x",
    "loongarch64",
}
# A rename or mount anywhere on the system during the lookup (RESOLVE_IN_ROOT checks the global
# rename and mount sequence counts): the kernel asks to try again. On a busy machine four tries
# were not always enough (a test's `holders` listing read as unreadable once, at a load of 24),
# and an unreadable directory is reported as missing evidence; each try costs microseconds.
_RETRIES = 64

# (dirfd, path, flags) -> fd, raising OSError; None when unavailable.
Opener = Callable[[int, str, int], int]
# The process's answer, once asked: {"opener": Opener | None}.
_state: dict[str, Opener | None] = {}


def opener() -> Opener | None:
    """``open_in_root(dirfd, path, flags) -> fd``: ``path`` resolved by the kernel inside ``dirfd``
    (``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS``); ``None`` where openat2 cannot be used.
    The first call tries it once (on ``/``); the answer holds for the process."""
    if "opener" not in _state:
        _state["opener"] = _load()
    return _state["opener"]


def _load() -> Opener | None:
    if os.environ.get("GPUPROV_NO_OPENAT2") or os.uname().machine.lower() not in _MACHINES:
        return None
    try:
        import ctypes
    except ImportError:
        return None

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    try:
        call = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    call.restype = ctypes.c_long
    call.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t]
    size = ctypes.sizeof(OpenHow)
    hows: dict[int, tuple[object, int]] = {}  # flags -> (its struct, the struct's address)
    get_errno = ctypes.get_errno
    resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
    number = _NR_OPENAT2

    def open_in_root(dirfd: int, path: str, flags: int) -> int:
        raw = os.fsencode(path)
        if b"\0" in raw:  # a C string would end there: a different path, not this one
            raise ValueError("embedded null byte")
        how = hows.get(flags)
        if how is None:
            struct = OpenHow(flags, 0, resolve)
            how = hows[flags] = (struct, ctypes.addressof(struct))
        err = 0
        for _attempt in range(_RETRIES):
            fd = call(number, dirfd, raw, how[1], size)
            if fd >= 0:
                return fd
            err = get_errno()
            if err not in (errno.EAGAIN, errno.EINTR):
                break
        raise OSError(err, os.strerror(err), path)

    try:
        fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        os.close(open_in_root(fd, ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError:  # ENOSYS (before 5.6), EPERM (a seccomp filter), EINVAL, E2BIG: walk instead
        return None
    finally:
        os.close(fd)
    return open_in_root
