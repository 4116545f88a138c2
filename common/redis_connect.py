"""One way to connect to Redis from a URL, for every process herder runs (the master's
threads, the workers, the scheduler, `herder enqueue`): redis://, rediss:// (TLS) and
unix:// as redis-py reads them, and Redis through Sentinel as

    redis+sentinel://[:password@]host:port[,host:port...]/master-name[/db][?ssl=true]

(the form rq-dashboard's redis-sentinel-url reads). The password, db and TLS apply to the
master Sentinel names; the Sentinels themselves are asked without a password unless
`sentinel_password=` is in the query.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis import Redis
from redis.exceptions import NoScriptError
from redis.sentinel import Sentinel

T = TypeVar("T")

SENTINEL_SCHEME = "redis+sentinel"


def version_options() -> dict[str, Any]:
    """redis-py's version, given once: left to itself it reads its package metadata for
    every new connection (a few ms, most of a forked worker's way to `ready`)."""
    try:
        from redis.driver_info import DriverInfo  # redis-py 8
    except ImportError:
        return {"lib_version": redis.__version__}  # redis-py 5 to 7
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


CONNECT_TIMEOUT = 5.0  # seconds to make a connection, unless the caller says otherwise


def keepalive_options() -> dict[int, int]:
    """TCP keepalive that notices a peer gone silent within about 15 s (idle 5 s, then 5 probes
    2 s apart), where the platform lets a socket say so; the kernel's default is two hours."""
    import socket

    wanted = {"TCP_KEEPIDLE": 5, "TCP_KEEPALIVE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 5}
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


def connect(url: str, **options: Any) -> Redis:
    """A Redis client for `url`; `options` (socket timeouts) go to every connection. Every
    connection herder makes has a connect timeout and TCP keepalive: a peer that vanished
    without a word (a dropped NAT entry, a failover that moved the address) is given up
    within seconds, never the minutes a kernel waits by default (docs/design.md, "The network
    is not reliable")."""
    options = {
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive_options(),
        **version_options(),
        **options,
    }
    if urlsplit(url).scheme == "unix":
        options.pop("socket_keepalive", None)  # a Unix socket has no TCP to keep alive
        options.pop("socket_keepalive_options", None)
    if urlsplit(url).scheme != SENTINEL_SCHEME:
        return Redis.from_url(url, **options)
    hosts, master, kwargs, sentinel_kwargs = parse_sentinel_url(url)
    sentinel = Sentinel(hosts, sentinel_kwargs={**options, **sentinel_kwargs}, **options, **kwargs)
    return sentinel.master_for(master)


RETRIES = 3  # a call whose connection broke is tried this many more times, on new connections


def retry_resets(tries: int = RETRIES, timeouts: bool = False) -> dict[str, Any]:
    """redis-py's options for a call whose connection was reset (and, with `timeouts`, one that
    got no reply within its socket timeout): tried again on a new connection, at once and then a
    little later, up to `tries` more times. The same on every redis-py herder supports: redis-py
    5 retries nothing by default and asks for the errors in `retry_on_error` as well as in the
    Retry; 6 and later retry timeouts too by default, with backoffs up to 10 s a try, which
    would stretch one call past any bound herder judges a worker by."""
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError
    from redis.retry import Retry

    errors = (RedisConnectionError, RedisTimeoutError) if timeouts else (RedisConnectionError,)
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), tries, supported_errors=errors)
    return {"retry": retry, "retry_on_error": list(errors)}


def bound_calls(client: Redis, seconds: float) -> None:
    """Every call on this client gives up after `seconds` without a reply, on the connections
    it has and the ones it makes later (RQ raises a worker's socket timeout to minutes, for
    its own blocking dequeue; herder's dequeues wait a fraction of a second). A connection
    that was open is closed: the next call makes a new one with the bound."""
    pool = client.connection_pool
    pool.connection_kwargs["socket_timeout"] = seconds
    pool.disconnect()


def parse_sentinel_url(url: str) -> tuple[list[tuple[str, int]], str, dict[str, Any], dict[str, Any]]:
    """(the Sentinels' addresses, the master's name, the master's connection options, the
    Sentinels' own); ValueError with what is wrong."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")
    userinfo, hostlist = (netloc[0], netloc[2]) if netloc[1] else ("", netloc[2])
    hosts = []
    for item in filter(None, hostlist.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"a Sentinel address must be host:port, got {item!r}")
        hosts.append((host, int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ValueError("must be redis+sentinel://[:password@]host:port[,host:port...]/master-name[/db]")
    kwargs: dict[str, Any] = {"db": int(path[1]) if len(path) == 2 else 0}
    user, _, password = userinfo.partition(":")
    if user:
        kwargs["username"] = unquote(user)
    if password:
        kwargs["password"] = unquote(password)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if query.get("ssl", "").lower() in ("1", "true", "yes"):
        kwargs["ssl"] = True
    sentinel_kwargs = {"password": query["sentinel_password"]} if "sentinel_password" in query else {}
    return hosts, path[0], kwargs, sentinel_kwargs


def with_script(client: Redis, source: str, call: Callable[[], T]) -> T:
    """`call()`, which sends `source` by its SHA (EVALSHA, in a pipeline or not); a Redis that
    forgot it (a restart, SCRIPT FLUSH) has it loaded and `call()` made once more."""
    try:
        return call()
    except NoScriptError:
        client.script_load(source)
        return call()
