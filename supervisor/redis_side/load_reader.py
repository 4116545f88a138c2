"""The load reader: reads the queues' load from Redis once per scale interval, in one
pipelined round trip.

A thread, so a slow or unreachable Redis never stalls the reconcile loop: the loop
reads the latest reading (or None: hold the count) and decides. When a cluster cap is
set, the same round trip also renews this host and its reservation (cluster.py). Another
once-a-second reading may ride along (`carry`: the scheduler locks'): an idle master's cost is
its wake-ups, so two readings in one wake-up and one round trip cost about what one does.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from redis import Redis
from redis.client import Pipeline
from rq.job import Job
from rq.queue import Queue
from rq.registry import StartedJobRegistry

from herder.common.config import DEFAULT_POOL
from herder.common.redis_connect import with_script
from herder.supervisor.redis_side import hosts
from herder.supervisor.redis_side.budget import cluster_keys
from herder.supervisor.redis_side.cluster import HOSTS_KEY, RESERVE, RESERVED_KEY, Grant, parse_grant
from herder.supervisor.redis_side.load import Load

log = logging.getLogger("herder")

# Each queue's length, its unexpired started entries, and when its oldest waiting job was
# enqueued (RQ pops from the left), in one call: the oldest job's hash is read inside Redis,
# not in a second round trip (a busy fleet's queue is never empty).
# KEYS: each queue's list and started registry, in turn; ARGV: 1 now (a started entry's expiry
# is a score), 2 the job hash prefix
QUEUE_LOAD = """
local out = {}
for i = 1, #KEYS, 2 do
  local head = redis.call('LINDEX', KEYS[i], 0)
  out[#out + 1] = redis.call('LLEN', KEYS[i])
  out[#out + 1] = redis.call('ZCOUNT', KEYS[i + 1], ARGV[1], '+inf')
  out[#out + 1] = head and redis.call('HGET', ARGV[2] .. head, 'enqueued_at')
end
return out
"""


@dataclass(frozen=True)
class Reading:
    load: Load | None  # None: Redis did not answer
    grant: Grant | None  # the default pool's (or the one pool a pool's own reading is for)
    per_queue: tuple[tuple[str, int, int, float], ...] = ()  # (queue, backlog, running, oldest age)
    kills: tuple[int, int, float] | None = None  # cluster kill counters: current, previous, read at
    grants: dict[str, Grant] = field(default_factory=dict)  # by pool, for the pools with a cluster cap

    def says_as_much_as(self, other: Reading | None) -> bool:
        """Whether it says what `other` said, but when it was read: the loop may take it at its
        next tick rather than be woken for it."""
        if other is None or (self.load is None) != (other.load is None):
            return False
        load, was = self.load, other.load
        kills, before = self.kills, other.kills
        return (
            (load is None or was is None or replace(load, at=0.0) == replace(was, at=0.0))
            and self.per_queue == other.per_queue
            and self.grant == other.grant
            and self.grants == other.grants
            and (kills[:2] if kills else None) == (before[:2] if before else None)
        )

    def for_pool(self, pool: str, queues: list[str]) -> Reading:
        """What one pool sees: its queues' figures and its own cluster grant."""
        if self.load is None:
            return Reading(None, None, kills=self.kills)
        mine = tuple(q for q in self.per_queue if q[0] in queues)
        load = Load(
            self.load.at,
            sum(q[1] for q in mine),
            sum(q[2] for q in mine),
            max((q[3] for q in mine), default=0.0),
        )
        return Reading(load, self.grants.get(pool), mine, self.kills, {})


def cluster_key(base: str, pool: str) -> str:
    """Hosts that name the same pool share its cap; the default pool keeps today's keys."""
    return base if pool == DEFAULT_POOL else f"{base}:{pool}"


@dataclass
class ClusterSettings:
    host_id: str
    cap: int
    ttl: float
    kill_window: float = 60.0


class Rider(Protocol):
    """A reading that rides along with the load's, in its pipeline, on its thread."""

    def ride(self, pipe: Pipeline) -> None:
        """Queue its one command on the reading's pipeline."""
        ...

    def arrived(self, reply: Any) -> None:
        """Its command's reply (not called when the reading failed: the last one stands)."""
        ...


class LoadReader:
    def __init__(
        self,
        connection: Redis,
        queues: list[str],
        interval: float,
        cluster: ClusterSettings | None = None,
        clusters: dict[str, ClusterSettings] | None = None,
    ) -> None:
        """`cluster`: the one pool's cluster cap; `clusters`: each pool's that has one."""
        self.connection = connection
        self.queues = queues
        self.interval = interval
        self.clusters: dict[str, ClusterSettings] = clusters or ({DEFAULT_POOL: cluster} if cluster else {})
        self._wake: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self.set_queues(queues)
        self._reading: Reading | None = None
        self._told: dict[str, tuple[int, int]] = {}  # pool -> (target, running)
        self._outage_since: float | None = None
        self._host: dict[str, Any] | None = None  # this host's record for the host list (hosts.py)
        self._hosts: tuple[float, list[dict[str, Any]]] = (0.0, [])  # (read at, wall; records)
        self._host_ids: list[bytes] = []  # the index as last read: their records ride along next time
        self._reserve = connection.register_script(RESERVE)
        self._queue_load = connection.register_script(QUEUE_LOAD)
        self._riders: list[Rider] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-reader", daemon=True)

    def set_queues(self, queues: list[str]) -> None:
        """The queues to read, from the next interval on (a reload may change them)."""
        keys = [
            (
                q,
                Queue(q, connection=self.connection).key,
                StartedJobRegistry(q, connection=self.connection).key,
            )
            for q in queues
        ]
        with self._lock:
            self.queues, self._keys = queues, keys

    def carry(self, rider: Rider) -> None:
        """Take `rider`'s reading along with each of the load's, from the next one on."""
        with self._lock:
            self._riders = [*self._riders, rider]

    def set_interval(self, seconds: float) -> None:
        """A reload's scale interval, from the next reading on."""
        self.interval = seconds

    @property
    def cluster(self) -> ClusterSettings | None:
        """The default pool's cluster settings (the first pool's, with pools)."""
        return self.clusters.get(DEFAULT_POOL) or next(iter(self.clusters.values()), None)

    def set_cluster(
        self, cap: int, ttl: float, kill_window: float, pool: str = DEFAULT_POOL, host_id: str = ""
    ) -> None:
        """A reload's cluster cap, host TTL and kill-budget window, from the next reading on;
        a pool a reload added gets its reservation (`host_id`: this host's). (Turning a pool's
        cap on or off is a restart: herder.common.config.reload_plan, herder.supervisor.control.reload.)"""
        with self._lock:
            if pool in self.clusters:
                self.clusters[pool] = replace(self.clusters[pool], cap=cap, ttl=ttl, kill_window=kill_window)
            elif host_id:
                self.clusters[pool] = ClusterSettings(host_id, cap, ttl, kill_window)

    def start(self, wake: Callable[[], None]) -> None:
        """Read every interval from now on, calling `wake` after each reading."""
        self._wake = wake
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def tell(self, target: int, running: int, pool: str = DEFAULT_POOL) -> None:
        """What the loop wants and runs now in a pool, for its next cluster reservation."""
        with self._lock:
            self._told[pool] = (target, running)

    def tell_host(self, record: dict[str, Any]) -> None:
        """This host's record (hosts.py), written with the next reading."""
        with self._lock:
            self._host = record

    def host_records(self) -> tuple[float, list[dict[str, Any]]]:
        """(when read, wall clock; every host's record read then), newest first, at most
        hosts.MAX_HOSTS: read by the HTTP threads, never blocking on Redis."""
        return self._hosts

    @property
    def outage_since(self) -> float | None:
        """Since when (monotonic) Redis has not answered a reading, or None while it answers."""
        return self._outage_since

    def take(self) -> Reading | None:
        """The newest reading, once; None if none arrived since the last take."""
        with self._lock:
            reading, self._reading = self._reading, None
            return reading

    def _run(self) -> None:
        last: Reading | None = None
        while not self._stop.is_set():
            started = time.monotonic()
            reading = self._read()
            with self._lock:
                self._reading = reading
            # A reading that says what the last did (an idle fleet's, second after second) waits
            # for the loop's next tick: an idle master's cost is its wake-ups.
            if not reading.says_as_much_as(last):
                self._wake()
            last = reading
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _read_hosts(self, ids: list[bytes], values: list[bytes | None] | None) -> None:
        """Every host's record named in the index: `values`, the records of the index as last
        read (read in the same round trip), if it names the same hosts; else one more round trip."""
        if values is None or set(ids) != set(self._host_ids):
            values = self.connection.mget(hosts.record_keys(ids)) if ids else []
        else:  # the same hosts: newest first, as the index has them now
            by_id = dict(zip(self._host_ids, values, strict=True))
            values = [by_id[i] for i in ids]
        self._host_ids = ids
        self._hosts = (time.time(), hosts.parse(values))

    @staticmethod
    def _ages(stamps: list[bytes | None]) -> list[float]:
        """Seconds each queue's oldest waiting job has waited (RQ's `enqueued_at`), 0 for an
        empty queue or an unreadable time."""
        now = time.time()
        ages = [0.0] * len(stamps)
        for i, stamp in enumerate(stamps):
            if stamp:
                try:
                    ages[i] = max(0.0, now - datetime.fromisoformat(stamp.decode()).timestamp())
                except ValueError:
                    pass
        return ages

    def _round_trip(
        self,
        riders: list[Rider],
        keys: list[tuple[str, str, str]],
        clusters: dict[str, ClusterSettings],
        told: dict[str, tuple[int, int]],
        host: dict[str, Any] | None,
        now_redis: float,
    ) -> tuple[list[Any], float]:
        """The reading's one pipeline: the riders', the queues' load (QUEUE_LOAD), the cluster's
        kill counters and reservations, this host's record; its replies, and when it was sent."""
        cluster = next(iter(clusters.values()), None)  # the kill budget's window: the host's
        pipe = self.connection.pipeline(transaction=False)
        for rider in riders:
            rider.ride(pipe)
        queue_keys = [k for _, queue_key, wip_key in keys for k in (queue_key, wip_key)]
        # EVALSHA, not the Script: a Script in a pipeline asks SCRIPT EXISTS first
        prefix = Job.redis_job_namespace_prefix
        pipe.evalsha(self._queue_load.sha, len(queue_keys), *queue_keys, now_redis, prefix)
        read_at = time.time()
        if cluster:
            pipe.mget(*cluster_keys(read_at, cluster.kill_window))
        for pool, c in clusters.items():
            target, running = told.get(pool, (0, 0))
            self._reserve(
                keys=[cluster_key(HOSTS_KEY, pool), cluster_key(RESERVED_KEY, pool)],
                args=[c.host_id, target, running, c.ttl, c.cap],
                client=pipe,
            )
        if host is not None:
            hosts.publish(pipe, host, read_at)
            if self._host_ids:
                pipe.mget(hosts.record_keys(self._host_ids))
        return pipe.execute(), read_at

    def _read(self) -> Reading:
        now_redis = time.time()  # for ZCOUNT of unexpired started entries; skew only blurs abandoned ones
        with self._lock:
            told, keys, clusters, host = dict(self._told), self._keys, dict(self.clusters), self._host
            riders = self._riders
        cluster = next(iter(clusters.values()), None)  # the kill budget's window: the host's
        try:

            def trip() -> tuple[list[Any], float]:
                return self._round_trip(riders, keys, clusters, told, host, now_redis)

            replies, read_at = with_script(self.connection, QUEUE_LOAD, trip)
            carried, (loads, *replies) = replies[: len(riders)], replies[len(riders) :]
            known = self._host_ids
            if host is not None:
                values = replies.pop() if known else None
                self._read_hosts(replies.pop(), values)
                del replies[-4:]  # the record's set and the index's upkeep
        except Exception as exc:
            if self._outage_since is None:
                self._outage_since = time.monotonic()
                log.error(
                    "cannot read the load from Redis (%s: %s): holding the current worker count "
                    "until it answers",
                    exc.__class__.__name__,
                    exc,
                )
            return Reading(None, None)
        if self._outage_since is not None:
            log.warning(
                "Redis answers again after %.1f s: scaling resumes", time.monotonic() - self._outage_since
            )
            self._outage_since = None
        for rider, reply in zip(riders, carried, strict=True):
            rider.arrived(reply)
        ages = self._ages([loads[3 * i + 2] for i in range(len(keys))])
        per_queue = tuple(
            (name, int(loads[3 * i]), int(loads[3 * i + 1]), ages[i]) for i, (name, _, _) in enumerate(keys)
        )
        rest = replies  # the kill counters, then each pool's reservation
        grants = {pool: parse_grant(reply) for pool, reply in zip(clusters, rest[1:], strict=True)}
        kills = None
        if cluster:
            current, previous = (int(v or 0) for v in rest[0])
            kills = (current, previous, read_at)
        load = Load(
            at=time.monotonic(),
            backlog=sum(q[1] for q in per_queue),
            running=sum(q[2] for q in per_queue),
            oldest_age=max((q[3] for q in per_queue), default=0.0),
        )
        grant = grants.get(DEFAULT_POOL) or next(iter(grants.values()), None)
        return Reading(load, grant, per_queue, kills, grants)
