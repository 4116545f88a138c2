"""The master's keeping of its scheduler child, in milliseconds: the reconcile loop with a fake
clock, fake processes and fake lock releases (the end-to-end tests are test_scheduler.py)."""

from __future__ import annotations

import signal
from dataclasses import replace

from fakes import SHORT_TIMEOUT_CONFIG, FakeClock, FakeLauncher, FakeProc, FakeRecovery
from herder.supervisor.__main__ import compose
from herder.supervisor.children.launchers import Launchers
from herder.supervisor.children.scheduler import SchedulerKeeper
from herder.supervisor.children.states import WorkerState
from herder.supervisor.master import Master, Start
from herder.supervisor.redis_side.scheduler_locks import Holder, LockReading


class FakeLocks:
    def __init__(self) -> None:
        self.started = False
        self.released: list[tuple[str, list[str]]] = []
        self.holders: dict[str, Holder | None] = {}

    def start(self) -> None:
        self.started = True

    def set_queues(self, queues: list[str]) -> None:
        pass

    def release(self, name: str, queues: list[str]) -> None:
        self.released.append((name, list(queues)))

    def reading(self) -> LockReading:
        return LockReading(dict(self.holders), 0.0)

    def drain(self, timeout: float) -> int:
        return 0


def make(clock: FakeClock, **settings: object) -> tuple[Master, FakeLocks, list[FakeProc], FakeLauncher]:
    procs: list[FakeProc] = []

    def spawn(argv: list[str], env: dict[str, str], wake) -> FakeProc:  # noqa: ANN001
        assert argv[-2:] == ["-m", "herder.worker.scheduler"] and env["HERDER_SCHEDULER_NAME"]
        procs.append(FakeProc(900 + len(procs), clock))
        return procs[-1]

    locks, launcher = FakeLocks(), FakeLauncher(clock)
    keeper = SchedulerKeeper(locks, clock, "h1", spawn=spawn)  # type: ignore[arg-type]
    cfg = replace(SHORT_TIMEOUT_CONFIG, queues=["high", "default"], **settings)  # type: ignore[arg-type]
    m = compose(
        cfg, Launchers(launcher, cfg), clock, recovery=FakeRecovery(), sched=keeper, start=Start(host_id="h1")
    )
    return m, locks, procs, launcher


def test_one_scheduler_beside_the_fleet_not_in_it(clock: FakeClock) -> None:
    m, locks, procs, launcher = make(clock)
    m.step()
    assert locks.started and len(procs) == 1 and len(launcher.spawned) == 2
    assert m.sched.name.startswith("herder-scheduler:h1:")
    procs[0].ready()
    m.step()
    assert m.sched.w is not None and m.sched.w.life.state == WorkerState.IDLE
    assert m.counters.totals.spawned == 2 and len(m.workers) == 2  # not a worker


def test_a_dead_scheduler_has_its_locks_freed_and_is_replaced_at_once(clock: FakeClock) -> None:
    m, locks, procs, _ = make(clock)
    m.step()
    first = m.sched.name
    procs[0].ready()
    clock.advance(5)
    m.step()
    procs[0].exit(-signal.SIGKILL)
    m.step()
    assert locks.released == [(first, ["high", "default"])]
    assert len(procs) == 2 and m.sched.name != first  # the same pass, under a new name


def test_a_scheduler_that_keeps_dying_young_backs_off(clock: FakeClock) -> None:
    m, locks, procs, _ = make(clock)
    m.step()
    procs[0].exit(1)  # before `ready`
    m.step()
    assert len(procs) == 1 and m.sched.slot.young_deaths == 1
    clock.advance(SHORT_TIMEOUT_CONFIG.backoff_initial)
    m.step()
    assert len(procs) == 2 and len(locks.released) == 1


def test_a_silent_scheduler_is_killed_and_then_sigkilled(clock: FakeClock) -> None:
    m, locks, procs, _ = make(clock)
    m.step()
    procs[0].ready()
    procs[0].obeys_term = False
    clock.advance(SHORT_TIMEOUT_CONFIG.heartbeat_timeout + 0.5)
    for w in launcher_procs(m):
        w.beat()  # the workers are fine
    m.step()
    assert procs[0].signals[:2] == [signal.SIGTERM, signal.SIGCONT]
    assert m.guard.degraded == "" and m.counters.totals.killed == 0  # not the fleet's budget
    clock.advance(SHORT_TIMEOUT_CONFIG.kill_timeout)
    m.step()  # SIGKILL: it exits
    m.step()  # reaped, locks freed, replaced
    assert signal.SIGKILL in procs[0].signals and len(locks.released) == 1 and len(procs) == 2


def test_stop_waits_for_the_scheduler_and_a_hurry_kills_it(clock: FakeClock) -> None:
    m, _, procs, launcher = make(clock)
    m.step()
    procs[0].ready()
    m.begin_stop(hurry=False, why="test")
    m.step()
    assert procs[0].stops == 1 and m.sched.running
    for p in launcher.spawned:
        p.exit(0)
    m.step()
    assert not m.workers and m.sched.running  # the loop goes on until the scheduler is gone
    m.begin_stop(hurry=True, why="test")
    assert signal.SIGTERM in procs[0].signals
    m.step()
    assert not m.sched.running and len(procs) == 1  # never respawned while stopping


def test_the_setting_off_and_a_reload(clock: FakeClock) -> None:
    m, _, procs, _ = make(clock, scheduler=False)
    m.step()
    assert procs == [] and m.sched.status(m.cfg).state == "off"
    m.cfg = replace(m.cfg, scheduler=True)
    m.step()
    assert len(procs) == 1
    procs[0].ready()
    m.cfg = replace(m.cfg, queues=["default"])  # a reload with new queues: a new scheduler
    m.step()
    assert procs[0].stops == 1
    procs[0].exit(0)
    m.step()
    assert len(procs) == 2 and m.sched.queues == ["default"]
    m.cfg = replace(m.cfg, scheduler=False)
    m.step()
    assert procs[1].stops == 1


def test_status_names_each_queue_holder(clock: FakeClock) -> None:
    m, locks, procs, _ = make(clock)
    m.step()
    procs[0].ready()
    m.step()
    locks.holders = {
        "high": Holder(m.sched.name, "h1", "box1", procs[0].pid),
        "default": Holder("elsewhere", "", "box2", 77),
    }
    st = m.commands.answer({"cmd": "status"})["scheduler"]
    assert (st["enabled"], st["state"], st["pid"], st["holds"]) == (True, "idle", procs[0].pid, ["high"])
    assert st["queues"][1]["holder"] == {
        "name": "elsewhere",
        "host_id": "",
        "hostname": "box2",
        "pid": 77,
        "here": False,
    }


def launcher_procs(m: Master) -> list[FakeProc]:
    return [w.proc for w in m.workers.values()]  # type: ignore[misc]
