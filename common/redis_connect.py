"""One way to connect to Redis from a URL, for every process herder runs (the master's
threads, the workers, the scheduler, `herder enqueue`): redis://, rediss:// (TLS) and
unix:// as redis-py reads them, and Redis through Sentinel as

    redis+sentinel://[:password@]host:port[,host:port...]/master-name[/db][?ssl=true]

(the form rq-dashboard's redis-sentinel-url reads). The password, db and TLS apply to the
master Sentinel names; the Sentinels themselves are asked without a password unless
`sentinel_password=` is in the query.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis import Redis
from redis.sentinel import Sentinel

SENTINEL_SCHEME = "redis+sentinel"


def version_options() -> dict[str, Any]:
    """redis-py's version, given once: left to itself it reads its package metadata for
    every new connection (a few ms, most of a forked worker's way to `ready`)."""
    try:
        from redis.driver_info import DriverInfo  # redis-py 8
    except ImportError:
        return {"lib_version": redis.__version__}  # redis-py 5 to 7
    return {"driver_info": DriverInfo(lib_version=redis.__version__)}


def connect(url: str, **options: Any) -> Redis:
    """A Redis client for `url`; `options` (socket timeouts) go to every connection."""
    options = {**version_options(), **options}
    if urlsplit(url).scheme != SENTINEL_SCHEME:
        return Redis.from_url(url, **options)
    hosts, master, kwargs, sentinel_kwargs = parse_sentinel_url(url)
    sentinel = Sentinel(hosts, sentinel_kwargs={**options, **sentinel_kwargs}, **options, **kwargs)
    return sentinel.master_for(master)


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
