"""The recovery sweep's decision (supervisor/redis_side/sweep.py), pure: which jobs no live
worker holds, and when it is safe to say so."""

from __future__ import annotations

from herder.supervisor.redis_side.sweep import Fleet, Popped, Started, plan

ME = "herder.host-a.0.100"
DEAD = "herder.host-a.1.101"
OTHER = "herder.host-b.0.200"


def sweep_twice(started, popped, fleet, trust=True, grace=2.0):  # noqa: ANN001, ANN201
    first, seen = plan(started, popped, fleet, {}, now=10.0, grace=grace, trust_leases=trust)
    assert first == [], "nothing moves on its first sighting"
    second, _ = plan(started, popped, fleet, seen, now=10.0 + grace, grace=grace, trust_leases=trust)
    return second


def test_a_live_workers_job_is_never_moved() -> None:
    started = [Started("q", "j1:e1", "j1", ME)]
    popped = [Popped("q", "j2", "queued")]
    fleet = Fleet(live=frozenset({ME}), held=frozenset({"j2"}))
    assert sweep_twice(started, popped, fleet) == []


def test_a_dead_workers_job_moves_after_the_grace() -> None:
    moves = sweep_twice([Started("q", "j1:e1", "j1", DEAD)], [], Fleet(dead=frozenset({DEAD})))
    assert [(m.source, m.member, m.holder) for m in moves] == [("wip", "j1:e1", "")]


def test_another_hosts_job_moves_at_once_on_a_lapsed_lease_and_only_when_leases_are_trusted() -> None:
    started = [Started("q", "j1:e1", "j1", OTHER)]
    assert sweep_twice(started, [], Fleet(), trust=False) == []
    # A lapsed lease is proof at its first sighting (the move re-checks the lease in Redis):
    # a host that dies whole has its jobs back a lease and a sweep after, not two sweeps more.
    moves, _ = plan(started, [], Fleet(), {}, now=10.0, grace=2.0, trust_leases=True)
    assert [(m.member, m.holder) for m in moves] == [("j1:e1", OTHER)]


def test_a_plain_rq_workers_job_is_rqs_business() -> None:
    assert sweep_twice([Started("q", "j1:e1", "j1", "worker-of-rq")], [], Fleet()) == []


def test_a_popped_job_nobody_holds_moves_but_not_one_that_is_also_started() -> None:
    popped = [Popped("q", "j1", "queued"), Popped("q", "j2", "queued"), Popped("q", "j3", "started")]
    started = [Started("q", "j2:e2", "j2", ME)]
    moves = sweep_twice(started, popped, Fleet(live=frozenset({ME})))
    assert [(m.source, m.job_id) for m in moves] == [("intermediate", "j1")]


def test_a_finished_jobs_leftover_entry_is_litter() -> None:
    moves = sweep_twice([], [Popped("q", "j1", "finished"), Popped("q", "j2", "")], Fleet())
    assert {m.job_id for m in moves} == {"j1", "j2"}
    assert all("finished" in m.why for m in moves)


def test_a_candidate_that_a_worker_takes_up_before_the_grace_ends_stays() -> None:
    """A new worker pops a requeued job whose hash still names the dead worker: by the next
    sweep the new worker holds it, and nothing moves."""
    fleet = Fleet(dead=frozenset({DEAD}))
    first, seen = plan([Started("q", "j1:e2", "j1", DEAD)], [], fleet, {}, 10.0, 2.0, True)
    assert first == []
    taken = Fleet(live=frozenset({ME}), dead=frozenset({DEAD}), held=frozenset({"j1"}))
    second, seen = plan([Started("q", "j1:e2", "j1", ME)], [], taken, seen, 12.0, 2.0, True)
    assert second == [] and seen == {}


def test_a_live_workers_entry_for_a_job_it_does_not_run_moves_only_after_the_longer_grace() -> None:
    """Redis says a live worker of ours started j1, the worker says it runs j2 (or nothing): it
    does not know it holds j1 (a failover lost the writes after j1's start). Moved, but only once
    that has lasted `unknown_grace`: a worker that just took a job may not have said so yet."""
    started = [Started("q", "j1:e1", "j1", ME), Started("q", "j2:e2", "j2", ME)]
    fleet = Fleet(live=frozenset({ME}), held=frozenset({"j2"}), holding={ME: "j2"})
    seen: dict = {}
    for now in (10.0, 12.0, 30.0, 39.9):
        moves, seen = plan(started, [], fleet, seen, now, 2.0, True, unknown_grace=30.0)
        assert moves == [], now
    moves, _ = plan(started, [], fleet, seen, 40.0, 2.0, True, unknown_grace=30.0)
    assert [(m.member, m.holder) for m in moves] == [("j1:e1", "")]
    assert moves[0].why == f"its worker {ME} runs job j2, not this one"
    idle = Fleet(live=frozenset({ME}), holding={ME: None})
    moves, _ = plan(started[:1], [], idle, seen, 40.0, 2.0, True, unknown_grace=30.0)
    assert moves[0].why == f"its worker {ME} runs no job, not this one"
