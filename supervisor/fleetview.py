"""What the snapshot's builder (views/build.py) reads of the master, and the readings that are
not a pool's or a worker's row: health's reasons, and each setting as it is in force."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from herder.common.config import KEYS, SECRET_KEYS, Config, redact_setting, redact_url
from herder.supervisor.counters import Counters
from herder.supervisor.fleet import Slot, Worker
from herder.supervisor.health import HealthWatch
from herder.supervisor.pool import Pool
from herder.supervisor.pressure import MemoryWatch
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import Recovery
from herder.supervisor.states import WORKING

if TYPE_CHECKING:
    from herder.supervisor.guard import KillGuard
    from herder.supervisor.launcher import Clock
    from herder.supervisor.scheduler import SchedulerKeeper


class Observed(Protocol):
    """What the builder reads of the master (herder.supervisor.master.Master); it changes nothing."""

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


def health_of(m: Observed, now: float, pools: list[Pool], live: list[Worker]) -> tuple[tuple[str, str], ...]:
    """Health's (kind, reason) pairs as the loop sees them now (herder.supervisor.health)."""
    return tuple(
        m.health.reasons(
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
        )
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
