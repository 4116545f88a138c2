"""Every herder host on one Redis, for the dashboard's host list: each master's load reader
writes its host's short record (a JSON string with a TTL) and indexes it in a sorted set by
when it was written; the same reader reads the newest MAX_HOSTS records back. No secret is in
a record: its id, hostname, pools, counts and health."""

from __future__ import annotations

import json
from typing import Any

from redis.client import Pipeline

INDEX_KEY = "herder:hosts"
RECORD_PREFIX = "herder:host:"
MAX_HOSTS = 200
TTL = 60  # seconds a record outlives its last write: a host gone quiet drops off after this


def publish(pipe: Pipeline, record: dict[str, Any], now: float, ttl: int = TTL) -> None:
    """Queue this host's record on `pipe`, and the index's upkeep, then a read of the index."""
    host_id = str(record["host_id"])
    pipe.set(RECORD_PREFIX + host_id, json.dumps(record), ex=ttl)
    pipe.zadd(INDEX_KEY, {host_id: now})
    pipe.zremrangebyscore(INDEX_KEY, "-inf", now - ttl)
    pipe.expire(INDEX_KEY, ttl * 2)
    pipe.zrevrange(INDEX_KEY, 0, MAX_HOSTS - 1)


def record_keys(ids: list[bytes | str]) -> list[str]:
    return [RECORD_PREFIX + (i.decode() if isinstance(i, bytes) else i) for i in ids]


def parse(values: list[bytes | None]) -> list[dict[str, Any]]:
    """The records read back; unreadable or expired ones left out."""
    out = []
    for raw in values:
        if not raw:
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("host_id"), str):
            out.append(record)
    return out
