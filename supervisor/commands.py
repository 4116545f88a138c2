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
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from herder.common.config import (
    DEFAULT_POOL,
    KEYS,
    WORKERS,
    Config,
    ConfigError,
    all_queues,
    pool_configs,
    reload_plan,
    reload_policy,
    reread,
)
from herder.supervisor.control import ControlServer
from herder.supervisor.counters import Counters
from herder.supervisor.fleet import Slot, Worker
from herder.supervisor.fleetview import fleet_view
from herder.supervisor.health import HealthWatch
from herder.supervisor.hooks import EventHooks
from herder.supervisor.pool import Pool
from herder.supervisor.pressure import MemoryWatch
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import Recovery
from herder.supervisor.snapshot import FleetView, build_status
from herder.supervisor.uplink import Uplink

if TYPE_CHECKING:
    from herder.supervisor.guard import KillGuard
    from herder.supervisor.launcher import Clock, Launcher
    from herder.supervisor.scheduler import SchedulerKeeper

log = logging.getLogger("herder")


class Fleet(Protocol):
    """What commands read and change of the master (herder.supervisor.master.Master)."""

    cfg: Config
    started_cfg: Config  # what the watchdog started with: it never re-reads the file
    clock: Clock
    host_id: str
    pools: dict[str, Pool]
    tickets: Iterator[int]
    target: int
    floor: int
    stopping: bool
    paused: bool
    started_at: float
    workers: dict[int, Worker]
    slots: dict[int, Slot]
    counters: Counters
    guard: KillGuard
    recovery: Recovery | None
    reader: LoadReader | None
    uplink: Uplink | None
    control: ControlServer | None
    sched: SchedulerKeeper
    health: HealthWatch
    memory: MemoryWatch
    hooks: EventHooks
    ever_ready: bool
    restarts: int

    def live_workers(self) -> list[Worker]: ...

    def pool_list(self) -> list[Pool]: ...

    def pool_workers(self, pool: Pool) -> list[Worker]: ...

    def launcher_for(self, pool: Pool) -> Launcher: ...

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
            case "restart" | "pause" | "resume" as cmd:
                pools = self.named_pools(body.get("pool"))
                if isinstance(pools, dict):
                    return pools  # the error: no such pool
                if cmd == "restart":
                    return self.restart("herder restart", pools)
                return self.pause(cmd == "pause", pools)
            case "reload":
                return self.reload("herder reload")
            case "enqueue":  # asked while the master was starting: the control thread queued it
                return self.enqueue(body)
            case "stop":
                if "timeout" in body:  # a new Config: the one herder started with stays as it was
                    timeout = float(body["timeout"])
                    self.m.cfg = replace(self.m.cfg, stop_timeout=timeout)
                    for pool in self.m.pool_list():
                        pool.cfg = replace(pool.cfg, stop_timeout=timeout)
                self.m.begin_stop(hurry=False, why="herder stop")
                return {"ok": True, "stopping": len(self.m.workers)}
            case cmd:
                return {"ok": False, "error": f"unknown command {cmd!r}"}

    def named_pools(self, name: object) -> list[Pool] | dict:
        """The pool a request names, or every pool when it names none; an error reply for a
        pool that does not exist (naming the ones that do)."""
        pools = [p for p in self.m.pool_list() if not p.draining]
        if name is None:
            return pools
        found = [p for p in pools if p.name == name]
        if not found:
            return {
                "ok": False,
                "error": f"no pool {name!r}; the pools are {', '.join(p.name for p in pools)}",
            }
        return found

    def view(self) -> FleetView:
        return fleet_view(self.m)

    def pause(self, paused: bool, pools: list[Pool]) -> dict:
        """`herder pause` / `resume` [--pool]: the workers finish their jobs and take no new
        ones (Sidekiq's quiet, celery's cancel_consumer); workers started meanwhile start paused."""
        m, names = self.m, {p.name for p in pools}
        for pool in pools:
            if pool.paused != paused:
                pool.paused = paused
                what = "finish their jobs and take no new ones" if paused else "take jobs again"
                where = "" if pool.name == DEFAULT_POOL else f" (pool {pool.name})"
                log.info("herder %s%s: workers %s", "pause" if paused else "resume", where, what)
        told = [w for w in m.workers.values() if w.pool in names]
        for w in told:
            w.proc.send_pause(paused)
        return {"ok": True, "paused": paused, "workers": len(told), "pools": sorted(names)}

    def restart(self, why: str, pools: list[Pool] | None = None) -> dict:
        m = self.m
        pools = pools if pools is not None else [p for p in m.pool_list() if not p.draining]
        n = 0
        for pool in pools:
            pool.generation += 1
            m.launcher_for(pool).renew(pool.cfg)  # new workers come from a new template: new code
            n += len(m.pool_workers(pool))
        where = (
            ""
            if [p.name for p in pools] == [DEFAULT_POOL]
            else f" of pool {', '.join(p.name for p in pools)}"
        )
        generation = max(p.generation for p in pools) if pools else 0
        log.info("%s: rolling restart of %d workers%s (generation %d)", why, n, where, generation)
        return {"ok": True, "replacing": n, "generation": generation}

    def rescale(self, body: dict[str, Any]) -> dict:
        m = self.m
        pools = [p for p in m.pool_list() if not p.draining]
        name = body.get("pool")
        if name is None and len(pools) > 1:
            return {
                "ok": False,
                "error": f"name a pool with --pool: the pools are {', '.join(p.name for p in pools)}",
            }
        found = self.named_pools(name)
        if isinstance(found, dict):
            return found
        pool = found[0]
        cfg = pool.cfg
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
        others = sum(p.cfg.floor for p in pools if p is not pool)
        if new.ceiling > new.limit or new.floor + others > new.limit:
            log.warning("scale to %d refused: above %s", new.ceiling, new.describe_limit())
            return {"ok": False, "error": f"{new.ceiling} workers is above {new.describe_limit()}"}
        self.resize(pool, new)
        bounds = f"min {new.floor}, max {new.ceiling}" if new.autoscale else "fixed"
        where = "" if pool.name == DEFAULT_POOL else f"pool {pool.name}: "
        log.info("scale: %starget now %d workers (%s)", where, pool.target, bounds)
        return {"ok": True, "pool": pool.name, "desired": pool.target, "min": new.floor, "max": new.ceiling}

    def resize(self, pool: Pool, cfg: Config) -> None:
        """New worker bounds for a pool (scale, reload): the target moves into them at once;
        autoscaling turned on starts from the count running so far."""
        pool.target = max(cfg.floor, min(cfg.ceiling, pool.target)) if cfg.autoscale else cfg.workers
        pool.scaler.configure(cfg)
        pool.cfg = cfg
        if not self.m.cfg.pools:  # one pool: its settings are the host's
            self.m.cfg = cfg

    def reload(self, why: str) -> dict:
        """Re-read the config file; settings pinned by the environment or flags stay. All or
        nothing: a changed key that only a restart of herder applies refuses the whole reload.
        Pools added start, pools removed drain, a changed pool is resized or rolled alone."""
        m = self.m
        if not m.cfg.config_file:
            log.warning("%s: no config file to re-read (herder run had no --config)", why)
            return {"ok": False, "error": "herder run was started without --config: nothing to re-read"}
        if m.uplink:
            m.uplink.reloading()
        try:
            new = reread(m.cfg)
            plan = reload_plan(m.cfg, new, m.started_cfg)
            self.check_pool_caps(new)
        except ConfigError as exc:
            log.error("%s: keeping the running config: %s", why, exc)
            if m.uplink:
                m.uplink.ready()
            return {"ok": False, "error": str(exc)}
        pools_done = self.apply(new)
        changed = sorted(plan.applied + plan.restart_workers)
        log.info(
            "%s: config re-read from %s; changed: %s", why, new.config_file, ", ".join(changed) or "nothing"
        )
        for line in pools_done:
            log.info("%s: %s", why, line)
        replacing = 0
        if plan.restart_workers:
            replacing = self.restart(f"{why} ({', '.join(plan.restart_workers)} changed)")["replacing"]
        if m.uplink:
            m.uplink.ready()
        reply = {
            "ok": True,
            "changed": changed,
            "applied": plan.applied,
            "restart_workers": plan.restart_workers,
            "replacing": replacing,
        }
        return reply | ({"pools": pools_done} if pools_done else {})

    def check_pool_caps(self, new: Config) -> None:
        """A pool that stays may not turn its cluster cap on or off on reload (how it reserves
        changes): ConfigError, and nothing changes. A pool added with a cap is fine."""
        m = self.m
        for name, pc in pool_configs(new).items():
            pool = m.pools.get(name)
            stays = pool is not None and not pool.draining and bool(m.cfg.pools and new.pools)
            if stays and (pool.cfg.cluster_max_workers is None) != (pc.cluster_max_workers is None):
                raise ConfigError(
                    f"pools.{name}.cluster_max_workers",
                    "turning a pool's cluster cap on or off changes how this host reserves; "
                    "only a restart of herder applies it; the running config is kept",
                    f"file {new.config_file}",
                )

    def apply(self, new: Config) -> list[str]:
        """Hand each setting to the part that uses it. Every part, every time: each setter is
        cheap and keeps what did not change, and no changed key can be forgotten. Settings
        read where they are used (deadlines, backoff, the workers limit) need only m.cfg.
        Returns what happened to pools (added, removed, rolled)."""
        m = self.m
        done: list[str] = []
        old_cfg, fresh = m.cfg, pool_configs(new)
        for name, pool in list(m.pools.items()):
            if name not in fresh and not pool.draining:
                pool.draining = True  # its workers stop after their jobs; then it goes (master)
                done.append(f"pool {name} removed: its workers finish their jobs and stop")
        for name, pc in fresh.items():
            pool = m.pools.get(name)
            if pool is None or pool.draining:
                m.pools[name] = Pool.build(name, pc, m.host_id, m.recovery, m.tickets)
                if new.pools:
                    done.append(f"pool {name} added")
                continue
            rolled = [
                k for k in KEYS if getattr(pc, k) != getattr(pool.cfg, k) and reload_policy(k) == WORKERS
            ]
            if new.pools and pool.cfg != pc and old_cfg.pools.get(name) != new.pools.get(name):
                done.append(f"pool {name} changed" + (f" ({', '.join(rolled)}: rolled)" if rolled else ""))
                if rolled:
                    pool.generation += 1
            self.resize(pool, pc)
            pool.retirement.configure(pc)
        m.cfg = new
        m.guard.configure(new, m.clock.wall())
        if m.recovery is not None:
            m.recovery.configure(new)
        if m.reader is not None:
            m.reader.set_queues(all_queues(new))
            m.reader.set_interval(min(pc.scale_interval for pc in fresh.values()))
            for name, pc in fresh.items():
                if pc.cluster_max_workers is not None:
                    m.reader.set_cluster(
                        pc.cluster_max_workers, pc.host_ttl, new.kill_budget_window, name, m.host_id
                    )
        logging.getLogger().setLevel(new.log_level.upper())
        m.hooks.configure(new)
        return done
