"""The dashboard's HTTP API end to end (supervisor/views/API.md): a real herder with --http,
real Redis, real jobs and a real SIGKILL; what /api/snapshot, /api/history and /api/hosts
answer, the headers every answer carries, and the paths and methods it refuses."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from harness import free_port, wait_for

pytestmark = pytest.mark.slow

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'"
)


def request(
    base: str,
    path: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one request; status 0 when nobody answered."""
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except (OSError, http.client.HTTPException):
        return 0, {}, b""


def get_json(base: str, path: str) -> Any:
    code, _, body = request(base, path)
    assert code == 200, (path, code, body)
    return json.loads(body)


def test_snapshot_history_and_a_killed_worker_on_the_dashboards_api(herder, jobs) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="2", http=str(port))
    workers = h.wait_workers(2)
    pids = {p.pid for p in workers}

    def shown() -> dict | None:
        s = get_json(base, "/api/snapshot")
        return s if s["state"] == "running" and {w["pid"] for w in s["workers"]} == pids else None

    snap = wait_for(shown, 10, what="the snapshot running, its workers with the real pids")
    assert snap["health"] == {"ok": True, "reasons": []}
    assert snap["controls"] is False
    (pool,) = snap["pools"]
    assert pool["name"] == "default" and pool["queues"] == ["default"] and pool["running"] == 2
    assert len({w["slot"] for w in snap["workers"]}) == 2
    assert all(w["rss"] and w["rss"] > 1_000_000 for w in snap["workers"])  # psutil read them
    assert [e for e in snap["events"] if e["kind"] == "spawned"]

    for _ in range(40):
        jobs.enqueue("record", "dash", 0.05)
    h.wait_status(lambda s: s["jobs"]["ok"] >= 40, 30, what="40 jobs done")
    history = get_json(base, "/api/history")
    assert history["step"] == 1.0 and len(history["t"]) == len(history["pools"]["default"]["jobs_per_s"])
    assert max(r or 0 for r in history["pools"]["default"]["jobs_per_s"]) > 0
    assert history["t"] == sorted(history["t"]) and history["t"][-1] <= history["time"]

    victim = workers[0].pid
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)

    def died() -> list[dict]:
        return [
            e
            for e in get_json(base, "/api/snapshot")["events"]
            if e["kind"] in ("died", "killed") and e["pid"] == victim
        ]

    (event,) = wait_for(died, 2, what=f"a died event naming pid {victim} within 2 s")
    assert f"pid {victim}" in event["text"] and "SIGKILL" in event["text"], event
    assert event["time"] >= killed_at - 1
    newer = get_json(base, f"/api/history?since={killed_at - 1}")["events"]
    assert event in newer and all(e["time"] > killed_at - 1 for e in newer)
    ids = [e["id"] for e in get_json(base, "/api/history")["events"]]
    assert ids == sorted(ids)

    hosts = get_json(base, "/api/hosts")["hosts"]
    assert [x["this"] for x in hosts].count(True) == 1
    assert hosts[0]["host_id"] == snap["host_id"] and hosts[0]["pools"] == ["default"]
    h.stop_and_check()


def test_headers_paths_and_methods(herder) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="1", http=str(port))
    wait_for(lambda: request(base, "/api/snapshot")[0] == 200, 20, what="a published snapshot")
    for path in ("/api/snapshot", "/api/history", "/api/hosts", "/healthz", "/nope", "/static/nope.js"):
        code, headers, _ = request(base, path)
        assert headers["Content-Security-Policy"] == CSP, path
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Cache-Control"] == "no-store", path
    assert request(base, "/api/snapshot")[1]["Content-Type"] == "application/json"
    assert request(base, "/nope")[0] == 404
    assert request(base, "/static/../http_endpoint.py")[0] == 404
    assert request(base, "/static/..%2fapi.py")[0] == 404
    assert request(base, "/api/history?since=abc")[0] == 400
    assert request(base, "/api/history?since=nan")[0] == 400
    code, headers, _ = request(base, "/api/snapshot", method="POST", body=b"{}")
    assert code == 405 and headers["Allow"] == "GET"
    assert request(base, "/api/login", method="GET")[0] == 405
    assert request(base, "/api/snapshot", method="DELETE")[0] == 405
    code, headers, body = request(base, "/")
    assert code in (200, 404) and headers["Content-Type"].startswith("text/html") and body
    # A raw request line with a path outside the folder: refused, never served.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/static/../../../etc/passwd")
    assert conn.getresponse().status == 404
    conn.close()
    h.stop_and_check()
