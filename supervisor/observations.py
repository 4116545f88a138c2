"""What a worker's stdout said, as the master's loop reads it: its Observations, the jobs it
finished (for the per-function metrics), and how one protocol line changes them (`record`).

The stdout reader (dispatchers.py) parses each line and records it here under the worker's
lock; the loop reads a snapshot and decides (liveness.py, fleet.py). Pure: no I/O, no threads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from herder.common.worker_protocol import Message


@dataclass
class Observations:
    """What the stdout reader saw. Written by the reader under `lock`, read by the loop."""

    last_seen: float  # monotonic time of the last valid line
    ready: bool = False
    job_id: str | None = None
    job_started: float = 0.0  # monotonic, on receipt of `busy`
    job_timeout: float | None = None
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
    paused: str | None = None  # why it takes no jobs, from its last `idle`: suspended or paused
    endings: int = 0  # given-up jobs this worker ended (`end`), which count as no job
    job_queue: str | None = None  # the running job's queue and function (`busy`, version 5)
    job_func: str | None = None
    job_started_wall: float = 0.0  # the worker's own time of `busy`
    # Since when (monotonic) its main loop has made no progress outside the job's own code, as
    # its last `beat` said (version 6); None while it progresses.
    stuck_since: float | None = None


@dataclass(frozen=True, slots=True)
class FinishedJob:
    """One job done, for the per-function job metrics (herder.supervisor.jobstats)."""

    queue: str
    func: str
    ok: bool
    seconds: float  # busy -> done, on the worker's own clock


# Finished jobs a worker's reader keeps until the loop takes them (a flood drops the oldest).
FINISHED_KEPT = 10_000


def record(o: Observations, finished: deque[FinishedJob], msg: Message, now: float) -> bool:
    """Record one parsed line (`now`: monotonic, on receipt); True if the loop should look now
    (a `ready` or a `stop`: a state to change at once, not at the next tick)."""
    o.last_seen = now
    match msg.verb:
        case "ready":
            o.ready = True
            return True
        case "beat":
            o.stuck_since = now - msg.stuck if msg.stuck > 0 else None
        case "idle":
            o.paused = msg.paused
            o.stuck_since = None
        case "busy":
            o.stuck_since = None
            o.job_id, o.job_started, o.job_timeout = msg.job_id, now, msg.timeout
            o.job_queue, o.job_func, o.job_started_wall = msg.queue, msg.func, msg.ts
            o.paused = None
        case "done" if msg.ok is None:  # an ending (`end`) is over: no job of its own
            o.endings += 1
            if o.job_id == msg.job_id:
                o.job_id = None
        case "done":
            o.stuck_since = None
            if o.job_id == msg.job_id:
                o.busy_seconds += now - o.job_started
            if msg.ok:
                o.jobs_ok += 1
            else:
                o.jobs_failed += 1
            if o.job_id == msg.job_id and o.job_queue is not None:
                seconds = max(0.0, msg.ts - o.job_started_wall)
                finished.append(FinishedJob(o.job_queue, o.job_func or "?", msg.ok, seconds))
            o.last_done_wall = msg.ts
            if o.job_id == msg.job_id:
                o.job_id = None
        case "stop":
            o.said_stop = True
            return True
    return False
