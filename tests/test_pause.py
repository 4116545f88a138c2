"""Pause and resume: RQ's own `rq suspend` / `rq resume` (every host) and `herder pause` /
`herder resume` (one host). A person's pause is not a fault: no worker is killed, no job
starts, health stays ok, and stop, scale and rolling restart still work. Real Redis, real
RQ command line, real herder."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from redis import Redis
from rq.job import Job

from harness import SHORT_TIMEOUT_FLAGS, wait_for

pytestmark = pytest.mark.slow

RQ = str(Path(sys.executable).with_name("rq"))


def cli(h, *args: str) -> str:  # noqa: ANN001 - harness.Herder
    r = subprocess.run(
        [h.argv[0], *args, "--state-dir", h.state_dir], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def paused(h) -> list[str | None]:  # noqa: ANN001
    return [w["paused"] for w in h.snapshot()["workers"]]


def ran_on(conn: Redis, ids: list[str]) -> set[int]:
    return {int(Job.fetch(i, connection=conn).worker_name.rsplit(".", 1)[1]) for i in ids}


def test_rq_suspend_starts_no_job_kills_no_worker_and_rq_resume_drains(herder, conn: Redis, jobs) -> None:
    h = herder(workers="2")  # heartbeat timeout 3 s (harness.SHORT_TIMEOUT_FLAGS)
    first = {p.pid for p in h.wait_workers(2)}
    subprocess.run([RQ, "suspend", "--url", h.redis_url], check=True, capture_output=True)
    wait_for(lambda: paused(h) == ["suspended"] * 2, 10, what="both workers to say suspended")
    ids = [jobs.enqueue("record", "s").id for _ in range(5)]
    beats = {key: conn.hget(key, "last_heartbeat") for key in conn.smembers("rq:workers")}
    # An absence over time: through more than two heartbeat timeouts, no job starts and no
    # suspended worker is taken for a silent one and killed.
    time.sleep(2 * float(SHORT_TIMEOUT_FLAGS["--heartbeat-timeout"]) + 2)
    status = h.snapshot()
    assert jobs.started("s") == []
    # As RQ's own suspended worker, each one keeps its heartbeat going in RQ's worker hash.
    assert all(conn.hget(key, "last_heartbeat") != beat for key, beat in beats.items()), beats
    assert {p.pid for p in h.workers()} == first and status["totals"]["killed"] == 0
    assert status["health"] == "ok" and status["suspended"] == 2
    # Scale and rolling restart still work while suspended, and start nothing either.
    cli(h, "scale", "3")
    wait_for(lambda: paused(h) == ["suspended"] * 3, 20, what="the third worker, suspended")
    cli(h, "restart")
    h.wait_status(
        lambda s: (
            [w["paused"] for w in s["workers"]] == ["suspended"] * 3
            and first.isdisjoint(w["pid"] for w in s["workers"])
        ),
        30,
        what="every first worker replaced by a suspended one",
    )
    assert not first & {p.pid for p in h.workers()}
    assert jobs.started("s") == [] and h.totals()["killed"] == 0
    subprocess.run([RQ, "resume", "--url", h.redis_url], check=True, capture_output=True)
    wait_for(lambda: sorted(jobs.finished("s")) == sorted(ids), 20, what="the queue to drain")
    wait_for(lambda: paused(h) == [None] * 3, 5, what="every worker to say it takes jobs again")
    h.stop_and_check()


def test_herder_pause_quiets_one_host_of_two_and_a_paused_host_still_stops_at_once(
    herder, conn: Redis, jobs
) -> None:
    a = herder(host_id="a", workers="2")
    b = herder(host_id="b", workers="2")
    a_pids = {p.pid for p in a.wait_workers(2)}
    b_pids = {p.pid for p in b.wait_workers(2)}
    assert "paused: 2 workers" in cli(a, "pause")
    # A worker says `paused` only from inside its pause loop: from then on it pops nothing.
    wait_for(lambda: paused(a) == ["paused"] * 2, 10, what="host a's workers to say paused")
    assert a.snapshot()["paused"] is True and b.snapshot()["paused"] is False
    ids = [jobs.enqueue("record", "p", 0.05).id for _ in range(12)]
    wait_for(lambda: len(jobs.finished("p")) == 12, 20, what="host b to run every job")
    assert ran_on(conn, ids) <= b_pids
    st = a.snapshot()
    assert st["totals"]["killed"] == 0 and st["health"] == "ok"
    # The other way round: a resumes, b pauses.
    cli(a, "resume")
    cli(b, "pause")
    wait_for(lambda: paused(a) == [None] * 2 and paused(b) == ["paused"] * 2, 10, what="the swap")
    more = [jobs.enqueue("record", "q", 0.05).id for _ in range(6)]
    wait_for(lambda: len(jobs.finished("q")) == 6, 20, what="host a to run the new jobs")
    assert ran_on(conn, more) <= a_pids
    took = b.stop_and_check()  # paused workers end at once on `stop`
    assert took < 5, took
    a.stop_and_check()
