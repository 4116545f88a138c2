"""What `herder status` shows: built by the master's loop, rendered by the CLI."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import psutil

from herder.common.config import redact_url

if TYPE_CHECKING:
    from herder.supervisor.master import Master

# `herder status` exit codes, as supervisorctl's.
EXIT_RUNNING = 0
EXIT_NOT_RUNNING = 3
EXIT_UNREACHABLE = 4

_processes: dict[int, psutil.Process] = {}  # kept so cpu_percent() measures since the last status


def _usage(pid: int) -> tuple[int | None, float | None]:
    try:
        proc = _processes.get(pid) or _processes.setdefault(pid, psutil.Process(pid))
        with proc.oneshot():
            return proc.memory_info().rss, proc.cpu_percent(None)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        _processes.pop(pid, None)
        return None, None


def _uptime(pid: int) -> float | None:
    try:
        return time.time() - psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def build_status(m: Master) -> dict[str, Any]:
    now = time.monotonic()
    workers = []
    for w in sorted(m.workers.values(), key=lambda w: w.slot):
        o = w.snapshot()
        rss, cpu = _usage(w.pid)
        workers.append(
            {
                "slot": w.slot,
                "pid": w.pid,
                "state": str(w.state),
                "job": o.job_id,
                "job_seconds": round(now - o.job_started, 1) if o.job_id else None,
                "jobs_ok": o.jobs_ok,
                "jobs_failed": o.jobs_failed,
                "last_done": o.last_done_wall,
                "rss": rss,
                "cpu_percent": cpu,
                "uptime": round(now - w.spawned_at, 1),
                "malformed_lines": o.malformed,
            }
        )
    for pid in set(_processes) - {w.pid for w in m.workers.values()}:
        _processes.pop(pid, None)
    backoff = [s.index for s in m.slots.values() if s.index not in m.workers and s.next_spawn_at > now]
    live = len(m.live_workers())
    running = (
        live >= m.target
        and not backoff
        and not m.stopping
        and not m.degraded
        and all(w["state"] in ("idle", "busy") for w in workers)
    )
    watchdog_pid = os.getppid()
    return {
        "ok": True,
        "running": running,
        "health": f"degraded: {m.degraded}" if m.degraded else "ok",
        "master": {"pid": os.getpid(), "uptime": round(time.time() - m.started_at, 1), "host_id": m.host_id},
        "watchdog": {"pid": watchdog_pid, "uptime": _uptime(watchdog_pid)},
        "redis_url": redact_url(m.cfg.redis_url),
        "autoscale": m.cfg.autoscale,
        "min": m.cfg.floor,
        "max": m.cfg.ceiling,
        "cluster_max": m.cfg.cluster_max_workers,
        "cluster_grant": m.grant,
        "desired": m.target,
        "actual": live,
        "stopping": m.stopping,
        "slots_in_backoff": backoff,
        "queues": [
            {
                "name": name,
                "backlog": int(q["backlog"]),
                "running": int(q["running"]),
                "growth": round(q["growth"], 2),
            }
            for name, q in sorted(m.queue_stats.items())
        ],
        "workers": workers,
        "totals": {
            "spawned": m.totals.spawned,
            "killed": m.totals.killed,
            "requeued": m.requeuer.requeued if m.requeuer else 0,
            "failed_by_herder": m.requeuer.failed if m.requeuer else 0,
        },
    }


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def render(status: dict[str, Any]) -> str:
    """The human-readable status, like supervisorctl's."""
    m, wd = status["master"], status["watchdog"]
    lines = [
        f"herder: {'running' if status['running'] else 'NOT fully running'}"
        f"{' (stopping)' if status['stopping'] else ''}   master {m['pid']} up {_duration(m['uptime'])}"
        f"   watchdog {wd['pid']} up {_duration(wd['uptime'])}",
        f"redis: {status['redis_url']}",
    ]
    if status.get("health", "ok") != "ok":
        lines.append(f"health: {status['health']}")
    scale = f"min {status['min']}, max {status['max']}" if status["autoscale"] else "fixed"
    if status["cluster_max"] is not None:
        scale += f", cluster max {status['cluster_max']} (granted {status['cluster_grant']})"
    lines.append(f"workers: {status['actual']} of {status['desired']} desired ({scale})")
    if status["slots_in_backoff"]:
        lines.append(f"slots in backoff: {', '.join(map(str, status['slots_in_backoff']))}")
    for q in status["queues"]:
        lines.append(
            f"queue {q['name']}: {q['backlog']} waiting, {q['running']} running, growth {q['growth']:+.1f}/s"
        )
    lines.append("")
    lines.append(
        f"{'SLOT':>4} {'PID':>7} {'STATE':<9} {'UP':>6} {'OK':>6} {'FAILED':>6} {'RSS':>7} {'CPU%':>5}  JOB"
    )
    for w in status["workers"]:
        rss = f"{w['rss'] / 2**20:.0f}M" if w["rss"] else "-"
        cpu = f"{w['cpu_percent']:.0f}" if w["cpu_percent"] is not None else "-"
        job = f"{w['job']} ({_duration(w['job_seconds'])})" if w["job"] else ""
        lines.append(
            f"{w['slot']:>4} {w['pid']:>7} {w['state']:<9} {_duration(w['uptime']):>6} "
            f"{w['jobs_ok']:>6} {w['jobs_failed']:>6} {rss:>7} {cpu:>5}  {job}"
        )
    return "\n".join(lines)


def exit_code(status: dict[str, Any]) -> int:
    return EXIT_RUNNING if status.get("running") else EXIT_NOT_RUNNING
