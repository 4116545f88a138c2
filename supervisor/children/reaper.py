"""Reap: the dead. A worker that exited leaves its pool; the jobs it held go back on their
queues; its slot backs off when it keeps dying young; the exit is said once, as an event and in
the journal. The loop calls `reap` each pass; the lifecycle (lifecycle.py) does the reaping
itself, this room what follows from it.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from herder.common.exits import describe
from herder.common.rq_names import rq_worker_name
from herder.supervisor.children import lifecycle
from herder.supervisor.children.counters import Counters
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.launcher import Clock
from herder.supervisor.children.launchers import Launchers
from herder.supervisor.children.observations import Observations
from herder.supervisor.children.states import KillKind
from herder.supervisor.policy.pool import Pool, Workers
from herder.supervisor.policy.pressure import OomWatch
from herder.supervisor.views.hooks import EventHooks
from herder.supervisor.views.journal import Journal

if TYPE_CHECKING:
    from herder.supervisor.redis_side.recovery import Recovery

log = logging.getLogger("herder")
Fold = Callable[[Worker], None]  # a worker's finished jobs into the job metrics


class Reaper:
    """What a worker's exit sets in motion. `stopping`: the master's stop (a stop's exits are
    no crash loop); `finished`: the worker's last finished jobs into the job metrics."""

    def __init__(
        self,
        clock: Clock,
        hostname: str,
        pools: dict[str, Pool],
        counters: Counters,
        recovery: Recovery | None,
        said: tuple[EventHooks, Journal, OomWatch],
    ) -> None:
        self.clock, self.hostname, self.pools, self.counters, self.recovery = (
            clock, hostname, pools, counters, recovery
        )  # fmt: skip
        self.hooks, self.journal, self.oom = said
        self._holding: dict[str, str | None] = {}  # RQ name -> the job it holds, every live worker's
        self._told_left = False  # a worker left since the recovery thread was last told

    def reap(
        self,
        launchers: Launchers,
        stopping: bool,
        finished: Fold,
        wake: Callable[[], None],
        changed: set[int] | None = None,
    ) -> None:
        """The workers that exited: among those that changed, the ones whose stdout closed (a
        busy fleet's lines change every worker each pass: no waitid for those); every worker at
        a sweep, which a SIGCHLD asks for."""
        for pool in list(self.pools.values()):
            if changed is None:
                look = list(pool.workers.values())
            else:
                ended = (w for pid in changed if (w := pool.by_pid.get(pid)) is not None)
                look = [w for w in ended if w.proc.snapshot().stdout_eof]
            for w in look:
                if w.proc.has_exited():
                    pool.leave(w)  # it leaves its pool
                    self.reap_one(w, pool, stopping, finished)
        for launcher in launchers.all():
            launcher.tend(wake)  # the fork server's life; strays a subreaper inherits
        self.forget_drained_pools()

    def reap_one(self, w: Worker, pool: Pool, stopping: bool, finished: Fold) -> None:
        now = self.clock.monotonic()
        for name in self.rq_names(w):  # no longer one the sweep must leave alone
            self._holding.pop(name, None)
        self._told_left = True
        ex = lifecycle.reap(w, now)
        code, obs, lived, how, graceful = ex.code, ex.obs, ex.lived, ex.how, ex.graceful
        oom = code == -signal.SIGKILL and not w.killed and self.oom.killed(w.proc.pid)
        if oom:  # said as such in the exit line, the event, the requeue and herder_kills_total
            how = "killed by the kernel's OOM killer (SIGKILL)"
            self.counters.totals.killed_by[KillKind.OOM] += 1
            self.counters.totals.killed_in(w.pool)[KillKind.OOM] += 1
        why = "stopped as asked" if graceful else w.life.kill_reason or "unexpected"
        if not graceful and self.recovery is not None and pool.cfg.worker_command is None:
            # A killed RQ worker cannot unregister itself, nor say what it had popped.
            for name in self.rq_names(w):
                self.recovery.forget(name)
        self.counters.fold_exit(w, obs, now)
        finished(w)
        life = f"lived {lived:.1f} s, {obs.jobs_ok} jobs ok, {obs.jobs_failed} failed"
        lifecycle.exited(w, ex, f"{how}; {why}; {life}")
        cause = f"killed by herder: {w.life.kill_reason}" if w.killed else f"worker died ({how})"
        label = "killed" if w.killed else "died"  # the metrics' reason
        for held in obs.jobs.values():  # every job it ran: one per thread of a threaded worker
            kind = w.life.kill_kind or KillKind.DIED
            self.requeue(held.job_id, f"{cause} while running the job", label, kind, self.rq_names(w))
        slot, delay = pool.slots.get(w.slot), None
        if slot is not None and not stopping:  # a stop's exits are no crash loop
            delay = lifecycle.back_off(slot, ex, pool.cfg, now)
            if delay is not None:
                log.warning("slot %d: backoff (died %d times in a row, before `ready` or within %.1f s "
                            "of its start); next spawn in %.2f s", w.slot, slot.young_deaths,
                            pool.cfg.min_uptime, delay)  # fmt: skip
        young = delay is not None
        if not graceful and not w.killed:  # an exit herder did not ask for
            self.counters.totals.died_by_pool[w.pool] += 1  # herder_workers_died_total
            self.report_death(w, code, obs, slot.young_deaths if young and slot else 1, oom)
        self.record_exit(w, how, graceful, oom, obs)

    def record_exit(self, w: Worker, how: str, graceful: bool, oom: bool, obs: Observations) -> None:
        """The exit as an event: stopped as asked, or a death and its cause (a kill by herder
        was told when herder decided it: `kill`)."""
        held = [h.job_id for h in obs.jobs.values()]
        fate = "requeued" if self.recovery is not None else "not requeued (no Redis)"
        jobs = f", job{'s' if len(held) > 1 else ''} {', '.join(held)} {fate}" if held else ""
        who, record = f"slot {w.slot} pid {w.pid}", self.journal.record
        if graceful:
            record("stopped", w.pool, f"{who} stopped ({w.life.stop_reason or 'as asked'})", w.slot, w.pid)
        elif oom:
            record("oom", w.pool, f"{who} killed by the kernel's OOM killer{jobs}", w.slot, w.pid)
        elif w.killed:
            record("killed", w.pool, f"{who} exited ({how}) after herder's kill{jobs}", w.slot, w.pid)
        else:
            record("died", w.pool, f"{who} died ({how}){jobs}", w.slot, w.pid)

    def report_death(self, w: Worker, code: int, obs: Observations, in_a_row: int, oom: bool = False) -> None:
        """`worker_died`: an exit herder did not ask for (a crash, os._exit, a segfault, a kill
        from outside), with the jobs it held, which the reap has put back on their queues. A
        slot dying young again and again says so at 1, 2, 4, 8 ... deaths in a row: a crash
        loop is a few events, not one per death."""
        if in_a_row & (in_a_row - 1):
            return
        self.hooks.emit(
            "worker_died",
            pool=w.pool,
            slot=w.slot,
            pid=w.pid,
            exit_code=code if code >= 0 else None,
            signal=describe(code).removeprefix("killed by ") if code < 0 else None,
            jobs=[{"job_id": h.job_id, "queue": h.queue, "function": h.func} for h in obs.jobs.values()],
            # Its jobs went to recovery: back on their queue, or past max_requeues given up
            # (then a `job_given_up` of their own).
            recovered=bool(obs.jobs) and self.recovery is not None,
            deaths_in_a_row=in_a_row,
            oom=oom,  # the kernel's OOM killer sent the SIGKILL (its cgroup's counter moved)
        )

    def requeue(
        self, job_id: str, reason: str, label: str, cause: str = "", workers: Iterable[str] = ()
    ) -> None:
        if self.recovery is None:  # no Redis: nothing to put it back on
            return log.error("job %s: %s; no Redis connection to requeue it", job_id, reason)
        self.recovery.requeue(job_id, reason, label, cause, tuple(workers))

    def forget_drained_pools(self) -> None:
        """A pool a reload removed is gone once its last worker is."""
        for pool in [p for p in self.pools.values() if p.draining]:
            if not pool.workers:
                del self.pools[pool.name]
                log.info("pool %s: drained and removed", pool.name)

    def rq_names(self, w: Worker) -> tuple[str, ...]:
        """As the worker registers with RQ: one name, or one per thread of a threaded worker
        (worked out once: each pass tells the recovery thread every worker's)."""
        if not w.rq_names:
            w.rq_names = tuple(rq_worker_name(self.hostname, w.slot, w.pid, t) for t in range(w.threads))
        return w.rq_names

    def tell_recovery(self, workers: Workers, changed: set[int] | None) -> None:
        """What the next sweep must not touch: each RQ name of a live worker and the job it
        holds. Kept up for the workers that changed (all at a sweep), told when it moved."""
        if self.recovery is None:
            return
        if changed is None:
            self._holding, look = {}, workers.values()
        else:
            look = [w for pid in changed if (w := workers.by_pid(pid)) is not None]
        before = len(self._holding)
        moved = False
        for w in look:
            jobs = w.proc.snapshot().jobs
            for thread, name in enumerate(self.rq_names(w)):
                job = jobs[thread].job_id if thread in jobs else None
                if self._holding.get(name, False) != job:
                    self._holding[name], moved = job, True
        if moved or self._told_left or changed is None or len(self._holding) != before:
            self._told_left = False
            self.recovery.tell(dict(self._holding))  # a copy: the recovery thread reads it
