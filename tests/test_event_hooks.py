"""Event hooks end to end (docs/monitoring.md, "Event hooks"): each event reaches a hook
command (JSON on its stdin) and a local HTTP endpoint; a hook that hangs is killed at its
timeout and counted; one that cannot start is logged once; no secret reaches a hook."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
from rq import Queue

from harness import HERDER, free_port, hook_command, metrics, read_events, sample, wait_for
from herder.supervisor.views.hooks import HealthChanges


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    """A local HTTP endpoint that records each POSTed JSON body."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/herder-events", received
    finally:
        server.shutdown()


@pytest.mark.slow
def test_each_event_reaches_the_hook_and_the_webhook(herder, conn, tmp_path, webhook) -> None:
    command, out = hook_command(tmp_path)
    url, posted = webhook
    h = herder(workers="2", on_event=command, on_event_url=url, cull_failures="2", max_requeues="0",
               kill_budget="0.5", heartbeat_timeout="3")  # fmt: skip
    h.wait_workers(2)

    def events(name: str, n: int = 1) -> list[dict] | None:
        got = [e for e in read_events(out) if e["event"] == name]
        return got if len(got) >= n and len([e for e in posted if e["event"] == name]) >= n else None

    q = Queue("default", connection=conn)
    # A job given up: killed mid-job with no requeue left.
    job = q.enqueue("herder_testjobs.record", "given-up", 30)
    wait_for(lambda: conn.llen("started:given-up") or None, 10, what="the job running")
    os.kill(h.worker_for_job(conn, job.id), signal.SIGKILL)
    (given_up,) = wait_for(lambda: events("job_given_up"), 20, what="job_given_up at the hook and the URL")
    assert (given_up["job_id"], given_up["queue"], given_up["pool"]) == (job.id, "default", "default")
    # A worker culled: two failed jobs in a row on one worker.
    h.wait_workers(2)
    for _ in range(4):
        q.enqueue("herder_testjobs.poison", "p")
    (culled, *_) = wait_for(lambda: events("worker_culled"), 20, what="worker_culled")
    assert re.match(r"culled: \d+ failed jobs", culled["reason"]) and culled["pool"] == "default"
    # Every worker frozen: one killed as hung, the other spared (the budget), health degraded.
    workers = h.wait_workers(2)
    for w in workers:
        os.kill(w.pid, signal.SIGSTOP)
    (killed,) = wait_for(lambda: events("worker_killed"), 20, what="worker_killed")
    assert killed["kind"] == "silent" and killed["pid"] in {w.pid for w in workers}
    (spent,) = wait_for(lambda: events("budget_spent"), 20, what="budget_spent")
    assert spent["budget"] == "kill" and "kill budget spent" in spent["reason"]
    changed = wait_for(lambda: events("health_changed"), 10, what="health_changed")
    assert changed[-1]["status"] == "degraded"
    for w in workers:
        if psutil.pid_exists(w.pid):
            os.kill(w.pid, signal.SIGCONT)
    # The master restarted by the watchdog.
    master = h.master()
    assert master is not None
    master.kill()
    (restarted,) = wait_for(lambda: events("master_restarted"), 30, what="master_restarted")
    assert restarted["restarts"] == 1 and restarted["master_pid"] != master.pid
    # What every hook saw: the same event at the command and the URL; no secret, no HERDER_ env.
    for e in read_events(out):
        assert e.pop("env") == ["HERDER_EVENT"] and e.pop("said") == e["event"]
        assert e in posted
        assert h.redis_url not in json.dumps(e)
    h.stop_and_check()


@pytest.mark.slow
def test_a_hanging_hook_is_killed_at_its_timeout_and_counted(herder, tmp_path) -> None:
    command, out = hook_command(tmp_path, hang_on="worker_killed")
    port = free_port()
    h = herder(workers="1", on_event=command, on_event_timeout="1", http=str(port))
    (w,) = h.wait_workers(1)
    os.kill(w.pid, signal.SIGSTOP)  # killed as hung: the event the hook hangs on
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: sample(metrics(base), "herder_event_hooks_total", outcome="timeout") == 1, 20,
             what="the hanging hook counted as timed out")  # fmt: skip
    hung = int((tmp_path / "events.jsonl.hung").read_text())
    assert not psutil.pid_exists(hung)  # killed with its process group, and reaped
    assert "event hook for worker_killed killed after 1 s (its timeout)" in h.log()
    h.wait_workers(1, without={w.pid})
    h.stop_and_check()
    assert read_events(out) == []  # nothing else happened that is an event


@pytest.mark.slow
def test_a_hook_that_cannot_start_is_logged_once_and_counted(herder, tmp_path) -> None:
    port = free_port()
    h = herder(workers="2", on_event=str(tmp_path / "no-such-hook"), http=str(port))
    workers = h.wait_workers(2)
    for w in workers:
        os.kill(w.pid, signal.SIGSTOP)  # a kill, then the budget spent and health degraded: 3 events
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: sample(metrics(base), "herder_event_hooks_total", outcome="unstartable") >= 3, 20,
             what="each delivery counted")  # fmt: skip
    assert h.log().count("cannot start") == 1
    for w in workers:
        if psutil.pid_exists(w.pid):
            os.kill(w.pid, signal.SIGCONT)
    h.stop_and_check()


def test_health_changes_make_events_but_starting_and_stopping_do_not() -> None:
    hc = HealthChanges()
    assert hc.observe([("starting", "starting: 0 of 2 workers ready")]) == []  # the baseline
    assert hc.observe([]) == []  # ready: herder's own doing, not news
    spent = [("kill_budget_spent", "kill budget spent on this host: ...")]
    assert [e for e, _ in hc.observe(spent)] == ["health_changed", "budget_spent"]
    assert hc.observe(spent) == []  # still the same: said once
    [(event, fields)] = hc.observe([])
    assert event == "health_changed" and fields == {
        "status": "ok",
        "reasons": [],
        "was": ["kill_budget_spent"],
    }
    assert hc.observe([("stopping", "stopping: herder is draining its workers")]) == []


@pytest.mark.slow
def test_a_webhook_url_is_shown_without_its_secret_path(tmp_path) -> None:
    url = "https://hooks.example.com/services/T000/B000/s3cr3t-token?key=k3y"
    r = subprocess.run([HERDER, "config", "--on-event-url", url, "--redis-url", "redis://127.0.0.1:1/0"],
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "https://hooks.example.com/***" in r.stdout
    assert "s3cr3t" not in r.stdout + r.stderr and "k3y" not in r.stdout + r.stderr
    bad = subprocess.run([HERDER, "config", "--on-event-url", "ftp://x/s3cr3t", "--redis-url", "redis://127.0.0.1:1/0"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert bad.returncode == 78 and "on_event_url" in bad.stderr and "s3cr3t" not in bad.stderr


@pytest.mark.slow
def test_every_death_herder_did_not_ask_for_is_an_event_with_the_jobs_it_held(
    herder, conn, tmp_path, webhook
) -> None:
    """kill -9 from outside, os._exit and a segfault in a job: each one `worker_died` at the hook
    command and at the webhook, with its exit, the job it held and that herder recovered it
    (here given up at once, `max_requeues = 0`: each job one death, one event)."""
    command, out = hook_command(tmp_path)
    url, posted = webhook
    # min_uptime 0: no death here counts as young, so none is thinned out as a crash loop's
    # (at 1, 2, 4 ... in a row: a slot whose replacement died at once would skip its 3rd).
    h = herder(workers="2", on_event=command, on_event_url=url, max_requeues="0", min_uptime="0")
    h.wait_workers(2)
    q = Queue("default", connection=conn)

    def died(n: int) -> list[dict] | None:
        hooked = [e for e in read_events(out) if e["event"] == "worker_died"]
        webbed = [e for e in posted if e["event"] == "worker_died"]
        return hooked if len(hooked) >= n and len(webbed) >= n else None

    held = q.enqueue("herder_testjobs.record", "held", 30)
    wait_for(lambda: conn.llen("started:held") or None, 10, what="the job running")
    victim = h.worker_for_job(conn, held.id)
    os.kill(victim, signal.SIGKILL)
    (killed,) = wait_for(lambda: died(1), 20, what="worker_died for the kill -9")
    assert (killed["pid"], killed["signal"], killed["exit_code"]) == (victim, "SIGKILL", None)
    assert killed["jobs"] == [{"job_id": held.id, "queue": "default", "function": "herder_testjobs.record"}]
    assert killed["recovered"] is True
    wait_for(
        lambda: [e for e in read_events(out) if e["event"] == "job_given_up"], 20, what="its job given up"
    )
    h.wait_workers(2)
    exited = q.enqueue("herder_testjobs.exit_hard", "x")
    wait_for(lambda: died(2), 20, what="worker_died for os._exit")
    h.wait_workers(2)
    crashed = q.enqueue("herder_testjobs.segfault", "s")
    hooked = wait_for(lambda: died(3), 20, what="worker_died for a segfault")
    by_job = {e["jobs"][0]["job_id"]: e for e in hooked if e["jobs"]}
    assert (by_job[exited.id]["exit_code"], by_job[exited.id]["signal"]) == (3, None)
    assert by_job[crashed.id]["signal"] == "SIGSEGV"
    for e in hooked:  # the same event at the command and at the URL, once each
        e.pop("env"), e.pop("said")
        assert [p for p in posted if p == e] == [e]
    h.stop_and_check()
    assert len(died(1) or []) >= 3 and all(e["event"] != "worker_died" or e["jobs"] for e in read_events(out))
