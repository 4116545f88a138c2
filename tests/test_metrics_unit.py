"""The series deploy/prometheus/herder-rules.yaml alerts on that only /metrics' collector makes:
unexpected worker deaths by pool, each pool's ceiling, which pool serves a queue, and whether
any RQ scheduler holds a queue's lock. The master runs on the fakes (fakes.py), its snapshot goes
through the collector, and the text is read back with prometheus-client's parser."""

from __future__ import annotations

import signal
from dataclasses import replace

from prometheus_client.parser import text_string_to_metric_families

from fakes import FakeClock, all_ready, live, make
from herder.supervisor.views.model import (
    CronStatus,
    Health,
    HostSnapshot,
    LockHolder,
    QueueLock,
    SchedulerStatus,
)
from herder.supervisor.views.prometheus import HEALTH_KINDS, SnapshotCollector, exposition, registry_for


def samples(snap: HostSnapshot, clock: FakeClock) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample /metrics would serve for `snap`: (name, sorted labels) -> value."""
    text = exposition(registry_for(SnapshotCollector(lambda: snap, clock.monotonic))).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_only_exits_herder_did_not_ask_for_count_as_deaths(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=2)
    m.step()
    all_ready(m)
    clock.advance(2)
    died = ("herder_workers_died_total", (("pool", "default"),))
    assert samples(m.take_snapshot(), clock)[died] == 0  # shown from the start, for rate()
    live(m)[0].exit(-signal.SIGKILL)  # from outside: herder sent nothing
    m.step()
    assert samples(m.take_snapshot(), clock)[died] == 1
    frozen = live(m)[1]  # herder kills this one (silent): a kill, not a death
    frozen.obeys_term = False
    clock.advance(3.5)  # past the 3 s heartbeat timeout
    live(m)[0].ready()  # the replacement keeps talking
    m.step()
    clock.advance(1.0)  # the kill timeout: SIGKILL
    live(m)[0].ready()
    m.step()
    m.step()
    got = samples(m.take_snapshot(), clock)
    assert got[("herder_kills_total", (("pool", "default"), ("reason", "silent")))] == 1
    assert got[died] == 1


def test_each_pool_has_its_ceiling_and_each_queue_names_its_pool(clock: FakeClock) -> None:
    m, _, _ = make(clock, min_workers=1, max_workers=5, queues=["high", "low"])
    m.step()
    got = samples(m.take_snapshot(), clock)
    assert got[("herder_workers_max", (("pool", "default"),))] == 5
    assert got[("herder_workers_desired", (("pool", "default"),))] == 1
    for queue in ("high", "low"):
        assert got[("herder_queue_info", (("pool", "default"), ("queue", queue)))] == 1


def test_scheduler_locks_show_once_read_held_or_not(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=1)
    m.step()

    def status(read_age: float | None, *queues: QueueLock) -> SchedulerStatus:
        off = CronStatus(False, None, None)
        return SchedulerStatus(True, "off", None, None, None, 0, (), queues, read_age, off)

    unread = status(None, QueueLock("default", None))
    m.sched.status = lambda cfg: unread  # type: ignore[method-assign]
    got = samples(m.take_snapshot(), clock)
    assert not [k for k in got if k[0] == "herder_scheduler_lock_held"]  # nothing known yet: no sample
    holder = LockHolder("s1", "h", "box", 7, here=False)
    read = status(0.3, QueueLock("a", holder), QueueLock("b", None))
    m.sched.status = lambda cfg: read  # type: ignore[method-assign]
    got = samples(m.take_snapshot(), clock)
    assert got[("herder_scheduler_lock_held", (("queue", "a"),))] == 1
    assert got[("herder_scheduler_lock_held", (("queue", "b"),))] == 0


def test_every_health_kind_has_a_series_one_while_it_holds(clock: FakeClock) -> None:
    m, _, _ = make(clock, workers=1)
    m.step()
    view = m.take_snapshot()
    kinds = {
        dict(k[1])["kind"]: v for k, v in samples(view, clock).items() if k[0] == "herder_health_problem"
    }
    assert set(kinds) == set(HEALTH_KINDS) and kinds["starting"] == 1  # no worker ready yet
    assert sum(kinds.values()) == 1
    problem = ("redis_unreachable", "redis unreachable for 12 s")
    down = replace(view, health=Health(False, (problem[1],), (problem,)))
    kinds = {
        dict(k[1])["kind"]: v for k, v in samples(down, clock).items() if k[0] == "herder_health_problem"
    }
    assert kinds["redis_unreachable"] == 1 and kinds["starting"] == 0


def test_a_finished_job_is_counted_once_while_its_worker_lives_and_after_its_reap(clock: FakeClock) -> None:
    """One count of finished jobs, the host's and its pool's, that every view reads: looking
    twice adds nothing, and a job finished just before its worker's exit is counted at the reap."""
    m, _, _ = make(clock, workers=2)
    m.step()
    all_ready(m)
    first, second = live(m)[0], live(m)[1]
    for proc, job in ((first, "a"), (second, "b")):
        proc.busy(job)
        clock.advance(0.5)
        proc.done()
    first.obs.jobs_failed += 1

    def counted() -> tuple[int, int, int, int]:
        snap = m.take_snapshot()
        [pool] = snap.pools
        return snap.jobs_ok, snap.jobs_failed, pool.jobs_ok, pool.jobs_failed

    assert counted() == (2, 1, 2, 1)
    assert counted() == (2, 1, 2, 1)  # counted again: nothing added
    first.busy("c")
    first.done()  # its last job, finished after the last look and before its exit
    m.stop_worker(m.workers[0], "test")
    first.exit(0)
    m.step()  # reaped (and its slot refilled)
    assert counted() == (3, 1, 3, 1)
    assert m.counters.pool_jobs("default").done == 4  # what the autoscaler reads: the same count
