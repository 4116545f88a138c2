"""A request from the master (or RQ's shutdown command) ends an idle worker's blocking dequeue at
once (Presence.wake_dequeue), also when it comes just before the dequeue blocks: the loop then
leaves RQ's dequeue at its first heartbeat() instead of waiting out a slice. Unit tests of the
worker's logic on a real connection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from redis import Redis
from rq import Queue

from herder.worker.base import Woken
from herder.worker.rq_worker import HerderWorker


def idle_worker(conn: Redis) -> HerderWorker:
    w = HerderWorker([Queue("default", connection=conn)], connection=conn, name="wake-unit")
    channel = SimpleNamespace(
        progress=lambda: None,
        on_request=lambda wake: None,
        idle=lambda paused=None: None,
        heartbeat_interval=1.0,
    )
    w.attach(channel, lease_seconds=3)  # type: ignore[arg-type]  # no master
    return w


def test_a_wake_before_the_dequeue_blocks_leaves_it_at_its_first_heartbeat(conn: Redis) -> None:
    w = idle_worker(conn)
    w.wake_dequeue()  # between the loop's look at the requests and its blocking call
    w._dequeuing = True  # the loop goes into RQ's dequeue
    with pytest.raises(Woken):
        w.heartbeat()  # RQ's dequeue loop's first call: back to herder's loop, which sees the request
    w.heartbeat()  # once: the next slice blocks as usual
