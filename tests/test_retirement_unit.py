"""Recycling and culling decided in milliseconds: the master's loop with a fake clock and a
fake launcher (tests/fakes.py), and a cull budget answered by the test."""

from __future__ import annotations

import random

from fakes import FakeClock, all_ready, live, make
from herder.supervisor.states import WorkerState


def ready_count(m) -> int:  # noqa: ANN001
    """Workers taking jobs: a retiring one still does, until it is sent `stop`."""
    return sum(w.state in (WorkerState.IDLE, WorkerState.BUSY) for w in m.workers.values())


def run_jobs(proc, n: int, failed: bool = False) -> None:  # noqa: ANN001
    if failed:
        proc.obs.jobs_failed += n
    else:
        proc.obs.jobs_ok += n


def settle(m, launcher, clock: FakeClock, passes: int = 6) -> int:  # noqa: ANN001
    """Run the loop: replacements come up, stopped workers exit. The lowest ready count seen."""
    lowest = ready_count(m)
    for _ in range(passes):
        clock.advance(0.1)
        m.step()
        for proc in launcher.spawned:
            if not proc.obs.ready and proc.code is None:
                proc.ready()
            if proc.stops and proc.code is None:
                proc.exit(0)
        lowest = min(lowest, ready_count(m))
    return lowest


def test_max_jobs_with_jitter_recycles_workers_apart_and_capacity_never_dips(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=4, max_jobs=100, max_jobs_jitter=50, recycle_share=0.25)
    m.pools["default"].retirement.rng = random.Random(7)
    m.step()
    all_ready(m)
    limits = sorted(w.jobs_limit for w in m.workers.values())
    assert len(set(limits)) > 1 and all(100 <= x <= 150 for x in limits)
    first = live(m)
    for proc in first.values():
        run_jobs(proc, 150)  # every worker is past its limit at once
    m.step()
    retiring = [w for w in m.workers.values() if w.retire_reason]
    assert len(retiring) == 1 and "max jobs" in retiring[0].retire_reason  # a quarter of 4 at a time
    assert settle(m, launcher, clock, passes=30) >= 4
    assert not set(first.values()) & set(live(m).values())  # all four recycled, one by one
    assert m.pools["default"].retirement.recycled["recycled after max jobs"] == 4
    assert all(p.code == 0 for p in first.values())  # each stopped gracefully
    assert all(s.young_deaths == 0 for s in m.slots.values())  # no backoff for a planned recycle


def test_a_worker_whose_jobs_keep_failing_is_culled_with_a_token_and_stopped_as_its_replacement_starts(
    clock: FakeClock,
) -> None:
    m, launcher, recovery = make(clock, workers=3, cull_failures=5)
    m.step()
    all_ready(m)
    bad = live(m)[1]
    run_jobs(bad, 4, failed=True)
    m.step()
    assert recovery.asked == []  # 4 failures: not yet
    run_jobs(bad, 1, failed=True)
    m.step()
    assert recovery.asked == [1]
    recovery.pending_answers = {1: True}
    spawned = len(launcher.spawned)
    m.step()
    assert m.workers[1].retire_reason.startswith("culled: 5 failed jobs")
    # Every job it took would fail: it takes no more (`stop` now), as its replacement starts.
    assert bad.stops == 1 and len(launcher.spawned) == spawned + 1
    settle(m, launcher, clock)
    assert ready_count(m) == 3
    assert bad.code == 0 and bad not in live(m).values()
    assert m.pools["default"].retirement.recycled["culled"] == 1


def test_no_token_leaves_the_worker_and_degrades_health_until_its_jobs_succeed(clock: FakeClock) -> None:
    m, _, recovery = make(clock, workers=2, cull_failures=5)
    m.step()
    all_ready(m)
    bad = live(m)[0]
    run_jobs(bad, 5, failed=True)
    m.step()
    recovery.pending_answers = {1: False}  # the cluster's budget is spent (or Redis is away)
    m.step()
    assert m.workers[0].retire_reason == "" and bad.stops == 0
    assert m.pools["default"].retirement.degraded.startswith("cull budget spent cluster-wide")
    assert not m.take_snapshot().health.ok
    clock.advance(61)  # the fault clears: no new failures, the minute passes
    m.step()
    assert m.pools["default"].retirement.degraded == ""


def test_the_local_budget_stops_culls_before_asking_redis(clock: FakeClock) -> None:
    m, _, recovery = make(clock, workers=3, cull_failures=2, cull_budget=1)
    m.step()
    all_ready(m)
    for proc in live(m).values():
        run_jobs(proc, 2, failed=True)  # a widespread fault: every worker fails
    m.step()
    assert recovery.asked == [1]  # one token locally: only one asks the cluster
    assert "on this host" in m.pools["default"].retirement.degraded
    recovery.pending_answers = {1: True}
    m.step()
    culled = [w for w in m.workers.values() if w.retire_reason]
    assert len(culled) == 1  # the others are left running


def test_one_failure_per_worker_culls_nobody(clock: FakeClock) -> None:
    """A poison job retried by RQ fails once on each worker it lands on."""
    m, _, recovery = make(clock, workers=4, cull_failures=5)
    m.step()
    all_ready(m)
    for proc in live(m).values():
        run_jobs(proc, 1, failed=True)
    for _ in range(3):
        m.step()
    assert recovery.asked == [] and not any(w.retire_reason for w in m.workers.values())


def test_memory_soft_limit_recycles_and_hard_limit_kills(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=2, max_memory=100.0)
    rss = {}
    m.pools["default"].retirement.rss_of = lambda pid: rss.get(pid, 50.0)
    m.step()
    all_ready(m)
    fat, huge = live(m)[0], live(m)[1]
    rss[fat.pid], rss[huge.pid] = 120.0, 160.0  # hard limit: 1.5 x 100 MB
    clock.advance(3)
    for proc in (fat, huge):
        proc.beat()
    m.step()
    assert "max memory" in m.workers[0].retire_reason
    assert huge.signals[:1] == [15] and "hard memory limit" in m.workers[1].kill_reason
