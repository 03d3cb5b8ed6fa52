"""The extender's HTTP server: the kube-scheduler's extender API (POST /filter, /prioritize,
/bind with its JSON), and the probes: GET /healthz (the process answers) and GET /readyz (200
only on the leader, with its state read from the API server, so a Service sends the scheduler's
calls there only)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson  # the scheduler's every call carries every node's name: a third of a pod's cost in json

from sharegpu.kube.extender.core import Extender
from sharegpu.kube.extender.wire import for_scheduler


class _Handler(BaseHTTPRequestHandler):
    extender: Extender  # set on the subclass serve() makes
    preempt: bool = False
    # The scheduler keeps its connection open (a handshake per verb would cost more than the
    # decision), and each reply leaves in one write (buffered, flushed after each request): a
    # reply written as headers then body waits on the client's delayed ACK (Nagle's algorithm).
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = -1

    def do_POST(self) -> None:
        verbs: dict[str, Callable[[Mapping[str, Any]], Any]] = {
            "/filter": self.extender.filter,
            "/prioritize": self.extender.prioritize,
            "/bind": self.extender.bind,
        }
        if self.preempt:
            verbs["/preempt"] = self.extender.preempt
        verb = verbs.get(self.path.rstrip("/") or "/")
        if verb is None:
            served = ", ".join(verbs)
            self._reply(404, {"Error": f"no extender verb {self.path}: this extender serves {served}"})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            args = orjson.loads(self.rfile.read(length) or b"{}")
            if not isinstance(args, dict):
                raise ValueError("the body is not a JSON object")
        except ValueError as err:  # orjson.JSONDecodeError is one
            self._reply(400, {"Error": f"malformed extender request: {err}"})
            return
        self._reply(200, for_scheduler(verb(args)))

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        if path == "/healthz":
            self._reply(200, {"ok": True})
        elif path == "/readyz":
            ext = self.extender
            ready = ext.is_leader and ext.synced
            why = "" if ready else ("not the leader" if not ext.is_leader else "reading the API server")
            self._reply(200 if ready else 503, {"ready": ready, "why": why})
        else:
            self._reply(404, {"Error": f"no endpoint {self.path}: GET /healthz or /readyz"})

    def _reply(self, status: int, body: object) -> None:
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scheduling cycle would drown the log


class ExtenderServer(ThreadingHTTPServer):
    """A thread per connection, and every one of them ended by server_close: the scheduler keeps
    its connections open, so their threads wait in recv for its next call. Left waiting while
    the interpreter finalized, such a thread (or any other still in C code) aborted the
    extender when it woke (SIGABRT at a SIGTERM, on the real node:
    tests/e2e/test_kube_real_sharegpu.py); now the connections are shut and the threads joined."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Stop listening, end every open connection (a call in progress loses its reply; the
        scheduler retries), and join their threads."""
        with self._open_lock:
            connections = list(self._open)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        super().server_close()


def serve(
    extender: Extender, host: str = "0.0.0.0", port: int = 8998, *, preempt: bool = False
) -> ExtenderServer:
    """An HTTP server of the extender API (not started: call serve_forever); `preempt` adds the
    preempt verb (the scheduler's configuration must name it too: preemptVerb)."""
    handler = type("Handler", (_Handler,), {"extender": extender, "preempt": preempt})
    return ExtenderServer((host, port), handler)
