"""Jobs for tests/test_hosts.py, run by herder in containers (mounted read-only at /srv/app), and
for tests/test_stale_finish.py.

Each run records itself in Redis, over a connection of its own, so the test counts the runs of
every job whatever happened to the worker's: a `start` record as it begins and an `end` record
as it ends, each with the job's id, the container's hostname and a run id. A record that cannot
be written (the container is cut off from Redis) is tried again until Redis answers: the job's
code keeps running without Redis, as a user's would, and says so once it can.
"""

from __future__ import annotations

import json
import socket
import time
import uuid

from redis import Redis
from redis.exceptions import RedisError
from rq import get_current_job

RUNS = "hosts:runs"  # a list of JSON records, one per start and one per end of a run
PATIENCE = 120.0  # seconds a record is tried for before the job gives up (and fails)

_connections: dict[tuple[str, int], Redis] = {}


def _record(host: str, port: int, record: dict[str, object]) -> None:
    """RPUSH the record, again on each failure until Redis answers. A push whose reply was lost
    may land twice: the run id lets the test count it once."""
    line = json.dumps(record)
    deadline = time.monotonic() + PATIENCE
    while True:
        conn = _connections.get((host, port))
        if conn is None:
            conn = _connections[host, port] = Redis(
                host=host, port=port, socket_timeout=1, socket_connect_timeout=1
            )
        try:
            conn.rpush(RUNS, line)
            return
        except RedisError:
            _connections.pop((host, port), None)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def work(seconds: float, host: str, port: int) -> str:
    """Runs `seconds`, recorded at both ends; returns the hostname of the container that ran it."""
    job = get_current_job()
    assert job is not None
    me, run = socket.gethostname(), uuid.uuid4().hex
    base = {"job": job.id, "host": me, "run": run}
    started = time.time()
    _record(host, port, {**base, "event": "start", "at": started})
    time.sleep(seconds)
    ended = time.time()  # the record may wait for Redis: `at` says when the run itself ended
    _record(host, port, {**base, "event": "end", "start": started, "at": ended, "written": time.time()})
    return me


def fail_after(seconds: float) -> None:
    """Runs `seconds`, then fails."""
    time.sleep(seconds)
    raise RuntimeError("failing on purpose")
