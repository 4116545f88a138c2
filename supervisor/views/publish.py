"""What the master shows, kept up each pass: health's bookkeeping, the job metrics, and the
host's snapshot (built by the one builder, build.py) published now and then for the HTTP
endpoint and the health event hooks, and for each `herder status` when it asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from herder.supervisor.children.fleet import Worker
from herder.supervisor.views.build import PUBLISH_EVERY, Snapshots
from herder.supervisor.views.hooks import EventHooks, HealthChanges
from herder.supervisor.views.journal import Journal
from herder.supervisor.views.model import HostSnapshot
from herder.supervisor.views.sources import Loop, Sources, short_pools

if TYPE_CHECKING:  # imported with --http only (__main__)
    from herder.supervisor.views.jobstats import JobStats

HEALTH_EVENTS_EVERY = 1.0  # seconds between two looks at health for the event hooks
HOST_RECORD_EVERY = 1.0  # seconds between two records of this host for the host list (hosts.py)


class Switch(Protocol):
    enabled: bool


class Outlet(Protocol):
    """Where the snapshot goes out: the HTTP endpoint's side in the loop (control/http_endpoint.py's
    `Publisher`). The views never import the control surface; it serves them."""

    controls: Switch

    def step(self, now: float) -> None: ...
    def publish(self, snap: HostSnapshot) -> None: ...
    def close(self) -> None: ...


class Views:
    """The views' side of the master: `sources` are the parts the snapshot is built from;
    `http` and `jobstats` exist with --http alone (only then does the master import
    prometheus-client and http.server: a master without is 1 MB smaller)."""

    def __init__(
        self,
        sources: Sources,
        snapshots: Snapshots,
        said: tuple[EventHooks, Journal],
        http: Outlet | None = None,
        jobstats: JobStats | None = None,
    ) -> None:
        self.sources, self.snapshots, self.http, self.jobstats = sources, snapshots, http, jobstats
        self.hooks, self.journal = said
        self.health, self.health_changes = sources.health, HealthChanges()
        self.snapshot: HostSnapshot | None = None  # the newest published
        self._published_at = self._host_told_at = self._health_read_at = float("-inf")
        self._uncounted: set[int] | None = None  # pids whose jobs are not counted yet (None: all)
        self._unfolded: set[int] | None = None  # pids whose finished jobs are not folded yet

    def note(self, changed: set[int] | None) -> None:
        """The workers that changed this pass (None: look at all): only theirs are counted and
        folded (a `done` is a change), so a pass costs what changed (children/changes.py)."""
        if changed is None:
            self._uncounted = self._unfolded = None
            return
        if self._uncounted is not None:
            self._uncounted |= changed
        if self._unfolded is not None:
            self._unfolded |= changed

    def _take(self, pids: set[int] | None) -> list[Worker]:
        workers = self.sources.workers
        if pids is None:
            return workers.values()
        return [w for pid in pids if (w := workers.by_pid(pid)) is not None]

    def publish(self, loop: Loop, floor: int, moving: int) -> None:
        """Health bookkeeping each pass; the host's snapshot every view renders, now and then.
        `moving`: the workers starting, stopping or being killed (the others are ready)."""
        src = self.sources
        now = src.clock.monotonic()
        ready = len(src.workers) - moving
        down = src.reader is not None and src.reader.outage_since is not None
        self.health.observe(now, ready, floor, short_pools(list(src.pools.values())), redis_down=down)
        unfolded, self._unfolded = self._unfolded, set()
        for w in self._take(unfolded):
            self.fold_finished(w, now)
        self.snapshots.evidence.observe(src.pools.values(), now)
        if self.http:
            self.http.step(now)
        if not (self.http or self.hooks.enabled):
            return  # nobody reads a published snapshot (`herder status` has one built for it)
        snap = self.snapshot
        if snap is None or now - self._published_at >= PUBLISH_EVERY:
            snap = self.take_snapshot(loop)
        if self.http and src.reader and now - self._host_told_at >= HOST_RECORD_EVERY:
            from herder.supervisor.views.api import host_record

            self._host_told_at = now
            src.reader.tell_host(host_record(snap))
        if self.hooks.enabled and now - self._health_read_at >= HEALTH_EVENTS_EVERY:
            self._health_read_at = now
            for event, fields in self.health_changes.observe(list(snap.health.problems)):
                self.hooks.emit(event, **fields)

    def take_snapshot(self, loop: Loop, usage: bool = False) -> HostSnapshot:
        """The host now, built by the one builder (views/build.py) and published: the newest
        for /healthz, /metrics and the dashboard; `herder status` renders the one it asks for.
        Workers' RSS and CPU are sampled (at most once a second) for status and the dashboard
        only: without --http a pass does not read every worker's /proc."""
        controls = self.http.controls.enabled if self.http else False
        self.count_jobs()
        snap = self.snapshots.build(self.sources, loop, controls, usage=usage or self.http is not None)
        self.snapshot, self._published_at = snap, snap.taken_at
        if self.http:
            self.http.publish(snap)
        return snap

    def count_jobs(self) -> None:
        """Every worker's jobs finished since it was last counted, into the one count the
        views and the autoscaler read (counters.py); done where they read it, not each pass."""
        uncounted, self._uncounted = self._uncounted, set()
        for w in self._take(uncounted):
            self.sources.counters.count_jobs(w, w.proc.snapshot())

    def fold_finished(self, w: Worker, now: float | None = None) -> None:
        """The worker's finished jobs into the job metrics (by the pool's queues) and into what
        the advice rests on."""
        done = w.proc.take_finished()
        if not done:
            return
        self.snapshots.evidence.jobs(w, done, self.sources.clock.monotonic() if now is None else now)
        if self.jobstats:
            pool = self.sources.pools.get(w.pool)
            self.jobstats.fold(w.pool, pool.cfg.queues if pool else (), done)

    def close(self) -> None:
        if self.http:
            self.http.close()
        self.hooks.close()
