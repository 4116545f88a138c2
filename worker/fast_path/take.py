"""The next job, taken by the finish's script as RQ's dequeue takes it, made from its hash.

`Take` keeps the take's arguments (made again only when the queues' order changes) and what
the worker learnt about RQ's restore of a taken job, a `Learned` (learned.py): READY, a
`FastRestore` (restore.py) makes each job; REFUSED, RQ's `Job.restore` does.
"""

from __future__ import annotations

import logging
from typing import Any

from rq.job import Job
from rq.logutils import blue, green
from rq.queue import Queue
from rq.suspension import WORKERS_SUSPENDED
from rq.utils import get_version

from herder.common import rq_seam
from herder.worker.fast_path import loglines, restore
from herder.worker.fast_path.learned import Learned
from herder.worker.fast_path.restore import FastRestore
from herder.worker.rq_worker import HerderMixin


class Take:
    """How one worker's finish script takes the next job, and that job made as RQ makes it."""

    def __init__(self, worker: HerderMixin) -> None:
        self.worker = worker
        self.restorer: Learned[FastRestore] = Learned()
        self._ordered: tuple[Queue, ...] = ()  # the queues' order the arguments below are for
        self._args: list[Any] = []

    def args(self) -> list[Any]:
        """How RQ's dequeue would take the next job (Queue.dequeue_any, without blocking): made
        again only when the queues' order changes (RQ keeps the server's version per connection)."""
        w = self.worker
        ordered = tuple(rq_seam.ordered_queues(w))
        if self._args and self._ordered == ordered:  # the same queues: an identity check each
            return self._args
        keys = [q.key for q in ordered]
        head = ["", WORKERS_SUSPENDED]
        if len(keys) == 1 and get_version(w.connection) >= (6, 2, 0):
            head[0] = "move"
            args = [*head, keys[0], w.queues[0].intermediate_queue_key]
        else:
            head[0] = "pop"
            args = [*head, len(keys), *keys]
        self._ordered, self._args = ordered, args
        return args

    def took(self, queue_key: str, job_id: str, data: dict[bytes, bytes]) -> tuple[Job, Queue]:
        """The job the script took, with its queue, as RQ's dequeue returns them (and says)."""
        w = self.worker
        queue = next((q for q in w.queues if q.key == queue_key), None) or w.queue_class.from_queue_key(
            queue_key, connection=w.connection, job_class=w.job_class, serializer=w.serializer
        )
        job = self.restore(job_id, data)
        if job is None:  # RQ's own restore
            job = w.job_class(job_id, connection=w.connection, serializer=w.serializer)
            try:
                job.restore(data)
            except Exception as e:  # as RQ's dequeue: the job and queue ride on the error
                e.job_id = job_id  # type: ignore[attr-defined]
                e.queue = queue  # type: ignore[attr-defined]
                raise
        job.redis_server_version = w.get_redis_server_version()
        w.reorder_queues(reference_queue=queue)
        if w.log_job_description:  # RQ's dequeue line, word for word
            what = blue(job.description)
            loglines.info(w.log, "Worker %s: %s: %s (%s)", w.name, green(queue.name), what, job.id)
        else:
            loglines.info(w.log, "Worker %s: %s: %s", w.name, green(queue.name), job.id)
        return job, queue

    def restore(self, job_id: str, data: dict[bytes, bytes]) -> Job | None:
        """The job as RQ's restore makes it (restore.py), or None: RQ's restore is to make it.
        Checked against RQ's restore at this worker's first job (and again if its job class,
        serializer or connection change)."""
        w, learned = self.worker, self.restorer
        if learned.refused:
            return None
        if learned.ready:
            fast = learned.value
            if (
                fast.job_class is w.job_class
                and fast.connection is w.connection
                and fast.serializer is w.serializer
            ):
                return fast.restore(job_id, data)
        fast, why = restore.checked(w.job_class, w.connection, w.serializer, job_id, data)  # type: ignore[assignment]
        if fast is None:
            learned.refuse(why)
            logging.getLogger("herder").info("fast path: RQ's restore makes each job (%s)", why)
            return None
        learned.become_ready(fast)
        return fast.restore(job_id, data)
