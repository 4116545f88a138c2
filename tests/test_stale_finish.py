"""A host cut off from Redis past its lease has its jobs recovered and run by another host; what it
writes once it is back must not undo that run, nor run the job again. On a real redis-server:

- the fast path's finish is written only while the job is still the worker's
  (herder.worker.fast_path.script, the call framed as a worker frames it: wire.py), and so is
  RQ's own (a failure, a Retry, --no-fast-path: herder.worker.job_path), on a real herder;
- the requeue of a job whose worker died while Redis was away moves it only while it is still
  started under that worker (supervisor/redis_side/recovery.py's MOVE), never another host's run;
- a job a worker took but had not started when it stalled, recovered and run elsewhere meanwhile,
  is not started by that worker once it goes on (herder.worker.fence), on both worker paths.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue

from harness import JOBS_DIR, wait_for
from herder.common.config import Config
from herder.supervisor.redis_side.recovery import RecoveryThread
from herder.worker.fast_path.script import ScriptConnection
from herder.worker.fast_path.wire import make_encoder, resp_request

WIP = "rq:wip:default"
FINISH = [("HSET", "rq:job:j", "status", "finished"), ("XADD", "rq:results:j", "*", "worker", "cut-off")]


def call(conn: Redis, number: int, owner: tuple[str, str] | None) -> list:
    script = ScriptConnection(conn.connection_pool, lambda exc, tries: None)
    encode = make_encoder(conn.connection_pool.get_encoder())
    request = resp_request(
        ["herder:call:w", number, "rq:job:", "herder:alive:w", 3], [], FINISH, None, [""], encode, owner
    )
    try:
        return script.call(request)
    finally:
        script.release()


def test_a_finish_is_written_while_its_execution_is_started(conn: Redis) -> None:
    conn.zadd(WIP, {"j:e1": 1e12})
    conn.hset("rq:job:j", "status", "started")
    assert call(conn, 1, (WIP, "j:e1")) == [1]
    assert conn.hget("rq:job:j", "status") == b"finished"
    assert conn.xlen("rq:results:j") == 1


def test_a_finish_for_a_recovered_job_writes_nothing_even_when_asked_again(conn: Redis) -> None:
    # Recovered from the cut-off worker (its execution e1 left the registry), run and finished
    # by another worker, whose result stands.
    conn.hset("rq:job:j", "status", "finished")
    conn.xadd("rq:results:j", {"worker": "other"})
    assert call(conn, 1, (WIP, "j:e1")) == [6]
    assert call(conn, 1, (WIP, "j:e1")) == [6]  # the same call after a lost reply: answered, not run
    assert conn.xlen("rq:results:j") == 1
    # ...and while another execution of it runs, the old one's finish does not end it either.
    conn.hset("rq:job:j", "status", "started")
    conn.zadd(WIP, {"j:e2": 1e12})
    assert call(conn, 2, (WIP, "j:e1")) == [6]
    assert conn.hget("rq:job:j", "status") == b"started"


def test_a_finish_for_a_job_its_own_code_deleted_is_written_as_rq_writes_it(conn: Redis) -> None:
    # job.delete() inside the job: its hash and its execution are gone, and herder never moved it.
    assert call(conn, 1, (WIP, "j:e1", 0)) == [1]
    assert conn.hget("rq:job:j", "status") == b"finished"
    assert conn.xlen("rq:results:j") == 1
    # ...and so after a heartbeat of the job since (RQ's forking worker beats a running job):
    # a hash of that one field, no status.
    conn.delete("rq:job:j")
    conn.hset("rq:job:j", "last_heartbeat", "2026-11-29T00:00:00.000000Z")
    assert call(conn, 2, (WIP, "j:e1", 0)) == [1]
    assert conn.hget("rq:job:j", "status") == b"finished"


def test_a_finish_for_a_recovered_job_deleted_since_writes_nothing(conn: Redis) -> None:
    # Recovered from this worker (moved once), run elsewhere and deleted there (a result TTL of 0):
    # the hash is gone as after a delete, but the job's moves say it was taken over.
    conn.set("herder:moved:j", 1)
    assert call(conn, 1, (WIP, "j:e1", 0)) == [6]
    assert not conn.exists("rq:job:j", "rq:results:j")


def test_a_call_without_an_owner_is_not_checked(conn: Redis) -> None:
    """A start's own call (no finish in it) has no owner: it runs as before."""
    assert call(conn, 1, None) == [1]
    assert conn.hget("rq:job:j", "status") == b"finished"


def started_under(conn: Redis, worker: str, execution: str) -> str:
    job = Queue("default", connection=conn).enqueue("herder_testjobs.record", "t")
    conn.lrem("rq:queue:default", 1, job.id)
    conn.hset(job.key, mapping={"status": "started", "worker_name": worker})
    conn.zadd(WIP, {f"{job.id}:{execution}": 9e9})
    return job.id


def test_a_dead_workers_requeue_leaves_a_run_another_host_took_since(conn: Redis, redis_url: str) -> None:
    # h2's worker died while h2 was cut off; h0 recovered the job and runs it now (its own
    # execution, its worker's name on the job). h2's requeue, done once Redis answers: no move.
    taken = started_under(conn, "herder.h0.0.7", "e2")
    mine = started_under(conn, "herder.h2.1.9", "e1")  # still under the dead worker: moved
    r = RecoveryThread(conn, Config(redis_url=redis_url, queues=["default"]), sweeping=False)
    r.start()
    try:
        r.requeue(taken, "test: its worker died", "died", workers=("herder.h2.1.9",))
        r.requeue(mine, "test: its worker died", "died", workers=("herder.h2.1.9",))
        wait_for(lambda: r.pending() == 0, 5, what="the requeues done")
    finally:
        r.drain(1)
    assert conn.lrange("rq:queue:default", 0, -1) == [mine.encode()]
    assert conn.zrange(WIP, 0, -1) == [f"{taken}:e2".encode()]
    assert conn.hget(f"rq:job:{taken}", "status") == b"started"
    assert r.counts.requeued == 1


@pytest.mark.slow
def test_a_dead_workers_self_deleted_job_is_neither_requeued_nor_made_again(
    conn: Redis, redis_url: str
) -> None:
    """A job whose own code deleted it, its worker dead before its finish: RQ's own clean-up finds
    no job and leaves it so. herder's requeue and sweep do the same: nothing put back, no hash made."""
    gone = started_under(conn, "herder.h2.1.9", "e1")
    left = started_under(conn, "herder.h2.1.9", "e2")  # its member left in the registry (as an rq might)
    conn.zrem(WIP, f"{gone}:e1")
    conn.delete(f"rq:job:{gone}", f"rq:job:{left}")
    r = RecoveryThread(conn, Config(redis_url=redis_url, queues=["default"]), sweeping=True)
    r.start()
    try:
        r.requeue(gone, "test: its worker died", "died", workers=("herder.h2.1.9",))
        wait_for(lambda: conn.zcard(WIP) == 0, 10, what="the sweep to clear the left member")
        wait_for(lambda: r.pending() == 0, 5, what="the requeue done")
    finally:
        r.drain(1)
    assert conn.llen("rq:queue:default") == 0
    assert not conn.exists(f"rq:job:{gone}", f"rq:job:{left}", f"herder:moved:{gone}", f"herder:moved:{left}")
    assert r.counts.requeued == 0


def test_a_move_counts_the_job_beside_its_hash(conn: Redis, redis_url: str) -> None:
    """The move writes the job's moves in its hash and under herder:moved:<id> (which outlives a
    hash deleted since), in the same script: what a stale start or finish is fenced on."""
    job_id = started_under(conn, "herder.h2.1.9", "e1")
    conn.set(f"herder:moved:{job_id}", 2)  # moved twice before, its hash since made anew
    r = RecoveryThread(conn, Config(redis_url=redis_url, queues=["default"]), sweeping=False)
    r.start()
    try:
        r.requeue(job_id, "test: its worker died", "died", workers=("herder.h2.1.9",))
        wait_for(lambda: r.pending() == 0, 5, what="the requeue done")
    finally:
        r.drain(1)
    assert conn.hget(f"rq:job:{job_id}", "herder_requeues") == b"3"
    assert conn.get(f"herder:moved:{job_id}") == b"3"
    assert 0 < conn.ttl(f"herder:moved:{job_id}") <= 7 * 24 * 3600


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "func"),
    [
        ("fast", "herder_testjobs.record"),
        ("rq", "herder_testjobs.record"),
        ("fast", "herder_hosts.fail_after"),
    ],
    ids=["fast-path-success", "rq-path-success", "failure"],
)
def test_a_worker_whose_job_was_recovered_writes_no_finish(herder, conn: Redis, path: str, func: str) -> None:
    """What another host's recovery leaves, made by hand mid-job: this execution's start gone from
    RQ's registry, the job run and finished by another worker. This worker's finish writes nothing."""
    h = herder(workers="1", **({"no_fast_path": True} if path == "rq" else {}))
    h.wait_workers(1)
    args = ("stale", 2) if func.endswith("record") else (2,)
    job = Queue("default", connection=conn).enqueue(func, *args)
    wait_for(lambda: conn.zcard(WIP) == 1, 10, what="the job to start")
    if func.endswith("record"):  # its code runs: RQ's start is written whole (RQ's own path
        # writes it in two transactions, and a hand-made recovery between them was overwritten)
        wait_for(lambda: conn.llen("started:stale") == 1, 10, what="the job's code to run")
    other = "herder.elsewhere.0.1"
    conn.zrem(WIP, *conn.zrange(WIP, 0, -1))
    conn.incr(f"herder:moved:{job.id}")  # as herder's move counts it (recovery.py's MOVE)
    conn.hset(job.key, mapping={"status": "finished", "worker_name": other})
    conn.xadd(f"rq:results:{job.id}", {"type": "1", "worker_name": other})
    h.wait_log(rf"job {job.id} ran here, but its finish was not written", timeout=15)
    h.wait_status(lambda st: st["workers"][0]["job"] is None, 10)
    assert conn.xlen(f"rq:results:{job.id}") == 1
    assert conn.hmget(job.key, "status", "worker_name") == [b"finished", other.encode()]
    assert conn.zcard(WIP) == 0 and conn.zcard("rq:failed:default") == 0
    h.stop_and_check()


def blocked_in_dequeue(conn: Redis, pid: int) -> bool:
    """The worker process's connection waits in RQ's blocking dequeue (BLMOVE) inside Redis."""
    return any(
        c.get("name") == f"herder-worker-{pid}" and c.get("cmd") == "blmove" and "b" in c.get("flags", "")
        for c in conn.client_list()
    )


def taken_within(conn: Redis, intermediate: str, job_id: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if conn.lrange(intermediate, 0, -1) == [job_id.encode()]:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("path", ["fast", "rq"])
def test_a_job_taken_before_a_stall_and_recovered_meanwhile_is_not_started_after_it(
    herder, conn: Redis, redis_url: str, path: str
) -> None:
    """The window between RQ's take (BLMOVE into the intermediate list) and the job's start, held
    open: the worker is stopped (SIGSTOP) while its dequeue waits in Redis, and a job enqueued then
    is moved to it, the reply waiting in its socket. Nobody's `busy` names the job, so the sweep
    puts it back; RQ's own worker runs it. Let go (SIGCONT), the worker reads its take's reply: it
    must not start the job (it did, and the job ran twice). It drops it, says why, and goes on."""
    h = herder(
        workers="1",
        heartbeat_timeout="120",  # a stopped worker says nothing: not killed for it meanwhile
        redis_timeout="15",  # nor does its take's reply time out while it is stopped
        progress_timeout="70",  # (longer than 4 times that, as herder requires)
        no_scheduler=True,
        **({"no_fast_path": True} if path == "rq" else {}),
    )
    (worker,) = h.wait_workers(1)
    q = Queue("default", connection=conn)
    intermediate = "rq:queue:default:intermediate"
    job = None
    try:
        for _ in range(30):  # its dequeue waits a heartbeat interval at a time: catch it waiting
            wait_for(
                lambda: blocked_in_dequeue(conn, worker.pid), 10, 0.01, what="the worker's dequeue to wait"
            )
            os.kill(worker.pid, signal.SIGSTOP)
            if blocked_in_dequeue(conn, worker.pid):
                job = q.enqueue("herder_testjobs.record", "stalled")
                if taken_within(conn, intermediate, job.id, 2.0):
                    break
                # Its wait ended in the instant between: the job stays queued. Another try.
                conn.lrem("rq:queue:default", 0, job.id)
                job.delete()
                job = None
            os.kill(worker.pid, signal.SIGCONT)
        assert job is not None, "the worker's dequeue was never caught waiting"
        # The sweep finds it held by no worker, twice, and puts it back at the front of its queue.
        wait_for(lambda: conn.lrange("rq:queue:default", 0, -1) == [job.id.encode()], 10, what="the requeue")
        assert conn.hget(job.key, "herder_requeues") == b"1"
        subprocess.run(
            [Path(sys.executable).parent / "rq", "worker", "--burst", "-w", "rq.worker.SimpleWorker",
             "--path", str(JOBS_DIR), "--url", redis_url, "default"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        assert conn.hget(job.key, "status") == b"finished"
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    said = f"job {job.id} not started: it was recovered from this worker"
    wait_for(lambda: said in h.log() or conn.llen("started:stalled") > 1, 15, what="the worker to go on")
    after = q.enqueue("herder_testjobs.record", "after")  # ...and it takes the next
    wait_for(lambda: conn.hget(after.key, "status") == b"finished", 15, what="the next job")
    h.stop_and_check()
    assert conn.lrange("started:stalled", 0, -1) == [job.id.encode()]  # it ran once, by RQ's worker
    assert conn.xlen(f"rq:results:{job.id}") == 1
    assert conn.hget(job.key, "status") == b"finished"
    assert h.log().count(f"job {job.id} not started") == 1


def test_a_job_taken_is_held_under_a_renewed_lease_even_when_asked_again(conn: Redis) -> None:
    """A worker back from a cut has no lease until its next renewal; a job it takes meanwhile
    would look like a dead worker's to another host's sweep (taken over, and run twice). The take
    renews the lease in the same script call, and so does the same call asked again."""
    job = Queue("default", connection=conn).enqueue("herder_testjobs.record", "t")
    script = ScriptConnection(conn.connection_pool, lambda exc, tries: None)
    encode = make_encoder(conn.connection_pool.get_encoder())
    take = ["move", "rq:suspended", "rq:queue:default", "rq:queue:default:intermediate"]
    request = resp_request(["herder:call:w", 1, "rq:job:", "herder:alive:w", 3], [], [], None, take, encode)
    try:
        assert not conn.exists("herder:alive:w")  # lapsed while the worker was cut off
        reply = script.call(request)
        assert int(reply[0]) == 2 and reply[2] == job.id.encode()
        assert 0 < conn.ttl("herder:alive:w") <= 3
        conn.delete("herder:alive:w")  # the reply was lost, and the lease lapsed again meanwhile
        assert int(script.call(request)[0]) == 2  # answered from the call's record
        assert 0 < conn.ttl("herder:alive:w") <= 3
    finally:
        script.release()
