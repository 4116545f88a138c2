"""One thread reads every worker's pipes: a selectors loop over all their stdout and stderr.

A thread per pipe made the master's CPU per job grow with the fleet (104 threads at 48
workers fought for the GIL and the cores; docs/benchmarks.md): the hub's cost per line is
flat in the fleet size, and one thread stays one thread at 4 workers or 256.

Readers still only record what they saw; the master's loop decides. Each pipe has a
PipeReader (herder.supervisor.children.dispatchers has the two kinds) that the hub feeds chunk by
chunk. After a pass that read anything the hub pauses COALESCE (longer when many pipes had
something): lines pile up in the pipes, so a busy fleet costs fewer wake-ups and reads. The
pause waits on the hub's poke pipe, so `hurry()` (the master reaping a worker, whose last
lines it must read first) and a new pipe end it at once; `hurry(fd)` also takes a pipe out of
a flood's pause. A reader may ask to be paused (a
flooding worker): its pipe leaves the selector until then, and the worker blocks on its full
pipe (back-pressure), never the master.
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from collections.abc import Callable
from typing import Protocol

CHUNK = 65536
COALESCE = 0.005  # seconds the hub pauses after a pass that read anything
BUSY_PIPES = 4  # pipes with something to read in one pass, above which the pause grows...
COALESCE_MAX_FACTOR = 50.0  # ... to at most this many times COALESCE (250 ms, at 200 such pipes)
QUIET_AFTER = 1.0  # seconds without a line that wakes the loop, after which the fleet is quiet...
QUIET_COALESCE = 0.05  # ... and the pause is this long: its idle lines are read a batch at a time
# While the master's loop is settled (it looks once a second: no worker or scheduler starting or
# stopping), a quiet fleet's lines are read twice a second, if each pipe had no more than a line
# or two. A wake-up costs far more than a line: after a pause the hub's code runs cold, 0.2 to
# 0.5 ms a pass against a few us a line (perf on a hub of 1 to 256 idle pipes), so two passes a
# second, not four, halve an idle fleet's cost; a quiet fleet's first `busy` then shows within
# half a second. A pass that read more than heartbeats (a job's `busy` or `done`, its prints: a
# reader's `active`) keeps the short pause, so a small busy fleet's lines are not held half a
# second; so does a pass that found more than a line or two in a pipe, which must not fill.
SETTLED_COALESCE = 0.5
SETTLED_CHUNK = 256  # bytes: the most a pipe may have had in a pass for the settled pause
# A settled big busy fleet (workers running jobs, none starting or stopping; the hub reads
# SETTLED_BUSY_PIPES pipes or more, 16 workers) pauses COALESCE per pipe that had something, up to a
# second: at 256 workers each running a few jobs a second, a read then finds several jobs'
# lines, not one, and a job costs the hub about the same at 256 workers as at 4. Not a small
# fleet: its reads find many jobs each already, and a longer pause only held its lines back
# (a replacement among 4 printing workers came 30 ms later at p90). Not after a pass in which
# a pipe had SETTLED_BUSY_CHUNK or more (a job that prints a lot): its pipe must not fill.
SETTLED_BUSY_PIPES = 32
SETTLED_BUSY_MAX = 1.0
SETTLED_BUSY_CHUNK = CHUNK // 4


class PipeReader(Protocol):
    wake: Callable[[], None]  # tells the master's loop to look now
    # Read first within a pass, lowest first: a worker's stdout (`busy <job>`) before its
    # stderr (the job's own lines), so a relayed line knows the job it came from.
    order: int
    # Whether the chunk it was last fed said more than "alive" (an `idle` heartbeat): a job's
    # line, what a job printed. A pass that heard only heartbeats may take the settled pause.
    active: bool

    def feed(self, chunk: bytes, now: float) -> tuple[bool, float | None]:
        """Take a chunk; (the master should look now, pause the pipe until this monotonic time)."""
        ...

    def eof(self) -> None:
        """The pipe ended (or failed): flush, close it, say so."""
        ...


class PipeHub:
    def __init__(self, coalesce: float = COALESCE) -> None:
        self.coalesce = coalesce
        self._sel = selectors.DefaultSelector()
        self._poke_r, self._poke_w = os.pipe()
        os.set_blocking(self._poke_r, False)
        os.set_blocking(self._poke_w, False)
        self._sel.register(self._poke_r, selectors.EVENT_READ, None)
        self._pause = selectors.DefaultSelector()  # the coalescing pause: a poke ends it early
        self._pause.register(self._poke_r, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._new: list[tuple[int, PipeReader]] = []
        self._resume: set[int] = set()  # fds hurry() asked to read to their end, paused or not
        self._draining: set[int] = set()  # those, in the hub's hands: read on, never paused
        self._paused: dict[int, tuple[float, PipeReader]] = {}  # fd -> (resume at, reader)
        self.after_pass: list[Callable[[], None]] = []  # run after each pass that read anything
        self._woke_at = 0.0  # monotonic: the last pass with a line that wakes the loop
        self._settled = False  # the master's loop is settled (settle())
        self._thread = threading.Thread(target=self._run, name="pipes", daemon=True)
        self._thread.start()

    def add(self, fd: int, reader: PipeReader) -> None:
        """Read `fd` from now on (any thread); the reader closes it at EOF."""
        os.set_blocking(fd, False)
        with self._lock:
            self._new.append((fd, reader))
        self._poke()

    def hurry(self, fd: int | None = None) -> None:
        """Read every pipe now, cutting a coalescing pause short (any thread); and `fd` on to
        its end, paused by a flood or not (the master reaping a worker reads its last lines at
        once: the worker is dead, its pipe holds what it holds)."""
        if fd is not None:
            with self._lock:
                self._resume.add(fd)
        self._poke()

    def settle(self, settled: bool) -> None:
        """The master's loop is settled, or no longer is (any thread): no longer ends a settled
        pause at once, as a worker's start or stop needs its lines read promptly."""
        was, self._settled = self._settled, settled
        if was and not settled:
            self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._poke_w, b"\0")
        except BlockingIOError:
            pass  # already poked

    def _run(self) -> None:
        while True:
            timeout = None
            if self._paused:
                timeout = max(0.0, min(at for at, _ in self._paused.values()) - time.monotonic())
            events = sorted(self._sel.select(timeout), key=lambda e: e[0].data.order if e[0].data else -1)
            now = time.monotonic()
            wakes: set[Callable[[], None]] = set()
            read_any = active = False
            biggest = 0  # the most one pipe had, in bytes
            for key, _ in events:
                if key.data is None:
                    self._take_new()
                    continue
                reader: PipeReader = key.data
                try:
                    chunk = os.read(key.fd, CHUNK)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    self._sel.unregister(key.fd)
                    self._draining.discard(key.fd)
                    reader.eof()
                    wakes.add(reader.wake)
                    continue
                read_any = True
                biggest = max(biggest, len(chunk))
                important, pause_until = reader.feed(chunk, now)
                active = active or reader.active
                if important:
                    wakes.add(reader.wake)
                if pause_until is not None and key.fd not in self._draining:
                    self._sel.unregister(key.fd)
                    self._paused[key.fd] = (pause_until, reader)
            for fd, (at, reader) in list(self._paused.items()):
                if at <= now:
                    del self._paused[fd]
                    self._sel.register(fd, selectors.EVENT_READ, reader)
            for wake in wakes:
                wake()
            if wakes:
                self._woke_at = now
            if read_any:
                for after in self.after_pass:
                    after()
                # Let busy workers' lines pile up: fewer wake-ups and reads. Longer when many pipes
                # had something (a large busy fleet), so a read still finds a few lines, not one:
                # the master's cost per job stays flat as the fleet grows. A poke ends it.
                pause = self.coalesce * min(COALESCE_MAX_FACTOR, max(1.0, len(events) / BUSY_PIPES))
                big = len(self._sel.get_map()) > SETTLED_BUSY_PIPES  # its pipes, and the poke pipe
                if self._settled and big and biggest < SETTLED_BUSY_CHUNK:
                    pause = max(pause, min(SETTLED_BUSY_MAX, self.coalesce * len(events)))
                if now - self._woke_at >= QUIET_AFTER:
                    # A quiet fleet: its `idle` lines (one a worker a second) read in batches,
                    # not one wake-up each. A `ready` or `stop` then waits up to this pause once;
                    # a death does not (the reap pokes).
                    settled = self._settled and not active and biggest <= SETTLED_CHUNK
                    pause = max(pause, SETTLED_COALESCE if settled else QUIET_COALESCE)
                self._pause.select(pause)

    def _take_new(self) -> None:
        try:
            while os.read(self._poke_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            new, self._new = self._new, []
            resume, self._resume = self._resume, set()
        # Only a pipe still read: one whose EOF came meanwhile is closed, and its number may be
        # a new worker's pipe by now (registered below), which must stay under flood control.
        resume &= self._sel.get_map().keys() | self._paused.keys()
        self._draining |= resume
        for fd, reader in new:
            self._sel.register(fd, selectors.EVENT_READ, reader)
        for fd in resume & self._paused.keys():
            _, reader = self._paused.pop(fd)
            self._sel.register(fd, selectors.EVENT_READ, reader)


_hub: PipeHub | None = None
_hub_lock = threading.Lock()


def settle(settled: bool) -> None:
    """PipeHub.settle on the process's hub, if it has one (a master on fakes has none)."""
    if _hub is not None:
        _hub.settle(settled)


def hub() -> PipeHub:
    """The process's one hub, started on first use (after any fork: the master's own)."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = PipeHub()
        return _hub
