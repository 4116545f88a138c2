"""/healthz and /metrics end to end: real herder, real Redis, real HTTP clients (a hostile
one too). /metrics is parsed with prometheus-client's own text parser and compared with
`herder status --json` and with what the test did."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from harness import free_port, http_get, metrics, redis_on, sample, start_redis, wait_for
from herder.supervisor.control.http_endpoint import RETRY_BIND

pytestmark = pytest.mark.slow


def healthz(base: str) -> tuple[int, dict]:
    code, body = http_get(base + "/healthz")
    return code, json.loads(body) if code else {}


def test_metrics_agree_with_status_and_with_what_the_test_did(herder, conn: Redis, jobs) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="2", http=str(port))  # a bare port: loopback
    workers = h.wait_workers(2)
    wait_for(lambda: healthz(base)[0] == 200, 10, what="/healthz 200")
    code, body = healthz(base)
    assert body == {"status": "ok", "reasons": [], "workers": {"ready": 2, "desired": 2}}
    ok_ids = [jobs.enqueue("record", "m").id for _ in range(12)]
    for _ in range(3):
        jobs.enqueue("poison", "p")
    h.wait_status(lambda s: s["jobs"] == {"ok": 12, "failed": 3}, 20, what="the jobs done, as status says")
    os.kill(workers[0].pid, signal.SIGKILL)  # between jobs: herder's kill count stays 0
    h.wait_workers(2, without={workers[0].pid})

    def settled() -> dict | None:
        m = metrics(base)
        done = sample(m, "herder_jobs_total", outcome="ok", pool="default") == 12
        # The queues are read once a scale interval (1 s): a reading may predate the last jobs.
        done = done and sample(m, "herder_queue_length", queue="default") == 0
        respawned = (
            sample(m, "herder_workers_spawned_total") == 3
            and sample(m, "herder_workers_ready", pool="default") == 2
        )
        return m if done and respawned else None

    m = wait_for(settled, 10, what="metrics to show the jobs and the respawn")
    status = h.snapshot()
    assert status["jobs"] == {"ok": 12, "failed": 3} and sorted(jobs.finished("m")) == sorted(ok_ids)
    assert sample(m, "herder_jobs_total", outcome="failed", pool="default") == 3
    assert sample(m, "herder_workers_spawned_total") == status["totals"]["spawned"] == 3
    assert sample(m, "herder_kills_total", reason="silent", pool="default") == 0 == status["totals"]["killed"]
    assert sample(m, "herder_requeues_total", reason="died", pool="default") == 0  # it held no job
    assert sample(m, "herder_jobs_failed_by_herder_total", pool="default") == 0
    assert sample(m, "herder_workers_desired", pool="default") == status["desired"] == 2
    assert sample(m, "herder_workers", state="idle", pool="default") == 2
    assert sample(m, "herder_queue_length", queue="default") == 0
    assert sample(m, "herder_budget_remaining", budget="cull") == status["budgets_left"]["cull"] == 10
    assert sample(m, "herder_healthy") == 1
    assert sample(m, "herder_master_restarts_total") == 0
    assert sample(m, "herder_master_loop_lag_seconds") < 1
    assert http_get(base + "/nope")[0] == 404
    # The dashboard people import draws only what herder serves (herder_job_rate: autoscaling).
    dashboard = (Path(__file__).parent.parent / "examples" / "grafana-dashboard.json").read_text()
    drawn = set(re.findall(r"herder_[a-z_]+", dashboard))
    families = {f.name for f in text_string_to_metric_families(http_get(base + "/metrics")[1].decode())}
    served = families | {name for name, _ in m}  # a family with no sample yet still counts
    assert drawn - served <= {"herder_job_rate"}, drawn - served

    master = h.master()
    assert master is not None
    os.kill(master.pid, signal.SIGKILL)  # the watchdog restarts it; the new one says so
    wait_for(lambda: (m := h.master()) is not None and m.pid != master.pid, 20, what="a new master")
    h.wait_workers(2)  # its own workers, ready
    wait_for(
        lambda: sample(metrics(base), "herder_master_restarts_total") == 1, 20, what="the restart counted"
    )
    assert h.snapshot()["master_restarts"] == 1
    h.stop_and_check()


def test_healthz_turns_503_with_the_reason_while_redis_is_down_and_recovers(herder, tmp_path: Path) -> None:
    proc, rport = start_redis(tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        h = herder(redis_url=f"redis://127.0.0.1:{rport}/0", workers="2", http=f"127.0.0.1:{port}",
                   health_grace="1")  # fmt: skip
        h.wait_workers(2)
        wait_for(lambda: healthz(base)[0] == 200, 10, what="/healthz 200")
        proc.kill()
        proc.wait(5)
        code, body = wait_for(lambda: (r := healthz(base))[0] == 503 and r, 15, what="/healthz 503")
        assert body["status"] == "degraded"
        assert any(r.startswith("redis unreachable for") for r in body["reasons"]), body
        m = metrics(base)
        assert sample(m, "herder_healthy") == 0
        assert sample(m, "herder_health_problem", kind="redis_unreachable") == 1
        status = h.snapshot()
        assert "redis unreachable" in status["health"] and not status["running"]
        proc = redis_on(rport, tmp_path)
        wait_for(lambda: healthz(base)[0] == 200, 20, what="/healthz 200 again")
        assert h.snapshot()["health"] == "ok"
        h.stop_and_check()
    finally:
        proc.kill()
        proc.wait(5)


def test_slow_and_hostile_clients_never_block_health_or_the_master(herder) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="1", http=f"127.0.0.1:{port}")
    h.wait_workers(1)
    wait_for(lambda: healthz(base)[0] == 200, 10, what="/healthz 200")
    # A huge request line, and garbage: refused with a status, nothing else happens.
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET /" + b"a" * 100_000 + b" HTTP/1.0\r\n\r\n")
        assert b" 414 " in s.recv(1000).split(b"\r\n")[0]
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"\x00\xff garbage\r\n\r\n")
        assert b" 400 " in s.recv(1000).split(b"\r\n")[0]
    # Slow-loris: connections that send half a request and then nothing; more of them than
    # the server serves at once.
    idle = []
    for _ in range(40):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        idle.append(s)
    # The master's loop does not care: status answers at once.
    started = time.monotonic()
    assert h.snapshot()["actual"] == 1
    assert time.monotonic() - started < 5
    # The stuck connections are cut off (IO timeout, then the deadline) and health answers again.
    wait_for(lambda: healthz(base)[0] == 200, 15, interval=0.5, what="/healthz after the slow clients")
    for s in idle:
        s.close()
    assert "connections refused so far" in h.log()  # counted and said once
    h.stop_and_check()


def test_a_taken_port_is_said_once_and_served_as_soon_as_it_is_free(herder) -> None:
    port = free_port()
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    h = herder(workers="1", http=str(port))
    h.wait_workers(1)
    # An absence over time: through more than one retry (herder retries the bind every
    # RETRY_BIND s), the taken port is said once, not once per retry.
    time.sleep(2 * RETRY_BIND + 0.5)
    assert h.log().count(f"cannot serve http on {port}") == 1
    assert h.snapshot()["running"]  # the fleet does not care
    squatter.close()
    wait_for(lambda: healthz(f"http://127.0.0.1:{port}")[0] == 200, 10, what="/healthz once the port is free")
    h.stop_and_check()
