"""Fakes for driving the master's reconcile loop in milliseconds, shared by the unit tests
(test_master_unit.py, test_scheduler_unit.py, test_retirement_unit.py, test_reload.py): a clock
the test advances, worker processes that do what the test says, a launcher that spawns them, a
recovery thread that records what it is asked, a short-timeout Config, and a Master built on them
(make). The fixture `clock` is in conftest.py.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace

from herder.common.config import Config
from herder.supervisor.__main__ import compose
from herder.supervisor.children.changes import Changes
from herder.supervisor.children.launcher import Launcher
from herder.supervisor.children.launchers import Launchers
from herder.supervisor.children.observations import Held, Observations
from herder.supervisor.master import Master, Start
from herder.supervisor.redis_side.recovery import Counts


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def wall(self) -> float:
        return 1_700_000_000.0 + self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class FakeProc:
    """A worker process that does what the test says, when the test says it."""

    def __init__(self, pid: int, clock: FakeClock, changes: Changes | None = None) -> None:
        self.pid = pid
        self.clock = clock
        self.changes = changes  # told of each change, as a real worker's readers tell theirs
        self.looks = 0  # snapshots the master took: what a pass cost this worker
        self.obs = Observations(last_seen=clock.t)
        self.told()
        self.code: int | None = None
        self.signals: list[int] = []
        self.stops = 0
        self.pauses: list[bool] = []
        self.ends: list[str] = []
        self.retires = 0  # `retire` lines sent
        self.env: dict[str, str] = {}  # what it was started with
        self.obeys_term = True

    # the ProcessHandle
    def snapshot(self) -> Observations:
        self.looks += 1
        return self.obs.copy()

    def told(self) -> None:
        """What a reader does once it recorded a line that changed something (changes.py)."""
        if self.changes is not None:
            self.changes.add(self.pid)

    def take_finished(self) -> list:
        return []

    def unread(self) -> int:
        return self.pending

    pending = 0  # bytes of its stdout the hub has not read (a starved master)

    def send_stop(self) -> None:
        self.stops += 1

    def send_pause(self, paused: bool) -> None:
        self.pauses.append(paused)

    def send_end(self, job_id: str) -> None:
        self.ends.append(job_id)

    def send_retire(self) -> None:
        self.retires += 1

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGKILL or (sig == signal.SIGTERM and self.obeys_term):
            self.exit(-sig)

    def has_exited(self) -> bool:
        self.exit_asked += 1  # a waitid, for a real worker
        return self.code is not None

    exit_asked = 0

    def reap(self) -> int:
        assert self.code is not None
        return self.code

    # what the worker says and does
    def ready(self) -> None:
        self.obs.ready, self.obs.last_seen = True, self.clock.t
        self.told()

    def busy(self, job: str, timeout: float | None = None, thread: int = 0) -> None:
        self.obs.jobs[thread] = Held(job, self.clock.t, timeout)
        self.obs.last_seen = self.clock.t
        self.told()

    def done(self, thread: int = 0) -> None:
        self.obs.jobs.pop(thread, None)
        self.obs.last_seen = self.clock.t
        self.obs.jobs_ok += 1
        self.obs.last_done_wall = self.clock.wall()
        self.told()

    def beat(self) -> None:
        self.obs.last_seen = self.clock.t  # a sign of life only: no change (an `idle`)

    def exit(self, code: int) -> None:
        if self.code is None:
            self.code = code
            self.obs.stdout_eof, self.obs.eof_at = True, self.clock.t  # its stdout's EOF
            self.told()


class FakeLauncher(Launcher):
    """A Launcher whose workers are FakeProcs; it has no template to tend, renew or close."""

    def __init__(self, clock: FakeClock, changes: Changes | None = None) -> None:
        self.clock = clock
        self.changes = changes
        self.spawned: list[FakeProc] = []
        self.fail = False
        self.warm = False  # a fork server still importing

    def warming(self) -> bool:
        return self.warm

    def spawn(self, argv: list[str], env: dict[str, str], slot: int, wake: Callable[[], None]) -> FakeProc:
        if self.fail:
            raise OSError("no such file")
        proc = FakeProc(100 + len(self.spawned), self.clock, self.changes)
        proc.env = env
        self.spawned.append(proc)
        return proc


class FakeRecovery:
    """A Recovery that records what it is asked and answers what the test set."""

    def __init__(self) -> None:
        self.requeues: list[tuple[str, str]] = []
        self.causes: list[str] = []
        self.waiting_endings: dict[str, int] = {}
        self.forgotten: list[str] = []
        self.told: dict[str, str | None] = {}
        self.asked: list[int] = []
        self.pending_answers: dict[int, bool] = {}  # what Redis will answer, by ticket
        self.counts = Counts()
        self.cfg = Config()
        self.on_give_up: Callable[[str, str, str], None] | None = None  # the master sets it

    def start(self) -> None:
        pass

    def configure(self, cfg: Config) -> None:  # a reload's settings
        self.cfg = cfg

    def tell(self, holding: dict[str, str | None]) -> None:
        self.told = dict(holding)

    def ask_cull(self, ticket: int, wall: float) -> None:
        self.asked.append(ticket)

    def answers(self) -> dict[int, bool]:
        out, self.pending_answers = self.pending_answers, {}
        return out

    def requeue(
        self, job_id: str, reason: str, label: str, cause: str = "", workers: tuple[str, ...] = ()
    ) -> None:
        self.requeues.append((job_id, reason))
        self.causes.append(cause)

    def endings(self) -> dict[str, int]:
        return self.waiting_endings

    def forget(self, worker_name: str) -> None:
        self.forgotten.append(worker_name)

    def count_kill(self, key: str, window: float) -> None:
        pass

    def drain(self, timeout: float) -> int:
        return 0


# The settings every fake master runs with (before its test's own): short timeouts, two workers.
SHORT_TIMEOUT_CONFIG = Config(
    redis_url=None,
    workers=2,
    heartbeat_interval=1.0,
    heartbeat_timeout=3.0,
    kill_timeout=1.0,
    stop_timeout=5.0,
    start_timeout=10.0,
    job_timeout=30.0,
    job_timeout_grace=1.0,
    min_uptime=1.0,
)


def make(
    clock: FakeClock, changes: Changes | None = None, **settings: object
) -> tuple[Master, FakeLauncher, FakeRecovery]:
    """A master on the fakes, SHORT_TIMEOUT_CONFIG changed by `settings`; and its launcher and
    recovery, for the test to drive and read. Its fakes say what changed and each pass looks at
    those, as the real master's readers do (children/changes.py)."""
    changes = changes or Changes()
    launcher, recovery = FakeLauncher(clock, changes), FakeRecovery()
    cfg = replace(SHORT_TIMEOUT_CONFIG, **settings)  # type: ignore[arg-type]
    start = Start(host_id="test", changes=changes)
    m = compose(cfg, Launchers(launcher, cfg), clock, recovery=recovery, start=start)
    return m, launcher, recovery


def live(m: Master) -> dict[int, FakeProc]:
    """Each slot's fake worker process."""
    return {w.slot: w.proc for w in m.workers.values()}  # type: ignore[misc]


def all_ready(m: Master) -> None:
    """Every live worker says `ready`, and one pass of the loop takes it in."""
    for proc in live(m).values():
        proc.ready()
    m.step()
