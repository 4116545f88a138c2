"""The RQ features people combine, end to end under herder, with RQ's own tooling: job
dependencies, callbacks, Retry, result and failure TTLs, the Result API, `rq requeue`,
`rq info`, and rq-dashboard's JSON API. Real Redis, real herder, real RQ commands."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from redis import Redis
from rq import Callback, Queue, Retry
from rq.command import send_stop_job_command
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.worker import Worker

from harness import free_port, wait_for

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def callbacks(conn: Redis, job: Job) -> list[str]:
    return [x.decode() for x in conn.lrange(f"callbacks:{job.id}", 0, -1)]


def status(conn: Redis, job: Job) -> str:
    return Job.fetch(job.id, connection=conn).get_status().value


def test_dependencies_callbacks_retry_results_and_rq_requeue(herder, conn: Redis) -> None:
    h = herder(workers="2")
    h.wait_workers(2)
    q = Queue("default", connection=conn)
    first = q.enqueue("herder_rqcompat.add", 1, 2, result_ttl=600)
    then = q.enqueue(
        "herder_rqcompat.add", 3, 4, depends_on=first, on_success=Callback("herder_rqcompat.noted_success")
    )
    broken = q.enqueue(
        "herder_rqcompat.fail", "bad", failure_ttl=300, on_failure=Callback("herder_rqcompat.noted_failure")
    )
    flaky = q.enqueue("herder_testjobs.fail_times", "flaky", 1, retry=Retry(max=2))
    ended = ["finished", "finished", "failed", "finished"]
    wait_for(
        lambda: [status(conn, j) for j in (first, then, broken, flaky)] == ended,
        20,
        what="every job to end as RQ would end it",
    )
    first, then = Job.fetch(first.id, connection=conn), Job.fetch(then.id, connection=conn)
    assert then.started_at >= first.ended_at  # the dependency ran first
    assert first.latest_result().return_value == {"sum": 3, "queue": "default"}  # the Result API
    assert 590 < conn.ttl(f"rq:results:{first.id}") <= 600  # result_ttl
    assert callbacks(conn, then) == ["success {'sum': 7, 'queue': 'default'}"]
    assert callbacks(conn, broken) == ["failure ValueError"]
    assert broken.id in FailedJobRegistry("default", connection=conn).get_job_ids()
    assert len(conn.lrange("stamped:flaky", 0, -1)) == 2  # failed once, retried once, done
    # `rq requeue` puts the failed job back; herder's workers run it again, as rq's would.
    requeue = [BIN / "rq", "requeue", "--all", "--queue", "default", "--url", h.redis_url]
    subprocess.run(requeue, check=True, capture_output=True)
    wait_for(lambda: len(callbacks(conn, broken)) == 2, 20, what="the requeued job to run again")
    h.stop_and_check()


def test_a_stopped_job_calls_on_stopped_and_rq_info_and_rq_dashboard_list_herders_workers(
    herder, conn: Redis
) -> None:
    h = herder(workers="2")
    h.wait_workers(2)
    q = Queue("default", connection=conn)
    job = q.enqueue("herder_rqcompat.slow", 30, on_stopped=Callback("herder_rqcompat.noted_stop"))
    busy = h.worker_for_job(conn, job.id)
    names = {w.pid: w.name for w in Worker.all(connection=conn)}
    assert set(names) == {p.pid for p in h.workers()}
    info = subprocess.run(
        [BIN / "rq", "info", "--url", h.redis_url, "--only-workers"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert all(name in info.stdout for name in names.values()), info.stdout
    port = free_port()
    dashboard = subprocess.Popen(
        [BIN / "rq-dashboard", "--redis-url", h.redis_url, "--bind", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        def listed() -> dict | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/0/data/workers.json", timeout=5) as r:
                    return {w["name"]: w for w in json.load(r)["workers"]}
            except OSError:
                return None

        workers = wait_for(listed, 20, what="rq-dashboard's worker list")
        assert set(workers) == set(names.values())
        assert workers[names[busy]]["current_job"]["job_id"] == job.id
    finally:
        dashboard.terminate()
        dashboard.wait(10)
    send_stop_job_command(conn, job.id)  # rq-dashboard's stop button
    wait_for(lambda: callbacks(conn, job) == ["stopped"], 10, what="on_stopped")
    assert status(conn, job) == "stopped"
    h.stop_and_check()
