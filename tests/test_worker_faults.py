"""A worker dies, freezes, hangs or crashes mid-job: replaced, and its job not lost."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
from rq.job import Job
from rq.registry import FailedJobRegistry

from harness import wait_for

pytestmark = pytest.mark.slow


def failure_reason(conn, job_id: str) -> str:
    """The failure Result's text. herder marks a job failed in its atomic move and writes the
    Result in the next round trip, a moment later: wait for it."""
    result = wait_for(
        lambda: Job.fetch(job_id, connection=conn).latest_result(), 5, what="the failure Result"
    )
    return result.exc_string or ""  # type: ignore[union-attr]


def test_kill_9_worker_mid_job_is_replaced_and_job_completes_elsewhere(herder, jobs, conn):
    h = herder(workers="2")
    h.wait_workers(2)
    job = jobs.enqueue("record", "t", 2)
    # Mid-job: its own code has run (RQ names the worker a moment before the job starts).
    wait_for(lambda: jobs.started("t") == [job.id] or None, 10, what="the job running")
    victim = h.worker_for_job(conn, job.id)
    os.kill(victim, signal.SIGKILL)
    h.wait_status(lambda s: victim not in [w["pid"] for w in s["workers"]], 10, what="the victim reaped")
    assert [(e["how"], e["why"]) for e in h.exits(victim)] == [("killed by SIGKILL", "unexpected")]
    jobs.wait_finished(job.id, 15, what="the job to finish on another worker")
    assert jobs.started("t") == [job.id, job.id]  # once interrupted, once completed
    assert jobs.finished("t") == [job.id]
    assert Job.fetch(job.id, connection=conn).worker_name.rsplit(".", 1)[1] != str(victim)
    h.wait_workers(2, without={victim})
    # herder requeued it and spawned a replacement; the kill was not herder's.
    assert h.totals() == {
        "spawned": 3,
        "killed": 0,
        "requeued": 1,
        "recovered_by_sweep": 0,
        "failed_by_herder": 0,
        "recycled": {},
    }
    # The live master reaped it: no zombie under it (pytest, a subreaper, would hide one later).
    master = h.master()
    assert master is not None
    assert not [c.pid for c in master.children() if c.status() == "zombie"]
    h.stop_and_check()


def test_sigstopped_worker_is_killed_within_heartbeat_timeout_and_job_requeued(herder, jobs, conn):
    heartbeat_timeout = 3.0
    h = herder(workers="2", heartbeat_timeout=str(heartbeat_timeout))
    h.wait_workers(2)
    job = jobs.enqueue("record", "t", 4)
    victim = h.worker_for_job(conn, job.id)
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.monotonic()
    h.wait_status(
        lambda s: victim not in [w["pid"] for w in s["workers"]],
        heartbeat_timeout + 5,
        what="the frozen worker killed and reaped",
    )
    replaced_after = time.monotonic() - stopped_at
    assert replaced_after <= heartbeat_timeout + 1.0, f"took {replaced_after:.2f} s"
    assert [k["why"][:11] for k in h.kills() if int(k["pid"]) == victim] == ["silent for "]
    jobs.wait_finished(job.id, 15, what="the requeued job to finish")
    assert jobs.finished("t") == [job.id]
    h.wait_workers(2)
    assert h.totals() == {
        "spawned": 3,
        "killed": 1,
        "requeued": 1,
        "recovered_by_sweep": 0,
        "failed_by_herder": 0,
        "recycled": {},
    }
    h.stop_and_check()


def test_sigstopped_idle_worker_is_killed_and_replaced(herder):
    h = herder(workers="1", heartbeat_timeout="3")
    (victim,) = h.wait_workers(1)
    os.kill(victim.pid, signal.SIGSTOP)
    h.wait_status(lambda s: s["totals"]["killed"] == 1, 3 + 2, what="the frozen worker killed")
    assert [(int(k["pid"]), k["was"], k["why"][:11]) for k in h.kills()] == [
        (victim.pid, "idle", "silent for ")
    ]
    (replacement,) = h.wait_workers(1, without={victim.pid})
    # Killed and replaced; idle, it had no job to requeue.
    assert h.totals() == {
        "spawned": 2,
        "killed": 1,
        "requeued": 0,
        "recovered_by_sweep": 0,
        "failed_by_herder": 0,
        "recycled": {},
    }
    h.stop_and_check()


def test_hanging_job_is_killed_after_its_timeout_requeued_then_failed_with_reason(herder, jobs, conn):
    h = herder(workers="2", max_requeues="1", job_timeout_grace="1")
    h.wait_workers(2)
    job = jobs.enqueue("hang", "t", job_timeout=2)
    # Attempt 1 killed at ~3 s, requeued once; attempt 2 killed, then failed.
    wait_for(lambda: jobs.status(job.id) == "failed", 20, what="the hanging job to be failed")
    assert len(jobs.started("t")) == 2
    assert jobs.finished("t") == []
    assert job.id in FailedJobRegistry("default", connection=conn).get_job_ids()
    reason = failure_reason(conn, job.id)
    assert re.search(r"killed by herder: busy \d+ s past its 2 s timeout", reason), reason
    assert "requeued 1 times already (limit 1)" in reason
    h.wait_workers(2)  # both slots refilled
    # Killed twice for its timeout: requeued once, then failed by herder.
    assert h.totals() == {
        "spawned": 4,
        "killed": 2,
        "requeued": 1,
        "recovered_by_sweep": 0,
        "failed_by_herder": 1,
        "recycled": {},
    }
    h.stop_and_check()


def test_job_that_kills_its_interpreter_is_handled_and_worker_replaced(herder, jobs, conn):
    h = herder(workers="2", max_requeues="1")
    h.wait_workers(2)
    exits = jobs.enqueue("exit_hard", "exit")
    wait_for(lambda: jobs.status(exits.id) == "failed", 20, what="the os._exit job to be failed")
    assert len(jobs.started("exit")) == 2
    assert "worker died (exit code 3) while running the job" in failure_reason(conn, exits.id)

    segv = jobs.enqueue("segfault", "segv")
    wait_for(lambda: jobs.status(segv.id) == "failed", 20, what="the segfaulting job to be failed")
    assert len(jobs.started("segv")) == 2
    assert "worker died (killed by SIGSEGV) while running the job" in failure_reason(conn, segv.id)

    # The fleet is whole again and still works.
    h.wait_workers(2)
    ok = jobs.enqueue("record", "ok")
    wait_for(lambda: jobs.finished("ok") == [ok.id], 10, what="a normal job after the crashes")
    h.stop_and_check()


def test_redis_hanging_does_not_stall_the_master_and_the_job_is_requeued_after(herder, own_redis, jobs):
    from rq import Queue

    proc, port = own_redis
    url = f"redis://127.0.0.1:{port}/0"
    from redis import Redis

    q = Queue(connection=Redis.from_url(url))
    master_heartbeat_timeout = 3
    h = herder(redis_url=url, workers="1", master_heartbeat_timeout=str(master_heartbeat_timeout))
    h.wait_workers(1)
    master = h.master()
    assert master is not None
    job = q.enqueue("herder_testjobs.record", "frozen", 3)
    victim = h.worker_for_job(Redis.from_url(url), job.id)
    # RQ names the worker on the job a moment before the job itself runs and says so.
    wait_for(lambda: Redis.from_url(url).llen("started:frozen") == 1, 10, what="the job to start")
    os.kill(victim, signal.SIGKILL)
    proc.send_signal(signal.SIGSTOP)  # Redis hangs: connections open, nothing answers
    # The master's loop goes on without Redis: it reaps the victim and says so in its status.
    h.wait_status(lambda s: victim not in [w["pid"] for w in s["workers"]], 10, what="the victim reaped")
    # An absence over time: well past the watchdog's deadline for a silent master, the
    # master is not taken for a hung one and replaced.
    time.sleep(2 * master_heartbeat_timeout + 2)
    assert h.snapshot()["master"]["pid"] == master.pid  # and its loop still answers
    proc.send_signal(signal.SIGCONT)
    r = Redis.from_url(url)
    wait_for(lambda: r.llen("finished:frozen") == 1, 30, what="the requeued job to finish")
    assert (cur := h.master()) is not None and cur.pid == master.pid, "the watchdog replaced a healthy master"
    assert r.llen("started:frozen") == 2
    totals = h.totals()
    assert (totals["requeued"], totals["killed"]) == (1, 0)  # requeued after the freeze; nobody killed
    h.stop_and_check()


def test_a_worker_that_starts_while_redis_hangs_waits_without_being_killed(herder, own_redis):
    """A worker born during a Redis freeze waits for it, heartbeating: each ping gives up within
    a heartbeat interval, so it never goes silent past the heartbeat timeout (3 s here)."""
    proc, port = own_redis
    url = f"redis://127.0.0.1:{port}/0"
    proc.send_signal(signal.SIGSTOP)  # Redis hangs: connections open, nothing answers
    try:
        h = herder(redis_url=url, workers="1", no_scheduler=True)
        h.wait_status(lambda s: len(s["workers"]) == 1, 20, what="a worker spawned into the freeze")
        # An absence over time: three heartbeat timeouts of Redis silence, no kill.
        time.sleep(3 * 3.0)
        st = h.snapshot()
        assert st["totals"]["killed"] == 0 and st["workers"][0]["state"] == "starting", st["workers"]
    finally:
        proc.send_signal(signal.SIGCONT)
    h.wait_workers(1)
    assert h.snapshot()["totals"] == {
        "spawned": 1,
        "killed": 0,
        "requeued": 0,
        "recovered_by_sweep": 0,
        "failed_by_herder": 0,
        "recycled": {},
    }
    h.stop_and_check()


def test_a_stop_wakes_an_idle_workers_blocking_dequeue_at_once(herder, conn):
    """An idle worker blocks in RQ's dequeue for a whole heartbeat interval (here 10 s); the
    master's `stop` wakes it at once (CLIENT UNBLOCK of its own named connection), so the
    fleet stops gracefully long before the dequeue would have timed out."""
    h = herder(workers="1", heartbeat_interval="10", heartbeat_timeout="60")
    h.wait_workers(1)
    (worker,) = h.workers()
    name = f"herder-worker-{worker.pid}"

    def blocked() -> bool:
        return any(c.get("name") == name and c.get("cmd") == "blmove" for c in conn.client_list())

    wait_for(blocked, 20, what="the idle worker blocked in its dequeue")
    took = h.stop_and_check(timeout=30)
    assert took < 8, f"the stop waited for the dequeue's 10 s timeout ({took:.1f} s)"
