"""The Docker Engine API over its unix socket, with the standard library only.

The container checks and the guest toolkit module ask a live engine what it runs (its version,
runtimes, CDI support, running containers, live-restore) and start one GPU container. The
``docker`` Python package is not needed: the modules carry this file to the guest as they carry
the rest of gpuprov (docs/guides/guests-and-containers.md). Every answer is bounded in size and
time; what the engine says is data, never run.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SOCKETS = ("var/run/docker.sock", "run/docker.sock")  # root-relative
API = "/v1.41"  # Docker 20.10's API: every engine since answers it
MAX_ANSWER = 8 << 20  # bytes read from one answer
MAX_LOG = 1 << 20  # bytes of a container's output kept


class EngineError(RuntimeError):
    """The engine did not answer, or answered with an error (its message)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


MAX_SUN_PATH = 107  # sockaddr_un's sun_path is 108 bytes with its NUL (unix(7))


@contextlib.contextmanager
def reachable_unix_path(path: str) -> Iterator[str]:
    """``path``, or one that reaches the same socket when ``path`` is too long for sockaddr_un.

    A long root (a guest staged under a deep folder) would make ``connect`` fail with "AF_UNIX path
    too long": the socket's folder is opened instead and named through /proc/self/fd, which the
    kernel resolves to it. The path is good while the context is open.
    """
    if len(os.fsencode(path)) <= MAX_SUN_PATH:
        yield path
        return
    folder, name = os.path.split(path)
    fd = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            with reachable_unix_path(self._path) as path:
                sock.connect(path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass
class DockerEngine:
    """A Docker engine on a unix socket (absolute path)."""

    socket_path: str
    timeout: float = 30.0

    def call(self, method: str, path: str, body: Any = None, *, timeout: float | None = None) -> Any:
        """One request; the decoded JSON answer (or the raw bytes when it is not JSON). ``timeout`` bounds
        the whole exchange, not each read: an engine that answers a byte at a time is cut off at it."""
        limit = timeout or self.timeout
        conn = _UnixConnection(self.socket_path, limit)
        expired = threading.Event()

        def cut_off() -> None:  # from the timer's thread: a read blocked on the socket ends at once
            expired.set()
            with contextlib.suppress(OSError, AttributeError):
                conn.sock.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(limit, cut_off)
        timer.daemon = True
        timer.start()
        try:
            headers = {"Host": "docker"}
            data = None
            if body is not None:
                data = json.dumps(body).encode()
                headers["Content-Type"] = "application/json"
            conn.request(method, API + path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read(MAX_ANSWER + 1)
            status = response.status
        except (OSError, http.client.HTTPException) as exc:
            if expired.is_set():
                raise EngineError(f"the Docker engine did not answer {method} {path} within {limit:g} s") from exc
            raise EngineError(f"no answer from the Docker engine at {self.socket_path} ({exc})") from exc
        finally:
            timer.cancel()
            conn.close()
        if expired.is_set():
            raise EngineError(f"the Docker engine did not answer {method} {path} within {limit:g} s")
        if len(raw) > MAX_ANSWER:
            raise EngineError(f"the Docker engine's answer to {method} {path} is over {MAX_ANSWER} bytes")
        kind = response.getheader("Content-Type") or ""
        answer: Any = raw
        if "json" in kind and raw:
            try:
                answer = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise EngineError(f"the Docker engine's answer to {method} {path} is not JSON ({exc})") from exc
        if status >= 400:
            said = answer.get("message") if isinstance(answer, dict) else raw[:500].decode("utf-8", "replace")
            raise EngineError(str(said or f"HTTP {status}").strip(), status)
        return answer

    def ping(self) -> bool:
        try:
            return self.call("GET", "/_ping", timeout=5) in (b"OK", "OK")
        except EngineError:
            return False


def find_engine(root: str = "/") -> DockerEngine | None:
    """The engine's socket under a live root (a socket file, not a regular one); None when there is none."""
    import os
    import stat

    for rel in SOCKETS:
        path = os.path.join(root, rel)
        try:
            if stat.S_ISSOCK(os.stat(path).st_mode):
                return DockerEngine(path)
        except OSError:
            continue
    return None


@dataclass
class EngineInfo:
    """What ``GET /info`` says, reduced to what gpuprov uses."""

    version: str | None
    runtimes: list[str]
    default_runtime: str | None
    cdi_spec_dirs: list[str] | None  # Docker >= 25 with CDI on lists them; None: no native CDI
    live_restore: bool
    running: int  # containers running now

    @property
    def major(self) -> int | None:
        head = (self.version or "").split(".", 1)[0]
        return int(head) if head.isdigit() else None


def engine_info(engine: DockerEngine) -> EngineInfo:
    info = engine.call("GET", "/info")
    if not isinstance(info, dict):
        raise EngineError("the Docker engine's /info is not a JSON object")
    runtimes = info.get("Runtimes")
    dirs = info.get("CDISpecDirs")
    return EngineInfo(
        version=info.get("ServerVersion") if isinstance(info.get("ServerVersion"), str) else None,
        runtimes=sorted(k for k in runtimes if isinstance(k, str)) if isinstance(runtimes, dict) else [],
        default_runtime=info.get("DefaultRuntime") if isinstance(info.get("DefaultRuntime"), str) else None,
        cdi_spec_dirs=[d for d in dirs if isinstance(d, str)] if isinstance(dirs, list) and dirs else None,
        live_restore=info.get("LiveRestoreEnabled") is True,
        running=info.get("ContainersRunning") if isinstance(info.get("ContainersRunning"), int) else 0,
    )


@dataclass
class Finished:
    """A container that ran to its end (or was stopped at the time limit)."""

    exit_code: int | None
    output: str
    timed_out: bool = False


@dataclass
class ContainerSpec:
    image: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    runtime: str | None = None  # "nvidia": the NVIDIA runtime (CDI mode injects the GPUs named in env)
    cdi_devices: list[str] = field(default_factory=list)  # native CDI (Docker >= 25): nvidia.com/gpu=all
    legacy_gpus: bool = False  # --gpus all (the legacy hook's DeviceRequest)
    binds: list[str] = field(default_factory=list)  # "host:container:ro"
    shm_mb: int = 0

    def body(self) -> dict[str, Any]:
        host: dict[str, Any] = {"NetworkMode": "none", "Binds": self.binds, "AutoRemove": False}
        if self.runtime:
            host["Runtime"] = self.runtime
        requests = []
        if self.cdi_devices:
            requests.append({"Driver": "cdi", "DeviceIDs": self.cdi_devices})
        if self.legacy_gpus:
            requests.append({"Driver": "", "Count": -1, "Capabilities": [["gpu"]]})
        if requests:
            host["DeviceRequests"] = requests
        if self.shm_mb:
            host["ShmSize"] = self.shm_mb << 20
        return {
            "Image": self.image,
            "Cmd": self.argv,
            "Env": [f"{k}={v}" for k, v in sorted(self.env.items())],
            "NetworkDisabled": True,
            "HostConfig": host,
        }


def image_present(engine: DockerEngine, image: str) -> bool:
    try:
        engine.call("GET", f"/images/{urllib.parse.quote(image, safe='')}/json")
    except EngineError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def local_images(engine: DockerEngine) -> list[tuple[int, str]]:
    """(size, first tag) of every tagged local image."""
    out = []
    for img in engine.call("GET", "/images/json") or []:
        if not isinstance(img, dict):
            continue
        tags = [t for t in img.get("RepoTags") or [] if isinstance(t, str) and not t.endswith(":<none>")]
        if tags:
            size = img.get("Size") if isinstance(img.get("Size"), int) else 0
            out.append((size, sorted(tags)[0]))
    return out


def _demux(raw: bytes) -> str:
    """The container's output from the engine's multiplexed log stream (8-byte frame headers)."""
    out, i = bytearray(), 0
    while i + 8 <= len(raw) and raw[i] in (0, 1, 2) and raw[i + 1 : i + 4] == b"\0\0\0":
        size = int.from_bytes(raw[i + 4 : i + 8], "big")
        out += raw[i + 8 : i + 8 + size]
        i += 8 + size
    if i == 0:  # a TTY container's log has no frames
        out = bytearray(raw)
    return bytes(out[:MAX_LOG]).decode("utf-8", "replace")


def run_container(engine: DockerEngine, spec: ContainerSpec, *, timeout: float = 120) -> Finished:
    """Create, start and wait for one container; always removed afterwards. Raises EngineError when
    the engine refuses it (no such runtime, no device driver, an image it cannot start)."""
    created = engine.call("POST", "/containers/create", spec.body())
    cid = created.get("Id") if isinstance(created, dict) else None
    if not isinstance(cid, str) or not cid.isalnum():
        raise EngineError("the Docker engine created a container but gave no id")
    try:
        engine.call("POST", f"/containers/{cid}/start")
        timed_out = False
        try:
            waited = engine.call("POST", f"/containers/{cid}/wait", timeout=timeout)
            code = waited.get("StatusCode") if isinstance(waited, dict) else None
        except EngineError:
            timed_out, code = True, None
            engine.call("POST", f"/containers/{cid}/kill")
        logs = engine.call("GET", f"/containers/{cid}/logs?stdout=1&stderr=1")
        output = _demux(logs if isinstance(logs, bytes) else json.dumps(logs).encode())
        return Finished(code if isinstance(code, int) else None, output, timed_out)
    finally:
        try:
            engine.call("DELETE", f"/containers/{cid}?force=1")
        except EngineError:
            pass
