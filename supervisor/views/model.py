"""The host as the dashboard, status and metrics see it: frozen, typed, plain data. The loop
builds one (views/build.py) and publishes it whole; readers on other threads only read it.
The JSON shapes are supervisor/views/API.md's contract: field names here are its names."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# What an event says happened (API.md, EVENT's `kind`).
EVENT_KINDS = (
    "died",  # a death herder did not ask for, and its cause
    "killed",  # a kill by herder, and its reason
    "oom",  # the kernel's OOM killer took a worker
    "culled",
    "recycled",
    "restart",  # a rolling restart
    "reload",
    "scale",  # an operator's scale command, or the autoscaler changing `wanted`
    "paused",
    "resumed",
    "spawned",
    "stopped",
)


@dataclass(frozen=True, slots=True)
class Event:
    id: int  # increasing
    time: float  # wall clock
    pool: str
    kind: str
    slot: int | None
    pid: int | None
    text: str  # a person's sentence


@dataclass(frozen=True, slots=True)
class ThreadJob:
    thread: int
    job: str
    func: str | None
    elapsed: float


@dataclass(frozen=True, slots=True)
class WorkerRow:
    pool: str
    slot: int
    pid: int
    state: str
    job: str | None  # its oldest job, in a threaded worker
    func: str | None
    elapsed: float | None  # seconds that job has run
    timeout: float | None  # that job's own limit
    jobs_done: int
    jobs_failed: int
    rss: int | None  # bytes
    cpu_percent: float | None
    uptime: float
    threads: tuple[ThreadJob, ...]


@dataclass(frozen=True, slots=True)
class PoolRow:
    name: str
    state: str  # running, paused, starting, stopping
    autoscale: bool
    min: int
    max: int
    wanted: int
    running: int
    busy: int
    queue_length: int | None  # None: not read yet
    growth: float | None
    oldest_age: float | None
    jobs_per_s: float
    failed_per_s: float
    jobs_ok: int
    jobs_failed: int
    queues: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SchedulerRow:
    pid: int | None
    state: str
    where: str


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    host_id: str
    hostname: str
    time: float  # wall clock
    taken_at: float  # monotonic, when the loop took it (not in the JSON)
    state: str  # starting, running, stopping
    health: Health
    controls: bool  # an operator configured a token
    pools: tuple[PoolRow, ...]
    workers: tuple[WorkerRow, ...]
    scheduler: SchedulerRow | None
    events: tuple[Event, ...]  # newest first

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["taken_at"]
        return out


def event_json(e: Event) -> dict[str, Any]:
    return asdict(e)
