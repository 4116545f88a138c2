"""The dashboard's JSON (supervisor/views/API.md): the newest snapshot, the history with the
events since a time, and the hosts on the same Redis. Pure renderers over published data;
the HTTP threads call them (http_endpoint.py), never the loop."""

from __future__ import annotations

import json
from typing import Any

from herder.supervisor.views.history import History
from herder.supervisor.views.journal import Journal
from herder.supervisor.views.model import HostSnapshot, event_json

MAX_HOSTS = 200


# <, > and & as JSON escapes (as Go's encoding/json writes them): the same strings once parsed, but
# no answer holds markup even for a client that ignores its Content-Type.
_HTML_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def encode(body: Any) -> bytes:
    """Compact JSON; a string stays a string whatever it holds (the page escapes it too)."""
    return json.dumps(body, separators=(",", ":"), allow_nan=False).translate(_HTML_SAFE).encode()


def snapshot_json(snap: HostSnapshot) -> dict[str, Any]:
    return snap.to_json()


def history_json(history: History, journal: Journal, now: float, since: float | None) -> dict[str, Any]:
    return {
        "time": now,
        **history.render(since),
        "events": [event_json(e) for e in journal.since(since)],
    }


def hosts_json(
    snap: HostSnapshot | None, records: tuple[float, list[dict[str, Any]]], now: float
) -> dict[str, Any]:
    """Every host's record as the load reader last read it, this host's own from its newest
    snapshot (fresher than its record); `last_seen`: seconds since the host wrote it."""
    read_at, found = records
    out: list[dict[str, Any]] = []
    if snap is not None:
        out.append(
            {
                "host_id": snap.host_id,
                "hostname": snap.hostname,
                "this": True,
                "pools": [p.name for p in snap.pools],
                "running": sum(p.running for p in snap.pools),
                "busy": sum(p.busy for p in snap.pools),
                "last_seen": round(max(0.0, now - snap.time), 1),
                "health": health_text(snap.health.ok, snap.health.reasons),
            }
        )
    for r in found:
        if snap is not None and r.get("host_id") == snap.host_id:
            continue
        if len(out) >= MAX_HOSTS:
            break
        out.append(
            {
                "host_id": str(r.get("host_id")),
                "hostname": str(r.get("hostname", "")),
                "this": False,
                "pools": [str(p) for p in r.get("pools", [])][:100],
                "running": _int(r.get("running")),
                "busy": _int(r.get("busy")),
                "last_seen": round(max(0.0, now - _float(r.get("time"), read_at)), 1),
                "health": str(r.get("health", "unknown")),
            }
        )
    return {"hosts": out}


def host_record(snap: HostSnapshot) -> dict[str, Any]:
    """What this host writes for the others' host lists (redis_side/hosts.py)."""
    return {
        "host_id": snap.host_id,
        "hostname": snap.hostname,
        "pools": [p.name for p in snap.pools],
        "running": sum(p.running for p in snap.pools),
        "busy": sum(p.busy for p in snap.pools),
        "health": health_text(snap.health.ok, snap.health.reasons),
        "time": snap.time,
    }


def health_text(ok: bool, reasons: tuple[str, ...]) -> str:
    return "ok" if ok else "degraded: " + "; ".join(reasons)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
