"""/metrics: the newest HostSnapshot (views/model.py) in Prometheus' form, built with
prometheus-client's metric families (never by hand). docs/monitoring.md lists every metric."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from herder.supervisor.views.model import ADVICE_KINDS, HostSnapshot, PoolRow

# Every label value a counter can take, shown from the start at 0 (so rate() works at once).
KILL_REASONS = ("silent", "no_ready", "no_progress", "stdout_closed", "stop_timeout", "job_timeout",
                "memory_hard", "hurried_stop", "oom")  # fmt: skip  # oom: the kernel's, not herder's
REQUEUE_REASONS = ("killed", "died", "swept")
# Every kind of health problem (health.py, and the snapshot's loop_stalled): each shown, 0 while
# it does not hold, so an alert on one kind has a series to watch.
HEALTH_KINDS = ("kill_budget_spent", "cull_budget_spent", "starting", "stopping", "below_minimum",
                "redis_unreachable", "loop_lagging", "loop_stalled")  # fmt: skip
RECYCLE_REASONS = ("culled", "recycled after max jobs", "recycled after max age", "recycled after max memory",
                   "killed over hard memory limit")  # fmt: skip
# The counters by (reason, pool) and by pool: each a pool row's field.
BY_REASON = (
    ("requeued_by", REQUEUE_REASONS, "herder_requeues", "Jobs put back on their queue, by why."),
    ("killed_by", KILL_REASONS, "herder_kills", "Workers herder killed, by why."),
    ("recycled_by", RECYCLE_REASONS, "herder_recycles", "Planned recycles and culls, by why."),
)
PER_POOL = (
    ("failed_by_herder", "herder_jobs_failed_by_herder", "Jobs failed past --max-requeues."),
    (
        "died",
        "herder_workers_died",
        "Worker exits herder did not ask for: crashes, os._exit, kills from outside, OOM kills.",
    ),
)


class SnapshotCollector:
    """A prometheus-client collector over the newest HostSnapshot (`current` returns it)."""

    def __init__(self, current: Callable[[], HostSnapshot | None], clock: Callable[[], float]) -> None:
        self.current = current
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        v: HostSnapshot | None = self.current()
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
        pools = v.pools  # every pool, the one `default` too
        g = GaugeMetricFamily("herder_workers", "Worker processes by state.", labels=["state", "pool"])
        for p in pools:
            for state, n in sorted(p.by_state.items()):
                g.add_metric([state, p.name], n)
        yield g
        for metric, key, text in (
            ("herder_workers_desired", "target", "The target worker count on this host."),
            (
                "herder_workers_wanted",
                "demand",
                "Workers the pool's queues call for across the cluster, before this host's bounds.",
            ),
            (
                "herder_workers_max",
                "ceiling",
                "The most workers this host runs for the pool (max_workers or its size).",
            ),
            ("herder_workers_running", "running", "Workers counting towards the target."),
            ("herder_workers_ready", "ready", "Workers idle or busy (taking jobs)."),
        ):
            g = GaugeMetricFamily(metric, text, labels=["pool"])
            for p in pools:
                g.add_metric([p.name], getattr(p, key))
            yield g
        c = CounterMetricFamily(
            "herder_jobs", "Jobs finished by herder's workers.", labels=["outcome", "pool"]
        )
        for p in pools:
            c.add_metric(["ok", p.name], p.jobs_ok)
            c.add_metric(["failed", p.name], p.jobs_failed)
        yield c
        yield _counter("herder_workers_spawned", "Workers spawned.", v.totals.get("spawned", 0))
        for field, reasons, name, doc in BY_REASON:
            yield _by_reason(pools, field, reasons, name, doc)
        for field, name, doc in PER_POOL:
            yield _per_pool(pools, field, name, doc)
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
        for q in sorted(v.queues, key=lambda q: q.name):
            if q.backlog is None:  # not read yet: no sample
                continue
            length.add_metric([q.name], q.backlog)
            running.add_metric([q.name], q.running or 0)
            growth.add_metric([q.name], q.growth or 0.0)
            oldest.add_metric([q.name], q.oldest_age or 0.0)
        yield from (length, running, growth, oldest)
        g = GaugeMetricFamily(
            "herder_queue_info", "1 for each queue, naming the pool that serves it.", labels=["queue", "pool"]
        )
        for p in pools:
            for queue in p.queues:
                g.add_metric([queue, p.name], 1)
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
        g = GaugeMetricFamily(
            "herder_advice",
            "1 for each piece of advice that asks for a change in a pool (herder advise says which); "
            "0 with reason none for a kind that asks for none.",
            labels=["pool", "kind", "reason"],
        )
        for p in pools:
            for kind in ADVICE_KINDS:  # a steady set of series: each pool's kinds, advised or not
                said = [a.reason for a in v.advice if a.pool == p.name and a.kind == kind and a.change]
                for reason in said or ["none"]:
                    g.add_metric([p.name, kind, reason], 1 if said else 0)
        yield g


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _per_pool(pools: tuple[PoolRow, ...], field: str, name: str, doc: str) -> CounterMetricFamily:
    """A counter by pool: each pool row's `field`."""
    c = CounterMetricFamily(name, doc, labels=["pool"])
    for p in pools:
        c.add_metric([p.name], getattr(p, field))
    return c


def _by_reason(
    pools: tuple[PoolRow, ...], field: str, reasons: tuple[str, ...], name: str, doc: str
) -> CounterMetricFamily:
    """A counter by (reason, pool) from each pool row's `field`, every one of `reasons` shown
    from the start at 0."""
    c = CounterMetricFamily(name, doc, labels=["reason", "pool"])
    for p in pools:
        for reason, n in sorted((dict.fromkeys(reasons, 0) | getattr(p, field)).items()):
            c.add_metric([reason, p.name], n)
    return c


def registry_for(collector: SnapshotCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]  # a Collector by duck typing
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
