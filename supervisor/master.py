"""The master: one reconcile loop that spawns, watches, stops and replaces workers.

Shaped like gunicorn's arbiter: wait for an event (a reader's wake-up byte, a signal, the
tick), then handle signals, reap the dead, murder the unresponsive, retire (recycle, cull),
scale, manage towards the target, answer control requests. Handlers only record; the loop
acts, and only it changes a worker's state (states.change_state). Workers start only
through the Launcher and time is read only through the Clock: unit tests use fakes.
docs/design.md has the map of the rooms around it and this loop's sketch.
"""

from __future__ import annotations

import itertools
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from herder.common import rq_seam, rq_support
from herder.common.config import DEFAULT_POOL, Config, all_queues, pool_configs, redact_url
from herder.common.exits import describe
from herder.common.rq_names import rq_worker_name
from herder.common.transitions import move
from herder.supervisor import fleet, lifecycle, pipes, reload, retirement
from herder.supervisor.commands import Commands
from herder.supervisor.control import ControlServer
from herder.supervisor.counters import Counters
from herder.supervisor.endings import Endings
from herder.supervisor.events import Events
from herder.supervisor.fleet import Limits, Slot, Worker
from herder.supervisor.guard import KillGuard
from herder.supervisor.health import HealthWatch
from herder.supervisor.hooks import EventHooks, HealthChanges
from herder.supervisor.launcher import Clock, Launcher, worker_argv, worker_env
from herder.supervisor.launchers import Launchers
from herder.supervisor.liveness import derived_state, judge, read_late
from herder.supervisor.observations import Observations
from herder.supervisor.pool import (
    Plan,
    Pool,
    Share,
    Workers,
    active,
    host_floor,
    host_target,
    live,
    share_limit,
    slots_of,
)
from herder.supervisor.pressure import KernelLog, MemoryWatch, OomWatch
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import Recovery
from herder.supervisor.scheduler import SchedulerKeeper
from herder.supervisor.states import (
    LEAVING,
    PHASES,
    WORKING,
    KillKind,
    MasterPhase,
    WorkerState,
    change_state,
)
from herder.supervisor.uplink import Uplink
from herder.supervisor.views.build import PUBLISH_EVERY, Snapshots
from herder.supervisor.views.journal import Journal
from herder.supervisor.views.model import HostSnapshot
from herder.supervisor.views.sources import Loop, Sources, sched_cfg, short_pools
from herder.supervisor.views.usage import SHARED

if TYPE_CHECKING:  # imported with --http only (Master.__init__)
    from herder.supervisor.http_endpoint import Publisher
    from herder.supervisor.jobstats import JobStats

log = logging.getLogger("herder")

# How often the loop looks at deadlines with nothing to wake it: once a second for a settled
# fleet (gunicorn's arbiter and supervisord do the same), four times while a process starts or
# stops, so a start, a stop's timeout and a SIGKILL's escalation keep their pace. A pass costs
# tens of microseconds per worker: at 256 idle workers the slow tick is a quarter of the CPU.
TICK = 1.0
TICK_IN_MOTION = 0.25
HEALTH_EVENTS_EVERY = 1.0  # seconds between two looks at health for the event hooks
HOST_RECORD_EVERY = 1.0  # seconds between two records of this host for the host list (hosts.py)


@dataclass
class Start:
    """How this master was started (__main__ fills it in; unit tests take the defaults).
    `control`: the control socket, already answering `starting` (__main__ opens it first
    thing); the loop takes it over (without one, the master opens its own). `http_token`:
    HERDER_HTTP_TOKEN, which __main__ took out of the environment (http_auth.py)."""

    host_id: str = ""
    restarts: int = 0  # times the watchdog restarted the master before this one
    started_at: float | None = None  # wall time; now, without
    control: ControlServer | None = None
    uplink: Uplink | None = None  # the pipe to the watchdog
    http_token: str = ""


class Master:
    def __init__(
        self,
        cfg: Config,
        launchers: Launchers,
        clock: Clock,
        recovery: Recovery | None = None,
        reader: LoadReader | None = None,
        sched: SchedulerKeeper | None = None,
        start: Start | None = None,
    ) -> None:
        """`launchers`: where workers come from (one fork server per set of imports);
        `recovery` and `reader`: the threads that talk to Redis (None without Redis);
        `sched`: RQ's scheduler process's keeper."""
        start = start or Start()
        control, http_token = start.control, start.http_token
        self.cfg = self.started_cfg = cfg  # started_cfg: the watchdog's, which it never re-reads
        self.clock = clock
        self.recovery, self.reader, self.uplink = recovery, reader, start.uplink
        self.hostname = socket.gethostname()
        self.host_id = start.host_id or cfg.host_id or f"{self.hostname}:{os.getpid()}"
        # The fleets: one pool per [pools.NAME] of the file, or the one pool `default` (pool.py).
        self.tickets = itertools.count(1)  # cull tickets: unique across pools (retirement.py)
        self.pools = {
            name: Pool.build(name, pc, self.host_id, recovery, self.tickets)
            for name, pc in pool_configs(cfg).items()
        }
        self.launchers = launchers  # one fork server per set of imports; pools that agree share it
        self.workers = Workers(self.pools)  # the host's fleet: every pool's workers (each pool holds its own)
        self.counters = Counters()
        self.sched = sched or SchedulerKeeper(None, clock, self.host_id)  # RQ's scheduler: scheduler.py
        self.guard = KillGuard(cfg, recovery)
        self.endings = Endings()  # given-up jobs: which worker ends each (endings.py)
        self.phase = MasterPhase.STARTING  # changed only through enter()
        self.ready_at: float | None = None  # wall time the fleet was first ready (`ready` to the watchdog)
        self.spawns_pending = False  # pacing left spawns for the next pass: it comes soon
        self.started_at = clock.wall() if start.started_at is None else start.started_at
        self.restarts = start.restarts  # times the watchdog restarted the master before this one
        self.lagging_reads, self._lag_said_at = 0, float("-inf")  # silences the reader's lag explained
        self.health = HealthWatch()
        # What happened, as sentences (views/journal.py): recorded once, where the loop decides it.
        self.journal = Journal(clock.wall)
        # The host as every view shows it (views/): built by the one builder, published each
        # pass at most every PUBLISH_EVERY for the HTTP endpoint and the health event hooks
        # (without either, never), and for each `herder status`.
        self.snapshots = Snapshots(self.hostname, clock.wall, SHARED, self.journal)
        self.snapshot: HostSnapshot | None = None
        self._published_at = float("-inf")
        self._host_told_at = float("-inf")
        # /metrics, and the job metrics only it serves, with --http alone: only then does the
        # master import prometheus-client and http.server (a master without is 1 MB smaller).
        self.jobstats: JobStats | None = None
        self.http: Publisher | None = None
        self.memory = MemoryWatch()  # the cgroup near its memory limit: no scale-up
        self.oom = OomWatch(kernel_log=KernelLog())  # a SIGKILL herder did not send: the OOM killer's?
        self.hooks = EventHooks(cfg, self.host_id, counted=bool(cfg.http))  # --on-event, --on-event-url
        self.health_changes, self._health_read_at = HealthChanges(), float("-inf")
        if recovery is not None:  # a job given up is an event (called from the recovery thread)
            recovery.on_give_up = lambda job_id, queue, why: self.hooks.emit(
                "job_given_up", job_id=job_id, queue=queue, pool=self.pool_of_queue(queue), reason=why
            )
        if cfg.http:
            from herder.supervisor.http_auth import Controls, read_token
            from herder.supervisor.http_endpoint import Feeds, Publisher
            from herder.supervisor.jobstats import JobStats

            try:
                token = read_token(cfg.http_token_file, http_token)
            except (OSError, ValueError) as exc:  # says which file, never what it holds
                log.error("http: cannot read http_token_file (%s): the dashboard stays read-only", exc)
                token = ""

            self.jobstats = JobStats()  # herder_job_duration_seconds
            self.http = Publisher(
                cfg.http,
                clock.monotonic,
                (self.jobstats.histogram, self.hooks.counts),
                Feeds(
                    journal=self.journal,
                    wall=clock.wall,
                    hosts=reader.host_records if reader is not None else lambda: (0.0, []),
                    controls=Controls(token),
                    submit=lambda body: self.commands.submit(body, self.events.wake),
                ),
            )
        self._last_alive = float("-inf")
        self.events = Events(clock)
        self.commands = Commands(self, self)
        # What the snapshot's builder reads: these parts, not the master (views/sources.py).
        self.sources = Sources(
            clock, self.host_id, self.started_at, self.restarts, self.pools, self.workers, self.counters,
            self.guard, recovery, reader, self.sched, self.health, self.memory,
        )  # fmt: skip
        answer = self.commands.answer_directly
        if control is None and cfg.state_dir:
            control = ControlServer(cfg.state_dir, self.events.wake, answer)
        self.control = control
        if control is not None:
            control.hand_over(self.events.wake, answer)

    # ---- pools --------------------------------------------------------------------------

    def pool_list(self) -> list[Pool]:
        return list(self.pools.values())

    def active_pools(self) -> list[Pool]:
        """The pools that run (not draining away after a reload removed them)."""
        return active(self.pools.values())

    def pool_of(self, w: Worker) -> Pool:
        return self.pools[w.pool]

    def pool_of_queue(self, queue: str) -> str:
        """The pool that serves `queue` (a queue belongs to one pool), or "" for none."""
        return next((p.name for p in list(self.pools.values()) if queue in p.cfg.queues), "")

    @property
    def slots(self) -> dict[int, Slot]:
        """Every pool's slots, by index."""
        return slots_of(self.pools.values())

    def new_pool(self, name: str, cfg: Config) -> Pool:
        """A pool of this host (its cull tickets unique across pools: retirement.py)."""
        return Pool.build(name, cfg, self.host_id, self.recovery, self.tickets)

    @property
    def settings_readers(self) -> list[Callable[[Config], None]]:
        """Every part that keeps settings of its own: a reload hands each the new Config."""
        readers: list[Callable[[Config], None]] = [
            lambda new: self.guard.configure(new, self.clock.wall()),
            self.hooks.configure,
        ]
        if self.recovery is not None:
            readers.append(self.recovery.configure)
        if self.reader is not None:
            readers.append(reload.reader_settings(self.reader, self.host_id))
        return readers

    def set_stop_timeout(self, seconds: float) -> None:
        """`herder stop --timeout`: a new Config (the one herder started with stays as it was)."""
        self.cfg = replace(self.cfg, stop_timeout=seconds)
        for pool in self.pool_list():
            pool.cfg = replace(pool.cfg, stop_timeout=seconds)

    @property
    def target(self) -> int:
        """The workers this host keeps: every pool's target."""
        return host_target(self.pools.values())

    @property
    def stopping(self) -> bool:
        return self.phase == MasterPhase.STOPPING

    @property
    def ever_ready(self) -> bool:
        """The fleet was ready once: health judges a shortfall from here on, not a start."""
        return self.ready_at is not None

    def enter(self, new: MasterPhase) -> None:
        """The one place the master's phase changes, checked against PHASES."""
        self.phase = move(PHASES, self.phase, new, "master")

    @property
    def paused(self) -> bool:
        """`herder pause` on every pool: this host takes no new jobs."""
        return all(p.paused for p in self.pools.values())

    def launcher_for(self, pool: Pool) -> Launcher:
        pool.launcher = self.launchers.for_pool(pool, self.events.wake)  # a restart renews it
        return pool.launcher

    # ---- signals ------------------------------------------------------------------------

    def handle_signals(self) -> None:
        for request in self.events.requests():
            if request.action == "reload":
                self.commands.reload(request.why)
            else:
                self.begin_stop(hurry=request.hurry, why=request.why)

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        self.events.install_signals()
        cfg, queues = self.cfg, ",".join(all_queues(self.cfg))
        log.info("master %d starting: %d workers on queues %s, redis %s (%s)", os.getpid(), self.target,
                 queues, redact_url(cfg.redis_url), rq_seam.describe())  # fmt: skip
        # pip keeps to the supported ranges (a --no-deps install may not); an rq that moved a name
        # the seam uses is named here, not found by a job at run time.
        for problem in rq_support.support_problems() + rq_seam.names_missing():
            log.warning('%s: see README, "Supported versions"', problem)
        if self.control and not self.control.started:
            try:
                self.control.start()
            except OSError as exc:
                log.error("cannot open the control socket %s: %s", self.control.path, exc)
                self.control = None
        for pool in self.pool_list():
            if self.reader and pool.cfg.autoscale:
                log.info(
                    "%s%s", "" if pool.name == DEFAULT_POOL else f"pool {pool.name}: ", pool.scaler.describe()
                )
        if self.reader:
            self.reader.start(self.events.wake)
        if self.recovery:
            self.recovery.start()
        if self.restarts:  # the watchdog restarted the master: its last one died or hung
            self.hooks.emit("master_restarted", restarts=self.restarts)
        while not self.stopped():
            began = self.clock.monotonic()
            self.step()
            if self.stopped():
                break  # the last one just exited: no tick to wait out
            worked, wait = self.clock.monotonic(), self.next_wait()
            self.events.wait(wait)
            self.health.loop_pass(began, worked, wait, self.clock.monotonic())
        return self.shut_down()

    def stopped(self) -> bool:
        """Stopping, and every worker and the scheduler process have exited."""
        return self.stopping and not self.workers and not self.sched.running

    def step(self) -> None:
        """One pass of the loop (unit tests call it directly)."""
        self.handle_signals()
        self.reap()
        self.murder()
        self.retire()
        self.scale()
        self.manage()
        self.sched.step(self.sched_cfg, self.stopping, self.events.wake)
        self.end_given_up()
        self.commands.handle_requests()
        self.counters.report_due(list(self.workers.values()), self.clock.monotonic())
        self.heartbeat()
        self.publish()
        if self.recovery:  # what the next sweep must not touch
            holding: dict[str, str | None] = {}
            for w in self.workers.values():
                jobs = w.proc.snapshot().jobs
                for thread, name in enumerate(self.rq_names(w)):
                    holding[name] = jobs[thread].job_id if thread in jobs else None
            self.recovery.tell(holding)
        pipes.settle(not self.in_motion())  # a settled loop's workers' lines: read in fewer batches

    @property
    def sched_cfg(self) -> Config:
        return sched_cfg(self.cfg)

    def retire(self) -> None:
        """Recycling and culling, each pool by its own rules (retirement.py)."""
        answers = self.recovery.answers() if self.recovery else {}
        now, wall = self.clock.monotonic(), self.clock.wall()
        for pool in self.pool_list():
            pool.retirement.review(pool.live(), pool.target, now, wall, self.kill, answers)

    def next_wait(self) -> float:
        """Until the next tick, or sooner if a slot's backoff ends first (0.1 s, not a tick)."""
        now = self.clock.monotonic()
        due = [
            s.next_spawn_at - now
            for p in self.pool_list()
            for s in p.slots.values()
            if s.index not in p.workers
        ]
        soon = [fleet.SPAWN_AGAIN] if self.spawns_pending else []  # paced spawns left for the next pass
        tick = TICK_IN_MOTION if self.in_motion() else TICK
        return max(0.0, min([tick, *soon, *[d for d in due if d > 0]]))

    def in_motion(self) -> bool:
        """Whether the master, a worker or the scheduler is starting or stopping (a slot's backoff
        has its own deadline in next_wait)."""
        if self.phase != MasterPhase.RUNNING or self.sched.in_motion():
            return True
        return any(w.life.state not in WORKING for w in self.workers.values())

    def publish(self) -> None:
        """Health bookkeeping each pass; the host's snapshot every view renders, now and then."""
        now = self.clock.monotonic()
        ready = sum(w.life.state in WORKING for w in self.workers.values())
        down = self.reader is not None and self.reader.outage_since is not None
        self.health.observe(now, ready, self.floor, short_pools(self.pool_list()),
                            redis_down=down)  # fmt: skip
        for w in self.workers.values():
            self.fold_finished(w)
        if self.http:
            self.http.step(now)
        if not (self.http or self.hooks.enabled):
            return  # nobody reads a published snapshot (`herder status` has one built for it)
        snap = self.snapshot
        if snap is None or now - self._published_at >= PUBLISH_EVERY:
            snap = self.take_snapshot()
        if self.http and self.reader and now - self._host_told_at >= HOST_RECORD_EVERY:
            from herder.supervisor.views.api import host_record

            self._host_told_at = now
            self.reader.tell_host(host_record(snap))
        if self.hooks.enabled and now - self._health_read_at >= HEALTH_EVENTS_EVERY:
            self._health_read_at = now
            for event, fields in self.health_changes.observe(list(snap.health.problems)):
                self.hooks.emit(event, **fields)

    def take_snapshot(self, usage: bool = False) -> HostSnapshot:
        """The host now, built by the one builder (views/build.py) and published: the newest
        for /healthz, /metrics and the dashboard; `herder status` renders the one it asks for.
        Workers' RSS and CPU are sampled (at most once a second) for status and the dashboard
        only: without --http a pass does not read every worker's /proc."""
        controls = self.http.controls.enabled if self.http else False
        self.count_jobs()
        loop = Loop(self.cfg, self.phase, self.ever_ready)
        snap = self.snapshots.build(self.sources, loop, controls, usage=usage or self.http is not None)
        self.snapshot, self._published_at = snap, snap.taken_at
        if self.http:
            self.http.publish(snap)
        return snap

    def shut_down(self) -> int:
        if self.reader:
            self.reader.stop()
        if self.http:
            self.http.close()
        self.hooks.close()
        self.commands.handle_requests()  # answer what arrived during the last pass
        if self.control:
            self.control.close()
        left = self.recovery.drain(timeout=10.0) if self.recovery else 0
        self.sched.close()
        for launcher in self.launchers.all():
            launcher.close()
        if left:
            log.error("%d jobs could not be requeued (Redis unreachable); RQ's abandoned-job sweep will "
                      "find them in their StartedJobRegistry", left)  # fmt: skip
        counts = self.recovery.counts if self.recovery else None
        self.counters.log_summary(counts.requeued if counts else 0, counts.failed if counts else 0, left)
        return 0

    def heartbeat(self) -> None:
        """`ready` once the fleet first is; `alive` and a status line to the watchdog."""
        if self.phase == MasterPhase.STARTING and self.fleet_ready():
            self.enter(MasterPhase.RUNNING)
            self.ready_at = self.clock.wall()
            log.info("all %d workers ready", len(self.live_workers()))
            if self.uplink:
                self.uplink.ready()
        if not self.uplink:
            return
        now = self.clock.monotonic()
        if now - self._last_alive >= self.started_cfg.heartbeat_interval:  # the watchdog's deadlines
            self._last_alive = now
            self.uplink.alive()
        live = self.live_workers()
        busy = sum(w.life.state == WorkerState.BUSY for w in live)
        queued = sum(q.backlog for p in self.pool_list() for q in p.scaler.queues.values())
        stopping = ", stopping" if self.stopping else ""
        self.uplink.status(f"{len(live)}/{self.target} workers, {busy} busy, {queued} queued{stopping}")
        if not self.stopping and self.uplink.watchdog_gone():
            log.warning("the watchdog is gone (parent changed or its pipe closed): stopping")
            self.begin_stop(hurry=False, why="watchdog gone")

    @property
    def floor(self) -> int:
        """The fewest workers this host runs: every pool's minimum."""
        return host_floor(self.pools.values())

    def fleet_ready(self) -> bool:
        """In every pool, every worker wanted (within the cluster's grant, after a first load
        reading when autoscaling) is up and has said `ready`."""
        for pool in self.pool_list():
            if pool.draining:
                continue
            live, grant = pool.live(), pool.scaler.grant
            due = pool.target if grant is None else min(pool.target, grant)  # the count to be ready
            if (pool.cfg.autoscale and not pool.scaler.has_reading) or len(live) < due:
                return False
            if any(w.life.state == WorkerState.STARTING for w in live):
                return False
        return True

    # ---- reap: the dead ------------------------------------------------------------------

    def reap(self) -> None:
        for slot_index, w in self.workers.items():
            if not w.proc.has_exited():
                continue
            now = self.clock.monotonic()
            ex = lifecycle.reap(w, now)
            pool = self.pool_of(w)
            del pool.workers[slot_index]  # it leaves its pool
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
            self.fold_finished(w)
            life = f"lived {lived:.1f} s, {obs.jobs_ok} jobs ok, {obs.jobs_failed} failed"
            lifecycle.exited(w, ex, f"{how}; {why}; {life}")
            cause = f"killed by herder: {w.life.kill_reason}" if w.killed else f"worker died ({how})"
            label = "killed" if w.killed else "died"  # the metrics' reason
            for held in obs.jobs.values():  # every job it ran: one per thread of a threaded worker
                self.requeue(
                    held.job_id,
                    f"{cause} while running the job",
                    label,
                    w.life.kill_kind or KillKind.DIED,
                    self.rq_names(w),
                )
            slot, delay = pool.slots.get(w.slot), None
            if slot is not None and not self.stopping:  # a stop's exits are no crash loop
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
        for launcher in self.launchers.all():
            launcher.tend(self.events.wake)  # the fork server's life; strays a subreaper inherits
        self.forget_drained_pools()

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

    def count_jobs(self) -> None:
        """Every worker's jobs finished since it was last counted, into the one count the
        views and the autoscaler read (counters.py); done where they read it, not each pass."""
        for w in self.workers.values():
            self.counters.count_jobs(w, w.proc.snapshot())

    def fold_finished(self, w: Worker) -> None:
        """The worker's finished jobs into the job metrics (by the pool's queues)."""
        done = w.proc.take_finished()
        if done and self.jobstats:
            pool = self.pools.get(w.pool)
            self.jobstats.fold(w.pool, pool.cfg.queues if pool else (), done)

    def requeue(
        self, job_id: str, reason: str, label: str, cause: str = "", workers: Iterable[str] = ()
    ) -> None:
        if self.recovery is None:  # no Redis: nothing to put it back on
            return log.error("job %s: %s; no Redis connection to requeue it", job_id, reason)
        self.recovery.requeue(job_id, reason, label, cause, tuple(workers))

    def forget_drained_pools(self) -> None:
        """A pool a reload removed is gone once its last worker is."""
        for pool in [p for p in self.pool_list() if p.draining]:
            if not pool.workers:
                del self.pools[pool.name]
                log.info("pool %s: drained and removed", pool.name)

    def end_given_up(self) -> None:
        """Jobs given up past max_requeues end in a worker, as RQ ends them (endings.py);
        only herder's own RQ workers can (not a --worker-command program)."""
        if self.recovery is None or self.stopping:
            return
        workers = [w for w in self.live_workers() if self.pool_of(w).cfg.worker_command is None]

        def current(w: Worker) -> bool:
            return w.generation >= self.pool_of(w).generation

        self.endings.dispatch(self.recovery.endings(), workers, current, self.clock.monotonic())

    def rq_names(self, w: Worker) -> tuple[str, ...]:
        """As the worker registers with RQ: one name, or one per thread of a threaded worker
        (worked out once: each pass tells the recovery thread every worker's)."""
        if not w.rq_names:
            w.rq_names = tuple(rq_worker_name(self.hostname, w.slot, w.pid, t) for t in range(w.threads))
        return w.rq_names

    # ---- murder: the unresponsive ----------------------------------------------------------

    def murder(self) -> None:
        now = self.clock.monotonic()
        for w in list(self.workers.values()):
            obs, cfg = w.proc.snapshot(), self.pool_of(w).cfg  # judged by its pool's deadlines
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
            elif not verdict.judged_hung or self.guard.allow(
                w, verdict.reason, max(self.target, len(self.live_workers())), self.clock.wall()
            ):  # the fleet the kill budget is a share of: counted only for a verdict (O(n) a worker)
                self.kill(w, verdict.reason, verdict.kind)
        self.guard.settle(self.workers.values())

    def kill(self, w: Worker, reason: str, kind: KillKind) -> None:
        """SIGTERM now (SIGKILL after kill_timeout, in murder); `kind` is the reason's class."""
        lifecycle.kill(w, reason, kind, self.clock.monotonic())
        self.counters.totals.killed += 1
        self.counters.totals.killed_by[kind] += 1
        self.counters.totals.killed_in(w.pool)[kind] += 1
        self.hooks.emit("worker_killed", pool=w.pool, slot=w.slot, pid=w.pid, kind=kind, reason=reason)
        self.journal.record("killed", w.pool, f"{w.label} killed by herder: {reason}", w.slot, w.pid)

    # ---- scale: the load decides the target ------------------------------------------------

    def scale(self) -> None:
        reading = self.reader.take() if self.reader and not self.stopping else None
        if reading is None or self.reader is None:
            return
        self.guard.cluster_read(reading.kills)
        pressure = self.memory.check(self.clock.monotonic())
        self.count_jobs()  # what each pool's workers did lately: the autoscaler learns their rate
        for pool in self.pool_list():
            done = self.counters.pool_jobs(pool.name)
            jobs, busy = done.done, done.busy_seconds
            paused = fleet.all_paused(pool.live())  # a pause is no demand for workers
            pool_reading = reading.for_pool(pool.name, pool.cfg.queues) if self.cfg.pools else reading
            # Under memory pressure the target may fall, never rise (pressure.py).
            target = pool.scaler.fold(pool_reading, jobs, busy, pool.target, paused or bool(pressure))
            if target != pool.target:
                queued = f"{pool_reading.load.backlog} jobs queued" if pool_reading.load else "queues unread"
                self.journal.record("scale", pool.name, f"autoscaler: pool {pool.name} from {pool.target} to "
                                    f"{target} workers ({queued})")  # fmt: skip
            pool.target = target
            if pool.cfg.cluster_max_workers is not None:
                self.reader.tell(target=pool.target, running=len(pool.workers), pool=pool.name)

    # ---- manage: towards the target -------------------------------------------------------

    def live_workers(self) -> list[Worker]:
        """Workers that count towards the target: not on their way out."""
        return live(self.workers.values())

    def manage(self) -> None:
        """Each pool's plan, carried out: the host's workers limit shared first (every pool its
        minimum, the rest in turn: pool.share_limit), each pool planned on the host as the
        plans before it left it."""
        self.spawns_pending = False
        if self.stopping:
            return
        running = self.active_pools()
        shares = share_limit([(p.name, p.cfg.floor, p.target) for p in running], self.cfg.limit)
        wall = self.clock.wall()
        for pool in self.pool_list():
            target = min(pool.target, shares[pool.name]) if pool.name in shares else 0  # draining: 0
            self.carry_out(pool, pool.plan(Share(target, self.cfg.limit, len(self.workers)), wall))

    def carry_out(self, pool: Pool, plan: Plan) -> None:
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
            self.stop_worker(w, stop.why)
        self.spawn_into_free_slots(pool, plan.spawn)

    def spawn_into_free_slots(self, pool: Pool, room: int) -> None:
        """Up to `room` workers for a pool, within the host's workers limit and paced
        (fleet.spawn_room); a pool's slots back off on their own."""
        waiting = room > 0 and self.launcher_for(pool).warming()  # a warm template is moments away
        room = 0 if waiting else fleet.spawn_room(room, self.workers.values, self.cfg.limit)
        now = self.clock.monotonic()
        free = pool.free_slots(self.pools.values(), room, self.cfg.limit, now)
        pending = fleet.spawn_paced(free, lambda slot: self.spawn(slot, pool), self.clock.monotonic)
        self.spawns_pending = self.spawns_pending or pending or waiting

    def spawn(self, slot: Slot, pool: Pool) -> None:
        cfg = pool.cfg
        jobs_limit, age_limit = pool.retirement.draw_limits()  # the worker stops at its jobs limit
        argv, env = worker_argv(cfg), worker_env(cfg, slot.index, pool.name, jobs_limit)
        proc = lifecycle.start(  # from the warm template (forkserver.py), or a new interpreter
            slot,
            cfg,
            self.clock.monotonic(),
            lambda: self.launcher_for(pool).spawn(argv, env, slot.index, self.events.wake),
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

    def stop_worker(self, w: Worker, why: str) -> None:
        lifecycle.ask_stop(w, why, self.clock.monotonic())

    # ---- stop -----------------------------------------------------------------------------

    def begin_stop(self, hurry: bool, why: str) -> None:
        if not self.stopping:
            self.enter(MasterPhase.STOPPING)
            log.info("%s: stopping %d workers (each finishes its job; stop timeout %g s)", why,
                     len(self.workers), self.cfg.stop_timeout)  # fmt: skip
            if self.uplink:
                self.uplink.stopping()
            for w in self.workers.values():
                if w.life.state not in LEAVING:
                    self.stop_worker(w, why)
        if hurry:
            log.warning("%s: stopping now; jobs still running go back on their queues", why)
            self.sched.hurry()
            for w in list(self.workers.values()):
                if w.life.state != WorkerState.KILLING:
                    self.kill(w, f"herder is stopping in a hurry ({why})", KillKind.HURRIED_STOP)
