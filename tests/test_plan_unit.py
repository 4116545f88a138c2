"""A pool's plan (Pool.plan) as a pure function, as scaling.decide is tested: a pool built on
fakes, workers placed in it by hand, no master and no loop. What the plan decides (stop whom
and why, what to journal, how many to spawn) is read from the Plan; nothing is carried out.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from fakes import SHORT_TIMEOUT_CONFIG, FakeClock, FakeProc
from herder.supervisor.children.fleet import Culling, Life, Limits, Worker
from herder.supervisor.children.states import Cull, Retire, WorkerState
from herder.supervisor.policy.pool import Plan, Pool, PoolState, Share

WALL = 1_700_000_000.0


def pool_of(clock: FakeClock, **settings: object) -> Pool:
    cfg = replace(SHORT_TIMEOUT_CONFIG, **settings)  # type: ignore[arg-type]
    return Pool.build("default", cfg, "test", None, itertools.count(1))


def place(
    pool: Pool,
    clock: FakeClock,
    slot: int,
    state: WorkerState = WorkerState.IDLE,
    generation: int = 0,
    retire: Retire | None = None,
    retire_reason: str = "",
) -> Worker:
    """A worker of `pool` in `slot`, in `state` (its lines say so: ready, busy for BUSY),
    marked to retire for `retire` (culled: its culling says so too)."""
    proc = FakeProc(100 + slot, clock)
    proc.ready()
    if state == WorkerState.BUSY:
        proc.busy(f"job-{slot}")
    w = Worker(
        slot,
        proc,
        spawned_at=clock.t,
        generation=generation,
        pool=pool.name,
        life=Life(state=state),
        limits=Limits(retire=retire, retire_reason=retire_reason),
        culling=Culling(cull=Cull.CULLED if retire == Retire.CULLED else Cull.NONE),
    )
    pool.workers[slot] = w
    return w


def share(target: int, limit: int = 10, host_workers: int = 0) -> Share:
    return Share(target, limit, host_workers)


def stopped(plan: Plan) -> dict[int, str]:
    return {s.worker.slot: s.why for s in plan.stops}


def test_a_settled_pool_plans_nothing(clock: FakeClock) -> None:
    pool = pool_of(clock)
    for i in range(2):
        place(pool, clock, i)
    assert pool.plan(share(2), WALL) == Plan()


def test_room_to_spawn_up_to_the_share(clock: FakeClock) -> None:
    pool = pool_of(clock, workers=5)
    place(pool, clock, 0)
    assert pool.plan(share(5), WALL).spawn == 4
    assert pool.plan(share(3), WALL).spawn == 2  # the host's share, not the pool's own target


def test_a_cluster_grant_counts_stopping_workers(clock: FakeClock) -> None:
    pool = pool_of(clock, workers=5)
    place(pool, clock, 0)
    place(pool, clock, 1, WorkerState.STOPPING)
    pool.scaler.grant = 3
    assert pool.plan(share(5), WALL).spawn == 1  # 3 granted, 2 processes still running


def test_scale_down_stops_idle_workers_only_highest_slot_first(clock: FakeClock) -> None:
    pool = pool_of(clock, workers=4)
    place(pool, clock, 0)
    place(pool, clock, 1, WorkerState.BUSY)
    place(pool, clock, 2)
    place(pool, clock, 3, WorkerState.BUSY)
    plan = pool.plan(share(1), WALL)
    assert stopped(plan) == {2: "scale down to 1", 0: "scale down to 1"}  # never a busy one
    assert plan.spawn == 0


def test_a_culled_worker_is_stopped_announced_and_replaced(clock: FakeClock) -> None:
    pool = pool_of(clock)
    place(pool, clock, 0)
    bad = place(pool, clock, 1, retire=Retire.CULLED, retire_reason="culled: 5 failed jobs")
    plan = pool.plan(share(2), WALL)
    [stop] = plan.stops
    assert stop.worker is bad and stop.culled and stop.why == "culled: 5 failed jobs"
    assert stop.said == ("culled", "slot 1 pid 101 culled: 5 failed jobs")
    assert plan.spawn == 1  # its replacement, in the same pass


def test_a_draining_pool_stops_every_live_worker_and_spawns_none(clock: FakeClock) -> None:
    pool = pool_of(clock)
    place(pool, clock, 0)
    place(pool, clock, 1, WorkerState.BUSY)
    pool.change_state(PoolState.DRAINING)
    plan = pool.plan(share(0), WALL)
    assert stopped(plan) == {0: "pool default removed by a reload", 1: "pool default removed by a reload"}
    assert plan.spawn == 0


def test_past_max_memory_a_worker_is_told_to_retire_once(clock: FakeClock) -> None:
    pool = pool_of(clock)
    fat = place(pool, clock, 0, retire=Retire.MAX_MEMORY, retire_reason="recycled after max memory")
    place(pool, clock, 1)
    plan = pool.plan(share(2), WALL)
    assert plan.retire == (fat,)
    assert plan.stops == ()  # no replacement ready yet: it keeps its place
    assert plan.spawn == 1  # a replacement starts first
    fat.limits.retire_sent = True
    assert pool.plan(share(2), WALL).retire == ()


def test_a_rolling_restart_stops_an_old_worker_only_once_a_new_one_is_ready(clock: FakeClock) -> None:
    pool = pool_of(clock, workers=4)
    for i in range(4):
        place(pool, clock, i)
    pool.generation = 1
    first = pool.plan(share(4), WALL)
    assert first.stops == () and first.spawn == 1  # a batch of max(1, 4 // 4) beyond the target
    place(pool, clock, 4, WorkerState.STARTING, generation=1)
    assert pool.plan(share(4), WALL).stops == ()  # starting is not ready: capacity never dips
    pool.workers[4].life.state = WorkerState.IDLE
    plan = pool.plan(share(4), WALL)
    assert list(stopped(plan).values()) == ["rolling restart: replaced"]
    assert plan.stops[0].said is None  # a restart is journaled once, by the command


def test_a_recycled_worker_is_journaled_as_replaced(clock: FakeClock) -> None:
    pool = pool_of(clock)
    old = place(pool, clock, 0, retire=Retire.MAX_AGE, retire_reason="recycled after max age (60 s)")
    place(pool, clock, 1)
    place(pool, clock, 2)  # its replacement, ready
    [stop] = pool.plan(share(2), WALL).stops
    assert stop.worker is old and stop.why == "recycled after max age (60 s)"
    assert stop.said == ("recycled", "slot 0 pid 100 recycled after max age (60 s); replaced")


def test_at_the_workers_limit_one_idle_old_worker_makes_room(clock: FakeClock) -> None:
    pool = pool_of(clock, workers=2)
    place(pool, clock, 0, WorkerState.BUSY)
    place(pool, clock, 1)
    pool.generation = 1
    assert pool.plan(share(2, limit=3, host_workers=2), WALL).stops == ()  # room below the limit
    plan = pool.plan(share(2, limit=2, host_workers=2), WALL)
    assert stopped(plan) == {1: "rolling restart at the workers limit: making room"}
    assert plan.spawn == 1


def test_planning_changes_nothing(clock: FakeClock) -> None:
    pool = pool_of(clock, workers=1)
    w = place(pool, clock, 0, retire=Retire.CULLED, retire_reason="culled")
    place(pool, clock, 1)
    place(pool, clock, 2)
    before = [(x.life.state, x.life.stop_reason, x.limits.retire_sent) for x in pool.workers.values()]
    assert pool.plan(share(1), WALL) == pool.plan(share(1), WALL)
    assert [(x.life.state, x.life.stop_reason, x.limits.retire_sent) for x in pool.workers.values()] == before
    assert w.proc.stops == 0  # type: ignore[attr-defined]


def test_a_culled_worker_is_stopped_once_and_not_counted_again(clock: FakeClock) -> None:
    pool = pool_of(clock)
    place(pool, clock, 0, retire=Retire.CULLED, retire_reason="culled")
    place(pool, clock, 1)
    place(pool, clock, 2)  # its replacement is up: the pool is at its target without it
    plan = pool.plan(share(2), WALL)
    assert stopped(plan) == {0: "culled"} and len(plan.stops) == 1
    assert plan.spawn == 0
