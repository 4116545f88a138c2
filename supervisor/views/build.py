"""The one builder of the HostSnapshot (views/model.py): it reads the master's parts
(views/sources.py, never the master itself), the loop calls it (at most every
PUBLISH_EVERY, and for each `herder status`), and every view renders what it built. Each
pool's figures are built here and nowhere else. `Snapshots` keeps what one snapshot needs
of the previous ones (the jobs/s over the last RATE_WINDOW seconds)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable

from herder.common.config import redact_url
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.observations import Observations
from herder.supervisor.children.states import WORKING, WorkerState
from herder.supervisor.policy.liveness import derived_state
from herder.supervisor.policy.pool import Pool, host_target, live
from herder.supervisor.redis_side.recovery import Counts
from herder.supervisor.views.journal import Journal
from herder.supervisor.views.model import (
    Health,
    HostSnapshot,
    PoolRow,
    QueueRow,
    SchedulerRow,
    SchedulerStatus,
    ThreadJob,
    WorkerRow,
)
from herder.supervisor.views.sources import Loop, Sources, health_of, sched_cfg, settings
from herder.supervisor.views.usage import Usage

PUBLISH_EVERY = 0.5  # seconds between two snapshots the loop publishes
RATE_WINDOW = 5.0  # seconds the jobs/s are measured over
SHOWN_EVENTS = 300
STATES = tuple(str(s) for s in WorkerState if s != WorkerState.EXITED)  # a pool's workers by state


class Snapshots:
    """Builds each snapshot; remembers each pool's job counts for its rates."""

    def __init__(self, hostname: str, wall: Callable[[], float], usage: Usage, journal: Journal) -> None:
        self.hostname, self.wall, self.usage, self.journal = hostname, wall, usage, journal
        self._counts: dict[str, deque[tuple[float, int, int]]] = {}  # pool -> (monotonic, ok, failed)

    def build(self, m: Sources, loop: Loop, controls: bool, usage: bool = True) -> HostSnapshot:
        """`loop`: where the master's loop stands now. `usage`: sample the workers' RSS and CPU
        for it (else None: a snapshot nobody shows them from need not cost a psutil read a
        worker a second)."""
        now, wall = m.clock.monotonic(), m.clock.wall()
        counts = m.recovery.counts if m.recovery else Counts()
        pools = list(m.pools.values())
        alive = live(m.workers.values())
        target, m_cfg = host_target(pools), loop.cfg
        every = sorted(m.workers.values(), key=lambda w: w.slot)
        observed = {w.slot: w.proc.snapshot() for w in every}  # once a worker: a copy under its lock
        sampled = self.usage.of(w.pid for w in every) if usage else {}
        workers = tuple(
            _worker_row(w, observed[w.slot], now, sampled.get(w.pid, (None, None))) for w in every
        )
        own = [tuple(_queue_row(p, q) for q in p.cfg.queues) for p in pools]  # each pool's queues' rows
        queues = tuple(q for rows in own for q in rows)
        pool_rows = tuple(
            self._pool_row(m, loop, p, now, observed, rows, counts)
            for p, rows in zip(pools, own, strict=True)
        )
        for gone in set(self._counts) - {p.name for p in pools}:
            del self._counts[gone]
        problems = health_of(m, loop, now, pools, alive)
        grants = [p.scaler.grant for p in pools if p.scaler.grant is not None]
        rates = [p.scaler.state.per_worker for p in pools if p.scaler.state.per_worker is not None]
        cfg = m_cfg if m_cfg.pools else pools[0].cfg  # one pool: its bounds are the host's (scale)
        fleet = max(target, len(alive))
        sched = m.sched.status(sched_cfg(m_cfg))
        ok, failed = m.counters.jobs.ok, m.counters.jobs.failed
        return HostSnapshot(
            host_id=m.host_id,
            hostname=self.hostname,
            time=self.wall(),
            taken_at=now,
            state=loop.phase,
            health=Health(ok=not problems, reasons=tuple(text for _, text in problems), problems=problems),
            controls=controls,
            pools=pool_rows,
            workers=workers,
            scheduler=_scheduler(sched),
            events=self.journal.newest(SHOWN_EVENTS),
            started_at=m.started_at,
            redis_url=redact_url(cfg.redis_url),
            autoscale=cfg.autoscale,
            floor=cfg.floor,
            ceiling=cfg.ceiling,
            workers_limit=cfg.limit,
            workers_limit_reason=cfg.limit_reason,
            cluster_max=cfg.cluster_max_workers,
            cluster_grant=sum(grants) if grants else None,
            target=target,
            actual=len(alive),
            ready=sum(w.life.state in WORKING for w in m.workers.values()),
            paused=all(p.paused for p in pools),
            backoff=tuple(
                sorted(
                    s.index
                    for p in pools
                    for s in p.slots.values()
                    if s.index not in p.workers and s.in_backoff(now)
                )
            ),
            queues=queues,
            totals={
                "spawned": m.counters.totals.spawned,
                "killed": m.counters.totals.killed,
                "requeued": counts.requeued,
                "recovered_by_sweep": counts.swept,
                "failed_by_herder": counts.failed,
                "recycled": dict(sum((p.retirement.recycled for p in pools), Counter())),
            },
            settings=settings(m, m_cfg),
            scheduler_status=sched,
            scheduler_locks=_locks(sched),
            jobs_ok=ok,
            jobs_failed=failed,
            killed_by=dict(m.counters.totals.killed_by),
            requeued_by=dict(counts.requeued_by),
            master_restarts=m.restarts,
            budgets_left={
                "kill": max(0.0, m.guard.budget.limit(fleet) - m.guard.budget.local_count(wall)),
                "cull": max(0.0, m_cfg.cull_budget - sum(p.retirement.local.count(wall) for p in pools)),
            },
            loop_lag=m.health.last_lag,
            job_rate=rates[0] if len(rates) == 1 else (sum(rates) / len(rates) if rates else None),
            memory_pressure=m.memory.reason,
        )

    def _pool_row(
        self,
        m: Sources,
        loop: Loop,
        pool: Pool,
        now: float,
        observed: dict[int, Observations],
        queues: tuple[QueueRow, ...],  # its own queues' rows
        counts: Counts,
    ) -> PoolRow:
        """One pool's figures, for every view (the only place they are built)."""
        cfg, name = pool.cfg, pool.name
        alive, mine = pool.live(), list(pool.workers.values())
        by_state = dict.fromkeys(STATES, 0)
        for w in mine:
            by_state[derived_state(w, observed[w.slot])] += 1
        # The pool's one count: every worker process it had, stopping and reaped ones too.
        done = m.counters.pool_jobs(name)
        ok, failed = done.ok, done.failed
        jobs_per_s, failed_per_s = self._rates(name, now, ok, failed)
        read = [q for q in queues if q.backlog is not None]
        known = bool(read) and len(read) == len(cfg.queues)
        if loop.stopping or pool.draining:
            state = "stopping"
        elif pool.paused:
            state = "paused"
        else:
            state = "running" if loop.ever_ready else "starting"
        # Requeues by the pool that owns the job's queue (a queue belongs to one pool).
        own = set(cfg.queues)
        requeued: Counter[str] = Counter()
        for (why, queue), n in counts.requeued_by_queue.items():
            if queue in own:
                requeued[why] += n
        return PoolRow(
            name=name,
            state=state,
            autoscale=cfg.autoscale,
            floor=cfg.floor,
            ceiling=cfg.ceiling,
            # What the pool's queues call for across the cluster before this host's bounds (the
            # figure a KEDA ScaledObject scales hosts by); a fixed-size pool wants its size.
            demand=pool.scaler.demand if cfg.autoscale and pool.scaler.demand is not None else pool.target,
            running=len(alive),
            busy=by_state[str(WorkerState.BUSY)],
            queue_length=sum(q.backlog or 0 for q in read) if known else None,
            growth=round(sum(q.growth or 0.0 for q in read), 3) if known else None,
            oldest_age=round(max(q.oldest_age or 0.0 for q in read), 1) if known else None,
            jobs_per_s=jobs_per_s,
            failed_per_s=failed_per_s,
            jobs_ok=ok,
            jobs_failed=failed,
            queues=tuple(cfg.queues),
            target=pool.target,
            ready=sum(w.life.state in WORKING for w in alive),
            by_state=by_state,
            scaled=dict(pool.scaled),
            threads=cfg.threads,
            cluster_max=cfg.cluster_max_workers,
            cluster_grant=pool.scaler.grant,
            paused=pool.paused,
            draining=pool.draining,
            generation=pool.generation,
            killed_by=dict(m.counters.totals.killed_by_pool.get(name, {})),
            requeued_by=dict(requeued),
            recycled_by=dict(pool.retirement.recycled),
            failed_by_herder=sum(n for q, n in counts.failed_by_queue.items() if q in own),
            died=m.counters.totals.died_by_pool[name],
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
        state=str(derived_state(w, o)),  # as its lines say now, not as of the loop's last pass
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
        waiting_for=o.waiting.what if o.waiting else None,
        waiting_seconds=round(max(0.0, now - o.waiting.since), 1) if o.waiting else None,
        last_done=o.last_done_wall,
        malformed=o.malformed,
        paused=o.paused,
        # A protocol line since its spawn: a starting worker without one is still loading and
        # holds the start window (fleet.loading); one with one is on its way to ready.
        heard_from=o.last_seen > w.spawned_at,
        jobs_limit=w.limits.jobs,
        retiring=w.limits.retire_reason if w.retiring else None,
    )


def _queue_row(pool: Pool, name: str) -> QueueRow:
    q = pool.scaler.queues.get(name)
    if q is None:  # not read yet
        return QueueRow(name=name, pool=pool.name, backlog=None, running=None, growth=None, oldest_age=None)
    return QueueRow(
        name=name,
        pool=pool.name,
        backlog=q.backlog,
        running=q.running,
        growth=q.growth,
        oldest_age=q.oldest_age,
    )


def _locks(s: SchedulerStatus | None) -> dict[str, bool]:
    """Queue -> some RQ scheduler (on any host) holds its lock; {} until Redis was read."""
    if s is None or s.read_age is None:
        return {}
    return {q.name: q.holder is not None for q in s.queues}


def _scheduler(s: SchedulerStatus | None) -> SchedulerRow | None:
    """Where RQ's scheduler runs: here, on another host (its hostname), or nowhere; None when
    herder runs no scheduler and none holds this host's queues."""
    if s is None:
        return None
    holders = [q.holder for q in s.queues if q.holder]
    if s.pid is not None or any(h.here for h in holders):
        where = "here"
    elif holders:
        where = ", ".join(sorted({str(h.hostname or h.host_id) for h in holders}))
    else:
        where = "nowhere"
    if not s.enabled and not holders:
        return None
    return SchedulerRow(pid=s.pid, state=s.state, where=where)
