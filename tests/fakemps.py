"""A stand-in for NVIDIA's ``nvidia-cuda-mps-control`` (tests only), written as a script by :func:`write`:
``-f`` serves a control socket in ``$CUDA_MPS_PIPE_DIRECTORY`` until ``quit``, keeping the limits it is
given; without ``-f`` it sends one command read from stdin and prints the answer, as the real client
mode does. Lets the supervisor script gpuprov writes run for real (its own shell, its mount namespace,
its restarts) on a machine without a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

SOURCE = r"""
import os, socket, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
path = os.path.join(pipe, "control")
if sys.argv[1:] == ["-f"]:
    state = {"sm": "100.0", "mem": "0", "servers": {}}
    if os.path.exists(path):
        os.unlink(path)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
    while True:
        c, _ = s.accept()
        cmd = c.recv(4096).decode().split()
        out = ""
        if cmd[:1] == ["quit"]:
            c.close()
            os.unlink(path)
            sys.exit(0)
        elif cmd[:1] == ["set_default_active_thread_percentage"]:
            state["sm"] = f"{float(cmd[1]):.1f}"
        elif cmd[:1] == ["set_default_device_pinned_mem_limit"]:
            state["mem"] = cmd[2]
        elif cmd[:1] == ["get_default_active_thread_percentage"]:
            out = state["sm"]
        elif cmd[:1] == ["get_default_device_pinned_mem_limit"]:
            out = state["mem"]
        c.sendall(out.encode())
        c.close()
else:
    line = sys.stdin.read().strip()
    c = socket.socket(socket.AF_UNIX)
    try:
        c.connect(path)
    except OSError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
    c.sendall(line.encode())
    c.shutdown(socket.SHUT_WR)
    data = c.recv(4096).decode()
    if data:
        print(data)
"""


def write(folder: Path) -> Path:
    """The stand-in as an executable ``nvidia-cuda-mps-control`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvidia-cuda-mps-control"
    path.write_text(f"#!{sys.executable}\n{SOURCE}")
    path.chmod(0o755)
    return path
