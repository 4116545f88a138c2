"""Control requests: what `herder status`, `scale`, `restart`, `pause`, `resume`, `reload`,
`stop` and `enqueue` do, and SIGHUP.

The control thread hands each request to the reconcile loop, which answers it here
(`handle_requests`), so a reply always matches what the loop decides; `ping` and `enqueue`
touch no fleet state and are answered on the control thread (`answer_directly`). A reload is
reload.py's; `status` renders a snapshot the loop takes for it (views/status.py).
"""

from __future__ import annotations

import logging
import os
import queue
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Any, Protocol

from herder.common.config import DEFAULT_POOL
from herder.common.control_protocol import LOOP_TIMEOUT
from herder.supervisor.children.fleet import Worker
from herder.supervisor.control import handoff, reload
from herder.supervisor.control.reload import Reloadable
from herder.supervisor.control.server import ControlServer, Request
from herder.supervisor.policy.pool import Pool
from herder.supervisor.views.journal import Journal
from herder.supervisor.views.model import HostSnapshot
from herder.supervisor.views.status import build_status

log = logging.getLogger("herder")


class Operable(Protocol):
    """What commands ask of the master (herder.supervisor.master.Master): its pools, which hold
    their workers and take restart, pause and scale themselves (pool.py), and the few things
    only the loop does."""

    journal: Journal
    control: ControlServer | None

    def active_pools(self) -> list[Pool]: ...  # not draining

    def pool_list(self) -> list[Pool]: ...  # every pool, draining ones too

    def stop_worker(self, w: Worker, why: str) -> None: ...

    def begin_stop(self, hurry: bool, why: str) -> None: ...

    def set_stop_timeout(self, seconds: float) -> None: ...

    def take_snapshot(self, usage: bool = False) -> HostSnapshot: ...


class Commands:
    def __init__(self, m: Operable, reloadable: Reloadable, handing: handoff.Handing) -> None:
        self.m = m
        self.reloadable = reloadable
        self.handing = handing  # `herder upgrade` (handoff.py, takeover.py)
        self.http_requests: queue.SimpleQueue[Request] = queue.SimpleQueue()  # the dashboard's controls

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

        cfg = self.reloadable.cfg
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

    def submit(self, body: dict, wake: Callable[[], None]) -> dict:
        """A command from the dashboard (an HTTP thread): queued to the loop as the control
        socket queues its own, answered from there."""
        request = Request(body)
        self.http_requests.put(request)
        wake()
        try:
            return request.reply.result(timeout=LOOP_TIMEOUT)
        except FutureTimeout:
            return {"ok": False, "error": "the master did not answer in time (is its loop hung?)"}

    # ---- in the reconcile loop -----------------------------------------------------------

    def handle_requests(self) -> None:
        control = self.m.control
        for requests in (control.requests if control else None, self.http_requests):
            if requests is not None:
                self._answer_all(requests)

    def _answer_all(self, requests: queue.SimpleQueue[Request]) -> None:
        while True:
            try:
                request = requests.get_nowait()
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
                reply = build_status(self.m.take_snapshot(usage=True))
                return reply | handoff.status(self.handing, reply)
            case "handover":
                return handoff.answer(self.handing, body)
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
            case "stop_worker":
                return self.stop_one(body.get("pid"))
            case "enqueue":  # asked while the master was starting: the control thread queued it
                return self.enqueue(body)
            case "stop":
                if "timeout" in body:
                    self.m.set_stop_timeout(float(body["timeout"]))
                self.m.begin_stop(hurry=False, why="herder stop")
                # drain_seconds: the longest the drain may take, so `herder stop` knows how long to wait.
                return {
                    "ok": True,
                    "stopping": sum(len(p.workers) for p in self.m.pool_list()),
                    "drain_seconds": self.reloadable.cfg.drain_seconds,  # the settings in force
                }
            case cmd:
                return {"ok": False, "error": f"unknown command {cmd!r}"}

    def stop_one(self, pid: object) -> dict:
        """One worker finishes its job and stops; its slot starts a new one (the target stays)."""
        found = [w for p in self.m.pool_list() for w in p.live() if w.pid == pid]
        if not found:
            return {"ok": False, "error": f"no live worker with pid {pid}"}
        w = found[0]
        self.m.stop_worker(w, "stopped by an operator")
        log.info("%s: stopped by an operator (a replacement starts in a free slot)", w.label)
        return {"ok": True, "pid": w.pid, "slot": w.slot, "pool": w.pool}

    def named_pools(self, name: object) -> list[Pool] | dict:
        """The pool a request names, or every pool when it names none; an error reply for a
        pool that does not exist (naming the ones that do)."""
        pools = self.m.active_pools()
        if name is None:
            return pools
        found = [p for p in pools if p.name == name]
        if not found:
            return {
                "ok": False,
                "error": f"no pool {name!r}; the pools are {', '.join(p.name for p in pools)}",
            }
        return found

    def pause(self, paused: bool, pools: list[Pool]) -> dict:
        """`herder pause` / `resume` [--pool]: the workers finish their jobs and take no new
        ones (Sidekiq's quiet, celery's cancel_consumer); workers started meanwhile start paused."""
        m = self.m
        for pool in pools:
            if pool.pause(paused):  # its workers told, each pool its own
                what = "finish their jobs and take no new ones" if paused else "take jobs again"
                where = "" if pool.name == DEFAULT_POOL else f" (pool {pool.name})"
                log.info("herder %s%s: workers %s", "pause" if paused else "resume", where, what)
                m.journal.record(
                    "paused" if paused else "resumed",
                    pool.name,
                    f"pool {pool.name} {pool.state}: workers {what}",
                )
        told = sum(len(p.workers) for p in pools)
        return {"ok": True, "paused": paused, "workers": told, "pools": sorted(p.name for p in pools)}

    def restart(self, why: str, pools: list[Pool] | None = None) -> dict:
        m = self.m
        pools = pools if pools is not None else m.active_pools()
        for pool in pools:
            pool.restart()
        n = sum(len(p.live()) for p in pools)
        where = (
            ""
            if [p.name for p in pools] == [DEFAULT_POOL]
            else f" of pool {', '.join(p.name for p in pools)}"
        )
        generation = max(p.generation for p in pools) if pools else 0
        log.info("%s: rolling restart of %d workers%s (generation %d)", why, n, where, generation)
        for pool in pools:
            m.journal.record(
                "restart",
                pool.name,
                f"{why}: rolling restart of pool {pool.name} (generation {pool.generation})",
            )
        return {"ok": True, "replacing": n, "generation": generation}

    def rescale(self, body: dict[str, Any]) -> dict:
        m = self.m
        pools = m.active_pools()
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
        bounds: dict[str, int]
        if "workers" in body:
            n = int(body["workers"])
            if n < 1:
                return {"ok": False, "error": "workers must be at least 1"}
            if cfg.autoscale:
                return {"ok": False, "error": "autoscaling is on: use --min/--max"}
            bounds = {"workers": n}
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
            bounds = {"min_workers": lo, "max_workers": hi}
        new = replace(pool.configured, **bounds)
        others = sum(p.cfg.floor for p in pools if p is not pool)
        if new.ceiling > new.limit or new.floor + others > new.limit:
            log.warning("scale to %d refused: above %s", new.ceiling, new.describe_limit())
            return {"ok": False, "error": f"{new.ceiling} workers is above {new.describe_limit()}"}
        before = f"min {pool.cfg.floor}, max {pool.cfg.ceiling}" if cfg.autoscale else str(pool.target)
        pool.scale(bounds)
        shown = f"min {new.floor}, max {new.ceiling}" if new.autoscale else "fixed"
        where = "" if pool.name == DEFAULT_POOL else f"pool {pool.name}: "
        log.info("scale: %starget now %d workers (%s)", where, pool.target, shown)
        after = f"min {new.floor}, max {new.ceiling}" if new.autoscale else str(pool.target)
        m.journal.record(
            "scale", pool.name, f"operator: pool {pool.name} scaled from {before} to {after} workers"
        )
        return {"ok": True, "pool": pool.name, "desired": pool.target, "min": new.floor, "max": new.ceiling}

    def reload(self, why: str) -> dict:
        """`herder reload` and SIGHUP (reload.py); keys only new workers take roll every pool."""
        reply = reload.reload(self.reloadable, why, lambda reason: self.restart(reason)["replacing"])
        if reply.get("ok"):
            changed = ", ".join(sorted(reply.get("changed", []) or [])) or "nothing changed"
            self.m.journal.record("reload", DEFAULT_POOL, f"{why}: configuration re-read ({changed})")
        else:
            self.m.journal.record("reload", DEFAULT_POOL, f"{why} refused: {reply.get('error', 'invalid')}")
        return reply
