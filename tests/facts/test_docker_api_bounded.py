"""The Docker Engine API client's time bound is the whole exchange's, not each read's (issue 49): an
engine that answers one byte every 0.2 s once held the client forever."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from gpuprov.facts.docker_api import DockerEngine, EngineError

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4000\r\n\r\n" + b" " * 3998 + b"{}"


def _trickle(path: Path, stop: threading.Event) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(5)
    try:
        conn, _addr = server.accept()
        conn.recv(65536)
        for byte in ANSWER:
            if stop.is_set():
                break
            conn.sendall(bytes([byte]))
            time.sleep(0.2)
        conn.close()
    except OSError:
        pass
    finally:
        server.close()


def test_an_engine_that_trickles_its_answer_is_cut_off_at_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "docker.sock"
    stop = threading.Event()
    server = threading.Thread(target=_trickle, args=(path, stop), daemon=True)
    server.start()
    while not path.exists():
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(EngineError, match=r"did not answer GET /info within 1 s"):
        DockerEngine(str(path)).call("GET", "/info", timeout=1)
    assert time.monotonic() - started < 3
    stop.set()
    server.join(5)
