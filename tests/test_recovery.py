"""No job lost, whatever the moment of the fault: kills between jobs and mid-pop, Redis
killed and restarted from its append-only file, Redis frozen, a whole host gone.

Each test asserts what a user cares about: every job ran (at least once), duplicates no
more than the faults that could cause them, nothing left running.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest
from redis import Redis
from rq import Queue

from harness import SHORT_TIMEOUT_FLAGS, redis_on, start_redis, wait_for

pytestmark = pytest.mark.slow

HEARTBEAT_TIMEOUT = float(SHORT_TIMEOUT_FLAGS["--heartbeat-timeout"])


def kill_storm(h, kills: int, stop: threading.Event, pause: tuple[float, float] = (0.05, 0.25)) -> list[int]:
    """kill -9 a random worker of `h` at random moments, `kills` times; the pids killed."""
    rng = random.Random(os.getpid())
    killed: list[int] = []
    while len(killed) < kills and not stop.is_set():
        time.sleep(rng.uniform(*pause))
        workers = h.workers()
        if not workers:
            continue
        victim = rng.choice(workers)
        try:
            victim.send_signal(signal.SIGKILL)
            killed.append(victim.pid)
        except psutil.NoSuchProcess:
            pass
    return killed


def runs(conn: Redis, tag: str) -> collections.Counter[str]:
    return collections.Counter(x.decode() for x in conn.lrange(f"finished:{tag}", 0, -1))


def assert_all_ran(conn: Redis, tag: str, ids: list[str], timeout: float) -> None:
    """Every job ran; if not, say where the missing ones are (the queue, RQ's intermediate
    list, its StartedJobRegistry, its FailedJobRegistry)."""
    try:
        wait_for(lambda: set(runs(conn, tag)) >= set(ids), timeout, interval=0.2, what="every job to run")
    except AssertionError:
        missing = set(ids) - set(runs(conn, tag))
        where = {
            "queued": {x.decode() for x in conn.lrange("rq:queue:default", 0, -1)},
            "intermediate": {x.decode() for x in conn.lrange("rq:queue:default:intermediate", 0, -1)},
            "started": {x.decode().split(":")[0] for x in conn.zrange("rq:wip:default", 0, -1)},
            "failed": {x.decode() for x in conn.zrange("rq:failed:default", 0, -1)},
        }
        raise AssertionError(
            f"{len(missing)} of {len(ids)} jobs never ran: "
            + ", ".join(f"{k} {len(missing & v)}" for k, v in where.items())
        ) from None


def test_kill_storm_at_random_moments_loses_no_job(herder, conn: Redis, jobs) -> None:
    """30 kill -9s of random workers at random moments (between jobs, mid-pop, mid-job)
    while 1,200 short jobs run: every job runs, duplicates at most one per kill."""
    h = herder(workers="4", max_requeues="20")
    h.wait_workers(4)
    q = Queue("default", connection=conn)
    with conn.pipeline() as pipe:
        ids = [q.enqueue("herder_testjobs.record", "storm", 0.005, pipeline=pipe).id for _ in range(1200)]
        pipe.execute()
    stop = threading.Event()
    result: list[list[int]] = []
    killer = threading.Thread(target=lambda: result.append(kill_storm(h, 30, stop)), daemon=True)
    killer.start()
    killer.join(60)  # the storm runs to its end: mid-job while jobs last, between jobs after
    stop.set()
    killed = result[0] if result else []
    assert_all_ran(conn, "storm", ids, timeout=60)
    assert len(killed) >= 30, f"only {len(killed)} kills happened before the jobs ran out"
    done = runs(conn, "storm")
    duplicates = sum(done.values()) - len(done)
    assert duplicates <= len(killed), (duplicates, len(killed))
    h.stop_and_check()


AOF = ("--appendonly", "yes", "--appendfsync", "always")


def test_redis_killed_mid_load_and_restarted_from_its_aof_loses_no_job(herder, tmp_path: Path) -> None:
    proc, port = start_redis(tmp_path, *AOF)
    url = f"redis://127.0.0.1:{port}/0"
    conn = Redis.from_url(url)
    try:
        # health_grace 1: the status says Redis is unreachable a second into the outage.
        h = herder(redis_url=url, workers="4", max_requeues="10", health_grace="1")
        h.wait_workers(4)
        master = h.master()
        q = Queue("default", connection=conn)
        with conn.pipeline() as pipe:
            ids = [q.enqueue("herder_testjobs.record", "aof", 0.02, pipeline=pipe).id for _ in range(400)]
            pipe.execute()
        wait_for(lambda: conn.llen("finished:aof") >= 40, 20, what="the load to be under way")
        proc.kill()  # kill -9, mid-load
        proc.wait(5)
        h.wait_status(lambda s: "redis unreachable" in s["health"], 10, what="herder to see Redis gone")
        # The fault's length: down for a heartbeat timeout more, long enough for every part of
        # herder (workers mid-job, the master's reader and recovery) to run into it.
        time.sleep(HEARTBEAT_TIMEOUT)
        proc = redis_on(port, tmp_path, *AOF)  # from the append-only file
        assert_all_ran(conn, "aof", ids, timeout=60)
        assert h.master() is not None and h.master().pid == master.pid, "the master was restarted"
        status = h.snapshot()
        # No churn: at most the workers that were mid-job when Redis died were replaced.
        assert status["totals"]["spawned"] <= 8, status["totals"]
        assert status["slots_in_backoff"] == []
        h.stop_and_check()
    finally:
        proc.kill()
        proc.wait(5)


def test_redis_frozen_for_several_heartbeat_timeouts_kills_at_most_the_budget(herder, tmp_path: Path) -> None:
    proc, port = start_redis(tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    conn = Redis.from_url(url)
    try:
        h = herder(redis_url=url, workers="4", max_requeues="10")
        h.wait_workers(4)
        q = Queue("default", connection=conn)
        ids = [q.enqueue("herder_testjobs.record", "frozen", 0.2).id for _ in range(60)]
        wait_for(lambda: conn.llen("finished:frozen") >= 5, 20, what="the load to be under way")
        proc.send_signal(signal.SIGSTOP)
        # The fault's length, and an absence over it: frozen for more than two heartbeat
        # timeouts, in which herder kills no more than its budget.
        time.sleep(2 * HEARTBEAT_TIMEOUT + 2)
        proc.send_signal(signal.SIGCONT)
        assert_all_ran(conn, "frozen", ids, timeout=60)
        totals = h.totals()
        assert totals["killed"] <= 2, totals  # the kill budget: half of 4 workers per minute
        h.stop_and_check()
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait(5)


def test_a_host_that_dies_whole_has_its_jobs_recovered_by_another(herder, conn: Redis, jobs) -> None:
    """Two hosts on one Redis; one is killed with all its workers mid-job. The other's sweep
    finds the jobs by their lapsed leases and requeues each exactly once."""
    fast = {"workers": "2", "sweep_interval": "1", "max_requeues": "5"}
    a = herder(host_id="host-a", **fast)
    b = herder(host_id="host-b", **fast)
    a.wait_workers(2)
    b.wait_workers(2)
    ids = [jobs.enqueue("record", "hosts", 4).id for _ in range(4)]
    wait_for(lambda: len(jobs.started("hosts")) == 4, 15, what="4 jobs running, two on each host")
    a_pids = {p.pid for p in a.workers()}
    on_a = [i for i in ids if a.worker_for_job(conn, i) in a_pids]
    assert len(on_a) == 2, on_a
    tree = [psutil.Process(a.pid), *psutil.Process(a.pid).children(recursive=True)]
    for p in tree:
        p.send_signal(signal.SIGKILL)  # the whole host at once: watchdog, master, workers
    killed_at = time.monotonic()
    wait_for(
        lambda: all(conn.hget(f"rq:job:{i}", "herder_requeues") for i in on_a), 25, what="A's jobs requeued"
    )
    recovered_in = time.monotonic() - killed_at
    assert_all_ran(conn, "hosts", ids, timeout=30)
    assert runs(conn, "hosts") == {i: 1 for i in ids}  # A's runs died before finishing: one each
    assert [int(conn.hget(f"rq:job:{i}", "herder_requeues")) for i in on_a] == [1, 1]  # never twice
    assert b.totals()["recovered_by_sweep"] == 2
    # The bound docs/design.md gives: the lease (3 s) + a sweep (1 s), within 5 s.
    assert recovered_in < 5, recovered_in
    b.stop_and_check()


@pytest.mark.parametrize(
    ("threads", "redis_first"),
    [("1", True), ("3", False)],
    ids=["redis-then-master", "master-then-redis-threads"],
)
def test_a_dead_masters_workers_exit_while_redis_is_down(
    herder, own_redis, redis_first: bool, threads: str
) -> None:
    """The master and Redis both gone, in either order: every worker, spare, fork server and
    scheduler notices its parent changed and exits within a few heartbeats, even from inside
    a wait for Redis (RQ's own retry sleeps up to a minute and never looks at the master)."""
    proc, port = own_redis
    h = herder(redis_url=f"redis://127.0.0.1:{port}/0", workers="3", threads=threads, health_grace="1")
    h.wait_workers(3)
    master = h.master()
    assert master is not None
    family = {p.pid for p in psutil.Process(master.pid).children(recursive=True)}
    assert len(family) >= 3

    def kill_master() -> None:
        h.signal(signal.SIGKILL)  # the watchdog first, so no new master comes
        h.wait_exit(5)
        master.kill()

    def stop_redis() -> None:
        proc.kill()
        proc.wait(5)

    first, then = (stop_redis, kill_master) if redis_first else (kill_master, stop_redis)
    first()
    if redis_first:  # every worker is in its wait for Redis before its master dies
        h.wait_status(lambda s: "redis unreachable" in s["health"], 10, what="herder to see Redis gone")
        time.sleep(3)  # the fault's shape: every worker's retry has backed off past a heartbeat
    then()
    # The bound: the sentinel sees the new parent within a heartbeat (1 s); the wait for Redis
    # it interrupts lasts at most a heartbeat more.
    wait_for(lambda: not alive(family) and not h.processes(), 6, what="every orphan to exit")


def alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out
