"""The worker's side of its jobs limit (worker/channel.py, JobsLimit): the jobs it may still
take, shared by a threaded worker's threads, and the master's `retire`."""

from __future__ import annotations

import threading
import time

from herder.common import worker_protocol as wp
from herder.worker.channel import JobsLimit


def test_the_limit_is_read_from_the_environment_and_a_bad_one_is_no_limit() -> None:
    assert wp.jobs_limit({wp.ENV_JOBS_LIMIT: "57"}) == 57
    for bad in ("", "0", "-3", "5.5", "lots"):
        assert wp.jobs_limit({wp.ENV_JOBS_LIMIT: bad}) is None
    assert wp.jobs_limit({}) is None


def test_no_more_jobs_are_taken_than_the_limit_by_threads_that_dequeue_at_once() -> None:
    """Each thread reserves its next job before it dequeues: two blocked dequeues that are both
    handed a job would otherwise take one past the limit."""
    limit = JobsLimit(50)
    barrier = threading.Barrier(8)

    def thread() -> None:
        barrier.wait()
        while limit.reserve():
            time.sleep(0.001)  # the dequeue, while the others reserve theirs
            limit.settle(True)  # it took a job

    threads = [threading.Thread(target=thread) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limit.taken == 50 and limit.reached


def test_a_dequeue_that_took_nothing_gives_its_room_back() -> None:
    limit = JobsLimit(2)
    assert limit.reserve() and limit.reserve()
    assert not limit.reserve()  # both held by dequeues under way
    limit.settle(False)  # one found the queue empty
    assert limit.reserve() and not limit.reached
    limit.settle(True)
    limit.settle(True)
    assert limit.reached and not limit.reserve()


def test_retire_ends_the_taking_at_once_with_or_without_a_limit() -> None:
    for limit in (JobsLimit(), JobsLimit(100)):
        assert limit.reserve()
        limit.settle(True)
        limit.retire()
        assert limit.reached and not limit.reserve()
