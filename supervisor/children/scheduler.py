"""The master's scheduler child: one process per host running RQ's scheduler
(herder.worker.scheduler), so enqueue_at/enqueue_in and Retry intervals work under herder.

Kept like a worker but outside the fleet: spawned while the `scheduler` setting is on,
watched with the workers' deadlines (liveness.judge: `ready`, heartbeat silence, stop
timeout), killed through its own process group, respawned at once after a death (with a
slot's backoff if it keeps dying young), restarted when a setting it depends on changes on
reload. It never counts towards the target, the totals or the kill budget, and its log lines
say "scheduler pid N", never "slot N". When it exits the master frees the RQ scheduler locks
it still held (redis_side/scheduler_locks.py), so its replacement, or a standby on another
host, schedules those queues within a tick (docs/design.md, "RQ's scheduler").
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Callable
from dataclasses import replace

from herder.common import worker_protocol as wp
from herder.common.config import Config
from herder.common.rq_names import ENV_SCHEDULER_NAME, rq_scheduler_name
from herder.supervisor.children import lifecycle
from herder.supervisor.children.fleet import ProcessHandle, Slot, Worker
from herder.supervisor.children.launcher import Clock, worker_env
from herder.supervisor.children.states import LEAVING, WORKING, KillKind, WorkerState, change_state
from herder.supervisor.children.workerproc import WorkerProcess
from herder.supervisor.policy.liveness import judge, read_late
from herder.supervisor.redis_side.scheduler_locks import Holder, SchedulerLocks
from herder.supervisor.views.model import CronStatus, LockHolder, QueueLock, SchedulerStatus

log = logging.getLogger("herder")

Spawn = Callable[[list[str], dict[str, str], Callable[[], None]], ProcessHandle]


def spawn_process(argv: list[str], env: dict[str, str], wake: Callable[[], None]) -> ProcessHandle:
    return WorkerProcess.spawn(argv, env, -1, wake, kind="scheduler")


def settings_of(cfg: Config) -> tuple[object, ...]:
    """What the scheduler process starts with: a reload that changes any of it restarts it."""
    return (
        tuple(cfg.queues),
        cfg.scheduler,
        cfg.cron,
        tuple(cfg.paths),
        cfg.redis_url,
        cfg.log_level,
        cfg.heartbeat_interval,
        cfg.heartbeat_timeout,
        cfg.kill_timeout,
    )


class SchedulerKeeper:
    def __init__(
        self,
        locks: SchedulerLocks | None,
        clock: Clock,
        host_id: str,
        spawn: Spawn = spawn_process,
        can_spawn: Callable[[], bool] = lambda: True,
    ) -> None:
        """`spawn`: how its process starts (the master's: from the fork server); `can_spawn`:
        False while that should wait (a fork server still importing)."""
        self.locks, self.clock, self.host_id = locks, clock, host_id  # no locks (no Redis): inert
        self._spawn_process, self._can_spawn = spawn, can_spawn
        self.w: Worker | None = None
        self.name = ""  # the RQ scheduler name of the current process
        self.queues: list[str] = []  # and the queues it was started for
        self.settings: tuple[object, ...] = ()
        self.slot = Slot(-1)
        self.spawned = 0
        self._started = False

    @property
    def running(self) -> bool:
        """A scheduler process is alive (the master waits for it before it exits)."""
        return self.w is not None

    def in_motion(self) -> bool:
        """Its process is starting or stopping: the master's loop looks more often."""
        return self.w is not None and self.w.life.state not in WORKING

    # ---- in the reconcile loop -------------------------------------------------------------

    def step(self, cfg: Config, stopping: bool, wake: Callable[[], None]) -> None:
        if self.locks is None:
            return
        if not self._started:
            self._started = True
            self.locks.start()
        self.locks.set_queues(cfg.queues)
        now = self.clock.monotonic()
        if self.w is not None:
            if self.w.proc.has_exited():
                self._reap(self.w, now, cfg)
            else:
                self._watch(self.w, now, cfg)
        wanted = (cfg.scheduler or bool(cfg.cron)) and not stopping
        if self.w is None and wanted and not self.slot.in_backoff(now) and self._can_spawn():
            self._spawn(cfg, wake, now)
        elif self.w is not None and self.w.life.state not in LEAVING:
            if not wanted:
                self._stop(
                    self.w, "herder is stopping" if stopping else "the scheduler and cron settings are off"
                )
            elif settings_of(cfg) != self.settings:
                self._stop(self.w, "its settings changed")

    def hurry(self) -> None:
        """A hurried stop: end it now; its locks are freed when it is reaped."""
        if self.w is not None and self.w.life.state != WorkerState.KILLING:
            self._kill(self.w, "herder is stopping in a hurry")

    def close(self, timeout: float = 5.0) -> None:
        """At the master's exit: finish freeing locks (the locks' TTL is the backstop)."""
        if self.locks is not None and self._started:
            left = self.locks.drain(timeout)
            if left:
                log.warning("%d scheduler lock releases not done (Redis unreachable); the locks lapse", left)

    def _spawn(self, cfg: Config, wake: Callable[[], None], now: float) -> None:
        name = rq_scheduler_name(self.host_id, secrets.token_hex(4))
        env = worker_env(replace(cfg, host_id=self.host_id), 0)  # its Config names this host
        env.pop(wp.ENV_SLOT, None)
        env[ENV_SCHEDULER_NAME] = name
        argv = [sys.executable, "-P", "-m", "herder.worker.scheduler"]
        proc = lifecycle.start(
            self.slot, cfg, now, lambda: self._spawn_process(argv, env, wake), "cannot spawn the scheduler"
        )
        if proc is None:
            return
        self.w = Worker(self.slot.index, proc, spawned_at=now, title="scheduler")
        self.name, self.queues, self.settings = name, list(cfg.queues), settings_of(cfg)
        self.spawned += 1
        log.info("scheduler pid %d: spawned as %s", proc.pid, name)

    def _watch(self, w: Worker, now: float, cfg: Config) -> None:
        # Not a fleet worker, but it lives the workers' life (lifecycle.py): the same state
        # funnel, kill and escalation; its lines say `scheduler pid N`.
        obs = w.proc.snapshot()
        if w.life.state == WorkerState.STARTING and obs.ready:
            change_state(w, WorkerState.IDLE, "ready")
        if w.life.state == WorkerState.KILLING:
            lifecycle.escalate(w, now, cfg.kill_timeout)
            return
        verdict = judge(w, obs, now, cfg)
        if verdict is not None and not read_late(verdict, w):
            self._kill(w, verdict.reason)

    def _stop(self, w: Worker, why: str) -> None:
        lifecycle.ask_stop(w, f"`stop`: {why}", self.clock.monotonic())

    def _kill(self, w: Worker, reason: str) -> None:
        lifecycle.kill(w, reason, KillKind.SCHEDULER, self.clock.monotonic())

    def _reap(self, w: Worker, now: float, cfg: Config) -> None:
        ex = lifecycle.reap(w, now)
        self.w = None
        assert self.locks is not None
        self.locks.release(self.name, self.queues)  # owner-checked: only what it still held
        why = "after `stop`" if ex.graceful else w.life.kill_reason or "unexpected"
        # The exit's one line is the one below, in the form docs and operators know; the
        # state's own line says it again only at DEBUG.
        lifecycle.exited(w, ex, f"{ex.how}; {why}", logging.DEBUG)
        log.log(
            logging.INFO if ex.graceful else logging.WARNING,
            "scheduler pid %d: exited (%s, %s) after %.1f s; freeing its scheduler locks",
            w.pid,
            ex.how,
            why,
            ex.lived,
        )
        delay = lifecycle.back_off(self.slot, ex, cfg, now)
        if delay is not None:
            log.warning(
                "scheduler: backoff (died %d times in a row); next spawn in %.2f s",
                self.slot.young_deaths,
                delay,
            )

    # ---- for `herder status` -----------------------------------------------------------------

    def status(self, cfg: Config) -> SchedulerStatus:
        """Where RQ's scheduler runs: this host's process, and each queue's lock holder (read
        from Redis, so it names another host's scheduler, or nobody, just as well)."""
        now = self.clock.monotonic()
        w = self.w
        reading = self.locks.reading() if self.locks else None
        queues = tuple(
            QueueLock(q, self._holder(reading.holders.get(q) if reading else None)) for q in cfg.queues
        )
        if w is not None:
            state = str(w.life.state)
        elif (cfg.scheduler or cfg.cron) and self.locks is not None:
            state = "backoff" if self.slot.in_backoff(now) else "starting"
        else:
            state = "off"
        return SchedulerStatus(
            enabled=cfg.scheduler and self.locks is not None,
            state=state,
            pid=w.pid if w else None,
            name=self.name if w else None,
            uptime=round(now - w.spawned_at, 1) if w else None,
            spawned=self.spawned,
            holds=tuple(q.name for q in queues if q.holder and q.holder.here),
            queues=queues,
            read_age=round(now - reading.at, 1) if reading else None,
            cron=CronStatus(
                bool(cfg.cron), cfg.cron or None, self._holder(reading.cron if reading else None)
            ),
        )

    def _holder(self, h: Holder | None) -> LockHolder | None:
        """A lock's holder as status shows it: here, when it is this host's process."""
        if h is None:
            return None
        here = self.w is not None and h.name == self.name
        return LockHolder(h.name, h.host_id, h.hostname, h.pid, here)
