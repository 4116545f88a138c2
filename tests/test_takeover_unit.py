"""Master B's side of `herder upgrade` (control/takeover.py), as decisions: when B counts one of
its workers serving, and how many of A's it asks to stop for them. Real readers, real
Observations, a real channel (a socket pair standing for A's control socket); the workers are
fakes whose lines the test writes."""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections import deque
from dataclasses import replace

from fakes import SHORT_TIMEOUT_CONFIG, FakeClock, FakeProc
from herder.supervisor.children.dispatchers import StdoutReader
from herder.supervisor.children.fleet import Life, Worker
from herder.supervisor.children.observations import Observations
from herder.supervisor.children.states import WorkerState
from herder.supervisor.control.takeover import Takeover
from herder.supervisor.policy.pool import Pool

A_PID = 4242


class Piped:
    """The stdout reader's view of a worker (dispatchers.Piped), over a FakeProc's Observations;
    `changes` counts the lines that moved something the loop acts on, as workerproc's does."""

    label = "slot 0 pid 1"
    stdout = stderr = None

    def __init__(self, proc: FakeProc) -> None:
        self.obs, self.lock, self.finished = proc.obs, threading.Lock(), deque()
        self.changes = 0

    def changing(self) -> Change:
        return Change(self)

    def json_fields(self) -> dict[str, object]:
        return {}


class Change:
    def __init__(self, proc: Piped) -> None:
        self.proc, self.quiet = proc, False

    def __enter__(self) -> Observations:
        self.proc.lock.acquire()
        return self.proc.obs

    def __exit__(self, *exc: object) -> None:
        self.proc.lock.release()
        if not self.quiet:
            self.proc.changes += 1


def b_worker(pool: Pool, clock: FakeClock, slot: int) -> tuple[Worker, StdoutReader]:
    """One of B's workers, spawned, and the reader of its stdout."""
    proc = FakeProc(100 + slot, clock)
    w = Worker(slot, proc, spawned_at=clock.t, pool=pool.name, life=Life(state=WorkerState.STARTING))
    pool.admit(w)
    return w, StdoutReader(Piped(proc), lambda: None)


def says(w: Worker, reader: StdoutReader, line: bytes) -> bool:
    """The worker writes `line`; the master's loop moves its state as murder.py would."""
    important, _ = reader.feed(line, now=0.0)
    if w.proc.snapshot().ready and w.life.state == WorkerState.STARTING:
        w.life.state = WorkerState.IDLE
    return important


def test_a_worker_serves_once_it_said_idle_or_busy_after_ready(clock: FakeClock) -> None:
    """`ready` comes when RQ has registered the worker ("started"); RQ lists it idle only at its
    first dequeue, and the worker's `idle` comes after that. Only then is it serving."""
    pool = Pool.build("default", SHORT_TIMEOUT_CONFIG, "test", None, itertools.count(1))
    w, reader = b_worker(pool, clock, 0)
    says(w, reader, b"idle 100.0\n")  # a sign of life before `ready`: not serving
    assert not Takeover.gate([pool])
    assert says(w, reader, b"ready 100 100.1 10\n")  # the loop looks at once...
    assert w.life.state == WorkerState.IDLE and not Takeover.gate([pool])  # ... but RQ says "started"
    changes = reader.proc.changes
    assert says(w, reader, b"idle 100.2\n")  # the first `idle` after `ready`: news, at once
    assert Takeover.gate([pool]) and reader.proc.changes == changes + 1
    assert not says(w, reader, b"idle 100.3\n")  # later ones only say it is alive
    # A worker whose first word after `ready` is a job's `busy` serves too.
    v, reader = b_worker(pool, clock, 1)
    says(v, reader, b"ready 101 100.1 10\n")
    says(v, reader, b"busy j1 100.2 180 default tasks.f\n")
    assert v.proc.snapshot().listed


def test_b_asks_a_to_stop_one_worker_for_each_of_its_own_that_rq_lists(clock: FakeClock) -> None:
    """A serves a pool of 4. B has two workers ready, of which RQ lists one idle: A is asked to
    stop one, not two, so RQ never lists fewer than 4 idle or busy; the second once it is."""
    cfg = replace(SHORT_TIMEOUT_CONFIG, workers=4)
    pool = Pool.build("default", cfg, "test", None, itertools.count(1))
    ours, a_end = socket.socketpair()
    begin = {"pid": A_PID, "version": "0", "host_id": "h", "pools": {"default": {"live": 4}}}
    takeover = Takeover(ours, begin, [])
    a_reads = a_end.makefile("rb")
    try:
        first, reader1 = b_worker(pool, clock, 0)
        second, reader2 = b_worker(pool, clock, 1)
        says(first, reader1, b"ready 100 100.0 10\n")
        says(first, reader1, b"idle 100.1\n")
        says(second, reader2, b"ready 101 100.0 10\n")
        assert Takeover.gate([pool])
        takeover.passed = True
        takeover.step([pool], lambda: None)
        asked = json.loads(a_reads.readline())
        assert asked["retire"] == {"default": 1}, asked
        a_end.sendall(b'{"ok": true, "live": {"default": 4}, "serving": {"default": 3}}\n')
        says(second, reader2, b"idle 100.2\n")
        takeover.step([pool], lambda: None)
        asked = json.loads(a_reads.readline())
        while not asked["retire"]:  # the channel's steps go on every EVERY seconds
            a_end.sendall(b'{"ok": true, "live": {"default": 4}, "serving": {"default": 3}}\n')
            asked = json.loads(a_reads.readline())
        assert asked["retire"] == {"default": 1}, asked
    finally:
        a_reads.close()
        a_end.close()  # the channel's thread ends: A is gone
        if takeover._thread is not None:
            takeover._thread.join(5)
            assert not takeover._thread.is_alive()
        ours.close()
