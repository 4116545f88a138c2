"""A taken job's path through herder's worker: its start (fenced, tried again on a reset), its
run, its finish (fenced too) and its `done`, each RQ's own step, or the fast path's where it
changes one. Part of HerderMixin (worker/rq_worker.py, whose story names each step in order)."""

from __future__ import annotations

import sys
import time

from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.job import Job, JobStatus
from rq.queue import Queue

from herder.common import rq_seam
from herder.common.redis_connect import RETRIES
from herder.worker.base import HerderBase, JobStopped
from herder.worker.fence import FencedConnection, StartRefused, finish_fenced_off


class JobPath(HerderBase):
    """RQ's per-job steps, as herder's worker takes them (see the module doc)."""

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
