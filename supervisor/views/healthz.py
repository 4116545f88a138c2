"""/healthz: the newest HostSnapshot's health as a load balancer or a probe reads it: 200 or
503, and why, in JSON."""

from __future__ import annotations

from typing import Any

from herder.supervisor.views.model import HostSnapshot


def healthz(snap: HostSnapshot | None, now: float) -> tuple[int, dict[str, Any]]:
    """(status code, body) as of `now` (monotonic): a loop that stopped publishing is a problem."""
    if snap is None:
        return 503, {"status": "degraded", "reasons": ["starting: the master has not published yet"]}
    problems = snap.problems(now)
    body: dict[str, Any] = {
        "status": "degraded" if problems else "ok",
        "reasons": [text for _, text in problems],
        "workers": {"ready": snap.ready, "desired": snap.target},
    }
    if snap.memory_pressure:  # said, not a problem: scale-up waits, the pod keeps its work
        body["memory_pressure"] = f"{snap.memory_pressure}; no scale-up"
    return (503 if problems else 200), body
