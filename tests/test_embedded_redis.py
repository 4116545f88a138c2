"""With no Redis URL, herder runs its own redis-server, owned by the watchdog."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from rq import Queue

from harness import HERDER, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def short_state_dir():
    # Unix socket paths are short (104-108 bytes): keep the state dir near the root.
    d = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp"))
    yield d / "state"
    shutil.rmtree(d, ignore_errors=True)


def embedded_redis_pids(state_dir: Path) -> list[int]:
    sock = str(state_dir / "redis.sock")
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"] and sock in " ".join(p.info["cmdline"])
    ]


def test_runs_jobs_on_its_own_redis_and_keeps_the_queue_across_restarts(herder, short_state_dir: Path):
    h = herder(redis_url=None, workers="1", state_dir=str(short_state_dir))
    h.wait_workers(1)
    url = f"unix://{short_state_dir}/redis.sock?db=0"
    status = subprocess.run(
        [HERDER, "status", "--state-dir", str(short_state_dir)], capture_output=True, text=True
    )
    assert status.returncode == 0 and url in status.stdout
    assert oct((short_state_dir / "redis.sock").stat().st_mode & 0o777) == "0o700"
    r = Redis.from_url(url)
    done = Queue(connection=r).enqueue("herder_testjobs.record", "e")
    wait_for(
        lambda: r.lrange("finished:e", 0, -1) == [done.id.encode()], 15, what="a job on the embedded redis"
    )
    parked = Queue("parked", connection=r).enqueue("herder_testjobs.record", "p")  # nobody serves "parked"
    (redis_pid,) = embedded_redis_pids(short_state_dir)
    # A master crash does not touch the queue: the watchdog owns the Redis.
    master = h.master()
    master.kill()
    wait_for(lambda: (m := h.master()) is not None and m.pid != master.pid, 10, what="a new master")
    assert embedded_redis_pids(short_state_dir) == [redis_pid]
    h.stop_and_check()
    assert embedded_redis_pids(short_state_dir) == []  # stopped with herder
    # Start again on the same state dir: the parked job is still there, and runs when served.
    h2 = herder(redis_url=None, workers="1", state_dir=str(short_state_dir), queue=["parked"])
    h2.wait_workers(1)
    r2 = Redis.from_url(url)
    wait_for(lambda: r2.lrange("finished:p", 0, -1) == [parked.id.encode()], 15, what="the parked job")
    h2.stop_and_check()
    assert embedded_redis_pids(short_state_dir) == []


def test_embedded_redis_that_dies_is_started_again(herder, short_state_dir: Path):
    h = herder(redis_url=None, workers="1", state_dir=str(short_state_dir))
    h.wait_workers(1)
    (first,) = embedded_redis_pids(short_state_dir)
    psutil.Process(first).kill()
    wait_for(
        lambda: (pids := embedded_redis_pids(short_state_dir)) and pids[0] != first,
        10,
        what="a new embedded redis",
    )
    url = f"unix://{short_state_dir}/redis.sock?db=0"
    r = Redis.from_url(url)

    def answers() -> bool:  # the new process is there before its socket is
        try:
            return bool(r.ping())
        except RedisConnectionError:
            return False

    wait_for(answers, 10, what="the new embedded redis to answer")
    job = Queue(connection=r).enqueue("herder_testjobs.record", "again")
    wait_for(
        lambda: r.lrange("finished:again", 0, -1) == [job.id.encode()], 20, what="work after the restart"
    )
    h.stop_and_check()
    assert embedded_redis_pids(short_state_dir) == []


def test_herder_stop_returns_when_all_of_herder_has_exited(herder, short_state_dir: Path):
    """`herder stop` returns once the watchdog has exited too, the last of herder: after the
    master, its workers and the embedded Redis the watchdog stops. "stopped" means nothing of
    that herder is left, as `systemctl stop` or `supervisorctl shutdown` would mean it."""
    h = herder(redis_url=None, workers="2", state_dir=str(short_state_dir))
    h.wait_workers(2)
    (redis_pid,) = embedded_redis_pids(short_state_dir)
    # A Redis slow to shut down (one writing a large dump), made certain: frozen, it leaves the
    # watchdog waiting for it (15 s, then SIGKILL) well after the master has exited.
    os.kill(redis_pid, signal.SIGSTOP)
    argv = [HERDER, "stop", "--state-dir", str(short_state_dir)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    left = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in h.processes()]  # at once: no wait
    assert r.returncode == 0 and r.stdout.splitlines() == ["stopping 2 workers", "stopped"], r
    assert not left, f"alive after `herder stop` returned: {left}"
    assert h.wait_exit(5) == 0
