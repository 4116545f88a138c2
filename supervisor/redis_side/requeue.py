"""Put a dead worker's job back on its queue, or fail it with a readable reason.

Called only after the worker is reaped, so it can no longer finish the job itself.
This is the at-least-once path: RQ would find the job eventually (its abandoned-job
sweep follows the job's heartbeat TTL, minutes away); herder knows at once.

Everything goes through RQ's own objects, so `rq info`, rq-dashboard and the failed
job registry show what a user of RQ expects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from redis import Redis
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.worker import Worker
from rq.worker_registration import unregister

log = logging.getLogger("herder")

REQUEUE_COUNT_META = "herder_requeues"


@dataclass(frozen=True)
class Outcome:
    action: str  # "requeued", "failed", "skipped"
    detail: str


def _drop_from_started(connection: Redis, job: Job) -> None:
    registry = StartedJobRegistry(job.origin, connection=connection)
    keys = [
        f"{job_id}:{execution_id}"
        for job_id, execution_id in registry.get_job_and_execution_ids(cleanup=False)
        if job_id == job.id
    ]
    if keys:
        connection.zrem(registry.key, *keys)


def requeue_or_fail(connection: Redis, job_id: str, reason: str, max_requeues: int) -> Outcome:
    """Requeue the job at the front of its queue, up to max_requeues; then fail it."""
    try:
        job = Job.fetch(job_id, connection=connection)
    except Exception as exc:  # NoSuchJobError, or a job whose payload cannot load
        return Outcome("skipped", f"cannot load job: {exc.__class__.__name__}")
    status = job.get_status(refresh=False)
    if status != JobStatus.STARTED:
        # It finished (its `done` line was lost with the worker) or someone else handled it.
        return Outcome("skipped", f"job is {status}, nothing to do")
    _drop_from_started(connection, job)
    count = int(job.meta.get(REQUEUE_COUNT_META, 0))
    if count < max_requeues:
        job.meta[REQUEUE_COUNT_META] = count + 1
        job.save_meta()
        Queue(job.origin, connection=connection).enqueue_job(job, at_front=True)
        return Outcome("requeued", f"requeue {count + 1} of {max_requeues}: {reason}")
    message = f"{reason}; requeued {count} times already (limit {max_requeues}), so failed"
    with connection.pipeline() as pipe:
        record_job_failure(job, message, pipe)
        pipe.execute()
    return Outcome("failed", message)


def forget_worker(connection: Redis, name: str) -> None:
    """Remove a killed worker's RQ registration so `rq info` does not list a ghost."""
    worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=connection)
    if worker is not None:
        with connection.pipeline() as pipe:
            unregister(worker, pipeline=pipe)
            pipe.delete(worker.key)
            pipe.execute()
