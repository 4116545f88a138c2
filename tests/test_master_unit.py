"""The master's decisions in milliseconds: the reconcile loop driven with a fake clock and a
fake process launcher (gunicorn's arbiter tests and supervisord's options object are the
models). The end-to-end tests run the same loop on real processes; these pin the rules.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import replace

import pytest

from fakes import SHORT_TIMEOUT_CONFIG, FakeClock, FakeProc, all_ready, live, make
from herder.common.worker_protocol import parse_line, wait_line
from herder.supervisor.children import fleet, pipes
from herder.supervisor.children.dispatchers import StdoutReader
from herder.supervisor.children.fleet import Life, Worker
from herder.supervisor.children.observations import Held, Observations, record, wait_to_log
from herder.supervisor.children.states import (
    TRANSITIONS,
    Cull,
    IllegalTransition,
    KillKind,
    MasterPhase,
    WorkerState,
    change_cull,
    change_state,
)
from herder.supervisor.control import reload
from herder.supervisor.master import TICK, TICK_IN_MOTION, Master
from herder.supervisor.policy.liveness import EOF_GRACE, derived_state, judge, next_verdict_at
from herder.supervisor.policy.pool import PoolState
from herder.supervisor.policy.scaling import Load
from herder.supervisor.redis_side.load_reader import Reading

# ---- spawn, ready, reap ----------------------------------------------------------------------


def test_spawns_the_target_and_marks_ready_workers_idle(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=3)
    m.step()
    assert len(launcher.spawned) == 3
    assert {w.life.state for w in m.workers.values()} == {WorkerState.STARTING}
    all_ready(m)
    assert {w.life.state for w in m.workers.values()} == {WorkerState.IDLE}
    launcher.spawned[0].busy("job-1")
    m.step()
    assert m.workers[0].life.state == WorkerState.BUSY


def test_spawns_wait_for_a_warming_fork_server_and_the_loop_comes_back_soon(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=3)
    launcher.warm = True
    m.step()
    assert launcher.spawned == [] and m.spawner.pending
    assert m.next_wait() == fleet.SPAWN_AGAIN  # not a whole tick: the template is moments away
    launcher.warm = False
    m.step()
    assert len(launcher.spawned) == 3 and not m.spawner.pending


def test_a_worker_that_dies_mid_job_is_replaced_at_once_and_its_job_requeued(clock: FakeClock) -> None:
    m, launcher, recovery = make(clock)
    m.step()
    all_ready(m)
    clock.advance(2)  # lived past min_uptime: no backoff
    victim = live(m)[1]
    victim.busy("job-7")
    m.step()
    victim.exit(-signal.SIGKILL)
    m.step()
    assert recovery.requeues == [("job-7", "worker died (killed by SIGKILL) while running the job")]
    assert recovery.forgotten == [f"herder.{m.reaper.hostname}.1.{victim.pid}"]
    assert live(m)[1] is launcher.spawned[-1] and len(launcher.spawned) == 3
    assert m.counters.totals.exited == 1


def test_a_slot_whose_workers_die_young_backs_off_exponentially(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=1, backoff_initial=0.1, backoff_max=1.0)
    emitted: list[tuple[str, dict]] = []
    m.hooks.emit = lambda event, **fields: emitted.append((event, fields))  # type: ignore[method-assign]
    m.step()
    delays = []
    for _ in range(6):
        launcher.spawned[-1].exit(1)  # before `ready`: died young
        m.step()
        slot = m.slots[0]
        delays.append(round(slot.next_spawn_at - clock.t, 3))
        assert 0 not in m.workers  # not respawned before its time
        assert m.next_wait() == pytest.approx(min(TICK_IN_MOTION, delays[-1]))
        clock.advance(delays[-1])
        m.step()
        assert 0 in m.workers
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    # Six deaths in a row, `worker_died` at the 1st, 2nd and 4th: a crash loop is a few events.
    died = [f for e, f in emitted if e == "worker_died"]
    assert [f["deaths_in_a_row"] for f in died] == [1, 2, 4] and died[0]["exit_code"] == 1
    # A worker that lives past min_uptime resets the slot.
    launcher.spawned[-1].ready()
    clock.advance(2)
    m.step()
    launcher.spawned[-1].exit(1)
    m.step()
    assert m.slots[0].young_deaths == 0 and 0 in m.workers


def test_a_launcher_that_cannot_spawn_backs_off_too(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=1)
    launcher.fail = True
    m.step()
    assert not m.workers and m.slots[0].in_backoff(clock.t)


# ---- murder: the unresponsive ------------------------------------------------------------------


def test_a_silent_worker_gets_sigterm_then_sigkill_after_the_kill_timeout(clock: FakeClock) -> None:
    m, _, recovery = make(clock, workers=1)
    m.step()
    proc = live(m)[0]
    proc.ready()
    proc.busy("job-1")
    proc.obeys_term = False  # frozen: SIGTERM does nothing
    m.step()
    clock.advance(3.5)  # past the 3 s heartbeat timeout
    m.step()
    assert proc.signals == [signal.SIGTERM, signal.SIGCONT]
    assert m.workers[0].life.state == WorkerState.KILLING
    clock.advance(1.0)  # the kill timeout
    m.step()
    assert proc.signals[-1] == signal.SIGKILL
    m.step()
    assert recovery.requeues == [
        ("job-1", "killed by herder: silent for 3.5 s (heartbeat timeout 3 s) while running the job")
    ]


def test_a_worker_whose_lines_wait_unread_is_not_silent(clock: FakeClock) -> None:
    # A master starved of CPU by its busy fleet reads late: the lines are in the pipe.
    m, _, _ = make(clock, workers=1)
    m.step()
    proc = live(m)[0]
    proc.ready()
    m.step()
    proc.pending = 120  # `beat` lines written, not yet read by the master's reader
    clock.advance(3.5)  # past the 3 s heartbeat timeout, as the master's reads go
    m.step()
    assert proc.signals == [] and m.workers[0].life.state != WorkerState.KILLING
    assert m.murderer.lagging_reads == 1
    proc.pending = 0  # read, and still nothing new: now it is silent
    m.step()
    assert proc.signals == [signal.SIGTERM, signal.SIGCONT]


def test_a_start_whose_ready_waits_unread_is_not_killed(clock: FakeClock) -> None:
    # Its `ready` sits in the pipe of a master short of CPU: the start was not hung.
    m, _, _ = make(clock, workers=1)
    m.step()
    proc = live(m)[0]
    proc.pending = 40  # `ready` written, not yet read
    clock.advance(11)  # past the 10 s start timeout, as the master's reads go
    m.step()
    assert proc.signals == [] and m.workers[0].life.state == WorkerState.STARTING
    proc.pending = 0  # read, and no `ready` among them: now it is a hung start
    m.step()
    assert proc.signals == [signal.SIGTERM, signal.SIGCONT]


def test_the_kill_budget_spares_half_the_fleet_and_health_recovers(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=4, kill_budget=0.5)
    m.step()
    all_ready(m)
    for proc in live(m).values():
        proc.obeys_term = False
    clock.advance(4)  # every worker silent: a widespread fault
    m.step()
    killing = [w for w in m.workers.values() if w.life.state == WorkerState.KILLING]
    spared = [w for w in m.workers.values() if w.spared]
    assert len(killing) == 2 and len(spared) == 2
    assert m.guard.degraded.startswith("kill budget spent on this host")
    for w in spared:
        w.proc.beat()  # type: ignore[attr-defined]
    m.step()
    assert m.guard.degraded == ""


def test_a_job_past_its_own_timeout_is_killed_even_with_the_budget_spent(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=1, kill_budget=0.01)
    assert m.guard.budget.take(1, now=clock.wall())  # the one token this window is gone
    m.step()
    proc = live(m)[0]
    proc.ready()
    proc.busy("slow", timeout=5)
    for _ in range(7):  # beats keep coming: alive, just slow
        clock.advance(1)
        proc.beat()
        m.step()
    assert m.workers[0].life.state == WorkerState.KILLING
    assert m.workers[0].life.kill_reason == "busy 2 s past its 5 s timeout"


# ---- stop, scale down, rolling restart ---------------------------------------------------------


def test_a_graceful_stop_lets_jobs_finish_and_kills_only_past_the_stop_timeout(clock: FakeClock) -> None:
    m, _, recovery = make(clock, workers=2, stop_timeout=5.0)
    m.step()
    all_ready(m)
    quick, slow = live(m)[0], live(m)[1]
    slow.busy("long-job")
    m.step()
    m.events.record(signal.SIGTERM)
    m.step()
    assert quick.stops == 1 and slow.stops == 1
    quick.exit(0)
    m.step()
    assert 0 not in m.workers and recovery.requeues == []
    for _ in range(5):
        clock.advance(1)
        slow.beat()
        m.step()
    assert m.workers[1].life.state == WorkerState.STOPPING
    clock.advance(1)
    slow.beat()
    m.step()
    assert m.workers[1].life.state == WorkerState.KILLING
    m.step()
    assert not m.workers
    assert recovery.requeues == [
        (
            "long-job",
            "killed by herder: still running 5 s after `stop`, job long-job still running"
            " while running the job",
        )
    ]


def test_the_loop_ends_as_the_last_worker_exits_without_waiting_a_tick(clock: FakeClock) -> None:
    """A stop ends the pass in which the last worker is reaped: the loop does not sleep out a
    tick first (an idle pool's stop took up to 0.25 s longer)."""
    m, _, _ = make(clock, workers=2, scheduler=False)
    m.events.install_signals = lambda: None  # type: ignore[method-assign]
    m.step()
    all_ready(m)
    waits: list[float] = []

    def wait(seconds: float) -> None:  # each pass ends here; the test acts between passes
        waits.append(seconds)
        if len(waits) == 1:
            m.events.record(signal.SIGTERM)
        elif len(waits) == 2:
            assert all(p.stops == 1 for p in live(m).values())
            for p in live(m).values():
                p.exit(0)  # they obey `stop`
        else:
            raise AssertionError("the loop waited after the last worker exited")

    m.events.wait = wait  # type: ignore[method-assign]
    assert m.run() == 0
    assert not m.workers and len(waits) == 2


def test_scale_down_stops_only_idle_workers(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=3)
    m.step()
    all_ready(m)
    for proc in live(m).values():
        proc.busy("j")
    m.step()
    m.commands.rescale({"workers": 1})
    m.step()
    assert all(p.stops == 0 for p in live(m).values())  # all busy: nobody is stopped
    live(m)[2].done()
    m.step()
    assert [s for s, p in live(m).items() if p.stops] == [2]


def test_a_rolling_restart_starts_replacements_before_it_stops_anyone(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=4)
    m.step()
    all_ready(m)
    old = set(live(m).values())
    m.commands.restart("test")
    lowest_ready = 4
    for _ in range(20):
        m.step()
        for proc in launcher.spawned:
            if proc not in old and not proc.obs.ready:
                proc.ready()  # replacements come up one pass after they are spawned
        for proc in old:
            if proc.stops and proc.code is None:
                proc.exit(0)
        ready = sum(w.life.state in (WorkerState.IDLE, WorkerState.BUSY) for w in m.workers.values())
        lowest_ready = min(lowest_ready, ready)
    assert not old & set(live(m).values())  # every old worker replaced
    assert lowest_ready >= 4  # and capacity never dipped
    assert len(m.workers) == 4


# ---- pure parts ------------------------------------------------------------------------------


def worker(state: WorkerState = WorkerState.IDLE, spawned_at: float = 0.0) -> Worker:
    return Worker(0, FakeProc(1, FakeClock()), spawned_at=spawned_at, life=Life(state=state))


def test_judge_eof_start_timeout_and_waiting_for_redis() -> None:
    cfg = SHORT_TIMEOUT_CONFIG
    w = worker(WorkerState.STARTING)
    quiet = Observations(last_seen=0.0)
    assert judge(w, quiet, cfg.start_timeout - 0.1, cfg) is None
    verdict = judge(w, quiet, cfg.start_timeout + 0.1, cfg)
    assert verdict and verdict.judged_hung and "start timeout" in verdict.reason
    waiting = Observations(last_seen=5.0)  # `idle` before `ready`: judged by silence instead
    assert judge(w, waiting, 5.0 + cfg.heartbeat_timeout - 0.1, cfg) is None
    assert judge(w, waiting, 5.0 + cfg.heartbeat_timeout + 0.1, cfg)
    eof = Observations(last_seen=0.0, ready=True, stdout_eof=True, eof_at=10.0)
    assert judge(worker(), eof, 10.0 + EOF_GRACE - 0.1, cfg) is None
    assert judge(worker(), eof, 10.0 + EOF_GRACE + 0.1, cfg)


def test_a_wait_is_recorded_until_the_worker_works_and_a_kill_names_it() -> None:
    cfg = SHORT_TIMEOUT_CONFIG
    o, finished = Observations(last_seen=0.0), deque()
    refused = parse_line(wait_line(100.0, 4.0, "Redis at r:16390: connection refused")[:-1])
    record(o, finished, refused, now=10.0)
    assert o.waiting and o.waiting.what == "Redis at r:16390: connection refused" and o.waiting.since == 6.0
    assert wait_to_log(o) == "Redis at r:16390: connection refused"
    record(o, finished, refused, now=11.0)
    assert wait_to_log(o) is None  # the same wait again: logged once
    # Silent past the heartbeat timeout while it waited: the kill says what it waited for.
    verdict = judge(worker(WorkerState.STARTING), o, 11.0 + cfg.heartbeat_timeout + 0.1, cfg)
    assert verdict and verdict.reason == (
        f"silent for {cfg.heartbeat_timeout + 0.1:.1f} s before `ready` (limit {cfg.heartbeat_timeout:g} s); "
        f"it was waiting {4.1 + cfg.heartbeat_timeout:.0f} s for Redis at r:16390: connection refused"
    )  # since 7.0: its last line said 4 s at 11.0
    record(o, finished, parse_line(wait_line(101.0, 5.0, "Redis: name resolution of r timed out")[:-1]), 12.0)
    assert wait_to_log(o) == "Redis: name resolution of r timed out"  # a new cause: logged
    record(o, finished, parse_line(b"idle 102.0"), 13.0)
    assert o.waiting is None  # it works (or waits for work) again
    record(o, finished, parse_line(b"ready 1 103.0 9"), 14.0)
    assert o.waiting is None and o.wait_logged is None
    # Never a wait at all: the start timeout's reason as before.
    verdict = judge(worker(WorkerState.STARTING), Observations(last_seen=0.0), cfg.start_timeout + 0.1, cfg)
    assert verdict and verdict.reason == f"no `ready` within the start timeout of {cfg.start_timeout:g} s"


class ReadOnly:
    """The stdout reader's view of a worker (dispatchers.Piped), with no process behind it."""

    label = "slot 0 pid 1"
    stdout = stderr = None

    def __init__(self) -> None:
        self.obs, self.lock, self.finished = Observations(last_seen=0.0), threading.Lock(), deque()

    @contextlib.contextmanager
    def changing(self) -> Iterator[Observations]:
        with self.lock:
            yield self.obs

    def json_fields(self) -> dict[str, object]:
        return {}


def test_a_worker_whose_ready_names_an_unknown_version_is_killed_at_the_start_timeout() -> None:
    """docs/protocol.md, "Versioning": the master refuses a version it does not know, and the
    worker, never ready, is killed at the start timeout, however long it goes on heartbeating."""
    cfg = SHORT_TIMEOUT_CONFIG
    proc = ReadOnly()
    reader = StdoutReader(proc, lambda: None)
    reader.feed(b"ready 1 100.0 99\nidle 100.5\n", now=0.0)
    assert proc.obs.malformed == 1
    w = worker(WorkerState.STARTING)
    proc.obs.last_seen = cfg.start_timeout - 1.0  # still heartbeating, just before the deadline
    assert judge(w, proc.obs, cfg.start_timeout - 0.1, cfg) is None
    verdict = judge(w, proc.obs, cfg.start_timeout + 0.1, cfg)
    assert verdict and verdict.kind == KillKind.NO_READY
    assert "unsupported protocol version '99'" in verdict.reason
    assert next_verdict_at(w, proc.obs, cfg) == cfg.start_timeout


def test_derived_state_follows_the_worker_unless_the_master_decided() -> None:
    busy = Observations(last_seen=0.0, ready=True, jobs={0: Held("j", 0.0)})
    assert derived_state(worker(WorkerState.STARTING), busy) == WorkerState.BUSY
    assert derived_state(worker(WorkerState.STOPPING), busy) == WorkerState.STOPPING
    assert derived_state(worker(WorkerState.STARTING), Observations(last_seen=0.0)) == WorkerState.STARTING


def test_the_transition_table_is_enforced() -> None:
    w = worker(WorkerState.KILLING)
    with pytest.raises(IllegalTransition):
        change_state(w, WorkerState.IDLE, "a bug")
    change_state(w, WorkerState.EXITED, "reaped")
    assert TRANSITIONS[WorkerState.EXITED] == frozenset()
    assert all(WorkerState.EXITED in targets for s, targets in TRANSITIONS.items() if s != WorkerState.EXITED)
    assert all(
        WorkerState.KILLING in TRANSITIONS[s]
        for s in (WorkerState.STARTING, WorkerState.IDLE, WorkerState.BUSY, WorkerState.STOPPING)
    )


def test_one_ctrl_c_delivered_twice_is_one_and_a_later_one_hurries(clock: FakeClock) -> None:
    m, _, _ = make(clock)
    m.events.record(signal.SIGINT)
    m.events.record(signal.SIGINT)
    requests = m.events.requests()
    assert [(r.action, r.hurry) for r in requests] == [("stop", False)]
    clock.advance(2)
    m.events.record(signal.SIGINT)
    assert [(r.action, r.hurry) for r in m.events.requests()] == [("stop", True)]


# ---- the workers limit and spawn pacing --------------------------------------------------------


@pytest.fixture
def window(monkeypatch: pytest.MonkeyPatch) -> int:
    """The start window, fixed so these tests do not depend on the host's CPU count."""
    monkeypatch.setattr(fleet, "START_WINDOW", 8)
    return 8


def fleet_up(m: Master) -> None:
    """Steps until the whole target is spawned and ready (spawns are paced)."""
    for _ in range(20):
        m.step()
        all_ready(m)
        if len(m.workers) == m.target and all(w.life.state == WorkerState.IDLE for w in m.workers.values()):
            return
    raise AssertionError("the fleet did not come up")


def loading_count(m: Master) -> int:
    return sum(w.life.state == WorkerState.STARTING for w in m.workers.values())


def test_a_big_scale_up_is_paced_and_the_loop_comes_back_soon(clock: FakeClock, window: int) -> None:
    m, launcher, _ = make(clock, workers=1, workers_limit=40)
    m.step()
    all_ready(m)
    assert m.commands.rescale({"workers": 40})["ok"]
    m.step()
    assert len(launcher.spawned) == 1 + fleet.SPAWNS_PER_PASS  # a few per pass, not 39 at once
    assert m.next_wait() == fleet.SPAWN_AGAIN  # and the next pass comes soon
    m.step()
    assert loading_count(m) == window  # the start window is full
    m.step()
    assert loading_count(m) == window and m.next_wait() == TICK_IN_MOTION  # nothing to do until one speaks
    peak = 0
    for _ in range(40):
        for proc in launcher.spawned[-3:]:
            proc.ready()  # three of the loading workers come up each pass
        m.step()
        peak = max(peak, loading_count(m))
    assert len(m.workers) == 40 == len(launcher.spawned)
    assert peak <= window
    assert m.next_wait() == TICK_IN_MOTION  # workers still start: the loop keeps the fast tick


def test_a_settled_fleet_ticks_slowly_and_a_start_or_stop_quickly(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads every worker: a settled fleet's loop looks once a second (gunicorn's and
    supervisord's tick); while a worker starts or stops, four times a second. Each pass tells
    the pipe hub which (a settled loop's quiet lines are read in fewer batches), and how long a
    quiet fleet's pipes may go unread (a quarter of its heartbeat_timeout)."""
    told: list[bool] = []
    longs: list[float | None] = []

    def settle(settled: bool, long: float | None = None) -> None:
        told.append(settled)
        longs.append(long)

    monkeypatch.setattr(pipes, "settle", settle)
    m, launcher, _ = make(clock, workers=3)
    m.step()
    assert m.next_wait() == TICK_IN_MOTION and told[-1] is False  # three workers starting
    all_ready(m)
    assert m.next_wait() == TICK == 1.0 and told[-1] is True
    assert longs[-1] == min(pipes.LONG_PAUSE_MAX, m.cfg.heartbeat_timeout / 4)
    m.workers[0].proc.busy("job-1")  # type: ignore[attr-defined]
    m.step()
    assert m.next_wait() == TICK and told[-1] is True  # a busy worker is settled too
    m.stop_worker(m.workers[1], "test")
    assert m.next_wait() == TICK_IN_MOTION  # its stop timeout is a deadline kept to the quarter second
    launcher.spawned[1].exit(0)
    m.step()  # reaped; its replacement starts
    assert m.next_wait() == TICK_IN_MOTION and told[-1] is False
    all_ready(m)
    assert m.next_wait() == TICK and told[-1] is True
    m.begin_stop(hurry=False, why="test")
    assert m.next_wait() == TICK_IN_MOTION  # a stopping master


def test_a_worker_that_speaks_before_ready_no_longer_holds_the_start_window(
    clock: FakeClock, window: int
) -> None:
    m, launcher, _ = make(clock, workers=20, workers_limit=20)
    m.step()
    m.step()
    assert len(launcher.spawned) == window
    clock.advance(0.5)
    for proc in launcher.spawned:
        proc.beat()  # `idle` before `ready`: loaded, and waiting for Redis
    m.step()
    assert len(launcher.spawned) == window + fleet.SPAWNS_PER_PASS


def test_a_pass_spends_at_most_a_slice_of_time_spawning(clock: FakeClock, window: int) -> None:
    m, launcher, _ = make(clock, workers=1, workers_limit=20)
    m.step()
    all_ready(m)
    slow = launcher.spawn

    def spawn_slowly(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        clock.advance(0.06)  # the host is busy: each spawn takes 60 ms of wall time
        return slow(*args, **kwargs)

    launcher.spawn = spawn_slowly  # type: ignore[method-assign]
    m.commands.rescale({"workers": 5})
    m.step()
    assert len(launcher.spawned) == 1 + 2  # 0.1 s of spawning, then the rest of the loop
    assert m.spawner.pending


def test_scale_past_the_workers_limit_is_refused_and_changes_nothing(clock: FakeClock) -> None:
    m, launcher, _ = make(clock, workers=2, workers_limit=8)
    m.step()
    reply = m.commands.rescale({"workers": 100000})
    assert not reply["ok"] and "workers limit of 8" in reply["error"]
    assert m.target == 2 and m.cfg.workers == 2
    m.step()
    assert len(launcher.spawned) == 2
    auto, _, _ = make(clock, max_workers=4, workers_limit=8)
    reply = auto.commands.rescale({"min": 1, "max": 9})
    assert not reply["ok"] and "workers limit of 8" in reply["error"] and auto.cfg.max_workers == 4


def test_stopping_workers_count_towards_the_limit(clock: FakeClock, window: int) -> None:
    m, launcher, _ = make(clock, workers=8, workers_limit=8)
    fleet_up(m)
    for proc in launcher.spawned[:4]:
        proc.busy("long")
    m.step()
    # A lower limit (a reload): the idle half is stopped; those still finish up meanwhile.
    reload.apply(m, replace(m.cfg, workers=4, workers_limit=4))
    m.step()
    assert sorted(w.slot for w in m.workers.values() if w.life.state == WorkerState.STOPPING) == [4, 5, 6, 7]
    clock.advance(2)
    for proc in launcher.spawned[:4]:
        proc.exit(-signal.SIGKILL)  # the busy half dies: four slots free, four processes left
    for _ in range(3):
        m.step()
    assert len(launcher.spawned) == 8 and len(m.workers) == 4  # no room until the stopping ones exit
    for proc in launcher.spawned[4:6]:
        proc.exit(0)
    m.step()
    assert len(launcher.spawned) == 10 and len(m.workers) == 4


def test_a_stop_in_the_middle_of_a_burst_spawns_no_more(clock: FakeClock, window: int) -> None:
    m, launcher, _ = make(clock, workers=1, workers_limit=40)
    m.step()
    all_ready(m)
    m.commands.rescale({"workers": 40})
    m.step()
    spawned = len(launcher.spawned)
    m.events.record(signal.SIGTERM)
    m.step()
    assert len(launcher.spawned) == spawned  # the stop came first
    assert all(p.stops == 1 for p in launcher.spawned) and not m.spawner.pending
    for proc in launcher.spawned:
        proc.exit(0)
    m.step()
    assert not m.workers


def test_a_rolling_restart_at_the_workers_limit_makes_room_one_at_a_time(
    clock: FakeClock, window: int
) -> None:
    m, launcher, _ = make(clock, workers=4, workers_limit=4)
    m.step()
    all_ready(m)
    old = set(launcher.spawned)
    m.commands.restart("test")
    lowest_ready = 4
    passes_seen: dict[FakeProc, int] = {}
    for _ in range(40):
        m.step()
        assert len(m.workers) <= 4
        for proc in set(launcher.spawned) - old:
            passes_seen[proc] = passes_seen.get(proc, 0) + 1
            if passes_seen[proc] == 2:
                proc.ready()  # a replacement needs two passes to come up
        for proc in old:
            if proc.stops and proc.code is None:
                proc.exit(0)
        ready = sum(w.life.state in (WorkerState.IDLE, WorkerState.BUSY) for w in m.workers.values())
        lowest_ready = min(lowest_ready, ready)
    assert not old & set(live(m).values())  # every old worker replaced
    assert lowest_ready >= 3  # at the limit capacity dips by one worker at most


def test_each_event_of_a_worker_is_logged_once_with_its_reason(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """spawned, ready, killed (with why), SIGKILL, exited (with how, why and its life): one line
    each, in the transition form the demo and docs/monitoring.md quote; nothing said twice."""
    caplog.set_level(logging.INFO, logger="herder")
    m, _, _ = make(clock, workers=1)
    m.step()
    proc = live(m)[0]
    proc.ready()
    proc.busy("job-1")
    proc.obeys_term = False
    m.step()
    clock.advance(3.5)
    m.step()
    clock.advance(1.0)
    m.step()
    m.step()
    lines = [r.getMessage() for r in caplog.records if f"pid {proc.pid}:" in r.getMessage()]
    assert lines == [
        f"slot 0 pid {proc.pid}: spawned -> starting",
        f"slot 0 pid {proc.pid}: starting -> busy (job job-1)",  # ready and busy came in one pass
        f"slot 0 pid {proc.pid}: busy -> killing (SIGTERM to its process group: silent for 3.5 s "
        "(heartbeat timeout 3 s))",
        f"slot 0 pid {proc.pid}: still alive 1.0 s after SIGTERM: SIGKILL",
        f"slot 0 pid {proc.pid}: killing -> exited (killed by SIGKILL; silent for 3.5 s (heartbeat "
        "timeout 3 s); lived 4.5 s, 0 jobs ok, 0 failed)",
    ], lines


def test_given_up_jobs_are_offered_to_idle_workers_once_each_never_run_in_the_master(
    clock: FakeClock,
) -> None:
    m, launcher, recovery = make(clock, workers=3)
    m.step()
    all_ready(m)
    busy = live(m)[0]
    busy.busy("job-running")
    recovery.waiting_endings = {"gone-1": 1, "gone-2": 2, "gone-3": 3}
    m.step()
    offered = {job for p in live(m).values() for job in p.ends}
    assert busy.ends == [] and offered == {"gone-1", "gone-2"}  # two idle workers, one each
    m.step()
    assert sorted(j for p in live(m).values() for j in p.ends) == ["gone-1", "gone-2"]  # not again
    recovery.waiting_endings = {"gone-3": 3}  # the first two were ended
    m.step()
    assert sorted(j for p in live(m).values() for j in p.ends) == ["gone-1", "gone-2", "gone-3"]
    clock.advance(31)  # still waiting long after its offer (another host's worker has it?)
    for p in live(m).values():
        p.beat()
    m.step()
    assert sum(j == "gone-3" for p in live(m).values() for j in p.ends) == 2


def test_a_killed_workers_job_is_requeued_with_the_kill_kind_as_its_cause(clock: FakeClock) -> None:
    m, _, recovery = make(clock, workers=1)
    m.step()
    proc = live(m)[0]
    proc.ready()
    proc.busy("job-1")
    m.step()
    clock.advance(3.5)
    m.step()
    m.step()
    assert recovery.causes == ["silent"]  # the ending's exception says: hung past its heartbeat


def test_an_ending_done_is_not_offered_again_until_the_job_is_given_up_again(clock: FakeClock) -> None:
    m, _, recovery = make(clock, workers=1)
    m.step()
    all_ready(m)
    proc = live(m)[0]
    recovery.waiting_endings = {"gone-1": 1}
    m.step()
    assert proc.ends == ["gone-1"]
    proc.obs.endings += 1  # the worker said `done gone-1 ... ended`
    m.step()  # the recovery thread has not swept since: it still lists give-up 1
    assert proc.ends == ["gone-1"]
    recovery.waiting_endings = {"gone-1": 2}  # retried by RQ, died again: a new give-up
    m.step()
    assert proc.ends == ["gone-1", "gone-1"]


class FakeReader:
    """The load reader's face to the loop: the next reading, once."""

    def __init__(self) -> None:
        self.next: Reading | None = None
        self.outage_since = None
        self.interval, self.queues, self.cluster = 1.0, ["default"], None

    def take(self) -> Reading | None:
        reading, self.next = self.next, None
        return reading

    def tell(self, target: int, running: int, pool: str = "default") -> None:
        pass


def test_memory_pressure_holds_scale_up_and_says_why_in_status_and_health(clock: FakeClock) -> None:
    reasons = iter(["cgroup memory 352 MiB of 384 MiB (92%)", "", ""])
    m, _, _ = make(clock, min_workers=1, max_workers=8)
    m.memory.read = lambda: next(reasons)  # the cgroup's reading
    m.reader = FakeReader()  # type: ignore[assignment]
    m.step()
    all_ready(m)
    for backlog in (300, 600):  # a growing backlog that would take every worker
        clock.t += 1.0
        m.reader.next = Reading(Load(clock.t, backlog, 1), None, (("default", backlog, 1, 30.0),))  # type: ignore[union-attr]
        m.step()
        if backlog == 300:  # under pressure: the target holds
            assert m.target == 1 and len(m.workers) == 1
            snap = m.take_snapshot()
            assert snap.memory_pressure == "cgroup memory 352 MiB of 384 MiB (92%)"
            assert snap.health.ok  # said beside health, never degrading it (a probe would restart)
            assert m.commands.answer({"cmd": "status"})["memory_pressure"] == snap.memory_pressure
    # Eased: the next reading scales up.
    assert m.target > 1 and not m.take_snapshot().memory_pressure


# ---- the other explicit states: the master's phase, a pool's, a worker's culling ------------


def test_the_master_pool_and_cull_states_move_only_along_their_tables(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=1)
    m.step()
    assert m.phase == MasterPhase.STARTING and not m.ever_ready
    all_ready(m)
    assert m.phase == MasterPhase.RUNNING and m.ever_ready and m.ready_at is not None
    m.begin_stop(hurry=False, why="test")
    assert m.stopping and m.ever_ready  # a stop keeps what the fleet was
    with pytest.raises(IllegalTransition):
        m.enter(MasterPhase.RUNNING)  # a stopping master never runs again

    pool = m.pool_list()[0]
    pool.change_state(PoolState.PAUSED)
    assert pool.paused and not pool.draining
    pool.change_state(PoolState.DRAINING)
    with pytest.raises(IllegalTransition):
        pool.change_state(PoolState.ACTIVE)  # a removed pool only drains

    w = next(iter(m.workers.values()))
    for step in (Cull.ASKED, Cull.DENIED, Cull.NONE, Cull.DENIED, Cull.ASKED, Cull.CULLED):
        change_cull(w, step)
    assert w.culled
    with pytest.raises(IllegalTransition):
        change_cull(w, Cull.NONE)  # culled is final: it retires


def test_the_snapshot_states_the_masters_phase_as_its_type(clock: FakeClock) -> None:
    """The snapshot is handed the master's phase (views/sources.Loop), not two booleans it
    rebuilds a string from."""
    m, _, _ = make(clock, workers=1)
    m.step()
    assert m.take_snapshot().state is MasterPhase.STARTING
    all_ready(m)
    assert m.take_snapshot().state is MasterPhase.RUNNING
    m.begin_stop(hurry=False, why="test")
    assert m.take_snapshot().state is MasterPhase.STOPPING


def test_a_pool_added_back_while_its_workers_drain_still_holds_them(clock: FakeClock) -> None:
    """A reload removes pool b (its worker finishes its job and goes), another adds it back
    before that worker exits: the new pool holds it, so it is still reaped and counted."""
    two = {"a": {"workers": 1, "queues": ["a"]}, "b": {"workers": 1, "queues": ["b"]}}
    m, _, _ = make(clock, pools=two)
    m.step()
    all_ready(m)
    [old] = m.pools["b"].workers.values()
    old.proc.busy("job-1")  # type: ignore[attr-defined]
    m.step()
    reload.apply(m, replace(m.cfg, pools={"a": two["a"]}))
    m.step()
    assert m.pools["b"].draining and old.life.state == WorkerState.STOPPING
    reload.apply(m, replace(m.cfg, pools=two))  # back, while its old worker runs its job
    m.step()
    assert old in m.pools["b"].workers.values() and old.slot in m.workers
    old.proc.done()  # type: ignore[attr-defined]
    old.proc.exit(0)  # type: ignore[attr-defined]
    m.step()
    assert old not in m.pools["b"].workers.values() and m.counters.totals.exited == 1
