"""One HostSnapshot from the FleetView the loop reads (snapshot.FleetView): the pools, the
workers, the scheduler, health and the newest events, frozen. `Snapshots` keeps what one
snapshot needs of the previous ones (the jobs/s over the last RATE_WINDOW seconds)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from herder.supervisor.fleet import Worker
from herder.supervisor.observations import Observations
from herder.supervisor.snapshot import FleetView
from herder.supervisor.states import WorkerState
from herder.supervisor.views.journal import Journal
from herder.supervisor.views.model import (
    Health,
    HostSnapshot,
    PoolRow,
    SchedulerRow,
    ThreadJob,
    WorkerRow,
)
from herder.supervisor.views.usage import Usage

RATE_WINDOW = 5.0  # seconds the jobs/s are measured over
SHOWN_EVENTS = 300


class Snapshots:
    """Builds each snapshot; remembers each pool's job counts for its rates."""

    def __init__(self, hostname: str, wall: Callable[[], float], usage: Usage, journal: Journal) -> None:
        self.hostname, self.wall, self.usage, self.journal = hostname, wall, usage, journal
        self._counts: dict[str, deque[tuple[float, int, int]]] = {}  # pool -> (monotonic, ok, failed)

    def build(self, v: FleetView, controls: bool) -> HostSnapshot:
        usage = self.usage.of(w.pid for w, _ in v.workers)
        workers = tuple(
            _worker_row(w, o, v.now, usage.get(w.pid, (None, None)))
            for w, o in sorted(v.workers, key=lambda pair: pair[0].slot)
        )
        pools = tuple(self._pool_row(name, pv, v, workers) for name, pv in v.pools.items())
        for gone in set(self._counts) - set(v.pools):
            del self._counts[gone]
        return HostSnapshot(
            host_id=v.host_id,
            hostname=self.hostname,
            time=self.wall(),
            taken_at=v.now,
            state=_state(v),
            health=Health(ok=not v.health, reasons=tuple(text for _, text in v.health)),
            controls=controls,
            pools=pools,
            workers=workers,
            scheduler=_scheduler(v.scheduler),
            events=self.journal.newest(SHOWN_EVENTS),
        )

    def _pool_row(
        self, name: str, pv: dict[str, Any], v: FleetView, workers: tuple[WorkerRow, ...]
    ) -> PoolRow:
        stats = [v.queues.get(q) for q in pv["queues"]]
        read = [q for q in stats if q is not None]
        known = bool(read) and len(read) == len(stats)
        ok, failed = pv["jobs"]["ok"], pv["jobs"]["failed"]
        jobs_per_s, failed_per_s = self._rates(name, v.now, ok, failed)
        if v.stopping or pv["draining"]:
            state = "stopping"
        elif pv["paused"]:
            state = "paused"
        else:
            state = "running" if v.ever_ready else "starting"
        return PoolRow(
            name=name,
            state=state,
            autoscale=pv["autoscale"],
            min=pv["min"],
            max=pv["max"],
            wanted=pv["wanted"],
            running=pv["actual"],
            busy=sum(w.pool == name and w.state == WorkerState.BUSY for w in workers),
            queue_length=sum(q.backlog for q in read) if known else None,
            growth=round(sum(q.growth for q in read), 3) if known else None,
            oldest_age=round(max(q.oldest_age for q in read), 1) if known else None,
            jobs_per_s=jobs_per_s,
            failed_per_s=failed_per_s,
            jobs_ok=ok,
            jobs_failed=failed,
            queues=tuple(pv["queues"]),
        )

    def _rates(self, pool: str, now: float, ok: int, failed: int) -> tuple[float, float]:
        """Jobs (ok and failed) and failed jobs a second over the last RATE_WINDOW seconds."""
        counts = self._counts.setdefault(pool, deque())
        counts.append((now, ok, failed))
        while len(counts) > 2 and now - counts[1][0] >= RATE_WINDOW:
            counts.popleft()
        then, ok0, failed0 = counts[0]
        dt = now - then
        if dt <= 0:
            return 0.0, 0.0
        done = max(0, ok + failed - ok0 - failed0)
        return round(done / dt, 3), round(max(0, failed - failed0) / dt, 3)


def _worker_row(w: Worker, o: Observations, now: float, usage: tuple[int | None, float | None]) -> WorkerRow:
    oldest = o.oldest
    return WorkerRow(
        pool=w.pool,
        slot=w.slot,
        pid=w.pid,
        state=str(w.state),
        job=oldest.job_id if oldest else None,
        func=oldest.func if oldest else None,
        elapsed=round(now - oldest.started, 1) if oldest else None,
        timeout=oldest.timeout if oldest else None,
        jobs_done=o.jobs_ok + o.jobs_failed,
        jobs_failed=o.jobs_failed,
        rss=usage[0],
        cpu_percent=usage[1],
        uptime=round(now - w.spawned_at, 1),
        threads=tuple(
            ThreadJob(thread=t, job=h.job_id, func=h.func, elapsed=round(now - h.started, 1))
            for t, h in sorted(o.jobs.items())
        ),
    )


def _state(v: FleetView) -> str:
    return "stopping" if v.stopping else "running" if v.ever_ready else "starting"


def _scheduler(s: dict[str, Any] | None) -> SchedulerRow | None:
    """Where RQ's scheduler runs: here, on another host (its hostname), or nowhere; None when
    herder runs no scheduler and none holds this host's queues."""
    if s is None:
        return None
    holders = [q["holder"] for q in s.get("queues", []) if q.get("holder")]
    if s.get("pid") is not None or any(h["here"] for h in holders):
        where = "here"
    elif holders:
        where = ", ".join(sorted({str(h["hostname"] or h["host_id"]) for h in holders}))
    else:
        where = "nowhere"
    if not s.get("enabled") and not holders:
        return None
    return SchedulerRow(pid=s.get("pid"), state=str(s.get("state", "off")), where=where)
