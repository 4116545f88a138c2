"""Murder: the unresponsive. Each pass judges every worker by its pool's deadlines (the
verdicts are liveness.py's, pure), spends the kill budget on a hung one (guard.py), and kills:
SIGTERM now, SIGKILL after kill_timeout (lifecycle.py). A kill is counted and said once, here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from herder.supervisor.children import lifecycle
from herder.supervisor.children.counters import Counters
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.launcher import Clock
from herder.supervisor.children.states import KillKind, WorkerState, change_state
from herder.supervisor.policy.guard import KillGuard
from herder.supervisor.policy.liveness import derived_state, judge, read_late
from herder.supervisor.policy.pool import Pool, Workers
from herder.supervisor.views.hooks import EventHooks
from herder.supervisor.views.journal import Journal

log = logging.getLogger("herder")


class Murderer:
    """`fleet`: the count the kill budget is a share of (the target, or more when more live)."""

    def __init__(
        self,
        clock: Clock,
        pools: dict[str, Pool],
        guard: KillGuard,
        counters: Counters,
        said: tuple[EventHooks, Journal],
        fleet: Callable[[], int],
    ) -> None:
        self.clock, self.pools, self.workers, self.guard, self.counters = (
            clock, pools, Workers(pools), guard, counters
        )  # fmt: skip
        self.hooks, self.journal = said
        self.fleet = fleet
        self.lagging_reads, self._lag_said_at = 0, float("-inf")  # silences the reader's lag explained

    def murder(self) -> None:
        now, now_wall = self.clock.monotonic(), self.clock.wall
        for w in list(self.workers.values()):
            obs, cfg = w.proc.snapshot(), self.pools[w.pool].cfg  # judged by its pool's deadlines
            state = derived_state(w, obs)
            if state != w.life.state:  # the reason is built only for a change (each worker, each pass)
                change_state(w, state, f"job {obs.job_id}" if obs.job_id else "ready")
            if w.life.state == WorkerState.KILLING:
                lifecycle.escalate(w, now, cfg.kill_timeout)
                continue
            verdict = judge(w, obs, now, cfg)
            if verdict is not None and read_late(verdict, w):
                # Its lines wait in the pipe: the master's reader is behind (starved of CPU by
                # a busy fleet), the worker is not silent. Never kill on the master's own lag.
                self.lagging_reads += 1
                if now - self._lag_said_at > 60:
                    self._lag_said_at = now
                    log.warning("slot %d pid %d: %s, but its lines wait unread: this master is short "
                                "of CPU (workers at nice +%d; see worker_nice); not killed", w.slot, w.pid,
                                verdict.reason, cfg.worker_nice)  # fmt: skip
                verdict = None
            if verdict is None:
                self.guard.responsive(w)
            elif not verdict.judged_hung or self.guard.allow(w, verdict.reason, self.fleet(), now_wall()):
                self.kill(w, verdict.reason, verdict.kind)  # the fleet size: counted only for a verdict
        self.guard.settle(self.workers.values())

    def kill(self, w: Worker, reason: str, kind: KillKind) -> None:
        """SIGTERM now (SIGKILL after kill_timeout, in murder); `kind` is the reason's class."""
        lifecycle.kill(w, reason, kind, self.clock.monotonic())
        self.counters.totals.killed += 1
        self.counters.totals.killed_by[kind] += 1
        self.counters.totals.killed_in(w.pool)[kind] += 1
        self.hooks.emit("worker_killed", pool=w.pool, slot=w.slot, pid=w.pid, kind=kind, reason=reason)
        self.journal.record("killed", w.pool, f"{w.label} killed by herder: {reason}", w.slot, w.pid)
