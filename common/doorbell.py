"""The master's doorbell: a one-byte datagram a worker sends beside a line that is news (a `busy`,
a `done`, a `ready`, a pause that changed) after RING_AFTER seconds without news, so a master
that reads a quiet fleet's heartbeats only every few seconds still reads news at once.

Why: the master's cost at rest is its wake-ups, not its work (docs/benchmarks.md, "A big
fleet's cost to the master"). A settled, quiet fleet's pipes need reading only as often as
liveness needs (a fraction of heartbeat_timeout); the doorbell wakes the pipe hub for the news
in between. A busy fleet never rings (its news follows news), and a worker that cannot ring
(another program) only has its news read at the quiet pace.

A Unix datagram socket in the state dir (0700: only herder's user and root reach it), named
after the master's pid, as two masters share the dir during `herder upgrade`; its path is in
the workers' environment (ENV_DOORBELL). A ring carries nothing but "read the pipes". A master
that cannot make one (a state dir whose path is too long for a socket) has none, and its hub
keeps its short pause. Standard library only: the worker imports it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
from pathlib import Path

from herder.common.processes import exists

ENV_DOORBELL = "HERDER_DOORBELL"  # the path of the master's doorbell
# A worker rings with news that follows this long without news. The hub takes its long pause
# only after twice this without news from anyone (pipes.py), so whatever arrives during a long
# pause has rung: a line held back there followed another by less, which the hub would have read.
RING_AFTER = 0.5
RECEIVE_BUFFER = 4096  # bytes: a few rings are as good as many; a full bell drops the rest
PREFIX, SUFFIX = "bell-", ".sock"


class Bell:
    """The master's side: bound, non-blocking; the hub waits on it and drains it."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, f"{PREFIX}{os.getpid()}{SUFFIX}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a dead master's of the same pid
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            self.sock.bind(self.path)
        except OSError:
            self.sock.close()
            raise
        self.sock.setblocking(False)
        self._pid = os.getpid()
        atexit.register(self.close)

    def fileno(self) -> int:
        return self.sock.fileno()

    def drain(self) -> int:
        """Take every ring waiting; how many there were."""
        rings = 0
        while True:
            try:
                self.sock.recv(16)
            except OSError:  # BlockingIOError: none left
                return rings
            rings += 1

    def close(self) -> None:
        """At the master's exit; not in a child forked from it (a worker forked from a fork
        server forked from the master runs the master's exit handlers)."""
        if os.getpid() != self._pid:
            return
        self.sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def open_bell(state_dir: str) -> Bell | None:
    """The master's doorbell in `state_dir`, or None where it cannot have one. The bells of
    masters that died without closing theirs go first."""
    if not state_dir or not hasattr(socket, "AF_UNIX"):
        return None
    for old in Path(state_dir).glob(f"{PREFIX}*{SUFFIX}"):
        pid = old.name[len(PREFIX) : -len(SUFFIX)]
        if pid.isdigit() and int(pid) != os.getpid() and not exists(int(pid)):
            with contextlib.suppress(OSError):
                old.unlink()
    try:
        return Bell(state_dir)
    except OSError:
        return None


class Ringer:
    """A worker's side: rings the bell named in its environment, never blocking, never raising
    (a master gone or a full bell: the pipes hold the news anyway)."""

    def __init__(self, path: str | None) -> None:
        self.path = path or None
        self.sock: socket.socket | None = None

    @classmethod
    def from_env(cls) -> Ringer:
        return cls(os.environ.get(ENV_DOORBELL))

    def ring(self) -> None:
        if self.path is None:
            return
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.sock.setblocking(False)
            self.sock.sendto(b"!", self.path)
        except OSError:
            pass  # full, or nobody listening: the line itself is in the pipe
