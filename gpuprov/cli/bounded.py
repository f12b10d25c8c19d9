"""Run a child that reads untrusted input (an inventory through Ansible's loader, ansible-playbook over
a fleet) bounded in time, memory and output: the whole process group is killed at the time limit,
each process may map at most ``memory_bytes`` (RLIMIT_AS) and write at most the output limit
(RLIMIT_FSIZE: its stdout is a file), and what it printed is read back only up to that limit.

Controller side only (the CLI); docs/reference/inputs.md, "Ansible inventories".
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

STDERR_TAIL = 64 << 10  # what is kept of stderr: its end, where the error is


class TimedOut(RuntimeError):
    """The child ran past its time limit and was killed with its process group."""


class OutputTooLarge(RuntimeError):
    """The child printed more than the output limit."""


@dataclass
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes  # its last STDERR_TAIL bytes


def _limits(memory_bytes: int | None, output_bytes: int) -> None:  # pragma: no cover - runs in the child
    if memory_bytes is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # past the output limit: killed, not an EFBIG to ignore


def _read(f: IO[bytes], limit: int, *, tail: bool = False) -> bytes:
    size = os.fstat(f.fileno()).st_size
    f.seek(max(0, size - limit) if tail else 0)
    return f.read(limit + 1)


def run_bounded(
    argv: list[str],
    *,
    time_limit: float,
    memory_bytes: int | None,
    output_bytes: int,
    stdin: bytes = b"",
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> Finished:
    """Run ``argv`` to its end within the limits. Raises OSError (it could not start), :class:`TimedOut`,
    :class:`OutputTooLarge`."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,  # its own process group: the kill reaches every worker it forked
            preexec_fn=lambda: _limits(memory_bytes, output_bytes + 1),
        )
        try:
            proc.communicate(stdin, timeout=time_limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise TimedOut(f"still running after {time_limit:g} s") from None
        except BaseException:
            _kill_group(proc)
            raise
        stdout = _read(out, output_bytes)
        if len(stdout) > output_bytes or proc.returncode == -signal.SIGXFSZ:
            raise OutputTooLarge(f"printed more than {output_bytes} bytes")
        return Finished(proc.returncode, stdout, _read(err, STDERR_TAIL, tail=True)[-STDERR_TAIL:])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
