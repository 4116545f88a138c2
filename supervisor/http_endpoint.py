"""/healthz and /metrics over HTTP (`--http [ADDR:]PORT`, loopback unless the user names
another address), for load balancers, Kubernetes probes and Prometheus.

Served from the newest Vitals the reconcile loop published (herder.supervisor.metrics):
a request never touches the fleet or waits for the loop. A hostile or slow client cannot
hurt the master: at most MAX_CONNECTIONS are served at once (more are closed at once and
counted), each may be silent for IO_TIMEOUT seconds and lasts REQUEST_DEADLINE at most
(a slow-loris is cut off), one request per connection, request lines capped by
http.server (414), and nothing a client sends reaches the log above DEBUG.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from herder.common.config import http_address
from herder.supervisor.metrics import (
    PUBLISH_EVERY,
    Vitals,
    VitalsCollector,
    exposition,
    registry_for,
    vitals_of,
)
from herder.supervisor.snapshot import FleetView

log = logging.getLogger("herder")

MAX_CONNECTIONS = 16
IO_TIMEOUT = 2.0  # seconds a client may be silent mid-request
REQUEST_DEADLINE = 5.0  # seconds a connection may last, however it trickles
RETRY_BIND = 2.0  # seconds between tries to bind the port while it is taken (a bind costs nothing)


class Publisher:
    """The loop's side: starts the endpoint (again every RETRY_BIND seconds while the port is
    taken, say by a master still draining) and hands it new Vitals every PUBLISH_EVERY."""

    def __init__(self, address: str, clock: Callable[[], float], collectors: tuple[Any, ...] = ()) -> None:
        self.address = address
        self.endpoint = HttpEndpoint(http_address(address), clock)
        for collector in collectors:  # served beside the Vitals (the job metrics)
            self.endpoint.registry.register(collector)
        self._bind_at = 0.0
        self._published_at = float("-inf")

    def step(self, now: float, view: Callable[[], FleetView]) -> None:
        if not self.endpoint.serving:
            if now < self._bind_at:
                return
            try:
                self.endpoint.start()
            except OSError as exc:
                level = logging.ERROR if self._bind_at == 0.0 else logging.DEBUG  # said once
                self._bind_at = now + RETRY_BIND
                log.log(level, "cannot serve http on %s (%s); trying again every %g s", self.address, exc,
                        RETRY_BIND)  # fmt: skip
                return
        if now - self._published_at >= PUBLISH_EVERY:
            self._published_at = now
            self.endpoint.publish(vitals_of(view()))

    def close(self) -> None:
        self.endpoint.close()


class HttpEndpoint:
    def __init__(self, address: tuple[str, int], clock: Callable[[], float]) -> None:
        self.address = address
        self.clock = clock
        self.vitals: Vitals | None = None  # replaced whole by the loop; read by request threads
        self.registry = registry_for(VitalsCollector(lambda: self.vitals, clock))
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.refused = 0  # connections closed unserved: MAX_CONNECTIONS were busy
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2] if self._server else self.address
        return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"

    def publish(self, vitals: Vitals) -> None:
        self.vitals = vitals

    def start(self) -> None:
        """Bind and serve on a thread of its own; OSError (the port is taken) to the caller."""
        self._server = _Server(self.address, _Handler, self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5}, name="http", daemon=True
        )
        self._thread.start()
        log.info("health and metrics on %s/healthz and %s/metrics", self.url, self.url)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- the answers --------------------------------------------------------------------

    def healthz(self) -> tuple[int, dict[str, Any]]:
        v = self.vitals
        if v is None:
            return 503, {"status": "degraded", "reasons": ["starting: the master has not published yet"]}
        problems = v.problems(self.clock())
        body: dict[str, Any] = {
            "status": "degraded" if problems else "ok",
            "reasons": [text for _, text in problems],
            "workers": {"ready": v.ready, "desired": v.desired},
        }
        if v.memory_pressure:  # said, not a problem: scale-up waits, the pod keeps its work
            body["memory_pressure"] = f"{v.memory_pressure}; no scale-up"
        return (503 if problems else 200), body

    def metrics(self) -> bytes:
        return exposition(self.registry)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], handler: type, endpoint: HttpEndpoint) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.endpoint = endpoint
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.endpoint.slots.acquire(blocking=False):
            self.endpoint.refused += 1
            if self.endpoint.refused in (1, 100, 10000):  # said once, then seldom
                log.warning("http: %d connections refused so far: %d busy already", self.endpoint.refused,
                            MAX_CONNECTIONS)  # fmt: skip
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:
            self.endpoint.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.endpoint.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("http: error serving %s", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = IO_TIMEOUT
    protocol_version = "HTTP/1.0"  # one request per connection: keep-alive cannot hold a slot

    def version_string(self) -> str:
        return "herder"

    def setup(self) -> None:
        super().setup()
        self._deadline = threading.Timer(REQUEST_DEADLINE, self._cut)
        self._deadline.daemon = True
        self._deadline.start()

    def _cut(self) -> None:
        try:
            self.request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        endpoint = self.server.endpoint
        path = urlsplit(self.path).path
        if path == "/healthz":
            code, body = endpoint.healthz()
            self._send(code, "application/json", json.dumps(body).encode() + b"\n")
        elif path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, endpoint.metrics())
        else:
            self._send(404, "text/plain; charset=utf-8", b"herder serves /healthz and /metrics\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        log.debug("http: %s %s", self.address_string(), format % args)
