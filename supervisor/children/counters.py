"""The master's counters: fleet totals, the one count of finished jobs (the host's and each
pool's, which every view and the autoscaler read), and the per-worker problems it reports
in the log.

Readers count a worker's malformed, oversized and throttled lines as they happen; the
loop reports only what is new, at most every REPORT_INTERVAL seconds per worker (and once
more when it exits), so a misbehaving worker cannot flood the master's log.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field

from herder.supervisor.children.dispatchers import STDERR_LINES_PER_SECOND
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.observations import Observations

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
class JobCount:
    """Jobs finished, ok and failed, and the seconds spent busy running them."""

    ok: int = 0
    failed: int = 0
    busy_seconds: float = 0.0

    @property
    def done(self) -> int:
        return self.ok + self.failed

    def add(self, ok: int, failed: int, busy_seconds: float) -> None:
        self.ok += ok
        self.failed += failed
        self.busy_seconds += busy_seconds


@dataclass
class Totals:
    spawned: int = 0
    exited: int = 0
    killed: int = 0
    problems: LineProblems = field(default_factory=LineProblems)  # as reported in the log
    killed_by: Counter[str] = field(default_factory=Counter)  # by the kill reason's class
    killed_by_pool: dict[str, Counter[str]] = field(default_factory=dict)  # pool -> kind -> kills
    died_by_pool: Counter[str] = field(default_factory=Counter)  # exits herder did not ask for

    def killed_in(self, pool: str) -> Counter[str]:
        """A pool's kills by kind, to count one more."""
        return self.killed_by_pool.setdefault(pool, Counter())


@dataclass
class _Reported:
    """A worker's problems already logged, so logs say what is new."""

    problems: LineProblems = field(default_factory=LineProblems)
    at: float = float("-inf")


@dataclass
class Counters:
    totals: Totals = field(default_factory=Totals)
    # Every job finished since the start, once: the host's and each pool's (pools a reload
    # removed too). A worker's own figures are folded in as they grow (count_jobs).
    jobs: JobCount = field(default_factory=JobCount)
    jobs_by_pool: dict[str, JobCount] = field(default_factory=dict)
    _counted: dict[int, JobCount] = field(default_factory=dict)  # of each worker's, by pid
    _reported: dict[int, _Reported] = field(default_factory=dict)  # by pid

    def count_jobs(self, w: Worker, obs: Observations) -> None:
        """What the worker finished since it was last counted, into the host's and its
        pool's count."""
        seen = self._counted.setdefault(w.pid, JobCount())
        ok, failed = obs.jobs_ok - seen.ok, obs.jobs_failed - seen.failed
        busy = obs.busy_seconds - seen.busy_seconds
        if ok or failed or busy:
            for count in (self.jobs, self.jobs_by_pool.setdefault(w.pool, JobCount()), seen):
                count.add(ok, failed, busy)

    def pool_jobs(self, pool: str) -> JobCount:
        """A pool's count (none yet: zero)."""
        return self.jobs_by_pool.get(pool) or JobCount()

    def fold_exit(self, w: Worker, obs: Observations, now: float) -> None:
        """A worker was reaped: its last jobs counted, its last problems reported."""
        self.totals.exited += 1
        self.count_jobs(w, obs)
        self._counted.pop(w.pid, None)
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
            self.jobs.ok,
            self.jobs.failed,
            requeued,
            failed,
            t.problems.malformed,
            t.problems.oversized,
            not_requeued,
        )
