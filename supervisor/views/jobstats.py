"""Per-function job metrics: how long jobs of each function take, by queue, pool and
outcome (`herder_job_duration_seconds`, a prometheus-client Histogram).

Each worker names the queue and function of the job it takes (`busy`, protocol version 5)
and the reader times it on the worker's own clock; the loop folds what finished into the
histogram now and then. Label values come from workers, so they are bounded: a queue the
pool does not serve reads `other`, and past MAX_SERIES functions new ones read `other`,
so a buggy or hostile worker cannot grow the master's memory or a scrape without bound.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from prometheus_client import Histogram

from herder.supervisor.children.observations import FinishedJob

log = logging.getLogger("herder")

MAX_SERIES = 500  # distinct (queue, function, pool) label sets
OTHER = "other"
# From a 5 ms no-op to an hour-long report: RQ jobs span six orders of magnitude.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)


class JobStats:
    def __init__(self) -> None:
        self.histogram = Histogram(
            "herder_job_duration_seconds",
            "How long jobs took, by queue, function, pool and outcome (ok or failed).",
            labelnames=["queue", "function", "pool", "outcome"],
            buckets=BUCKETS,
            registry=None,  # the HTTP endpoint registers it beside the fleet's metrics
        )
        self._series: set[tuple[str, str, str]] = set()
        self.overflowed = 0  # jobs counted under `other` for want of room

    def fold(self, pool: str, queues: Iterable[str], done: list[FinishedJob]) -> None:
        served = set(queues)
        for job in done:
            queue = job.queue if job.queue in served else OTHER
            key = (queue, job.func, pool)
            if key not in self._series:
                if len(self._series) >= MAX_SERIES:
                    if not self.overflowed:
                        log.warning("job metrics: more than %d functions; counting the rest as %r",
                                    MAX_SERIES, OTHER)  # fmt: skip
                    self.overflowed += 1
                    key = (queue, OTHER, pool)
                self._series.add(key)
            outcome = "ok" if job.ok else "failed"
            self.histogram.labels(*key, outcome).observe(job.seconds)
