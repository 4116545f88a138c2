"""What `herder status` prints, from the status snapshot the master sends (a dict)."""

from __future__ import annotations

from typing import Any

# `herder status` exit codes, as supervisorctl's.
EXIT_RUNNING = 0
EXIT_NOT_RUNNING = 3
EXIT_UNREACHABLE = 4


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
    state = status.get("state", "running")
    headline = "running" if status["running"] else "starting" if state == "starting" else "NOT fully running"
    lines = [
        f"herder: {headline}"
        f"{' (stopping)' if status['stopping'] else ''}   master {m['pid']} up {_duration(m['uptime'])}"
        f"   watchdog {wd['pid']} up {_duration(wd['uptime'])}",
        f"redis: {status['redis_url']}",
    ]
    if status.get("handover"):
        lines.append(render_handover(status["handover"]))
    if status.get("health", "ok") != "ok":
        lines.append(f"health: {status['health']}")
    if status.get("memory_pressure"):
        lines.append(f"memory pressure: {status['memory_pressure']}; no scale-up")
    if status.get("paused"):
        lines.append("paused: this host's workers take no new jobs (herder resume)")
    if status.get("suspended"):
        lines.append(f"suspended: {status['suspended']} workers wait for `rq resume`")
    scale = f"min {status['min']}, max {status['max']}" if status["autoscale"] else "fixed"
    scale += f", limit {status['workers_limit']}"
    if status["cluster_max"] is not None:
        scale += f", cluster max {status['cluster_max']} (granted {status['cluster_grant']})"
    pools = status.get("pools") or {}
    several = len(pools) > 1
    if several:  # each pool's sizing on its own line below
        scale = f"{len(pools)} pools, limit {status['workers_limit']}"
    lines.append(f"workers: {status['actual']} of {status['desired']} desired ({scale})")
    if several:
        for name, pl in pools.items():
            sizing = f"min {pl['min']}, max {pl['max']}" if pl["autoscale"] else "fixed"
            if pl["cluster_max"] is not None:
                sizing += f", cluster max {pl['cluster_max']} (granted {pl['cluster_grant']})"
            flags = "".join([", paused" if pl["paused"] else "", ", draining" if pl["draining"] else ""])
            lines.append(
                f"pool {name}: {pl['actual']} of {pl['desired']} desired ({sizing}{flags}); "
                f"queues {', '.join(pl['queues'])}"
            )
    if status["slots_in_backoff"]:
        lines.append(f"slots in backoff: {', '.join(map(str, status['slots_in_backoff']))}")
    for q in status["queues"]:
        if q["backlog"] is None:
            lines.append(f"queue {q['name']}: not read yet")
            continue
        oldest = f", oldest waiting {q['oldest_age']:.1f} s" if q.get("oldest_age") else ""
        lines.append(
            f"queue {q['name']}: {q['backlog']} waiting, {q['running']} running, "
            f"growth {q['growth']:+.1f}/s{oldest}"
        )
    if status.get("scheduler"):
        lines.append(render_scheduler(status["scheduler"]))
    lines.append("")
    pool_col = f"{'POOL':<10} " if several else ""
    header = (
        f"{'SLOT':>4} {'PID':>7} {'STATE':<9} {'UP':>6} {'OK':>6} {'FAILED':>6} {'RSS':>7} {'CPU%':>5}  JOB"
    )
    lines.append(pool_col + header)
    order = list(pools)
    workers = sorted(status["workers"], key=lambda w: order.index(w["pool"]) if w.get("pool") in order else 0)
    for w in workers:
        rss = f"{w['rss'] / 2**20:.0f}M" if w["rss"] else "-"
        cpu = f"{w['cpu_percent']:.0f}" if w["cpu_percent"] is not None else "-"
        job = f"{w['job']} ({_duration(w['job_seconds'])})" if w["job"] else ""
        if not job and w.get("waiting_for"):  # why it does not work: it waits (for Redis, say)
            job = f"waiting {_duration(w.get('waiting_seconds') or 0)} for {w['waiting_for']}"
        more = len(w.get("jobs", [])) - 1  # a threaded worker's other jobs
        job += f" and {more} more" if more > 0 else ""
        state = w.get("paused") or w["state"] if w["state"] == "idle" else w["state"]
        pool_cell = f"{w.get('pool', ''):<10} " if several else ""
        lines.append(
            f"{pool_cell}{w['slot']:>4} {w['pid']:>7} {state:<9} {_duration(w['uptime']):>6} "
            f"{w['jobs_ok']:>6} {w['jobs_failed']:>6} {rss:>7} {cpu:>5}  {job}"
        )
    return "\n".join(lines)


def render_handover(h: dict[str, Any]) -> str:
    """`herder upgrade` under way: both masters, their versions, whose workers are whose."""
    old, new = h["from"], h["to"]
    return (
        f"upgrade: master {old['pid']} (herder {old['version']}, {len(old['workers'])} workers left: "
        f"{' '.join(str(w['pid']) for w in old['workers']) or 'none'}) hands over to master {new['pid']} "
        f"(herder {new['version']}, {len(new['workers'])} workers)"
    )


def render_scheduler(s: dict[str, Any]) -> str:
    """Where RQ's scheduler runs: this host's process, and who holds each queue's lock."""
    if s["pid"]:
        here = f"pid {s['pid']} ({s['state']})"
    elif s["enabled"] or (s.get("cron") or {}).get("enabled"):
        here = s["state"]
    else:
        here = "off on this host (--no-scheduler)"
    parts = [f"holds {', '.join(s['holds'])}"] if s["holds"] else []
    for q in s["queues"]:
        h = q["holder"]
        if s["read_age"] is None:
            parts.append(f"{q['name']}: holder not read yet")
        elif h is None:
            parts.append(f"{q['name']}: NO scheduler holds its lock (scheduled jobs wait)")
        elif not h["here"]:
            where = f"host {h['host_id']}" if h["host_id"] else f"{h['hostname']} (not herder's)"
            parts.append(f"{q['name']} scheduled by pid {h['pid']} on {where}")
    cron = s.get("cron") or {}
    if cron.get("enabled"):
        h = cron["holder"]
        if s["read_age"] is None:
            parts.append("cron: holder not read yet")
        elif h is None:
            parts.append("cron: NO scheduler holds its lock (cron jobs wait)")
        elif h["here"]:
            parts.append(f"runs cron from {cron['config']}")
        else:
            where = f"host {h['host_id']}" if h["host_id"] else h["hostname"]
            parts.append(f"cron runs in pid {h['pid']} on {where}")
    return f"scheduler: {here}" + (f"; {'; '.join(parts)}" if parts else "")


def render_advice(advice: list[dict[str, Any]]) -> str:
    """`herder advise`: each piece under its pool, the change it asks for and what it rests on."""
    if not advice:
        return "no advice yet: nothing seen calls for a change (or too little seen so far)"
    lines = []
    for a in advice:
        lines.append(f"pool {a['pool']}: {a['kind']}: {a['text']}")
        sure = a["confidence"]
        rests = f"(over {sure['jobs']} jobs, {sure['minutes']:g} min)"
        change = ", ".join(f"{k} = {v}" for k, v in a["change"].items())
        lines.append(f"  set {change}   {rests}" if change else f"  {rests}")
    return "\n".join(lines)


def exit_code(status: dict[str, Any]) -> int:
    return EXIT_RUNNING if status.get("running") else EXIT_NOT_RUNNING
