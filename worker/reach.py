"""Reaching Redis before a worker starts: each attempt bounded, and what the worker waits for
said on its channel (`wait`, docs/protocol.md).

redis-py bounds a connect and a reply by its socket timeouts, but not the name resolution
before them: getaddrinfo blocks in C for as long as the resolver takes (a DNS server that
does not answer: minutes). So the name is resolved first on a helper thread, waited for at
most RESOLVE_TIMEOUT, and a resolution that has not answered is said as such and tried again
(joining the same helper: one blocked thread a name, never one an attempt). What the worker
says never holds the password: only the host, port or socket path, and redis-py's error text
with the password taken out if it were in it.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis import Redis

    from herder.worker.channel import Channel

RESOLVE_TIMEOUT = 5.0  # seconds a name resolution may take before the worker says so and retries


class NotResolved(OSError):
    """The Redis host's name did not resolve (in time, or at all)."""


@dataclass(frozen=True)
class Target:
    """Where a client connects, as a person reads it (never its password)."""

    where: str  # "Redis at redis.example:6379", "Redis at /run/redis.sock"
    host: str | None = None  # a name to resolve first (not an address, not a Unix socket)
    port: int = 6379
    password: str | None = None  # to take out of any error text, never to show

    @classmethod
    def of(cls, client: Redis) -> Target:
        kwargs: dict[str, Any] = client.connection_pool.connection_kwargs
        password = kwargs.get("password")
        if kwargs.get("path"):
            return cls(f"Redis at {kwargs['path']}", password=password)
        host, port = kwargs.get("host"), int(kwargs.get("port") or 6379)
        if not host:  # through Sentinel: the master's address is Sentinel's to say
            name = getattr(client.connection_pool, "service_name", "")
            return cls(f"Redis master {name} through Sentinel".replace("  ", " "), password=password)
        return cls(f"Redis at {host}:{port}", None if _is_address(host) else host, port, password)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class Resolver:
    """Name resolutions on helper threads, each waited for a bounded time. One that has not
    answered stays under way: the next attempt waits for the same one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], tuple[threading.Event, list[Any]]] = {}

    def resolve(self, host: str, port: int, timeout: float) -> None:
        """Return once `host` resolves; NotResolved when it fails or takes longer than `timeout`."""
        key = (host, port)
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = (threading.Event(), [])
                threading.Thread(
                    target=self._run, args=(key, *pending), name="herder-resolve", daemon=True
                ).start()
        done, outcome = pending
        if not done.wait(timeout):
            raise NotResolved(f"name resolution of {host} timed out after {timeout:g} s")
        with self._lock:
            if self._pending.get(key) is pending:
                del self._pending[key]  # the next attempt asks the resolver afresh
        if isinstance(outcome[0], OSError):
            raise NotResolved(f"name resolution of {host} failed ({_strerror(outcome[0])})")

    @staticmethod
    def _run(key: tuple[str, int], done: threading.Event, outcome: list[Any]) -> None:
        try:
            outcome.append(socket.getaddrinfo(key[0], key[1], type=socket.SOCK_STREAM))
        except OSError as exc:
            outcome.append(exc)
        done.set()


resolver = Resolver()  # the process's: a spare's unanswered resolution is its worker's to wait for


def _strerror(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


_REDIS_PY_PREFIX = re.compile(r"^Error -?\d+ (?:connecting to|while writing to) \S+?\.? ")


def describe(exc: BaseException, password: str | None = None) -> str:
    """A short sentence for why an attempt failed: "connection refused", "name resolution of
    r.example timed out after 5 s", "connect timed out"."""
    if isinstance(exc, NotResolved):
        text = str(exc)
    else:
        text = _REDIS_PY_PREFIX.sub("", str(exc)).strip().rstrip(".") or type(exc).__name__
        text = {"Timeout connecting to server": "connect timed out"}.get(text, text)
        text = text[:1].lower() + text[1:]
    if password:
        text = text.replace(password, "***")
    return text


def wait_for_redis(connection: Redis, channel: Channel) -> bool:
    """Wait until Redis answers, saying meanwhile what the worker waits for; False if asked to
    stop first.

    A worker started during a Redis outage waits instead of exiting, so the fleet keeps its size
    instead of churning through crash-and-respawn; and one that cannot resolve Redis's name, or
    whose connect gets no answer, waits the same way (docs/design.md, "The network
    is not reliable"). A wrong password or another configuration error is not an outage: it raises,
    and the worker exits. `connection` should time out within a heartbeat interval: a ping
    blocked on a frozen Redis must not keep the worker silent past its heartbeat deadline.
    """
    from redis.exceptions import AuthenticationError, ConnectionError, TimeoutError

    target = Target.of(connection)
    started: float | None = None  # monotonic: the first attempt that did not answer
    while True:
        attempt = time.monotonic()
        try:
            if target.host and started is None:  # said only if it lasts (a slow resolver)
                unanswered = f"{target.where}: name resolution of {target.host} not answered yet"
                channel.waiting(unanswered, attempt, say=False)
            if target.host:
                resolver.resolve(target.host, target.port, RESOLVE_TIMEOUT)
            if started is None:
                channel.waiting(f"{target.where}: no answer yet", attempt, say=False)
            connection.ping()
            channel.waited()
            if started is not None:
                away = time.monotonic() - started
                print(f"herder worker: Redis answers after {away:.1f} s", file=sys.stderr, flush=True)
            return True
        except AuthenticationError:
            channel.waited()
            raise
        except (ConnectionError, TimeoutError, NotResolved) as exc:
            what = f"{target.where}: {describe(exc, target.password)}"
            if started is None:
                started = attempt
                print(f"herder worker: waiting for {what}", file=sys.stderr, flush=True)
            channel.waiting(what, started)
        if channel.stop_reason:
            channel.waited()
            return False
        channel.idle()  # its `wait` line, from the main loop
        time.sleep(channel.heartbeat_interval)
