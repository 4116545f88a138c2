"""Self-defense end to end: cull a worker whose jobs keep failing (within a budget shared by
every host), leave a poison job's workers alone, recycle by jobs and memory with the
replacement first. Real Redis, real workers."""

from __future__ import annotations

import threading
import time

import pytest
from redis import Redis
from rq import Queue, Retry

from harness import ready_pids, wait_for

pytestmark = pytest.mark.slow


def enqueue(conn: Redis, func: str, n: int, *args: object, **kw: object) -> list[str]:
    q = Queue("default", connection=conn)
    with conn.pipeline() as pipe:
        ids = [q.enqueue(f"herder_testjobs.{func}", *args, pipeline=pipe, **kw).id for _ in range(n)]
        pipe.execute()
    return ids


def finished(conn: Redis, tag: str) -> list[str]:
    return [x.decode() for x in conn.lrange(f"finished:{tag}", 0, -1)]


def test_the_worker_whose_connection_went_bad_is_culled_and_the_others_untouched(herder, conn: Redis) -> None:
    h = herder(workers="3", cull_failures="5", cull_failure_window="30")
    workers = h.wait_workers(3)
    bad, *good = (p.pid for p in workers)
    conn.set(f"broken:{bad}", 1)
    ids = enqueue(conn, "flaky_connection", 60, "conn", retry=Retry(max=5))
    wait_for(lambda: set(finished(conn, "conn")) == set(ids), 60, what="every job to finish")
    h.wait_workers(3, timeout=20, without={bad})  # the bad worker replaced
    assert {p.pid for p in h.workers()} >= set(good)  # the healthy workers untouched
    status = h.snapshot()
    assert status["totals"]["recycled"] == {"culled": 1}
    assert status["totals"]["killed"] == 0 and status["health"] == "ok"
    failed_on = {int(x) for x in conn.lrange("failed-on:conn", 0, -1)}
    assert failed_on == {bad}  # every failure was the bad worker's
    h.stop_and_check()


def test_a_widespread_fault_culls_at_most_the_budget_across_two_hosts(herder, conn: Redis) -> None:
    """The database is down: every job fails on every worker of both hosts. Culling them all
    would take the service down: at most the shared budget is culled; health says why, and
    recovers by itself once the fault clears and the failures age out."""
    opts = {"workers": "3", "cull_failures": "3", "cull_failure_window": "6", "cull_budget": "2"}
    a = herder(host_id="a", **opts)
    b = herder(host_id="b", **opts)
    a.wait_workers(3)
    b.wait_workers(3)
    conn.set("db_down", 1)
    enqueue(conn, "flaky_connection", 120, "down")
    wait_for(
        lambda: any(
            "cull budget spent" in (s or {}).get("health", "") for s in (a.try_snapshot(), b.try_snapshot())
        ),
        30,
        what="degraded: cull budget spent",
    )
    # An absence over time: more failures keep coming for 2 s, and still no more culls.
    time.sleep(2)
    statuses = [a.snapshot(), b.snapshot()]
    culls = [s["totals"]["recycled"].get("culled", 0) for s in statuses]
    assert sum(culls) == 2, culls
    assert [s["actual"] for s in statuses] == [3, 3]  # capacity kept
    conn.delete("db_down")
    conn.delete("rq:queue:default")  # the failing backlog is gone with the fault
    for h in (a, b):
        st = h.wait_status(lambda s: s["health"] == "ok", 20, what="health ok")
        assert st["running"]
    a.stop_and_check()
    b.stop_and_check()


def test_a_poison_job_retried_by_rq_culls_no_worker(herder, conn: Redis) -> None:
    h = herder(workers="3")  # the defaults: 5 failures a minute
    h.wait_workers(3)
    before = {p.pid for p in h.workers()}
    (job_id,) = enqueue(conn, "poison", 1, "poison", retry=Retry(max=3))
    wait_for(lambda: conn.llen("started:poison") == 4, 20, what="the poison job tried 4 times")
    wait_for(lambda: Queue("default", connection=conn).fetch_job(job_id).get_status() == "failed", 10)
    # The master has counted every failure (a cull would follow the count at once)...
    st = h.wait_status(lambda s: s["jobs"]["failed"] == 4, 10, what="the master to count the 4 failures")
    # ...and culled nobody.
    assert st["totals"]["recycled"] == {} and st["health"] == "ok"
    assert sorted(w["pid"] for w in st["workers"]) == sorted(before)
    assert {p.pid for p in h.workers()} == before
    h.stop_and_check()


def test_max_jobs_with_jitter_recycles_apart_with_ready_workers_never_below_target(
    herder, conn: Redis
) -> None:
    h = herder(workers="4", max_jobs="40", max_jobs_jitter="30", recycle_share="0.25")
    first = {p.pid for p in h.wait_workers(4)}
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(len(ready_pids(h.snapshot())))
            time.sleep(0.05)  # a sampling interval, not a wait for a state

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # Keep work coming until every first worker has reached its limit and been recycled (one
    # at a time, each after a replacement is ready): a fixed batch could drain first.
    ids: list[str] = []
    deadline = time.monotonic() + 90
    while first & {p.pid for p in h.workers()} and time.monotonic() < deadline and len(ids) < 4000:
        if conn.llen("rq:queue:default") < 40:
            ids += enqueue(conn, "record", 40, "recycle", 0.01)
        time.sleep(0.05)  # the feeder's pace, not a wait for a state
    wait_for(lambda: len(finished(conn, "recycle")) >= len(ids), 60, what="every job to finish")
    stop.set()
    sampler.join(5)
    assert not first & {p.pid for p in h.workers()}, "a first worker was never recycled"
    assert sorted(finished(conn, "recycle")) == sorted(ids)  # each once: nothing interrupted
    assert min(samples) >= 4, f"ready workers dipped to {min(samples)}"
    totals = h.totals()
    recycled = totals["recycled"].get("recycled after max jobs", 0)
    assert recycled >= 4, recycled
    assert totals["killed"] == 0
    stops = [
        line for line in h.log().splitlines() if "recycled after max jobs" in line and "-> stopping" in line
    ]
    assert len({line.split(" pid ")[1].split(":")[0] for line in stops}) == len(stops)  # each one once
    h.stop_and_check()


def test_a_leaking_worker_is_recycled_between_jobs_past_max_memory(herder, conn: Redis) -> None:
    h = herder(workers="1", max_memory="120", max_memory_hard="1000")
    (first,) = h.wait_workers(1)
    ids = enqueue(conn, "leak", 6, "leak", 30)  # 30 MB more each job
    wait_for(lambda: len(finished(conn, "leak")) == 6, 60, what="the leaking jobs to finish")
    assert sorted(finished(conn, "leak")) == sorted(ids)  # each ran once, none interrupted
    h.wait_status(lambda s: "recycled after max memory" in str(s["totals"]["recycled"]), 20, what="a recycle")
    h.wait_workers(1, timeout=20, without={first.pid})  # the leaky worker gone, its replacement ready
    assert h.totals()["killed"] == 0
    h.stop_and_check()
