"""When herder gives up on a job (its worker died on every attempt, past --max-requeues), the
job ends as the installed RQ ends an abandoned job: failure callback, exception handlers, Retry
with its interval, and on rq 3 also its FAILED webhooks and its rate-limit slot (rq 2 has no
rate limits, and its clean-up of an abandoned job sends no webhook); all in a worker, never in
the master."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
from rq import Callback, Queue, Retry
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.webhook import Webhook

from harness import wait_for
from herder.common import rq_seam

pytestmark = pytest.mark.slow


class Hooks(BaseHTTPRequestHandler):
    calls: list[tuple[str, str, dict]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Hooks.calls.append(("POST", self.path, json.loads(body or b"{}")))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def entries(conn, kind: str, job_id: str) -> list[dict]:  # noqa: ANN001
    return [json.loads(x) for x in conn.lrange(f"contract:{kind}:{job_id}", 0, -1)]


def test_a_job_whose_worker_always_dies_ends_as_rq_ends_an_abandoned_job(herder, conn):
    Hooks.calls = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/failed"
    try:
        h = herder(workers="2", max_requeues="0", exception_handler="herder_rqcontract.handler")
        q = Queue("default", connection=conn)
        gated: dict = {}
        if rq_seam.RQ3:  # a rate limit the doomed job holds, and a job waiting for its slot
            from rq.rate_limit import RateLimit

            gated["rate_limit"] = RateLimit("one-at-a-time", 1)
        doomed = q.enqueue(
            "herder_rqcontract.die_every_time",
            on_failure=Callback("herder_rqcontract.on_failure"),
            retry=Retry(max=1, interval=1),
            webhooks=[Webhook(url, "failed", method="POST")],
            **gated,
        )
        if gated:
            behind = q.enqueue("herder_testjobs.record", "behind-the-gate", **gated)
            assert behind.get_status() == "rate_limited"  # waits for the doomed job's slot

        def failed() -> Job | None:
            job = Job.fetch(doomed.id, connection=conn)
            return job if job.get_status() == "failed" and job.latest_result() else None

        job = wait_for(failed, 30, what="the doomed job to end failed")
        attempts = [float(x) for x in conn.lrange(f"contract:attempt:{doomed.id}", 0, -1)]
        assert len(attempts) == 2  # the first run, and one retry (Retry(max=1))
        # The retry waited out its interval as RQ counts it: RQ schedules in whole seconds
        # (ScheduledJobRegistry truncates the due time), so 1 s means "a later second".
        assert attempts[1] >= int(attempts[0]) + 1
        # The failure callback and the exception handler ran once per give-up (RQ runs them
        # for every failed attempt, retried or not), with herder's reason for giving up.
        for kind in ("callback", "handler"):
            calls = entries(conn, kind, doomed.id)
            assert len(calls) == 2, (kind, calls)
            assert all(c["type"] == "WorkerDied" and "AbandonedJobError" in c["bases"] for c in calls)
            assert all("worker died (exit code 3) while running the job" in c["message"] for c in calls)
        # ... in a worker, never in the master or the watchdog.
        pids = {c["pid"] for kind in ("callback", "handler") for c in entries(conn, kind, doomed.id)}
        master = h.master()
        assert master is not None and master.pid not in pids and h.pid not in pids
        for pid in pids:
            try:
                assert psutil.Process(pid).ppid() == master.pid
            except psutil.NoSuchProcess:
                pass
        # RQ's failure record: the registry and a Result naming why herder gave up.
        assert doomed.id in FailedJobRegistry("default", connection=conn).get_job_ids()
        assert "(limit 0), so failed" in (job.latest_result().exc_string or "")
        if rq_seam.RQ3:
            # The webhook fired once, when the job failed for good.
            wait_for(lambda: Hooks.calls or None, 10, what="the failed webhook")
            assert [(m, p) for m, p, _ in Hooks.calls] == [("POST", "/failed")]
            # Its rate-limit slot was freed: the job behind it ran.
            wait_for(lambda: conn.lrange("finished:behind-the-gate", 0, -1) or None, 20, what="the gated job")
        h.stop_and_check()
        if not rq_seam.RQ3:  # rq 2's clean-up sends none; the worker's log says the ending is done
            assert "given up by herder: failed" in h.log() and Hooks.calls == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_job_whose_worker_hangs_is_ended_with_an_exception_that_says_so(herder, conn):
    import os
    import signal

    h = herder(workers="1", max_requeues="0")
    h.wait_workers(1)
    q = Queue("default", connection=conn)
    job = q.enqueue(
        "herder_testjobs.record", "frozen", 60, on_failure=Callback("herder_rqcontract.on_failure")
    )
    pid = h.worker_for_job(conn, job.id)
    os.kill(pid, signal.SIGSTOP)  # frozen: silent past the 3 s heartbeat timeout, then killed
    try:
        wait_for(
            lambda: Job.fetch(job.id, connection=conn).get_status() == "failed" or None, 30, what="failed"
        )
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    (call,) = entries(conn, "callback", job.id)
    assert call["type"] == "JobHung" and "silent for" in call["message"]
    h.stop_and_check()
