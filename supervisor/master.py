"""The master: one reconcile loop that spawns, watches, stops and replaces workers.

Shaped like gunicorn's arbiter: wait for an event (a wake-up byte from a reader thread,
a signal, or the tick), then reap the dead, then murder the unresponsive, then manage
the fleet towards its target. Signal handlers only record the signal; the loop acts.
Only this loop changes a worker's state, and every change is logged with its reason.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace

from redis import Redis

from herder.common.config import ENV_RESOLVED, Config, ConfigError, redact_url
from herder.supervisor import logs
from herder.supervisor.control import ControlServer, Request
from herder.supervisor.redis_side.budget import ClusterView, KillBudget, cluster_keys
from herder.supervisor.redis_side.cluster import share_of
from herder.supervisor.redis_side.observer import ClusterSettings, Observer
from herder.supervisor.redis_side.requeuer import Requeuer
from herder.supervisor.scaling import ScaleConfig, ScaleState, decide, learn_rate, pick_idle_to_stop
from herder.supervisor.states import WorkerState
from herder.supervisor.status import build_status
from herder.supervisor.uplink import Uplink
from herder.supervisor.workerproc import STDERR_LINES_PER_SECOND, Observations, WorkerProcess
from herder.watchdog.core import describe as describe_exit

log = logging.getLogger("herder")

TICK = 0.25  # the loop looks at deadlines at least this often
COUNTER_REPORT_INTERVAL = 5.0
DUPLICATE_SIGNAL_WINDOW = 1.0  # a second SIGINT sooner than this is a duplicate delivery
EOF_GRACE = 1.0  # seconds a worker may live on after closing its stdout


@dataclass
class Slot:
    """A place in the fleet. It outlives the workers that fill it, and remembers how
    they died, so a slot whose workers keep dying young backs off."""

    index: int
    young_deaths: int = 0
    next_spawn_at: float = 0.0


@dataclass
class Totals:
    spawned: int = 0
    exited: int = 0
    killed: int = 0
    requeued: int = 0
    failed: int = 0
    malformed: int = 0
    oversized: int = 0
    throttled: int = 0
    jobs_ok: int = 0
    jobs_failed: int = 0
    busy_seconds: float = 0.0


@dataclass
class Reported:
    """Counter values already logged for one worker, so logs say what is new."""

    malformed: int = 0
    oversized: int = 0
    throttled: int = 0
    stderr_dropped: int = 0
    at: float = 0.0


@dataclass
class Master:
    cfg: Config
    uplink: Uplink | None = None
    target: int = 0
    workers: dict[int, WorkerProcess] = field(default_factory=dict)
    slots: dict[int, Slot] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)
    stopping: bool = False
    _signals: list[int] = field(default_factory=list)
    _reported: dict[int, Reported] = field(default_factory=dict)
    _ready_sent: bool = False
    _last_alive: float = 0.0
    _sigint_count: int = 0
    _first_sigint: float = 0.0
    scale_state: ScaleState = field(default_factory=ScaleState)
    grant: int | None = None  # cluster grant; None when there is no cluster cap
    _done_seen: tuple[int, float] = (0, 0.0)  # jobs and busy seconds already folded into the rate
    generation: int = 0  # bumped by a rolling restart
    degraded: str = ""  # why health is degraded (the kill budget is spent), or ""

    def __post_init__(self) -> None:
        self.target = self.target or self.cfg.floor
        self.host_id = self.cfg.host_id or f"{socket.gethostname()}:{os.getpid()}"
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.requeuer = (
            Requeuer(
                Redis.from_url(self.cfg.redis_url, socket_timeout=5, socket_connect_timeout=3),
                self.cfg.max_requeues,
            )
            if self.cfg.redis_url
            else None
        )
        self.hostname = socket.gethostname()
        self.observer: Observer | None = None
        if self.cfg.redis_url:  # status shows queue lengths even for a fixed count
            cluster = None
            if self.cfg.cluster_max_workers is not None:
                cluster = ClusterSettings(
                    self.host_id, self.cfg.cluster_max_workers, self.cfg.host_ttl, self.cfg.kill_budget_window
                )
                self.grant = 0  # spawn nothing until the cluster grants it
            self.observer = Observer(
                Redis.from_url(self.cfg.redis_url, socket_timeout=5, socket_connect_timeout=3),
                self.cfg.queues,
                self.cfg.scale_interval,
                self.wake,
                cluster,
            )
        # The policy decides for the whole cluster when there is a cap, else for this host.
        self.scale_cfg = ScaleConfig(
            min_workers=self.cfg.floor,
            max_workers=self.cfg.cluster_max_workers or self.cfg.ceiling,
            interval=self.cfg.scale_interval,
            scale_down_delay=self.cfg.scale_down_delay,
            drain_target=self.cfg.drain_target,
        )
        self.cluster_desired = self.target
        self.budget = KillBudget(window=self.cfg.kill_budget_window, fraction=self.cfg.kill_budget)
        self.cluster_kills = ClusterView() if self.cfg.cluster_max_workers is not None else None
        self.started_at = time.time()
        self.queue_stats: dict[str, dict[str, float]] = {}  # name -> backlog, running, growth
        self.control: ControlServer | None = None
        if self.cfg.state_dir:
            self.control = ControlServer(self.cfg.state_dir, self.wake, self.answer_directly)

    # ---- events ----------------------------------------------------------------------

    def wake(self) -> None:
        """Called by reader threads: something worth a look happened."""
        try:
            os.write(self._wake_w, b".")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake anyway

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals.append(signum)  # set_wakeup_fd wakes the loop

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self._wake_w)

    def wait(self, timeout: float) -> None:
        try:
            readable, _, _ = select.select([self._wake_r], [], [], timeout)
        except InterruptedError:
            return
        if readable:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass

    def handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if sig == signal.SIGCHLD:
                continue  # reap() looks at every worker each pass
            if sig == signal.SIGHUP:
                self.reload("SIGHUP")
            elif sig == signal.SIGQUIT:
                self.begin_stop(hurry=True, why="SIGQUIT")
            elif sig == signal.SIGINT:
                now = time.monotonic()
                if self._sigint_count and now - self._first_sigint < DUPLICATE_SIGNAL_WINDOW:
                    # One Ctrl-C delivered twice (to the process and to its group, as
                    # `timeout` and some shells do) is not a request to hurry.
                    log.info("SIGINT again within %g s: taken as the same one", DUPLICATE_SIGNAL_WINDOW)
                    continue
                self._sigint_count += 1
                self._first_sigint = self._first_sigint or now
                hurry = self._sigint_count > 1
                self.begin_stop(hurry=hurry, why="second SIGINT" if hurry else "SIGINT")
            elif sig == signal.SIGTERM:
                self.begin_stop(hurry=False, why="SIGTERM")

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        self.install_signals()
        log.info(
            "master %d starting: %d workers on queues %s, redis %s",
            os.getpid(),
            self.target,
            ",".join(self.cfg.queues),
            redact_url(self.cfg.redis_url),
        )
        for i in range(self.cfg.ceiling):
            self.slots[i] = Slot(i)
        if self.control:
            try:
                self.control.start()
            except OSError as exc:
                log.error("cannot open the control socket %s: %s", self.control.path, exc)
                self.control = None
        if self.observer and self.cfg.autoscale:
            log.info(
                "autoscaling between %d and %d workers%s",
                self.cfg.floor,
                self.cfg.ceiling,
                f", host {self.host_id} in a cluster of at most {self.cfg.cluster_max_workers}"
                if self.cfg.cluster_max_workers is not None
                else "",
            )
        if self.observer:
            self.observer.start()
        while True:
            self.handle_signals()
            self.reap()
            self.murder()
            self.autoscale()
            self.manage()
            self.handle_requests()
            self.report_counters()
            self.heartbeat()
            if self.stopping and not self.workers:
                break
            self.wait(self.next_wait())
        if self.observer:
            self.observer.stop()
        self.handle_requests()  # answer what arrived during the last pass
        if self.control:
            self.control.close()
        left = self.requeuer.drain(timeout=10.0) if self.requeuer else 0
        if left:
            log.error(
                "%d jobs could not be requeued (Redis unreachable); RQ's abandoned-job sweep will "
                "find them in their StartedJobRegistry",
                left,
            )
        if self.requeuer:
            self.totals.requeued, self.totals.failed = self.requeuer.requeued, self.requeuer.failed
        t = self.totals
        log.info(
            "master %d stopped: spawned %d, exited %d, killed %d, jobs ok %d failed %d, requeued %d, "
            "failed by herder %d, malformed lines %d, oversized lines %d, "
            "jobs not requeued for want of Redis %d",
            os.getpid(),
            t.spawned,
            t.exited,
            t.killed,
            t.jobs_ok,
            t.jobs_failed,
            t.requeued,
            t.failed,
            t.malformed,
            t.oversized,
            left,
        )
        return 0

    def next_wait(self) -> float:
        """Until the next tick, or sooner if a slot's backoff ends first (so a 0.1 s backoff
        is 0.1 s, not a whole tick)."""
        now = time.monotonic()
        due = [s.next_spawn_at - now for s in self.slots.values() if s.index not in self.workers]
        return max(0.0, min([TICK, *[d for d in due if d > 0]]))

    def heartbeat(self) -> None:
        if not self.uplink:
            return
        now = time.monotonic()
        if now - self._last_alive >= self.cfg.heartbeat_interval:
            self._last_alive = now
            self.uplink.alive()
        wanted = self.target if self.grant is None else min(self.target, self.grant)
        live = self.live_workers()
        busy = sum(w.state == WorkerState.BUSY for w in live)
        queued = sum(int(q["backlog"]) for q in self.queue_stats.values())
        self.uplink.status(
            f"{len(live)}/{self.target} workers, {busy} busy, {queued} queued"
            + (", stopping" if self.stopping else "")
        )
        if (
            not self._ready_sent
            and (not self.cfg.autoscale or self.scale_state.last is not None)  # a first load reading
            and len(live) >= wanted
            and all(w.state != WorkerState.STARTING for w in live)
        ):
            self._ready_sent = True
            self.uplink.ready()
            log.info("all %d workers ready", len(live))
        if not self.stopping and self.uplink.watchdog_gone():
            log.warning("the watchdog is gone (parent changed or its pipe closed): stopping")
            self.begin_stop(hurry=False, why="watchdog gone")

    # ---- state --------------------------------------------------------------------------

    def set_state(self, w: WorkerProcess, state: WorkerState, reason: str) -> None:
        if w.state == state:
            return
        level = logging.DEBUG if {w.state, state} <= {WorkerState.IDLE, WorkerState.BUSY} else logging.INFO
        log.log(level, "slot %d pid %d: %s -> %s (%s)", w.slot, w.pid, w.state, state, reason)
        w.state = state

    def observe(self, w: WorkerProcess, obs: Observations) -> None:
        """Derive the state from what the worker said, unless the master's own action rules."""
        if w.state in (WorkerState.KILLING, WorkerState.STOPPING):
            return
        if not obs.ready:
            return
        if obs.job_id is not None:
            self.set_state(w, WorkerState.BUSY, f"job {obs.job_id}")
        else:
            self.set_state(w, WorkerState.IDLE, "ready" if w.state == WorkerState.STARTING else "job done")

    # ---- reap: the dead ------------------------------------------------------------------

    def reap(self) -> None:
        for slot_index, w in list(self.workers.items()):
            if not w.has_exited():
                continue
            code = w.reap()
            obs = w.snapshot()
            del self.workers[slot_index]
            self.totals.exited += 1
            self.totals.jobs_ok += obs.jobs_ok
            self.totals.jobs_failed += obs.jobs_failed
            self.totals.busy_seconds += obs.busy_seconds
            lived = time.monotonic() - w.spawned_at
            how = describe_exit(code)
            graceful = w.stop_sent_at is not None and code == 0 and not w.kill_reason
            cause = f"killed by herder: {w.kill_reason}" if w.kill_reason else f"worker died ({how})"
            if graceful:
                log.info(
                    "slot %d pid %d: stopped (%s) after %.1f s, %d jobs ok, %d failed",
                    w.slot,
                    w.pid,
                    how,
                    lived,
                    obs.jobs_ok,
                    obs.jobs_failed,
                )
            else:
                log.warning(
                    "slot %d pid %d: %s -> exited (%s, %s) after %.1f s",
                    w.slot,
                    w.pid,
                    w.state,
                    how,
                    w.kill_reason or "unexpected",
                    lived,
                )
                self._forget_rq_worker(w)
            self.report_counters_for(w, obs, final=True)
            w.state = WorkerState.EXITED
            if obs.job_id is not None:
                self.requeue(obs.job_id, f"{cause} while running the job")
            self._after_exit(w, graceful, lived, obs.ready)

    def _after_exit(self, w: WorkerProcess, graceful: bool, lived: float, was_ready: bool) -> None:
        slot = self.slots.get(w.slot)
        if slot is None or self.stopping:
            return
        now = time.monotonic()
        # Died young: before `ready` (a failed start, however long it took) or soon after.
        if graceful or (was_ready and lived >= self.cfg.min_uptime):
            slot.young_deaths = 0
            slot.next_spawn_at = now
            return
        slot.young_deaths += 1
        delay = min(self.cfg.backoff_max, self.cfg.backoff_initial * 2 ** (slot.young_deaths - 1))
        slot.next_spawn_at = now + delay
        log.warning(
            "slot %d: %s (died %d times in a row, before `ready` or within %.1f s of its start); "
            "next spawn in %.2f s",
            w.slot,
            WorkerState.BACKOFF,
            slot.young_deaths,
            self.cfg.min_uptime,
            delay,
        )

    def _forget_rq_worker(self, w: WorkerProcess) -> None:
        """A killed RQ worker cannot unregister itself: do it, so `rq info` shows no ghost."""
        if self.requeuer is not None and self.cfg.worker_command is None:
            self.requeuer.forget(f"herder.{self.hostname}.{w.slot}.{w.pid}")

    # ---- requeue -------------------------------------------------------------------------

    def requeue(self, job_id: str, reason: str) -> None:
        if self.requeuer is None:
            log.error("job %s: %s; no Redis connection to requeue it", job_id, reason)
            return
        self.requeuer.requeue(job_id, reason)

    # ---- murder: the unresponsive ----------------------------------------------------------

    def murder(self) -> None:
        now = time.monotonic()
        cfg = self.cfg
        for w in list(self.workers.values()):
            obs = w.snapshot()
            self.observe(w, obs)
            if w.state == WorkerState.KILLING:
                if not w.sigkilled and now - (w.kill_started_at or now) >= cfg.kill_timeout:
                    log.warning(
                        "slot %d pid %d: still alive %.1f s after SIGTERM: SIGKILL",
                        w.slot,
                        w.pid,
                        cfg.kill_timeout,
                    )
                    w.signal_group(signal.SIGKILL)
                    w.sigkilled = True
                continue
            reason = self.unresponsive_reason(w, obs, now)
            if reason is None:
                if w.spared:
                    w.spared = False
                    log.warning("slot %d pid %d: responsive again", w.slot, w.pid)
                continue
            # The kill budget limits herder's judgement that a worker is hung (silence, no
            # `ready`, a closed stdout): what a widespread fault fools. A stop timeout is part
            # of a stop, and a job past its own timeout is killed as RQ itself would.
            judged_hung = w.state != WorkerState.STOPPING and not self.past_job_timeout(obs, now)
            if not judged_hung or self.may_kill(w, reason):
                self.kill(w, reason)
        if self.degraded and not any(w.spared for w in self.workers.values()):
            log.warning("health ok again: no worker is waiting on the kill budget")
            self.degraded = ""

    def past_job_timeout(self, obs: Observations, now: float) -> bool:
        if obs.job_id is None:
            return False
        timeout = obs.job_timeout if obs.job_timeout is not None else self.cfg.job_timeout
        return timeout >= 0 and now - obs.job_started > timeout + self.cfg.job_timeout_grace

    def unresponsive_reason(self, w: WorkerProcess, obs: Observations, now: float) -> str | None:
        cfg = self.cfg
        if obs.stdout_eof:
            # EOF comes a moment before the exit that caused it: allow the process time to go.
            grace = cfg.kill_timeout if obs.said_stop else EOF_GRACE
            if now - obs.eof_at > grace:
                return "closed its stdout" + (" after saying stop" if obs.said_stop else " but kept running")
            return None
        stopping_for = now - w.stop_sent_at if w.stop_sent_at is not None else 0.0
        if w.state == WorkerState.STOPPING and stopping_for > cfg.stop_timeout:
            busy = f", job {obs.job_id} still running" if obs.job_id else ""
            return f"still running {cfg.stop_timeout:g} s after `stop`{busy}"
        if not obs.ready:
            if obs.last_seen > w.spawned_at:
                # Heartbeats before `ready`: alive, waiting (for Redis, say); judged by silence.
                silent = now - obs.last_seen
                if silent > cfg.heartbeat_timeout:
                    return f"silent for {silent:.1f} s before `ready` (limit {cfg.heartbeat_timeout:g} s)"
                return None
            if now - w.spawned_at > cfg.start_timeout:
                return f"no `ready` within the start timeout of {cfg.start_timeout:g} s"
            return None
        silent = now - obs.last_seen
        if silent > cfg.heartbeat_timeout:
            return f"silent for {silent:.1f} s (heartbeat timeout {cfg.heartbeat_timeout:g} s)"
        if obs.job_id is not None:
            timeout = obs.job_timeout if obs.job_timeout is not None else cfg.job_timeout
            elapsed = now - obs.job_started
            if timeout >= 0 and elapsed > timeout + cfg.job_timeout_grace:
                return f"busy {elapsed - timeout:.0f} s past its {timeout:g} s timeout"
        return None

    def may_kill(self, w: WorkerProcess, reason: str) -> bool:
        """Take a kill token, or leave the worker alone and say why (once per worker)."""
        fleet = max(self.target, len(self.live_workers()))
        cluster = None
        if self.cluster_kills is not None and self.cfg.cluster_max_workers is not None:
            cluster = (self.cluster_kills, self.cfg.cluster_max_workers)
        if self.budget.take(fleet, cluster=cluster):
            if cluster is not None and self.requeuer is not None:
                self.requeuer.count_kill(cluster_keys(time.time(), self.budget.window)[0], self.budget.window)
            w.spared = False
            return True
        if not w.spared:
            w.spared = True
            where = "cluster-wide" if cluster else "on this host"
            self.degraded = (
                f"kill budget spent {where}: {self.budget.limit(fleet)} kills per "
                f"{self.budget.window:g} s; unresponsive workers are left alone"
            )
            log.error(
                "slot %d pid %d: would kill it (%s), but %s. A widespread fault? Leaving it for a person; "
                "health degraded",
                w.slot,
                w.pid,
                reason,
                self.degraded,
            )
        return False

    def kill(self, w: WorkerProcess, reason: str) -> None:
        self.set_state(w, WorkerState.KILLING, reason)
        w.kill_reason = reason
        w.kill_started_at = time.monotonic()
        self.totals.killed += 1
        log.warning("slot %d pid %d: SIGTERM to its process group: %s", w.slot, w.pid, reason)
        w.signal_group(signal.SIGTERM)
        w.signal_group(signal.SIGCONT)  # a stopped process cannot act on SIGTERM

    # ---- manage: towards the target -------------------------------------------------------

    def live_workers(self) -> list[WorkerProcess]:
        """Workers that count towards the target: not on their way out."""
        return [
            w for w in self.workers.values() if w.state not in (WorkerState.STOPPING, WorkerState.KILLING)
        ]

    def stop_worker(self, w: WorkerProcess, why: str) -> None:
        w.send_stop()
        w.stop_sent_at = time.monotonic()
        self.set_state(w, WorkerState.STOPPING, why)

    def roll(self, live: list[WorkerProcess]) -> bool:
        """One step of a rolling restart; False when no worker of an older generation is left.

        Replacements start first, up to a batch beyond the target; an old worker is sent
        `stop` (it finishes its job) only once a new one is ready to take its place, so
        capacity never dips. If replacements keep failing, the old workers keep working.
        """
        old = [w for w in live if w.generation < self.generation]
        if not old:
            return False
        new = [w for w in live if w.generation == self.generation]
        ready_new = [w for w in new if w.state in (WorkerState.IDLE, WorkerState.BUSY)]
        surplus = len(old) + len(ready_new) - self.target
        for w in sorted(old, key=lambda w: w.state != WorkerState.IDLE)[: max(0, surplus)]:
            self.stop_worker(w, "rolling restart: replaced")
        batch = max(1, self.target // 4)
        room = min(self.target - len(new), self.target + batch - len(self.workers))
        self.spawn_into_free_slots(room)
        return True

    def spawn_into_free_slots(self, room: int) -> None:
        now = time.monotonic()
        for i in range(self.cfg.ceiling + max(1, self.cfg.ceiling // 4)):
            if room <= 0:
                return
            slot = self.slots.setdefault(i, Slot(i))
            if slot.index in self.workers:
                continue
            room -= 1  # a slot in backoff still takes its place: a crash loop cannot spill over
            if now >= slot.next_spawn_at:
                self.spawn(slot)

    def manage(self) -> None:
        if self.stopping:
            return
        live = self.live_workers()
        if self.roll(live):
            return
        if len(live) > self.target:
            states = {w.slot: str(w.state) for w in live}
            for slot in pick_idle_to_stop(states, len(live) - self.target):
                self.stop_worker(self.workers[slot], f"scale down to {self.target}")
            return
        # A cluster grant counts every process still running, stopping ones included.
        room = self.target - len(live)
        if self.grant is not None:
            room = min(room, self.grant - len(self.workers))
        self.spawn_into_free_slots(room)

    def autoscale(self) -> None:
        """Fold the newest load reading into the policy and set the target."""
        if self.observer is None or self.stopping:
            return
        reading = self.observer.take()
        if reading is None:
            return
        self.record_queue_stats(reading.per_queue)
        if reading.kills is not None and self.cluster_kills is not None:
            current, previous, read_at = reading.kills
            self.cluster_kills = ClusterView(current, previous, read_at)
        if not self.cfg.autoscale:
            return
        jobs, busy = self.jobs_and_busy_seconds()
        seen_jobs, seen_busy = self._done_seen
        self._done_seen = (jobs, busy)
        state = learn_rate(self.scale_state, jobs - seen_jobs, busy - seen_busy, self.scale_cfg)
        load = reading.load
        if load is not None and state.per_worker is not None:
            completions = load.running * state.per_worker  # cluster-wide: every host's busy workers
        else:
            completions = (jobs - seen_jobs) / self.cfg.scale_interval
        decision, self.scale_state = decide(state, load, self.cluster_desired, completions, self.scale_cfg)
        self.cluster_desired = decision.desired
        target = decision.desired
        if self.cfg.cluster_max_workers is not None:
            hosts = reading.grant.hosts if reading.grant else (self.host_id,)
            target = max(
                self.cfg.floor, min(self.cfg.ceiling, share_of(decision.desired, hosts, self.host_id))
            )
            self.observer.tell(wanted=target, running=len(self.workers))
            if reading.grant is not None:
                self.grant = reading.grant.granted
        if target != self.target:
            granted = f", cluster grant {self.grant}" if self.grant is not None else ""
            log.info("scale: %d -> %d workers (%s%s)", self.target, target, decision.reason, granted)
            self.target = target

    def record_queue_stats(self, per_queue: tuple[tuple[str, int, int], ...]) -> None:
        now = time.monotonic()
        for name, backlog, running in per_queue:
            prev = self.queue_stats.get(name)
            growth = 0.0
            if prev is not None and now > prev["at"]:
                sample = (backlog - prev["backlog"]) / (now - prev["at"])
                growth = self.scale_cfg.alpha * sample + (1 - self.scale_cfg.alpha) * prev["growth"]
            self.queue_stats[name] = {"backlog": backlog, "running": running, "growth": growth, "at": now}

    # ---- control requests ------------------------------------------------------------------

    def answer_directly(self, body: dict) -> dict | None:
        """Requests the control thread answers itself (no fleet state involved)."""
        if body["cmd"] == "ping":
            return {"ok": True, "pid": os.getpid()}
        if body["cmd"] == "enqueue":
            return self.enqueue(body)
        return None

    def enqueue(self, body: dict) -> dict:
        """`herder enqueue`: put a job on a queue, for trying things out (control thread)."""
        from rq import Queue

        if not self.cfg.redis_url:
            return {"ok": False, "error": "no Redis configured"}
        func, args = body.get("func"), body.get("args", [])
        if not isinstance(func, str) or not func or not isinstance(args, list):
            return {"ok": False, "error": 'enqueue needs "func" (a dotted name) and "args" (a list)'}
        name = body.get("queue") or self.cfg.queues[0]
        try:
            conn = Redis.from_url(self.cfg.redis_url, socket_timeout=5, socket_connect_timeout=3)
            job = Queue(name, connection=conn).enqueue(func, *args)
        except Exception as exc:  # Redis errors name host and port, never the password
            return {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
        return {"ok": True, "job_id": job.id, "queue": name}

    def handle_requests(self) -> None:
        if self.control is None:
            return
        while True:
            try:
                request: Request = self.control.requests.get_nowait()
            except Exception:
                return
            try:
                reply = self.answer(request.body)
            except Exception as exc:  # a bad request must never take the loop down
                log.exception("control request %r failed", request.body.get("cmd"))
                reply = {"ok": False, "error": f"{exc.__class__.__name__}: {exc}"}
            request.reply.set_result(reply)

    def answer(self, body: dict) -> dict:
        cmd = body["cmd"]
        if cmd == "status":
            return build_status(self)
        if cmd == "scale":
            return self.rescale(body)
        if cmd == "restart":
            return self.restart("herder restart")
        if cmd == "reload":
            return self.reload("herder reload")
        if cmd == "stop":
            if "timeout" in body:
                self.cfg.stop_timeout = float(body["timeout"])
            self.begin_stop(hurry=False, why="herder stop")
            return {"ok": True, "stopping": len(self.workers)}
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    def restart(self, why: str) -> dict:
        self.generation += 1
        n = len(self.live_workers())
        log.info("%s: rolling restart of %d workers (generation %d)", why, n, self.generation)
        return {"ok": True, "replacing": n, "generation": self.generation}

    def reload(self, why: str) -> dict:
        """Re-read the config file; settings pinned by the environment or flags stay."""
        if not self.cfg.config_file:
            log.warning("%s: no config file to re-read (herder run had no --config)", why)
            return {"ok": False, "error": "herder run was started without --config: nothing to re-read"}
        if self.uplink:
            self.uplink.reloading()
        try:
            new = reread(self.cfg)
        except ConfigError as exc:
            log.error("%s: keeping the running config: %s", why, exc)
            if self.uplink:
                self.uplink.ready()
            return {"ok": False, "error": str(exc)}
        changed = sorted(k for k in vars(new) if getattr(new, k) != getattr(self.cfg, k))
        restart_keys = {"queues", "paths", "worker_command", "redis_url", "log_level", "heartbeat_interval"}
        old_cfg, self.cfg = self.cfg, new
        if {"workers", "min_workers", "max_workers"} & set(changed):
            body = {"workers": new.workers} if not new.autoscale else {"min": new.floor, "max": new.ceiling}
            self.cfg = old_cfg
            self.rescale(body)
            self.cfg = new
        self.scale_cfg = replace(
            self.scale_cfg, scale_down_delay=new.scale_down_delay, drain_target=new.drain_target
        )
        log.info(
            "%s: config re-read from %s; changed: %s", why, new.config_file, ", ".join(changed) or "nothing"
        )
        if "queues" in changed and self.observer:
            self.observer.set_queues(new.queues)
            self.queue_stats = {k: v for k, v in self.queue_stats.items() if k in new.queues}
        if restart_keys & set(changed):
            self.restart(f"{why} ({', '.join(sorted(restart_keys & set(changed)))} changed)")
        if self.uplink:
            self.uplink.ready()
        return {"ok": True, "changed": changed}

    def rescale(self, body: dict) -> dict:
        if "workers" in body:
            n = int(body["workers"])
            if n < 1:
                return {"ok": False, "error": "workers must be at least 1"}
            if self.cfg.autoscale:
                return {"ok": False, "error": "autoscaling is on: use --min/--max"}
            self.cfg.workers = n
            self.target = n
        else:
            if not self.cfg.autoscale:
                return {
                    "ok": False,
                    "error": "autoscaling is off: herder run needs --max-workers for --min/--max",
                }
            lo = int(body.get("min", self.cfg.floor))
            hi = int(body.get("max", self.cfg.ceiling))
            if not 0 <= lo <= hi or hi < 1:
                return {"ok": False, "error": f"need 0 <= min <= max and max >= 1, got {lo}, {hi}"}
            self.cfg.min_workers, self.cfg.max_workers = lo, hi
            self.scale_cfg = replace(
                self.scale_cfg, min_workers=lo, max_workers=self.cfg.cluster_max_workers or hi
            )
            self.target = max(lo, min(hi, self.target))
            self.cluster_desired = max(lo, min(self.scale_cfg.max_workers, self.cluster_desired))
        for i in range(self.cfg.ceiling):
            self.slots.setdefault(i, Slot(i))
        log.info(
            "scale: target now %d workers (%s)",
            self.target,
            f"min {self.cfg.floor}, max {self.cfg.ceiling}" if self.cfg.autoscale else "fixed",
        )
        return {"ok": True, "desired": self.target, "min": self.cfg.floor, "max": self.cfg.ceiling}

    def jobs_and_busy_seconds(self) -> tuple[int, float]:
        jobs, busy = self.totals.jobs_ok + self.totals.jobs_failed, self.totals.busy_seconds
        for w in self.workers.values():
            o = w.snapshot()
            jobs += o.jobs_ok + o.jobs_failed
            busy += o.busy_seconds
        return jobs, busy

    def worker_argv(self) -> list[str]:
        if self.cfg.worker_command:
            return list(self.cfg.worker_command)
        argv = [
            sys.executable,
            "-P",
            "-m",
            "herder.worker",
            "--heartbeat-interval",
            f"{self.cfg.heartbeat_interval:g}",
            "--log-level",
            self.cfg.log_level.upper(),
        ]
        for q in self.cfg.queues:
            argv += ["--queue", q]
        for p in self.cfg.paths:
            argv += ["--path", p]
        if self.cfg.state_dir:
            argv += ["--orphan-log", os.path.join(self.cfg.state_dir, "orphaned-workers.log")]
        return argv

    def worker_env(self, slot: Slot) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != ENV_RESOLVED}
        env.update(
            HERDER_SLOT=str(slot.index),
            HERDER_QUEUES=",".join(self.cfg.queues),
            HERDER_HEARTBEAT_INTERVAL=f"{self.cfg.heartbeat_interval:g}",
            HERDER_PROTOCOL_VERSION="1",
            PYTHONUNBUFFERED="1",
        )
        if self.cfg.redis_url:
            env["HERDER_REDIS_URL"] = self.cfg.redis_url
        return env

    def spawn(self, slot: Slot) -> None:
        try:
            w = WorkerProcess.spawn(slot.index, self.worker_argv(), self.worker_env(slot), self.wake)
        except OSError as exc:
            slot.young_deaths += 1
            delay = min(self.cfg.backoff_max, self.cfg.backoff_initial * 2 ** (slot.young_deaths - 1))
            slot.next_spawn_at = time.monotonic() + delay
            log.error("slot %d: cannot spawn worker (%s); next try in %.2f s", slot.index, exc, delay)
            return
        w.generation = self.generation
        self.workers[slot.index] = w
        self.totals.spawned += 1
        log.info("slot %d pid %d: spawned -> %s", slot.index, w.pid, w.state)

    # ---- stop -----------------------------------------------------------------------------

    def begin_stop(self, hurry: bool, why: str) -> None:
        if not self.stopping:
            self.stopping = True
            log.info(
                "%s: stopping %d workers (each finishes its job; stop timeout %g s)",
                why,
                len(self.workers),
                self.cfg.stop_timeout,
            )
            if self.uplink:
                self.uplink.stopping()
            for w in self.workers.values():
                if w.state not in (WorkerState.KILLING, WorkerState.STOPPING):
                    self.stop_worker(w, why)
        if hurry:
            log.warning("%s: stopping now; jobs still running go back on their queues", why)
            for w in list(self.workers.values()):
                if w.state != WorkerState.KILLING:
                    self.kill(w, f"herder is stopping in a hurry ({why})")

    # ---- counters -------------------------------------------------------------------------

    def report_counters(self) -> None:
        now = time.monotonic()
        for w in self.workers.values():
            rep = self._reported.setdefault(w.pid, Reported())
            if now - rep.at >= COUNTER_REPORT_INTERVAL:
                self.report_counters_for(w, w.snapshot())

    def report_counters_for(self, w: WorkerProcess, obs: Observations, final: bool = False) -> None:
        rep = self._reported.setdefault(w.pid, Reported())
        new_malformed = obs.malformed - rep.malformed
        new_oversized = obs.oversized - rep.oversized
        new_throttled = obs.throttled - rep.throttled
        new_dropped = obs.stderr_dropped - rep.stderr_dropped
        if new_malformed or new_oversized or new_throttled or new_dropped:
            log.warning(
                "slot %d pid %d: %d malformed and %d oversized protocol lines, throttled %d times, "
                "dropped %d stderr lines over %d/s (totals %d, %d, %d, %d; last problem: %s)",
                w.slot,
                w.pid,
                new_malformed,
                new_oversized,
                new_throttled,
                new_dropped,
                STDERR_LINES_PER_SECOND,
                obs.malformed,
                obs.oversized,
                obs.throttled,
                obs.stderr_dropped,
                obs.last_error or "-",
            )
            self.totals.malformed += new_malformed
            self.totals.oversized += new_oversized
            self.totals.throttled += new_throttled
        rep.malformed, rep.oversized, rep.throttled = obs.malformed, obs.oversized, obs.throttled
        rep.stderr_dropped, rep.at = obs.stderr_dropped, time.monotonic()
        if final:
            self._reported.pop(w.pid, None)


def reread(cfg: Config) -> Config:
    """The config with its file layer read again; keys pinned by environment or flags stay."""
    from herder.common import config as settings

    assert cfg.config_file
    file_layer = settings.load_file(cfg.config_file)
    pinned = {k: (getattr(cfg, k), "environment or command line") for k in cfg.pinned}
    fresh, _ = settings.resolve([file_layer, pinned])
    fresh.config_file, fresh.pinned, fresh.state_dir = cfg.config_file, cfg.pinned, cfg.state_dir
    fresh.host_id = cfg.host_id
    fresh.embedded_redis = cfg.embedded_redis
    if cfg.embedded_redis and fresh.redis_url is None:
        fresh.redis_url = cfg.redis_url  # the watchdog's private Redis stays where it is
    return fresh


def main() -> int:
    cfg = Config.from_env()
    logs.setup(cfg.log_level)
    uplink = Uplink()
    return Master(cfg, uplink=uplink).run()


if __name__ == "__main__":
    sys.exit(main())
