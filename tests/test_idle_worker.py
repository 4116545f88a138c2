"""What an idle worker asks of Redis. An idle worker waits for a job in slices of a heartbeat
interval; at 256 workers each round trip of a slice is a few percent of a core, so a slice asks
for no more than it needs: RQ's heartbeat and herder's lease in one round trip, RQ's suspension
flag, the blocking dequeue. The `idle` state is written once per idle spell, not every slice.
Real Redis (its MONITOR stream), real herder."""

from __future__ import annotations

import time

import pytest
from redis import Redis

pytestmark = pytest.mark.slow

SLICES = 4  # dequeue slices watched


def commands_per_slice(redis_url: str, deadline_s: float = 20.0) -> list[list[str]]:
    """The commands of the worker's dequeue connection between its blocking dequeues, from
    Redis's MONITOR stream: one list per whole slice (the first, cut by the start of the
    stream, is dropped)."""
    watcher = Redis.from_url(redis_url, socket_timeout=deadline_s)
    slices: list[list[str]] = []
    client = None
    deadline = time.monotonic() + deadline_s
    with watcher.monitor() as stream:
        while len(slices) < SLICES + 1:
            assert time.monotonic() < deadline, f"{len(slices)} dequeue slices seen in {deadline_s:g} s"
            seen = stream.next_command()
            words = seen["command"].split()
            if client is None and words[0] == "BLMOVE":
                client = (seen["client_address"], seen["client_port"])
                slices.append([])
                continue
            if client != (seen["client_address"], seen["client_port"]):
                continue
            if words[0] == "BLMOVE":
                slices.append([])
            else:
                slices[-1].append(" ".join(words[:3]))
    return slices[:-1]  # the last one has only begun


def test_an_idle_slice_asks_redis_for_a_heartbeat_the_suspension_flag_and_the_dequeue(
    herder, conn: Redis
) -> None:
    h = herder(workers="1")
    h.wait_workers(1)
    slices = commands_per_slice(h.redis_url)
    for commands in slices:
        # Not the worker's state again and again: it said `idle` when the spell began.
        assert not [c for c in commands if c.startswith("HSET") and "state" in c], slices
        # One heartbeat a slice (RQ calls for two: before and after each dequeue).
        assert sum(c.startswith("HSET") and "last_heartbeat" in c for c in commands) <= 1, slices
        assert sum(c.startswith("EXISTS") for c in commands) == 1, slices  # RQ's suspension flag
        assert len(commands) <= 8, slices  # the heartbeat pipeline and the suspension check
    # The worker says it is idle, and RQ lists it with a fresh heartbeat.
    name = conn.smembers("rq:workers").pop().decode()
    assert conn.hget(name, "state") == b"idle"
    h.stop_and_check()
