"""What a worker's stdout said, as the master's loop reads it: its Observations, the jobs it
finished (for the per-function metrics), and how one protocol line changes them (`record`).

The stdout reader (dispatchers.py) parses each line and records it here under the worker's
lock; the loop reads a snapshot and decides (liveness.py, fleet.py). Pure: no I/O, no threads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace

from herder.common.worker_protocol import RETIRING, Message


@dataclass(frozen=True, slots=True)
class Held:
    """A job a worker runs now, as its `busy` line said: one per thread of a threaded worker."""

    job_id: str
    started: float  # monotonic, on receipt of `busy`
    timeout: float | None = None  # the job's own limit (RQ's job.timeout); None: the worker said none
    queue: str | None = None  # its queue and function (`busy`, version 5)
    func: str | None = None
    started_wall: float = 0.0  # the worker's own time of `busy`
    # Since when (monotonic) the thread's loop has made no progress outside the job's own code,
    # as its last `beat` said (version 6); None while it progresses.
    stuck_since: float | None = None


@dataclass(frozen=True, slots=True)
class Waiting:
    """What a worker waits for before it can work (Redis, say), as its last `wait` line said."""

    what: str  # "Redis at redis.example:6379: connection refused"
    since: float  # monotonic: when its wait began, by its own count

    def reason(self, now: float) -> str:
        """A person's sentence: "waiting 12 s for Redis at ...: connection refused"."""
        return f"waiting {max(0.0, now - self.since):.0f} s for {self.what}"


@dataclass
class Observations:
    """What the stdout reader saw. Written by the reader under `lock`, read by the loop (a
    snapshot: `copy`)."""

    last_seen: float  # monotonic time of the last valid line
    ready: bool = False
    # It said `idle` or `busy` since `ready`: RQ lists it idle or busy (`ready` comes when RQ
    # has registered it, still "started"; RQ marks it idle at its first dequeue, after its
    # maintenance, and the worker says `idle` after that). A hand-over counts it serving only then.
    listed: bool = False
    jobs: dict[int, Held] = field(default_factory=dict)  # by thread (0 for a one-job worker)
    jobs_ok: int = 0
    jobs_failed: int = 0
    last_done_wall: float | None = None  # the worker's completion timestamp
    busy_seconds: float = 0.0  # summed busy->done durations, for the per-worker job rate
    said_stop: bool = False
    stdout_eof: bool = False
    eof_at: float = 0.0  # monotonic
    malformed: int = 0
    oversized: int = 0
    throttled: int = 0  # times the reader paused a flooding worker
    stderr_dropped: int = 0
    last_error: str = ""
    # Why its `ready` was refused (a protocol version the master does not know): then its
    # heartbeats do not stand for a start, and the start timeout ends it (liveness.py).
    ready_refused: str = ""
    paused: str | None = None  # why it takes no jobs, from its last `idle`: suspended, paused, retiring
    endings: int = 0  # given-up jobs this worker ended (`end`), which count as no job
    # What it waits for (`wait`, version 9) until it says ready, idle or busy again; and the
    # wait the master last logged, so a worker that keeps waiting is logged once per change.
    waiting: Waiting | None = None
    wait_logged: str | None = None

    def copy(self) -> Observations:
        """A snapshot the loop may read while the reader records on (Held is immutable).
        Field by field, not dataclasses.replace (a tenth of its cost: an idle worker's
        Observations change, and are copied, once a second, each of a big fleet's)."""
        snap = object.__new__(Observations)
        snap.__dict__.update(self.__dict__)
        snap.jobs = dict(self.jobs)
        return snap

    @property
    def oldest(self) -> Held | None:
        """The job it has run longest, None when it runs none."""
        jobs = self.jobs
        if len(jobs) < 2:  # the loop asks of every worker each pass: most run one job or none
            return next(iter(jobs.values()), None)
        return min(jobs.values(), key=lambda h: h.started)

    @property
    def job_id(self) -> str | None:
        """The job it runs (its oldest, in a threaded worker), None when idle."""
        held = self.oldest
        return held.job_id if held else None


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """One job done, for the per-function job metrics (herder.supervisor.views.jobstats) and the
    advice (herder.supervisor.views.advice)."""

    queue: str
    func: str
    ok: bool
    seconds: float  # busy -> done, on the worker's own clock
    cpu: float | None = None  # the CPU seconds it took, as its `done` said (version 10)
    runq: float | None = None  # the seconds it waited for a CPU meanwhile (version 10)


# Finished jobs a worker's reader keeps until the loop takes them (a flood drops the oldest).
FINISHED_KEPT = 10_000


def record(o: Observations, finished: deque[FinishedJob], msg: Message, now: float) -> bool:
    """Record one parsed line (`now`: monotonic, on receipt); True if the loop should look now
    (a `ready`, the first `idle` after it, a `stop`: a state to change at once, not at the
    next tick).

    A `wait` is a sign of life like `idle`: before `ready` it turns the start deadline into the
    heartbeat deadline (docs/design.md, "The network is not reliable")."""
    o.last_seen = now
    held = o.jobs.get(msg.thread)
    match msg.verb:
        case "ready":
            o.ready = True
            o.waiting = o.wait_logged = None
            return True
        case "beat" if held is not None and held.job_id == msg.job_id:
            o.jobs[msg.thread] = replace(held, stuck_since=now - msg.stuck if msg.stuck > 0 else None)
        case "idle":
            listing = o.ready and not o.listed  # a hand-over counts it serving from now on
            o.listed = o.ready
            retiring = msg.paused == RETIRING and o.paused != RETIRING
            o.paused = msg.paused
            o.waiting = None
            return retiring or listing  # retiring: it takes no more jobs, its replacement is due now
        case "wait":
            assert msg.what is not None
            o.waiting = Waiting(msg.what, now - msg.waited)
        case "busy":
            assert msg.job_id is not None
            o.listed = o.ready
            o.jobs[msg.thread] = Held(msg.job_id, now, msg.timeout, msg.queue, msg.func, msg.ts)
            o.paused = o.waiting = o.wait_logged = None
        case "done" if msg.ok is None:  # an ending (`end`) is over: no job of its own
            o.endings += 1
            if held is not None and held.job_id == msg.job_id:
                del o.jobs[msg.thread]
        case "done":
            ran = held is not None and held.job_id == msg.job_id
            if msg.ok:
                o.jobs_ok += 1
            else:
                o.jobs_failed += 1
            if ran:
                assert held is not None
                o.busy_seconds += now - held.started
                if held.queue is not None:
                    seconds = max(0.0, msg.ts - held.started_wall)
                    func = held.func or "?"
                    finished.append(FinishedJob(held.queue, func, msg.ok, seconds, msg.cpu, msg.runq))
                del o.jobs[msg.thread]
            o.last_done_wall = msg.ts
        case "stop":
            o.said_stop = True
            return True
    return False


def wait_to_log(o: Observations) -> str | None:
    """What the worker now waits for, if the master has not logged it yet (then it is marked
    logged): a wait is logged once per change of what it waits for, not once a line."""
    if o.waiting is None or o.waiting.what == o.wait_logged:
        return None
    o.wait_logged = o.waiting.what
    return o.waiting.what
