"""One gpuprov run at a time per concern on a host: an exclusive ``flock`` a module takes before it
reads the host and holds until its process ends (docs/reference/boot-trial.md, "One run at a time").

Why: a play killed on the controller does not stop the module on the host, which goes on to the end
of its plan. A run started again at once read the host before that one had recorded its work and
planned the same steps beside it: two trial initramfs builds into one file, one ``mv`` of the other's
output (the lab, 2026-11-29). The second run now waits, then reads what the first one left.

The lock goes with the process (the kernel drops a ``flock`` when its last descriptor closes), so a
killed holder never leaves a stale lock to clean up.
"""

from __future__ import annotations

import fcntl
import os
import time

from ..facts.sysfs import Sysfs

# Where the live host's locks are: /run is the root's own (a lock file in a world-writable folder
# such as /run/lock could be made by anyone beforehand) and is emptied at boot.
LOCK_DIR = "/run/gpuprov"
# How long a run waits for one that holds the lock: a trial initramfs build under the lab's TCG host
# takes about 90 s, a real host's far less.
WAIT_SECONDS = 300.0
_POLL_SECONDS = 0.5
_MAX_PROC_LOCKS = 1 << 20  # bytes of /proc/locks read when naming a holder

_held: list[int] = []  # descriptors of the locks taken: open until the process ends


def hold_for(root: str, concern: str, seconds: float | None = None) -> str | None:
    """Hold ``concern``'s lock on ``root`` (:func:`hold`): a file in :data:`LOCK_DIR` for the live
    root; the root folder itself for any other root, so nothing is written into a staged or scratch
    tree. A root that is no folder takes no lock and gets none made: the module's own check of its
    root says what is wrong with it. Live or not is Sysfs's rule, the one the module's reads and
    writes follow ("/." is the live root too, and takes the live root's lock)."""
    if Sysfs(root).live:
        return hold(os.path.join(LOCK_DIR, f"{concern}.lock"), seconds)
    if not os.path.isdir(root):
        return None
    return hold(root, seconds, folder=True)


def hold(path: str, seconds: float | None = None, *, folder: bool = False) -> str | None:
    """Take an exclusive lock on ``path`` (a ``folder``, or a file made 0600 when missing, never
    through a link), waiting at most ``seconds`` (:data:`WAIT_SECONDS`), and keep it until this
    process ends. None once it is held, else why not (the holder named when the kernel says who)."""
    try:
        if folder:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        else:
            os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"cannot open the lock {path}: {exc.strerror or exc}"
    seconds = WAIT_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                who = holder(fd)
                os.close(fd)
                return f"another run holds {path}{who} after {seconds:.0f} s of waiting"
            time.sleep(_POLL_SECONDS)
            continue
        except OSError as exc:
            os.close(fd)
            return f"cannot lock {path}: {exc.strerror or exc}"
        _held.append(fd)
        return None


def release() -> None:
    """Let go of every lock this process holds: for a caller that runs modules one after another in one
    process (tests/modrun.py); a module's own process just ends."""
    while _held:
        os.close(_held.pop())


def holder(fd: int) -> str:
    """ " (pid N, COMMAND)" for the process /proc/locks names as holding a flock on ``fd``'s file, else ""."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", "rb") as f:
            text = f.read(_MAX_PROC_LOCKS).decode("ascii", "replace")
    except OSError:
        return ""
    for line in text.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 1234 00:19:5678 0 EOF"; waiters are marked "->" and not holders.
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key and fields[4].isdigit():
            try:
                with open(f"/proc/{fields[4]}/comm", "rb") as f:
                    comm = f.read(64).decode("ascii", "replace").strip()
            except OSError:
                comm = "?"
            return f" (pid {fields[4]}, {comm})"
    return ""
