"""Health's reasons, the --http address and a snapshot's staleness: pure logic, plain numbers."""

from __future__ import annotations

import pytest

from herder.common.config import Config, ConfigError, http_address, validate
from herder.supervisor.views.health import LAG_LIMIT, LAG_MEMORY, HealthWatch
from herder.supervisor.views.model import STALE_AFTER, Health, HostSnapshot


def reasons(h: HealthWatch, now: float, **kw: object) -> list[str]:
    args = {
        "ready": 2, "floor": 2, "was_ready": True, "stopping": False, "redis_down_since": None,
        "grace": 10.0, "budgets": [],
    }  # fmt: skip
    args.update(kw)
    return [kind for kind, _ in h.reasons(now, **args)]  # type: ignore[arg-type]


def test_a_short_dip_below_the_minimum_is_ok_a_long_one_is_not() -> None:
    h = HealthWatch()
    h.observe(100.0, ready=1, floor=2)  # a worker crashed; its replacement is loading
    assert reasons(h, 105.0, ready=1) == []
    assert reasons(h, 110.5, ready=1) == ["below_minimum"]
    h.observe(111.0, ready=2, floor=2)
    assert reasons(h, 111.0) == []


def test_a_pool_below_its_own_minimum_degrades_health_and_is_named() -> None:
    h = HealthWatch()
    # The host has its 3 ready workers (floor 3), but all are bulk's: the high pool has none.
    h.observe(100.0, ready=3, floor=3, short="pool high: 0 of 1")
    assert reasons(h, 105.0, ready=3, floor=3) == []  # within the grace: a replacement loads
    (reason,) = h.reasons(111.0, ready=3, floor=3, was_ready=True, stopping=False, redis_down_since=None,
                          grace=10.0, budgets=[], short="pool high: 0 of 1")  # fmt: skip
    assert reason == ("below_minimum", "below minimum workers: pool high: 0 of 1 for 11 s")
    h.observe(112.0, ready=3, floor=3, short="")  # high's worker is back
    assert reasons(h, 112.0, ready=3, floor=3) == []


def test_starting_stopping_redis_and_budgets_each_say_so() -> None:
    h = HealthWatch()
    assert reasons(h, 0.0, was_ready=False, ready=0) == ["starting"]
    assert reasons(h, 0.0, stopping=True) == ["stopping"]
    assert reasons(h, 20.0, redis_down_since=15.0) == []  # within the grace
    assert reasons(h, 30.0, redis_down_since=15.0) == ["redis_unreachable"]
    spent = [("kill_budget_spent", "kill budget spent"), ("cull_budget_spent", "")]
    assert reasons(h, 0.0, budgets=spent) == ["kill_budget_spent"]


def test_a_late_pass_of_the_loop_is_remembered_for_a_while() -> None:
    h = HealthWatch()
    h.loop_pass(began=49.9, worked=49.91, wait=0.25, woke=50.0)  # woken early: not late at all
    assert reasons(h, 50.0) == [] and h.last_lag == pytest.approx(0.01)
    h.loop_pass(began=50.0, worked=50.0, wait=0.25, woke=50.25 + LAG_LIMIT + 0.5)  # a wait overshot
    assert reasons(h, 51.8) == ["loop_lagging"]
    h.loop_pass(began=52.0, worked=52.0 + LAG_LIMIT + 0.5, wait=0.0, woke=53.5)  # a slow pass
    assert h.last_lag == pytest.approx(LAG_LIMIT + 0.5)
    later = 53.5 + LAG_MEMORY + 1
    h.loop_pass(began=later - 0.25, worked=later - 0.25, wait=0.25, woke=later)
    assert reasons(h, later) == []


def test_snapshots_that_stop_coming_say_the_loop_is_stalled() -> None:
    v = HostSnapshot(
        host_id="h", hostname="h", time=1e9, taken_at=10.0, state="running", health=Health(True, ()),
        controls=False, pools=(), workers=(), scheduler=None, events=(),
    )  # fmt: skip
    assert v.problems(10.0 + STALE_AFTER) == []
    assert [k for k, _ in v.problems(10.0 + STALE_AFTER + 1)] == ["loop_stalled"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("9100", ("127.0.0.1", 9100)), ("0.0.0.0:80", ("0.0.0.0", 80)), ("[::1]:9100", ("::1", 9100))],
)
def test_http_address_is_loopback_unless_named(text: str, expected: tuple[str, int]) -> None:
    assert http_address(text) == expected


@pytest.mark.parametrize("text", ["x", "70000", "0", ":9100", "::1:9100", "host:"])
def test_a_bad_http_address_is_a_config_error_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigError, match="'http'"):
        validate(Config(http=text))


def test_no_scale_up_while_every_worker_is_paused() -> None:
    from herder.supervisor.policy.autoscaler import Autoscaler
    from herder.supervisor.policy.scaling import Load
    from herder.supervisor.redis_side.load_reader import Reading

    scaler = Autoscaler(Config(max_workers=8, min_workers=1), "host")
    grown = [
        Reading(Load(at=t, backlog=500 * t, running=0), None, (("default", 500 * t, 0, 0.0),))
        for t in (1, 2, 3)
    ]
    assert [scaler.fold(r, 0, 0.0, 1, paused=True) for r in grown] == [1, 1, 1]  # a pause is no demand
    assert scaler.fold(grown[-1], 0, 0.0, 1) > 1
