"""How herder's worker takes its jobs: RQ's blocking dequeue cut into one-interval slices, so the
loop heartbeats and sees the master's requests (stop, pause, an ending, the jobs limit) between
them, and RQ's maintenance between jobs. Part of HerderMixin (worker/rq_worker.py).

`busy` goes out the moment the dequeue returns, before RQ's own bookkeeping, so the
master knows the job from the instant it left the queue (docs/protocol.md).
"""

from __future__ import annotations

import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from rq.exceptions import StopRequested
from rq.job import Job
from rq.queue import Queue

from herder.common.worker_protocol import RETIRING
from herder.worker.abandoned import end_abandoned
from herder.worker.base import HerderBase, RedisAway, Woken
from herder.worker.fence import Fence


class Dequeue(HerderBase):
    """RQ's dequeue, maintenance and teardown, as herder's worker runs them (see the module doc)."""

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

    def dequeue_slice(self) -> float:
        """How long one blocking dequeue waits: a heartbeat interval, so an idle worker says
        `idle`, renews RQ's heartbeat and looks at RQ's suspension that often, and no more (at
        256 idle workers, more often would be a core's worth of Redis calls). A request from
        the master (stop, pause, end) ends the wait at once (wake_dequeue); where Redis denies
        that, the slice's end does. Redis 6 takes fractions of a second; before it, whole seconds."""
        if self.get_redis_server_version() >= (6, 0, 0):
            return self.channel.heartbeat_interval
        return max(1, int(self.channel.heartbeat_interval))

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

    def reorder_queues(self, reference_queue: Queue) -> None:
        """RQ calls it once its dequeue has taken a job: from here a failed heartbeat must not
        leave the loop, or the job would wait in RQ's intermediate list."""
        self._dequeuing = False
        if self._idle_said:  # a job taken (by RQ's dequeue or the fast path's script)
            self._idle_said = False
        super().reorder_queues(reference_queue=reference_queue)

    def run_maintenance_tasks(self) -> None:
        """RQ's registry clean-up; one that fails for want of Redis is tried at the next turn.
        A finish the fast path holds goes out first."""
        if self.fast is not None:
            self.fast.flush()
        try:
            super().run_maintenance_tasks()
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self.redis_away(exc)

    def teardown(self) -> None:
        """RQ's, after the fast path's held finish is out and its script connection released."""
        fast = self.fast
        if fast is None:
            return super().teardown()
        try:
            fast.close()
        finally:
            super().teardown()


def function_name(job: Job) -> str:
    """The job's function as RQ names it (`module.func`); `?` when its data cannot be read
    (RQ fails such a job itself, with the reason)."""
    try:
        return job.func_name
    except Exception:
        return "?"
