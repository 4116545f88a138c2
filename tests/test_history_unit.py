"""The dashboard's rings: the history (15 minutes at 1 s resolution, bounded, O(pools) a
sample) and the events journal (bounded, ids increasing), on a fake wall clock."""

from __future__ import annotations

import json

from herder.supervisor.views.api import encode, history_json
from herder.supervisor.views.history import SERIES, SPAN, History
from herder.supervisor.views.journal import KEPT, Journal
from herder.supervisor.views.model import WIRE_NAMES, Health, HostSnapshot, PoolRow

T0 = 1_800_000_000.0


def pool(name: str, jobs_per_s: float = 0.0, queue_length: int | None = 3) -> PoolRow:
    growth = None if queue_length is None else 0.5
    return PoolRow(name=name, state="running", autoscale=False, floor=1, ceiling=4, demand=2, running=2,
                   busy=1, queue_length=queue_length, growth=growth, oldest_age=None, jobs_per_s=jobs_per_s,
                   failed_per_s=0.0, jobs_ok=0, jobs_failed=0, queues=(name,))  # fmt: skip


def snap(t: float, *pools: PoolRow) -> HostSnapshot:
    return HostSnapshot(host_id="h", hostname="h", time=t, taken_at=t, state="running",
                        health=Health(True, ()), controls=False, pools=pools, workers=(), scheduler=None,
                        events=())  # fmt: skip


def test_one_sample_a_second_the_newest_of_its_second() -> None:
    h = History()
    for i in range(10):  # every 0.5 s, as the loop publishes
        h.append(snap(T0 + i * 0.5, pool("a", jobs_per_s=float(i))))
    out = h.render()
    assert out["step"] == 1.0
    assert out["t"] == [T0 + i * 0.5 for i in (1, 3, 5, 7, 9)]
    assert out["pools"]["a"]["jobs_per_s"] == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert set(out["pools"]["a"]) == {WIRE_NAMES.get(k, k) for k in SERIES}  # the wire's names


def test_bounded_to_the_last_15_minutes() -> None:
    h = History()
    for i in range(SPAN + 300):
        h.append(snap(T0 + i, pool("a")))
    out = h.render()
    assert len(h) == SPAN == 900
    assert out["t"][0] == T0 + 300 and out["t"][-1] == T0 + SPAN + 299
    assert all(len(series) == SPAN for series in out["pools"]["a"].values())


def test_a_clock_stepping_back_keeps_the_timeline_increasing() -> None:
    h = History()
    h.append(snap(T0 + 10, pool("a")))
    h.append(snap(T0 + 5, pool("a")))
    assert h.render()["t"] == [T0 + 10]


def test_pools_coming_and_going_are_aligned_with_t_null_where_absent() -> None:
    h = History()
    h.append(snap(T0, pool("a")))
    h.append(snap(T0 + 1, pool("a"), pool("b", queue_length=None)))
    h.append(snap(T0 + 2, pool("b")))
    out = h.render()
    assert out["pools"]["a"]["queue_length"] == [3, 3, None]
    assert out["pools"]["b"]["queue_length"] == [None, None, 3]
    assert out["pools"]["b"]["growth"] == [None, None, 0.5]
    assert h.render(since=T0 + 0.5)["t"] == [T0 + 1, T0 + 2]


def test_journal_bounded_ids_increasing_since_and_newest_first() -> None:
    now = [T0]
    j = Journal(lambda: now[0])
    for i in range(KEPT + 50):
        now[0] = T0 + i
        j.record("spawned", "default", f"slot {i} pid {1000 + i} spawned", i, 1000 + i)
    kept = j.since()
    assert len(kept) == KEPT == 300
    assert [e.id for e in kept] == list(range(51, KEPT + 51))
    assert j.newest(2)[0].id == KEPT + 50 and j.newest(2)[1].id == KEPT + 49
    assert [e.id for e in j.since(T0 + KEPT + 47)] == [KEPT + 49, KEPT + 50]


def test_history_json_is_plain_json_with_a_hostile_name_kept_as_a_string() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    h, j = History(), Journal(lambda: T0)
    h.append(snap(T0, pool(hostile)))
    j.record("scale", hostile, f"operator: pool {hostile} scaled from 1 to 2 workers")
    body = json.loads(encode(history_json(h, j, T0 + 1, None)))
    assert list(body["pools"]) == [hostile]
    assert body["events"][0]["pool"] == hostile and body["events"][0]["kind"] == "scale"
    assert set(body) == {"time", "step", "t", "pools", "events"}
