"""Jobs for the network fault tests: each records that it ran over a connection of its own,
straight to Redis, so the faults between herder and Redis never touch the record."""

from __future__ import annotations

import time

from redis import Redis

_direct: dict[int, Redis] = {}


def tick(n: int, port: int, seconds: float = 0.002) -> int:
    conn = _direct.get(port)
    if conn is None:
        conn = _direct[port] = Redis(port=port, socket_timeout=10, socket_connect_timeout=5)
    time.sleep(seconds)
    conn.rpush("ran", n)
    return n


def nap(seconds: float) -> float:
    """Touches nothing but the clock: only herder's own traffic crosses a fault."""
    time.sleep(seconds)
    return seconds
