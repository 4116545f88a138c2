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

import psutil
from redis import Redis
from rq import Queue

from conftest import wait_for


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
