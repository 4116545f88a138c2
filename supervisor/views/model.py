"""The host as `herder status`, /healthz, /metrics and the dashboard see it: frozen, typed,
plain data. The loop builds one (views/build.py, the one builder) and publishes it whole;
readers on other threads only read it, and every view is a renderer of it.

The dashboard's JSON (supervisor/views/API.md's contract) is the fields not marked VIEW_ONLY,
under the same names but those WIRE_NAMES renames; the VIEW_ONLY fields are what status and
/metrics need beside them.

A worker count has one name per meaning here as in the loop: `floor` and `ceiling` (a pool's
bounds, in worker processes on this host), `target` (how many the loop keeps), `demand` (what
the queues call for before any bound). The wire keeps the names its readers know: WIRE_NAMES."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from herder.supervisor.children.states import MasterPhase  # the snapshot's `state`: renderers read it here

STALE_AFTER = 5.0  # seconds without a new snapshot: the loop is stalled (it passes every 0.25 s)
VIEW_ONLY = {"json": False}  # a field's metadata: kept out of the dashboard's JSON
# The one map from the loop's words to the wire's (the dashboard's JSON, status, /metrics).
WIRE_NAMES = {"floor": "min", "ceiling": "max", "target": "desired", "demand": "wanted"}


def view_only(default: Any = None, factory: Any = None) -> Any:
    """A field status or /metrics reads that the dashboard's JSON leaves out."""
    if factory is not None:
        return field(default_factory=factory, metadata=VIEW_ONLY)
    return field(default=default, metadata=VIEW_ONLY)


# What an event says happened (API.md, EVENT's `kind`).
EVENT_KINDS = (
    "died",  # a death herder did not ask for, and its cause
    "killed",  # a kill by herder, and its reason
    "oom",  # the kernel's OOM killer took a worker
    "culled",
    "recycled",
    "restart",  # a rolling restart
    "reload",
    "scale",  # an operator's scale command, or the autoscaler changing a pool's target
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
    # What it said it waits for before it can work (`wait`: "Redis at host:6379: connection
    # refused") and for how many seconds; None while it waits for nothing.
    waiting_for: str | None = None
    waiting_seconds: float | None = None
    last_done: float | None = view_only()  # wall clock of its last finished job
    malformed: int = view_only(0)  # protocol lines it sent that herder could not read
    paused: str | None = view_only()  # what it said of a pause (`suspended`, ...)
    heard_from: bool = view_only(False)  # a protocol line since its spawn
    jobs_limit: int | None = view_only()  # the most jobs it takes: max_jobs plus its jitter draw
    retiring: str | None = view_only()  # why it is being replaced (a recycle, a cull), as a sentence


@dataclass(frozen=True, slots=True)
class PoolRow:
    name: str
    state: str  # running, paused, starting, stopping
    autoscale: bool
    floor: int
    ceiling: int
    demand: int  # what the pool's queues call for across the cluster, before this host's bounds
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
    target: int = view_only(0)  # this host's target for the pool
    ready: int = view_only(0)  # idle or busy
    by_state: dict[str, int] = view_only(factory=dict)  # every worker state but exited
    scaled: dict[str, int] = view_only(factory=dict)  # `herder scale`'s bounds over the file's
    threads: int = view_only(1)  # jobs each of its workers runs at once
    cluster_max: int | None = view_only()
    cluster_grant: int | None = view_only()
    paused: bool = view_only(False)
    draining: bool = view_only(False)
    generation: int = view_only(0)
    killed_by: dict[str, int] = view_only(factory=dict)
    requeued_by: dict[str, int] = view_only(factory=dict)
    recycled_by: dict[str, int] = view_only(factory=dict)
    failed_by_herder: int = view_only(0)
    died: int = view_only(0)  # exits herder did not ask for


@dataclass(frozen=True, slots=True)
class QueueRow:
    """One queue in force; the figures None until the load reader has read it."""

    name: str
    pool: str
    backlog: int | None
    running: int | None
    growth: float | None  # jobs/s, smoothed as the scaling policy smooths it
    oldest_age: float | None  # seconds its oldest waiting job has waited


@dataclass(frozen=True, slots=True)
class SchedulerRow:
    pid: int | None
    state: str
    where: str


# Where RQ's scheduler runs, as its keeper (scheduler.py) reads it: typed once there, shown by
# status as it is (`SchedulerStatus.to_json`), summed up as a SchedulerRow by the builder.


@dataclass(frozen=True, slots=True)
class LockHolder:
    """The RQ scheduler process holding a lock, on any host, as Redis names it."""

    name: str
    host_id: str  # "" if it is not herder's
    hostname: str
    pid: int | None
    here: bool  # this host's own scheduler process


@dataclass(frozen=True, slots=True)
class QueueLock:
    name: str  # the queue
    holder: LockHolder | None  # None: nobody holds it (or not read yet: read_age None)


@dataclass(frozen=True, slots=True)
class CronStatus:
    enabled: bool
    config: str | None
    holder: LockHolder | None


@dataclass(frozen=True, slots=True)
class SchedulerStatus:
    enabled: bool
    state: str  # its process's state, or off, backoff, starting
    pid: int | None
    name: str | None
    uptime: float | None
    spawned: int
    holds: tuple[str, ...]  # the queues whose lock this host's process holds
    queues: tuple[QueueLock, ...]
    read_age: float | None  # seconds since the locks were read; None: not yet
    cron: CronStatus

    def to_json(self) -> dict[str, Any]:
        """As `herder status` shows it."""
        out: dict[str, Any] = _json(self)
        return out


@dataclass(frozen=True, slots=True)
class Health:
    ok: bool
    reasons: tuple[str, ...]
    problems: tuple[tuple[str, str], ...] = view_only(())  # (kind, reason): herder.supervisor.views.health


@dataclass(frozen=True, slots=True)
class HostSnapshot:
    host_id: str
    hostname: str
    time: float  # wall clock
    taken_at: float  # monotonic, when the loop took it (not in the JSON)
    state: MasterPhase  # the master's: starting, running, stopping
    health: Health
    controls: bool  # an operator configured a token
    pools: tuple[PoolRow, ...]
    workers: tuple[WorkerRow, ...]
    scheduler: SchedulerRow | None
    events: tuple[Event, ...]  # newest first
    # What status and /metrics read beside the dashboard's fields (the host's figures).
    started_at: float = view_only(0.0)  # wall clock the master started
    redis_url: str | None = view_only()  # password redacted
    autoscale: bool = view_only(False)
    floor: int = view_only(0)
    ceiling: int = view_only(0)
    workers_limit: int = view_only(0)
    workers_limit_reason: str = view_only("")
    cluster_max: int | None = view_only()
    cluster_grant: int | None = view_only()  # the pools' cluster grants summed; None: none
    target: int = view_only(0)
    actual: int = view_only(0)  # workers counting towards the target
    ready: int = view_only(0)  # workers idle or busy
    paused: bool = view_only(False)
    backoff: tuple[int, ...] = view_only(())  # slots waiting out a backoff
    queues: tuple[QueueRow, ...] = view_only(())  # in force, in priority order
    totals: dict[str, Any] = view_only(factory=dict)  # spawned, killed, requeued, ...
    settings: dict[str, Any] = view_only(factory=dict)  # every setting in force, secrets redacted
    scheduler_status: SchedulerStatus | None = view_only()  # scheduler.py's, as status shows it
    scheduler_locks: dict[str, bool] = view_only(factory=dict)  # queue -> some scheduler holds it; {}: unread
    jobs_ok: int = view_only(0)
    jobs_failed: int = view_only(0)
    killed_by: dict[str, int] = view_only(factory=dict)
    requeued_by: dict[str, int] = view_only(factory=dict)
    master_restarts: int = view_only(0)
    budgets_left: dict[str, float] = view_only(factory=dict)  # kill, cull: this host's view
    loop_lag: float = view_only(0.0)  # seconds the loop's last pass came late
    job_rate: float | None = view_only()  # learned jobs/s of one busy worker
    memory_pressure: str = view_only("")  # why scale-up is held, or ""; said, never degrading

    def problems(self, now: float) -> list[tuple[str, str]]:
        """Health as of `now` (monotonic): the loop's reasons, and the loop itself if it stopped
        publishing (/healthz and herder_healthy)."""
        stale = now - self.taken_at
        if stale > STALE_AFTER:
            return [
                ("loop_stalled", f"master loop stalled: no pass for {stale:.0f} s"),
                *self.health.problems,
            ]
        return list(self.health.problems)

    def to_json(self) -> dict[str, Any]:
        """The dashboard's JSON (API.md): every field but taken_at and the VIEW_ONLY ones."""
        out = _json(self)
        del out["taken_at"]
        return out


def _json(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {
            WIRE_NAMES.get(f.name, f.name): _json(getattr(value, f.name))
            for f in fields(value)
            if f.metadata.get("json", True)
        }
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    return value


def event_json(e: Event) -> dict[str, Any]:
    return _json(e)
