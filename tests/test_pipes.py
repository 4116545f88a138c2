"""The pipe hub (herder.supervisor.children.pipes): one thread reads many pipes, pauses a flooding one
and says EOF; and a fleet's master keeps a fixed number of threads whatever its size."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness import HERDER, wait_for
from herder.common.doorbell import Bell, Ringer
from herder.supervisor.children import pipes as pipes_mod
from herder.supervisor.children.pipes import (
    LONG_AFTER,
    QUIET_AFTER,
    QUIET_COALESCE,
    RELAXED_SWITCH_INTERVAL,
    SETTLED_COALESCE,
    PipeHub,
)


class Recorder:
    order = 0
    active = True  # what it is fed is more than heartbeats

    def __init__(self, pause_after: int | None = None) -> None:
        self.data = b""
        self.feeds = 0
        self.ended = threading.Event()
        self.pause_after = pause_after
        self.paused_at: float | None = None
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        self.data += chunk
        self.feeds += 1
        if self.pause_after is not None and self.feeds == self.pause_after:
            self.paused_at = now
            return True, now + 0.5
        return True, None

    def eof(self) -> None:
        self.ended.set()


def test_one_thread_reads_many_pipes_and_says_eof() -> None:
    hub = PipeHub()
    pipes = [os.pipe() for _ in range(50)]
    readers = [Recorder() for _ in pipes]
    for (r, _), rec in zip(pipes, readers, strict=True):
        hub.add(r, rec)
    for i, (_, w) in enumerate(pipes):
        os.write(w, f"line {i}\n".encode())
        os.close(w)
    for i, rec in enumerate(readers):
        assert rec.ended.wait(5), f"pipe {i}: no EOF"
        assert rec.data == f"line {i}\n".encode() and rec.woken >= 1
    for r, _ in pipes:
        os.close(r)


class Quiet(Recorder):
    """A worker's `idle` lines: nothing that wakes the loop. Records each pass it was read in."""

    active = False  # heartbeats only

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[float] = []

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        self.passes.append(now)  # one `now` per pass of the hub
        return False, None


@pytest.mark.slow
def test_a_quiet_fleets_lines_are_read_in_batches() -> None:
    """Lines that wake nobody (`idle`), one from each of 20 pipes 5 ms apart, after a quiet
    second: the hub reads them a batch at a time (a 5 ms pause would take about one pass a line)."""
    hub = PipeHub()
    pipes = [os.pipe() for _ in range(20)]
    readers = [Quiet() for _ in pipes]
    for (r, _), rec in zip(pipes, readers, strict=True):
        hub.add(r, rec)
    time.sleep(QUIET_AFTER + 0.1)  # nothing read for a while: the fleet is quiet
    began = time.monotonic()
    for _, w in pipes:
        os.write(w, b"idle 1.0\n")
        time.sleep(0.005)
    span = time.monotonic() - began
    wait_for(lambda: all(rec.passes for rec in readers), 5, what="every line read")
    passes = len({t for rec in readers for t in rec.passes})
    assert passes <= span / QUIET_COALESCE + 2, (passes, span)
    for r, w in pipes:
        os.close(w)
        os.close(r)


@pytest.mark.slow
def test_a_settled_masters_quiet_lines_are_read_a_few_times_a_second() -> None:
    """The master's loop settled (it looks once a second): 20 idle lines 25 ms apart are read
    in about one pass per SETTLED_COALESCE, where the quiet pause alone takes one per 50 ms."""
    hub = PipeHub()
    hub.settle(True)
    pipes = [os.pipe() for _ in range(20)]
    readers = [Quiet() for _ in pipes]
    for (r, _), rec in zip(pipes, readers, strict=True):
        hub.add(r, rec)
    time.sleep(QUIET_AFTER + 0.1)
    began = time.monotonic()
    for _, w in pipes:
        os.write(w, b"idle 1.0\n")
        time.sleep(0.025)
    span = time.monotonic() - began
    wait_for(lambda: all(rec.passes for rec in readers), 5, what="every line read")
    passes = len({t for rec in readers for t in rec.passes})
    assert passes <= span / SETTLED_COALESCE + 2 < span / QUIET_COALESCE, (passes, span)
    for r, w in pipes:
        os.close(w)
        os.close(r)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["the loop is no longer settled", "a chatty pipe"])
def test_a_settled_pause_ends_for_a_start_or_stop_and_is_never_taken_for_a_chatty_pipe(
    how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A settled pause made 30 s long, to be sure of what ends it: the master's loop no longer
    settled (a worker starts or stops: its lines are wanted now) ends it at once; after a pass
    that read more than a line or two from a pipe (a job's prints) it is never taken."""
    monkeypatch.setattr(pipes_mod, "SETTLED_COALESCE", 30.0)
    hub = PipeHub()
    hub.settle(True)
    (ra, wa), (rb, wb) = os.pipe(), os.pipe()
    a, b = Quiet(), Quiet()
    hub.add(ra, a)
    hub.add(rb, b)
    time.sleep(QUIET_AFTER + 0.1)
    first = b"x" * 4000 + b"\n" if how == "a chatty pipe" else b"idle 1.0\n"
    os.write(wa, first)
    wait_for(lambda: a.passes, 5, what="the first line read")
    written = time.monotonic()
    os.write(wb, b"ready 1 1.0\n")
    if how == "the loop is no longer settled":
        hub.settle(False)
    # Waited for past its deadline rather than failing there, so the assert says how late it was.
    with contextlib.suppress(AssertionError):
        wait_for(lambda: b.passes, 35, what="the next line read")
    assert b.passes, "the next line was never read"
    late = b.passes[0] - written
    assert late < 5.0, f"read {late:.1f} s after it was written: the 30 s settled pause was taken"
    for fd in (ra, wa, rb, wb):
        os.close(fd)


def first_read_after(rec: Quiet, written: float, timeout: float) -> float:
    """Seconds from `written` to the first pass that read `rec` since; waited for past
    `timeout` rather than failing there, so the assert says how late it was."""
    with contextlib.suppress(AssertionError):
        wait_for(lambda: rec.passes and rec.passes[-1] >= written, timeout, what="the line read")
    later = [t for t in rec.passes if t >= written]
    assert later, "the line was never read"
    return later[0] - written


@pytest.mark.slow
def test_a_quiet_fleets_pipes_wait_the_long_pause_which_a_ring_ends(tmp_path: Path) -> None:
    """Settled, a long pause of 30 s (to be sure of what ends it), a fleet quiet for longer
    than LONG_AFTER: an `idle` line waits out the pause (the settled pause alone reads it
    within SETTLED_COALESCE); a `busy` line with a ring of the doorbell is read at once."""
    bell = Bell(str(tmp_path))
    hub = PipeHub(bell=bell)
    hub.settle(True, 30.0)
    (ra, wa), (rb, wb) = os.pipe(), os.pipe()
    a, b = Quiet(), Working()
    hub.add(ra, a)
    hub.add(rb, b)
    os.write(wa, b"idle 1.0\n")
    wait_for(lambda: a.passes, 5, what="the first line read")
    time.sleep(max(QUIET_AFTER, LONG_AFTER) + 0.1)  # quiet: the hub's next pause is the long one
    os.write(wa, b"idle 2.0\n")  # the long pause began at the last pass: this one waits
    written = time.monotonic()
    with contextlib.suppress(AssertionError):
        wait_for(lambda: len(a.passes) > 1, 3 * SETTLED_COALESCE, what="the second line read")
    assert len(a.passes) == 1, "read within the settled pause: no long pause was taken"
    os.write(wb, b"busy j1 3.0 none\n")
    rang = time.monotonic()
    Ringer(bell.path).ring()
    late = first_read_after(b, rang, 35)
    assert late < SETTLED_COALESCE, f"the rung line was read {late:.2f} s after the ring"
    assert a.passes[-1] >= written  # the pass the ring began read every pipe
    for fd in (ra, wa, rb, wb):
        os.close(fd)


@pytest.mark.slow
def test_a_workers_news_that_does_not_ring_is_never_held_the_long_pause(tmp_path: Path) -> None:
    """A worker rings only with news after RING_AFTER without news (doorbell.py): one running a
    job every 0.3 s never rings. The rest of the fleet's `idle` lines come between its lines, so
    the hub has passes that read nothing but "alive"; it takes the long pause only after
    LONG_AFTER without news from anyone, so each of the job lines is read within the settled
    pause, never held the long one."""
    hub = PipeHub(bell=Bell(str(tmp_path)))
    hub.settle(True, 30.0)
    (ra, wa), (rb, wb) = os.pipe(), os.pipe()
    idle, working = Quiet(), Working()
    hub.add(ra, idle)
    hub.add(rb, working)
    time.sleep(max(QUIET_AFTER, LONG_AFTER) + 0.1)
    written = []
    for i in range(8):
        written.append(time.monotonic())
        os.write(wb, f"done j{i} 1.0 ok\n".encode())  # no ring: the last news was 0.3 s ago
        time.sleep(0.15)
        os.write(wa, b"idle 1.0\n")  # a pass of "alive" only: the next pause may be settled
        time.sleep(0.15)
    late = max(first_read_after(working, at, 35) for at in written)
    assert late < 2 * SETTLED_COALESCE, f"a job's line waited {late:.2f} s to be read"
    for fd in (ra, wa, rb, wb):
        os.close(fd)


@pytest.mark.slow
def test_without_a_doorbell_there_is_no_long_pause() -> None:
    """No doorbell (a state dir too long for a socket's path): a long pause asked for is not
    taken; the settled pause reads."""
    hub = PipeHub()
    hub.settle(True, 30.0)
    r, w = os.pipe()
    rec = Quiet()
    hub.add(r, rec)
    os.write(w, b"idle 1.0\n")
    wait_for(lambda: rec.passes, 5, what="the first line read")
    time.sleep(max(QUIET_AFTER, LONG_AFTER) + 0.1)
    written = time.monotonic()  # before the write: the hub may read it before this thread runs again
    os.write(w, b"idle 2.0\n")
    late = first_read_after(rec, written, 35)
    assert late < 2 * SETTLED_COALESCE, f"read {late:.2f} s after it was written"
    os.close(w)
    os.close(r)


def test_the_long_pause_is_a_quarter_of_the_heartbeat_timeout_and_none_for_a_worker_command() -> None:
    from herder.common.config import Config

    assert pipes_mod.long_pause([Config(heartbeat_timeout=3.0)]) == 0.75
    assert pipes_mod.long_pause([Config(), Config(heartbeat_timeout=4.0)]) == 1.0  # the least of the pools'
    assert pipes_mod.long_pause([Config(heartbeat_timeout=600.0)]) == pipes_mod.LONG_PAUSE_MAX
    assert pipes_mod.long_pause([Config(), Config(worker_command=["my-worker"])]) is None
    assert pipes_mod.long_pause([]) is None


class Working(Quiet):
    """A worker running slow jobs: its `busy` and `done` lines wake nobody, but they are more
    than heartbeats."""

    active = True


@pytest.mark.slow
def test_a_settled_small_fleet_running_jobs_has_its_lines_read_without_the_settled_pause() -> None:
    """One worker, settled, a job's line every 50 ms for 1.5 s after a quiet second (nothing
    wakes the loop): its lines are read within about QUIET_COALESCE, never held SETTLED_COALESCE
    as a fleet's heartbeats are (the master counted a leaking worker's jobs half a second late)."""
    hub = PipeHub()
    hub.settle(True)
    r, w = os.pipe()
    rec = Working()
    hub.add(r, rec)
    time.sleep(QUIET_AFTER + 0.1)
    written: list[float] = []
    began = time.monotonic()
    while time.monotonic() - began < 1.5:
        written.append(time.monotonic())
        os.write(w, b"done 1.0 1\n")
        time.sleep(0.05)
    wait_for(lambda: rec.passes and rec.passes[-1] >= written[-1], 5, what="every line read")
    late = max(min(t for t in rec.passes if t >= at) - at for at in written)
    assert late < SETTLED_COALESCE / 2, f"a job's line waited {late * 1000:.0f} ms to be read"
    os.close(w)
    os.close(r)


class Busy(Quiet):
    """A busy worker's lines (`busy`, `done`): each pass that reads them wakes the loop."""

    active = True

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        super().feed(chunk, now)
        return True, None


def passes_of_a_busy_fleet(settled: bool, chatty: bool = False, n: int = 40) -> tuple[int, float]:
    """n pipes, each with a line every 10 ms for a second (one of them also 20 KB at a time if
    `chatty`): how many passes the hub read them in, over how long."""
    hub = PipeHub()
    hub.settle(settled)
    pipes = [os.pipe() for _ in range(n)]
    readers = [Busy() for _ in pipes]
    for (r, _), rec in zip(pipes, readers, strict=True):
        hub.add(r, rec)
    began = time.monotonic()
    while time.monotonic() - began < 1.0:
        for _, w in pipes:
            os.write(w, b"done 1.0 1\n")
        if chatty:
            os.write(pipes[0][1], b"x" * 20_000 + b"\n")
        time.sleep(0.01)
    span = time.monotonic() - began
    for _, w in pipes:
        os.write(w, b"end\n")
    ended = began + span
    wait_for(lambda: all(rec.passes and rec.passes[-1] >= ended for rec in readers), 5, what="all read")
    for r, w in pipes:
        os.close(w)
        os.close(r)
    return len({t for rec in readers for t in rec.passes if t <= ended}), span


@pytest.mark.slow
def test_a_settled_big_busy_fleets_lines_are_read_in_fewer_passes_but_never_a_chatty_pipes() -> None:
    """None starting or stopping, 40 busy pipes: the hub pauses 5 ms a pipe that had lines
    (200 ms), not 5 ms per 4 (50 ms), so each read finds several jobs' lines. Not after a pass
    in which a pipe had 16 KB or more: a job printing that much must not fill its pipe. And not
    for a small fleet (8 pipes): its lines are read as often as when it is not settled."""
    settled, span = passes_of_a_busy_fleet(settled=True)
    assert settled <= span / (pipes_mod.COALESCE * 40) + 3, (settled, span)
    moving, _ = passes_of_a_busy_fleet(settled=False)
    assert moving >= 2 * settled, (moving, settled)
    chatty, _ = passes_of_a_busy_fleet(settled=True, chatty=True)
    assert chatty >= 2 * settled, (chatty, settled)
    small_settled, _ = passes_of_a_busy_fleet(settled=True, n=8)
    small_moving, _ = passes_of_a_busy_fleet(settled=False, n=8)
    assert small_settled >= small_moving / 2, (small_settled, small_moving)


def test_a_paused_pipe_is_left_unread_until_its_time_then_read_again() -> None:
    hub = PipeHub()
    r, w = os.pipe()
    rec = Recorder(pause_after=1)
    hub.add(r, rec)
    os.write(w, b"first\n")
    wait_for(lambda: rec.paused_at, 5, what="the first chunk")
    os.write(w, b"second\n")
    time.sleep(0.2)  # an absence: within the pause, nothing more is read
    assert rec.data == b"first\n"
    wait_for(lambda: rec.data == b"first\nsecond\n" or None, 5, what="the pipe read again after the pause")
    assert time.monotonic() - rec.paused_at >= 0.5
    os.close(w)
    assert rec.ended.wait(5)
    os.close(r)


def steady_threads(p: psutil.Process) -> int:
    """The master's threads, leaving out a moment's one (the control socket answers each
    request on a thread of its own): the fewest of a few readings."""
    seen = []
    for _ in range(5):
        seen.append(p.num_threads())
        time.sleep(0.1)
    return min(seen)


def test_hurry_cuts_the_coalescing_pause_short() -> None:
    """The master reaping a worker has the hub read its last lines now, not after the pause a
    busy fleet's lines pile up in (issue 19: the pause grows to 250 ms)."""
    hub = PipeHub(coalesce=30.0)  # a pause far longer than anything below waits
    r, w = os.pipe()
    rec = Recorder()
    hub.add(r, rec)
    os.write(w, b"first\n")
    wait_for(lambda: rec.feeds == 1, timeout=5, what="the first line read")
    os.write(w, b"second\n")  # the hub pauses now: the line waits in the pipe...
    time.sleep(0.3)
    assert rec.data == b"first\n"
    hub.hurry()  # ... until hurried
    wait_for(lambda: rec.data == b"first\nsecond\n", timeout=5, what="the second line read after hurry()")
    os.close(w)
    hub.hurry()
    assert rec.ended.wait(5)
    os.close(r)


@pytest.mark.slow
def test_the_masters_threads_do_not_grow_with_the_fleet(herder) -> None:
    h = herder(workers="3")
    h.wait_workers(3)
    master = h.master()
    assert master is not None
    few = steady_threads(master)
    scaled = subprocess.run(
        [HERDER, "scale", "12", "--state-dir", h.state_dir], capture_output=True, timeout=30
    )
    assert scaled.returncode == 0, scaled.stderr
    h.wait_status(
        lambda s: s["desired"] == s["actual"] == 12 and len(s["workers"]) == 12, 60, what="12 workers"
    )
    many = steady_threads(master)
    assert many == few, f"{few} threads at 3 workers, {many} at 12"
    h.stop_and_check()


@pytest.mark.slow
def test_workers_run_nicer_than_the_master_so_it_keeps_its_share_of_the_cpu(herder, tmp_path) -> None:
    conf = tmp_path / "herder.toml"
    conf.write_text("[pools.high]\nqueues = ['high']\nworkers = 1\nworker_nice = 0\n"
                    "[pools.bulk]\nqueues = ['bulk']\nworkers = 1\n")  # fmt: skip
    h = herder(config=str(conf))
    st = h.wait_status(
        lambda s: len(s["workers"]) == 2 and all(w["state"] == "idle" for w in s["workers"]), 20
    )
    master = h.master()
    assert master is not None
    nice = {w["pool"]: psutil.Process(w["pid"]).nice() for w in st["workers"]}
    assert nice == {"high": master.nice(), "bulk": master.nice() + 5}  # the default +5; high said 0
    h.stop_and_check()


def test_hurry_takes_a_pipe_out_of_a_floods_pause() -> None:
    """A flooding worker's pipe is left unread for the rest of its second; when that worker
    dies, the master reaping it has its last lines and EOF read at once, not after the pause
    (it waits for them, and every other worker's death waits behind it)."""

    class Flooding(Recorder):
        def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
            super().feed(chunk, now)
            return False, now + 30.0  # a pause far longer than anything below waits

    hub = PipeHub(coalesce=0.0)
    r, w = os.pipe()
    rec = Flooding()
    hub.add(r, rec)
    os.write(w, b"flood\n")
    wait_for(lambda: rec.feeds == 1, timeout=5, what="the first chunk read, and the pipe paused")
    os.write(w, b"last words\n")
    os.close(w)  # the worker died
    time.sleep(0.3)
    assert rec.data == b"flood\n" and not rec.ended.is_set()  # paused: unread
    hub.hurry(r)
    assert rec.ended.wait(5), "the paused pipe's EOF was not read after hurry(fd)"
    assert rec.data == b"flood\nlast words\n"
    os.close(r)


def test_a_settled_big_fleets_hub_relaxes_the_switch_interval_until_the_loop_unsettles() -> None:
    """The master hands the GIL over every millisecond, so its loop waits little for a hub
    parsing lines. A big settled fleet (20 workers' stdout and stderr) relaxes that to Python's default,
    where a starved master's waits for the GIL are what cost; the loop unsettling (a death, a
    start) sets it back at once. A small settled fleet never relaxes it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    hub = PipeHub()
    pipes = [os.pipe() for _ in range(40)]
    readers = [Busy() for _ in pipes]
    try:
        for (r, _), rec in zip(pipes, readers, strict=True):
            hub.add(r, rec)

        def read_once_more() -> None:
            seen = len(readers[0].passes)
            os.write(pipes[0][1], b"done 1.0 1\n")
            wait_for(lambda: len(readers[0].passes) > seen, 5, what="a pass of the hub")

        read_once_more()
        assert sys.getswitchinterval() == 0.001  # not settled
        hub.settle(True)
        read_once_more()
        wait_for(lambda: sys.getswitchinterval() == RELAXED_SWITCH_INTERVAL, 5, what="the relaxed interval")
        hub.settle(False)
        wait_for(lambda: sys.getswitchinterval() == 0.001, 5, what="the interval set back")
        for _, w in pipes[16:]:  # 8 workers' pipes left: a small fleet
            os.close(w)
        wait_for(lambda: all(rec.ended.is_set() for rec in readers[16:]), 5, what="24 pipes' EOF")
        hub.settle(True)
        read_once_more()
        read_once_more()
        assert sys.getswitchinterval() == 0.001
    finally:
        hub.settle(False)
        for _, w in pipes:
            with contextlib.suppress(OSError):
                os.close(w)
        wait_for(lambda: all(rec.ended.is_set() for rec in readers), 5, what="every pipe's EOF")
        for r, _ in pipes:
            with contextlib.suppress(OSError):
                os.close(r)
        sys.setswitchinterval(before)


class Slow(Recorder):
    """A reader that takes 50 ms a chunk once `slow`: a pass over 30 of them takes 1.5 s, as a
    pass over a big busy fleet's pipes can on a starved master."""

    slow = False

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        if self.slow:
            time.sleep(0.05)
        return super().feed(chunk, now)


@contextlib.contextmanager
def slow_fleet(hub: PipeHub, n: int = 30) -> Iterator[tuple[list[tuple[int, int]], list[Slow]]]:
    """n pipes read by Slow readers, added to `hub`; at the end each closed, its EOF read."""
    pipes = [os.pipe() for _ in range(n)]
    readers = [Slow() for _ in pipes]
    try:
        for (r, _), rec in zip(pipes, readers, strict=True):
            hub.add(r, rec)
        yield pipes, readers
    finally:
        for _, w in pipes:
            os.close(w)
        wait_for(lambda: all(rec.ended.is_set() for rec in readers), 10, what="every pipe's EOF")
        for r, _ in pipes:
            os.close(r)


def long_pass(pipes: list[tuple[int, int]], readers: list[Slow]) -> None:
    """Every pipe read once (a worker's pipe the hub has read is no longer new), then a pass over
    them all that takes 1.5 s, under way when this returns."""
    for _, w in pipes:
        os.write(w, b"idle 1.0\n")
    wait_for(lambda: all(rec.feeds for rec in readers), 5, what="every pipe read once")
    for rec in readers:
        rec.slow = True
        rec.feeds = 0
    for _, w in pipes:
        os.write(w, b"idle 2.0\n")
    wait_for(lambda: any(rec.feeds for rec in readers), 5, what="the pass under way")


class Witness(Recorder):
    """A pipe's reader that notes, in the hub's thread, how many of the `others` had been read
    when it was first fed and when its end came: how far the pass over them had got."""

    def __init__(self, others: list[Slow]) -> None:
        super().__init__()
        self.others = others
        self.others_read_at_feed: int | None = None
        self.others_read_at_eof: int | None = None

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        if self.others_read_at_feed is None:
            self.others_read_at_feed = sum(1 for rec in self.others if rec.feeds)
        return super().feed(chunk, now)

    def eof(self) -> None:
        self.others_read_at_eof = sum(1 for rec in self.others if rec.feeds)
        super().eof()


def test_a_pipe_hurried_mid_pass_is_read_to_its_end_before_the_rest_of_the_pass() -> None:
    """The loop reaping a dead worker waits for its last lines (hurry(fd)): the hub reads them
    between two pipes of the pass under way, not after it."""
    hub = PipeHub()
    dead_r, dead_w = os.pipe()
    with slow_fleet(hub) as (pipes, readers):
        dead = Witness(readers)
        hub.add(dead_r, dead)
        os.write(dead_w, b"ready 1 0.5 10\n")
        wait_for(lambda: dead.feeds, 5, what="the worker's `ready`")
        long_pass(pipes, readers)
        os.write(dead_w, b"done j 1.0 ok\n")  # its last line, then its death
        os.close(dead_w)
        hub.hurry(dead_r)
        assert dead.ended.wait(10), "the dead pipe's end was never read"
        assert dead.data == b"ready 1 0.5 10\ndone j 1.0 ok\n"
        assert dead.others_read_at_eof is not None and dead.others_read_at_eof < len(readers), (
            "read only once the pass had read every other pipe"
        )
    with contextlib.suppress(OSError):
        os.close(dead_r)


def test_a_new_workers_first_line_is_read_within_a_long_pass() -> None:
    """A worker spawned while a long pass is under way: its `ready` is read between two pipes of
    that pass (the hub peeks at new workers' stdout every PEEK_EVERY), not two passes later."""
    hub = PipeHub()
    new_r, new_w = os.pipe()
    with slow_fleet(hub) as (pipes, readers):
        new = Witness(readers)
        try:
            long_pass(pipes, readers)
            hub.add(new_r, new)  # spawned now; its first words a moment later
            time.sleep(pipes_mod.PEEK_EVERY)
            os.write(new_w, b"ready 1 1.0 10\n")
            wait_for(lambda: new.feeds, 10, what="the new worker's `ready` read")
            assert new.others_read_at_feed is not None and new.others_read_at_feed < len(readers), (
                "read only once the pass had read every other pipe"
            )
            os.write(new_w, b"idle 2.0\n")  # read from now on with the rest, in its turn
            wait_for(lambda: new.data == b"ready 1 1.0 10\nidle 2.0\n", 10, what="its next line")
        finally:
            os.close(new_w)
            wait_for(new.ended.is_set, 10, what="the new pipe's EOF")
            os.close(new_r)
