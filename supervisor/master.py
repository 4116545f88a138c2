"""The master: one reconcile loop that spawns, watches, stops and replaces workers.

Shaped like gunicorn's arbiter: wait for an event (a reader's wake-up byte, a signal, the
tick), then handle signals, reap the dead, murder the unresponsive, retire (recycle, cull),
scale, manage towards the target, answer control requests. Handlers only record; the loop
acts, and only it changes a worker's state (states.change_state). Each step's work is done
in its room: spawner.py (spawn), reaper.py (reap), murder.py (murder), the pools' plans
(pool.py), the views (views/publish.py). Workers start only through the Launcher and time is
read only through the Clock: unit tests use fakes. docs/design.md has the map of the rooms
around it and this loop's sketch.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from herder.common import rq_seam, rq_support
from herder.common.config import DEFAULT_POOL, Config, all_queues, redact_url
from herder.common.transitions import move
from herder.supervisor.children import fleet, lifecycle, pipes
from herder.supervisor.children.changes import Changes, Sweeps
from herder.supervisor.children.fleet import Slot, Worker
from herder.supervisor.children.launcher import Clock
from herder.supervisor.children.launchers import Launchers
from herder.supervisor.children.reaper import Reaper
from herder.supervisor.children.scheduler import SchedulerKeeper
from herder.supervisor.children.spawner import Spawner
from herder.supervisor.children.states import (
    LEAVING,
    PHASES,
    KillKind,
    MasterPhase,
    WorkerState,
)
from herder.supervisor.control import reload
from herder.supervisor.control.commands import Commands
from herder.supervisor.control.handoff import Handoff
from herder.supervisor.control.server import ControlServer
from herder.supervisor.control.takeover import Takeover
from herder.supervisor.events import Events
from herder.supervisor.policy.endings import Endings
from herder.supervisor.policy.guard import KillGuard
from herder.supervisor.policy.murder import Murderer
from herder.supervisor.policy.pool import (
    Pool,
    Share,
    Workers,
    active,
    fleet_ready,
    host_floor,
    host_target,
    live,
    share_limit,
    slots_of,
)
from herder.supervisor.policy.pressure import MemoryWatch
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import Recovery
from herder.supervisor.uplink import Uplink
from herder.supervisor.views.model import HostSnapshot
from herder.supervisor.views.publish import Views
from herder.supervisor.views.sources import Loop, sched_cfg

log = logging.getLogger("herder")

# How often the loop looks at deadlines with nothing to wake it: once a second for a settled
# fleet (gunicorn's arbiter and supervisord do the same), four times while a process starts or
# stops, so a start, a stop's timeout and a SIGKILL's escalation keep their pace. A pass costs
# tens of microseconds per worker: at 256 idle workers the slow tick is a quarter of the CPU.
TICK = 1.0
STATUS_EVERY = 1.0  # seconds between two status lines to the watchdog (systemd's STATUS=)
TICK_IN_MOTION = 0.25


@dataclass
class Start:
    """How this master was started (__main__ fills it in; unit tests take the defaults).
    `control`: the control socket, already answering `starting` (__main__ opens it first
    thing); the loop takes it over (without one, __main__ opens one). `http_token`:
    HERDER_HTTP_TOKEN, which __main__ took out of the environment (http_auth.py)."""

    host_id: str = ""
    restarts: int = 0  # times the watchdog restarted the master before this one
    started_at: float | None = None  # wall time; now, without
    control: ControlServer | None = None
    uplink: Uplink | None = None  # the pipe to the watchdog
    http_token: str = ""
    # Who changed since the last pass (children/changes.py): __main__ passes the readers'
    # registry; without one (the unit tests' fakes) every pass looks at every worker.
    changes: Changes | None = None
    takeover: Takeover | None = None  # `herder upgrade`: this master takes over from another (takeover.py)


@dataclass
class Children:
    """The children and their lives: the pools (each holds its workers and slots), where their
    processes come from, RQ's scheduler process, and the rooms that carry a life out."""

    pools: dict[str, Pool]  # one per [pools.NAME] of the file, or the one pool `default`
    launchers: Launchers  # one fork server per set of imports; pools that agree share it
    sched: SchedulerKeeper  # RQ's scheduler process (scheduler.py)
    spawner: Spawner
    reaper: Reaper  # the dead
    murderer: Murderer  # the unresponsive
    tickets: Iterator[int]  # cull tickets, unique across pools, a reload's new ones too (retirement.py)
    sweeps: Sweeps  # which workers a pass looks at: those that changed, or all


@dataclass
class Policy:
    """What decides beside each pool's plan, and the Redis threads it reads (None without Redis)."""

    guard: KillGuard  # the kill budget
    endings: Endings  # given-up jobs: which worker ends each
    memory: MemoryWatch  # the cgroup near its memory limit: no scale-up
    recovery: Recovery | None  # requeues, sweeps, answers
    reader: LoadReader | None  # the load readings the autoscalers fold


@dataclass
class Surface:
    """The control surface: wake-ups and signals, the control socket, the pipe to the watchdog."""

    events: Events
    control: ControlServer | None
    uplink: Uplink | None


class Master:
    """The loop: `step` is one pass, each step's work done in its room; the master's own state
    is its phase (`enter`), when the fleet was first ready, and the settings in force."""

    def __init__(
        self, cfg: Config, clock: Clock, children: Children, policy: Policy, surface: Surface, views: Views,
        start: Start,
    ) -> None:  # fmt: skip
        """Its parts, grouped by room, composed by __main__ (tests compose it the same way)."""
        self.cfg = self.started_cfg = cfg  # started_cfg: the watchdog's, which it never re-reads
        self.clock, self.host_id, self.restarts = clock, start.host_id, start.restarts
        self.pools, self.launchers, self.sched = children.pools, children.launchers, children.sched
        self.workers = Workers(self.pools)  # the host's fleet: every pool's workers (each pool holds its own)
        self.spawner, self.reaper, self.murderer = children.spawner, children.reaper, children.murderer
        self.sweeps = children.sweeps
        self.tickets = children.tickets
        self.guard, self.endings, self.memory = policy.guard, policy.endings, policy.memory
        self.recovery, self.reader = policy.recovery, policy.reader
        self.events, self.control, self.uplink = surface.events, surface.control, surface.uplink
        self.views, self.journal, self.hooks = views, views.journal, views.hooks
        self.counters = views.sources.counters
        self.phase = MasterPhase.STARTING  # changed only through enter()
        self.ready_at: float | None = None  # wall time the fleet was first ready (`ready` to the watchdog)
        self._last_alive = self._status_at = float("-inf")
        self._status_shape: tuple[object, ...] = ()
        # `herder upgrade`: this master takes over from the old one, or hands over to the new one.
        self.takeover = start.takeover
        self.handoff: Handoff | None = None
        self.commands = Commands(self, self, self)  # the requests the loop answers (commands.py)

    # ---- pools --------------------------------------------------------------------------

    def pool_list(self) -> list[Pool]:
        return list(self.pools.values())

    def active_pools(self) -> list[Pool]:
        """The pools that run (not draining away after a reload removed them)."""
        return active(self.pools.values())

    def pool_of(self, w: Worker) -> Pool:
        return self.pools[w.pool]

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
        if self.control and not self.control.started and not self.takeover:  # taking over: at the gate
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
            self.views.health.loop_pass(began, worked, wait, self.clock.monotonic())
        return self.shut_down()

    def stopped(self) -> bool:
        """Stopping, and every worker and the scheduler process have exited."""
        return self.stopping and not self.workers and not self.sched.running

    def step(self) -> None:
        """One pass of the loop (unit tests call it directly). It looks at the workers that
        changed since the last (children/changes.py), or at a sweep at all of them."""
        self.handle_signals()
        if self.events.child_exited:  # a death whose EOF may have come before its exit
            self.events.child_exited = False
            self.sweeps.ask()
        changed = self.sweeps.take(self.clock.monotonic())
        self.views.note(changed)
        self.reaper.reap(self.launchers, self.stopping, self.views.fold_finished, self.events.wake, changed)
        self.murderer.murder(changed)
        self.retire(changed)
        self.scale()
        self.manage(changed)
        self.sched.step(self.sched_cfg, self.stopping, self.events.wake)
        self.end_given_up()
        self.commands.handle_requests()
        if changed is None:  # a worker's problems are reported every few seconds at most
            self.counters.report_due(list(self.workers.values()), self.clock.monotonic())
        self.heartbeat()
        self.hand_over()
        moving = self.murderer.moving_count()
        self.views.publish(Loop(self.cfg, self.phase, self.ever_ready), self.floor, moving)
        self.reaper.tell_recovery(self.workers, changed)  # what the next sweep must not touch
        # A settled loop's workers' lines: read in fewer batches, a quiet fleet's seconds apart.
        pipes.settle(not self.in_motion(), pipes.long_pause([p.cfg for p in self.pool_list()]))

    @property
    def sched_cfg(self) -> Config:
        return sched_cfg(self.cfg)

    def retire(self, changed: set[int] | None) -> None:
        """Recycling and culling, each pool by its own rules (retirement.py), for the workers
        that changed, or every worker when time is due to move one (age, memory) or at a sweep."""
        answers = self.recovery.answers() if self.recovery else {}
        now, wall = self.clock.monotonic(), self.clock.wall()
        for pool in self.pool_list():
            look = None
            if changed is not None and not pool.retirement.whole_due(now, answers):
                look = [w for pid in changed if (w := pool.by_pid.get(pid)) and w.life.state not in LEAVING]
                if not look:
                    continue  # none of its workers changed, and time moves none of them yet
            pool.retirement.review(pool.live, pool.target, now, wall, self.murderer.kill, answers, look)

    def next_wait(self) -> float:
        """Until the next tick, or sooner if a slot's backoff ends first (0.1 s, not a tick) or a
        worker's next deadline comes (murder's)."""
        now = self.clock.monotonic()
        due = [
            p.slots[i].next_spawn_at - now
            for p in self.pool_list()
            if len(p.slots) > len(p.workers)  # a slot with no worker in it: few, often none
            for i in p.slots.keys() - p.workers.keys()
        ]
        due.append(self.murderer.next_deadline() - now)
        soon = [fleet.SPAWN_AGAIN] if self.spawner.pending else []  # paced spawns left for the next pass
        tick = TICK_IN_MOTION if self.in_motion() else TICK
        return max(0.0, min([tick, *soon, *[d for d in due if d > 0]]))

    def in_motion(self) -> bool:
        """Whether the master, a worker or the scheduler is starting or stopping (a slot's backoff
        has its own deadline in next_wait)."""
        if self.phase != MasterPhase.RUNNING or self.sched.in_motion():
            return True
        return self.murderer.in_motion()

    def take_snapshot(self, usage: bool = False) -> HostSnapshot:
        """The host now, built and published by the views (views/publish.py)."""
        return self.views.take_snapshot(Loop(self.cfg, self.phase, self.ever_ready), usage)

    def listeners(self) -> list[socket.socket]:
        """The listening sockets a new master takes over (`herder upgrade`: handoff.py)."""
        http = self.views.http.endpoint.listener() if self.views.http else None
        control = self.control.listener() if self.control else None
        return [s for s in (control, http) if s is not None]

    def hand_over(self) -> None:
        """`herder upgrade`, either side: B asks A for workers' stops past its gate; A, its last
        worker gone, yields the listening sockets to B and exits (without `stopping`: the
        watchdog carries on with B)."""
        if self.takeover and not self.stopping:
            self.takeover.step(self.pool_list(), self.events.wake)
        if self.handoff and not self.stopping and self.handoff.finished(len(self.workers)):
            log.info("herder upgrade: every worker handed over to master %d: exiting", self.handoff.to_pid)
            if self.control:
                self.control.yield_path()
            if self.views.http:
                self.views.http.held = True  # not bound again: the port is B's
            self.views.close()
            self.enter(MasterPhase.STOPPING)

    def shut_down(self) -> int:
        if self.takeover:
            self.takeover.close()
        if self.reader:
            self.reader.stop()
        self.views.close()
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
        starting = self.phase == MasterPhase.STARTING  # asked only then: readiness walks the fleet
        gate = self.takeover.gate if self.takeover else fleet_ready
        if starting and gate(self.pool_list()):
            if self.takeover:  # past the gate: serve beside A, then A's workers go
                self.takeover.passed = True
                if self.control and not self.control.started:
                    self.control.start()
                if self.views.http:
                    self.views.http.held = False
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
        # systemd's STATUS= line: at once when the fleet's size, target or phase moves; its
        # busy and queued counts, which move with every job, once a second at most.
        shape = (len(self.workers), self.target, self.phase, self.stopping)
        if shape != self._status_shape or now - self._status_at >= STATUS_EVERY:
            self._status_at, self._status_shape = now, shape
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

    def end_given_up(self) -> None:
        """Jobs given up past max_requeues end in a worker, as RQ ends them (endings.py);
        only herder's own RQ workers can (not a --worker-command program)."""
        if self.recovery is None or self.stopping:
            return
        waiting = self.recovery.endings()
        if self.endings.idle(waiting):
            return  # the usual pass: nothing given up, no workers to look at
        workers = [w for w in self.live_workers() if self.pool_of(w).cfg.worker_command is None]

        def current(w: Worker) -> bool:
            return w.generation >= self.pool_of(w).generation

        self.endings.dispatch(waiting, workers, current, self.clock.monotonic())

    # ---- scale: the load decides the target ------------------------------------------------

    def scale(self) -> None:
        frozen = self.stopping or self.handoff is not None  # handing over: A's pools only shrink
        reading = self.reader.take() if self.reader and not frozen else None
        if reading is None or self.reader is None:
            return
        self.guard.cluster_read(reading.kills)
        pressure = self.memory.check(self.clock.monotonic())
        self.views.count_jobs()  # what each pool's workers did lately: the autoscaler learns their rate
        for pool in self.pool_list():
            done = self.counters.pool_jobs(pool.name)
            jobs, busy = done.done, done.busy_seconds
            paused = fleet.all_paused(pool.workers.values())  # a pause is no demand for workers
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

    def manage(self, changed: set[int] | None = None) -> None:
        """Each pool's plan, carried out: the host's workers limit shared first (every pool its
        minimum, the rest in turn: pool.share_limit), each pool planned on the host as the
        plans before it left it. A pool whose last plan was still and whose inputs did not move
        is not planned again (but at a sweep, `changed` None)."""
        self.spawner.pending, self.spawner.moved = False, []
        if self.stopping:
            return
        running = self.active_pools()
        shares = share_limit([(p.name, p.cfg.floor, p.target) for p in running], self.cfg.limit)
        wall = self.clock.wall()
        for pool in self.pool_list():
            target = min(pool.target, shares[pool.name]) if pool.name in shares else 0  # draining: 0
            if self.takeover:
                target = self.takeover.cap(pool, target)
            if self.handoff:
                target = self.handoff.target(pool, target)
            share = Share(target, self.cfg.limit, len(self.workers))
            key = pool.plan_key(share)
            if changed is not None and pool.still_at == key:
                continue
            plan = pool.plan(share, wall)
            pool.planned(key, plan)
            self.spawner.carry_out(pool, plan, self.cfg.limit)
        self.murderer.moving.update(self.spawner.moved)  # starting or stopping from now on

    def stop_worker(self, w: Worker, why: str) -> None:
        lifecycle.ask_stop(w, why, self.clock.monotonic())
        self.murderer.moving.add(w.pid)
        if pool := self.pools.get(w.pool):
            pool.touch()

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
                    self.murderer.kill(w, f"herder is stopping in a hurry ({why})", KillKind.HURRIED_STOP)
