"""The finish template (herder.worker.fast_path.finish_template): RQ's own finish of a successful
job, recorded for a stand-in job, is kept only when it gives RQ's finish byte for byte, for a
second stand-in and for the first real job of its shape; every job it is not for (a failure, a
job with a dependent, a result TTL of 0, callbacks, DEBUG lines) gets RQ's own finish.

Unit tests of the worker's logic against the test Redis: real jobs, started by the worker and
finished through its finish (`_finalize_success`), whose writes go out with `flush`. The
key-by-key comparison with RQ's SimpleWorker is in tests/test_fast_path.py."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
from redis import Redis
from rq import Callback, Queue
from rq.job import Job, JobStatus
from rq.utils import now
from rq.worker import SimpleWorker

from herder.common import rq_seam
from herder.worker.fast_path import finish_template
from herder.worker.fast_path.finish import Finish
from herder.worker.fast_path.learned import Phase
from herder.worker.fast_path.recording import Recorder
from herder.worker.fast_path.start_template import FrozenClock
from herder.worker.fast_path.worker import HerderFastWorker

pytestmark = pytest.mark.skipif(
    rq_seam.fast_path_missing() is not None, reason=f"no fast path on {rq_seam.describe()}"
)


@pytest.fixture
def worker(conn: Redis) -> HerderFastWorker:
    w = HerderFastWorker([Queue("default", connection=conn)], connection=conn, name="unit-worker")
    # No master: nothing reads what it says, and no request comes.
    channel = SimpleNamespace(progress=lambda: None, on_request=lambda wake: None, done=lambda *a, **k: None)
    w.attach(channel, lease_seconds=3)
    return w


def started(worker: HerderFastWorker, job_id: str) -> tuple[Job, Queue, Any]:
    """The job as RQ's worker holds it once it has run: started (written), ended, a result."""
    queue = worker.queues[0]
    job = Job.fetch(job_id, connection=worker.connection)
    execution = worker.prepare_execution(job)
    worker.prepare_job_execution(job)
    return job, queue, execution


def ended(worker: HerderFastWorker, job: Job, result: Any) -> None:
    job.ended_at = now()
    job._result = result
    job._status = JobStatus.FINISHED


def rqs_finish(worker: HerderFastWorker, job: Job, queue: Queue, execution: Any, t: Any) -> list[list[bytes]]:
    """RQ's own finish (SimpleWorker's, not herder's) of the job at time t, recorded, not sent;
    what it leaves on the objects is undone."""
    status, kept = job._status, worker.executions.get(execution.id)
    real, recorder = worker.connection, Recorder(worker.connection)
    worker.connection = recorder  # type: ignore[assignment]
    try:
        with FrozenClock()(t, execution.id):
            SimpleWorker.handle_job_success(worker, job, queue, queue.started_job_registry, execution)
    finally:
        worker.connection = real
        job._status = status
        if kept is not None:
            worker.executions[execution.id] = kept
    (pipeline,) = recorder.pipelines
    assert pipeline.guards == [job.dependents_key]
    return encoded(worker, pipeline.take_recorded())


def encoded(worker: HerderFastWorker, commands: list) -> list[list[bytes]]:
    return [[worker.fast.calls.encode(a) for a in command] for command in commands]


def templates_finish(
    worker: HerderFastWorker, job: Job, queue: Queue, execution: Any, t: Any
) -> list[list[bytes]]:
    finish = worker.fast.finish
    shape = finish.shape(job, queue, execution)
    assert shape is not None
    template = finish.make_template(shape)
    return finish.encoded(finish.template_finish_quietly(template, job, execution, t))  # framed: read back


SHAPES = [
    pytest.param("herder_rqcompat.add", (1, 2), {}, {"sum": 3, "queue": "default"}, id="a return value"),
    pytest.param("time.sleep", (0,), {}, None, id="None"),
    pytest.param("herder_rqcompat.add", (1, 2), {"result_ttl": 77}, {"sum": 3}, id="result_ttl=77"),
    pytest.param("herder_rqcompat.add", (1, 2), {"result_ttl": -1}, {"sum": 3}, id="result_ttl=-1"),
    pytest.param("herder_rqcompat.add", (1, 2), {"meta": {"a": 1, "b": "two"}}, [1, 2], id="meta"),
    pytest.param(
        "herder_rqcompat.add",
        (),
        {
            "kwargs": {"a": "x" * 300, "b": "é"},
            "job_timeout": 33,
            "ttl": 900,
            "failure_ttl": 60,
            "description": "mine",
        },
        "é" * 50,
        id="more fields",
    ),  # fmt: skip
]


@pytest.mark.parametrize(("func", "args", "options", "result"), SHAPES)
def test_the_template_gives_rqs_own_finish_for_real_jobs(
    worker: HerderFastWorker, conn: Redis, func: str, args: tuple, options: dict, result: Any
) -> None:
    """For two real jobs of one shape, at two times: the template's commands are RQ's own
    finish's, byte for byte, and the job's hash is its own (not the stand-in's)."""
    q = Queue("default", connection=conn)
    for n in range(2):
        kwargs = dict(options)
        job_kwargs = kwargs.pop("kwargs", {})
        enqueued = q.enqueue(func, *args, **job_kwargs, **kwargs)
        job, queue, execution = started(worker, enqueued.id)
        ended(worker, job, result)
        t = now()
        ours = templates_finish(worker, job, queue, execution, t)
        assert ours == rqs_finish(worker, job, queue, execution, t), n
        assert any(c[:2] == [b"HSET", job.key.encode()] and len(c) > 4 for c in ours)
        assert b"herder-stand-in" not in b"".join(a for c in ours for a in c)


def finish(worker: HerderFastWorker, job: Job, queue: Queue, execution: Any, result: Any) -> None:
    """herder's finish as the worker runs it: recorded (or filled in), then written."""
    worker._finalize_success(job, queue, execution, result)
    worker.fast.flush()


def test_the_first_finish_of_a_shape_teaches_the_next_ones(worker: HerderFastWorker, conn: Redis) -> None:
    q = Queue("default", connection=conn)
    ids = [q.enqueue("herder_rqcompat.add", n, 1).id for n in range(3)]
    filled = []
    original = Finish.template_finish

    def spy(self: Finish, template: Any, job: Job, *rest: Any) -> Any:
        commands = original(self, template, job, *rest)
        if not self.worker.log.disabled:  # not a check (a stand-in's, or the first real job's)
            filled.append(job.id)
        return commands

    Finish.template_finish = spy  # type: ignore[method-assign]
    try:
        for job_id in ids:
            job, queue, execution = started(worker, job_id)
            finish(worker, job, queue, execution, {"n": job.args[0]})
    finally:
        Finish.template_finish = original  # type: ignore[method-assign]
    # The first is RQ's recorded finish (and the real check of the template), then the template.
    assert filled == ids[1:]
    assert [learned.phase for learned in worker.fast.finish.templates.values()] == [Phase.READY]
    for job_id in ids:
        job = Job.fetch(job_id, connection=conn)
        assert job.get_status() == JobStatus.FINISHED and job.return_value() == {"n": job.args[0]}
        assert conn.ttl(job.key) > 0
    assert sorted(q.finished_job_registry.get_job_ids()) == sorted(ids)
    assert int(conn.hget(worker.key, "successful_job_count")) == 3
    assert not worker.executions and not q.started_job_registry.get_job_ids()


def learnt(worker: HerderFastWorker, conn: Redis, **options: Any) -> None:
    """A first job of the default shape has taught the worker its template."""
    job_id = Queue("default", connection=conn).enqueue("herder_rqcompat.add", 0, 0, **options).id
    finish(worker, *started(worker, job_id), {"sum": 0})


def test_a_job_with_a_dependent_gets_rqs_finish(worker: HerderFastWorker, conn: Redis) -> None:
    """The template's finish is guarded by the job's dependents set: with a dependent, nothing
    of it is written and RQ's own finish runs (it enqueues the dependent)."""
    learnt(worker, conn)
    q = Queue("default", connection=conn)
    parent = q.enqueue("herder_rqcompat.add", 1, 2)
    child = q.enqueue("herder_rqcompat.add", 3, 4, depends_on=parent)
    q.remove(parent.id)  # taken by hand
    calls = []
    original = SimpleWorker.handle_job_success

    def spy(self: Any, job: Job, *rest: Any) -> Any:
        calls.append(job.id)
        return original(self, job, *rest)

    SimpleWorker.handle_job_success = spy  # type: ignore[method-assign]
    try:
        job, queue, execution = started(worker, parent.id)
        worker._finalize_success(job, queue, execution, {"sum": 3})
        pending = worker.fast.finish.pending
        assert calls == [] and pending is not None  # the template's, guarded
        assert pending.guards == [job.dependents_key]
        worker.fast.flush()
    finally:
        SimpleWorker.handle_job_success = original  # type: ignore[method-assign]
    assert calls == [parent.id]  # the guard found the dependent: RQ's own finish
    assert Job.fetch(parent.id, connection=conn).get_status() == JobStatus.FINISHED
    assert child.get_status(refresh=True) == JobStatus.QUEUED and child.id in q.get_job_ids()


def test_a_failing_job_gets_rqs_failure(worker: HerderFastWorker, conn: Redis) -> None:
    learnt(worker, conn)
    q = Queue("default", connection=conn)
    job_id = q.enqueue("herder_rqcompat.fail", "bad").id
    q.remove(job_id)
    job, queue, execution = started(worker, job_id)
    filled = []
    original = Finish.template_finish
    Finish.template_finish = lambda *a: filled.append(a) or original(*a)  # type: ignore[method-assign]
    try:
        worker.perform_job(job, queue, execution)
        worker.fast.flush()
    finally:
        Finish.template_finish = original  # type: ignore[method-assign]
    assert filled == []
    assert Job.fetch(job_id, connection=conn).get_status() == JobStatus.FAILED
    assert job_id in q.failed_job_registry.get_job_ids()


def test_a_result_ttl_of_0_keeps_rqs_finish(worker: HerderFastWorker, conn: Redis) -> None:
    """RQ deletes such a job, listing its executions first: a read no template can stand in
    for. The shape is refused once and each of its jobs is finished by RQ's own code."""
    q = Queue("default", connection=conn)
    ids = [q.enqueue("herder_rqcompat.add", n, 1, result_ttl=0).id for n in range(2)]
    for job_id in ids:
        q.remove(job_id)
        finish(worker, *started(worker, job_id), {"n": 1})
    assert [learned.phase for learned in worker.fast.finish.templates.values()] == [Phase.REFUSED]
    assert not any(conn.exists(f"rq:job:{job_id}") for job_id in ids)


@pytest.mark.parametrize(
    "unfit",
    [
        pytest.param(lambda w, job: logging.getLogger("rq.worker").setLevel(logging.DEBUG), id="DEBUG lines"),
        pytest.param(lambda w, job: setattr(job, "_success_callback_name", "x.y"), id="a success callback"),
        pytest.param(lambda w, job: setattr(job, "origin", "elsewhere"), id="another origin"),
    ],
)
def test_a_job_the_template_is_not_for_gets_rqs_finish(
    worker: HerderFastWorker, conn: Redis, unfit: Any
) -> None:
    level = logging.getLogger("rq.worker").level
    try:
        learnt(worker, conn)
        job, queue, execution = started(worker, Queue("default", connection=conn).enqueue("time.sleep", 0).id)
        unfit(worker, job)
        assert worker.fast.finish.shape(job, queue, execution) is None
    finally:
        logging.getLogger("rq.worker").setLevel(level)


def test_callbacks_get_rqs_finish(worker: HerderFastWorker, conn: Redis) -> None:
    q = Queue("default", connection=conn)
    job = q.enqueue("herder_rqcompat.add", 1, 2, on_success=Callback("herder_rqcompat.noted_success"))
    job, queue, execution = started(worker, job.id)
    assert worker.fast.finish.shape(job, queue, execution) is None


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(lambda job: str(job.description), id="a job field the stand-ins share"),
        pytest.param(lambda job: repr(time.time()), id="a clock the template does not pin"),
        pytest.param(lambda job: str(job.origin)[::-1], id="a queue name the template cannot find"),
    ],
)
def test_a_finish_that_depends_on_more_keeps_rqs_finish(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch, extra: Any
) -> None:
    """An RQ whose finish writes something the template cannot stand in for: a check refuses
    it (the real job's, or the second stand-in's), and the shape keeps RQ's finish."""
    original = Job._handle_success

    def _handle_success(self: Job, result_ttl: int, pipeline: Any, **kwargs: Any) -> None:
        original(self, result_ttl, pipeline, **kwargs)
        pipeline.hset(self.key, "extra", extra(self))

    monkeypatch.setattr(Job, "_handle_success", _handle_success)
    q = Queue("default", connection=conn)
    for n in range(2):
        job_id = q.enqueue("herder_rqcompat.add", n, 1).id
        q.remove(job_id)
        finish(worker, *started(worker, job_id), {"n": n})
        assert Job.fetch(job_id, connection=conn).to_dict()  # written
        assert conn.hget(f"rq:job:{job_id}", "extra") is not None
    assert [learned.phase for learned in worker.fast.finish.templates.values()] == [Phase.REFUSED]


def test_the_stand_ins_leave_nothing(worker: HerderFastWorker, conn: Redis) -> None:
    learnt(worker, conn)
    assert not any(b"herder-stand-in" in k or b"herder-check" in k for k in conn.scan_iter(count=1000))
    assert not worker.executions
    assert finish_template.STAND_IN_EXECUTION not in worker.executions
