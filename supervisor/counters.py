"""The master's counters: fleet totals, and the per-worker problems it reports in the log.

Readers count a worker's malformed, oversized and throttled lines as they happen; the
loop reports only what is new, at most every REPORT_INTERVAL seconds per worker (and once
more when it exits), so a misbehaving worker cannot flood the master's log.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field

from herder.supervisor.dispatchers import STDERR_LINES_PER_SECOND
from herder.supervisor.fleet import Worker
from herder.supervisor.observations import Observations

log = logging.getLogger("herder")

REPORT_INTERVAL = 5.0


@dataclass
class LineProblems:
    """What a worker's pipes carried that herder could not take: protocol lines malformed or
    oversized, times its stdout was throttled, stderr lines dropped."""

    malformed: int = 0
    oversized: int = 0
    throttled: int = 0
    stderr_dropped: int = 0

    @classmethod
    def of(cls, obs: Observations) -> LineProblems:
        return cls(obs.malformed, obs.oversized, obs.throttled, obs.stderr_dropped)

    def since(self, before: LineProblems) -> LineProblems:
        return LineProblems(*(a - b for a, b in zip(self.counts(), before.counts(), strict=True)))

    def add(self, more: LineProblems) -> None:
        self.malformed, self.oversized, self.throttled, self.stderr_dropped = (
            a + b for a, b in zip(self.counts(), more.counts(), strict=True)
        )

    def counts(self) -> tuple[int, int, int, int]:
        return self.malformed, self.oversized, self.throttled, self.stderr_dropped


@dataclass
class Totals:
    spawned: int = 0
    exited: int = 0
    killed: int = 0
    problems: LineProblems = field(default_factory=LineProblems)  # as reported in the log
    jobs_ok: int = 0
    jobs_failed: int = 0
    busy_seconds: float = 0.0
    killed_by: Counter[str] = field(default_factory=Counter)  # by the kill reason's class
    killed_by_pool: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, pool)
    died_by_pool: Counter[str] = field(default_factory=Counter)  # exits herder did not ask for


@dataclass
class _Reported:
    """A worker's problems already logged, so logs say what is new."""

    problems: LineProblems = field(default_factory=LineProblems)
    at: float = float("-inf")


@dataclass
class Counters:
    totals: Totals = field(default_factory=Totals)
    by_pool: dict[str, Totals] = field(default_factory=dict)  # the reaped workers' jobs, per pool
    _reported: dict[int, _Reported] = field(default_factory=dict)  # by pid

    def fold_exit(self, w: Worker, obs: Observations, now: float) -> None:
        """A worker was reaped: add its job counts to the totals (the host's and its pool's),
        report its last problems."""
        t = self.totals
        t.exited += 1
        for totals in (t, self.by_pool.setdefault(w.pool, Totals())):
            totals.jobs_ok += obs.jobs_ok
            totals.jobs_failed += obs.jobs_failed
            totals.busy_seconds += obs.busy_seconds
        self.report(w, obs, now)
        self._reported.pop(w.pid, None)

    def report_due(self, workers: list[Worker], now: float) -> None:
        reported = self._reported
        for w in workers:
            rep = reported.get(w.pid)
            if rep is None or now - rep.at >= REPORT_INTERVAL:
                self.report(w, w.proc.snapshot(), now)

    def report(self, w: Worker, obs: Observations, now: float) -> None:
        rep = self._reported.setdefault(w.pid, _Reported())
        now_seen = LineProblems.of(obs)
        if now_seen == rep.problems:  # nothing new: the common case, each worker every few seconds
            rep.at = now
            return
        new = now_seen.since(rep.problems)
        if any(new.counts()):
            log.warning(
                "slot %d pid %d: %d malformed and %d oversized protocol lines, throttled %d times, "
                "dropped %d stderr lines over %d/s (totals %d, %d, %d, %d; last problem: %s)",
                w.slot,
                w.pid,
                *new.counts(),
                STDERR_LINES_PER_SECOND,
                *now_seen.counts(),
                obs.last_error or "-",
            )
            self.totals.problems.add(new)
        rep.problems, rep.at = now_seen, now

    def _base(self, pool: str | None) -> Totals:
        return self.totals if pool is None else self.by_pool.get(pool, Totals())

    def jobs(self, workers: list[Worker], pool: str | None = None) -> tuple[int, int]:
        """Jobs ok and failed since the start, by the whole fleet, or by one pool (`workers`:
        its live ones)."""
        base = self._base(pool)
        ok, failed = base.jobs_ok, base.jobs_failed
        for w in workers:
            o = w.proc.snapshot()
            ok, failed = ok + o.jobs_ok, failed + o.jobs_failed
        return ok, failed

    def jobs_and_busy_seconds(self, workers: list[Worker], pool: str | None = None) -> tuple[int, float]:
        """Jobs done and seconds spent busy since the start, by the whole fleet or one pool."""
        base = self._base(pool)
        jobs, busy = base.jobs_ok + base.jobs_failed, base.busy_seconds
        for w in workers:
            o = w.proc.snapshot()
            jobs += o.jobs_ok + o.jobs_failed
            busy += o.busy_seconds
        return jobs, busy

    def log_summary(self, requeued: int, failed: int, not_requeued: int) -> None:
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
            requeued,
            failed,
            t.problems.malformed,
            t.problems.oversized,
            not_requeued,
        )
