"""The readers of a worker's two pipes (supervisord's dispatchers): stdout is the protocol
channel, each line recorded in the worker's Observations; stderr is whatever the worker and its
jobs print, relayed into herder's log.

One thread feeds every worker's readers (herder.supervisor.children.pipes), so the master's cost per
line does not grow with the fleet. Whatever a worker writes, the master's memory stays bounded:
lines are length-capped, stderr is rate-limited, a stdout flood is slowed by back-pressure (its
pipe is left unread for the rest of the second, the worker blocks on it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any, Protocol

from herder.common.worker_protocol import MAX_LINE_BYTES, LineSplitter, ProtocolError, parse_line
from herder.supervisor.children import logs
from herder.supervisor.children.observations import FinishedJob, Observations, record, wait_to_log

log = logging.getLogger("herder")

# A busy worker sends ~3 lines a job; 20k lines/s is ~6x the fastest no-op job rate seen.
STDOUT_LINES_PER_SECOND = 20_000
STDERR_LINES_PER_SECOND = 1000  # RQ logs ~4 lines a job; fast no-op jobs reach ~250 jobs/s


class Change(Protocol):
    """`with proc.changing() as obs`: `quiet` set inside says the change moved nothing the loop
    acts on (an `idle` that only says the worker is alive), so it is not told (changes.py)."""

    quiet: bool

    def __enter__(self) -> Observations: ...
    def __exit__(self, *exc: object) -> None: ...


class Piped(Protocol):
    """What the readers use of a watched worker process (herder.supervisor.children.workerproc)."""

    label: str  # the prefix of its relayed stderr
    lock: threading.Lock  # the readers write obs and finished under it; the loop reads under it
    finished: deque[FinishedJob]
    stdout_done: threading.Event

    def changing(self) -> Change:
        """Its Observations to change, under `lock` (the loop's next snapshot sees the change)."""
        ...

    @property
    def stdout(self) -> IO[bytes]: ...

    @property
    def stderr(self) -> IO[bytes]: ...

    def json_fields(self) -> dict[str, Any]: ...


class StdoutReader:
    """The protocol channel: each line recorded in the worker's Observations (pipes.PipeReader)."""

    order = 0  # before stderr in a pass of the hub

    def __init__(self, proc: Piped, wake: Callable[[], None]) -> None:
        self.proc, self.wake = proc, wake
        self.active = False  # the last chunk had a line other than a plain `idle` (pipes.PipeReader)
        self.splitter = LineSplitter(MAX_LINE_BYTES)
        self.window_start, self.lines = time.monotonic(), 0

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        proc, important = self.proc, False
        self.active = False
        if chunk[:5] == b"idle " and self.alive(chunk):
            self.lines += 1
        else:
            for raw, truncated in self.splitter.feed(chunk):
                self.lines += 1
                if truncated:
                    self.active = True
                    with proc.changing() as obs:
                        obs.oversized += 1
                        obs.last_error = f"line longer than {MAX_LINE_BYTES} bytes"
                    continue
                important |= self.record(raw)
        if now - self.window_start >= 1.0:
            self.window_start, self.lines = now, 0
        elif self.lines > STDOUT_LINES_PER_SECOND:  # a flood: unread for the rest of the second
            with proc.changing() as obs:
                obs.throttled += 1
            return important, self.window_start + 1.0
        return important, None

    def alive(self, chunk: bytes) -> bool:
        """A chunk of one whole `idle <ts>` line from a worker that neither waits nor pauses:
        it says only that the worker is alive, so it moves only `last_seen`, as `record` would.
        An idle fleet's lines are nearly all these, one a worker a second: their cost is most of
        an idle master's. False (nothing done): the chunk is for the general way, `record`."""
        if chunk.find(b"\n") != len(chunk) - 1 or not self.splitter.empty:
            return False
        try:  # as parse_line's: a number, not NaN, not negative (a pause's word fails here)
            ts = float(chunk[5:])
        except ValueError:
            return False
        if not ts >= 0:
            return False
        change = self.proc.changing()
        with change as obs:
            change.quiet = True
            if obs.waiting is not None or obs.paused is not None or not obs.listed:
                return False  # news: the general way says what ended, or that RQ lists it
            obs.last_seen = time.monotonic()
        return True

    def record(self, raw: bytes) -> bool:
        """One line, parsed and recorded; True if the loop should look now."""
        proc = self.proc
        try:
            msg = parse_line(raw)
        except ProtocolError as exc:
            self.active = True
            with proc.changing() as obs:
                obs.malformed += 1
                obs.last_error = str(exc)
                if raw[:6] == b"ready ":
                    obs.ready_refused = obs.last_error
            return False
        change = proc.changing()
        with change as obs:
            # An `idle` that changes no pause and ends no wait only says the worker is alive:
            # its silence deadline is murder's own to look at (changes.py), not a change.
            change.quiet = msg.verb == "idle" and obs.waiting is None and obs.paused == msg.paused
            important = record(obs, proc.finished, msg, time.monotonic())
            change.quiet = change.quiet and not important  # the first `idle` after `ready` is news
            news = wait_to_log(obs) if msg.verb == "wait" else None
        self.active = self.active or not change.quiet
        if news is not None:
            log.warning("%s: waiting for %s", proc.label, news)
        return important

    def eof(self) -> None:
        proc = self.proc
        with proc.changing() as obs:
            obs.stdout_eof = True
            obs.eof_at = time.monotonic()
        proc.stdout.close()  # the reader owns its pipe: no fd is closed under a read
        proc.stdout_done.set()


class StderrReader:
    """Whatever the worker (and its jobs) print: relayed into herder's log, rate-limited."""

    order = 1

    def __init__(self, proc: Piped) -> None:
        self.proc = proc
        self.wake: Callable[[], None] = _nothing  # stderr never needs the loop's attention
        self.active = True  # what it reads is a job's or the worker's own output, never a heartbeat
        self.splitter = LineSplitter(MAX_LINE_BYTES)
        self.window_start, self.logged = time.monotonic(), 0

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        proc = self.proc
        if now - self.window_start >= 1.0:
            self.window_start, self.logged = now, 0
        lines = []
        for raw, truncated in self.splitter.feed(chunk):
            if self.logged >= STDERR_LINES_PER_SECOND:  # the master reports the count
                with proc.changing() as obs:
                    obs.stderr_dropped += 1
                continue
            self.logged += 1
            text = raw.decode("utf-8", "replace").rstrip()
            lines.append(text + " [line truncated]" if truncated else text)
        logs.relay(proc.label, lines, proc.json_fields() if lines and logs.json_lines else None, hold=True)
        return False, None

    def eof(self) -> None:
        proc = self.proc
        tail = self.splitter.flush()
        if tail:
            lines = [tail.decode("utf-8", "replace").rstrip()]
            logs.relay(proc.label, lines, proc.json_fields() if logs.json_lines else None)
        proc.stderr.close()


def _nothing() -> None:
    pass
