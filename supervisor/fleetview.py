"""The fleet as plain data: what `herder status`, /healthz and /metrics show (snapshot.FleetView),
read from the master by the loop, each pool and each setting as it is in force."""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from herder.common.config import KEYS, SECRET_KEYS, Config, redact_setting, redact_url
from herder.supervisor.counters import Counters
from herder.supervisor.fleet import Slot, Worker
from herder.supervisor.health import HealthWatch
from herder.supervisor.pool import Pool
from herder.supervisor.pressure import MemoryWatch
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import Counts, Recovery
from herder.supervisor.snapshot import FleetView
from herder.supervisor.states import WORKING

if TYPE_CHECKING:
    from herder.supervisor.guard import KillGuard
    from herder.supervisor.launcher import Clock
    from herder.supervisor.scheduler import SchedulerKeeper


class Observed(Protocol):
    """What the view reads of the master (herder.supervisor.master.Master); it changes nothing."""

    cfg: Config
    clock: Clock
    host_id: str
    started_at: float
    target: int
    floor: int
    stopping: bool
    paused: bool
    ever_ready: bool
    restarts: int
    workers: dict[int, Worker]
    slots: dict[int, Slot]
    counters: Counters
    guard: KillGuard
    recovery: Recovery | None
    reader: LoadReader | None
    sched: SchedulerKeeper
    health: HealthWatch
    memory: MemoryWatch

    @property
    def sched_cfg(self) -> Config: ...

    def live_workers(self) -> list[Worker]: ...

    def pool_list(self) -> list[Pool]: ...

    def pool_workers(self, pool: Pool) -> list[Worker]: ...


def fleet_view(m: Observed) -> FleetView:
    """What status, /healthz and /metrics show, as plain data (snapshot.FleetView)."""
    now, wall = m.clock.monotonic(), m.clock.wall()
    counts = m.recovery.counts if m.recovery else Counts()
    live = m.live_workers()
    fleet = max(m.target, len(live))
    backoff = [s.index for s in m.slots.values() if s.index not in m.workers and s.in_backoff(now)]
    pools = m.pool_list()
    grants = [p.scaler.grant for p in pools if p.scaler.grant is not None]
    queue_stats = {q: p.scaler.queues.get(q) for p in pools for q in p.cfg.queues}
    rates = [p.scaler.state.per_worker for p in pools if p.scaler.state.per_worker is not None]
    return FleetView(
        cfg=m.cfg if m.cfg.pools else pools[0].cfg,  # one pool: its bounds are the host's (scale)
        host_id=m.host_id,
        started_at=m.started_at,
        now=now,
        target=m.target,
        grant=sum(grants) if grants else None,
        live=len(live),
        stopping=m.stopping,
        health=m.health.reasons(
            now,
            ready=sum(w.state in WORKING for w in live),
            floor=m.floor,
            was_ready=m.ever_ready,
            stopping=m.stopping,
            redis_down_since=m.reader.outage_since if m.reader else None,
            grace=m.cfg.health_grace,
            short=short_pools(m),
            budgets=[
                ("kill_budget_spent", m.guard.degraded),
                (
                    "cull_budget_spent",
                    next((named(p, pools) for p in pools if p.retirement.degraded), ""),
                ),
            ],
        ),
        workers=[(w, w.proc.snapshot()) for w in m.workers.values()],
        backoff=sorted(backoff),
        queues=queue_stats,  # in force, read or not
        settings=settings(m),
        totals={
            "spawned": m.counters.totals.spawned,
            "killed": m.counters.totals.killed,
            "requeued": counts.requeued,
            "recovered_by_sweep": counts.swept,
            "failed_by_herder": counts.failed,
            "recycled": dict(sum((p.retirement.recycled for p in pools), Counter())),
        },
        scheduler=m.sched.status(m.sched_cfg),
        jobs=m.counters.jobs(list(m.workers.values())),
        killed_by=dict(m.counters.totals.killed_by),
        requeued_by=dict(counts.requeued_by),
        master_restarts=m.restarts,
        budgets_left={
            "kill": max(0.0, m.guard.budget.limit(fleet) - m.guard.budget.local_count(wall)),
            "cull": max(0.0, m.cfg.cull_budget - sum(p.retirement.local.count(wall) for p in pools)),
        },
        loop_lag=m.health.last_lag,
        job_rate=rates[0] if len(rates) == 1 else (sum(rates) / len(rates) if rates else None),
        paused=m.paused,
        ever_ready=m.ever_ready,
        pools={p.name: pool_view(m, p) for p in pools},
        memory_pressure=m.memory.reason,
    )


def named(pool: Pool, pools: list[Pool]) -> str:
    """A pool's cull-budget reason as /healthz shows it: naming the pool when there are several."""
    reason = pool.retirement.degraded
    return f"pool {pool.name}: {reason}" if len(pools) > 1 else reason


def short_pools(m: Observed) -> str:
    """The pools below their own minimum of ready workers, when there are several."""
    pools = [p for p in m.pool_list() if not p.draining]
    if len(pools) < 2:
        return ""
    ready = {p.name: sum(w.state in WORKING for w in m.pool_workers(p)) for p in pools}
    return "; ".join(
        f"pool {p.name}: {ready[p.name]} of {p.cfg.floor}" for p in pools if ready[p.name] < p.cfg.floor
    )


def pool_view(m: Observed, pool: Pool) -> dict[str, Any]:
    """One pool in `herder status`: its queues, sizing and counts."""
    cfg, live = pool.cfg, m.pool_workers(pool)
    return {
        "queues": list(cfg.queues),
        "autoscale": cfg.autoscale,
        "min": cfg.floor,
        "max": cfg.ceiling,
        "scaled": dict(pool.scaled),  # `herder scale`'s bounds over the file's, {}: none
        "threads": cfg.threads,  # jobs each of its workers runs at once
        "desired": pool.target,
        # What the pool's queues call for across the cluster before this host's bounds (the
        # figure a KEDA ScaledObject scales hosts by); a fixed-size pool wants its size.
        "wanted": pool.scaler.wanted if cfg.autoscale and pool.scaler.wanted is not None else pool.target,
        "actual": len(live),
        "ready": sum(w.state in WORKING for w in live),
        "cluster_max": cfg.cluster_max_workers,
        "cluster_grant": pool.scaler.grant,
        "paused": pool.paused,
        "draining": pool.draining,
        "generation": pool.generation,
        "jobs": dict(zip(("ok", "failed"), m.counters.jobs(live_all(m, pool), pool.name), strict=True)),
        **pool_counts(m, pool),
    }


def pool_counts(m: Observed, pool: Pool) -> dict[str, Any]:
    """A pool's kills, requeues, recycles and given-up jobs (requeues by the pool that owns the
    job's queue: a queue belongs to one pool)."""
    counts = m.recovery.counts if m.recovery else Counts()
    queues = set(pool.cfg.queues)
    requeued: Counter[str] = Counter()
    for (why, queue), n in counts.requeued_by_queue.items():
        if queue in queues:
            requeued[why] += n
    killed = {kind: n for (kind, name), n in m.counters.totals.killed_by_pool.items() if name == pool.name}
    return {
        "killed_by": killed,
        "requeued_by": dict(requeued),
        "recycled_by": dict(pool.retirement.recycled),
        "failed_by_herder": sum(n for q, n in counts.failed_by_queue.items() if q in queues),
        "died": m.counters.totals.died_by_pool[pool.name],
    }


def live_all(m: Observed, pool: Pool) -> list[Worker]:
    """Every worker process of a pool, stopping ones too (their jobs count until reaped)."""
    return [w for w in m.workers.values() if w.pool == pool.name]


def settings(m: Observed) -> dict[str, Any]:
    """Every setting as the master runs it, read back from the part that applies it where
    one does: a reload that did not reach a part shows here. With pools, the fleet
    settings shown are the first pool's; `pools` has what each pool sets itself."""
    first = m.pool_list()[0]
    in_force = m.cfg if m.cfg.pools else first.cfg  # one pool: `herder scale`'s bounds are the host's
    out: dict[str, Any] = {k: getattr(in_force, k) for k in KEYS}
    out.update({k: redact_setting(k, out[k]) for k in SECRET_KEYS if out[k]})
    out.update(
        redis_url=redact_url(m.cfg.redis_url),
        workers_limit=m.cfg.limit,
        kill_budget=m.guard.budget.fraction,
        kill_budget_window=m.guard.budget.window,
        scale_down_delay=first.scaler.policy.scale_down_delay,
        drain_target=first.scaler.policy.drain_target,
        max_wait=first.scaler.policy.max_wait,
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        pools={p.name: dict(m.cfg.pools.get(p.name, {})) for p in m.pool_list()},
    )
    if m.recovery is not None:
        out.update(max_requeues=m.recovery.cfg.max_requeues, sweep_interval=m.recovery.cfg.sweep_interval)
    if m.reader is not None:
        out.update(scale_interval=m.reader.interval, queues=list(m.reader.queues))
        if m.reader.cluster is not None:
            out.update(cluster_max_workers=m.reader.cluster.cap, host_ttl=m.reader.cluster.ttl)
    return out
