"""The fence on RQ's own path (herder.worker.fence), unit by unit on a real redis-server: herder's
RQ worker (no master behind it) starts a job only while the job is still where its take put it,
in the same call as RQ's start transaction, and writes nothing for a start it refused, on rq 3's
way of ending it (_finalize_failure) and on rq 2's (handle_job_failure, inline)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from redis import Redis
from rq import Queue
from rq.worker import SimpleWorker

from herder.worker.fence import Fence, StartRefused
from herder.worker.rq_worker import herder_worker_class

INTERMEDIATE = "rq:queue:default:intermediate"


@pytest.fixture
def worker(conn: Redis):  # noqa: ANN201 - herder's RQ worker class, made at run time
    w = herder_worker_class(SimpleWorker)([Queue("default", connection=conn)], connection=conn, name="unit")
    w.attach(SimpleNamespace(progress=lambda: None, on_request=lambda wake: None), lease_seconds=3)
    return w


def taken(conn: Redis, worker) -> object:  # noqa: ANN001
    """A job as RQ's dequeue leaves it: moved into the intermediate list, its fence noted."""
    job = Queue("default", connection=conn).enqueue("herder_testjobs.record", "fence")
    conn.lmove("rq:queue:default", INTERMEDIATE)
    worker._fence = Fence(job.key, job.id, None, worker.claim_key(), worker.held())
    return job


def test_a_start_takes_the_job_out_of_the_intermediate_list_and_notes_its_moves(conn: Redis, worker) -> None:  # noqa: ANN001
    job = taken(conn, worker)
    conn.set(f"herder:moved:{job.id}", 2)  # moved twice before this take
    conn.delete(worker.lease)  # lapsed while the worker could not reach Redis
    execution = worker.prepare_execution(job)
    assert 0 < conn.ttl(worker.lease) <= 3  # renewed by the start itself: the job is held under it
    assert conn.llen(INTERMEDIATE) == 0  # taken out by the first transaction, RQ's LREM after
    assert conn.zscore("rq:wip:default", execution.composite_key) is not None
    assert worker._fence.moves == 2 and worker._fence.claim == ""
    worker.prepare_job_execution(job, remove_from_intermediate_queue=True)
    assert conn.hget(job.key, "status") == b"started"


def test_a_job_no_longer_where_its_take_put_it_is_not_started(conn: Redis, worker) -> None:  # noqa: ANN001
    job = taken(conn, worker)
    conn.lrem(INTERMEDIATE, 1, job.id)  # recovered meanwhile: back on its queue
    conn.lpush("rq:queue:default", job.id)
    with pytest.raises(StartRefused):
        worker.prepare_execution(job)
    assert conn.zcard("rq:wip:default") == 0
    assert conn.hget(job.key, "status") == b"queued"
    assert not worker.executions


def test_a_second_transaction_after_a_move_is_refused_and_writes_no_failure(conn: Redis, worker) -> None:  # noqa: ANN001
    job = taken(conn, worker)
    execution = worker.prepare_execution(job)
    conn.set(f"herder:moved:{job.id}", 1)  # moved between RQ's two start transactions
    with pytest.raises(StartRefused):
        worker.prepare_job_execution(job, remove_from_intermediate_queue=True)
    assert conn.hget(job.key, "status") == b"queued"
    # rq 3 ends it through _finalize_failure, rq 2 inline through handle_job_failure: neither writes.
    queue = worker.queues[0]
    try:
        raise StartRefused(job.id)
    except StartRefused:
        worker._finalize_failure(job, queue, execution, sys.exc_info())
        worker.handle_job_failure(job=job, queue=queue, exc_string="refused")
    assert conn.hget(job.key, "status") == b"queued"
    assert conn.zcard("rq:failed:default") == 0
    assert worker._fenced_off == job.id
