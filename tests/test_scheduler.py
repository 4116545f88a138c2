"""RQ's scheduler under herder: enqueue_in/enqueue_at and Retry intervals run on time, in
exactly one place per queue across hosts, move within a second when their holder is killed,
and stay put when the setting is off. Real redis-server, real `herder run`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import timedelta
from typing import Any

import pytest
from redis import Redis
from rq import Retry
from rq.job import Job
from rq.registry import ScheduledJobRegistry

from harness import HERDER, Herder, plain_spawns, wait_for

pytestmark = pytest.mark.slow

LOCK = "rq:scheduler-lock:default"  # RQ's scheduler lock of the queue the tests use
LATE = 2.5  # a tick is 1 s; the rest is slack for a loaded test machine


def stamps(conn: Redis, tag: str) -> list[tuple[str, float]]:
    """(job id, wall time) of each run of herder_testjobs.stamp / fail_times, in order."""
    out = []
    for raw in conn.lrange(f"stamped:{tag}", 0, -1):
        job_id, at = raw.decode().split()
        out.append((job_id, float(at)))
    return out


def scanners(conn: Redis, seconds: float) -> set[str]:
    """The Redis clients that scanned the default queue's ScheduledJobRegistry for due jobs
    (RQ's get_jobs_to_schedule) in the next `seconds`: the schedulers actually at work."""
    found = set()
    with conn.monitor() as m:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # workers' BLPOPs keep commands coming
            cmd = m.next_command()
            if cmd["command"].lower().startswith("zrangebyscore rq:scheduled:default "):
                found.add(f"{cmd['client_address']}:{cmd['client_port']}")
    return found


def holding(h: Herder) -> dict[str, Any]:
    """Status once this host's scheduler holds the default queue's lock."""
    return h.wait_status(
        lambda s: s["scheduler"]["holds"] == ["default"],
        15,
        what="this host's scheduler to hold the lock of queue default",
    )["scheduler"]


def holder_of(h: Herder) -> dict[str, Any] | None:
    s = h.try_snapshot()
    sched = s and s.get("scheduler")  # None while the master starts
    return sched["queues"][0]["holder"] if sched else None


def status_text(h: Herder) -> str:
    r = subprocess.run(
        [HERDER, "status", "--state-dir", h.state_dir], capture_output=True, text=True, timeout=30
    )
    assert r.returncode in (0, 3), r.stderr
    return r.stdout


def test_enqueue_in_and_retry_intervals_run_on_time(herder, jobs, conn: Redis) -> None:
    h = herder(workers="2")
    h.wait_workers(2)
    st = holding(h)
    sched = h.scheduler()
    assert sched is not None and st["pid"] == sched.pid and st["state"] == "idle"
    assert f"scheduler: pid {sched.pid} (idle); holds default" in status_text(h)
    if not plain_spawns():
        # Forked from the fork server as a worker is (it shares its imports), the master's child.
        assert sched.name() == "herder-sched" and sched.ppid() == h.master().pid

    # RQ keeps due times in whole seconds (it truncates them): enqueue just after a second
    # begins, so the due time RQ records is enqueue + 2 s to within a few milliseconds.
    wait_for(lambda: time.time() % 1 < 0.03, 5, interval=0.002)
    enqueued_at = time.time()
    later = jobs.queue.enqueue_in(timedelta(seconds=2), "herder_testjobs.stamp", "in")
    registry = ScheduledJobRegistry("default", connection=conn)
    due = registry.get_scheduled_time(later).timestamp()
    assert due in (int(enqueued_at) + 2, int(enqueued_at) + 3)  # 3: a second turned in between
    doomed = jobs.enqueue("fail_times", "doomed", 99, retry=Retry(max=2, interval=1))
    saved = jobs.enqueue("fail_times", "saved", 1, retry=Retry(max=2, interval=1))
    wait_for(lambda: stamps(conn, "in"), 2 + LATE + 2, what="the job enqueued in 2 s to run")
    ((job_id, ran_at),) = stamps(conn, "in")
    assert job_id == later.id
    assert due <= ran_at <= due + LATE and ran_at - enqueued_at >= 2 - 0.03, (
        f"ran {ran_at - enqueued_at:.2f} s after enqueue_in(2 s)"
    )

    # Retry(max=2, interval=1): RQ runs a job that keeps failing three times, a second apart
    # (less up to a second, as RQ truncates each due time)...
    wait_for(lambda: jobs.status(doomed.id) == "failed", 15, what="the doomed job to fail for good")
    runs = [at for _, at in stamps(conn, "doomed")]
    assert len(runs) == 3
    gaps = [b - a for a, b in zip(runs, runs[1:], strict=False)]
    assert all(0 < g <= 1.0 + LATE for g in gaps), gaps
    # ...and a job that succeeds on its retry finishes, after two runs.
    wait_for(lambda: jobs.status(saved.id) == "finished", 10, what="the retried job to succeed")
    assert len(stamps(conn, "saved")) == 2
    assert ScheduledJobRegistry("default", connection=conn).count == 0
    h.stop_and_check()
    assert conn.get(LOCK) is None  # a graceful stop releases the lock for the next scheduler


def test_two_hosts_run_each_scheduled_job_exactly_once(herder, jobs, conn: Redis) -> None:
    a, b = herder(workers="2", host_id="a"), herder(workers="2", host_id="b")
    a.wait_workers(2)
    b.wait_workers(2)
    wait_for(lambda: holder_of(a) and holder_of(b), 15, what="both hosts to see a lock holder")
    ids = [jobs.queue.enqueue_in(timedelta(seconds=1), "herder_testjobs.stamp", "once").id for _ in range(20)]
    retried = jobs.enqueue("fail_times", "retried", 99, retry=Retry(max=2, interval=1))
    wait_for(lambda: len(stamps(conn, "once")) >= 20, 10, what="20 scheduled jobs to run")
    wait_for(lambda: jobs.status(retried.id) == "failed", 15, what="the retried job to fail for good")
    # An absence over time: two more scheduler ticks (1 s each), in which a second scheduler
    # that had moved the same jobs would have enqueued them again.
    time.sleep(2)
    assert sorted(job_id for job_id, _ in stamps(conn, "once")) == sorted(ids)
    assert len(stamps(conn, "retried")) == 3
    # Both hosts agree on the holder; exactly one of them holds it, the other stands by.
    sa, sb = a.snapshot()["scheduler"], b.snapshot()["scheduler"]
    ha, hb = sa["queues"][0]["holder"], sb["queues"][0]["holder"]
    assert ha["name"] == hb["name"] and ha["here"] != hb["here"]
    assert sorted([sa["holds"], sb["holds"]]) == [[], ["default"]]
    assert sa["state"] == sb["state"] == "idle"
    standby, active = (a, b) if sb["holds"] else (b, a)
    # Not only the outcome: only one scheduler looks for due jobs at all.
    assert len(scanners(conn, 3)) == 1
    assert "holds the scheduler lock of default" in active.log()
    assert "holds the scheduler lock of default" not in standby.log()
    assert "standing by for default (another scheduler holds it)" in standby.log()
    host = "b" if active is b else "a"
    assert f"default scheduled by pid {active.scheduler().pid} on host {host}" in status_text(standby)
    a.stop_and_check()
    b.stop_and_check()


def test_kill_9_of_the_scheduler_moves_it_within_a_second(herder, jobs, conn: Redis) -> None:
    a, b = herder(workers="1", host_id="a"), herder(workers="1", host_id="b")
    a.wait_workers(1)
    b.wait_workers(1)
    held = wait_for(lambda: holder_of(a), 15, what="a scheduler lock holder")
    victim_host = a if held["host_id"] == "a" else b
    victim = victim_host.scheduler()
    assert victim is not None and victim.pid == held["pid"]
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    enqueued_at = time.time()
    job = jobs.queue.enqueue_in(timedelta(seconds=1), "herder_testjobs.stamp", "after")
    new = wait_for(
        lambda: (n := conn.get(LOCK)) and n.decode() != held["name"] and n.decode(), 5, what="a new holder"
    )
    moved_in = time.monotonic() - killed_at
    assert moved_in < 2.0, f"the lock moved {moved_in:.2f} s after the kill"
    wait_for(lambda: stamps(conn, "after"), 1 + LATE + 2, what="a job scheduled after the kill to run")
    ((job_id, ran_at),) = stamps(conn, "after")
    assert job_id == job.id and ran_at - enqueued_at <= 1 + LATE
    # Status, on both hosts, names the new holder; the killed host runs a new scheduler.
    live = {p.pid for p in (a.scheduler(), b.scheduler()) if p is not None}
    for h in (a, b):
        now = wait_for(lambda h=h: (x := holder_of(h)) and x["name"] == new and x, 5)
        assert now["pid"] in live and now["pid"] != victim.pid
    replacement = victim_host.snapshot()["scheduler"]
    assert replacement["pid"] not in (None, victim.pid) and replacement["spawned"] == 2
    assert f"scheduler pid {victim.pid}: exited (killed by SIGKILL, unexpected)" in victim_host.log()
    # The kill was the scheduler's alone: no worker was killed, none respawned.
    assert victim_host.totals()["spawned"] == 1 and victim_host.totals()["killed"] == 0
    a.stop_and_check()
    b.stop_and_check()


def test_frozen_scheduler_is_killed_and_its_lock_moves(herder, jobs, conn: Redis) -> None:
    h = herder(workers="1", heartbeat_timeout="2")
    h.wait_workers(1)
    first = holding(h)
    os.kill(first["pid"], signal.SIGSTOP)
    frozen_at = time.monotonic()
    # Its lock outlives the master's patience: the master kills it and frees the lock.
    wait_for(lambda: (n := conn.get(LOCK)) and n.decode() != first["name"], 10, what="the lock to move")
    assert time.monotonic() - frozen_at < 2 + 1 + 2  # heartbeat timeout + a kill + a respawn
    # Its states change through the workers' funnel, and say so: idle -> killing (why).
    killing = f"scheduler pid {first['pid']}: idle -> killing (SIGTERM to its process group: silent for"
    assert killing in h.log()
    job = jobs.queue.enqueue_in(timedelta(seconds=1), "herder_testjobs.stamp", "thawed")
    wait_for(lambda: stamps(conn, "thawed"), 1 + LATE + 2, what="a scheduled job to run")
    assert stamps(conn, "thawed")[0][0] == job.id
    h.stop_and_check()


def test_scheduler_off_leaves_scheduled_jobs_alone(herder, jobs, conn: Redis) -> None:
    h = herder(workers="1", no_scheduler=True)
    h.wait_workers(1)
    job = jobs.queue.enqueue_in(timedelta(seconds=1), "herder_testjobs.stamp", "never")
    retried = jobs.enqueue("fail_times", "once", 99, retry=Retry(max=2, interval=1))
    wait_for(lambda: jobs.status(retried.id) == "scheduled", 10, what="the failed job to wait for its retry")
    # An absence over time: the scheduled job was due after 1 s and the retry after its 1 s
    # interval; for 3 s nothing moves them, as no scheduler runs.
    time.sleep(3)
    assert h.scheduler() is None
    assert stamps(conn, "never") == [] and len(stamps(conn, "once")) == 1
    assert Job.fetch(job.id, connection=conn).get_status() == "scheduled"
    assert ScheduledJobRegistry("default", connection=conn).count == 2
    st = h.snapshot()["scheduler"]
    assert (st["enabled"], st["state"], st["pid"], st["holds"]) == (False, "off", None, [])
    assert st["queues"] == [{"name": "default", "holder": None}] and st["read_age"] is not None
    text = status_text(h)
    assert "scheduler: off on this host (--no-scheduler); default: NO scheduler holds its lock" in text
    # A scheduler elsewhere (here: a lock taken as RQ's would) is named, as not herder's.
    conn.set(LOCK, "elsewhere", ex=30)
    conn.hset("rq:scheduler:elsewhere", mapping={"hostname": "otherbox", "pid": "4242"})
    wait_for(lambda: holder_of(h), 5, what="status to see the other scheduler")
    assert "default scheduled by pid 4242 on otherbox (not herder's)" in status_text(h)
    assert conn.get(LOCK) == b"elsewhere"  # herder never touches a lock it does not hold
    h.stop_and_check()


def test_reload_restarts_the_scheduler_for_new_queues_and_turns_it_off(
    herder, jobs, conn: Redis, tmp_path
) -> None:
    cfg = tmp_path / "herder.toml"
    cfg.write_text("[herder]\nworkers = 1\n")
    h = herder(config=str(cfg))
    h.wait_workers(1)
    first = holding(h)
    # New queues: a new scheduler process, for them all.
    cfg.write_text("[herder]\nworkers = 1\nqueue = ['high', 'default']\n")
    h.signal(signal.SIGHUP)
    st = h.wait_status(lambda s: s["scheduler"]["holds"] == ["high", "default"], 15)["scheduler"]
    assert st["pid"] != first["pid"]
    assert f"scheduler pid {first['pid']}: idle -> stopping (`stop`: its settings changed)" in h.log()
    # Off: it stops and lets go of its locks.
    cfg.write_text("[herder]\nworkers = 1\nqueue = ['high', 'default']\nscheduler = false\n")
    h.signal(signal.SIGHUP)
    h.wait_status(lambda s: s["scheduler"]["state"] == "off", 10, what="the scheduler off")
    wait_for(lambda: h.scheduler() is None, 10, what="no scheduler process")
    assert f"scheduler pid {st['pid']}: exited (exit code 0, after `stop`)" in h.log()
    wait_for(lambda: conn.get(LOCK) is None and conn.get("rq:scheduler-lock:high") is None, 5)
    h.stop_and_check()


def test_the_setting_from_flag_environment_and_file(tmp_path) -> None:
    def config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
        return subprocess.run(
            [HERDER, "config", *args], capture_output=True, text=True, env={**environ, **(env or {})}
        )

    def value(r: subprocess.CompletedProcess[str]) -> str:
        assert r.returncode == 0, r.stderr
        (line,) = [x for x in r.stdout.splitlines() if x.startswith("scheduler ")]
        return " ".join(line.split())

    assert value(config()) == "scheduler True # default"
    assert value(config("--no-scheduler")) == "scheduler False # command line (--no-scheduler)"
    assert (
        value(config(env={"HERDER_SCHEDULER": "off"})) == "scheduler False # environment (HERDER_SCHEDULER)"
    )
    assert value(config("--scheduler", env={"HERDER_SCHEDULER": "0"})).startswith("scheduler True")
    f = tmp_path / "h.toml"
    f.write_text("[herder]\nscheduler = false\n")
    assert value(config("--config", str(f))) == f"scheduler False # file {f}"
    bad = config(env={"HERDER_SCHEDULER": "maybe"})
    assert bad.returncode == 78
    assert "'scheduler' from environment (HERDER_SCHEDULER): must be true or false, got 'maybe'" in bad.stderr
