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
a flood's pause, and has it read between two pipes of a pass under way, not after it. A
reader may ask to be paused (a flooding worker): its pipe leaves the selector until then, and
the worker blocks on its full pipe (back-pressure), never the master.

A settled, quiet fleet says nothing but "alive" for seconds on end: the hub then reads its
pipes only every few seconds (the long pause, a quarter of heartbeat_timeout at most), and the
master's doorbell (herder.common.doorbell), which a worker rings beside news that follows a
quiet spell, ends that pause the moment a job starts or a worker pauses.
"""

from __future__ import annotations

import os
import selectors
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from herder.common.config import Config
from herder.common.doorbell import RING_AFTER, Bell, open_bell

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
# A settled fleet that has said nothing but "alive" for LONG_AFTER: its pipes are read every
# long pause, which the doorbell ends for news. Why: an idle master's cost is its wake-ups (two
# passes a second were about two fifths of it at 256 workers, docs/benchmarks.md). A quarter of
# heartbeat_timeout at most, so a silent worker's silence is seen at most that late. None
# without a doorbell (a state dir too long for its path), nor for a --worker-command program,
# which does not ring.
LONG_PAUSE_MAX = 2.5
LONG_AFTER = 2 * RING_AFTER  # a worker rings news after RING_AFTER quiet (doorbell.py)
# The master hands the GIL over every millisecond (supervisor/__main__.py), so its loop, woken
# by a death, waits little for a hub parsing lines. While a big fleet is settled, the hub
# relaxes that to Python's default: there its threads' waits for the GIL are what cost, not
# what a handover delays. 256 busy workers on 2 cores leave the master a few percent of a core,
# so a thread holding the GIL is often off the CPU, and each waiting thread wakes every
# interval to ask for it: at 1 ms that was a third of the master's CPU outside the hub
# (docs/benchmarks.md). The loop ends the relaxed spell as it unsettles (a death, a start).
RELAXED_SWITCH_INTERVAL = 0.005
HURRIED_READS = 4  # chunks a pass reads at most out of turn from a pipe hurry(fd) asked for
# A pass over a big busy fleet's pipes can take seconds of wall time on a starved master (64
# noisy workers on 2 cores): every PEEK_EVERY of it, the hub looks between two pipes at the
# new workers' stdout it has not read yet, so a replacement's `ready` is read then, not two
# passes later (it was 7 s after the kill, median; docs/benchmarks.md). Only those: reading
# every busy stdout more often would cost a big busy fleet's batching.
PEEK_EVERY = 0.05


@dataclass(slots=True)
class _Pass:
    """What one pass of the hub read, for what it does after: whom to wake, how long to pause."""

    events: list[tuple[selectors.SelectorKey, int]]  # what it reads in turn
    wakes: set[Callable[[], None]] = field(default_factory=set)
    read_any: bool = False
    active: bool = False  # a reader heard more than "alive"
    biggest: int = 0  # the most one pipe had, in bytes
    _in_turn: set[int] | None = None

    def in_turn(self) -> set[int]:
        """The pipes this pass reads in its turn (a peek leaves those alone)."""
        if self._in_turn is None:
            self._in_turn = {key.fd for key, _ in self.events}
        return self._in_turn


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


def long_pause(cfgs: list[Config]) -> float | None:
    """The long pause for a fleet run with these configs (its pools'), or None for none: any
    --worker-command program may not ring the doorbell."""
    if not cfgs or any(c.worker_command for c in cfgs):
        return None
    return min(LONG_PAUSE_MAX, min(c.heartbeat_timeout for c in cfgs) / 4)


class PipeHub:
    def __init__(self, coalesce: float = COALESCE, bell: Bell | None = None) -> None:
        self.coalesce = coalesce
        self._bell = bell
        self._long_pause: float | None = None  # settle(): the master's, for a quiet fleet
        self._active_at = 0.0  # monotonic: the last pass that read more than "alive"
        self._sel = selectors.DefaultSelector()
        self._poke_r, self._poke_w = os.pipe()
        os.set_blocking(self._poke_r, False)
        os.set_blocking(self._poke_w, False)
        self._sel.register(self._poke_r, selectors.EVENT_READ, None)
        self._pause = selectors.DefaultSelector()  # the coalescing pause: a poke ends it early
        self._pause.register(self._poke_r, selectors.EVENT_READ)
        self._long = selectors.DefaultSelector()  # the long pause: a poke or a ring ends it
        self._long.register(self._poke_r, selectors.EVENT_READ)
        if bell is not None:
            self._long.register(bell.fileno(), selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._new: list[tuple[int, PipeReader]] = []
        self._resume: set[int] = set()  # fds hurry() asked to read to their end, paused or not
        self._draining: set[int] = set()  # those, in the hub's hands: read on, never paused
        self._paused: dict[int, tuple[float, PipeReader]] = {}  # fd -> (resume at, reader)
        self._fresh = selectors.DefaultSelector()  # new workers' stdout, not read yet (PEEK_EVERY)
        self._fresh_fds: set[int] = set()  # the same fds, for a cheap look on every read
        self.after_pass: list[Callable[[], None]] = []  # run after each pass that read anything
        self._woke_at = 0.0  # monotonic: the last pass with a line that wakes the loop
        self._settled = False  # the master's loop is settled (settle())
        self._brisk: float | None = None  # the switch interval the hub relaxed from, while relaxed
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

    def settle(self, settled: bool, long_pause: float | None = None) -> None:
        """The master's loop is settled, or no longer is (any thread): no longer ends a settled
        pause at once, as a worker's start or stop needs its lines read promptly. `long_pause`:
        how long a settled quiet fleet's pipes may go unread (long_pause()), None for never."""
        self._long_pause = long_pause if self._bell is not None else None
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
            self._relax(self._settled and len(self._sel.get_map()) > SETTLED_BUSY_PIPES)
            now = time.monotonic()
            p = _Pass(events)
            peek_at = now + PEEK_EVERY
            out_of_turn = False  # a pipe was read out of turn: some events may be for pipes gone since
            for key, _ in events:
                if self._resume:
                    out_of_turn = True
                    self._read_out_of_turn(now, p)
                elif (self._fresh_fds or self._new) and time.monotonic() >= peek_at:
                    out_of_turn = True
                    self._read_out_of_turn(now, p, peek=True)
                    peek_at = time.monotonic() + PEEK_EVERY
                if out_of_turn and self._sel.get_map().get(key.fd) is not key:
                    continue  # read to its end out of turn (its number may be a new pipe's by now)
                if key.data is None:
                    self._take_new()
                else:
                    self._read(key, now, p)
            for fd, (at, reader) in list(self._paused.items()):
                if at <= now:
                    del self._paused[fd]
                    self._sel.register(fd, selectors.EVENT_READ, reader)
            for wake in p.wakes:
                wake()
            if p.wakes:
                self._woke_at = now
            if p.read_any:
                for after in self.after_pass:
                    after()
                # Let busy workers' lines pile up: fewer wake-ups and reads. Longer when many pipes
                # had something (a large busy fleet), so a read still finds a few lines, not one:
                # the master's cost per job stays flat as the fleet grows. A poke ends it.
                pause = self.coalesce * min(COALESCE_MAX_FACTOR, max(1.0, len(events) / BUSY_PIPES))
                big = len(self._sel.get_map()) > SETTLED_BUSY_PIPES  # its pipes, and the poke pipe
                if self._settled and big and p.biggest < SETTLED_BUSY_CHUNK:
                    pause = max(pause, min(SETTLED_BUSY_MAX, self.coalesce * len(events)))
                if p.active:
                    self._active_at = now
                if now - self._woke_at >= QUIET_AFTER:
                    # A quiet fleet: its `idle` lines (one a worker a second) read in batches,
                    # not one wake-up each. A `ready` or `stop` then waits up to this pause once;
                    # a death does not (the reap pokes).
                    settled = self._settled and not p.active and p.biggest <= SETTLED_CHUNK
                    pause = max(pause, SETTLED_COALESCE if settled else QUIET_COALESCE)
                    if settled and self._long_wait(now, pause):
                        continue
                self._pause.select(pause)

    def _read(self, key: selectors.SelectorKey, now: float, p: _Pass) -> bool | None:
        """One read of a pipe, fed to its reader: True at its end (the reader closes it), False
        after a chunk, None with nothing to read."""
        reader: PipeReader = key.data
        try:
            chunk = os.read(key.fd, CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            chunk = b""
        if self._fresh_fds and key.fd in self._fresh_fds:
            self._fresh_fds.discard(key.fd)
            self._fresh.unregister(key.fd)  # before its reader may close it (EOF)
        if not chunk:
            self._sel.unregister(key.fd)
            self._draining.discard(key.fd)
            reader.eof()
            p.wakes.add(reader.wake)
            return True
        p.read_any = True
        p.biggest = max(p.biggest, len(chunk))
        important, pause_until = reader.feed(chunk, now)
        p.active = p.active or reader.active
        if important:
            p.wakes.add(reader.wake)
        if pause_until is not None and key.fd not in self._draining:
            self._sel.unregister(key.fd)
            self._paused[key.fd] = (pause_until, reader)
        return False

    def _read_out_of_turn(self, now: float, p: _Pass, peek: bool = False) -> None:
        """Between two pipes of a pass: the pipes hurry(fd) asked for, to their end (the loop
        reaping a dead worker waits for its last lines; a dead worker's pipe holds a pipe
        buffer at most, and HURRIED_READS bounds a live one's, a flood's let out of its pause);
        and at a `peek`, the new workers' stdout that has something and that the pass does not
        read in its turn (PEEK_EVERY). The pipes of workers spawned since the pass began are
        taken in; a peek leaves the poke, so the pause after the pass still ends at once."""
        self._take_new(drain_poke=not peek)
        for fd in list(self._draining):
            key = self._sel.get_map().get(fd)
            for _ in range(HURRIED_READS if key is not None else 0):
                if self._read(key, now, p) is not False:
                    break  # its end, or nothing more yet (a job's child may hold it open)
        if peek:
            for fresh, _ in self._fresh.select(0):
                if self._resume:
                    break  # a reap waits: its pipe first (the caller's next look)
                key = self._sel.get_map().get(fresh.fd)
                if key is not None and fresh.fd not in p.in_turn():
                    self._read(key, now, p)

    def _relax(self, relaxed: bool) -> None:
        """Relax the process's switch interval (a big settled fleet), or set it back; only the
        hub's thread switches it, so the two never cross."""
        if relaxed and self._brisk is None:
            self._brisk = sys.getswitchinterval()
            sys.setswitchinterval(max(self._brisk, RELAXED_SWITCH_INTERVAL))
        elif not relaxed and self._brisk is not None:
            sys.setswitchinterval(self._brisk)
            self._brisk = None

    def _long_wait(self, now: float, pause: float) -> bool:
        """The long pause, if the fleet has said nothing but "alive" for LONG_AFTER and no ring
        waits (a ring taken here may be for a line not read yet: the short pause, then). Capped
        at a flooding pipe's return. False: not taken."""
        long_pause, bell = self._long_pause, self._bell
        if long_pause is None or bell is None or now - self._active_at < LONG_AFTER or bell.drain():
            return False
        if self._paused:
            long_pause = min(long_pause, min(at for at, _ in self._paused.values()) - now)
        if long_pause <= pause:
            return False
        self._long.select(long_pause)
        bell.drain()  # what rang is in the pipes, read next
        return True

    def _take_new(self, drain_poke: bool = True) -> None:
        try:
            while drain_poke and os.read(self._poke_r, 4096):
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
            if reader.order == 0:  # a worker's stdout: its first words are its start (PEEK_EVERY)
                self._fresh.register(fd, selectors.EVENT_READ)
                self._fresh_fds.add(fd)
        for fd in resume & self._paused.keys():
            _, reader = self._paused.pop(fd)
            self._sel.register(fd, selectors.EVENT_READ, reader)


_hub: PipeHub | None = None
_hub_lock = threading.Lock()
_bell: Bell | None = None
_bell_made = False


def settle(settled: bool, long: float | None = None) -> None:
    """PipeHub.settle on the process's hub, if it has one (a master on fakes has none)."""
    if _hub is not None:
        _hub.settle(settled, long)


def doorbell_name(state_dir: str) -> str | None:
    """The path of the doorbell the process's hub waits on (made here, in `state_dir`, without
    the hub's thread: the master forks its first fork server while it has none), for the
    workers' environment; None without one."""
    with _hub_lock:
        bell = _the_bell(state_dir)
        return bell.path if bell else None


def _the_bell(state_dir: str | None) -> Bell | None:
    """The process's doorbell: made once, on the first call with a state dir."""
    global _bell, _bell_made
    if not _bell_made and state_dir:
        _bell, _bell_made = open_bell(state_dir), True
    return _bell


def hub() -> PipeHub:
    """The process's one hub, started on first use (after any fork: the master's own)."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = PipeHub(bell=_the_bell(None))
        return _hub
