"""The fleet as plain data the loop hands over (FleetView), never the Master itself: what
`herder status` (views/status.py), the dashboard's snapshot (views/build.py), /healthz and
/metrics (metrics.py's Vitals) are built from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from herder.common.config import Config
from herder.supervisor.fleet import Worker
from herder.supervisor.observations import Observations


@dataclass(frozen=True)
class QueueStats:
    backlog: int
    running: int
    growth: float  # jobs/s, smoothed as the scaling policy smooths it
    oldest_age: float = 0.0  # seconds the oldest waiting job has waited (0: none waits)


@dataclass(frozen=True)
class FleetView:
    cfg: Config
    host_id: str
    started_at: float  # wall clock
    now: float  # monotonic
    target: int
    grant: int | None
    live: int
    stopping: bool
    health: list[tuple[str, str]]  # (kind, reason) pairs: herder.supervisor.health
    workers: list[tuple[Worker, Observations]]
    backoff: list[int]  # slots waiting out a backoff
    queues: dict[str, QueueStats | None]  # the queues in force, in priority order; None: not read yet
    totals: dict[str, int]
    settings: dict[str, Any]  # every setting as the master runs it (secrets redacted)
    scheduler: dict[str, Any] | None = None  # where RQ's scheduler runs (scheduler.py)
    jobs: tuple[int, int] = (0, 0)  # ok, failed: the fleet's since the master started
    killed_by: dict[str, int] = field(default_factory=dict)  # kills by the reason's class
    requeued_by: dict[str, int] = field(default_factory=dict)  # killed, died, swept
    master_restarts: int = 0
    budgets_left: dict[str, float] = field(default_factory=dict)  # kill, cull: this host's view
    loop_lag: float = 0.0  # seconds the loop's last pass came late
    job_rate: float | None = None  # learned jobs/s of one busy worker (autoscaling)
    paused: bool = False  # `herder pause` on this host
    ever_ready: bool = True  # the fleet was ready once: no longer `starting`
    pools: dict[str, dict[str, Any]] = field(default_factory=dict)  # by name: queues, sizing, counts
    memory_pressure: str = ""  # why scale-up is held (pressure.py), or ""

    @property
    def degraded(self) -> str:
        return "; ".join(text for _, text in self.health)
