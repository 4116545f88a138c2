"""The autoscaling policy with a wait target (`max_wait`): sized for the target, not for an
empty queue (supervisor/policy/scaling.py, docs/scaling.md). Pure: no Redis, no processes.

tests/test_scaling_policy.py holds every general property with and without a target; here are
the ways a target changes the count, and tests/test_scaling_traces.py holds it to the traces.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from herder.supervisor.policy.scaling import (
    DEFAULT_ARRIVAL_SPAN,
    DEFAULT_WAIT,
    WAIT_SHARE,
    Load,
    ScaleConfig,
    ScaleState,
    decide,
    learn_rate,
    pooled_rate,
    smoothed_arrival,
)


def warm(cfg: ScaleConfig, samples: list[tuple[int, float]]) -> ScaleState:
    state = ScaleState()
    for jobs, busy in samples:
        state = learn_rate(state, jobs, busy, cfg)
    return state


def test_a_backlog_the_fleet_serves_within_the_target_waits_for_it():
    # 2 jobs/s per worker, 4 workers busy and keeping up (8 jobs/s in, 8 done), 20 waiting:
    # the newest of them starts in 20 / (4 * 2) = 2.5 s, half the 5 s target. Four hold.
    cfg = ScaleConfig(floor=1, ceiling=20, max_wait=5.0)

    def steady(backlog: int, c: ScaleConfig = cfg) -> int:
        state = decide(warm(c, [(20, 10.0)] * 3), Load(0.0, backlog, 4), 4, 8.0, c)[1]
        return decide(state, Load(1.0, backlog, 4), 4, 8.0, c)[0].target

    assert steady(20) == 4
    # Twice the backlog would start its newest job only after 5 s: a worker per 5 jobs.
    assert steady(40) == 8
    # Without a target the same fleet is sized for a 1 s wait: the newest of the 20 starts
    # within half a second, 20 / (2 * 0.5) = 20 workers.
    assert steady(20, ScaleConfig(floor=1, ceiling=20)) == 20


def test_with_a_target_a_fleet_is_shed_half_a_target_after_its_queue_empties():
    cfg = ScaleConfig(floor=1, ceiling=30, max_wait=5.0, scale_down_delay=30.0)
    state = warm(cfg, [(20, 10.0)] * 3)
    state = decide(state, Load(0.0, 100, 0), 1, 0.0, cfg)[1]
    decision, state = decide(state, Load(1.0, 100, 0), 1, 0.0, cfg)
    assert decision.target == 20  # 100 waiting, 5 per worker (2 jobs/s for half the target)
    targets = []
    for second in range(2, 12):  # drained: nothing waits, nothing runs
        decision, state = decide(state, Load(float(second), 0, 0), 20, 0.0, cfg)
        targets.append(decision.target)
    # Held for half the 5 s target (not the 30 s scale-down delay), then the minimum.
    assert targets == [20] * 3 + [1] * 7, targets


@settings(max_examples=200, deadline=None)
@given(
    fast=st.integers(100, 1000),  # jobs of a few ms done in one busy second
    slow=st.floats(1.0, 10.0),  # the busy seconds of one slow job
    order=st.permutations(list(range(8))),
)
def test_a_mix_of_fast_and_slow_jobs_is_judged_by_its_pooled_rate(fast, slow, order):
    """Half the intervals finish many fast jobs in a busy second, half one slow job: the count a
    backlog asks for stays within 4x of what the mix's mean job needs, in whatever order they
    finished (the rate of each interval, averaged, was off by up to 33x here)."""
    cfg = ScaleConfig(floor=0, ceiling=100_000, max_wait=10.0)
    samples = [(fast, 1.0) if i % 2 else (1, slow) for i in range(8)]
    mean_rate = (4 * fast + 4) / (4 + 4 * slow)  # jobs over busy seconds, all of them
    expected = 100_000 / (mean_rate * 5.0)  # 100,000 waiting, each worker given half the target
    for last in ((fast, 1.0), (1, slow)):
        state = warm(cfg, [samples[i] for i in order] + [last] * 2)
        state = decide(state, Load(0.0, 100_000, 0), 0, 0.0, cfg)[1]
        count = decide(state, Load(1.0, 100_000, 0), 0, 0.0, cfg)[0].target
        assert expected / 4 <= count <= 4 * expected + 1, (last, count, expected)


def test_the_pooled_rate_is_jobs_over_busy_seconds():
    cfg = ScaleConfig(floor=0, ceiling=10)
    state = warm(cfg, [(100, 1.0), (1, 2.0)])
    # (0.2 * 1 + 0.8 * 100) / (0.2 * 2 + 0.8 * 1): jobs and busy seconds each smoothed
    assert math.isclose(pooled_rate(state), 80.2 / 1.2)
    assert pooled_rate(ScaleState()) is None
    assert pooled_rate(ScaleState(per_worker=3.0)) == 3.0  # a memory without the pooled figures


def test_jobs_slower_than_the_target_get_a_worker_each_not_more():
    # 30 s jobs under a 5 s target: draining 2 waiting jobs within 2.5 s would take 24 workers,
    # but a job starts as soon as it has a worker: 3 busy + 2 waiting is all there is to do.
    cfg = ScaleConfig(floor=1, ceiling=50, max_wait=5.0)
    state = warm(cfg, [(1, 30.0)] * 3)
    state = decide(state, Load(0.0, 2, 3), 3, 0.1, cfg)[1]
    decision, _ = decide(state, Load(1.0, 2, 3), 3, 0.1, cfg)
    assert decision.target == 5, decision


def test_a_rate_too_large_to_multiply_holds_the_jobs_running():
    # Regression. Counterexample found by the bounds property: one job over 2.2e-308 busy
    # seconds pools to a rate of 4.5e307 jobs/s; 4 running jobs at that rate overflowed the
    # arrival estimate to infinity, and math.floor(inf) raised OverflowError in decide().
    cfg = ScaleConfig(floor=0, ceiling=10, max_wait=5.0, alpha=1.0)
    state = learn_rate(ScaleState(), 1, 2.2250738585072014e-308, cfg)
    state = decide(state, Load(0.0, 0, 0), 0, 0.0, cfg)[1]
    decision, _ = decide(state, Load(0.1, 0, 4), 0, 0.0, cfg)
    assert decision.target == 4  # the jobs running, each on a worker


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(0.05, 50.0),
    backlog=st.integers(1, 5000),
    running=st.integers(0, 200),
    drain=st.floats(1.0, 300.0),
)
def test_without_a_target_the_newest_waiting_job_starts_within_half_a_second(rate, backlog, running, drain):
    """Without `max_wait` the fleet is sized for DEFAULT_WAIT (1 s), whatever the drain target:
    enough workers that the newest waiting job starts within half of it, or one per waiting job
    when they are slower than that (the first rule drained the backlog within the drain target,
    letting a job wait up to 30 s)."""
    cfg = ScaleConfig(floor=0, ceiling=100_000, drain_target=drain)
    state = warm(cfg, [(1000, 1000 / rate)])
    decision, _ = decide(state, Load(0.0, backlog, running), running, running * rate, cfg)
    wanted = min(backlog / (rate * WAIT_SHARE * DEFAULT_WAIT), running + backlog)
    assert decision.target >= math.ceil(wanted - 1e-9), (decision, wanted)


def test_without_a_target_a_job_older_than_a_second_adds_a_worker():
    cfg = ScaleConfig(floor=1, ceiling=10)
    state = warm(cfg, [(100, 10.0)] * 3)  # 10 jobs/s per worker: 2 waiting need no more than 1
    state = decide(state, Load(0.0, 2, 1, 0.5), 1, 10.0, cfg)[1]
    decision, _ = decide(state, Load(1.0, 2, 1, 1.5), 1, 10.0, cfg)
    assert decision.target == 2 and "sized for 1 s without max_wait" in decision.reason, decision


def test_the_first_arrival_estimate_starts_from_the_jobs_done_not_one_jump_of_the_backlog():
    # 2 jobs/s done; the backlog jumps by 30 between the first two readings: 32 jobs/s taken as
    # the arrival rate would keep 16 workers of 2 jobs/s busy. Smoothed from the jobs done over
    # the span (5 s without a target), the jump weighs a sixth.
    first = smoothed_arrival(None, Load(0.0, 10, 1), Load(1.0, 40, 1), 2.0, DEFAULT_ARRIVAL_SPAN)
    assert first is not None and math.isclose(first, 2.0 + 30.0 / 6)
