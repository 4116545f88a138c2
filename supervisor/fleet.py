"""The master's records of its fleet: a Worker (one process and what the master decided
about it) and a Slot (a place in the fleet that outlives its workers and backs off when
they keep dying young). Plain data and pure rules; only the reconcile loop changes them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from herder.common.config import Config
from herder.supervisor.states import WorkerState
from herder.supervisor.workerproc import Observations


class ProcessHandle(Protocol):
    """What the master needs of a worker process (herder.supervisor.workerproc has the real
    one; unit tests use a fake)."""

    @property
    def pid(self) -> int: ...

    def snapshot(self) -> Observations: ...

    def send_stop(self) -> None: ...

    def signal_group(self, sig: int) -> None: ...

    def has_exited(self) -> bool: ...

    def reap(self) -> int: ...


@dataclass
class Worker:
    slot: int
    proc: ProcessHandle
    spawned_at: float  # monotonic
    generation: int = 0  # a rolling restart replaces every worker of an older generation
    state: WorkerState = WorkerState.STARTING
    stop_sent_at: float | None = None
    kill_started_at: float | None = None
    kill_reason: str = ""
    sigkilled: bool = False
    spared: bool = False  # judged hung, but the kill budget was spent
    # Retirement (herder.supervisor.retirement): replaced first, then sent `stop`.
    retire_reason: str = ""  # why: a planned recycle, or a cull
    jobs_limit: int | None = None  # max_jobs plus this worker's jitter
    age_limit: float | None = None  # max_age plus this worker's jitter
    failed_seen: int = 0  # its failed jobs already timed into `failures`
    failures: deque[float] = field(default_factory=lambda: deque(maxlen=256))  # when (monotonic)
    cull: str = ""  # "", "asked" (a cull token is on its way) or "denied"
    cull_ticket: int = 0
    cull_asked_at: float = 0.0
    rss: float | None = None  # MB, its last reading (only with max_memory)
    rss_checked_at: float = float("-inf")

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Slot:
    index: int
    young_deaths: int = 0
    next_spawn_at: float = 0.0  # monotonic; later than now while the slot backs off

    def in_backoff(self, now: float) -> bool:
        return self.next_spawn_at > now

    def lived(self, now: float) -> None:
        """A worker left gracefully or lived long enough: spawn again at once."""
        self.young_deaths = 0
        self.next_spawn_at = now

    def died_young(self, now: float, cfg: Config) -> float:
        """Back off: 0.1 s, 0.2 s, 0.4 s ... capped. Returns the delay."""
        self.young_deaths += 1
        delay = min(cfg.backoff_max, cfg.backoff_initial * 2 ** (self.young_deaths - 1))
        self.next_spawn_at = now + delay
        return delay


def died_young(graceful: bool, was_ready: bool, lived: float, cfg: Config) -> bool:
    """Before `ready` (a failed start, however long it took), or soon after it."""
    return not graceful and not (was_ready and lived >= cfg.min_uptime)
