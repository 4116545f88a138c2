"""The recovery thread on a real Redis, without a fleet: a task that keeps failing never
blocks the tasks behind it, and a move is atomic and counted."""

from __future__ import annotations

import time

import pytest
from redis import Redis
from rq import Queue
from rq.registry import StartedJobRegistry

from harness import RoundTrips, wait_for
from herder.common.config import Config
from herder.supervisor.redis_side import recovery as recovery_mod
from herder.supervisor.redis_side.recovery import RecoveryThread

pytestmark = pytest.mark.slow


def started(conn: Redis, queue: str, func: str = "herder_testjobs.record") -> str:
    """A job as RQ leaves it when its worker dies mid-job: status started, in the registry."""
    job = Queue(queue, connection=conn).enqueue(func, "t")
    conn.lrem(f"rq:queue:{queue}", 1, job.id)
    conn.hset(job.key, mapping={"status": "started", "worker_name": "herder.gone.0.1"})
    conn.zadd(StartedJobRegistry(queue, connection=conn).key, {f"{job.id}:exec1": 9e9})
    return job.id


def test_a_failing_task_does_not_block_the_ones_behind_it(conn: Redis, redis_url: str, monkeypatch) -> None:
    monkeypatch.setattr(recovery_mod, "RETRY_INITIAL", 0.01)
    bad = started(conn, "broken")
    conn.delete("rq:wip:broken")
    conn.set("rq:wip:broken", "not a sorted set")  # every move of that job fails (WRONGTYPE)
    good = started(conn, "default")
    r = RecoveryThread(conn, Config(redis_url=redis_url, queues=["default"]), sweeping=False)
    r.start()
    r.requeue(bad, "test: its worker died", "died")
    r.requeue(good, "test: its worker died", "died")
    wait_for(
        lambda: conn.lrange("rq:queue:default", 0, -1) == [good.encode()], 5, what="the good job requeued"
    )
    wait_for(lambda: r.counts.given_up == 1, 10, what="the bad task given up")
    assert r.counts.requeued == 1 and r.pending() == 0
    assert conn.hget(f"rq:job:{good}", "herder_requeues") == b"1"


def test_a_move_happens_once_however_often_it_is_asked(conn: Redis, redis_url: str) -> None:
    job_id = started(conn, "default")
    r = RecoveryThread(conn, Config(redis_url=redis_url, max_requeues=3), sweeping=False)
    r.start()
    for _ in range(3):  # the reap path and two sweeps, say
        r.requeue(job_id, "test: its worker died", "died")
    wait_for(lambda: r.pending() == 0, 5, what="the requeues done")
    assert conn.lrange("rq:queue:default", 0, -1) == [job_id.encode()]
    assert conn.hget(f"rq:job:{job_id}", "herder_requeues") == b"1"
    assert conn.zcard("rq:wip:default") == 0


@pytest.mark.parametrize("limit", [0, 2])
def test_past_max_requeues_the_job_fails_with_a_reason(conn: Redis, redis_url: str, limit: int) -> None:
    from rq.job import Job
    from rq.registry import FailedJobRegistry

    job_id = started(conn, "default")
    conn.hset(f"rq:job:{job_id}", "herder_requeues", limit)
    r = RecoveryThread(conn, Config(redis_url=redis_url, max_requeues=limit), sweeping=False)
    r.start()
    r.requeue(job_id, "killed by herder: test", "killed")
    wait_for(lambda: r.counts.failed == 1, 5, what="the job failed")
    assert job_id in FailedJobRegistry("default", connection=conn)
    job = Job.fetch(job_id, connection=conn)
    assert job.get_status() == "failed"
    assert "requeued" in (job.latest_result().exc_string or "")
    assert conn.llen("rq:queue:default") == 0


def test_a_sweep_reads_an_entry_only_at_its_second_sighting_and_moves_an_orphan_as_soon_as_before(
    conn: Redis, redis_url: str
) -> None:
    """A busy fleet's started entries are mostly gone by the next sweep: the first sweep that
    sees an entry reads nothing of its job; the second reads it and, the grace run from the
    first sighting, moves an orphan then, as when every entry was read at once."""
    job_id = started(conn, "default")
    conn.hdel(f"rq:job:{job_id}", "worker_name")  # its worker died before it put its name on it
    r = RecoveryThread(conn, Config(redis_url=redis_url, sweep_interval=0.2))  # not started: swept here

    def hgets() -> int:
        return int(conn.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))

    before = hgets()
    r._sweep_once()
    assert hgets() == before, "the first sighting read the job's hash"
    assert conn.zcard("rq:wip:default") == 1
    time.sleep(0.3)  # the grace: one sweep interval since the first sighting
    r._sweep_once()
    assert hgets() > before
    assert conn.lrange("rq:queue:default", 0, -1) == [job_id.encode()], "the orphan was not moved"
    assert conn.zcard("rq:wip:default") == 0


def test_a_sweeps_moves_go_in_one_round_trip_also_after_redis_forgot_the_script(
    conn: Redis, redis_url: str
) -> None:
    """A busy fleet's sweep may find a few entries to move at once (jobs a starved worker took a
    moment ago, litter): all its moves go in one round trip, each atomic on its own, and a Redis
    that forgot the move script (a restart, SCRIPT FLUSH) has it loaded again and loses none."""
    r = RecoveryThread(conn, Config(redis_url=redis_url, sweep_interval=0.2))  # not started: swept here
    trips = RoundTrips(r.connection)
    for flushed in (False, True):
        orphans = [started(conn, "default") for _ in range(3)]
        for job_id in orphans:
            conn.hdel(f"rq:job:{job_id}", "worker_name")  # its worker died before it put its name on it
        r._sweep_once()  # the first sighting
        time.sleep(0.3)  # the grace: one sweep interval since
        if flushed:
            conn.script_flush()
            r._sweep_once()  # the look loads its script again, and so do the moves
        else:
            before = trips.count
            r._sweep_once()
            # the look, the entries' hashes, the moves; then each requeued job's note (its meta)
            assert trips.count - before == 3 + 2 * len(orphans), f"{trips.count - before} round trips"
        assert sorted(conn.lrange("rq:queue:default", 0, -1)) == sorted(j.encode() for j in orphans)
        assert r.counts.swept == 3 * (1 + flushed) and conn.zcard("rq:wip:default") == 0
        conn.delete("rq:queue:default")
