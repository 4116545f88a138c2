"""A job herder gave up on ends as RQ ends an abandoned job, in a worker (never the master).

herder requeues the job a dead or killed worker held, up to `max_requeues` times; past that
its master's recovery thread takes it out of RQ's registries and leaves it in
herder.common.rq_names.ENDINGS_KEY with the reason, and the master asks an idle worker
(`end <job-id>` on its stdin) to end it. The worker does what RQ's own clean-up of an
abandoned job does (StartedJobRegistry.cleanup), with the worker's own options (job and
queue class, serializer, exception handlers):

1. the job's failure callback, under RQ's callback timeout, with an exception whose type says
   why herder gave up (below);
2. the worker's exception handlers (`--exception-handler`), with the same exception;
3. `Retry`: with retries left the job is retried (after its interval, through RQ's
   scheduler); otherwise it is failed: FailedJobRegistry and a failure Result with herder's
   reason, its dependents enqueued if they allow failures, and its FAILED webhooks sent;
4. its rate-limit slot freed (RQ's release_slot), so the next job of its key can run.

The ending runs once per give-up: a worker claims it (a key naming the worker, whose lease
proves it alive), and its last write removes the ending and the claim together. A worker
that dies mid-ending leaves a claim whose lease lapses; the next worker the master asks
takes it over, so an ending may run twice, never zero times.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from rq.exceptions import AbandonedJobError, NoSuchJobError
from rq.job import JobStatus

from herder.common import rq_seam
from herder.common.rq_names import ENDINGS_KEY, ending_claim_key, lease_key

if TYPE_CHECKING:
    from rq.worker import BaseWorker

log = logging.getLogger("herder.worker")


class HerderAbandonedJob(AbandonedJobError):
    """herder gave up on the job: its worker died or was killed while holding it, more often
    than `max_requeues` allows. A subclass of RQ's AbandonedJobError, so code that handles
    RQ's abandoned jobs handles these too; the subclass says why."""


class WorkerDied(HerderAbandonedJob):
    """The worker died running it: killed by a signal (the OOM killer's SIGKILL too), a
    segfault, os._exit."""


class WorkerKilled(HerderAbandonedJob):
    """herder killed the worker while stopping (past the stop timeout, or a hurried stop)."""


class JobHung(HerderAbandonedJob):
    """The worker went silent past its heartbeat timeout (frozen, deadlocked, swapped out), or
    its loop made no progress outside the job past the progress timeout (a Redis call that
    never returned)."""


class JobTimedOut(HerderAbandonedJob):
    """The job ran past its timeout plus herder's grace and would not stop."""


class MemoryExceeded(HerderAbandonedJob):
    """The worker passed --max-memory-hard while running it."""


class WorkerLost(HerderAbandonedJob):
    """Its worker, or that worker's whole host, vanished (found by a recovery sweep)."""


# The master's cause (a kill's kind, "died" or "swept") -> the exception the hooks see.
CAUSES: dict[str, type[HerderAbandonedJob]] = {
    "died": WorkerDied,
    "silent": JobHung,
    "no_ready": JobHung,
    "no_progress": JobHung,
    "stdout_closed": JobHung,
    "job_timeout": JobTimedOut,
    "memory_hard": MemoryExceeded,
    "stop_timeout": WorkerKilled,
    "hurried_stop": WorkerKilled,
    "swept": WorkerLost,
}

# Take the claim if it is free, ours, or its worker's lease has lapsed (that worker is dead).
# KEYS: 1 the claim; ARGV: 1 this worker's name, 2 the claim's TTL (seconds), 3 the lease prefix
CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] and redis.call('EXISTS', ARGV[3] .. holder) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', tonumber(ARGV[2]))
return 1
"""
CLAIM_TTL = 3600  # a backstop only: a dead claimant's lease lapses within seconds


def end_abandoned(worker: BaseWorker, job_id: str) -> str:
    """Run the ending of a job herder gave up on; what happened, for the log."""
    conn = worker.connection
    raw = conn.hget(ENDINGS_KEY, job_id)
    if raw is None:
        return "no ending waits (another worker ran it)"
    claim = conn.register_script(CLAIM)
    if not claim(keys=[ending_claim_key(job_id)], args=[worker.name, CLAIM_TTL, lease_key("")]):
        return "another live worker is running its ending"
    given_up = json.loads(raw)
    try:
        job = worker.job_class.fetch(job_id, connection=conn, serializer=worker.serializer)
    except NoSuchJobError:
        conn.pipeline().hdel(ENDINGS_KEY, job_id).delete(ending_claim_key(job_id)).execute()
        return "the job is gone"
    count = int(conn.hget(job.key, "herder_requeues") or 0)
    limit = given_up.get("limit", 0)
    reason = f"{given_up['why']}; requeued {max(0, count - 1)} times already (limit {limit}), so failed"
    exc_class = CAUSES.get(given_up.get("cause", ""), HerderAbandonedJob)
    exc = exc_class(reason)
    try:  # RQ's order: the callback, then the handlers; a raising callback never stops the rest
        rq_seam.failure_callback(job, worker.death_penalty_class, exc_class, exc, None)
    except Exception:
        log.exception("job %s: failure callback raised", job_id)
    try:
        rq_seam.call_exception_handlers(rq_seam.exception_handlers(worker), job, exc_class, exc, None)
    except Exception:
        log.exception("job %s: an exception handler raised", job_id)
    queue = worker.queue_class(
        job.origin, connection=conn, job_class=worker.job_class, serializer=worker.serializer
    )
    retry = bool(job.retries_left and job.retries_left > 0)
    with conn.pipeline() as pipe:
        if retry:
            job.retry(queue, pipe)
        else:
            rq_seam.record_failure(job, reason, pipe)
        pipe.hdel(ENDINGS_KEY, job_id)
        pipe.delete(ending_claim_key(job_id))
        pipe.execute()
    if not retry:
        if rq_seam.abandoned_sends_webhooks():
            job.send_webhooks(JobStatus.FAILED, exc_string=reason)
        queue.enqueue_dependents(job)
    rq_seam.release_slot(job)
    if retry:
        return f"retried ({job.retries_left} retries left): {reason}"
    return f"failed: {reason}"
