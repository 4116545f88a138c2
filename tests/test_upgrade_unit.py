"""The watchdog's side of `herder upgrade` when the new master fails (watchdog/upgrade.py):
whatever B does, A is the master again and `<state dir>/upgrade.json` says why. The masters are
stand-ins (sleeping processes), the watchdog a stand-in of what the upgrader asks of it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from herder.common import upgrade_protocol as up
from herder.watchdog.upgrade import Upgrader


class Dog:
    """What the upgrader asks of the watchdog (upgrade.Supervising)."""

    def __init__(self, master: subprocess.Popen[bytes] | None, config: str | None = None) -> None:
        self.master, self.master_starts, self.config = master, 1, config
        self.stopping, self.master_ready = False, True
        self.reinstated: list[int] = []

    def adopt_master(self, master: subprocess.Popen[bytes], early: bool = False) -> None:
        self.master = master

    def reinstate(self, master: subprocess.Popen[bytes]) -> None:
        self.master = master
        self.reinstated.append(master.pid)

    def start_master(self, extra: dict[str, str] | None = None) -> None:
        raise AssertionError("not in these tests")


def sleeper() -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, process_group=0)


def handing_over(
    tmp_path: Path, state: str
) -> tuple[Dog, Upgrader, subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """A (the old master) and B (the new one, the watchdog's master now), in `state`."""
    a, b = sleeper(), sleeper()
    dog = Dog(b)
    upgrader = Upgrader(dog, str(tmp_path))
    upgrader.seq, upgrader.old = 1, a
    upgrader.say(state, old=a.pid, new=b.pid)
    upgrader.deadline = time.monotonic() + up.GATE_SECONDS
    return dog, upgrader, a, b


def test_b_exiting_before_its_gate_gives_the_service_back_to_a(tmp_path: Path) -> None:
    dog, upgrader, a, b = handing_over(tmp_path, up.STARTING)
    try:
        b.kill()
        b.wait()
        assert upgrader.master_exited(b.returncode)  # the watchdog does not restart anything
        assert (dog.master, dog.reinstated, upgrader.old) == (a, [a.pid], None)
        record = up.read_result(str(tmp_path))
        assert record["state"] == up.FAILED, record
        assert "before it was ready" in record["error"] and f"master {a.pid} goes on" in record["error"]
        assert a.poll() is None  # untouched
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_b_missing_its_gate_is_killed_and_a_goes_on(tmp_path: Path) -> None:
    dog, upgrader, a, b = handing_over(tmp_path, up.STARTING)
    try:
        upgrader.step(upgrader.deadline + 1)
        assert b.wait(5) == -9
        assert (dog.master, dog.reinstated) == (a, [a.pid])
        record = up.read_result(str(tmp_path))
        assert record["state"] == up.FAILED and "not ready within" in record["error"], record
        assert a.poll() is None
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_b_exiting_during_the_hand_over_gives_the_service_back_to_a(tmp_path: Path) -> None:
    """A takes its pools back when B's channel closes (handoff.py); the watchdog makes it the
    master again instead of starting a third."""
    dog, upgrader, a, b = handing_over(tmp_path, up.HANDING_OVER)
    try:
        b.kill()
        b.wait()
        assert upgrader.master_exited(b.returncode)
        assert dog.master is a
        assert "during the hand-over" in up.read_result(str(tmp_path))["error"]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_a_finished_hand_over_is_done_and_a_later_exit_of_b_is_the_watchdogs_own(tmp_path: Path) -> None:
    dog, upgrader, a, b = handing_over(tmp_path, up.HANDING_OVER)
    try:
        a.kill()
        _, status = os.waitpid(a.pid, 0)
        assert upgrader.reaped(a.pid, status)
        assert up.read_result(str(tmp_path))["state"] == up.DONE
        assert not upgrader.master_exited(0)  # B is the master: a crash is restarted as any
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_a_build_that_cannot_start_changes_nothing_and_says_why(tmp_path: Path) -> None:
    a = sleeper()
    dog = Dog(a, config="not a config")  # the installed herder's check refuses it
    upgrader = Upgrader(dog, str(tmp_path))
    try:
        upgrader.request()
        assert up.read_result(str(tmp_path))["state"] == up.CHECKING
        deadline = time.monotonic() + 60
        while upgrader.busy and time.monotonic() < deadline:
            upgrader.step(time.monotonic())
            time.sleep(0.05)
        record = up.read_result(str(tmp_path))
        assert record["state"] == up.FAILED and "cannot start" in record["error"], record
        assert "JSONDecodeError" in record["error"], record["error"]
        assert (dog.master, dog.reinstated, upgrader.old) == (a, [], None)
    finally:
        a.kill()
        a.wait()


def test_an_upgrade_is_refused_while_one_runs_or_the_master_is_not_ready(tmp_path: Path) -> None:
    dog = Dog(None)
    upgrader = Upgrader(dog, str(tmp_path))
    upgrader.request()
    assert up.read_result(str(tmp_path))["error"] == "no master is running"
    a = sleeper()
    try:
        dog.master, dog.master_ready = a, False
        upgrader.request()
        assert "not ready yet" in up.read_result(str(tmp_path))["error"]
        assert up.read_result(str(tmp_path))["seq"] == 2
        upgrader.state = up.HANDING_OVER  # one under way: a second signal changes nothing
        dog.master_ready = True
        upgrader.request()
        assert (upgrader.seq, upgrader.state) == (2, up.HANDING_OVER)
    finally:
        a.kill()
        a.wait()


def test_a_signal_that_waited_out_the_exec_is_refused(tmp_path: Path) -> None:
    """A second SIGUSR1 sent while the watchdog re-exec'd waits (blocked) and is delivered before
    the new watchdog's first pass starts B: it must not start a second upgrade, whose exec would
    drop A mid-hand-over (seen: A lost its pipe and stopped, taken for orphaned)."""
    a = sleeper()
    assert a.stdout is not None
    dog = Dog(None)
    upgrader = Upgrader(dog, str(tmp_path))
    try:
        upgrader.resume({"seq": 1, "pid": a.pid, "fd": os.dup(a.stdout.fileno()), "starts": 1})
        assert dog.master is not None and dog.master.pid == a.pid and dog.reinstated == [a.pid]
        upgrader.request()
        assert upgrader.seq == 1 and not (tmp_path / up.RESULT).exists()  # refused, nothing written
    finally:
        a.kill()
        a.wait()


def test_a_stop_during_the_check_ends_the_upgrade_without_an_exec(tmp_path: Path) -> None:
    a = sleeper()
    dog = Dog(a, config="not a config")  # were the stop ignored, the check would fail: never an exec here
    upgrader = Upgrader(dog, str(tmp_path))
    try:
        upgrader.request()
        assert upgrader.state == up.CHECKING
        dog.stopping = True  # SIGTERM meanwhile
        upgrader.step(time.monotonic())
        record = up.read_result(str(tmp_path))
        assert (record["state"], record["error"]) == (up.FAILED, "herder is stopping"), record
        assert upgrader._check is None and dog.master is a
    finally:
        a.kill()
        a.wait()


def test_a_old_master_dying_before_the_gate_leaves_b_alone_in_charge(tmp_path: Path) -> None:
    """A dies while B starts: B's `ready` ends the upgrade (nothing to hand over); had B missed
    its gate instead, it is killed and the watchdog restarts a master as after any death."""
    dog, upgrader, a, b = handing_over(tmp_path, up.STARTING)
    try:
        a.kill()
        _, status = os.waitpid(a.pid, 0)
        assert upgrader.reaped(a.pid, status) and upgrader.old is None
        upgrader.on_ready()
        assert up.read_result(str(tmp_path))["state"] == up.DONE and dog.master is b
        upgrader.state = up.STARTING  # the other way: the gate missed
        upgrader.step(upgrader.deadline + 1)
        assert b.wait(5) == -9 and dog.reinstated == []
        assert "the old master had exited" in up.read_result(str(tmp_path))["error"]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
