"""What /metrics and /healthz serve: Vitals, a frozen snapshot of the fleet's counts that
the reconcile loop publishes (at most every PUBLISH_EVERY seconds) beside the dashboard's
HostSnapshot. Their renderers live with the others in herder.supervisor.views
(`prometheus.py`, `healthz.py`).

The HTTP threads (herder.supervisor.http_endpoint) read only the newest Vitals: a scrape
never touches the fleet, never waits for the loop, and a stalled loop shows as stale
Vitals (health: "master loop stalled"). docs/monitoring.md lists every metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from herder.supervisor.snapshot import FleetView, QueueStats
from herder.supervisor.states import WORKING, WorkerState

PUBLISH_EVERY = 0.5  # seconds between two Vitals the loop publishes
STALE_AFTER = 5.0  # seconds without new Vitals: the loop is stalled (it passes every 0.25 s)
# Every label value a counter can take, shown from the start at 0 (so rate() works at once).
KILL_REASONS = ("silent", "no_ready", "no_progress", "stdout_closed", "stop_timeout", "job_timeout",
                "memory_hard", "hurried_stop", "oom")  # fmt: skip  # oom: the kernel's, not herder's
REQUEUE_REASONS = ("killed", "died", "swept")
# Every kind of health problem (health.py, and the endpoint's loop_stalled): each shown, 0 while
# it does not hold, so an alert on one kind has a series to watch.
HEALTH_KINDS = ("kill_budget_spent", "cull_budget_spent", "starting", "stopping", "below_minimum",
                "redis_unreachable", "loop_lagging", "loop_stalled")  # fmt: skip
RECYCLE_REASONS = ("culled", "recycled after max jobs", "recycled after max age", "recycled after max memory",
                   "killed over hard memory limit")  # fmt: skip


@dataclass(frozen=True)
class Vitals:
    taken_at: float  # monotonic, when the loop took it
    health: tuple[tuple[str, str], ...]  # (kind, reason); empty: healthy
    workers_by_state: dict[str, int]
    desired: int
    running: int  # counting towards the target: not stopping or killing
    ready: int  # idle or busy
    jobs_ok: int
    jobs_failed: int
    spawned: int
    failed_by_herder: int
    requeued_by: dict[str, int]
    killed_by: dict[str, int]
    recycled_by: dict[str, int]
    master_restarts: int
    budgets_left: dict[str, float]
    queues: dict[str, QueueStats] = field(default_factory=dict)
    loop_lag: float = 0.0
    job_rate: float | None = None  # learned jobs/s of one busy worker
    # By pool: workers by state, and desired, running, ready (the `pool` label of the fleet metrics).
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Said beside health, never degrading it: memory pressure holds scale-up, but a probe that
    # restarted the pod for it would lose the work in flight (pressure.py).
    memory_pressure: str = ""
    # Queue -> some RQ scheduler (on any host) holds its lock; empty until Redis was read.
    scheduler_locks: dict[str, bool] = field(default_factory=dict)

    def problems(self, now: float) -> list[tuple[str, str]]:
        """Health as of `now`: the loop's reasons, and the loop itself if it stopped publishing."""
        stale = now - self.taken_at
        if stale > STALE_AFTER:
            return [("loop_stalled", f"master loop stalled: no pass for {stale:.0f} s"), *self.health]
        return list(self.health)


def vitals_of(v: FleetView) -> Vitals:
    by_state = {str(s): 0 for s in WorkerState if s != WorkerState.EXITED}
    for w, _ in v.workers:
        by_state[str(w.state)] += 1
    pools: dict[str, dict[str, Any]] = {}
    for name, pv in v.pools.items():  # every pool, the one `default` too (fleetview.pool_view)
        states = {str(s): 0 for s in WorkerState if s != WorkerState.EXITED}
        for w, _ in v.workers:
            if w.pool == name:
                states[str(w.state)] += 1
        ready = sum(states[str(s)] for s in WORKING)
        pools[name] = {
            "by_state": states,
            "desired": pv["desired"],
            "wanted": pv.get("wanted", pv["desired"]),
            "running": pv["actual"],
            "ready": ready,
            "jobs": pv.get("jobs", {"ok": 0, "failed": 0}),
            # Every reason from the start at 0, so rate() works at once.
            "killed_by": dict.fromkeys(KILL_REASONS, 0) | pv.get("killed_by", v.killed_by),
            "requeued_by": dict.fromkeys(REQUEUE_REASONS, 0) | pv.get("requeued_by", v.requeued_by),
            "recycled_by": dict.fromkeys(RECYCLE_REASONS, 0) | pv.get("recycled_by", v.totals["recycled"]),
            "failed_by_herder": pv.get("failed_by_herder", v.totals["failed_by_herder"]),
            "died": pv.get("died", 0),
            "max": pv.get("max", pv["desired"]),
            "queues": pv.get("queues", list(v.queues)),
        }
    sched = v.scheduler or {}
    locks = {q["name"]: q["holder"] is not None for q in sched.get("queues", [])}
    return Vitals(
        taken_at=v.now,
        health=tuple(v.health),
        workers_by_state=by_state,
        desired=v.target,
        running=v.live,
        ready=sum(by_state[str(s)] for s in WORKING),
        jobs_ok=v.jobs[0],
        jobs_failed=v.jobs[1],
        spawned=v.totals["spawned"],
        failed_by_herder=v.totals["failed_by_herder"],
        requeued_by=dict.fromkeys(REQUEUE_REASONS, 0) | v.requeued_by,
        killed_by=dict.fromkeys(KILL_REASONS, 0) | v.killed_by,
        recycled_by=dict.fromkeys(RECYCLE_REASONS, 0) | v.totals["recycled"],
        master_restarts=v.master_restarts,
        budgets_left=dict(v.budgets_left),
        queues={name: q for name, q in v.queues.items() if q is not None},  # unread: no sample yet
        loop_lag=v.loop_lag,
        job_rate=v.job_rate,
        pools=pools,
        memory_pressure=v.memory_pressure,
        scheduler_locks=locks if sched.get("read_age") is not None else {},
    )
