"""Control requests and reload: what `herder status`, `scale`, `restart`, `reload`, `stop`
and `enqueue` do, and SIGHUP.

The control thread hands each request to the reconcile loop, which answers it here
(`handle_requests`), so a reply always matches what the loop decides; `ping` and `enqueue`
touch no fleet state and are answered on the control thread (`answer_directly`).
"""

from __future__ import annotations

import logging
import os
import queue
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from herder.common.config import KEYS, Config, ConfigError, redact_url, reload_plan, reread
from herder.supervisor.autoscaler import Autoscaler
from herder.supervisor.control import ControlServer
from herder.supervisor.counters import Counters
from herder.supervisor.fleet import Slot, Worker
from herder.supervisor.health import HealthWatch
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import Counts, Recovery
from herder.supervisor.snapshot import FleetView, build_status
from herder.supervisor.states import WORKING
from herder.supervisor.uplink import Uplink

if TYPE_CHECKING:
    from herder.supervisor.guard import KillGuard
    from herder.supervisor.launcher import Clock
    from herder.supervisor.retirement import Retirement
    from herder.supervisor.scheduler import SchedulerKeeper

log = logging.getLogger("herder")


class Fleet(Protocol):
    """What commands read and change of the master (herder.supervisor.master.Master)."""

    cfg: Config
    started_cfg: Config  # what the watchdog started with: it never re-reads the file
    clock: Clock
    host_id: str
    target: int
    generation: int
    stopping: bool
    paused: bool
    started_at: float
    workers: dict[int, Worker]
    slots: dict[int, Slot]
    scaler: Autoscaler
    counters: Counters
    guard: KillGuard
    retirement: Retirement
    recovery: Recovery | None
    reader: LoadReader | None
    uplink: Uplink | None
    control: ControlServer | None
    sched: SchedulerKeeper
    health: HealthWatch
    ever_ready: bool
    restarts: int

    def live_workers(self) -> list[Worker]: ...

    def begin_stop(self, hurry: bool, why: str) -> None: ...


class Commands:
    def __init__(self, m: Fleet) -> None:
        self.m = m

    # ---- on the control thread ---------------------------------------------------------

    def answer_directly(self, body: dict) -> dict | None:
        """Requests the control thread answers itself (no fleet state involved)."""
        if body["cmd"] == "ping":
            return {"ok": True, "pid": os.getpid()}
        if body["cmd"] == "enqueue":
            return self.enqueue(body)
        return None

    def enqueue(self, body: dict) -> dict:
        """`herder enqueue`: put a job on a queue, for trying things out."""
        from rq import Queue

        from herder.common.redis_connect import connect

        cfg = self.m.cfg
        if not cfg.redis_url:
            return {"ok": False, "error": "no Redis configured"}
        func, args = body.get("func"), body.get("args", [])
        if not isinstance(func, str) or not func or not isinstance(args, list):
            return {"ok": False, "error": 'enqueue needs "func" (a dotted name) and "args" (a list)'}
        name = body.get("queue") or cfg.queues[0]
        try:
            conn = connect(cfg.redis_url, socket_timeout=5, socket_connect_timeout=3)
            job = Queue(name, connection=conn).enqueue(func, *args)
        except Exception as exc:  # Redis errors name host and port, never the password
            return {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        return {"ok": True, "job_id": job.id, "queue": name}

    # ---- in the reconcile loop -----------------------------------------------------------

    def handle_requests(self) -> None:
        control = self.m.control
        if control is None:
            return
        while True:
            try:
                request = control.requests.get_nowait()
            except queue.Empty:
                return
            try:
                reply = self.answer(request.body)
            except Exception as exc:  # a bad request must never take the loop down
                log.exception("control request %r failed", request.body.get("cmd"))
                reply = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
            request.reply.set_result(reply)

    def answer(self, body: dict) -> dict:
        match body["cmd"]:
            case "status":
                return build_status(self.view())
            case "scale":
                return self.rescale(body)
            case "restart":
                return self.restart("herder restart")
            case "pause" | "resume":
                return self.pause(body["cmd"] == "pause")
            case "reload":
                return self.reload("herder reload")
            case "enqueue":  # asked while the master was starting: the control thread queued it
                return self.enqueue(body)
            case "stop":
                if "timeout" in body:  # a new Config: the one herder started with stays as it was
                    self.m.cfg = replace(self.m.cfg, stop_timeout=float(body["timeout"]))
                self.m.begin_stop(hurry=False, why="herder stop")
                return {"ok": True, "stopping": len(self.m.workers)}
            case cmd:
                return {"ok": False, "error": f"unknown command {cmd!r}"}

    def view(self) -> FleetView:
        m = self.m
        now, wall = m.clock.monotonic(), m.clock.wall()
        counts = m.recovery.counts if m.recovery else Counts()
        live = m.live_workers()
        fleet = max(m.target, len(live))
        backoff = [s.index for s in m.slots.values() if s.index not in m.workers and s.in_backoff(now)]
        return FleetView(
            cfg=m.cfg,
            host_id=m.host_id,
            started_at=m.started_at,
            now=now,
            target=m.target,
            grant=m.scaler.grant,
            live=len(live),
            stopping=m.stopping,
            health=m.health.reasons(
                now,
                ready=sum(w.state in WORKING for w in live),
                floor=m.cfg.floor,
                was_ready=m.ever_ready,
                stopping=m.stopping,
                redis_down_since=m.reader.outage_since if m.reader else None,
                grace=m.cfg.health_grace,
                budgets=[
                    ("kill_budget_spent", m.guard.degraded),
                    ("cull_budget_spent", m.retirement.degraded),
                ],
            ),
            workers=[(w, w.proc.snapshot()) for w in m.workers.values()],
            backoff=sorted(backoff),
            queues={name: m.scaler.queues.get(name) for name in m.cfg.queues},  # in force, read or not
            settings=self.settings(),
            totals={
                "spawned": m.counters.totals.spawned,
                "killed": m.counters.totals.killed,
                "requeued": counts.requeued,
                "recovered_by_sweep": counts.swept,
                "failed_by_herder": counts.failed,
                "recycled": dict(m.retirement.recycled),
            },
            scheduler=m.sched.status(m.cfg),
            jobs=m.counters.jobs(list(m.workers.values())),
            killed_by=dict(m.counters.totals.killed_by),
            requeued_by=dict(counts.requeued_by),
            master_restarts=m.restarts,
            budgets_left={
                "kill": max(0.0, m.guard.budget.limit(fleet) - m.guard.budget.local_count(wall)),
                "cull": max(0.0, m.cfg.cull_budget - m.retirement.local.count(wall)),
            },
            loop_lag=m.health.last_lag,
            job_rate=m.scaler.state.per_worker,
            paused=m.paused,
            ever_ready=m.ever_ready,
        )

    def settings(self) -> dict[str, Any]:
        """Every setting as the master runs it, read back from the part that applies it where
        one does: a reload that did not reach a part shows here."""
        m = self.m
        out: dict[str, Any] = {k: getattr(m.cfg, k) for k in KEYS}
        out.update(
            redis_url=redact_url(m.cfg.redis_url),
            workers_limit=m.cfg.limit,
            kill_budget=m.guard.budget.fraction,
            kill_budget_window=m.guard.budget.window,
            scale_down_delay=m.scaler.policy.scale_down_delay,
            drain_target=m.scaler.policy.drain_target,
            log_level=logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        )
        if m.recovery is not None:
            out.update(max_requeues=m.recovery.cfg.max_requeues, sweep_interval=m.recovery.cfg.sweep_interval)
        if m.reader is not None:
            out.update(scale_interval=m.reader.interval, queues=list(m.reader.queues))
            if m.reader.cluster is not None:
                out.update(cluster_max_workers=m.reader.cluster.cap, host_ttl=m.reader.cluster.ttl)
        return out

    def pause(self, paused: bool) -> dict:
        """`herder pause` / `resume`: this host's workers finish their jobs and take no new ones
        (Sidekiq's quiet, celery's cancel_consumer); workers started meanwhile start paused."""
        m = self.m
        if m.paused != paused:
            m.paused = paused
            what = "finish their jobs and take no new ones" if paused else "take jobs again"
            log.info("herder %s: workers %s", "pause" if paused else "resume", what)
        for w in m.workers.values():
            w.proc.send_pause(paused)
        return {"ok": True, "paused": paused, "workers": len(m.workers)}

    def restart(self, why: str) -> dict:
        m = self.m
        m.generation += 1
        m.launcher.renew(m.cfg)  # new workers come from a new template: new code, new settings
        n = len(m.live_workers())
        log.info("%s: rolling restart of %d workers (generation %d)", why, n, m.generation)
        return {"ok": True, "replacing": n, "generation": m.generation}

    def rescale(self, body: dict[str, Any]) -> dict:
        cfg = self.m.cfg
        if "workers" in body:
            n = int(body["workers"])
            if n < 1:
                return {"ok": False, "error": "workers must be at least 1"}
            if cfg.autoscale:
                return {"ok": False, "error": "autoscaling is on: use --min/--max"}
            new = replace(cfg, workers=n)
        else:
            if not cfg.autoscale:
                return {
                    "ok": False,
                    "error": "autoscaling is off: herder run needs --max-workers for --min/--max",
                }
            lo = int(body.get("min", cfg.floor))
            hi = int(body.get("max", cfg.ceiling))
            if not 0 <= lo <= hi or hi < 1:
                return {"ok": False, "error": f"need 0 <= min <= max and max >= 1, got {lo}, {hi}"}
            new = replace(cfg, min_workers=lo, max_workers=hi)
        if new.ceiling > new.limit:
            log.warning("scale to %d refused: above %s", new.ceiling, new.describe_limit())
            return {"ok": False, "error": f"{new.ceiling} workers is above {new.describe_limit()}"}
        self.resize(new)
        bounds = f"min {new.floor}, max {new.ceiling}" if new.autoscale else "fixed"
        log.info("scale: target now %d workers (%s)", self.m.target, bounds)
        return {"ok": True, "desired": self.m.target, "min": new.floor, "max": new.ceiling}

    def resize(self, cfg: Config) -> None:
        """New worker bounds (scale, reload): the target moves into them at once; autoscaling
        turned on starts from the count running so far."""
        m = self.m
        m.target = max(cfg.floor, min(cfg.ceiling, m.target)) if cfg.autoscale else cfg.workers
        m.scaler.configure(cfg)
        m.cfg = cfg

    def reload(self, why: str) -> dict:
        """Re-read the config file; settings pinned by the environment or flags stay. All or
        nothing: a changed key that only a restart of herder applies refuses the whole reload."""
        m = self.m
        if not m.cfg.config_file:
            log.warning("%s: no config file to re-read (herder run had no --config)", why)
            return {"ok": False, "error": "herder run was started without --config: nothing to re-read"}
        if m.uplink:
            m.uplink.reloading()
        try:
            new = reread(m.cfg)
            plan = reload_plan(m.cfg, new, m.started_cfg)
        except ConfigError as exc:
            log.error("%s: keeping the running config: %s", why, exc)
            if m.uplink:
                m.uplink.ready()
            return {"ok": False, "error": str(exc)}
        self.apply(new)
        changed = sorted(plan.applied + plan.restart_workers)
        log.info(
            "%s: config re-read from %s; changed: %s", why, new.config_file, ", ".join(changed) or "nothing"
        )
        replacing = 0
        if plan.restart_workers:
            replacing = self.restart(f"{why} ({', '.join(plan.restart_workers)} changed)")["replacing"]
        if m.uplink:
            m.uplink.ready()
        return {
            "ok": True,
            "changed": changed,
            "applied": plan.applied,
            "restart_workers": plan.restart_workers,
            "replacing": replacing,
        }

    def apply(self, new: Config) -> None:
        """Hand each setting to the part that uses it. Every part, every time: each setter is
        cheap and keeps what did not change, and no changed key can be forgotten. Settings
        read where they are used (deadlines, backoff, the workers limit) need only m.cfg."""
        m = self.m
        self.resize(new)
        m.guard.configure(new, m.clock.wall())
        m.retirement.configure(new)
        if m.recovery is not None:
            m.recovery.configure(new)
        if m.reader is not None:
            m.reader.set_queues(new.queues)
            m.reader.set_interval(new.scale_interval)
            if new.cluster_max_workers is not None:
                m.reader.set_cluster(new.cluster_max_workers, new.host_ttl, new.kill_budget_window)
        logging.getLogger().setLevel(new.log_level.upper())
