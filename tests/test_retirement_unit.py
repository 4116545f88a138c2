"""Recycling and culling decided in milliseconds: the master's loop with a fake clock and a
fake launcher (tests/fakes.py), and a cull budget answered by the test."""

from __future__ import annotations

import random

from fakes import FakeClock, all_ready, live, make
from herder.common import worker_protocol as wp
from herder.supervisor.children.states import WorkerState


def ready_count(m) -> int:  # noqa: ANN001
    """Workers taking jobs: a retiring one still does, until it is sent `stop`."""
    return sum(w.life.state in (WorkerState.IDLE, WorkerState.BUSY) for w in m.workers.values())


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
    limits = sorted(w.limits.jobs for w in m.workers.values())
    assert len(set(limits)) > 1 and all(100 <= x <= 150 for x in limits)
    first = live(m)
    for proc in first.values():
        run_jobs(proc, 150)  # every worker is past its limit at once
    m.step()
    retiring = [w for w in m.workers.values() if w.limits.retire_reason]
    assert len(retiring) == 1 and "max jobs" in retiring[0].limits.retire_reason  # a quarter of 4 at a time
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
    assert m.workers[1].limits.retire_reason.startswith("culled: 5 failed jobs")
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
    assert m.workers[0].limits.retire_reason == "" and bad.stops == 0
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
    culled = [w for w in m.workers.values() if w.limits.retire_reason]
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
    assert recovery.asked == [] and not any(w.limits.retire_reason for w in m.workers.values())


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
    assert "max memory" in m.workers[0].limits.retire_reason
    assert huge.signals[:1] == [15] and "hard memory limit" in m.workers[1].life.kill_reason


def test_each_worker_is_told_its_own_jobs_limit_and_no_other(clock: FakeClock, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv(wp.ENV_JOBS_LIMIT, "7")  # the master's own environment never leaks through
    m, launcher, _ = make(clock, workers=4, max_jobs=100, max_jobs_jitter=50)
    m.step()
    told = {w.pid: w.proc.env.get(wp.ENV_JOBS_LIMIT) for w in m.workers.values()}  # type: ignore[attr-defined]
    assert told == {w.pid: str(w.limits.jobs) for w in m.workers.values()}
    assert {wp.jobs_limit(p.env) for p in launcher.spawned} == {w.limits.jobs for w in m.workers.values()}
    m, launcher, _ = make(clock, workers=1)  # no max_jobs: no limit
    m.step()
    assert wp.ENV_JOBS_LIMIT not in launcher.spawned[0].env


def test_a_worker_is_replaced_ahead_of_its_jobs_limit_and_stopped_only_at_it(clock: FakeClock) -> None:
    """From its job rate: its replacement is ready by the time it reaches its limit, and it works
    on to its limit (it stops taking jobs there itself) before it is sent `stop`."""
    m, launcher, _ = make(clock, workers=2, max_jobs=100)
    m.step()
    all_ready(m)
    fast, slow = live(m)[0], live(m)[1]
    lowest = 2
    for _ in range(7):  # 10 jobs a second: 70 done, the limit 3 s away: not yet
        clock.advance(1.0)
        for proc in (fast, slow):
            run_jobs(proc, 10 if proc is fast else 2)
            proc.busy("j")
        m.step()
        for proc in launcher.spawned[2:]:
            proc.ready()
        lowest = min(lowest, ready_count(m))
    assert not m.workers[0].retiring and len(launcher.spawned) == 2
    clock.advance(1.0)
    run_jobs(fast, 20)  # 90: the 10 left take less than a replacement's start (1.5 s so far) and a look
    fast.busy("j")
    slow.beat()
    m.step()
    assert "91 jobs taken of its limit of 100" in m.workers[0].limits.retire_reason  # 90 done, 1 running
    (new,) = launcher.spawned[2:]
    new.ready()
    clock.advance(0.5)
    run_jobs(fast, 5)
    fast.busy("j")
    m.step()
    assert fast.stops == 0 and fast.retires == 0  # ready beside it, but it still takes jobs
    run_jobs(fast, 5)  # at its limit the worker stops taking jobs, and says so
    fast.obs.jobs.clear()
    fast.obs.paused = wp.RETIRING
    m.step()
    assert fast.stops == 1 and slow.stops == 0
    assert lowest == 2 and ready_count(m) >= 2


def test_an_early_replaced_worker_with_no_more_jobs_goes_once_its_replacement_is_ready(
    clock: FakeClock,
) -> None:
    m, launcher, _ = make(clock, workers=1, max_jobs=100)
    m.step()
    all_ready(m)
    (proc,) = live(m).values()
    for _ in range(9):
        clock.advance(1.0)
        run_jobs(proc, 10)
        proc.done()  # its last job a moment ago
        m.step()
    assert m.workers[0].retiring
    launcher.spawned[-1].ready()
    m.step()
    assert proc.stops == 0  # its last job a moment ago: it works on
    clock.advance(1.5)  # the queue ran dry: no job since
    proc.beat()
    m.step()
    assert proc.stops == 1


def test_workers_at_their_limit_are_all_replaced_whatever_the_recycle_share(clock: FakeClock) -> None:
    """The recycle share paces replacements started ahead; one that takes no more jobs is no
    capacity, and its replacement starts at once."""
    m, launcher, _ = make(clock, workers=4, max_jobs=50, recycle_share=0.1)
    m.step()
    all_ready(m)
    at_limit = [live(m)[0], live(m)[1], live(m)[2]]
    for proc in at_limit:
        run_jobs(proc, 50)
        proc.obs.paused = wp.RETIRING
    m.step()
    assert sum(w.retiring for w in m.workers.values()) == 3
    assert len(launcher.spawned) == 4 + 1  # one beyond the target at a time (a quarter of 4)
    for proc in launcher.spawned[4:]:
        proc.ready()
    m.step()
    assert sum(p.stops for p in at_limit) == 1  # one replaced; the next replacement starts as it exits


def test_past_max_memory_the_worker_is_told_at_once_to_take_no_more_jobs(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=1, max_memory=100.0)
    rss = {}
    m.pools["default"].retirement.rss_of = lambda pid: rss.get(pid, 50.0)
    m.step()
    all_ready(m)
    (fat,) = live(m).values()
    fat.busy("j")
    rss[fat.pid] = 120.0
    clock.advance(3)
    fat.beat()
    m.step()
    assert "max memory" in m.workers[0].limits.retire_reason
    assert fat.retires == 1 and fat.stops == 0  # no more jobs now; `stop` once replaced
    m.step()
    assert fat.retires == 1  # once
    launcher.spawned[-1].ready()
    m.step()
    assert fat.stops == 1


def test_a_worker_says_when_it_takes_no_more_jobs_and_status_shows_it(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=1, max_jobs=10)
    m.step()
    all_ready(m)
    (proc,) = live(m).values()
    run_jobs(proc, 10)
    proc.obs.paused = wp.RETIRING
    m.step()
    (row,) = [r for r in m.take_snapshot().workers if r.pid == proc.pid]
    assert (row.paused, row.jobs_limit) == ("retiring", 10)
    assert row.retiring == "recycled after max jobs: 10 jobs done (limit 10)"


def test_a_worker_that_took_its_last_long_job_is_replaced_while_it_runs_it(clock: FakeClock) -> None:
    """Jobs of a minute: no rate foretells the limit, but the job it runs is its last (the
    worker counts the jobs it takes), so its replacement starts now, not after that minute."""
    m, launcher, _ = make(clock, workers=1, max_jobs=5, job_timeout=300.0)
    m.step()
    all_ready(m)
    (proc,) = live(m).values()
    for job in ("first", "second", "third", "fourth"):
        if job != "first":
            proc.done()
        proc.busy(job)
        for _ in range(60):  # a minute, its beat going on
            clock.advance(1)
            proc.beat()
            m.step()
    assert not m.workers[0].retiring  # 4 taken of 5, the next a minute away
    proc.done()
    proc.busy("fifth")
    m.step()
    assert "5 jobs taken of its limit of 5" in m.workers[0].limits.retire_reason
    assert len(launcher.spawned) == 2
    launcher.spawned[1].ready()
    clock.advance(30)
    proc.beat()
    m.step()
    assert proc.stops == 0  # it runs its last job: stopped at its end, when it says `retiring`
