"""`herder status`: the JSON the control socket answers (docs/control.md describes it; the
CLI renders it, herder.supervisor.ctl.render), built in the loop from the FleetView, and the
`starting` answer of the same shape before the loop runs. Workers' RSS and CPU come from the
sampling the dashboard's snapshot shares (views/usage.py): at most one a second.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any

import psutil

from herder.common.config import KEYS, Config, all_queues, redact_setting, redact_url
from herder.supervisor.snapshot import FleetView
from herder.supervisor.states import WORKING
from herder.supervisor.views.usage import SHARED


def _uptime(pid: int) -> float | None:
    try:
        return time.time() - psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def build_status(v: FleetView) -> dict[str, Any]:
    workers = []
    usage = SHARED.of(w.pid for w, _ in v.workers)
    for w, o in sorted(v.workers, key=lambda pair: pair[0].slot):
        rss, cpu = usage[w.pid]
        workers.append(
            {
                "slot": w.slot,
                "pid": w.pid,
                "pool": w.pool,
                "state": str(w.state),
                "job": o.job_id,  # its oldest, in a threaded worker
                "job_seconds": round(v.now - o.oldest.started, 1) if o.oldest else None,
                # Every job it runs, by thread (one entry for a one-job worker).
                "jobs": [
                    {"thread": t, "job": h.job_id, "seconds": round(v.now - h.started, 1)}
                    for t, h in sorted(o.jobs.items())
                ],
                "jobs_ok": o.jobs_ok,
                "jobs_failed": o.jobs_failed,
                "last_done": o.last_done_wall,
                "rss": rss,
                "cpu_percent": cpu,
                "uptime": round(v.now - w.spawned_at, 1),
                "malformed_lines": o.malformed,
                "paused": o.paused,
                # A protocol line since its spawn: a starting worker without one is still loading
                # and holds the start window (fleet.loading); one with one is on its way to ready.
                "heard_from": o.last_seen > w.spawned_at,
            }
        )
    running = (
        v.live >= v.target
        and not v.backoff
        and not v.stopping
        and not v.degraded
        and all(w.state in WORKING for w, _ in v.workers)
    )
    watchdog_pid = os.getppid()
    cfg = v.cfg
    return {
        "ok": True,
        "state": "stopping" if v.stopping else "running" if v.ever_ready else "starting",
        "running": running,
        "health": f"degraded: {v.degraded}" if v.degraded else "ok",
        "master": {"pid": os.getpid(), "uptime": round(time.time() - v.started_at, 1), "host_id": v.host_id},
        "watchdog": {"pid": watchdog_pid, "uptime": _uptime(watchdog_pid)},
        "redis_url": redact_url(cfg.redis_url),
        "autoscale": cfg.autoscale,
        "min": cfg.floor,
        "max": cfg.ceiling,
        "workers_limit": cfg.limit,
        "workers_limit_reason": cfg.limit_reason,
        "cluster_max": cfg.cluster_max_workers,
        "cluster_grant": v.grant,
        "desired": v.target,
        "actual": v.live,
        "stopping": v.stopping,
        "paused": v.paused,
        "suspended": sum(o.paused == "suspended" for _, o in v.workers),
        "slots_in_backoff": v.backoff,
        "queues": [
            {"name": name, "backlog": None, "running": None, "growth": None, "oldest_age": None}
            if q is None
            else {
                "name": name,
                "backlog": q.backlog,
                "running": q.running,
                "growth": round(q.growth, 2),
                "oldest_age": round(q.oldest_age, 1),
            }
            for name, q in v.queues.items()
        ],
        "workers": workers,
        "totals": v.totals,
        "settings": v.settings,
        "scheduler": v.scheduler,
        "jobs": {"ok": v.jobs[0], "failed": v.jobs[1]},
        "killed_by": v.killed_by,
        "requeued_by": v.requeued_by,
        "master_restarts": v.master_restarts,
        "budgets_left": {k: round(n, 2) for k, n in v.budgets_left.items()},
        "loop_lag": round(v.loop_lag, 3),
        "job_rate": None if v.job_rate is None else round(v.job_rate, 3),
        "pools": v.pools,
        "memory_pressure": v.memory_pressure or None,
    }


def starting_status(cfg: Config, started_at: float) -> dict[str, Any]:
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
    }
