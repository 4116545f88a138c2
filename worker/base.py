"""What the three parts of herder's RQ worker share (worker/rq_worker.py tells how they fit):
the worker's state between its RQ methods, the exceptions that carry a step out of RQ's loop,
and what the overrides ask of the fast path. No RQ method is overridden here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rq.job import Job
from rq.queue import Queue
from rq.worker import BaseWorker

from herder.worker.channel import Channel
from herder.worker.fence import Fence


class JobStopped(BaseException):  # not an Exception: a job's `except Exception` cannot keep it
    """Raised in the running job by RQ's send_stop_job_command; RQ marks the job stopped."""


class Woken(Exception):  # noqa: N818 - a state, not a mistake
    """A request from the master woke the blocking dequeue: out of RQ's dequeue loop (which
    would block again for the rest of its idle time) to herder's, which looks at the request."""


class RedisAway(Exception):  # noqa: N818 - a state, not a mistake
    """Redis failed a call of RQ's dequeue loop: out to herder's own wait for Redis, which
    watches the master. RQ's retry sleeps up to a minute between tries and never looks, so an
    orphan waiting there would outlive its master for as long as Redis stays away."""


class FastStart(Protocol):
    def prepare_execution(self, job: Job) -> Any: ...
    def prepare_job_execution(self, job: Job) -> bool: ...


class FastFinish(Protocol):
    pending: Any  # the finish held for the next round trip (its `after`: writes that go with it)
    job_beat: Any

    def can_defer(self, job: Job, return_value: Any) -> bool: ...
    def finalize_success(
        self, job: Job, queue: Queue, execution: Any, return_value: Any, rq_finalize: Callable[..., None]
    ) -> None: ...
    def ended(self, job: Job, heartbeat_ttl: int) -> bool: ...
    def handle_job_success(self, *args: Any, **kwargs: Any) -> bool: ...
    def hold_done(self, job_id: str, ok: bool) -> bool: ...


class FastSteps(Protocol):
    """What the overrides ask of the fast path (herder.worker.fast_path.worker.FastPath,
    whose module follows one job through them), so that neither module imports the other."""

    start: FastStart
    finish: FastFinish

    def take_next(self, timeout: int | None) -> tuple[Job, Queue] | None: ...
    def flush(self, take: bool = False) -> tuple[Job, Queue] | None: ...
    def close(self) -> None: ...


class HerderBase(BaseWorker):
    """The state herder's parts (Presence, Dequeue, JobPath) read and write between RQ's calls."""

    channel: Channel
    # The fast path (herder.worker.fast_path.worker: HerderFastWorker), which the overrides ask
    # first where it changes RQ's step; None on RQ's own path (a user's class, rq 2, the flag).
    fast: FastSteps | None = None
    # One log line less per job: the result TTL is the same for every job and says little.
    log_result_lifespan = False
    # While Redis is unreachable RQ retries inside its dequeue loop; herder's heartbeat
    # rides on those retries (see heartbeat()), so they must come at least that often.
    max_connection_wait_time = 1.0
    _performing: str | None = None  # the job whose own code is running now
    _rq_beat_at = float("-inf")  # monotonic time of the last plain heartbeat() sent to RQ
    lease_quiet = False  # while the fast path records RQ's start: the lease rides apart
    # The job herder's dequeue took last, and what its start and finish are fenced on
    # (herder.worker.fence); None before the first.
    _fence: Fence | None = None
    _fenced_off: str | None = None  # the job whose start or finish the fence refused

    nice_when_ready = 0  # the increment on its niceness to take once registered (--worker-nice)
    # The thread it runs in, when it is one of a threaded worker's (worker/threads.py): its job's
    # timeout and a stop request are raised in that thread, not by a signal to the process.
    thread_ident: int | None = None

    _idle_said = False  # `idle` is RQ's state in Redis, written by this worker's dequeue wait
    _dequeuing = False  # in RQ's dequeue loop and no job taken yet (see RedisAway)
    _woken = False  # a request woke the dequeue (wake_dequeue): leave RQ's loop at its next turn
