"""The master's readings of Redis that repeat every second or so, on a real Redis: when
nothing changed, each costs one round trip (an idle master at 256 workers wakes for each),
and what changed is still read at once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from redis import Redis
from rq.registry import StartedJobRegistry
from rq.scheduler import SCHEDULER_KEY_TEMPLATE, RQScheduler

from harness import RoundTrips, wait_for
from herder.common.config import Config
from herder.common.rq_names import lease_key, rq_scheduler_name
from herder.supervisor.redis_side import hosts
from herder.supervisor.redis_side.load_reader import LoadReader
from herder.supervisor.redis_side.recovery import RecoveryThread
from herder.supervisor.redis_side.scheduler_locks import SchedulerLocks


def test_a_sweep_renews_the_leases_of_the_workers_holding_a_job_in_the_round_trip_that_reads(
    conn: Redis, redis_url: str
) -> None:
    """The leases ride with the sweep's first read, and only those of workers that hold a job
    (an idle worker renews its own; nobody looks at it until it takes a job, which renews it
    too). An idle fleet's sweep renews no lease at all. A Redis that forgot the renewal script
    (a restart, SCRIPT FLUSH) has it loaded again, and the leases are still renewed."""
    cfg = Config(redis_url=redis_url)
    r = RecoveryThread(Redis.from_url(redis_url), cfg)  # not started: swept here
    busy, idle = ["herder.host.0.1", "herder.host.1.2"], ["herder.host.2.3"]
    r.tell({**{n: f"job-{n}" for n in busy}, **{n: None for n in idle}})
    trips = RoundTrips(r.connection)
    r._sweep_once()  # the first loads the script
    before = trips.count
    r._sweep_once()
    assert trips.count - before == 1, f"a sweep took {trips.count - before} round trips"
    for n in busy:
        assert 0 < conn.ttl(lease_key(n)) <= cfg.lease_seconds
    assert not conn.exists(lease_key(idle[0])), "an idle worker's lease was renewed by its master"
    conn.delete(*(lease_key(n) for n in busy))
    conn.script_flush()
    r._sweep_once()
    assert all(conn.ttl(lease_key(n)) > 0 for n in busy), "no lease renewed after SCRIPT FLUSH"

    def sets() -> int:  # a renewal is a SET (inside the script: counted all the same)
        return int(conn.info("commandstats").get("cmdstat_set", {}).get("calls", 0))

    r.tell({n: None for n in busy + idle})
    calls = sets()
    r._sweep_once()
    assert sets() == calls, "an idle fleet's sweep renewed leases"


def test_a_sweep_reads_back_only_the_entries_of_jobs_no_worker_of_ours_holds(
    conn: Redis, redis_url: str
) -> None:
    """A busy fleet's lists are mostly its own jobs: the sweep's look leaves those out inside
    Redis (its CPU follows the orphans, not the fleet), and what it leaves out is exactly what
    the sweep would pass by: a started entry by its job id (the member less its last
    `:<execution>`), a popped one by the whole entry. A job held by a worker of another host,
    or none, still comes back."""
    r = RecoveryThread(Redis.from_url(redis_url), Config(redis_url=redis_url))  # not started
    mine = {f"herder.host.{i}.{i}": f"job-{i}" for i in range(3)}
    r.tell({**mine, "herder.host.9.9": None})
    wip, popped = StartedJobRegistry("default", connection=conn).key, "rq:queue:default:intermediate"
    conn.zadd(wip, {"job-0:e0": 1, "job-1:e1": 2, "job-x:ex": 3, "job-2": 4, "job-2x:e": 5})
    conn.rpush(popped, "job-1", "job-y", "job-0x")
    lists = r._first_look(["default"], frozenset(mine), frozenset(mine.values()))[:2]
    assert lists == [[b"job-y", b"job-0x"], [b"job-x:ex", b"job-2x:e"]]
    assert all(conn.ttl(lease_key(n)) > 0 for n in mine), "the holders' leases were not renewed"
    conn.delete(wip, popped)


def test_a_busy_queues_reading_and_its_oldest_jobs_wait_are_one_round_trip(
    conn: Redis, redis_url: str
) -> None:
    """How long the oldest waiting job has waited is read with the queue's length, inside
    Redis: a busy fleet's queue is never empty, and its reading stays one round trip, also
    after Redis forgot the script (a restart, SCRIPT FLUSH)."""
    reader = LoadReader(Redis.from_url(redis_url), ["default"], 1.0)  # not started: read here
    enqueued = datetime.now(UTC) - timedelta(seconds=30)
    conn.hset("rq:job:old-1", "enqueued_at", enqueued.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
    conn.rpush("rq:queue:default", "old-1", "new-2")
    reader._read()  # the first loads the script
    for flushed in (False, True):
        if flushed:
            conn.script_flush()
        trips = RoundTrips(reader.connection)
        load = reader._read().load
        assert load is not None and load.backlog == 2
        assert 29 < load.oldest_age < 60, f"the oldest job waited {load.oldest_age:.1f} s"
        # Forgotten: the reading that finds it so, the script loaded again, the reading again.
        assert trips.count == (3 if flushed else 1), f"a reading took {trips.count} round trips"
    conn.delete("rq:queue:default", "rq:job:old-1")


def test_the_host_list_is_read_with_the_load_and_a_new_host_shows_at_the_next_reading(
    conn: Redis, redis_url: str
) -> None:
    reader = LoadReader(Redis.from_url(redis_url), ["default"], 1.0)  # not started: read here
    reader.tell_host({"host_id": "a", "hostname": "box-a"})
    trips = RoundTrips(reader.connection)
    reader._read()
    assert [h["host_id"] for h in reader.host_records()[1]] == ["a"]
    before = trips.count
    reader._read()
    assert trips.count - before == 1, "the same hosts' records took a round trip of their own"
    with conn.pipeline(transaction=False) as pipe:  # another host writes its record, later
        hosts.publish(pipe, {"host_id": "b", "hostname": "box-b"}, time.time() + 1)
        pipe.execute()
    reader._read()
    assert [h["host_id"] for h in reader.host_records()[1]] == ["b", "a"]  # newest first


def test_a_herder_schedulers_record_is_read_once_and_a_new_holder_at_once(conn: Redis) -> None:
    locks = SchedulerLocks(conn, ["default"])  # not started: read here
    lock = RQScheduler.get_locking_key("default")

    def hold(name: str, pid: int | None, host: str = "h1") -> None:
        conn.set(lock, name)
        if pid is not None:
            record = {"herder_host": host, "hostname": "box", "pid": pid}
            conn.hset(SCHEDULER_KEY_TEMPLATE % name, mapping=record)

    def hmgets() -> int:
        return int(conn.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))

    first = rq_scheduler_name("h1", "one")
    hold(first, 41)
    assert locks._read().holders["default"].pid == 41
    before = hmgets()
    for _ in range(3):
        holder = locks._read().holders["default"]
        assert (holder.name, holder.host_id, holder.pid) == (first, "h1", 41)
    assert hmgets() == before, "a known scheduler's record was read again"

    second = rq_scheduler_name("h2", "two")  # it took the lock before writing its record
    hold(second, None)
    holder = locks._read().holders["default"]
    assert (holder.name, holder.pid) == (second, None)
    hold(second, 42, "h2")
    assert locks._read().holders["default"].pid == 42

    hold("rq-own", 43, host="")  # RQ's own scheduler may come back under its name: read each time
    assert locks._read().holders["default"].pid == 43
    conn.hset(SCHEDULER_KEY_TEMPLATE % "rq-own", "pid", 44)
    assert locks._read().holders["default"].pid == 44
    conn.delete(lock)
    assert locks._read().holders["default"] is None


def test_the_scheduler_locks_reading_rides_with_the_load_in_one_round_trip(
    conn: Redis, redis_url: str
) -> None:
    """In a master the lock holders are read in the load reader's pipeline: one wake-up and one
    round trip a second for both, none on the locks' own connection."""
    reader = LoadReader(Redis.from_url(redis_url), ["default"], 1.0)  # not started: read here
    locks = SchedulerLocks(Redis.from_url(redis_url), ["default"])
    locks.ride_with(reader)
    name = rq_scheduler_name("h1", "one")
    conn.set(RQScheduler.get_locking_key("default"), name)
    conn.hset(SCHEDULER_KEY_TEMPLATE % name, mapping={"herder_host": "h1", "hostname": "box", "pid": 41})
    load_trips, lock_trips = RoundTrips(reader.connection), RoundTrips(locks.connection)
    reader._read()  # a new holder: its record read in one more round trip
    holder = locks.reading().holders["default"]
    assert (holder.name, holder.pid) == (name, 41)
    before = load_trips.count
    reader._read()
    assert load_trips.count - before == 1, "the lock holders took a round trip of their own"
    assert lock_trips.count == 1  # the new holder's record, once; never the locks
    conn.delete(RQScheduler.get_locking_key("default"))
    reader._read()
    assert locks.reading().holders["default"] is None


def test_the_load_reader_wakes_the_loop_only_for_a_reading_that_says_something_new(
    conn: Redis, redis_url: str
) -> None:
    """An idle fleet's readings say the same second after second: the loop takes the newest at
    its own tick instead of being woken for each; a job queued is news at the next reading."""
    wakes: list[float] = []
    reader = LoadReader(Redis.from_url(redis_url), ["default"], 0.05)
    reader.start(lambda: wakes.append(time.monotonic()))
    try:
        wait_for(lambda: reader.take() is not None, 5, what="a first reading")
        began = time.monotonic()
        wait_for(lambda: reader.take() is not None and time.monotonic() - began > 0.5, 5, what="readings")
        assert len(wakes) == 1, f"{len(wakes)} wake-ups for readings that said nothing new"
        conn.rpush("rq:queue:default", "job-1")
        wait_for(lambda: len(wakes) == 2, 5, what="a wake-up for the queued job")
        reading = reader.take()
        assert reading is not None and reading.load is not None and reading.load.backlog == 1
    finally:
        reader.stop()
        conn.delete("rq:queue:default")
