"""A flaky network between herder and Redis loses no job and wedges no worker.

A TCP proxy (tests/faultproxy.py) sits between herder and a real redis-server; the jobs record
their runs over a connection of their own, straight to Redis, so only herder's own traffic
crosses the faults. While a few thousand short jobs run, the proxy breaks connections one at a
time at random moments: resets (at whatever byte a request or reply is), connections that go
silently dead (nothing forwarded, nothing closed), and stalls of all traffic. Then the network
heals, and what a user cares about is asserted: every job ran at least once and ends
`finished`, none is left in RQ's registries or the intermediate list, duplicates are few, no
worker stayed wedged, the master never restarted, and herder stops cleanly.
"""

from __future__ import annotations

import random
import re
import subprocess
import time
from pathlib import Path

import pytest
from redis import Redis
from rq import Queue

from faultproxy import FaultProxy
from harness import start_redis, wait_for

pytestmark = pytest.mark.slow

JOBS = 1600
JOB_SECONDS = 0.04  # 4 workers take about 16 s for them all: jobs run through every fault
FAULTS_FOR = 16.0  # seconds of faults, then the network is healthy again


def enqueue(conn: Redis, n: int, port: int) -> list[str]:
    q = Queue("default", connection=conn)
    with conn.pipeline() as pipe:
        jobs = [
            Queue.prepare_data(
                "herder_netjobs.tick", (i, port, JOB_SECONDS), job_id=f"net-{i}", result_ttl=3600
            )
            for i in range(n)
        ]
        q.enqueue_many(jobs, pipeline=pipe)
        pipe.execute()
    return [f"net-{i}" for i in range(n)]


def unfinished(conn: Redis, ids: list[str]) -> list[str]:
    with conn.pipeline() as pipe:
        for job_id in ids:
            pipe.hget(f"rq:job:{job_id}", "status")
        statuses = pipe.execute()
    return [job_id for job_id, s in zip(ids, statuses, strict=True) if s != b"finished"]


def leftovers(conn: Redis) -> dict[str, int]:
    keys = ["rq:wip:default", "rq:queue:default:intermediate", "rq:queue:default", "rq:failed:default"]
    kinds = {k: conn.type(k) for k in keys}
    out = {}
    for key, kind in kinds.items():
        out[key] = conn.zcard(key) if kind == b"zset" else conn.llen(key) if kind == b"list" else 0
    return out


def break_things(proxy: FaultProxy, until: float, rng: random.Random) -> None:
    """Resets most of all, now and then every connection at once, a silently dead connection,
    or two seconds of all traffic held."""
    while time.monotonic() < until:
        time.sleep(rng.uniform(0.3, 1.5))
        roll = rng.random()
        if roll < 0.55:
            proxy.reset_one()
        elif roll < 0.7:
            proxy.reset_all()
        elif roll < 0.9:
            proxy.silence_one()
        else:
            proxy.stall(2.0)
    proxy.heal()


@pytest.mark.parametrize("path", ["fast", "rq"])
def test_resets_dead_connections_and_stalls_lose_no_job_and_wedge_no_worker(
    herder, tmp_path: Path, path: str
) -> None:
    """Both worker paths: the fast path's one script call a job, and RQ's own calls."""
    proc, port = start_redis(tmp_path)
    proxy = FaultProxy(port, seed=27)
    direct = Redis(port=port)
    try:
        ids = enqueue(direct, JOBS, port)
        flags = {"no_fast_path": True} if path == "rq" else {}
        h = herder(redis_url=proxy.url(), workers="4", no_scheduler=True, **flags)
        h.wait_workers(4)
        master = h.master()
        assert master is not None
        rng = random.Random(11)  # 18 faults in 16 s: 9 resets, 5 of all, 3 silent deaths, 1 stall
        break_things(proxy, time.monotonic() + FAULTS_FOR, rng)
        healed = time.monotonic()
        # Healthy again: every job ends, within the bound a wedged worker is given up by.
        try:
            wait_for(
                lambda: not unfinished(direct, ids), 60, what="every job to finish after the network healed"
            )
        except AssertionError:
            stuck = unfinished(direct, ids)
            states = {j: direct.hmget(f"rq:job:{j}", "status", "worker_name") for j in stuck[:10]}
            raise AssertionError(f"{len(stuck)} jobs unfinished: {states}; {leftovers(direct)}") from None
        took = time.monotonic() - healed
        ran = [int(x) for x in direct.lrange("ran", 0, -1)]
        assert set(ran) == set(range(JOBS))  # every job ran at least once
        duplicates = len(ran) - JOBS
        assert duplicates <= JOBS // 20, duplicates  # at least once: a few, never a flood
        # A lost reply can leave a finished job's entry in the started registry under a live worker
        # that runs others: the sweep takes it once --progress-timeout (30 s) has passed.
        try:
            wait_for(lambda: not any(leftovers(direct).values()), 30 + 10, what="no job left")
        except AssertionError:
            raise AssertionError(f"left in a registry or list: {leftovers(direct)}") from None
        assert (now := h.master()) is not None and now.pid == master.pid  # the master never restarted
        faults = proxy.counts
        print(f"faults {faults}; duplicates {duplicates}; all done {took:.1f} s after healing")
        assert faults["resets"] > 10 and faults["silenced"] >= 2 and faults["stalls"] >= 1
        h.stop_and_check()
    finally:
        proxy.close()
        proc.terminate()
        proc.wait(10)


def test_a_long_job_is_its_own_time_not_a_stuck_loop(herder, conn: Redis) -> None:
    """The progress bound judges the worker's loop outside the job's own code: a job that runs
    past it (its code, its callbacks) is never killed for it."""
    q = Queue("default", connection=conn)
    h = herder(workers="1", progress_timeout="7", redis_timeout="1.1", no_scheduler=True)
    h.wait_workers(1)
    job = q.enqueue("herder_testjobs.record", "long", 9)
    wait_for(lambda: job.get_status(refresh=True) == "finished", 30, what="the long job to finish")
    assert conn.lrange("finished:long", 0, -1) == [job.id.encode()]
    assert h.totals()["killed"] == 0
    h.stop_and_check()


def test_workers_born_while_redis_refuses_connections_wait_and_health_names_the_cause(
    herder, tmp_path: Path
) -> None:
    """Redis killed, not yet back: every connection is refused. The workers born meanwhile wait
    for it (as ones born into a freeze do) instead of exiting and backing their slots off, and
    the health's reason is the cause, "redis unreachable", not the symptoms that follow."""
    proc, port = start_redis(tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    h = herder(redis_url=url, workers="2", no_scheduler=True, health_grace="1")
    h.wait_workers(2)
    Redis(port=port).shutdown(nosave=True)
    proc.wait(10)
    h.wait_status(lambda s: "redis unreachable" in s["health"], 15, what="health: redis unreachable")
    for w in h.workers():
        w.kill()  # replaced while Redis refuses every connection
    st = h.wait_status(
        lambda s: s["totals"]["spawned"] >= 4 and len(s["workers"]) == 2,
        15,
        what="two workers born into the outage",
    )
    health = st["health"]
    assert health.startswith("degraded: redis unreachable") and "below" not in health, health
    born = {w["pid"] for w in st["workers"]}
    # Waiting, not dying: over two heartbeat timeouts of refusals, the same two workers live.
    deadline = time.monotonic() + 2 * 3.0
    while time.monotonic() < deadline:
        st = h.snapshot()
        assert {w["pid"] for w in st["workers"]} == born, st["workers"]
        assert "below" not in st["health"], st["health"]
        time.sleep(0.5)
    assert not re.search(r"exited \(exit code 1", h.log())
    back = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    try:
        h.wait_workers(2, timeout=20)
        assert {p.pid for p in h.workers()} == born  # the very workers that waited took up work
        h.wait_status(lambda s: s["health"] == "ok", 20, what="health ok again")
        h.stop_and_check()
    finally:
        back.terminate()
        back.wait(10)


def test_a_sentinel_failover_mid_load_loses_no_job(herder, tmp_path: Path) -> None:
    """Redis through Sentinel, a replica beside the master, and a failover while jobs run: the
    old master turns replica under herder's open connections (its writes refused, READONLY),
    the address of the master moves. Every connection finds the new one; every job ends."""
    import shutil

    from harness import free_port

    for name in ("primary", "replica"):
        (tmp_path / name).mkdir()
    primary, port = start_redis(tmp_path / "primary")
    replica, rport = start_redis(tmp_path / "replica", "--replicaof", "127.0.0.1", str(port))
    sport = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {sport}\nbind 127.0.0.1\ndir {tmp_path}\nsentinel monitor mymaster 127.0.0.1 {port} 1\n"
        "sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 5000\n"
    )
    sentinel = subprocess.Popen([shutil.which("redis-server") or "redis-server", str(conf), "--sentinel"],
                                stdout=subprocess.DEVNULL)  # fmt: skip
    ask = Redis(port=sport)
    try:
        # A replica that has not synced yet would be promoted empty: Redis's loss, not herder's.
        wait_for(lambda: _synced(Redis(port=rport)), 20, what="the replica to sync")
        wait_for(lambda: _replicas_known(ask), 20, what="the Sentinel to know the master and its replica")
        q = Queue("default", connection=Redis(port=port))
        ids = [q.enqueue("herder_netjobs.nap", 0.04, job_id=f"fo-{i}").id for i in range(800)]
        url = f"redis+sentinel://127.0.0.1:{sport}/mymaster/0"
        # The failover loses the old master's last writes (replication is asynchronous): a job
        # whose start the new master has and whose finish it lost is started under a live worker
        # that runs another: recovered after --progress-timeout (short here).
        h = herder(redis_url=url, workers="4", no_scheduler=True, progress_timeout="7", redis_timeout="1.1")
        h.wait_workers(4)
        wait_for(lambda: len(unfinished(Redis(port=port), ids)) < 600, 30, what="jobs under way")
        ask.execute_command("SENTINEL", "FAILOVER", "mymaster")
        wait_for(lambda: _master_port(ask) == rport, 20, what="the replica promoted")
        new = Redis(port=rport)
        wait_for(lambda: not unfinished(new, ids), 60, what="every job to finish on the new master")
        assert not any(leftovers(new).values()), leftovers(new)
        h.stop_and_check()
    finally:
        for p in (sentinel, replica, primary):
            p.terminate()
            p.wait(10)


def _synced(replica: Redis) -> bool:
    return replica.info("replication").get("master_link_status") == "up"


def _replicas_known(ask: Redis) -> bool:
    try:
        return bool(ask.execute_command("SENTINEL", "replicas", "mymaster"))
    except Exception:
        return False


def _master_port(ask: Redis) -> int | None:
    try:
        return int(ask.execute_command("SENTINEL", "get-master-addr-by-name", "mymaster")[1])
    except Exception:
        return None
