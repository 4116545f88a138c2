"""Which workers retire, and why: planned recycling (by jobs, age and memory) and culling a
worker whose jobs keep failing. A recycled worker is replaced first, then sent `stop`
(manage's rolling step does both), so capacity never dips and no job is interrupted. A
culled worker is sent `stop` at once, in the pass its replacement starts: every job it
would take meanwhile would fail (and spend that job's RQ retries), so it is no capacity.

- The worker enforces its own jobs limit (drawn here at its spawn, jitter and all, and handed
  to it): it takes no job past it, as RQ's --max-jobs, and says `idle <ts> retiring` until
  `stop`. Its replacement starts ahead, when its job rate says it reaches the limit within a
  replacement's start (timed per pool), and it is stopped at its limit, not before
  (`working_to_its_limit`). Past max_memory the master tells it `retire` (manage sends it):
  it takes no more jobs at once, while its replacement starts.

- Planned recycles (gunicorn's max_requests, celery's max-tasks/max-memory-per-child, PM2's
  max_memory_restart, circus's max_age) are not faults: they spend no budget, back off no
  slot, and at most `recycle_share` of the fleet (at least one) retires at once. Each worker
  gets its own jitter, so a fleet started together does not recycle together.
- A cull is a verdict on a worker that a connection gone bad has made fail every job:
  `cull_failures` failed jobs within `cull_failure_window` seconds (5 a minute by
  default). It takes a token from the cull budget, locally and cluster-wide in Redis
  (an atomic script, on the recovery thread: the loop never waits), failing closed: no
  token, or no answer from Redis, and the worker is left running, health is degraded
  with the reason, and the log says so once.
- Past the hard memory limit a worker is killed at once, job or not (its job is requeued).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random
from collections import Counter
from collections.abc import Callable, Iterator

from herder.common.config import Config
from herder.common.worker_protocol import RETIRING
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.observations import Observations
from herder.supervisor.children.states import Cull, KillKind, Retire, change_cull
from herder.supervisor.children.workerproc import rss
from herder.supervisor.redis_side.budget import SlidingWindow
from herder.supervisor.redis_side.recovery import Recovery

log = logging.getLogger("herder")

Killer = Callable[[Worker, str, KillKind], None]  # (worker, reason, the reason's class)

ASK_AGAIN = 10.0  # seconds before a worker denied a cull asks again (the window moves on)
RSS_EVERY = 2.0  # seconds between RSS readings of one worker
MB = 2**20
# A worker near its jobs limit is replaced ahead of it: from its job rate, once it will reach
# the limit within a replacement's start plus the time until the loop surely looks again.
START_GUESS = 1.0  # seconds a replacement takes to be ready, until the pool has timed one
START_WEIGHT = 0.3  # the newest start's weight in the pool's running figure
LOOK_AGAIN = 1.0  # seconds until the loop surely passes again (the master's settled TICK)
RATE_AFTER = 3  # jobs a worker has done before its rate says when it reaches its limit
STILL_TAKING = 1.0  # seconds since its last job within which a worker still takes jobs


def rss_mb(pid: int) -> float | None:
    got = rss(pid)
    return got / MB if got is not None else None


class Retirement:
    def __init__(
        self,
        cfg: Config,
        recovery: Recovery | None,
        rng: random.Random | None = None,
        rss_of: Callable[[int], float | None] = rss_mb,
        tickets: Iterator[int] | None = None,
    ) -> None:
        """`tickets`: cull ticket numbers, shared by the pools of one master (one recovery
        thread answers them all)."""
        self.cfg = cfg
        self.recovery = recovery
        self.tickets = tickets or itertools.count(1)
        self.rng = rng or random.Random()
        self.rss_of = rss_of
        self.local = SlidingWindow(cfg.cull_window)
        self.degraded = ""  # why health is degraded (the cull budget is spent), or ""
        self.recycled: Counter[str] = Counter()  # planned recycles and culls (Retire), hard kills
        self.start_seconds = START_GUESS  # how long this pool's workers take to be ready, lately
        # When the next review of every worker is due (time moves age and memory, not lines).
        self._whole_at = float("-inf")
        self._deferred = False  # a worker waited for room: every pass reviews all until none does

    def configure(self, cfg: Config) -> None:
        self.cfg = cfg
        if cfg.cull_window != self.local.window:
            self.local = SlidingWindow(cfg.cull_window)

    def draw_limits(self) -> tuple[int | None, float | None]:
        """A new worker's own recycling points, (jobs, age): the limits plus its share of the
        jitter. Drawn before its spawn: the worker is told its jobs limit and stops there."""
        cfg = self.cfg
        jobs = None if cfg.max_jobs is None else cfg.max_jobs + self.rng.randint(0, cfg.max_jobs_jitter)
        age = None if cfg.max_age is None else cfg.max_age + self.rng.uniform(0, cfg.max_age_jitter)
        return jobs, age

    # ---- each pass of the loop -----------------------------------------------------------

    def whole_due(self, now: float, answers: dict[int, bool]) -> bool:
        """Whether this pass reviews every worker, not only those that changed: an answer to a
        cull ticket came, an RSS reading or a worker's age limit is due, or the budget is spent."""
        return bool(answers) or now >= self._whole_at or bool(self.degraded) or self._deferred

    def review(
        self,
        live_of: Callable[[], list[Worker]],
        target: int,
        now: float,
        wall: float,
        kill: Killer,
        answers: dict[int, bool] | None = None,
        look: list[Worker] | None = None,
    ) -> None:
        """Decide retirements for the live (not yet leaving) workers: those in `look` (the ones
        that changed), or all of them (`live_of()`, walked otherwise only when a decision counts
        over the pool: a recycle's room, a cull's budget). `answers`: the cull tickets the
        recovery thread answered (the master takes them once for every pool)."""
        if answers is None:
            answers = self.recovery.answers() if self.recovery else {}
        live = functools.cache(live_of)  # the pool listed once at most, and only when needed
        if look is None:
            look = live()
            self._whole_at = self._next_whole(look, now)
        elif not look:
            return
        else:
            self._whole_at = min(self._whole_at, self._next_whole(look, now))
        room: int | None = None  # counted (a walk of the pool) only when a plan is due
        self._deferred = False
        for w in look:
            obs, culling = w.proc.snapshot(), w.culling
            if w.limits.ready_at is None and obs.ready:
                self._timed_start(w, now)
            if obs.jobs_failed != culling.failed_seen or culling.failures:  # else nothing to count or expire
                self._count_failures(w, obs, now)
            if culling.cull == Cull.ASKED and culling.ticket in answers:
                self._answered(w, answers[culling.ticket], now, wall)
            if w.retiring:
                continue
            hard = self._memory(w, now)
            if hard:
                kill(w, hard, KillKind.MEMORY_HARD)
                continue
            if culling.failures or culling.cull == Cull.DENIED:  # else no failure to cull for, none denied
                self._consider_cull(w, now, wall, live())
            if w.retiring:
                continue
            planned = self.planned(w, obs, now)
            if planned is None:
                continue
            if room is None:
                planned_already = sum(1 for x in live() if x.recycling)
                room = max(1, math.floor(self.cfg.recycle_share * target)) - planned_already
            # Room is for replacements started ahead: one that takes no more jobs is due, room or not.
            if room <= 0 and obs.paused != RETIRING:
                self._deferred = True  # looked at again when room frees
                continue
            limits = w.limits
            limits.retire, limits.retire_reason = planned
            self.recycled[limits.retire] += 1
            room -= 1
            log.info("slot %d pid %d: %s; its replacement starts first", w.slot, w.pid, limits.retire_reason)
        if self.degraded and not any(w.culling.cull == Cull.DENIED for w in live()):
            log.warning("health ok again: no worker is waiting on the cull budget")
            self.degraded = ""

    def _next_whole(self, workers: list[Worker], now: float) -> float:
        """When time alone next moves a retirement: an RSS reading due, the first age limit."""
        at = now + RSS_EVERY if self.cfg.max_memory is not None else float("inf")
        ages = [w.spawned_at + w.limits.age for w in workers if w.limits.age is not None]
        return min([at, *ages])

    def planned(self, w: Worker, obs: Observations, now: float) -> tuple[Retire, str] | None:
        """A planned recycle due now, and its sentence; None if none is."""
        done, limits = obs.jobs_ok + obs.jobs_failed, w.limits
        if limits.jobs is not None:
            if done >= limits.jobs:
                return Retire.MAX_JOBS, f"{Retire.MAX_JOBS}: {done} jobs done (limit {limits.jobs})"
            taken = done + len(obs.jobs)  # as the worker counts: the jobs it runs are taken
            if taken + self._jobs_ahead(w, done, now) >= limits.jobs:
                return Retire.MAX_JOBS, (
                    f"{Retire.MAX_JOBS}: {taken} jobs taken of its limit of {limits.jobs}, which it "
                    f"reaches within a replacement's start ({self.start_seconds:.2f} s)"
                )
        age = now - w.spawned_at
        if limits.age is not None and age >= limits.age:
            return Retire.MAX_AGE, f"{Retire.MAX_AGE}: {age:.0f} s old (limit {limits.age:.0f} s)"
        limit = self.cfg.max_memory
        if limits.rss is not None and limit is not None and limits.rss >= limit:
            return Retire.MAX_MEMORY, f"{Retire.MAX_MEMORY}: RSS {limits.rss:.0f} MiB (limit {limit:g} MiB)"
        if obs.paused == RETIRING:  # it takes no more jobs, by a limit the master did not set
            return Retire.MAX_JOBS, f"{Retire.MAX_JOBS}: {done} jobs done, and it takes no more"
        return None

    def _jobs_ahead(self, w: Worker, done: int, now: float) -> float:
        """Jobs the worker likely does before a replacement started now is ready and the loop
        has looked again: its rate since it became ready, times that time (0 until known)."""
        ready_at = w.limits.ready_at
        if ready_at is None or done < RATE_AFTER or now <= ready_at:
            return 0.0
        return done / (now - ready_at) * (self.start_seconds + LOOK_AGAIN)

    def _timed_start(self, w: Worker, now: float) -> None:
        """The worker is ready (the loop looks at once on `ready`): how long its start took
        goes into the pool's running figure."""
        w.limits.ready_at = now
        took = max(0.0, now - w.spawned_at)
        self.start_seconds += START_WEIGHT * (took - self.start_seconds)

    # ---- parts -------------------------------------------------------------------------

    def _count_failures(self, w: Worker, obs: Observations, now: float) -> None:
        culling = w.culling
        for _ in range(max(0, obs.jobs_failed - culling.failed_seen)):
            culling.failures.append(now)
        culling.failed_seen = obs.jobs_failed
        while culling.failures and culling.failures[0] < now - self.cfg.cull_failure_window:
            culling.failures.popleft()

    def _memory(self, w: Worker, now: float) -> str:
        """The hard limit's kill reason, or ""; keeps the worker's last RSS reading."""
        hard, limits = self.cfg.memory_hard_limit, w.limits
        if self.cfg.max_memory is None or now - limits.rss_checked_at < RSS_EVERY:
            return ""
        limits.rss_checked_at = now
        limits.rss = self.rss_of(w.pid)
        if limits.rss is not None and hard is not None and limits.rss >= hard:
            self.recycled["killed over hard memory limit"] += 1
            return f"RSS {limits.rss:.0f} MB over the hard memory limit of {hard:g} MB"
        return ""

    def _consider_cull(self, w: Worker, now: float, wall: float, live: list[Worker]) -> None:
        cfg, culling = self.cfg, w.culling
        failing = cfg.cull_failures > 0 and len(culling.failures) >= cfg.cull_failures
        if not failing:
            if culling.cull == Cull.DENIED:
                change_cull(w, Cull.NONE)  # its jobs succeed again: nothing to cull
            return
        if culling.cull == Cull.ASKED or (culling.cull == Cull.DENIED and now - culling.asked_at < ASK_AGAIN):
            return
        culling.asked_at = now
        asking = sum(1 for x in live if x.culling.cull == Cull.ASKED)  # asks in flight count
        if self.local.count(wall) + asking + 1 > cfg.cull_budget:
            self._deny(w, "on this host")
        elif self.recovery is None:
            self._answered(w, True, now, wall)
        else:
            change_cull(w, Cull.ASKED)
            culling.ticket = next(self.tickets)
            self.recovery.ask_cull(culling.ticket, wall)

    def _answered(self, w: Worker, granted: bool, now: float, wall: float) -> None:
        if not granted:
            self._deny(w, "cluster-wide (or Redis did not answer)")
            return
        self.local.add(wall)
        change_cull(w, Cull.CULLED)
        limits, failures = w.limits, len(w.culling.failures)
        limits.retire = Retire.CULLED
        limits.retire_reason = (
            f"{Retire.CULLED}: {failures} failed jobs within {self.cfg.cull_failure_window:g} s"
        )
        self.recycled[Retire.CULLED] += 1
        log.warning(
            "slot %d pid %d: %s; stopped as its replacement starts", w.slot, w.pid, limits.retire_reason
        )

    def _deny(self, w: Worker, where: str) -> None:
        first = w.culling.cull != Cull.DENIED
        change_cull(w, Cull.DENIED)
        self.degraded = (
            f"cull budget spent {where}: {self.cfg.cull_budget} culls per {self.cfg.cull_window:g} s; "
            "workers whose jobs keep failing are left running"
        )
        if first:
            log.error(
                "slot %d pid %d: %d failed jobs within %g s, but %s. A widespread fault (a database "
                "down)? Leaving it for a person; health degraded",
                w.slot,
                w.pid,
                len(w.culling.failures),
                self.cfg.cull_failure_window,
                self.degraded,
            )


def tell_retire(w: Worker) -> None:
    """`retire` on its stdin, once: it takes no more jobs (past max_memory: each job may leak
    more); replaced, then sent `stop` by its pool's rolling step."""
    w.limits.retire_sent = True
    w.proc.send_retire()


def working_to_its_limit(w: Worker, obs: Observations, wall: float) -> bool:
    """A worker replaced ahead of its jobs limit that still takes jobs: it is sent `stop` at
    its limit (where it stops taking jobs and says `retiring`), not as soon as its replacement
    is ready, which would waste the jobs it has left. One that has had no job for a moment
    has no queue to work: it goes now."""
    if w.limits.retire != Retire.MAX_JOBS or w.limits.jobs is None or obs.paused is not None:
        return False
    if obs.jobs_ok + obs.jobs_failed >= w.limits.jobs:
        return False  # past it (a --worker-command program that does not stop there)
    recent = obs.last_done_wall is not None and wall - obs.last_done_wall < STILL_TAKING
    return bool(obs.jobs) or recent
