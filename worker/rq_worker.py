"""herder's RQ worker: RQ's SimpleWorker (or a user's --worker-class) that reports to the master.

With SimpleWorker, jobs run in this process, one at a time: the master is the isolation (fork per job
costs about 6x in RQ's own benchmark). Everything about a job's lifecycle (registries,
results, retries, callbacks) stays RQ's: this class only adds protocol lines, turns the
blocking dequeue into one-interval slices so the main loop can heartbeat, and keeps the
worker's lease (herder.common.rq_names) renewed, so any master can tell it is alive.

Every RQ method herder changes is overridden here, once. On herder's default worker
(HerderFastWorker) the fast path is `self.fast`, and the overrides where it changes a step ask
it first; worker/fast_path/worker.py tells one job's way through them, in order.

`busy` goes out the moment the dequeue returns, before RQ's own bookkeeping, so the
master knows the job from the instant it left the queue (docs/protocol.md).

RQ's remote commands work as RQ documents them: `send_shutdown_command` is a graceful stop
(the job finishes, the worker says `stop` and exits 0, and the master replaces it as it would
after its own `stop`), and `send_stop_job_command` stops the job in this process (JobStopped,
raised in the job's thread, the way RQ's own timeout is) so RQ marks it stopped, never
requeued, and the worker goes on to the next job.

Paused (`rq suspend` on any host, or `herder pause` on this one) it takes no new job: it is
checked before every dequeue slice, so a worker waiting on the queue notices within one
slice (0.25 s), and while paused it keeps saying `idle <ts> suspended|paused`, so the master
neither kills it nor counts it as a fault, and a `stop` ends it at once.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.command import parse_payload
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.suspension import is_suspended
from rq.worker import BaseWorker, SimpleWorker, WorkerStatus

from herder.common import rq_seam
from herder.common.redis_connect import RETRIES
from herder.common.rq_names import client_name, lease_key
from herder.common.worker_protocol import RETIRING
from herder.worker import reach
from herder.worker.abandoned import end_abandoned
from herder.worker.channel import Channel
from herder.worker.fence import Fence, FencedConnection, StartRefused, finish_fenced_off

# What an idle worker's connection is blocked in, as CLIENT LIST names it.
BLOCKING_DEQUEUES = frozenset({"blmove", "blpop", "brpoplpush", "bzpopmin"})
STOP_JOB_SIGNAL = signal.SIGUSR1  # the pubsub thread asks the main thread to stop the job


class JobStopped(BaseException):  # not an Exception: a job's `except Exception` cannot keep it
    """Raised in the running job by RQ's send_stop_job_command; RQ marks the job stopped."""


def raise_in_thread(ident: int, exc: type[BaseException]) -> None:
    """Raise `exc` in another thread of this process, at its next Python instruction (as
    RQ's TimerDeathPenalty does; a blocking C call finishes first)."""
    if ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc)) > 1:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)


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
    """What the overrides below ask of the fast path (herder.worker.fast_path.worker.FastPath,
    whose module follows one job through them), so that neither module imports the other."""

    start: FastStart
    finish: FastFinish

    def take_next(self, timeout: int | None) -> tuple[Job, Queue] | None: ...
    def flush(self, take: bool = False) -> tuple[Job, Queue] | None: ...
    def close(self) -> None: ...


class HerderMixin(BaseWorker):
    """herder's protocol on top of any RQ worker class: SimpleWorker (herder's default, the
    job in this process) or a user's class (`--worker-class`), forking ones included."""

    channel: Channel
    # The fast path (herder.worker.fast_path.worker: HerderFastWorker), which the overrides below
    # ask first where it changes RQ's step; None on RQ's own path (a user's class, rq 2, the flag).
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

    def attach(self, channel: Channel, lease_seconds: float) -> None:
        self.channel = channel
        self.lease_ttl = max(1, round(lease_seconds))
        self.lease = lease_key(self.name)
        self.lease_renewed = float("-inf")  # monotonic
        channel.on_beat = self.renew_lease  # while a job runs, from the channel's thread
        channel.on_request(self.wake_dequeue)  # the process's channel, a threaded worker's too
        process = getattr(channel, "process", channel)  # a threaded worker's: its process's
        if isinstance(process, Channel):  # what a loop stuck in a Redis call between jobs waits for
            process.stall = f"{reach.Target.of(self.connection).where}: no answer yet"

    def wake_dequeue(self) -> None:
        """A request came from the master: end this worker's blocking dequeue now, as its
        timeout would (CLIENT UNBLOCK: Redis returns nothing, or the job it already moved),
        so the loop sees the request at once, not at the end of the slice. Best effort: where
        CLIENT LIST or UNBLOCK is denied, the slice's end does it. Called on a thread of its own.
        Marked woken even when not in the dequeue yet: a request that comes between the loop's
        look at the requests and its blocking call would otherwise wait out a whole slice; RQ's
        loop's first heartbeat() leaves it instead (and a worker busy then looks once more)."""
        self._woken = True  # RQ's loop would block again for the rest of its idle time: heartbeat()
        if not self._dequeuing:
            return
        names = {self.name, client_name()}  # RQ names one of its connections; herder names every one
        for _ in range(3):  # the loop may be between two calls: a moment later it blocks
            try:
                blocked = [
                    int(c["id"])
                    for c in self.connection.client_list()
                    if c.get("name") in names and c.get("cmd") in BLOCKING_DEQUEUES
                ]
                for client_id in blocked:
                    self.connection.client_unblock(client_id)
            except RedisError:
                return
            if blocked or not (self._dequeuing and self._woken):
                return
            time.sleep(0.02)

    def renew_lease(self, pipeline=None) -> None:  # noqa: ANN001 - a redis Pipeline or None
        """The lease says this process is alive; an error here only delays it a beat.

        RQ calls heartbeat() twice per job; a SET each time was a round trip per call (about
        a tenth of a no-op job's cost). A third of the lease's life between renewals is enough.
        """
        now = time.monotonic()
        if self.lease_quiet or now - self.lease_renewed < self.lease_ttl / 3:
            return
        try:
            (pipeline or self.connection).set(self.lease, "1", ex=self.lease_ttl)
            self.lease_renewed = now
        except Exception:
            if pipeline is not None:
                raise

    def procline(self, message: str) -> None:
        """RQ retitles its process at each step of each job when setproctitle is installed (a
        herder dependency): that would rename herder's workers (ps -o comm, psutil's name())
        and cost a syscall per step. herder's worker keeps its title; `herder status` says
        what each worker is doing."""

    def _install_signal_handlers(self) -> None:
        # Graceful stop is `stop` on stdin (or EOF). A signal from herder means "now":
        # RQ's warm shutdown would let an unresponsive job run on, and its cold shutdown
        # raises SystemExit inside the job, which RQ then records as a failed job. With
        # the default action the process just ends and the master requeues the job.
        if self.thread_ident is not None:
            return  # a threaded worker's thread: the process's main thread set them (threads.py)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(STOP_JOB_SIGNAL, self._stop_job_now)

    def handle_payload(self, message) -> None:  # noqa: ANN001 - a redis pubsub message
        """RQ's remote commands, from its pubsub thread. `shutdown` would SIGINT this process
        (ending the job mid-way): here it is the graceful stop herder's `stop` is."""
        if parse_payload(message).get("command") == "shutdown":
            self.log.info(
                "Worker %s: RQ's shutdown command: finishing the current job, then exiting", self.name
            )
            self.channel.request_stop("RQ's shutdown command")
            self.wake_dequeue()  # an idle worker stops now, as RQ's does, not at its slice's end
            return
        super().handle_payload(message)

    def kill_horse(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """RQ's send_stop_job_command calls this once it has marked the job to stop. With no
        horse the job runs in this process, so its main thread is told to stop it."""
        if self.horse_pid:
            super().kill_horse(sig)  # a forking worker class: RQ's own way
        elif self.thread_ident is not None:  # one thread of a threaded worker: raised in that thread
            job_id = rq_seam.stopped_job_id(self)
            if job_id is not None and job_id == self._performing:
                raise_in_thread(self.thread_ident, JobStopped)
        else:
            os.kill(os.getpid(), STOP_JOB_SIGNAL)

    def recovered_from_me(self, job: Job, queue: Queue, execution) -> bool:  # noqa: ANN001
        """True when the finish is not this worker's to write (herder.worker.fence): RQ no longer
        has the job started under this execution and the job was recovered from this worker (its
        lease ran out while its host could not reach Redis), so it runs or ran elsewhere, whose
        outcome stands. A job whose own code deleted it is not: RQ writes its finish all the same.
        (rq 3's finishes; the fast path's success checks this inside its own script.)"""
        if execution is None:
            return False
        fence = self._fence
        moved = fence.moves if fence is not None and fence.job_id == job.id else None
        try:
            registry, member = queue.started_job_registry.key, execution.composite_key
            fenced = finish_fenced_off(self.connection, registry, member, job.key, job.id, moved)
        except (RedisConnectionError, RedisTimeoutError):
            return False  # RQ's own writes meet the same outage, and are tried again
        if not fenced:
            return False
        self._fenced_off = job.id
        self.log.warning(
            "Worker %s: job %s ran here, but its finish was not written: the job was recovered "
            "from this worker while it could not reach Redis (its lease ran out), so it runs or "
            "has run elsewhere, whose outcome stands",
            self.name, job.id,
        )  # fmt: skip
        return True

    def _finalize_success(self, job: Job, queue: Queue, execution, return_value) -> None:  # noqa: ANN001
        fast = self.fast
        if fast is not None and fast.finish.can_defer(job, return_value):  # its finish recorded, held
            rq_finalize = super()._finalize_success  # type: ignore[misc]
            return fast.finish.finalize_success(job, queue, execution, return_value, rq_finalize)
        if self.recovered_from_me(job, queue, execution):
            return None
        return super()._finalize_success(job, queue, execution, return_value)  # type: ignore[misc]

    def _finalize_failure(self, job: Job, queue: Queue, execution, exc_info) -> None:  # noqa: ANN001
        """A job ended by JobStopped is a stopped job, as RQ's forking worker ends one: its
        `on_stopped` callback runs (not `on_failure`), and RQ marks it stopped."""
        if self.fast is not None:  # a success callback raised: RQ's failure writes its own heartbeat
            self.fast.finish.job_beat = None
        if exc_info[0] is StartRefused:  # RQ's start fenced off (prepare_job_execution): nothing to end
            self.start_refused(job)
            return None
        if self.recovered_from_me(job, queue, execution):
            return None
        if exc_info[0] is not JobStopped:
            return super()._finalize_failure(job, queue, execution, exc_info)
        self.log.warning("Worker %s: job %s stopped by user", self.name, job.id)
        self.handle_execution_ended(job, queue, job.failure_callback_timeout)
        try:
            rq_seam.stopped_callback(job, self.death_penalty_class)
        except Exception:
            self.log.exception("Worker %s: stopped callback for job %s raised", self.name, job.id)
        self.handle_job_failure(
            job=job,
            exc_string="Job stopped by user (send_stop_job_command).",
            queue=queue,
            started_job_registry=queue.started_job_registry,
            execution=execution,
        )

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        """RQ's, or on the fast path for a job whose finish is recorded: its last heartbeat kept
        for the finish (fast_path/finish.py)."""
        fast = self.fast
        if fast is not None and fast.finish.ended(job, heartbeat_ttl):
            return None
        return super().handle_execution_ended(job, queue, heartbeat_ttl)

    def handle_job_success(self, *args, **kwargs) -> None:  # type: ignore[override]  # noqa: ANN002, ANN003
        """On the fast path the finish is recorded and held for the next round trip
        (fast_path/finish.py); otherwise, and where that cannot be, RQ's own, now."""
        fast = self.fast
        if fast is not None and fast.finish.handle_job_success(*args, **kwargs):
            return None
        return self.rq_handle_job_success(*args, **kwargs)

    def rq_handle_job_success(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        """RQ's finish of a job that ran well, tried again when its connection breaks (redis-py 5
        never retries a WATCH): a finished job is not failed for a reset. RQ's finish is one
        WATCH/MULTI/EXEC transaction, so a try that broke before EXEC wrote nothing; one whose
        EXEC reply was lost writes its fields again, the same values."""
        return self._tried_again(super().handle_job_success, *args, **kwargs)

    def prepare_job_execution(self, job: Job, *args, **kwargs) -> None:  # type: ignore[override]  # noqa: ANN002, ANN003
        """Nothing on the fast path when the job's start is written already (fast_path/start.py);
        otherwise RQ's own."""
        fast = self.fast
        if fast is not None and fast.start.prepare_job_execution(job):
            return None
        return self.rq_prepare_job_execution(job, *args, **kwargs)

    def rq_prepare_job_execution(self, job: Job, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        """RQ's start of a job in the horse's half (state, heartbeats, the job's fields), one
        transaction of the same values each try: tried again when its connection breaks
        (redis-py 5 never retries a transaction on a reset), so the job runs rather than fails.
        Fenced, as rq_prepare_execution."""
        return self._tried_again(self._fenced, super().prepare_job_execution, job, *args, **kwargs)

    def prepare_execution(self, job: Job):  # type: ignore[override]  # noqa: ANN201 - RQ's Execution
        """On the fast path, the job's start in one script call or already written by the take
        (fast_path/start.py); otherwise RQ's own."""
        if self.fast is not None:
            return self.fast.start.prepare_execution(job)
        return self.rq_prepare_execution(job)

    def rq_prepare_execution(self, job: Job):  # noqa: ANN201 - RQ's Execution
        """RQ's first start transaction, written only while the job is still where this worker's
        take put it, not recovered since (herder.worker.fence): StartRefused otherwise."""
        return self._fenced(super().prepare_execution, job)

    def _fenced(self, call, job: Job, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        """`call` (RQ's start) with this worker's connection fenced for `job`, the job herder's
        dequeue took. Not while the fast path records RQ's start (its script fences it)."""
        fence, real = self._fence, self.connection
        if fence is None or fence.job_id != job.id or not isinstance(real, Redis):
            return call(job, *args, **kwargs)
        self.connection = FencedConnection(real, fence)  # type: ignore[assignment]
        executions: dict = getattr(self, "executions", {})  # rq >= 3 keeps them on the worker; rq 2 does not
        before = set(executions)
        try:
            return call(job, *args, **kwargs)
        except StartRefused:
            for execution_id in set(executions) - before:  # RQ's objects of a start never written
                del executions[execution_id]
            raise
        finally:
            self.connection = real

    def held(self) -> tuple[str, int]:
        """This worker's lease key and TTL: renewed in the very call that starts a job (fence.py), so
        no job is started under a lease that lapsed while the worker could not reach Redis."""
        return self.lease, self.lease_ttl

    def claim_key(self) -> str:
        """Where RQ's dequeue puts the job it takes (RQ's rule: one queue, Redis 6.2 and later):
        the queue's intermediate list. '' for none: LPOP from several queues (a job no sweep sees,
        so none recovers), or a queue class that takes jobs its own way."""
        if self.queue_class.dequeue_any.__func__ is not Queue.dequeue_any.__func__:  # type: ignore[attr-defined]
            return ""
        if len(self.queues) == 1 and self.get_redis_server_version() >= (6, 2, 0):
            return self.queues[0].intermediate_queue_key
        return ""

    def start_refused(self, job: Job) -> None:
        """A start the fence refused: the job is dropped here, said once, and the next taken."""
        self._fenced_off = job.id
        self.log.warning(
            "Worker %s: job %s not started: it was recovered from this worker while it could not "
            "reach Redis (its take was not followed by its start in time), so it runs or has run "
            "elsewhere",
            self.name, job.id,
        )  # fmt: skip

    def _tried_again(self, call, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        for tries in range(RETRIES + 1):
            try:
                return call(*args, **kwargs)  # rq 3 passes the execution too
            except (RedisConnectionError, RedisTimeoutError):
                if tries == RETRIES:
                    raise
                self.channel.progress()
                time.sleep(0.05 * 2**tries)
        return None

    def handle_exception(self, job: Job, *exc_info) -> None:  # noqa: ANN002
        """rq 2 ends a stopped job through its failure path: as its forking worker does for a
        stopped horse, the exception handlers do not see it (rq 3 ends it in _finalize_failure).
        Nor do they see a start the fence refused (rq 2, the same path)."""
        if exc_info and exc_info[0] in (JobStopped, StartRefused):
            return
        super().handle_exception(job, *exc_info)

    def handle_job_failure(self, job: Job, *args, **kwargs) -> None:  # type: ignore[override]  # noqa: ANN002, ANN003
        """rq 2's perform_job ends a start the fence refused (its second start transaction) as a
        failure, inline: nothing is written for it (rq 3's goes to _finalize_failure)."""
        if sys.exc_info()[0] is StartRefused:
            self.start_refused(job)
            return None
        return super().handle_job_failure(job, *args, **kwargs)

    def _stop_job_now(self, signum: int, frame: object) -> None:
        job_id = rq_seam.stopped_job_id(self)
        if job_id is not None and job_id == self._performing:  # never in RQ's own bookkeeping
            raise JobStopped(f"job {job_id} stopped by RQ's send_stop_job_command")

    def teardown(self) -> None:
        """RQ's, after the fast path's held finish is out and its script connection released."""
        fast = self.fast
        if fast is None:
            return super().teardown()
        try:
            fast.close()
        finally:
            super().teardown()

    def unsubscribe(self) -> None:
        """RQ's, in an order that does not race. RQ sends UNSUBSCRIBE, then tells its pubsub
        thread to stop: when the reply wakes the thread first, it blocks for another 60 s
        and the worker's exit waits out RQ's join(timeout=1). Told first, it ends on the reply."""
        if self.pubsub_thread:
            self.pubsub_thread.stop()
            self.pubsub.unsubscribe()
            self.pubsub_thread.join(timeout=1)
            self.pubsub.close()

    def bootstrap(self, *args, **kwargs) -> None:  # type: ignore[override]
        """RQ's, tried again while Redis is away (a worker born as Redis went down waits for it,
        heartbeating, rather than exit and back its slot off)."""
        while True:
            try:
                super().bootstrap(*args, **kwargs)
                break
            except (RedisConnectionError, RedisTimeoutError) as exc:
                if self.channel.stop_reason:
                    raise StopRequested() from exc
                self.redis_away(exc)
        self.redis_back()
        if self.nice_when_ready:  # listed by RQ: from now on below the master
            os.nice(self.nice_when_ready)
            self.nice_when_ready = 0
        self.channel.ready()  # registered, and subscribed to RQ's commands

    _away_since: float | None = None  # monotonic: when Redis stopped answering this worker

    def redis_away(self, exc: Exception) -> None:
        """A Redis call outside a job failed for want of Redis: said once an outage, then a
        heartbeat and a pause before the caller tries again."""
        self._idle_said = False  # a Redis that comes back may have lost the worker's hash
        if self._away_since is None:
            self._away_since = time.monotonic()
            print(
                f"herder worker: waiting for Redis ({exc.__class__.__name__}: {exc})",
                file=sys.stderr,
                flush=True,
            )
        # What it waits for, to the master (`wait`, in place of its `idle` until Redis answers).
        target = reach.Target.of(self.connection)
        self.channel.waiting(f"{target.where}: {reach.describe(exc, target.password)}", self._away_since)
        self.channel.idle()
        self.channel.requests.wait(min(1.0, self.channel.heartbeat_interval))

    def redis_back(self) -> None:
        if self._away_since is not None:
            self.channel.waited()
            away, self._away_since = time.monotonic() - self._away_since, None
            print(f"herder worker: Redis answers again after {away:.1f} s", file=sys.stderr, flush=True)

    def run_maintenance_tasks(self) -> None:
        """RQ's registry clean-up; one that fails for want of Redis is tried at the next turn.
        A finish the fast path holds goes out first."""
        if self.fast is not None:
            self.fast.flush()
        try:
            super().run_maintenance_tasks()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self.redis_away(exc)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        fast = self.fast
        if fast is not None and fast.finish.pending is not None:  # the held finish takes the next job
            result = fast.take_next(timeout)
            if result is not None:
                return result
        limit = self.channel.limit
        if timeout is None:  # burst mode: RQ's non-blocking dequeue, once; past its limit, none
            if not limit.reserve():
                return None
            result = None
            try:
                result = super().dequeue_job_and_maintain_ttl(None, max_idle_time)
            finally:
                limit.settle(result is not None)
            return self._took(result)
        # Block for one slice at a time (RQ's max_idle_time makes its loop return None
        # after one empty BLPOP), and check for a stop request only here, before a
        # dequeue: never between popping a job and running it.
        slice_s = self.dequeue_slice()
        idle_since = time.monotonic()
        first = True
        while True:
            if self.channel.stop_reason:
                raise StopRequested()
            if not first:  # work() checked just before the first slice
                self.check_for_suspension(burst=False)
            first = False
            self.run_endings()
            if not limit.reserve():  # at its jobs limit, or told to retire: no job, ever again
                self.wait_retiring()
                continue
            self.channel.progress()
            self._dequeuing = True
            result = None
            try:
                result = super().dequeue_job_and_maintain_ttl(slice_s, max_idle_time=slice_s)
            except Woken:
                continue
            except (RedisConnectionError, RedisTimeoutError, RedisAway) as exc:  # RQ's writes, its retry
                self.redis_away(exc)
                continue
            finally:
                self._dequeuing = False
                limit.settle(result is not None)
            self.redis_back()
            if result is not None:
                return self._took(result)
            if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                return None

    def wait_retiring(self) -> None:
        """A moment of the wait for `stop` once the process takes no more jobs (its jobs limit,
        or the master's `retire`): it says so (`idle <ts> retiring`: the master replaces it,
        then sends `stop`), and RQ's heartbeat goes on. Another thread's dequeue still under
        way holds the last of a threaded worker's limit: this one waits for it, saying nothing."""
        if self.channel.stop_reason:
            raise StopRequested()
        if self.channel.limit.reached:
            self.channel.idle(paused=RETIRING)
        self.beat_redis()
        self.channel.requests.clear()
        self.channel.requests.wait(min(0.5, self.channel.heartbeat_interval / 2))  # `stop` ends it at once

    def run_endings(self) -> None:
        """Jobs herder gave up on, which the master asked this worker to end (`end`): each
        ends as RQ ends an abandoned job (herder.worker.abandoned), framed as busy ... done
        `ended`, so the master watches it like a job and counts no job for it."""
        while self.channel.endings:
            job_id = self.channel.endings.popleft()
            self.channel.busy(job_id, None)
            try:
                outcome = end_abandoned(self, job_id)
                self.log.warning("Worker %s: job %s given up by herder: %s", self.name, job_id, outcome)
            except RedisError as exc:  # the ending stays waiting: the master asks again
                self.log.warning("Worker %s: ending of job %s not done (%s)", self.name, job_id, exc)
            finally:
                self.channel.done(job_id, None)

    def dequeue_slice(self) -> float:
        """How long one blocking dequeue waits: a heartbeat interval, so an idle worker says
        `idle`, renews RQ's heartbeat and looks at RQ's suspension that often, and no more (at
        256 idle workers, more often would be a core's worth of Redis calls). A request from
        the master (stop, pause, end) ends the wait at once (wake_dequeue); where Redis denies
        that, the slice's end does. Redis 6 takes fractions of a second; before it, whole seconds."""
        if self.get_redis_server_version() >= (6, 0, 0):
            return self.channel.heartbeat_interval
        return max(1, int(self.channel.heartbeat_interval))

    def pause_reason(self) -> str | None:
        """ "paused" (herder pause), "suspended" (rq suspend) or None. A Redis that does not
        answer is no pause: the dequeue rides out the outage as it always does."""
        if self.channel.paused:
            return "paused"
        try:
            # Without the heartbeat RQ's check adds: herder's heartbeat() keeps its own pace
            # (an idle slice renewed it twice a second, a round trip each).
            return "suspended" if is_suspended(self.connection) else None
        except RedisError:
            return None

    def check_for_suspension(self, burst: bool) -> None:
        """RQ's check, made herder's: also `herder pause`; heartbeats while it waits; `stop`
        ends the wait at once (RQ's sleeps a second at a time and says nothing)."""
        fast = self.fast
        if fast is not None and fast.finish.pending is not None:
            if not self.channel.paused:
                return  # the take checks RQ's suspension in the same round trip
            fast.flush()
        why = self.pause_reason()
        if why is None:
            return
        if burst:
            raise StopRequested()
        before = self.get_state()
        self.set_state(WorkerStatus.SUSPENDED)
        self.log.info("Worker %s: %s, taking no jobs until it is resumed", self.name, why)
        while why is not None and not self._stop_requested:
            if self.channel.stop_reason:
                raise StopRequested()
            self.channel.idle(paused=why)
            self.beat_redis()  # RQ's own check heartbeats a suspended worker; so does herder's
            self.channel.requests.clear()
            self.channel.requests.wait(0.5)  # a stop or resume from the master ends it at once
            why = self.pause_reason()
        self.set_state(before)
        self.log.info("Worker %s: resumed", self.name)

    def _took(self, result: tuple[Job, Queue] | None) -> tuple[Job, Queue] | None:
        if result is not None:
            job = result[0]
            # Before any bookkeeping (see the module doc); the queue and function label its metrics.
            self.channel.busy(job.id, job.timeout, job.origin, function_name(job))
            if self._fence is None or self._fence.job_id != job.id:  # not the fast path's script's take
                self._fence = Fence(
                    job.key, job.id, None, self.claim_key(), self.held()
                )  # its moves: at its start
        return result

    def heartbeat(self, timeout: int | None = None, pipeline=None) -> None:  # type: ignore[override]
        # RQ calls this on its main loop before every dequeue attempt, including each retry
        # while Redis is down: the `idle` line goes first, so an outage does not make a
        # healthy worker look hung. Calls inside a job's bookkeeping come with a pipeline.
        fast = self.fast
        if pipeline is None and fast is not None and fast.finish.pending is not None:
            # Rides with the held finish (fast path); `idle` after `done`.
            if timeout is None and not self.rq_beat_due():
                return
            pipeline = fast.finish.pending.after
        if pipeline is None and timeout is None and self._dequeuing and self._woken:
            self._woken = False
            raise Woken()  # no job taken: back to herder's loop, which reads the request
        self.channel.progress()  # the main loop (RQ's retries while Redis is away too)
        if pipeline is None and self.get_state() != "busy":
            self.channel.idle()
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
            self.renew_lease(pipeline)  # in the same round trip as RQ's own
            return
        self.beat_redis(timeout)

    def beat_redis(self, timeout: int | None = None) -> None:
        """RQ's heartbeat and herder's lease, in one round trip (RQ's own heartbeat is three).
        Without a timeout at most twice a heartbeat interval: RQ calls heartbeat() before and
        after every dequeue, twice a job and twice an idle slice, and RQ's worker key lives
        minutes (worker_ttl)."""
        if timeout is None and not self.rq_beat_due():
            return
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout, pipe)
                self.renew_lease(pipe)
                pipe.execute()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            # Missed: the next one goes out (RQ's key lives minutes; the lease a few seconds).
            self._rq_beat_at = self.lease_renewed = float("-inf")
            if self._dequeuing:  # RQ.s dequeue loop, no job taken: wait for Redis in herder's wait
                raise RedisAway(exc) from exc

    def rq_beat_due(self) -> bool:
        """Whether RQ's heartbeat is due (at most twice a heartbeat interval); taken if so."""
        now = time.monotonic()
        if now - self._rq_beat_at < self.channel.heartbeat_interval / 2:
            return False
        self._rq_beat_at = now
        return True

    _idle_said = False  # `idle` is RQ's state in Redis, written by this worker's dequeue wait

    def set_state(self, state: str, pipeline=None) -> None:  # noqa: ANN001 - a redis Pipeline or None
        # RQ's dequeue says `idle` as each of its waits begins, and herder's waits are slices of a
        # heartbeat interval: once said, an idle worker does not say it again every slice (a
        # round trip a second; at 256 idle workers, a good part of a core).
        fast = self.fast
        if pipeline is None and fast is not None and fast.finish.pending is not None:
            pipeline = fast.finish.pending.after  # while a finish is held, written with it, in order
        if pipeline is None and self._dequeuing and state == WorkerStatus.IDLE:
            if self._idle_said and self._state == WorkerStatus.IDLE:
                return
            super().set_state(state, pipeline)
            self._idle_said = True
            return
        if self._idle_said:  # not set unless it was: RQ's start leaves no field of its own
            self._idle_said = False
        super().set_state(state, pipeline)

    _dequeuing = False  # in RQ's dequeue loop and no job taken yet (see RedisAway)
    _woken = False  # a request woke the dequeue (wake_dequeue): leave RQ's loop at its next turn

    def reorder_queues(self, reference_queue: Queue) -> None:
        """RQ calls it once its dequeue has taken a job: from here a failed heartbeat must not
        leave the loop, or the job would wait in RQ's intermediate list."""
        self._dequeuing = False
        if self._idle_said:  # a job taken (by RQ's dequeue or the fast path's script)
            self._idle_said = False
        super().reorder_queues(reference_queue=reference_queue)

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._job_ok: bool | None = None  # perform_job says, unless it ran in a forked horse
        self._fenced_off = None
        self.channel.in_job = True  # its time is the job's (a forking class's horse's too)
        try:
            super().execute_job(job, queue)
        except StartRefused:  # RQ's first start transaction (prepare_execution): dropped here
            self.start_refused(job)
        finally:
            self.channel.in_job = False
            self.channel.progress()
            ok = self._job_ok
            if self._fenced_off == job.id:  # not started, or its finish not written: no job of ours
                self.channel.done(job.id, None)
            else:
                if ok is None:  # the horse's verdict is only in Redis
                    try:
                        ok = job.get_status(refresh=True) == JobStatus.FINISHED
                    except RedisError:
                        ok = False
                # On the fast path it is held, and sent once the job's finish is in Redis.
                if self.fast is None or not self.fast.finish.hold_done(job.id, ok):
                    self.channel.done(job.id, ok)

    def perform_job(self, job: Job, queue: Queue, *execution) -> bool:  # type: ignore[override]
        """RQ's (rq 3 passes the execution, rq 2 does not), with the job's own run marked."""
        perform = job.perform

        def performing():  # noqa: ANN202 - whatever the job returns
            self._performing = job.id  # the window in which a stop request may interrupt
            try:
                return perform()
            except JobStopped:
                rq_seam.stopped_instead_of_failed(job)  # rq 2: its on_stopped, not on_failure
                raise
            finally:
                self._performing = None

        job.perform = performing  # type: ignore[method-assign]
        self._job_ok = super().perform_job(job, queue, *execution)
        return self._job_ok


class ToMaster(logging.StreamHandler):
    """RQ's two handlers in one: records below ERROR to stdout, the rest to stderr (both are
    the master's pipes). One handler, not two filtered ones: half the dispatch per line."""

    # While a thread holds it (hold(): the fast path, for RQ's two lines at a job's success, back
    # to back, nothing run between them) that thread's records below ERROR are kept, then written
    # together: one write for both (the worker's stdout is unbuffered, PYTHONUNBUFFERED, so each
    # record is otherwise a write of its own). Other threads' records are written as always.
    _holder: int | None = None

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self._held: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if (
            self._holder is not None
            and record.levelno < logging.ERROR
            and self._holder == threading.get_ident()
        ):
            try:
                self._held.append(self.format(record) + self.terminator)
            except Exception:
                self.handleError(record)
            return
        self.stream = sys.stdout if record.levelno < logging.ERROR else sys.stderr
        super().emit(record)

    def write_line(self, line: str, record: Callable[[], logging.LogRecord]) -> None:
        """A line below ERROR, formatted as format() formats its record (the fast path's INFO
        lines, herder.worker.fast_path.loglines), written as emit() writes it: held, or a write
        and a flush under the handler's lock. `record` makes the record for handleError."""
        if self._holder is not None and self._holder == threading.get_ident():
            self._held.append(line + self.terminator)
            return
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            self.stream = sys.stdout
            try:
                self.stream.write(line + self.terminator)
                self.flush()
            except RecursionError:  # as StreamHandler.emit
                raise
            except Exception:
                self.handleError(record())

    def hold(self) -> None:
        self._holder = threading.get_ident()

    def unhold(self) -> None:
        """The held records out, in one write."""
        if self._holder != threading.get_ident():
            return
        self._holder = None
        with self.lock:  # type: ignore[union-attr]  # Handler.createLock made it
            held, self._held = "".join(self._held), []
            if held:
                self.stream = sys.stdout
                try:
                    self.stream.write(held)
                    self.flush()
                except Exception:  # as logging's own emit: a broken stream never fails the worker
                    pass


_to_master: ToMaster | None = None  # the handler log_to_master installed, if it did


def held_log_lines() -> ToMaster | None:
    """herder's own log handler, to hold lines with; None under a user's logging config."""
    return _to_master


def _no_caller(*args: object, **kwargs: object) -> tuple[str, int, str, None]:
    return "(unknown file)", 0, "(unknown function)", None


def log_to_master(log_format: str) -> None:
    """RQ's own log set-up (rq.logutils.setup_loghandlers: info to stdout, errors to stderr,
    not propagated), with a plain handler. RQ's colourising one asks isatty() of its stream for
    every record, a system call per line; a worker's streams are always the master's pipes.
    herder's format names no caller, so RQ's worker logger skips looking for one (a walk up
    the stack per line). As RQ, nothing is added when a handler is already in place (a user's
    logging config), and then nothing else changes either."""
    logger = logging.getLogger("rq.worker")
    node: logging.Logger | None = logger
    while node is not None:
        if node.handlers:
            return
        node = node.parent
    global _to_master
    handler = _to_master = ToMaster()
    handler.setFormatter(logging.Formatter(fmt=log_format, datefmt=DEFAULT_LOGGING_DATE_FORMAT))
    logger.addHandler(handler)
    logger.propagate = False
    if "%(pathname)" not in log_format and "%(filename)" not in log_format and "%(lineno)" not in log_format:
        logger.findCaller = _no_caller  # type: ignore[method-assign]


def function_name(job: Job) -> str:
    """The job's function as RQ names it (`module.func`); `?` when its data cannot be read
    (RQ fails such a job itself, with the reason)."""
    try:
        return job.func_name
    except Exception:
        return "?"


def herder_worker_class(base: type[BaseWorker] = SimpleWorker) -> type[BaseWorker]:
    """herder's protocol combined with an RQ worker class (a user's `--worker-class`)."""
    if issubclass(base, HerderMixin):
        return base
    return type(f"Herder{base.__name__}", (HerderMixin, base), {})


HerderWorker = herder_worker_class(SimpleWorker)
