"""Threads per worker (`threads = N`, issue 31): one worker process runs N jobs at once, each
thread an RQ worker of its own, with every guarantee kept per job: a kill loses none of the
jobs the process held, a graceful stop finishes every thread's job, a job past its timeout is
stopped in its own thread while its siblings run on."""

from __future__ import annotations

import os
import re
import signal
import uuid
from collections import Counter

import pytest
from redis import Redis
from rq import Worker
from rq.job import Job

from harness import JobsHelper, wait_for

pytestmark = pytest.mark.slow


def worker_pids_of(conn: Redis, job_ids: list[str]) -> set[int]:
    """The process of each job's RQ worker (`<host>.<slot>.<pid>[.t<i>]`), from RQ's record."""
    names = [Job.fetch(j, connection=conn).worker_name for j in job_ids]
    return {int(name.split(".")[3]) for name in names if name}


def busy_threaded_worker(herder, jobs: JobsHelper, threads: int, seconds: float):  # noqa: ANN201
    """One worker of `threads` threads, each running a `record` job of `seconds`: (the herder,
    the worker's process, the jobs' tag, their ids), once every job has started."""
    h = herder(workers="1", threads=str(threads))
    (proc,) = h.wait_workers(1)
    tag = uuid.uuid4().hex
    ids = [jobs.enqueue("record", tag, seconds).id for _ in range(threads)]
    wait_for(lambda: len(jobs.started(tag)) == threads, 10, what=f"the {threads} jobs to start together")
    return h, proc, tag, ids


def test_a_threaded_worker_runs_its_jobs_at_once_each_thread_an_rq_worker(
    herder, jobs: JobsHelper, conn
) -> None:
    # All four run at once in the one process: each started before any finished.
    h, proc, tag, ids = busy_threaded_worker(herder, jobs, threads=4, seconds=1.5)
    assert jobs.finished(tag) == []
    st = h.wait_status(  # as the master reads each thread's `busy` line, a moment after the job's start
        lambda s: sorted(j["thread"] for j in s["workers"][0]["jobs"]) == [0, 1, 2, 3], 5,
        what="the four threads' jobs in status",
    )  # fmt: skip
    (w,) = st["workers"]
    assert w["state"] == "busy" and jobs.finished(tag) == []
    assert worker_pids_of(conn, ids) == {proc.pid}
    names = {Job.fetch(j, connection=conn).worker_name for j in ids}
    assert len(names) == 4  # each job taken by a thread's own RQ worker
    for job_id in ids:
        jobs.wait_finished(job_id, 10, what=f"job {job_id} to finish")
    # RQ's registries and results, as a one-job pool leaves them.
    q = jobs.queue
    assert q.started_job_registry.get_job_ids() == [] and sorted(
        q.finished_job_registry.get_job_ids()
    ) == sorted(ids)
    assert [Job.fetch(j, connection=conn).return_value() for j in ids] == [tag] * 4
    # RQ's view: four workers of that process, each registered under its thread's name.
    registered = {x.name for x in Worker.all(connection=conn) if x.name.split(".")[3] == str(proc.pid)}
    assert registered == names
    assert st["totals"]["spawned"] == 1
    h.stop_and_check()
    assert {x.name for x in Worker.all(connection=conn)} & names == set()  # each unregistered itself


def test_a_killed_threaded_worker_loses_none_of_its_jobs(herder, jobs: JobsHelper, conn) -> None:
    h, proc, tag, ids = busy_threaded_worker(herder, jobs, threads=3, seconds=2)
    os.kill(proc.pid, signal.SIGKILL)  # every job it held goes back on the queue
    for job_id in ids:
        jobs.wait_finished(job_id, 30, what=f"job {job_id} requeued and finished")
    assert sorted(jobs.finished(tag)) == sorted(ids)  # each ran to its end once
    assert sorted(jobs.started(tag)) == sorted(ids * 2)  # and started twice: killed, then again
    st = h.snapshot()  # all three put back by the reap itself, at once, none left to a sweep
    assert (st["totals"]["requeued"], st["totals"]["recovered_by_sweep"]) == (3, 0), st["totals"]
    h.stop_and_check()


def test_a_graceful_stop_finishes_every_threads_job(herder, jobs: JobsHelper) -> None:
    h, _, tag, ids = busy_threaded_worker(herder, jobs, threads=3, seconds=1.5)
    h.stop_and_check()  # exit 0, nothing left
    assert sorted(jobs.finished(tag)) == sorted(ids)
    assert all(jobs.status(j) == "finished" for j in ids)


def test_a_job_past_its_timeout_is_stopped_in_its_own_thread_while_its_siblings_finish(
    herder, jobs: JobsHelper, conn
) -> None:
    h = herder(workers="1", threads="2")
    (proc,) = h.wait_workers(1)
    tag = uuid.uuid4().hex
    late = jobs.enqueue("spin", tag, 30, job_timeout=1)
    sibling = jobs.enqueue("spin", tag, 2.5)
    wait_for(lambda: len(jobs.started(tag)) == 2, 10, what="both jobs to start")
    wait_for(lambda: jobs.status(late.id) == "failed", 10, what="the late job stopped by its timeout")
    result = Job.fetch(late.id, connection=conn).latest_result()
    assert result is not None and "JobTimeoutException" in (result.exc_string or "")
    jobs.wait_finished(sibling.id, 10, what="its sibling to finish")
    assert jobs.finished(tag) == [sibling.id]
    (w,) = h.wait_workers(1)
    assert w.pid == proc.pid  # the process lives on: only the late job was stopped
    h.stop_and_check()


def test_rqs_stop_job_command_stops_the_job_in_its_own_thread(herder, jobs: JobsHelper, conn) -> None:
    from rq.command import send_stop_job_command

    h = herder(workers="1", threads="2")
    (proc,) = h.wait_workers(1)
    tag = uuid.uuid4().hex
    long = jobs.enqueue("spin", tag, 30)
    sibling = jobs.enqueue("spin", tag, 2.5)
    wait_for(lambda: len(jobs.started(tag)) == 2, 10, what="both jobs to start")
    send_stop_job_command(conn, long.id)
    wait_for(lambda: jobs.status(long.id) == "stopped", 10, what="the long job stopped, as RQ marks it")
    jobs.wait_finished(sibling.id, 10, what="its sibling to finish")
    assert jobs.finished(tag) == [sibling.id]
    (w,) = h.wait_workers(1)
    assert w.pid == proc.pid
    h.stop_and_check()


def test_worker_init_runs_once_per_process_and_recycling_counts_every_threads_jobs(
    herder, jobs: JobsHelper, tmp_path
) -> None:
    """As for a one-job worker: --worker-init once per process (before its threads start),
    and max_jobs counts the jobs of all its threads: the process takes no more than its limit,
    however many of its threads dequeue at once (the replacement starts first)."""
    init_log = tmp_path / "init.log"
    h = herder(workers="1", threads="3", max_jobs="6", worker_init="herder_hooks:record_init",
               env={"HERDER_TEST_INIT_LOG": str(init_log)})  # fmt: skip
    (first,) = h.wait_workers(1)
    assert init_log.read_text().split() == [str(first.pid)]
    tag = uuid.uuid4().hex
    ids = [jobs.enqueue("record", tag).id for _ in range(12)]  # more than its limit, all at once
    for job_id in ids:
        jobs.wait_finished(job_id, 20, what=f"job {job_id} to finish")
    ran = Counter(
        int(re.search(r"\.(\d+)(?:\.t\d+)?$", Job.fetch(i, connection=jobs.conn).worker_name).group(1))
        for i in ids
    )  # by process, as RQ recorded each job's worker (one name per thread)
    assert ran[first.pid] == 6 and max(ran.values()) == 6, ran
    second = h.wait_workers(1, timeout=20, without=[first.pid])[0]  # recycled after its 6 jobs
    started = init_log.read_text().split()
    assert started[0] == str(first.pid) and str(second.pid) in started and len(set(started)) == len(started)
    # Recycled for its limit of 6: before the sixth job ends when the master sees it coming (six
    # taken within a replacement's start), or after it, when its jobs outran the master's look.
    assert re.search(r"recycled after max jobs: 6 jobs (done|taken of its limit of 6)", h.log())
    h.stop_and_check()
