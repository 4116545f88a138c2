"""The master's doorbell (herder.common.doorbell): a worker rings it beside news that follows a
quiet spell, so a settled master that reads its quiet fleet's pipes only every few seconds
(the pipe hub's long pause) still sees a job start at once.

The first test runs a worker's channel (herder.worker.channel) in a process of its own, its
protocol on a pipe and its doorbell a real one, and says which lines ring. The end-to-end one
runs `herder run` and times what a user sees: a job taken by a quiet fleet shows as `busy` in
the status within a fraction of the long pause.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import wait_for
from herder.common.doorbell import ENV_DOORBELL, RING_AFTER, Bell, Ringer, open_bell
from herder.supervisor.children.pipes import LONG_PAUSE_MAX

# The worker's side: each step from stdin, then "ok" on stderr once its line is written.
CHANNEL = """
import sys, time
from herder.common import worker_protocol as wp
from herder.worker.channel import Channel

channel = Channel(heartbeat_interval=0.2)
for step in sys.stdin:
    verb, *args = step.split()
    if verb == "sleep":
        time.sleep(float(args[0]))
    elif verb == "ready":
        channel.ready()
    elif verb == "idle":
        channel.idle(args[0] if args else None)
    elif verb == "busy":
        channel.busy(args[0], None, "default", "jobs.f")
    elif verb == "done":
        channel.done(args[0], True, hold=bool(args[1:]))
    elif verb == "beat":
        channel._send(wp.beat_line(args[0], time.time()))  # as the sentinel sends it
    elif verb == "wait":
        channel.waiting("Redis at host:1: refused", time.monotonic())
    elif verb == "waited":
        channel.waited()
    print("ok", file=sys.stderr, flush=True)
"""

# (step, rings it must make). News rings after RING_AFTER without a line other than a plain
# `idle`; a plain `idle` and a `beat` never ring.
STEPS = [
    ("ready", 1),  # the first news
    ("idle", 0),  # plain: alive
    ("sleep 0.3", 0),
    ("idle", 0),  # plain again, however long after
    (f"sleep {RING_AFTER + 0.1}", 0),
    ("busy j1", 1),  # a job taken after a quiet spell
    ("done j1 hold", 0),  # held for the next busy: nothing written
    ("busy j2", 0),  # with the held done, right after the last news
    ("beat j2", 0),  # never rings...
    (f"sleep {RING_AFTER + 0.1}", 0),
    ("beat j2", 0),  # ...even after a quiet spell, but it is not quiet news-wise:
    ("done j2", 0),  # news right after a beat does not ring (the master reads beats promptly)
    (f"sleep {RING_AFTER + 0.1}", 0),
    ("idle", 0),
    ("idle paused", 1),  # a pause that changed
    ("sleep 0.3", 0),
    ("idle paused", 0),  # the same pause again: alive
    ("idle", 0),  # resumed, but 0.3 s after the last news
    (f"sleep {RING_AFTER + 0.1}", 0),
    ("wait", 1),  # a wait begins
    ("waited", 0),
    (f"sleep {RING_AFTER + 0.1}", 0),
    ("idle", 1),  # the wait is over: the idle that says so is news
]


@pytest.mark.slow
def test_a_worker_rings_with_news_after_a_quiet_spell_and_never_for_heartbeats(tmp_path: Path) -> None:
    bell = Bell(str(tmp_path))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHANNEL],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, ENV_DOORBELL: bell.path},
    )
    assert proc.stdin and proc.stdout and proc.stderr
    try:
        bell.drain()
        for step, rings in STEPS:
            proc.stdin.write(step.encode() + b"\n")
            proc.stdin.flush()
            assert proc.stderr.readline() == b"ok\n", f"the channel failed at {step!r}"
            assert bell.drain() == rings, f"{step!r}: expected {rings} ring(s)"
        proc.stdin.close()
        lines = proc.stdout.read().decode().splitlines()
        assert [line.split()[0] for line in lines] == [
            "ready", "idle", "idle", "busy", "done", "busy", "beat", "beat", "done", "idle",
            "idle", "idle", "idle", "wait", "idle",
        ]  # fmt: skip
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_a_quiet_fleet_shows_a_job_it_takes_as_busy_at_once(herder, conn) -> None:
    """heartbeat_timeout 20 s: the hub's long pause is LONG_PAUSE_MAX (2.5 s), and a job taken
    by a quiet fleet at any moment would show as busy up to that late without the doorbell.
    Three jobs, each after the fleet has been quiet again: each shows within 1 s."""
    from rq import Queue

    h = herder(workers="2", heartbeat_timeout="20")
    h.wait_workers(2)
    queue = Queue("default", connection=conn)
    for i in range(3):
        time.sleep(LONG_PAUSE_MAX)  # quiet: nothing but `idle` lines for longer than LONG_AFTER
        job = queue.enqueue("herder_testjobs.record", f"bell-{i}", 1.5, job_id=f"bell-{i}")
        enqueued = time.monotonic()
        h.wait_status(
            lambda s, j=job.id: any(w.get("job") == j for w in s["workers"]),
            10,
            what=f"job {job.id} shown as busy",
            interval=0.02,
        )
        late = time.monotonic() - enqueued
        assert late < 1.0, f"job {job.id} showed as busy {late:.2f} s after it was enqueued"
        wait_for(lambda j=job: j.get_status(refresh=True) == "finished", 10, what=f"job {job.id} done")
    h.stop_and_check()


def test_a_masters_bell_lives_in_the_state_dir_and_a_dead_masters_bell_goes(tmp_path: Path) -> None:
    """The bell is a socket in the state dir named after the master's pid; a dead master's left
    there goes when the next one makes its own, a live one's (an upgrade's other master) stays;
    closing it removes it; a state dir too long for a socket's path has no bell, not an error."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    left = tmp_path / f"bell-{int(dead.stdout)}.sock"
    other = tmp_path / f"bell-{os.getppid()}.sock"
    left.touch()
    other.touch()
    bell = open_bell(str(tmp_path))
    assert bell is not None
    assert Path(bell.path) == tmp_path / f"bell-{os.getpid()}.sock" and Path(bell.path).is_socket()
    assert not left.exists() and other.exists()
    Ringer(bell.path).ring()
    assert bell.drain() == 1
    bell.close()
    assert not Path(bell.path).exists()
    Ringer(bell.path).ring()  # nobody listens: nothing raised
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    assert open_bell(str(deep)) is None
