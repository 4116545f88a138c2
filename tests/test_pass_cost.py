"""A pass of the master's loop costs what changed, not the fleet (children/changes.py): it looks
at the workers whose lines changed, those in motion and those whose deadline has come; the
whole fleet only at a sweep. And nothing is judged later for it: a silent worker, a stop past
its timeout, a death whose line never came are all still found, on time.

Unit tests on the fakes, told what changed as the real readers tell the real registry; the
figures of a real fleet are the benchmark's (docs/benchmarks.md, "Scaling")."""

from __future__ import annotations

import signal

import pytest

from fakes import FakeClock, FakeProc, all_ready, live, make
from herder.supervisor.children.changes import SWEEP_EVERY, Changes
from herder.supervisor.children.states import WorkerState
from herder.supervisor.master import Master
from herder.supervisor.policy.pool import Pool

FLEET = 256


def settled(clock: FakeClock, n: int = FLEET, **settings: object) -> Master:
    """A master with n ready workers and a sweep just behind it."""
    m, _, _ = make(clock, changes=Changes(), workers=n, workers_limit=n, **settings)
    while len(m.workers) < n or any(w.life.state != WorkerState.IDLE for w in m.workers.values()):
        clock.t += 0.1  # spawns are paced
        all_ready(m)
    m.sweeps.ask()
    m.step()
    for proc in live(m).values():
        proc.looks = proc.exit_asked = 0  # type: ignore[attr-defined]
    return m


def looks(m: Master) -> dict[int, int]:
    return {slot: proc.looks for slot, proc in live(m).items() if proc.looks}  # type: ignore[attr-defined]


def test_a_quiet_pass_looks_at_no_worker_and_a_busy_one_at_those_that_changed(clock: FakeClock) -> None:
    m = settled(clock)
    clock.t += 0.1
    m.step()
    assert looks(m) == {}, "a pass with nothing changed looked at workers"
    procs = live(m)
    for slot in (3, 200):
        procs[slot].busy(f"job-{slot}")  # type: ignore[attr-defined]
    clock.t += 0.1
    m.step()
    assert set(looks(m)) == {3, 200}
    assert m.workers[3].life.state == WorkerState.BUSY and m.workers[200].life.state == WorkerState.BUSY
    # A sweep still looks at every worker, now and then.
    clock.t += SWEEP_EVERY
    m.step()
    assert len(looks(m)) == FLEET


def test_an_idle_fleets_seconds_between_sweeps_look_at_no_worker(clock: FakeClock) -> None:
    """The views' once-a-second sample and the advice's RSS readings (every 2 s) included: an
    idle fleet whose workers only say they are alive costs no look at any of them until the
    next sweep (or the first silence deadline: the fakes' heartbeat timeout is short)."""
    m = settled(clock, heartbeat_timeout=60.0)
    start = clock.t
    while clock.t - start < SWEEP_EVERY - 0.5:
        clock.t += 0.25
        for proc in live(m).values():
            proc.beat()  # type: ignore[attr-defined]
        m.step()
    assert looks(m) == {}, "an idle second looked at workers"


def test_a_silent_worker_is_killed_at_its_heartbeat_timeout_though_nothing_changed(clock: FakeClock) -> None:
    m = settled(clock, n=8)
    procs = live(m)
    silent = procs[5]
    killed_at = None
    start = clock.t
    while killed_at is None and clock.t - start < 3 * m.cfg.heartbeat_timeout:
        clock.t += 0.25
        for slot, proc in procs.items():
            if slot != 5:
                proc.beat()  # a sign of life, no change (an `idle` line)
        m.step()
        if signal.SIGTERM in silent.signals:  # type: ignore[attr-defined]
            killed_at = clock.t
    assert killed_at is not None, "the silent worker was never judged"
    assert killed_at - start <= m.cfg.heartbeat_timeout + 0.25 + 1e-9, killed_at - start
    assert all(not p.signals for s, p in procs.items() if s != 5)  # type: ignore[attr-defined]


def test_a_stop_past_its_timeout_is_killed_on_time(clock: FakeClock) -> None:
    # Its other deadlines far off: only the stop the master sent can bring murder back in time.
    m = settled(clock, n=8, heartbeat_timeout=60.0, job_timeout=600.0, stop_timeout=2.0)
    w = m.workers[2]
    proc: FakeProc = w.proc  # type: ignore[assignment]
    proc.busy("long")
    m.step()
    m.stop_worker(w, "test")
    sent = clock.t
    while signal.SIGTERM not in proc.signals and clock.t - sent < 3 * m.cfg.stop_timeout:
        clock.t += 0.25
        for p in live(m).values():
            p.beat()
        m.step()
    assert signal.SIGTERM in proc.signals
    assert clock.t - sent <= m.cfg.stop_timeout + 0.25 + 1e-9


def test_a_death_whose_line_never_came_is_reaped_at_its_sigchld(clock: FakeClock) -> None:
    m = settled(clock, n=8)
    proc: FakeProc = m.workers[4].proc  # type: ignore[assignment]
    proc.code = -signal.SIGKILL  # dead, and no EOF told (a change the registry never heard of)
    m.events.child_exited = True  # what the SIGCHLD handler records
    m.step()
    assert all(w.proc is not proc for w in m.workers.values()), "the dead worker was not reaped"


def busy_pass(m: Master, clock: FakeClock) -> None:
    """Every worker finishes a job and starts the next, as a busy fleet's do between passes."""
    clock.t += 0.5
    for slot, proc in live(m).items():
        proc.done()  # type: ignore[attr-defined]
        proc.busy(f"job-{slot}-{clock.t}", timeout=180)  # type: ignore[attr-defined]
    m.step()


def test_a_busy_fleets_workers_are_asked_whether_they_exited_only_once_their_stdout_closed(
    clock: FakeClock,
) -> None:
    """Each busy worker changes every pass; its exit is its stdout's EOF (or a SIGCHLD's sweep),
    so a pass asks no live worker (a waitid each) whether it exited."""
    m = settled(clock)
    busy_pass(m, clock)
    procs = live(m)
    assert sum(p.exit_asked for p in procs.values()) == 0  # type: ignore[attr-defined]
    procs[7].exit(-signal.SIGKILL)  # type: ignore[attr-defined]
    busy_pass(m, clock)
    assert m.workers[7].proc is not procs[7], "the worker whose stdout closed was not reaped"
    assert sum(p.exit_asked for p in procs.values()) == 1  # type: ignore[attr-defined]


def test_a_busy_fleets_workers_are_judged_only_when_a_deadline_comes(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new job moves a worker's deadlines, which murder arms again; it asks for a verdict only
    once one could be due (liveness.next_verdict_at), as a silent worker's shows."""
    from herder.supervisor.policy import murder

    m = settled(clock)
    judged: list[int] = []
    real = murder.judge
    monkeypatch.setattr(murder, "judge", lambda w, *rest: judged.append(w.slot) or real(w, *rest))
    busy_pass(m, clock)
    busy_pass(m, clock)
    assert judged == [], "workers with no deadline come were judged"
    silent = live(m)[9]
    until = clock.t + m.cfg.heartbeat_timeout + 1
    while clock.t < until and m.workers[9].proc is silent:
        for proc in live(m).values():
            if proc is not silent:
                proc.beat()  # type: ignore[attr-defined]
        clock.t += 0.25
        m.step()
    assert 9 in judged and signal.SIGTERM in silent.signals  # type: ignore[attr-defined]


def test_a_busy_pass_counts_the_recycles_under_way_only_when_one_is_due(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The room for recycles (a walk of the pool) is counted when a worker's recycle is due,
    not for every pass that a worker changed in."""
    from herder.supervisor.children.fleet import Worker

    m = settled(clock, max_jobs=3, max_jobs_jitter=0)
    walked: list[int] = []
    real = Worker.recycling
    monkeypatch.setattr(Worker, "recycling", property(lambda w: walked.append(w.slot) or real.fget(w)))
    busy_pass(m, clock)
    assert walked == [], "a pass with no recycle due walked the pool"
    busy_pass(m, clock)
    busy_pass(m, clock)  # the third job done: every worker is due
    assert walked, "recycles were planned without counting those under way"
    assert any(w.limits.retire is not None for w in m.workers.values())


def test_a_pass_where_a_few_of_a_big_fleets_workers_change_walks_no_pool(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers of 256 take jobs and finish them, pass after pass, ms apart: neither the
    pool's plan nor the retirement review lists the pool's workers (a walk of 256, each pass).
    The views' once-a-second sample may fall among them: one walk at most."""
    m = settled(clock)
    walks: list[int] = []
    real = Pool.live
    monkeypatch.setattr(Pool, "live", lambda self: walks.append(1) or real(self))
    procs = live(m)
    for turn in range(6):
        clock.t += 0.005
        for slot in (3, 200):
            if turn % 2:
                procs[slot].done()  # type: ignore[attr-defined]
            else:
                procs[slot].busy(f"job-{slot}-{turn}")  # type: ignore[attr-defined]
        m.step()
        assert m.workers[3].life.state == (WorkerState.IDLE if turn % 2 else WorkerState.BUSY)
    assert len(walks) <= 1, f"{len(walks)} walks of the pool in 6 passes"


def test_a_still_pool_is_planned_again_only_when_what_its_plan_reads_moved(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = settled(clock, n=16)
    pool = m.pools["default"]
    plans: list[int] = []
    real = Pool.plan
    monkeypatch.setattr(Pool, "plan", lambda self, share, now: plans.append(1) or real(self, share, now))
    clock.t += 0.1
    m.step()
    assert plans == [], "a still pool with nothing changed was planned again"
    procs = live(m)
    for slot, proc in procs.items():  # every worker takes a job: idle to busy
        proc.busy(f"job-{slot}")  # type: ignore[attr-defined]
    clock.t += 0.1
    m.step()
    assert all(w.life.state == WorkerState.BUSY for w in m.workers.values())
    assert plans == [], "a move between idle and busy planned a pool at its target again"
    pool.target = 15  # as the autoscaler or `herder scale` sets it
    clock.t += 0.1
    m.step()
    assert len(plans) == 1, "a new target did not plan the pool"
    assert not any(w.life.state == WorkerState.STOPPING for w in m.workers.values()), "a busy worker stopped"
    # The scale-down waits for an idle worker: its plan told idle from busy, so a worker that
    # finishes its job plans the pool again, and that worker goes.
    procs[5].done()  # type: ignore[attr-defined]
    clock.t += 0.1
    m.step()
    assert len(plans) == 2
    assert [w.slot for w in m.workers.values() if w.life.state == WorkerState.STOPPING] == [5]
