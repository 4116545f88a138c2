"""What /metrics and /healthz serve: Vitals, a frozen snapshot of the fleet that the
reconcile loop publishes (at most every PUBLISH_EVERY seconds), and its Prometheus form,
built with prometheus-client's metric families (never by hand).

The HTTP threads (herder.supervisor.http_endpoint) read only the newest Vitals: a scrape
never touches the fleet, never waits for the loop, and a stalled loop shows as stale
Vitals (health: "master loop stalled"). docs/monitoring.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

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
    one = {
        "default": {
            "desired": v.target,
            "actual": v.live,
            "jobs": dict(zip(("ok", "failed"), v.jobs, strict=True)),
        }
    }
    for name, pv in (v.pools or one).items():
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


class VitalsCollector:
    """A prometheus-client collector over the newest Vitals (`current` returns it)."""

    def __init__(self, current: Callable[[], Vitals | None], clock: Callable[[], float]) -> None:
        self.current = current
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        v: Vitals | None = self.current()
        if v is None:
            return
        problems = v.problems(self.clock())
        yield _gauge("herder_healthy", "1 when /healthz answers 200, else 0.", 0 if problems else 1)
        g = GaugeMetricFamily(
            "herder_health_problem",
            "1 for each reason health is degraded, 0 for the others.",
            labels=["kind"],
        )
        held = {kind for kind, _ in problems}
        for kind in (*HEALTH_KINDS, *sorted(held - set(HEALTH_KINDS))):  # a new kind shows too
            g.add_metric([kind], 1 if kind in held else 0)
        yield g
        pools = v.pools or {
            "default": {
                "by_state": v.workers_by_state,
                "desired": v.desired,
                "wanted": v.desired,
                "running": v.running,
                "ready": v.ready,
                "jobs": {"ok": v.jobs_ok, "failed": v.jobs_failed},
                "killed_by": v.killed_by,
                "requeued_by": v.requeued_by,
                "recycled_by": v.recycled_by,
                "failed_by_herder": v.failed_by_herder,
                "died": 0,
                "max": v.desired,
                "queues": list(v.queues),
            }
        }
        g = GaugeMetricFamily("herder_workers", "Worker processes by state.", labels=["state", "pool"])
        for name, pv in pools.items():
            for state, n in sorted(pv["by_state"].items()):
                g.add_metric([state, name], n)
        yield g
        for metric, key, text in (
            ("herder_workers_desired", "desired", "The target worker count on this host."),
            (
                "herder_workers_wanted",
                "wanted",
                "Workers the pool's queues call for across the cluster, before this host's bounds.",
            ),
            (
                "herder_workers_max",
                "max",
                "The most workers this host runs for the pool (max_workers or its size).",
            ),
            ("herder_workers_running", "running", "Workers counting towards the target."),
            ("herder_workers_ready", "ready", "Workers idle or busy (taking jobs)."),
        ):
            g = GaugeMetricFamily(metric, text, labels=["pool"])
            for name, pv in pools.items():
                g.add_metric([name], pv[key])
            yield g
        c = CounterMetricFamily(
            "herder_jobs", "Jobs finished by herder's workers.", labels=["outcome", "pool"]
        )
        for name, pv in pools.items():
            c.add_metric(["ok", name], pv["jobs"]["ok"])
            c.add_metric(["failed", name], pv["jobs"]["failed"])
        yield c
        yield _counter("herder_workers_spawned", "Workers spawned.", v.spawned)
        yield _by_pool(pools, "requeued_by", "herder_requeues", "Jobs put back on their queue, by why.")
        c = CounterMetricFamily(
            "herder_jobs_failed_by_herder", "Jobs failed past --max-requeues.", labels=["pool"]
        )
        for name, pv in pools.items():
            c.add_metric([name], pv["failed_by_herder"])
        yield c
        yield _by_pool(pools, "killed_by", "herder_kills", "Workers herder killed, by why.")
        c = CounterMetricFamily(
            "herder_workers_died",
            "Worker exits herder did not ask for: crashes, os._exit, kills from outside, OOM kills.",
            labels=["pool"],
        )
        for name, pv in pools.items():
            c.add_metric([name], pv["died"])
        yield c
        yield _by_pool(pools, "recycled_by", "herder_recycles", "Planned recycles and culls, by why.")
        yield _counter(
            "herder_master_restarts", "Times the watchdog restarted the master.", v.master_restarts
        )
        g = GaugeMetricFamily(
            "herder_budget_remaining",
            "Tokens left in a self-defense budget (this host's view).",
            labels=["budget"],
        )
        for budget, left in sorted(v.budgets_left.items()):
            g.add_metric([budget], left)
        yield g
        length = GaugeMetricFamily("herder_queue_length", "Jobs waiting in the queue.", labels=["queue"])
        running = GaugeMetricFamily("herder_queue_running", "Jobs of the queue running.", labels=["queue"])
        growth = GaugeMetricFamily(
            "herder_queue_growth",
            "Queue growth in jobs/s, as the scaling policy smooths it.",
            labels=["queue"],
        )
        oldest = GaugeMetricFamily(
            "herder_queue_oldest_job_age_seconds",
            "How long the queue's oldest waiting job has waited (0: none waits).",
            labels=["queue"],
        )
        for name, q in sorted(v.queues.items()):
            length.add_metric([name], q.backlog)
            running.add_metric([name], q.running)
            growth.add_metric([name], q.growth)
            oldest.add_metric([name], q.oldest_age)
        yield from (length, running, growth, oldest)
        g = GaugeMetricFamily(
            "herder_queue_info", "1 for each queue, naming the pool that serves it.", labels=["queue", "pool"]
        )
        for name, pv in pools.items():
            for queue in pv["queues"]:
                g.add_metric([queue, name], 1)
        yield g
        g = GaugeMetricFamily(
            "herder_scheduler_lock_held",
            "1 while some RQ scheduler (on any host) holds the queue's scheduler lock, else 0.",
            labels=["queue"],
        )
        for queue, held in sorted(v.scheduler_locks.items()):
            g.add_metric([queue], 1 if held else 0)
        yield g
        yield _gauge(
            "herder_master_loop_lag_seconds", "How late the master loop's last pass came.", v.loop_lag
        )
        yield _gauge(
            "herder_memory_pressure",
            "1 while the cgroup's memory is near its limit and scale-up is held.",
            1 if v.memory_pressure else 0,
        )
        if v.job_rate is not None:
            yield _gauge("herder_job_rate", "Learned jobs per second of one busy worker.", v.job_rate)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _by_pool(pools: dict[str, dict[str, Any]], key: str, name: str, doc: str) -> CounterMetricFamily:
    """A counter by (reason, pool) from each pool's `key` dict."""
    c = CounterMetricFamily(name, doc, labels=["reason", "pool"])
    for pool, pv in pools.items():
        for reason, n in sorted(pv[key].items()):
            c.add_metric([reason, pool], n)
    return c


def registry_for(collector: VitalsCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]  # a Collector by duck typing
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
