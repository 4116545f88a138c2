"""Murder: the unresponsive. Each pass judges the workers that changed and those whose next
deadline has come (liveness.next_verdict_at; the whole fleet at a sweep, children/changes.py)
by their pool's deadlines (the verdicts are liveness.py's, pure), spends the kill budget on a
hung one (guard.py), and kills: SIGTERM now, SIGKILL after kill_timeout (lifecycle.py). A kill
is counted and said once, here.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable

from herder.supervisor.children import lifecycle
from herder.supervisor.children.counters import Counters
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.launcher import Clock
from herder.supervisor.children.states import WORKING, KillKind, KillStage, WorkerState, change_state
from herder.supervisor.policy.guard import KillGuard
from herder.supervisor.policy.liveness import derived_state, judge, next_verdict_at, read_late
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
        # When each worker is to be judged again if nothing changes: its next deadline. A heap
        # with stale entries left in it (a newer `_due` wins); a sweep starts it afresh.
        self._due: dict[int, float] = {}
        self._deadlines: list[tuple[float, int]] = []
        self.moving: set[int] = set()  # pids last seen starting, stopping or being killed

    def murder(self, changed: set[int] | None = None) -> None:
        """Judge the workers in `changed` (pids) and those whose deadline has come; every worker
        when `changed` is None (a sweep)."""
        now, now_wall = self.clock.monotonic(), self.clock.wall
        if changed is None:
            look = list(self.workers.values())
            self._due, self._deadlines, self.moving = {}, [], set()
        else:
            due = changed | self._come(now) | self.moving  # those in motion: each pass, as before
            look = [w for pid in due if (w := self.workers.by_pid(pid)) is not None]
        for w in look:
            obs, cfg = w.proc.snapshot(), self.pools[w.pool].cfg  # judged by its pool's deadlines
            state = derived_state(w, obs)
            if state != w.life.state:  # the reason is built only for a change
                was = w.life.state
                change_state(w, state, f"job {obs.job_id}" if obs.job_id else "ready")
                self.pools[w.pool].worker_moved(was, state)  # its pool's plan may read it
            if w.life.state in WORKING:
                self.moving.discard(w.pid)
            else:
                self.moving.add(w.pid)
            if w.life.state == WorkerState.KILLING:
                lifecycle.escalate(w, now, cfg.kill_timeout)
                self._arm_kill(w, cfg.kill_timeout)
                continue
            # No verdict can come before its next deadline (a property test holds the two to
            # that): a busy fleet's workers change each pass, and are judged only when due.
            at = next_verdict_at(w, obs, cfg)
            verdict = judge(w, obs, now, cfg) if at <= now else None
            if verdict is not None and read_late(verdict, w):
                # Its lines wait in the pipe: the master's reader is behind (starved of CPU by
                # a busy fleet), the worker is not silent. Never kill on the master's own lag.
                self.lagging_reads += 1
                if now - self._lag_said_at > 60:
                    self._lag_said_at = now
                    log.warning("slot %d pid %d: %s, but its lines wait unread: this master is short "
                                "of CPU (workers at nice +%d; see worker_nice); not killed", w.slot, w.pid,
                                verdict.reason, cfg.worker_nice)  # fmt: skip
                self._arm(w.pid, now)  # judged again next pass, its lines read by then
                continue
            if verdict is None:
                self.guard.responsive(w)
                self._arm(w.pid, at)
            elif not verdict.judged_hung or self.guard.allow(w, verdict.reason, self.fleet(), now_wall()):
                self.kill(w, verdict.reason, verdict.kind)  # the fleet size: counted only for a verdict
                self._arm_kill(w, cfg.kill_timeout)
            else:
                self._arm(w.pid, now)  # spared, waiting on the kill budget: asked again each pass
        if self.guard.degraded:
            self.guard.settle(self.workers.values())

    def in_motion(self) -> bool:
        """Whether a worker is starting, stopping or being killed (O(those), not O(fleet))."""
        return self.moving_count() > 0

    def moving_count(self) -> int:
        """How many workers are starting, stopping or being killed."""
        gone = {pid for pid in self.moving if self.workers.by_pid(pid) is None}
        self.moving -= gone
        return len(self.moving)

    def next_deadline(self) -> float:
        """When the next worker is due to be judged (inf: none is)."""
        heap = self._deadlines
        while heap and self._due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # stale: judged again since, or gone
        return heap[0][0] if heap else float("inf")

    def _arm(self, pid: int, at: float) -> None:
        if self._due.get(pid) != at:
            self._due[pid] = at
            heapq.heappush(self._deadlines, (at, pid))

    def _arm_kill(self, w: Worker, kill_timeout: float) -> None:
        """A worker being killed: its SIGKILL is due kill_timeout after its SIGTERM; then its reap."""
        if w.life.kill_stage == KillStage.TERM:
            self._arm(w.pid, (w.life.kill_started_at or self.clock.monotonic()) + kill_timeout)
        else:
            self._due.pop(w.pid, None)  # SIGKILLed: its exit (a SIGCHLD, its EOF) is a change

    def _come(self, now: float) -> set[int]:
        """The pids whose deadline has come, taken off the heap."""
        come = set()
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            at, pid = heapq.heappop(heap)
            if self._due.get(pid) == at:
                del self._due[pid]
                come.add(pid)
        return come

    def kill(self, w: Worker, reason: str, kind: KillKind) -> None:
        """SIGTERM now (SIGKILL after kill_timeout, in murder); `kind` is the reason's class."""
        lifecycle.kill(w, reason, kind, self.clock.monotonic())
        self.moving.add(w.pid)
        self.pools[w.pool].touch()
        self.counters.totals.killed += 1
        self.counters.totals.killed_by[kind] += 1
        self.counters.totals.killed_in(w.pool)[kind] += 1
        self.hooks.emit("worker_killed", pool=w.pool, slot=w.slot, pid=w.pid, kind=kind, reason=reason)
        self.journal.record("killed", w.pool, f"{w.label} killed by herder: {reason}", w.slot, w.pid)
