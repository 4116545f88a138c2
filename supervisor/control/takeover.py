"""`herder upgrade`, master B's side: the new build's master takes over from master A, which
the watchdog named in ENV_FROM (A's side: handoff.py; the watchdog's: watchdog/upgrade.py;
docs/design.md, "Upgrading in place").

- At its start B asks A for its state and listening sockets (`begin`): B runs with A's host id
  (the cluster never counts this host twice), A's targets, `herder scale`'s bounds and pauses.
- Each pool of B may run `cap` workers: its max plus the surge (upgrade_protocol.SURGE) less
  A's workers still running, stopping ones included; so A's and B's together never exceed it.
- The gate: B is `ready` (to the watchdog) once each pool has a worker listed in RQ as idle or
  busy (`serving`). Only then does B serve the control socket and the HTTP port beside A, and
  ask A to stop its workers: one of A's for each of B's serving beyond the pool's target, so
  the workers taking jobs never fall below it. A exits when its last has; the channel's end
  tells B. A worker's `ready` is not enough: RQ lists it "started" until its first dequeue,
  after RQ's maintenance; one of A's stopped then would leave RQ a worker short.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable, Iterable

from herder.common.control_protocol import LOOP_TIMEOUT, MAX_REPLY, encode, socket_path
from herder.common.upgrade_protocol import SURGE
from herder.supervisor import __version__
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.states import WORKING
from herder.supervisor.control.handoff import summary
from herder.supervisor.policy.pool import Pool

log = logging.getLogger("herder")

EVERY = 0.05  # seconds between B's steps on the channel
CONNECT_TIMEOUT = 10.0


def serving(w: Worker) -> bool:
    """Idle or busy, as RQ lists it: ready, and it said `idle` or `busy` since."""
    return w.life.state in WORKING and w.proc.snapshot().listed


class TakeoverRefused(Exception):
    """A cannot hand over (gone, an older herder, a hand-over under way): B must not start."""


class Takeover:
    def __init__(self, sock: socket.socket, begin: dict, fds: list[int]) -> None:
        self._sock, self._reader = sock, sock.makefile("rb")
        self.a_pid, self.a_version = int(begin["pid"]), str(begin.get("version", ""))
        self.host_id = str(begin["host_id"])
        self.pools_state: dict[str, dict] = dict(begin.get("pools", {}))
        self.listeners: dict[str, socket.socket] = {}
        for name, fd in zip(begin.get("listeners", []), fds, strict=False):
            self.listeners[name] = socket.socket(fileno=fd)
        self.a_live = {name: int(st.get("live", 0)) for name, st in self.pools_state.items()}
        self.a_serving = dict(self.a_live)
        self.a_workers: list[dict] = []
        self.pending: Counter[str] = Counter()  # stops asked of A, not yet answered
        self._outbox: Counter[str] = Counter()
        self._mine: list[dict] = []
        self.passed = False  # the gate: B's first workers ready
        self.done = False  # A is gone (or its channel broke)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake: Callable[[], None] = lambda: None

    @classmethod
    def begin(cls, state_dir: str) -> Takeover:
        """Ask master A (on its control socket) for its state and listening sockets."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.connect(socket_path(state_dir))
            me = {"pid": os.getpid(), "version": __version__}
            sock.sendall(encode({"cmd": "handover", "op": "begin", **me}))
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_REPLY, 8)
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            reply = json.loads(data or b"null")
        except (OSError, ValueError) as exc:
            sock.close()
            raise TakeoverRefused(f"master A does not answer on {socket_path(state_dir)}: {exc}") from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            sock.close()
            for fd in fds:
                os.close(fd)
            why = reply.get("error") if isinstance(reply, dict) else None
            raise TakeoverRefused(why or "master A refused (a herder too old to hand over?)")
        sock.settimeout(2 * LOOP_TIMEOUT)  # a hung A is taken for gone: B fills its pools
        return cls(sock, reply, fds)

    # ---- applied at B's start --------------------------------------------------------------

    def carry_over(self, pools: Iterable[Pool]) -> None:
        """A's run-time state onto B's pools: `herder scale`'s bounds, its targets, its pauses."""
        for pool in pools:
            st = self.pools_state.get(pool.name)
            if st is None:
                continue
            if st.get("scaled"):
                pool.scale({k: int(v) for k, v in st["scaled"].items()})
            if pool.cfg.autoscale:  # the autoscaler goes on from A's target
                pool.target = pool.cfg.bound(int(st.get("target", pool.target)))
            if st.get("paused"):
                pool.pause(True)

    # ---- in B's loop ----------------------------------------------------------------------

    def cap(self, pool: Pool, target: int) -> int:
        """The workers B's pool may run now: A's and B's together within its max and the surge."""
        if self.done:
            return target
        with self._lock:
            a = self.a_live.get(pool.name, 0)
        return max(0, min(target, pool.cfg.ceiling + SURGE - a))

    @staticmethod
    def gate(pools: Iterable[Pool]) -> bool:
        """B's first workers: each running pool that wants any has one serving."""
        return all(any(serving(w) for w in p.live()) for p in pools if not p.draining and p.target > 0)

    def step(self, pools: list[Pool], wake: Callable[[], None]) -> None:
        """After the gate: ask A to stop one of its workers for each of B's serving beyond the
        pool's target (A's still taking jobs counted), and start the channel's thread, which
        wakes the loop (`wake`) when one of A's has gone: B's cap grew."""
        if self.done or not self.passed:
            return
        self._wake = wake
        with self._lock:
            self._mine = summary(w for p in pools for w in p.workers.values())
            for pool in pools:
                mine = sum(serving(w) for w in pool.live())
                theirs = self.a_serving.get(pool.name, 0) - self.pending[pool.name]
                extra = min(theirs, mine + theirs - pool.target)
                if extra > 0:
                    self._outbox[pool.name] += extra
                    self.pending[pool.name] += extra
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="takeover", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        stop = threading.Event()
        while not stop.wait(EVERY):
            with self._lock:
                sent, self._outbox = self._outbox, Counter()
                body = {"cmd": "handover", "op": "step", "workers": self._mine, "retire": dict(sent)}
            try:
                self._sock.sendall(encode(body))
                line = self._reader.readline()
                reply = json.loads(line) if line else None
            except (OSError, ValueError):
                reply = None
            if not isinstance(reply, dict) or not reply.get("ok"):
                break
            with self._lock:
                before = sum(self.a_live.values())
                self.a_live = {k: int(v) for k, v in reply.get("live", {}).items()}
                self.a_serving = {k: int(v) for k, v in reply.get("serving", {}).items()}
                self.a_workers = list(reply.get("workers", []))
                self.pending.subtract(sent)
                fewer = sum(self.a_live.values()) < before
            if fewer:
                self._wake()
        with self._lock:
            self.done, self.a_live, self.a_workers = True, {}, []
        self._wake()
        log.info("herder upgrade: master %d has handed over and exited", self.a_pid)
        self._sock.close()

    def close(self) -> None:
        """B stops: A keeps what it has not handed over."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def view(self) -> dict:
        """The hand-over as status shows it: both masters, whose workers are whose, the versions."""
        with self._lock:
            return {
                "from": {"pid": self.a_pid, "version": self.a_version, "workers": list(self.a_workers)},
                "to": {"pid": os.getpid(), "version": __version__, "workers": list(self._mine)},
                "surge": SURGE,
                "done": self.done,
            }
