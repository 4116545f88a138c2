"""Murder judges a worker again at `next_verdict_at`, not each pass: that moment must never be
later than the first at which `judge` finds a verdict, whatever the worker said and whatever
the master did. A property test of two pure functions, over every state and deadline."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import FakeClock, FakeProc
from herder.common.config import Config
from herder.supervisor.children.fleet import Life, Worker
from herder.supervisor.children.observations import Held, Observations
from herder.supervisor.children.states import WorkerState
from herder.supervisor.policy.liveness import judge, next_verdict_at

times = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
seconds = st.floats(min_value=0.1, max_value=30.0, allow_nan=False)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Worker, Observations, Config]:
    cfg = dataclasses.replace(
        Config(),
        heartbeat_timeout=draw(seconds),
        start_timeout=draw(seconds),
        stop_timeout=draw(seconds),
        kill_timeout=draw(seconds),
        progress_timeout=draw(seconds),
        job_timeout=draw(st.one_of(seconds, st.just(-1.0))),
        job_timeout_grace=draw(st.floats(min_value=0.0, max_value=10.0)),
    )
    states = [WorkerState.STARTING, WorkerState.IDLE, WorkerState.BUSY, WorkerState.STOPPING]
    state = draw(st.sampled_from(states))
    life = Life(state=state, stop_sent_at=draw(times) if state == WorkerState.STOPPING else None)
    w = Worker(0, FakeProc(1, FakeClock()), spawned_at=draw(times), life=life)
    jobs = {
        t: Held(
            f"job-{t}",
            draw(times),
            draw(st.one_of(st.none(), seconds, st.just(-1.0))),
            stuck_since=draw(st.one_of(st.none(), times)),
        )
        for t in range(draw(st.integers(0, 3)))
    }
    eof = draw(st.booleans())
    obs = Observations(
        last_seen=draw(times),
        ready=draw(st.booleans()),
        jobs=jobs,
        stdout_eof=eof,
        eof_at=draw(times) if eof else 0.0,
        said_stop=draw(st.booleans()),
        ready_refused=draw(st.sampled_from(["", "unsupported protocol version '99'"])),
    )
    return w, obs, cfg


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(cases(), st.lists(st.floats(min_value=0.0, max_value=200.0, allow_nan=False), min_size=1, max_size=20))
def test_no_verdict_comes_before_the_moment_murder_looks_again(case, moments) -> None:  # noqa: ANN001
    w, obs, cfg = case
    at = next_verdict_at(w, obs, cfg)
    for now in [*moments, at - 1e-3, at - 0.5, at - 5]:
        if now < at:
            assert judge(w, obs, now, cfg) is None, (now, at)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(cases())
def test_the_moment_is_the_first_verdict_not_a_guess(case) -> None:  # noqa: ANN001
    """Tight, not only safe: just past it a verdict comes (every worker has a deadline, its
    silence at the latest), so no worker is judged later than it was when judged each pass."""
    w, obs, cfg = case
    at = next_verdict_at(w, obs, cfg)
    assert judge(w, obs, at + 1e-6, cfg) is not None, at
