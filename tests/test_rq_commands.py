"""RQ's remote commands sent to herder's workers with RQ's own API, as rq-dashboard sends
them: a shutdown is a graceful recycle, a stop-job stops that job as RQ marks it (stopped,
never requeued) and the worker goes on. Real Redis, real workers."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from rq.command import send_shutdown_command, send_stop_job_command
from rq.worker import Worker

from harness import wait_for

pytestmark = pytest.mark.slow


def test_send_shutdown_command_is_a_graceful_recycle_busy_or_idle(herder, conn: Redis, jobs) -> None:
    h = herder(workers="2")
    h.wait_workers(2)
    job = jobs.enqueue("record", "sd", 1.5)
    busy = h.worker_for_job(conn, job.id)
    idle = next(p.pid for p in h.workers() if p.pid != busy)
    names = {w.pid: w.name for w in Worker.all(connection=conn)}  # as rq-dashboard lists them
    for pid in (busy, idle):
        send_shutdown_command(conn, names[pid])
    h.wait_workers(2, timeout=15, without={busy, idle})  # both gone, two replacements ready
    assert not {busy, idle} & {p.pid for p in h.workers()}
    assert jobs.started("sd") == [job.id] and jobs.finished("sd") == [job.id]  # never interrupted
    wait_for(lambda: jobs.status(job.id) == "finished", 5, what="RQ to mark the job finished")
    status = h.snapshot()
    assert status["totals"]["killed"] == 0 and status["totals"]["requeued"] == 0
    assert status["slots_in_backoff"] == [] and status["totals"]["spawned"] == 4
    for pid in (busy, idle):  # stopped as asked (RQ's shutdown said `stop`), not "unexpected"
        assert [(e["how"], e["why"]) for e in h.exits(pid)] == [("exit code 0", "stopped as asked")]
    h.stop_and_check()


def test_send_stop_job_command_stops_the_job_as_rq_marks_it_and_the_worker_goes_on(
    herder, conn: Redis, jobs
) -> None:
    h = herder(workers="1")
    (worker,) = h.wait_workers(1)
    long = jobs.enqueue("record", "long", 60)
    wait_for(lambda: jobs.started("long") == [long.id], 10, what="the long job to start")
    started = time.monotonic()
    send_stop_job_command(conn, long.id)
    wait_for(lambda: jobs.status(long.id) == "stopped", 10, what="the job stopped")
    assert time.monotonic() - started < 5
    after = jobs.enqueue("record", "after")
    wait_for(lambda: jobs.finished("after") == [after.id], 10, what="the next job")
    # The same worker went on, and the master has seen it done with the next job: herder
    # requeues a job only when its worker exits or is killed, so none was.
    status = h.wait_status(
        lambda s: (
            [(w["pid"], w["job"]) for w in s["workers"]] == [(worker.pid, None)] and s["jobs"]["ok"] >= 1
        ),
        10,
        what="the worker idle after the next job",
    )
    assert status["totals"]["killed"] == 0 and status["totals"]["requeued"] == 0
    assert {p.pid for p in h.workers()} == {worker.pid}
    assert jobs.started("long") == [long.id] and jobs.finished("long") == []
    assert jobs.status(long.id) == "stopped"
    h.stop_and_check()


def test_send_shutdown_command_stops_an_idle_worker_at_once(herder, conn: Redis) -> None:
    """As RQ's own worker stops at once: not at the end of its blocking dequeue's slice (a
    heartbeat interval, 5 s here). Found by rq's test_worker_pool (check_workers, reap_workers)."""
    h = herder(workers="1", heartbeat_interval="5", heartbeat_timeout="30")
    pid = h.wait_workers(1)[0].pid
    wait_for(lambda: any(w.pid == pid for w in Worker.all(connection=conn)), 10, what="the worker listed")
    time.sleep(0.5)  # in its blocking dequeue
    name = next(w.name for w in Worker.all(connection=conn) if w.pid == pid)
    sent = time.monotonic()
    send_shutdown_command(conn, name)
    wait_for(lambda: pid not in {p.pid for p in h.workers()}, 10, what="the worker to stop")
    assert time.monotonic() - sent < 2.5
    h.stop_and_check()
