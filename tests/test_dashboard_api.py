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
from pathlib import Path
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


TOKEN = "s3cret-dashboard-token-4f1d"


def post(
    base: str, path: str, body: object, cookie: str = "", csrf: str = "", raw: bytes | None = None
) -> tuple[int, dict[str, str], Any]:
    headers = {"Content-Type": "application/json"}
    if cookie:
        headers["Cookie"] = cookie
    if csrf:
        headers["X-CSRF-Token"] = csrf
    data = raw if raw is not None else json.dumps(body).encode()
    code, got, answer = request(base, path, "POST", data, headers)
    try:
        return code, got, json.loads(answer)
    except ValueError:
        return code, got, answer


def login(base: str, token: str = TOKEN) -> tuple[str, str]:
    """(the session cookie as a client sends it back, the CSRF token)."""
    code, headers, answer = post(base, "/api/login", {"token": token})
    assert code == 200, answer
    set_cookie = headers["Set-Cookie"]
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Path=/" in set_cookie
    return set_cookie.split(";")[0], answer["csrf"]


def test_controls_with_a_token_file_login_and_csrf(herder, tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="1", http=str(port), http_token_file=str(token_file))
    (worker,) = h.wait_workers(1)
    wait_for(lambda: request(base, "/api/snapshot")[0] == 200, 10, what="a published snapshot")
    assert get_json(base, "/api/snapshot")["controls"] is True
    scale = {"cmd": "scale", "pool": "default", "workers": 2}

    assert post(base, "/api/login", {"token": "wrong"})[0] == 403
    assert post(base, "/api/login", {"token": TOKEN[:-1]})[0] == 403
    assert post(base, "/api/login", {}, raw=b"{not json")[0] == 400
    cookie, csrf = login(base)
    assert post(base, "/api/command", scale)[0] == 403  # no session
    assert post(base, "/api/command", scale, cookie=cookie)[0] == 403  # no CSRF token
    assert post(base, "/api/command", scale, cookie=cookie, csrf=csrf + "x")[0] == 403
    assert post(base, "/api/command", scale, cookie="herder_session=forged", csrf=csrf)[0] == 403
    assert post(base, "/api/command", scale, csrf=csrf)[0] == 403
    bad_bodies = [{"cmd": "stop"}, {"cmd": "scale", "pool": "default"}, {"cmd": "scale", "workers": 2}, []]
    bad_bodies += [{"cmd": "scale", "pool": "default", "workers": True}, {"cmd": "stop_worker", "pid": "1"}]
    for bad in bad_bodies:
        assert post(base, "/api/command", bad, cookie=cookie, csrf=csrf)[0] == 400, bad
    big = {"cmd": "pause", "pool": "default", "pad": "x" * 5000}
    assert post(base, "/api/command", big, cookie=cookie, csrf=csrf)[0] == 400
    assert h.status()["desired"] == 1

    code, _, answer = post(base, "/api/command", scale, cookie=cookie, csrf=csrf)
    assert code == 200 and answer["ok"] is True and answer["desired"] == 2, answer
    h.wait_status(lambda s: s["desired"] == 2 and s["actual"] == 2, 20, what="scaled to 2 from the dashboard")
    code, _, answer = post(base, "/api/command", {"cmd": "scale", "pool": "nope", "workers": 2}, cookie, csrf)
    assert code == 200 and answer["ok"] is False and "no pool 'nope'" in answer["error"]  # the socket's reply
    code, _, answer = post(base, "/api/command", {"cmd": "stop_worker", "pid": worker.pid}, cookie, csrf)
    assert code == 200 and answer["ok"] is True, answer
    h.wait_workers(2, without={worker.pid})

    def stopped() -> list[dict]:
        events = get_json(base, "/api/snapshot")["events"]
        return [e for e in events if e["kind"] == "stopped" and e["pid"] == worker.pid]

    (event,) = wait_for(stopped, 5, what="the stopped worker's event")
    assert event["text"] == f"slot {event['slot']} pid {worker.pid} stopped (stopped by an operator)"
    events = get_json(base, "/api/snapshot")["events"]
    assert [
        e for e in events if e["kind"] == "scale" and "operator" in e["text"] and "from 1 to 2" in e["text"]
    ]

    # The token is nowhere a reader could see it: the log, status, metrics, the API.
    seen = [h.log(), json.dumps(h.status()), request(base, "/metrics")[2].decode()]
    seen += [request(base, p)[2].decode() for p in ("/api/snapshot", "/api/history", "/api/hosts")]
    assert not [text for text in seen if TOKEN in text]
    h.stop_and_check()


def test_no_token_means_read_only_and_names_stay_plain_strings(herder) -> None:
    hostile = "<img src=x onerror=alert(1)>"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="1", http=str(port), queue=hostile, env={"HERDER_HTTP_TOKEN": ""})
    h.wait_workers(1)
    wait_for(lambda: request(base, "/api/snapshot")[0] == 200, 10, what="a published snapshot")
    code, headers, body = request(base, "/api/snapshot")
    assert headers["Content-Type"] == "application/json"
    snap = json.loads(body)
    assert snap["controls"] is False and snap["pools"][0]["queues"] == [hostile]
    assert post(base, "/api/login", {"token": ""})[:1] == (403,)
    code, _, answer = post(base, "/api/login", {"token": TOKEN})
    assert code == 403 and answer == {"error": "read-only: no token configured"}
    code, _, answer = post(base, "/api/command", {"cmd": "pause", "pool": "default"}, "herder_session=x", "y")
    assert code == 403 and answer == {"error": "read-only: no token configured"}
    h.stop_and_check()


def test_the_token_from_the_environment_reaches_no_worker(herder, jobs) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    h = herder(workers="1", http=str(port), env={"HERDER_HTTP_TOKEN": TOKEN})
    (worker,) = h.wait_workers(1)
    wait_for(lambda: request(base, "/api/snapshot")[0] == 200, 10, what="a published snapshot")
    cookie, csrf = login(base)
    code, _, answer = post(base, "/api/command", {"cmd": "pause", "pool": "default"}, cookie, csrf)
    assert code == 200 and answer["ok"] is True and answer["paused"] is True
    h.wait_status(lambda s: s["paused"], 10, what="paused from the dashboard")
    pids = {p.pid for p in h.processes()}  # `herder run` execs the watchdog with the environment it hands on
    assert worker.pid in pids and len(pids) >= 4  # the watchdog, master, fork server, worker
    assert not [pid for pid in pids if TOKEN.encode() in Path(f"/proc/{pid}/environ").read_bytes()]
    h.stop_and_check()
