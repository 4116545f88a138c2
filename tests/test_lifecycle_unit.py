"""One supervised child's life (supervisor/children/lifecycle.py), for workers and the scheduler alike,
and the one transition check every state machine makes (common/transitions.py): in
milliseconds, on fake processes and a fake clock."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from fakes import SHORT_TIMEOUT_CONFIG, FakeClock, FakeProc
from herder.common.config import Config
from herder.common.transitions import IllegalTransition, move
from herder.supervisor.children import lifecycle, states
from herder.supervisor.children.fleet import Slot, Worker
from herder.supervisor.children.scheduler import SchedulerKeeper
from herder.supervisor.children.states import KILL_TRANSITIONS, KillKind, KillStage, WorkerState
from herder.supervisor.redis_side.scheduler_locks import LockReading
from herder.watchdog.core import MASTER_TRANSITIONS, MasterState, Phase, Watchdog
from herder.watchdog.notify import Notifier

CFG = SHORT_TIMEOUT_CONFIG


def child(clock: FakeClock, state: WorkerState = WorkerState.IDLE) -> Worker:
    w = Worker(0, FakeProc(100, clock), spawned_at=clock.t)
    w.life.state = state
    return w


# ---- transitions.move ----------------------------------------------------------------------

TABLE = {"a": frozenset({"b"}), "b": frozenset({"a", "b"}), "c": frozenset[str]()}


def test_move_follows_its_table_and_names_who_and_why() -> None:
    assert move(TABLE, "a", "b", "x") == "b"
    assert move(TABLE, "b", "b", "x") == "b"  # staying put: only where the table lists it
    with pytest.raises(IllegalTransition, match=r"^x: a -> a is not allowed$"):
        move(TABLE, "a", "a", "x")
    with pytest.raises(IllegalTransition, match=r"^slot 1: c -> a is not allowed \(a bug\)$"):
        move(TABLE, "c", "a", "slot 1", "a bug")
    assert states.IllegalTransition is IllegalTransition  # the old import still works


def test_every_machine_checks_its_moves_with_move() -> None:
    w = child(FakeClock())
    states.change_kill(w, KillStage.SPARED)
    states.change_kill(w, KillStage.TERM)
    with pytest.raises(IllegalTransition):
        states.change_kill(w, KillStage.NONE)  # a kill is never taken back
    assert KILL_TRANSITIONS[KillStage.SIGKILLED] == frozenset()
    assert MASTER_TRANSITIONS[MasterState.KILLED] == frozenset()


def test_the_watchdogs_phase_is_a_machine_of_its_own() -> None:
    wd = Watchdog(["true"])
    assert wd.phase == Phase.RUNNING and not wd.stopping
    wd.begin_stop(12.0)
    assert wd.stopping and wd.stop_started == 12.0
    with pytest.raises(IllegalTransition):
        wd.begin_stop(13.0)  # every caller asks only while running
    wd.master_becomes(MasterState.READY)
    wd.master_becomes(MasterState.KILLED)
    with pytest.raises(IllegalTransition):
        wd.master_becomes(MasterState.STARTING)  # no master starts after the stop's SIGKILL


# ---- the one graceful rule -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "stop_sent", "said_stop", "killed", "graceful"),
    [
        (0, True, False, False, True),  # asked by herder, exited 0
        (0, False, True, False, True),  # asked by RQ's shutdown command: it said `stop`
        (0, False, False, False, False),  # exited 0 unasked
        (1, True, True, False, False),  # asked, but failed
        (-signal.SIGTERM, True, False, False, False),
        (0, True, True, True, False),  # killed by herder, whatever it said
    ],
)
def test_the_one_graceful_rule(
    code: int, stop_sent: bool, said_stop: bool, killed: bool, graceful: bool
) -> None:
    clock = FakeClock()
    w = child(clock)
    proc = w.proc
    assert isinstance(proc, FakeProc)
    proc.obeys_term = False  # it exits with the code the case says
    if stop_sent:
        lifecycle.ask_stop(w, "test", clock.t)
    if killed:
        lifecycle.kill(w, "test", KillKind.SILENT, clock.t)
    proc.obs.said_stop = said_stop
    proc.exit(code)
    clock.advance(5)
    ex = lifecycle.reap(w, clock.t)
    assert (ex.code, ex.lived, ex.graceful) == (code, 5.0, graceful)


def test_a_reaped_child_is_exited_and_its_slot_backs_off_only_when_it_died_young() -> None:
    clock, slot = FakeClock(), Slot(0)
    w = child(clock, WorkerState.STARTING)
    w.proc.exit(1)  # type: ignore[attr-defined]  # before `ready`
    ex = lifecycle.reap(w, clock.t)
    lifecycle.exited(w, ex, "test")
    assert w.life.state == WorkerState.EXITED
    assert lifecycle.back_off(slot, ex, CFG, clock.t) == CFG.backoff_initial and slot.young_deaths == 1
    w = child(clock)
    w.proc.obs.ready = True  # type: ignore[attr-defined]
    clock.advance(CFG.min_uptime)
    w.proc.exit(1)  # type: ignore[attr-defined]  # lived long enough: a crash, no crash loop
    assert lifecycle.back_off(slot, lifecycle.reap(w, clock.t), CFG, clock.t) is None
    assert slot.young_deaths == 0 and not slot.in_backoff(clock.t)


# ---- kill and escalation -------------------------------------------------------------------


def test_a_kill_escalates_to_sigkill_once_after_kill_timeout() -> None:
    clock = FakeClock()
    w = child(clock)
    proc = w.proc
    assert isinstance(proc, FakeProc)
    proc.obeys_term = False
    lifecycle.kill(w, "silent", KillKind.SILENT, clock.t)
    assert w.life.state == WorkerState.KILLING and w.killed and w.life.kill_kind == KillKind.SILENT
    assert proc.signals == [signal.SIGTERM, signal.SIGCONT]
    clock.advance(CFG.kill_timeout / 2)
    lifecycle.escalate(w, clock.t, CFG.kill_timeout)
    assert signal.SIGKILL not in proc.signals  # not yet
    clock.advance(CFG.kill_timeout / 2)
    for _ in range(3):
        lifecycle.escalate(w, clock.t, CFG.kill_timeout)
        clock.advance(CFG.kill_timeout)
    assert proc.signals.count(signal.SIGKILL) == 1 and w.life.kill_stage == KillStage.SIGKILLED


def test_a_spared_worker_can_still_be_killed_and_a_killed_one_not_spared() -> None:
    clock = FakeClock()
    w = child(clock)
    states.change_kill(w, KillStage.SPARED)
    assert w.spared and not w.killed
    lifecycle.kill(w, "job timeout", KillKind.JOB_TIMEOUT, clock.t)
    assert w.killed and not w.spared
    with pytest.raises(IllegalTransition):
        states.change_kill(w, KillStage.SPARED)


# ---- the scheduler lives the same life -----------------------------------------------------


class FakeLocks:
    def __init__(self) -> None:
        self.released: list[str] = []

    def start(self) -> None:
        pass

    def set_queues(self, queues: list[str]) -> None:
        pass

    def release(self, name: str, queues: list[str]) -> None:
        self.released.append(name)

    def reading(self) -> LockReading:
        return LockReading({}, 0.0)

    def drain(self, timeout: float) -> int:
        return 0


def keeper(clock: FakeClock) -> tuple[SchedulerKeeper, list[FakeProc]]:
    procs: list[FakeProc] = []

    def spawn(argv: list[str], env: dict[str, str], wake: object) -> FakeProc:
        procs.append(FakeProc(900 + len(procs), clock))
        return procs[-1]

    return SchedulerKeeper(FakeLocks(), clock, "h1", spawn=spawn), procs  # type: ignore[arg-type]


def spawned_scheduler(clock: FakeClock) -> tuple[SchedulerKeeper, list[FakeProc], Config, Worker]:
    """A keeper whose scheduler process was just spawned (no `ready` yet)."""
    sched, procs = keeper(clock)
    cfg = replace(CFG, scheduler=True)
    sched.step(cfg, False, lambda: None)
    assert sched.w is not None
    return sched, procs, cfg, sched.w


def test_the_scheduler_reaches_exited_after_a_graceful_stop(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="herder")
    sched, procs, cfg, w = spawned_scheduler(clock)
    procs[0].ready()
    sched.step(cfg, False, lambda: None)
    sched.step(cfg, True, lambda: None)  # herder stops: `stop`
    assert w.life.state == WorkerState.STOPPING and procs[0].stops == 1
    procs[0].exit(0)
    sched.step(cfg, True, lambda: None)
    assert w.life.state == WorkerState.EXITED and sched.w is None
    assert f"scheduler pid {w.pid}: exited (exit code 0, after `stop`)" in caplog.text
    assert sched.slot.young_deaths == 0


def test_a_scheduler_that_said_stop_and_exited_0_is_graceful_as_a_worker_is(clock: FakeClock) -> None:
    """RQ's shutdown command stops it (it says `stop`, exits 0) without herder's `stop`: the
    shared rule counts that graceful, so its slot does not back off (it did, before)."""
    sched, procs, cfg, w = spawned_scheduler(clock)
    procs[0].ready()
    procs[0].obs.said_stop = True
    procs[0].exit(0)
    sched.step(cfg, False, lambda: None)
    assert w.life.state == WorkerState.EXITED and sched.slot.young_deaths == 0
    assert len(procs) == 2  # replaced at once


def test_a_scheduler_killed_is_exited_too(clock: FakeClock) -> None:
    sched, procs, cfg, w = spawned_scheduler(clock)
    procs[0].obeys_term = False
    sched.hurry()
    assert w.life.kill_kind == KillKind.SCHEDULER and procs[0].signals == [signal.SIGTERM, signal.SIGCONT]
    for _ in range(3):
        clock.advance(cfg.kill_timeout)
        sched.step(cfg, True, lambda: None)
    assert procs[0].signals.count(signal.SIGKILL) == 1 and w.life.state == WorkerState.EXITED


# ---- the watchdog: a starved master is not a hung one --------------------------------------


def _busy_python(nice: int = 0) -> subprocess.Popen[bytes]:
    code = f"import os\nos.nice({nice})\nwhile True: pass"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    os.sched_setaffinity(proc.pid, {0})  # all on one CPU: the nice one waits for it
    return proc


# A master's shape: its loop (the main thread) waits for the GIL or a lock that another thread
# holds while that one is runnable; taken from the first moment, before any thread starts.
THREADED = """
import os, sys, threading
os.sched_setaffinity(0, {int(sys.argv[1])})
os.nice(int(sys.argv[2]))
lock = threading.Lock()
def spin():
    with lock:
        while True: pass
t = threading.Thread(target=spin)
t.start()
while not lock.locked(): pass
with lock: pass
"""


def _threaded_python(cpu: int, nice: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", THREADED, str(cpu), str(nice)], stdout=subprocess.PIPE)


def _lived(proc: subprocess.Popen[bytes], timeout: float, limit: float = 10) -> float:
    """How long a watchdog with this heartbeat timeout lets a silent `proc` live."""
    wd = Watchdog(["true"], heartbeat_timeout=timeout)
    wd.adopt_master(proc)
    began = time.monotonic()
    while proc.poll() is None and time.monotonic() - began < limit:
        wd.check_silence()
        time.sleep(0.05)
    return time.monotonic() - began


@pytest.mark.slow
def test_a_starved_master_whose_loop_waits_for_another_thread_is_spared_too() -> None:
    """Starved of CPU, a master's loop often waits (state S) for the GIL another of its threads
    holds, runnable: the master is judged by all its threads, not its loop alone (judged by its
    loop, it was killed at the deadline, under systemd in a container). A thread spinning on a
    CPU to spare while the loop waits is a hang: the process runs, and it is killed."""
    hogs = [_busy_python() for _ in range(3)]  # CPU 0
    # The spinning one ahead of other work on CPU 1 (the machine may be busy): root may do so.
    starved, spinning = _threaded_python(0, 19), _threaded_python(1, -10 if os.geteuid() == 0 else 0)
    try:
        assert _lived(starved, 0.5) >= 4 * 0.5
        assert _lived(spinning, 0.5) < 4 * 0.5
    finally:
        for proc in (*hogs, starved, spinning):
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_systemd_is_fed_while_a_starved_master_is_spared_not_for_a_frozen_one(tmp_path) -> None:
    """WatchdogSec must not restart a fleet the watchdog deliberately keeps: while a starved
    master is spared, WATCHDOG=1 still goes out; a frozen master gets none past the ping grace."""
    import socket

    hogs = [_busy_python() for _ in range(3)]
    starved, frozen = _busy_python(nice=19), _busy_python()
    os.kill(frozen.pid, signal.SIGSTOP)
    path = tmp_path / "notify.sock"
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(path))
    manager.setblocking(False)
    try:
        for proc, fed in ((starved, True), (frozen, False)):
            wd = Watchdog(["true"], heartbeat_timeout=5.0, ping_grace=0.3)
            wd.notify = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "200000"})  # every 0.1 s
            wd.adopt_master(proc)
            wd.master_becomes(MasterState.READY)
            pings, began = [], time.monotonic()
            while time.monotonic() - began < 2.5:  # silent, short of its deadline: neither is killed
                wd.check_silence()
                wd.feed_service_manager(time.monotonic())
                try:
                    while True:
                        if manager.recv(64) == b"WATCHDOG=1":
                            pings.append(time.monotonic() - began)
                except BlockingIOError:
                    pass
                time.sleep(0.05)
            assert proc.poll() is None
            if fed:
                assert pings and pings[-1] > 2.0, pings
            else:
                assert pings and pings[-1] < 0.6, pings
    finally:
        manager.close()
        for proc in (*hogs, starved, frozen):
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_the_watchdog_spares_a_master_starved_of_cpu_for_a_while_but_not_a_hung_one() -> None:
    """A master silent because it waits on a run queue (a host overloaded by its own busy
    workers) is not killed until 4 heartbeat timeouts: killing it would stop the whole fleet.
    A master silent and not waiting for CPU (frozen, blocked, deadlocked) is killed as ever."""
    hogs = [_busy_python() for _ in range(3)]
    starved, frozen = _busy_python(nice=19), _busy_python()
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        for proc, spared in ((starved, True), (frozen, False)):
            wd = Watchdog(["true"], heartbeat_timeout=0.5)
            wd.adopt_master(proc)
            began = time.monotonic()
            while proc.poll() is None and time.monotonic() - began < 10:
                wd.check_silence()
                time.sleep(0.05)
            lived = time.monotonic() - began
            assert proc.returncode == -signal.SIGKILL
            if spared:  # killed once starved for 4 timeouts, not at the first
                assert lived >= 4 * 0.5, lived
            else:
                assert lived < 4 * 0.5, lived
    finally:
        for proc in (*hogs, starved, frozen):
            proc.kill()
            proc.wait()
