"""The master's records of its fleet: a Worker (one process and what the master decided
about it) and a Slot (a place in the fleet that outlives its workers and backs off when
they keep dying young). Plain data and pure rules; only the reconcile loop changes them.
A pool holds its workers and slots (pool.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from herder.common.config import Config, host_cpus
from herder.supervisor.children.observations import FinishedJob, Observations
from herder.supervisor.children.states import Cull, KillKind, KillStage, Retire, WorkerState

# Spawn pacing (figures: docs/operations.md, "Workers limit"). A spawn costs the master little
# CPU but can take long in wall time once the host is busy starting other workers (Popen waits
# for the exec), so one pass spawns a few and comes back soon for the rest: signals, control
# requests and the watchdog's heartbeat never wait behind a scale-up.
SPAWNS_PER_PASS = 4
SPAWN_SLICE = 0.1  # seconds of one pass spent spawning, at most
SPAWN_AGAIN = 0.02  # how soon the loop comes back while spawns are pending
# A new worker spends a few tenths of a second of CPU loading Python, redis and rq before it
# says a word. Dozens doing it at once only queue for the same cores (and starve the working
# ones and the master), so at most this many load at a time (the start window).
START_WINDOW = 4 * host_cpus()


class ProcessHandle(Protocol):
    """What the master needs of a worker process (herder.supervisor.children.workerproc has the real
    one; unit tests use a fake)."""

    @property
    def pid(self) -> int: ...

    def snapshot(self) -> Observations: ...

    def take_finished(self) -> list[FinishedJob]: ...

    def unread(self) -> int: ...

    def send_stop(self) -> None: ...

    def send_pause(self, paused: bool) -> None: ...

    def send_end(self, job_id: str) -> None: ...

    def send_retire(self) -> None: ...

    def signal_group(self, sig: int) -> None: ...

    def has_exited(self) -> bool: ...

    def reap(self) -> int: ...


@dataclass
class Life:
    """Where a worker is in its life: its state, and its stop and kill as herder asked them.
    Moved by lifecycle.py (and states.change_state, the one funnel of its state)."""

    state: WorkerState = WorkerState.STARTING
    stop_sent_at: float | None = None  # monotonic
    stop_reason: str = ""  # why herder sent it `stop` (its exit's event says so)
    kill_started_at: float | None = None  # monotonic: its SIGTERM
    kill_reason: str = ""  # why herder killed it, as a sentence (its kill's log line and events)
    kill_kind: KillKind | None = None  # and as a class: what the code branches on, the metrics' label
    kill_stage: KillStage = KillStage.NONE  # spared, SIGTERM sent, SIGKILL sent (states.KILL_TRANSITIONS)


@dataclass
class Limits:
    """What recycling holds about a worker: its own limits, its memory, and why it retires
    (replaced first, then sent `stop`). Moved by retirement.py."""

    jobs: int | None = None  # max_jobs plus this worker's jitter (the worker knows it too)
    age: float | None = None  # max_age plus this worker's jitter
    ready_at: float | None = None  # monotonic: when the loop first saw it ready (its job rate's start)
    rss: float | None = None  # MB, its last reading (only with max_memory)
    rss_checked_at: float = float("-inf")
    retire: Retire | None = None  # why it retires: a planned recycle, or a cull
    retire_reason: str = ""  # the same, as a sentence with its figures
    retire_sent: bool = False  # told `retire`: it takes no more jobs (past max_memory)


@dataclass
class Culling:
    """What culling holds about a worker whose jobs may keep failing. Moved by retirement.py
    (its state through states.change_cull)."""

    cull: Cull = Cull.NONE  # where culling stands (states.CULL_TRANSITIONS)
    failed_seen: int = 0  # its failed jobs already timed into `failures`
    failures: deque[float] = field(default_factory=lambda: deque(maxlen=256))  # when (monotonic)
    ticket: int = 0  # the cull token asked for, as the recovery thread answers it
    asked_at: float = 0.0  # monotonic


@dataclass
class Worker:
    """One worker process: what it is (fixed at its spawn), and one record per concern that
    moves: its life (lifecycle.py), its limits (retirement.py's recycling), its culling."""

    slot: int
    proc: ProcessHandle
    spawned_at: float  # monotonic
    generation: int = 0  # a rolling restart replaces every worker of its pool's older generations
    pool: str = "default"  # the name of the pool that holds it (herder.supervisor.policy.pool)
    title: str = ""  # what its log lines call it when it is no fleet worker ("scheduler")
    threads: int = 1  # jobs it runs at once, one per thread (its pool's `threads` at its spawn)
    rq_names: tuple[str, ...] = ()  # as it registers with RQ, one per thread (worked out once)
    life: Life = field(default_factory=Life)
    limits: Limits = field(default_factory=Limits)
    culling: Culling = field(default_factory=Culling)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def label(self) -> str:
        """What its log lines start with: `slot 3 pid 1234`, `scheduler pid 1234`."""
        return f"{self.title or f'slot {self.slot}'} pid {self.pid}"

    @property
    def killed(self) -> bool:
        """herder killed it (SIGTERM sent; herder.supervisor.children.lifecycle.kill)."""
        return self.life.kill_stage in (KillStage.TERM, KillStage.SIGKILLED)

    @property
    def spared(self) -> bool:
        """Judged hung, but the kill budget was spent: left alone (guard.py)."""
        return self.life.kill_stage == KillStage.SPARED

    @property
    def culled(self) -> bool:
        return self.culling.cull == Cull.CULLED

    @property
    def retiring(self) -> bool:
        """Marked to retire (recycled or culled): replaced, then sent `stop`."""
        return self.limits.retire is not None

    @property
    def recycling(self) -> bool:
        """A planned recycle (not a cull): no fault, no budget spent."""
        return self.limits.retire is not None and self.limits.retire != Retire.CULLED


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


def spawn_paced(free: Iterable[Slot], spawn: Callable[[Slot], None], clock: Callable[[], float]) -> bool:
    """Spawn into `free` slots, at most SPAWNS_PER_PASS of them and for at most SPAWN_SLICE
    seconds; True if some are left for the next pass."""
    began = clock()
    for n, slot in enumerate(free):
        if n >= SPAWNS_PER_PASS or clock() - began >= SPAWN_SLICE:
            return True
        spawn(slot)
    return False


def all_paused(workers: list[Worker]) -> bool:
    """Every worker says it takes no jobs (`rq suspend`, `herder pause`; one that retires is
    no pause: it is being replaced)."""
    return bool(workers) and all(w.proc.snapshot().paused in PAUSES for w in workers)


PAUSES = ("suspended", "paused")  # the reasons an idle worker gives that are a pause


def loading(workers: Iterable[Worker]) -> int:
    """Workers still loading their code: starting and not a word yet (a worker waiting for
    Redis says `idle`, so it does not hold the start window)."""
    return sum(
        w.life.state == WorkerState.STARTING and w.proc.snapshot().last_seen <= w.spawned_at for w in workers
    )


def spawn_room(room: int, workers: Callable[[], list[Worker]], limit: int) -> int:
    """How many of `room` spawns may start now: never past the workers limit (stopping workers
    count: they are still processes), and only while the start window has room (a `ready`
    wakes the loop for the next ones)."""
    if room <= 0:
        return 0  # nothing to spawn: the window is not counted (a pass over every worker)
    every = workers()  # the host's, every pool's
    return min(room, limit - len(every), START_WINDOW - loading(every))
