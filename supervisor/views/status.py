"""`herder status`: the JSON the control socket answers (docs/control.md describes it; the
CLI renders it, herder.supervisor.ctl.render), rendered from a HostSnapshot (views/model.py)
the loop built for the request with the one builder, and the `starting` answer of the same
shape before the loop runs.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

import psutil

from herder.common.config import KEYS, Config, all_queues, redact_setting, redact_url
from herder.supervisor.views.model import HostSnapshot, MasterPhase, PoolRow, QueueRow, WorkerRow


def _uptime(pid: int) -> float | None:
    try:
        return time.time() - psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def build_status(snap: HostSnapshot) -> dict[str, Any]:
    degraded = "; ".join(snap.health.reasons)
    stopping = snap.state == MasterPhase.STOPPING
    running = (
        snap.actual >= snap.target
        and not snap.backoff
        and not stopping
        and not degraded
        and snap.ready == len(snap.workers)
    )
    watchdog_pid = os.getppid()
    return {
        "ok": True,
        "state": snap.state,
        "running": running,
        "health": f"degraded: {degraded}" if degraded else "ok",
        "master": {
            "pid": os.getpid(),
            "uptime": round(time.time() - snap.started_at, 1),
            "host_id": snap.host_id,
        },
        "watchdog": {"pid": watchdog_pid, "uptime": _uptime(watchdog_pid)},
        "redis_url": snap.redis_url,
        "autoscale": snap.autoscale,
        "min": snap.floor,
        "max": snap.ceiling,
        "workers_limit": snap.workers_limit,
        "workers_limit_reason": snap.workers_limit_reason,
        "cluster_max": snap.cluster_max,
        "cluster_grant": snap.cluster_grant,
        "desired": snap.target,
        "actual": snap.actual,
        "stopping": stopping,
        "paused": snap.paused,
        "suspended": sum(w.paused == "suspended" for w in snap.workers),
        "slots_in_backoff": list(snap.backoff),
        "queues": [_queue(q) for q in snap.queues],
        "workers": [_worker(w) for w in snap.workers],
        "totals": snap.totals,
        "settings": snap.settings,
        "scheduler": snap.scheduler_status.to_json() if snap.scheduler_status else None,
        "jobs": {"ok": snap.jobs_ok, "failed": snap.jobs_failed},
        "killed_by": snap.killed_by,
        "requeued_by": snap.requeued_by,
        "master_restarts": snap.master_restarts,
        "budgets_left": {k: round(n, 2) for k, n in snap.budgets_left.items()},
        "loop_lag": round(snap.loop_lag, 3),
        "job_rate": None if snap.job_rate is None else round(snap.job_rate, 3),
        "pools": {p.name: _pool(p) for p in snap.pools},
        "memory_pressure": snap.memory_pressure or None,
        # What herder advises changing, per pool, with its figures (docs/advice.md).
        "advice": [a.to_json() for a in snap.advice],
    }


def _worker(w: WorkerRow) -> dict[str, Any]:
    return {
        "slot": w.slot,
        "pid": w.pid,
        "pool": w.pool,
        "state": w.state,
        "job": w.job,  # its oldest, in a threaded worker
        "job_seconds": w.elapsed,
        # Every job it runs, by thread (one entry for a one-job worker).
        "jobs": [{"thread": t.thread, "job": t.job, "seconds": t.elapsed} for t in w.threads],
        "jobs_ok": w.jobs_done - w.jobs_failed,
        "jobs_failed": w.jobs_failed,
        "last_done": w.last_done,
        "rss": w.rss,
        "cpu_percent": w.cpu_percent,
        "uptime": w.uptime,
        "malformed_lines": w.malformed,
        "paused": w.paused,  # why it takes no jobs: suspended, paused, retiring (waits for `stop`)
        "heard_from": w.heard_from,
        "jobs_limit": w.jobs_limit,  # the most jobs it takes (max_jobs plus its jitter draw), or null
        "retiring": w.retiring,  # why it is being replaced (a recycle, a cull), or null
        "waiting_for": w.waiting_for,  # what it waits for before it can work: Redis, say
        "waiting_seconds": w.waiting_seconds,
    }


def _queue(q: QueueRow) -> dict[str, Any]:
    if q.backlog is None:  # not read yet
        return {"name": q.name, "backlog": None, "running": None, "growth": None, "oldest_age": None}
    return {
        "name": q.name,
        "backlog": q.backlog,
        "running": q.running,
        "growth": round(q.growth or 0.0, 2),
        "oldest_age": round(q.oldest_age or 0.0, 1),
    }


def _pool(p: PoolRow) -> dict[str, Any]:
    """One pool in `herder status`: its queues, sizing and counts."""
    return {
        "queues": list(p.queues),
        "autoscale": p.autoscale,
        "min": p.floor,
        "max": p.ceiling,
        "scaled": p.scaled,  # `herder scale`'s bounds over the file's, {}: none
        "threads": p.threads,  # jobs each of its workers runs at once
        "desired": p.target,
        # What the pool's queues call for across the cluster before this host's bounds.
        "wanted": p.demand,
        "actual": p.running,
        "ready": p.ready,
        "cluster_max": p.cluster_max,
        "cluster_grant": p.cluster_grant,
        "paused": p.paused,
        "draining": p.draining,
        "generation": p.generation,
        "jobs": {"ok": p.jobs_ok, "failed": p.jobs_failed},
        "killed_by": p.killed_by,
        "requeued_by": p.requeued_by,
        "recycled_by": p.recycled_by,
        "failed_by_herder": p.failed_by_herder,
        "died": p.died,
    }


def starting_status(cfg: Config, started_at: float, version: str) -> dict[str, Any]:
    """What the control socket answers while the master is still starting (imports, Redis
    clients, its first loop pass): the same shape as build_status, state `starting`, no
    workers yet, so `herder status` is useful from the first moment."""
    watchdog_pid, settings = os.getppid(), asdict(cfg)
    return {
        "ok": True,
        "state": "starting",
        "running": False,
        "health": "degraded: starting: the master is loading",
        "master": {"pid": os.getpid(), "uptime": round(time.time() - started_at, 1), "host_id": cfg.host_id},
        "watchdog": {"pid": watchdog_pid, "uptime": _uptime(watchdog_pid)},
        "redis_url": redact_url(cfg.redis_url),
        "autoscale": cfg.autoscale,
        "min": cfg.floor,
        "max": cfg.ceiling,
        "workers_limit": cfg.limit,
        "workers_limit_reason": cfg.limit_reason,
        "cluster_max": cfg.cluster_max_workers,
        "cluster_grant": None,
        "desired": cfg.floor,
        "actual": 0,
        "stopping": False,
        "paused": False,
        "suspended": 0,
        "slots_in_backoff": [],
        "queues": [
            {"name": q, "backlog": None, "running": None, "growth": None, "oldest_age": None}
            for q in all_queues(cfg)
        ],
        "workers": [],
        "totals": {
            "spawned": 0,
            "killed": 0,
            "requeued": 0,
            "recovered_by_sweep": 0,
            "failed_by_herder": 0,
            "recycled": {},
        },  # fmt: skip
        "settings": {k: redact_setting(k, v) for k, v in settings.items() if k in KEYS},
        "scheduler": None,
        "jobs": {"ok": 0, "failed": 0},
        "killed_by": {},
        "requeued_by": {},
        "master_restarts": 0,
        "budgets_left": {},
        "loop_lag": 0.0,
        "job_rate": None,
        "pools": {},
        "memory_pressure": None,
        "advice": [],
        "version": version,
        "handover": None,  # `herder upgrade`: the loop's answer has it (control/handoff.py)
    }
