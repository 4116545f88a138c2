"""Spawn: a pool's plan carried out through the lifecycle (lifecycle.py): the stops it asks
for, each said as the plan says, then the spawns, within the host's workers limit and paced
(fleet.py), each from its pool's launcher (launchers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from herder.common.config import DEFAULT_POOL
from herder.supervisor.children import fleet, lifecycle
from herder.supervisor.children.counters import Counters
from herder.supervisor.children.fleet import Limits, Slot, Worker
from herder.supervisor.children.launcher import Clock, Launcher, worker_argv, worker_env
from herder.supervisor.children.launchers import Launchers
from herder.supervisor.policy import retirement
from herder.supervisor.policy.pool import Plan, Pool, Workers
from herder.supervisor.views.hooks import EventHooks
from herder.supervisor.views.journal import Journal

log = logging.getLogger("herder")


class Spawner:
    """`pending`: pacing (or a template still warming) left spawns for the next pass, which
    then comes soon (the loop's next_wait)."""

    def __init__(
        self,
        clock: Clock,
        pools: dict[str, Pool],
        launchers: Launchers,
        counters: Counters,
        said: tuple[EventHooks, Journal],
        wake: Callable[[], None],
    ) -> None:
        self.clock, self.pools, self.workers, self.launchers = clock, pools, Workers(pools), launchers
        self.counters, self.wake = counters, wake
        self.hooks, self.journal = said
        self.pending = False

    def carry_out(self, pool: Pool, plan: Plan, limit: int) -> None:
        """A pool's plan, through the lifecycle: `retire`, the stops (each told as the plan
        says), the spawns."""
        for w in plan.retire:
            retirement.tell_retire(w)
        for stop in plan.stops:
            w = stop.worker
            if stop.culled:
                self.hooks.emit(
                    "worker_culled", pool=pool.name, slot=w.slot, pid=w.pid, reason=w.limits.retire_reason
                )
            if stop.said is not None:
                self.journal.record(stop.said[0], pool.name, stop.said[1], w.slot, w.pid)
            lifecycle.ask_stop(w, stop.why, self.clock.monotonic())
        self.spawn_into_free_slots(pool, plan.spawn, limit)

    def spawn_into_free_slots(self, pool: Pool, room: int, limit: int) -> None:
        """Up to `room` workers for a pool, within the host's workers limit and paced
        (fleet.spawn_room); a pool's slots back off on their own."""
        waiting = room > 0 and self.launcher_for(pool).warming()  # a warm template is moments away
        room = 0 if waiting else fleet.spawn_room(room, self.workers.values, limit)
        now = self.clock.monotonic()
        free = pool.free_slots(self.pools.values(), room, limit, now)
        pending = fleet.spawn_paced(free, lambda slot: self.spawn(slot, pool), self.clock.monotonic)
        self.pending = self.pending or pending or waiting

    def spawn(self, slot: Slot, pool: Pool) -> None:
        cfg = pool.cfg
        jobs_limit, age_limit = pool.retirement.draw_limits()  # the worker stops at its jobs limit
        argv, env = worker_argv(cfg), worker_env(cfg, slot.index, pool.name, jobs_limit)
        proc = lifecycle.start(  # from the warm template (forkserver.py), or a new interpreter
            slot,
            cfg,
            self.clock.monotonic(),
            lambda: self.launcher_for(pool).spawn(argv, env, slot.index, self.wake),
            f"slot {slot.index}: cannot spawn worker",
        )
        if proc is None:
            return
        w = Worker(
            slot.index,
            proc,
            spawned_at=self.clock.monotonic(),
            generation=pool.generation,
            pool=pool.name,
            threads=pool.cfg.threads if pool.cfg.worker_command is None else 1,
            limits=Limits(jobs=jobs_limit, age=age_limit),
        )
        if pool.paused:
            proc.send_pause(True)
        pool.workers[slot.index] = w
        self.counters.totals.spawned += 1
        where = "" if pool.name == DEFAULT_POOL else f" (pool {pool.name})"
        log.info("slot %d pid %d: spawned -> %s%s", slot.index, w.pid, w.life.state, where)
        self.journal.record("spawned", pool.name, f"{w.label} spawned{where}", slot.index, w.pid)

    def launcher_for(self, pool: Pool) -> Launcher:
        pool.launcher = self.launchers.for_pool(pool, self.wake)  # a restart renews it
        return pool.launcher
