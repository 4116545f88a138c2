"""The load reader: reads the queues' load from Redis once per scale interval, in one
pipelined round trip.

A thread, so a slow or unreachable Redis never stalls the reconcile loop: the loop
reads the latest reading (or None: hold the count) and decides. When a cluster cap is
set, the same round trip also renews this host and its reservation (cluster.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from redis import Redis
from rq.queue import Queue
from rq.registry import StartedJobRegistry

from herder.supervisor.redis_side.budget import cluster_keys
from herder.supervisor.redis_side.cluster import HOSTS_KEY, RESERVE, RESERVED_KEY, Grant, parse_grant
from herder.supervisor.scaling import Load

log = logging.getLogger("herder")


@dataclass(frozen=True)
class Reading:
    load: Load | None  # None: Redis did not answer
    grant: Grant | None
    per_queue: tuple[tuple[str, int, int], ...] = ()  # (queue, backlog, running)
    kills: tuple[int, int, float] | None = None  # cluster kill counters: current, previous, read at


@dataclass
class ClusterSettings:
    host_id: str
    cap: int
    ttl: float
    kill_window: float = 60.0


class LoadReader:
    def __init__(
        self,
        connection: Redis,
        queues: list[str],
        interval: float,
        cluster: ClusterSettings | None = None,
    ) -> None:
        self.connection = connection
        self.queues = queues
        self.interval = interval
        self.cluster = cluster
        self._wake: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self.set_queues(queues)
        self._reading: Reading | None = None
        self._wanted = 0
        self._running = 0
        self._outage_since: float | None = None
        self._reserve = connection.register_script(RESERVE) if cluster else None
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

    def set_interval(self, seconds: float) -> None:
        """A reload's scale interval, from the next reading on."""
        self.interval = seconds

    def set_cluster(self, cap: int, ttl: float, kill_window: float) -> None:
        """A reload's cluster cap, host TTL and kill-budget window, from the next reading on.
        (Turning the cap on or off is a restart: herder.common.config.reload_plan.)"""
        with self._lock:
            if self.cluster is not None:
                self.cluster = replace(self.cluster, cap=cap, ttl=ttl, kill_window=kill_window)

    def start(self, wake: Callable[[], None]) -> None:
        """Read every interval from now on, calling `wake` after each reading."""
        self._wake = wake
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def tell(self, wanted: int, running: int) -> None:
        """What the loop wants and runs now, for the next cluster reservation."""
        with self._lock:
            self._wanted, self._running = wanted, running

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
        while not self._stop.is_set():
            started = time.monotonic()
            reading = self._read()
            with self._lock:
                self._reading = reading
            self._wake()
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def _read(self) -> Reading:
        now_redis = time.time()  # for ZCOUNT of unexpired started entries; skew only blurs abandoned ones
        with self._lock:
            wanted, running, keys, cluster = self._wanted, self._running, self._keys, self.cluster
        try:
            pipe = self.connection.pipeline(transaction=False)
            for _, queue_key, wip_key in keys:
                pipe.llen(queue_key)
                pipe.zcount(wip_key, now_redis, "+inf")
            read_at = time.time()
            if cluster:
                pipe.mget(*cluster_keys(read_at, cluster.kill_window))
            if cluster and self._reserve:
                self._reserve(
                    keys=[HOSTS_KEY, RESERVED_KEY],
                    args=[cluster.host_id, wanted, running, cluster.ttl, cluster.cap],
                    client=pipe,
                )
            replies = pipe.execute()
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
        per_queue = tuple(
            (name, int(replies[2 * i]), int(replies[2 * i + 1])) for i, (name, _, _) in enumerate(keys)
        )
        grant = parse_grant(replies[-1]) if cluster else None
        kills = None
        if cluster:
            current, previous = (int(v or 0) for v in replies[-2])
            kills = (current, previous, read_at)
        load = Load(
            at=time.monotonic(),
            backlog=sum(b for _, b, _ in per_queue),
            running=sum(r for _, _, r in per_queue),
        )
        return Reading(load, grant, per_queue, kills)
