"""A Docker engine's API on a unix socket, served by a thread: the part of Engine API v1.41 that
gpuprov.facts.docker_api speaks (ping, info, images, create/start/wait/logs/kill/delete). The
client under test talks real HTTP over a real socket; only the engine behind it is made up."""

from __future__ import annotations

import json
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from gpuprov.facts.docker_api import reachable_unix_path


class FakeDockerd:
    def __init__(
        self,
        socket_path: Path,
        *,
        version: str = "28.2.2",
        runtimes: tuple[str, ...] = ("runc", "nvidia"),
        cdi_dirs: list[str] | None = None,
        images: list[tuple[str, int]] | None = None,
        output: str = "",
        exit_code: int = 0,
        start_error: str | None = None,
        bench_output: str | None = None,
    ) -> None:
        self.version, self.runtimes, self.cdi_dirs = version, runtimes, cdi_dirs
        self.images = images if images is not None else [("nvidia/cuda:12.4.1-base-ubuntu22.04", 250)]
        self.output, self.exit_code, self.start_error = output, exit_code, start_error
        self.bench_output = bench_output
        self.created: list[dict[str, Any]] = []
        self.removed = 0
        self.socket_path = str(socket_path)
        self._containers: dict[str, dict[str, Any]] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: Any, kind: str = "application/json") -> None:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if data:
                    self.wfile.write(data)

            def do_GET(self) -> None:
                fake.route(self, "GET")

            def do_POST(self) -> None:
                fake.route(self, "POST")

            def do_DELETE(self) -> None:
                fake.route(self, "DELETE")

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        with reachable_unix_path(self.socket_path) as bindable:  # a deep tmp_path is too long for bind()
            self._server = Server(bindable, Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def route(self, h: Any, method: str) -> None:
        path = urlparse(h.path).path.removeprefix("/v1.41")
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        if path == "/_ping":
            return h._answer(200, b"OK", "text/plain")
        if path == "/info":
            info: dict[str, Any] = {
                "ServerVersion": self.version,
                "Runtimes": {r: {} for r in self.runtimes},
                "DefaultRuntime": "runc",
                "LiveRestoreEnabled": False,
                "ContainersRunning": 0,
            }
            if self.cdi_dirs is not None:
                info["CDISpecDirs"] = self.cdi_dirs
            return h._answer(200, info)
        if path == "/images/json":
            return h._answer(200, [{"RepoTags": [n], "Size": s} for n, s in self.images])
        if path.startswith("/images/") and path.endswith("/json"):
            name = unquote(path[len("/images/") : -len("/json")])
            if name in [n for n, _ in self.images]:
                return h._answer(200, {"RepoTags": [name]})
            return h._answer(404, {"message": f"No such image: {name}"})
        if path == "/containers/create":
            if body["HostConfig"].get("Runtime") not in (None, *self.runtimes):
                return h._answer(400, {"message": f"unknown or invalid runtime name: {body['HostConfig']['Runtime']}"})
            cid = f"c{len(self.created):063d}"
            self.created.append(body)
            self._containers[cid] = body
            return h._answer(201, {"Id": cid, "Warnings": []})
        parts = path.split("/")
        if len(parts) >= 3 and parts[1] == "containers" and parts[2] in self._containers:
            cid, verb = parts[2], (parts[3] if len(parts) > 3 else "")
            if method == "DELETE":
                self.removed += 1
                del self._containers[cid]
                return h._answer(204, b"", "text/plain")
            if verb == "start":
                if self.start_error:
                    return h._answer(500, {"message": self.start_error})
                return h._answer(204, b"", "text/plain")
            if verb == "wait":
                return h._answer(200, {"StatusCode": self.exit_code})
            if verb == "logs":
                argv = self._containers[cid]["Cmd"]
                text = self.bench_output if argv[0] == "python3" and self.bench_output is not None else self.output
                data = text.encode()
                frame = b"\x01\0\0\0" + len(data).to_bytes(4, "big") + data  # stdout, multiplexed
                return h._answer(200, frame, "application/vnd.docker.multiplexed-stream")
            if verb == "kill":
                return h._answer(204, b"", "text/plain")
        return h._answer(404, {"message": f"page not found: {method} {path}"})
