"""/healthz, /metrics and the dashboard over HTTP (`--http [ADDR:]PORT`, loopback unless the
user names another address), for load balancers, Kubernetes probes, Prometheus and people.

Served from the newest HostSnapshot the reconcile loop published (herder.supervisor.views:
every answer is a renderer of it), with the history and events rings (views/history.py,
views/journal.py): a request never touches the fleet or waits for the loop; a control
command (POST /api/command) is queued to the loop like the control socket's.
A hostile or slow client cannot hurt the master: at most MAX_CONNECTIONS are served at
once (more are closed at once and counted), each may be silent for IO_TIMEOUT seconds and
lasts REQUEST_DEADLINE at most (a slow-loris is cut off), one request per connection,
request lines capped by http.server (414), bodies by MAX_BODY, and nothing a client sends
reaches the log above DEBUG.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from herder.common.config import http_address
from herder.supervisor.control.http_auth import Controls, cookie, is_loopback
from herder.supervisor.views import api, static
from herder.supervisor.views.healthz import healthz
from herder.supervisor.views.history import History
from herder.supervisor.views.journal import Journal
from herder.supervisor.views.model import HostSnapshot
from herder.supervisor.views.prometheus import SnapshotCollector, exposition, registry_for

log = logging.getLogger("herder")

MAX_CONNECTIONS = 16
IO_TIMEOUT = 2.0  # seconds a client may be silent mid-request
REQUEST_DEADLINE = 5.0  # seconds a connection may last, however it trickles
RETRY_BIND = 2.0  # seconds between tries to bind the port while it is taken (a bind costs nothing)
MAX_BODY = 4096  # bytes a POST may carry
SECURITY_HEADERS = (
    (
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
)
JSON = "application/json"
READ_ONLY = "read-only: no token configured"
COMMANDS = ("scale", "pause", "resume", "restart", "stop_worker")
# path -> the methods it takes (any other path: 404; another method: 405)
ROUTES = {
    "/healthz": ("GET",),
    "/metrics": ("GET",),
    "/": ("GET",),
    "/api/snapshot": ("GET",),
    "/api/history": ("GET",),
    "/api/hosts": ("GET",),
    "/api/login": ("POST",),
    "/api/command": ("POST",),
}


@dataclass
class Feeds:
    """What the endpoint serves beside the snapshot: the master's events (`journal`), the host
    records the load reader last read (`hosts`), who may send commands (`controls`) and how
    one reaches the loop (`submit`, which returns the loop's reply)."""

    journal: Journal | None = None
    wall: Callable[[], float] = time.time
    hosts: Callable[[], tuple[float, list[dict[str, Any]]]] = lambda: (0.0, [])
    controls: Controls | None = None
    submit: Callable[[dict], dict] | None = None
    # `herder upgrade`: the version, and the hand-over under way (handoff.view), beside the snapshot.
    upgrade: Callable[[], dict[str, Any]] = lambda: {}


class Publisher:
    """The loop's side: starts the endpoint (again every RETRY_BIND seconds while the port is
    taken, say by a master still draining) and hands it each snapshot the loop publishes."""

    def __init__(
        self,
        address: str,
        clock: Callable[[], float],
        collectors: tuple[Any, ...] = (),
        feeds: Feeds | None = None,
    ) -> None:
        self.address = address
        self.endpoint = HttpEndpoint(http_address(address), clock, feeds or Feeds())
        self.journal, self.controls = self.endpoint.journal, self.endpoint.controls
        host = self.endpoint.address[0]
        if not is_loopback(host) and not self.controls.enabled:
            log.warning(
                "http: serving on %s, which is not loopback, and no token is configured: anyone "
                "who reaches it reads this host's workers, jobs and queues (the controls stay "
                "off); bind 127.0.0.1 or put it behind a proxy that authenticates",
                address,
            )
        elif not is_loopback(host):
            log.warning(
                "http: serving on %s, which is not loopback: the dashboard's controls are behind "
                "the token, but plain HTTP carries it in clear; put TLS in front",
                address,
            )
        for collector in collectors:  # served beside the snapshot's series (the job metrics)
            self.endpoint.registry.register(collector)
        self._bind_at = 0.0
        # `herder upgrade`: the listening socket master A handed over, served once `held` is
        # lifted (B's first workers ready): the port never refuses a connection meanwhile.
        self.inherited: socket.socket | None = None
        self.held = False

    def step(self, now: float) -> None:
        """Each pass of the loop: serve, once the port is free."""
        if not self.endpoint.serving and not self.held:
            if now < self._bind_at:
                return
            try:
                self.endpoint.start(self.inherited)
            except OSError as exc:
                level = logging.ERROR if self._bind_at == 0.0 else logging.DEBUG  # said once
                self._bind_at = now + RETRY_BIND
                log.log(level, "cannot serve http on %s (%s); trying again every %g s", self.address, exc,
                        RETRY_BIND)  # fmt: skip
                return

    def publish(self, snap: HostSnapshot) -> None:
        """A new snapshot for every answer, and a sample for the history."""
        self.endpoint.history.append(snap)
        self.endpoint.publish(snap)

    @property
    def snapshot(self) -> HostSnapshot | None:
        return self.endpoint.snapshot

    def close(self) -> None:
        self.endpoint.close()


class HttpEndpoint:
    def __init__(
        self,
        address: tuple[str, int],
        clock: Callable[[], float],
        feeds: Feeds,
    ) -> None:
        self.address = address
        self.controls = feeds.controls or Controls("")
        self.submit = feeds.submit
        self.clock, self.wall = clock, feeds.wall
        self.snapshot: HostSnapshot | None = None  # replaced whole by the loop; read by request threads
        self._snapshot_body: tuple[HostSnapshot | None, bytes] = (None, b"")  # encoded once, on demand
        self.history = History()
        self.journal = feeds.journal or Journal(feeds.wall)
        self.hosts, self.upgrade = feeds.hosts, feeds.upgrade
        self.registry = registry_for(SnapshotCollector(lambda: self.snapshot, clock))
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

    def publish(self, snapshot: HostSnapshot) -> None:
        self.snapshot = snapshot

    def listener(self) -> socket.socket | None:
        return self._server.socket if self._server is not None else None

    def start(self, inherited: socket.socket | None = None) -> None:
        """Bind (or serve on the socket `inherited` from the master before: `herder upgrade`) and
        serve on a thread of its own; OSError (the port is taken) to the caller."""
        self._server = _Server(self.address, _Handler, self, inherited)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5}, name="http", daemon=True
        )
        self._thread.start()
        log.info("health and metrics on %s/healthz and %s/metrics, the dashboard on %s/", self.url, self.url,
                 self.url)  # fmt: skip

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- the answers --------------------------------------------------------------------

    def healthz(self) -> tuple[int, dict[str, Any]]:
        return healthz(self.snapshot, self.clock())

    def metrics(self) -> bytes:
        return exposition(self.registry)

    def snapshot_body(self) -> tuple[int, bytes]:
        snap = self.snapshot
        if snap is None:
            return 503, api.encode({"error": "starting: the master has not published yet"})
        cached, body = self._snapshot_body
        if cached is not snap:  # one encoding per published snapshot, however many pages poll
            body = api.encode(api.snapshot_json(snap) | self.upgrade())
            self._snapshot_body = (snap, body)
        return 200, body

    def history_body(self, query: str) -> tuple[int, bytes]:
        values = parse_qs(query).get("since")
        since = None
        if values:
            try:
                since = float(values[0])
            except ValueError:
                return 400, api.encode({"error": "since must be a number (Unix seconds)"})
            if not math.isfinite(since):
                return 400, api.encode({"error": "since must be a finite number"})
        return 200, api.encode(api.history_json(self.history, self.journal, self.wall(), since))

    def hosts_body(self) -> tuple[int, bytes]:
        return 200, api.encode(api.hosts_json(self.snapshot, self.hosts(), self.wall()))

    def login(self, body: object) -> tuple[int, dict[str, Any], str | None]:
        """(code, answer, the session cookie to set or None)."""
        if not self.controls.enabled:
            return 403, {"error": READ_ONLY}, None
        token = body.get("token") if isinstance(body, dict) else None
        found = self.controls.login(token)
        if found is None:
            log.warning("http: a login with a wrong token was refused")
            return 403, {"error": "wrong token"}, None
        session, csrf = found
        return 200, {"csrf": csrf}, cookie(session)

    def command(self, body: object) -> tuple[int, dict[str, Any]]:
        """A control command, checked, then answered by the loop as the control socket's is."""
        request = command_of(body)
        if isinstance(request, str):
            return 400, {"error": request}
        if self.submit is None:
            return 403, {"error": READ_ONLY}
        log.info("http: dashboard command %s", request)
        return 200, self.submit(request)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self, address: tuple[str, int], handler: type, endpoint: HttpEndpoint, inherited: socket.socket | None
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.endpoint = endpoint
        super().__init__(address, handler, bind_and_activate=inherited is None)
        if inherited is not None:
            self.socket.close()
            self.socket = inherited
            self.server_address = inherited.getsockname()
        # Non-blocking: during a hand-over two masters accept on it, and a connection the other
        # took first must not block this one's accept (socketserver skips the OSError).
        self.socket.setblocking(False)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        conn.setblocking(True)
        return conn, addr

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

    def __getattr__(self, name: str) -> Callable[[], None]:
        """http.server calls do_<METHOD> for a request: every method goes to _route (an unknown
        one is answered there, 405), never to http.server's bare 501 page."""
        if name.startswith("do_") and name[3:].isupper():
            return lambda: self._route(name[3:])
        raise AttributeError(name)

    def _route(self, method: str) -> None:
        try:
            self._answer(method)
        except Exception:  # never a 500 with a trace: logged (DEBUG: a client's doing), answered 400
            log.debug("http: %s %s failed", method, self.path, exc_info=True)
            self._json(400, {"error": "bad request"})

    def _answer(self, method: str) -> None:
        endpoint = self.server.endpoint
        url = urlsplit(self.path)
        path = url.path
        static_name = path.removeprefix("/static/") if path.startswith("/static/") else None
        allowed = ("GET",) if static_name is not None else ROUTES.get(path)
        if allowed is None:
            self._json(404, {"error": "not found"})
            return
        if method not in allowed:
            route = "/static/*" if static_name is not None else path  # a known route, not the client's bytes
            methods = ", ".join(allowed)
            self._json(405, {"error": f"{route} takes {methods}"}, (("Allow", methods),))
            return
        if static_name is not None:
            found = static.read(static_name) if "/" not in static_name else None
            if found is None:
                self._json(404, {"error": "not found"})
            else:
                self._send(200, found[1], found[0])
        elif path == "/":
            code, body, content_type = static.page()
            self._send(code, content_type, body)
        elif path == "/healthz":
            code, health = endpoint.healthz()
            self._send(code, JSON, json.dumps(health).encode() + b"\n")
        elif path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, endpoint.metrics())
        elif path == "/api/snapshot":
            self._send(*_json_answer(endpoint.snapshot_body()))
        elif path == "/api/history":
            self._send(*_json_answer(endpoint.history_body(url.query)))
        elif path == "/api/hosts":
            self._send(*_json_answer(endpoint.hosts_body()))
        elif path == "/api/login":
            body = self._body()
            if body is not _BAD:
                code, answer, session = endpoint.login(body)
                self._json(code, answer, (("Set-Cookie", session),) if session else ())
        elif path == "/api/command":
            if not endpoint.controls.enabled:
                self._json(403, {"error": READ_ONLY})
            elif not endpoint.controls.allowed(self.headers.get("Cookie"), self.headers.get("X-CSRF-Token")):
                self._json(403, {"error": "log in first (POST /api/login), and send its X-CSRF-Token"})
            else:
                body = self._body()
                if body is not _BAD:
                    self._json(*endpoint.command(body))

    def _body(self) -> object:
        """The request's JSON body, or _BAD once a 400 has been answered (none, too big, not JSON)."""
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._json(400, {"error": f"a JSON body of at most {MAX_BODY} bytes, with its Content-Length"})
            return _BAD
        try:
            return json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError):
            self._json(400, {"error": "the body is not JSON"})
            return _BAD

    def _json(self, code: int, body: dict[str, Any], extra: tuple[tuple[str, str], ...] = ()) -> None:
        self._send(code, JSON, api.encode(body), extra)

    def _send(
        self, code: int, content_type: str, body: bytes, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in SECURITY_HEADERS + extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        log.debug("http: %s %s", self.address_string(), format % args)


def _json_answer(answer: tuple[int, bytes]) -> tuple[int, str, bytes]:
    return answer[0], JSON, answer[1]


_BAD = object()  # a body already answered with 400


def command_of(body: object) -> dict[str, Any] | str:
    """The control command a dashboard's body asks for, with only its own fields; or why not."""
    if not isinstance(body, dict) or body.get("cmd") not in COMMANDS:
        return f"a JSON object whose cmd is one of {', '.join(COMMANDS)}"
    cmd = body["cmd"]
    if cmd == "stop_worker":
        pid = body.get("pid")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            return "stop_worker needs pid (a positive integer)"
        return {"cmd": cmd, "pid": pid}
    pool = body.get("pool")
    if not isinstance(pool, str) or not pool or len(pool) > 200:
        return f"{cmd} needs pool (a pool's name)"
    if cmd != "scale":
        return {"cmd": cmd, "pool": pool}
    workers = body.get("workers")
    if not isinstance(workers, int) or isinstance(workers, bool) or not 0 < workers <= 100_000:
        return "scale needs workers (a positive integer)"
    return {"cmd": cmd, "pool": pool, "workers": workers}
