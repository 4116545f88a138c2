"""What a snapshot is built from: the master's parts, each read live, never the master itself
(`Sources`, handed over once), and where its loop stands (`Loop`, handed over with each
build); and the readings that are not a pool's or a worker's row:
health's reasons, and each setting as it is in force."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from herder.common.config import KEYS, SECRET_KEYS, Config, all_queues, redact_setting, redact_url
from herder.supervisor.children.counters import Counters
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.states import WORKING, MasterPhase
from herder.supervisor.policy.pool import Pool, Workers, active
from herder.supervisor.policy.pressure import MemoryWatch
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import Recovery
from herder.supervisor.views.health import HealthWatch

if TYPE_CHECKING:
    from herder.supervisor.children.launcher import Clock
    from herder.supervisor.children.scheduler import SchedulerKeeper
    from herder.supervisor.policy.guard import KillGuard


@dataclass(frozen=True)
class Loop:
    """Where the loop stands as a snapshot is built: values the master replaces (a reload its
    settings, a stop its phase), handed over with each build."""

    cfg: Config  # the settings in force
    phase: MasterPhase
    ever_ready: bool  # the fleet was ready once (health judges a shortfall from then)

    @property
    def stopping(self) -> bool:
        return self.phase == MasterPhase.STOPPING


@dataclass(frozen=True)
class Sources:
    """The parts the builder reads, handed over once: the collections are the master's own,
    changed in place by the loop."""

    clock: Clock
    host_id: str
    started_at: float
    restarts: int  # times the watchdog restarted the master before this one
    pools: dict[str, Pool]
    workers: Workers  # every pool's, by slot
    counters: Counters
    guard: KillGuard
    recovery: Recovery | None
    reader: LoadReader | None
    sched: SchedulerKeeper
    health: HealthWatch
    memory: MemoryWatch


def sched_cfg(cfg: Config) -> Config:
    """RQ's scheduler serves every pool's queues."""
    return replace(cfg, queues=all_queues(cfg)) if cfg.pools else cfg


def health_of(
    s: Sources, loop: Loop, now: float, pools: list[Pool], alive: list[Worker]
) -> tuple[tuple[str, str], ...]:
    """Health's (kind, reason) pairs as the loop sees them now (herder.supervisor.views.health)."""
    cfg = loop.cfg
    return tuple(
        s.health.reasons(
            now,
            ready=sum(w.life.state in WORKING for w in alive),
            floor=sum(p.cfg.floor for p in active(pools)),
            was_ready=loop.ever_ready,
            stopping=loop.stopping,
            redis_down_since=s.reader.outage_since if s.reader else None,
            grace=cfg.health_grace,
            short=short_pools(pools),
            budgets=[
                ("kill_budget_spent", s.guard.degraded),
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


def short_pools(pools: list[Pool]) -> str:
    """The pools below their own minimum of ready workers, when there are several."""
    running = active(pools)
    if len(running) < 2:
        return ""
    ready = {p.name: sum(w.life.state in WORKING for w in p.live()) for p in running}
    return "; ".join(
        f"pool {p.name}: {ready[p.name]} of {p.cfg.floor}" for p in running if ready[p.name] < p.cfg.floor
    )


def settings(s: Sources, cfg: Config) -> dict[str, Any]:
    """Every setting as the master runs it, read back from the part that applies it where
    one does: a reload that did not reach a part shows here. With pools, the fleet
    settings shown are the first pool's; `pools` has what each pool sets itself."""
    pools = list(s.pools.values())
    first = pools[0]
    in_force = cfg if cfg.pools else first.cfg  # one pool: `herder scale`'s bounds are the host's
    out: dict[str, Any] = {k: getattr(in_force, k) for k in KEYS}
    out.update({k: redact_setting(k, out[k]) for k in SECRET_KEYS if out[k]})
    out.update(
        redis_url=redact_url(cfg.redis_url),
        workers_limit=cfg.limit,
        kill_budget=s.guard.budget.fraction,
        kill_budget_window=s.guard.budget.window,
        scale_down_delay=first.scaler.policy.scale_down_delay,
        drain_target=first.scaler.policy.drain_target,
        max_wait=first.scaler.policy.max_wait,
        log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        pools={p.name: dict(cfg.pools.get(p.name, {})) for p in pools},
    )
    if s.recovery is not None:
        out.update(max_requeues=s.recovery.cfg.max_requeues, sweep_interval=s.recovery.cfg.sweep_interval)
    if s.reader is not None:
        out.update(scale_interval=s.reader.interval, queues=list(s.reader.queues))
        if s.reader.cluster is not None:
            out.update(cluster_max_workers=s.reader.cluster.cap, host_ttl=s.reader.cluster.ttl)
    return out
