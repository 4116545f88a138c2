"""The start template (herder.worker.fast_path.start_template): RQ's own start, recorded for a stand-in
job, is kept only when it gives a real job's start byte for byte, and refused otherwise.

Unit tests of the worker's logic: a real Redis connection object (the worker needs one), but
nothing is sent: RQ's start is recorded, never run. The end-to-end checks are in
tests/test_fast_path.py (a running job sees the same keys under RQ's worker and herder's)."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import pytest
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.utils import now

from herder.common import rq_seam
from herder.worker.fast_path import start_template
from herder.worker.fast_path.worker import HerderFastWorker

pytestmark = pytest.mark.skipif(
    rq_seam.fast_path_missing() is not None, reason=f"no fast path on {rq_seam.describe()}"
)


@pytest.fixture
def worker(conn: Redis) -> HerderFastWorker:
    w = HerderFastWorker([Queue("default", connection=conn)], connection=conn, name="unit-worker")
    # No master: nothing reads what it says, and no request comes.
    channel = SimpleNamespace(progress=lambda: None, on_request=lambda wake: None)
    w.attach(channel, lease_seconds=3)
    return w


def start_of(worker: HerderFastWorker, job: Job) -> tuple:
    t, execution_id = now(), uuid.uuid4().hex
    _, commands, _ = worker.fast.start.record(job, t, execution_id)
    return t, execution_id, commands


def encoded(worker: HerderFastWorker, commands: list) -> list[list[bytes]]:
    return [[worker.fast.calls.encode(a) for a in command] for command in commands]


@pytest.mark.slow
def test_the_template_gives_rqs_own_start_for_the_next_job(worker: HerderFastWorker, conn: Redis) -> None:
    q = Queue("default", connection=conn)
    first = q.enqueue("herder_rqcompat.add", 1, 2, job_timeout=77)
    worker.fast.start.learn_template(first, *start_of(worker, first))
    template = worker.fast.start.next
    assert template is not None and template.key == "77" and worker.fast.start.templates.ready
    assert start_template.STAND_IN_EXECUTION not in worker.executions  # the stand-in left nothing

    second = q.enqueue("herder_rqcompat.add", 3, 4, job_timeout=77)
    t, execution_id, commands = start_of(worker, second)
    filled = template.fill(second.id, second.origin, execution_id, t, worker.fast.calls.encode)
    assert filled == encoded(worker, commands)
    assert b"\x00J" in b"".join(a for c in template.commands for a in c)  # the job id is a marker

    other = q.enqueue("herder_rqcompat.add", 5, 6, job_timeout=500)  # another heartbeat TTL
    worker.fast.start.learn_template(other, *start_of(worker, other))
    assert worker.fast.start.next is not None and worker.fast.start.next.key == "500"
    assert set(worker.fast.start.templates.value) == {"77", "500"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(lambda job: str(job.description), id="a job field the stand-in does not share"),
        pytest.param(lambda job: repr(time.time()), id="a clock the template does not pin"),
    ],
)
def test_a_start_that_depends_on_more_keeps_its_own_round_trip(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch, extra
) -> None:
    """An RQ whose start writes something the template cannot stand in for: the check against
    the real start refuses it, and every start keeps its own round trip."""
    original = Job.prepare_for_execution

    def prepare_for_execution(self: Job, worker_name: str, pipeline) -> None:  # noqa: ANN001
        original(self, worker_name, pipeline)
        pipeline.hset(self.key, "extra", extra(self))

    monkeypatch.setattr(Job, "prepare_for_execution", prepare_for_execution)
    job = Queue("default", connection=conn).enqueue("herder_rqcompat.add", 1, 2)
    worker.fast.start.learn_template(job, *start_of(worker, job))
    assert worker.fast.start.next is None and worker.fast.start.templates.refused
    assert worker.fast.start.templates.reason == "the template did not give RQ's own start for a real job"


@pytest.mark.slow
def test_a_start_that_fails_for_a_stand_in_keeps_its_own_round_trip(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = Job.prepare_for_execution

    def prepare_for_execution(self: Job, worker_name: str, pipeline) -> None:  # noqa: ANN001
        original(self, worker_name, pipeline)
        pipeline.hset(self.key, "first", self.args[0])  # the stand-in has no arguments

    monkeypatch.setattr(Job, "prepare_for_execution", prepare_for_execution)
    job = Queue("default", connection=conn).enqueue("herder_rqcompat.add", 1, 2)
    worker.fast.start.learn_template(job, *start_of(worker, job))
    assert worker.fast.start.next is None and "stand-in" in worker.fast.start.templates.reason


@pytest.mark.slow
def test_a_start_that_talks_to_redis_directly_takes_rqs_own_path(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An RQ whose start reads Redis outside its pipelines cannot be recorded: the worker starts
    every job by RQ's own code (two round trips), and the job's start is RQ's, written."""
    original = Job.prepare_for_execution

    def prepare_for_execution(self: Job, worker_name: str, pipeline) -> None:  # noqa: ANN001
        original(self, worker_name, pipeline)
        pipeline.hset(self.key, "seen", str(self.connection.ping()))

    monkeypatch.setattr(Job, "prepare_for_execution", prepare_for_execution)
    job = Queue("default", connection=conn).enqueue("herder_rqcompat.add", 1, 2)
    conn.lpop("rq:queue:default")
    worker.prepare_execution(job)  # as RQ's execute_job and perform_job call them
    worker.prepare_job_execution(job, remove_from_intermediate_queue=True)
    assert worker.fast.start.recording.refused and "cannot be recorded" in worker.fast.start.recording.reason
    assert worker.fast.start.next is None
    assert conn.hget(job.key, "status") == b"started" and conn.hget(job.key, "seen") == b"True"
    assert job.id in StartedJobRegistry("default", connection=conn).get_job_ids()


def test_the_pinned_clock_is_this_threads_only() -> None:
    """While a stand-in's time is pinned, RQ's other threads in the worker (its pubsub
    listener, herder's sentinel) still read the real clock."""
    import threading

    import rq.utils

    seen: dict[str, object] = {}
    clock = start_template.FrozenClock()
    with clock(start_template.STAND_IN_TIME, start_template.STAND_IN_EXECUTION):
        other = threading.Thread(target=lambda: seen.update(other=rq.utils.now()))
        other.start()
        other.join()
        seen["this"] = rq.utils.now()
    assert seen["this"] == start_template.STAND_IN_TIME
    assert seen["other"] != start_template.STAND_IN_TIME and seen["other"].year < 2100  # type: ignore[attr-defined]
    assert rq.utils.now().year < 2100  # restored


def test_two_threads_windows_overlap_and_neither_undoes_the_others() -> None:
    """Each thread's pin is its own: the first window to close leaves the second's in force
    (threads per worker run overlapping starts)."""
    import threading
    from datetime import timedelta

    import rq.executions
    import rq.utils

    clock = start_template.FrozenClock()
    later = start_template.STAND_IN_TIME + timedelta(days=1)
    first_in, first_out, seen = threading.Event(), threading.Event(), {}

    def first() -> None:
        with clock(start_template.STAND_IN_TIME, start_template.STAND_IN_EXECUTION):
            first_in.set()
            first_out.wait(5)
            seen["first"] = rq.utils.now()

    t = threading.Thread(target=first)
    t.start()
    first_in.wait(5)
    with clock(later, "f1" * 16):
        first_out.set()
        t.join(5)  # the first window closes while this one is open
        seen["second"], seen["second_id"] = rq.utils.now(), rq.executions.uuid4().hex
    assert seen == {"first": start_template.STAND_IN_TIME, "second": later, "second_id": "f1" * 16}
    assert rq.utils.now().year < 2100 and rq.executions.uuid4().hex != "f1" * 16  # both closed


def test_whole_seconds_are_timegms() -> None:
    """The template's whole-second scores (start_template.whole_seconds) are RQ's timegm of the
    UTC time tuple, for any aware time (before 1970, in another zone, at a second's edge) and a
    naive one."""
    import calendar
    import random
    from datetime import UTC, datetime, timedelta, timezone

    rng = random.Random(7)
    zones = [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))]
    times = [
        datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=d) for d in (-1, 0, 1, 999_999, -999_999)
    ]
    times += [
        datetime(1900, 1, 1, tzinfo=UTC) + timedelta(microseconds=rng.randrange(10**17)) for _ in range(5000)
    ]
    times = [t.astimezone(rng.choice(zones)) for t in times] + [datetime(2030, 5, 6, 7, 8, 9, 999_999)]
    for t in times:
        assert start_template.whole_seconds(t) == calendar.timegm(t.utctimetuple()), t
