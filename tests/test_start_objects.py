"""RQ's start objects built directly (herder.worker.fast_path.worker: _build_start) are the ones
RQ's own start leaves: the Execution, the job's fields RQ sets (what the job's code sees of
itself), the worker's. A start the template wrote is in Redis already; the worker only needs
RQ's objects, and builds them instead of replaying RQ's start for them, once it has checked,
for a stand-in job, that the two agree (and replays RQ's start if they do not).

Unit tests of the worker's logic on a real connection; nothing is written to Redis here."""

from __future__ import annotations

import logging
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from redis import Redis
from rq import Queue
from rq.job import Job
from rq.utils import now

from herder.common import rq_seam
from herder.worker.fast_path.start import Written
from herder.worker.fast_path.worker import HerderFastWorker

pytestmark = pytest.mark.skipif(
    rq_seam.fast_path_missing() is not None, reason=f"no fast path on {rq_seam.describe()}"
)


@pytest.fixture
def worker(unit_fast_worker: HerderFastWorker) -> HerderFastWorker:
    return unit_fast_worker


def effects(worker: HerderFastWorker, job: Job, start: Any) -> tuple[dict, dict, dict, dict]:
    """What a start leaves: the worker's fields set anew, the job's (all of them: what its code
    can read of itself), the execution's, and the worker's executions; the worker is put back."""
    before = dict(vars(worker))
    execution = start(job)
    try:
        changed = {k: v for k, v in vars(worker).items() if k not in before or before[k] is not v}
        executions = {k: vars(v) for k, v in worker.executions.items()}
        fields = {k: v for k, v in vars(job).items() if k != "connection"}  # before `seen` reads any
        fields["connection is the job's own"] = job.connection is worker.connection
        seen = {
            "status": job.get_status(refresh=False),
            "started_at": job.started_at,
            "worker_name": job.worker_name,
            "last_heartbeat": job.last_heartbeat,
            "func_name": job.func_name,
            "args": job.args,
            "heartbeat_ttl": worker.get_heartbeat_ttl(job),
        }
        ex = {k: "<the job>" if v is job else v for k, v in vars(execution).items()}
        return changed, {**fields, "seen": seen}, ex, executions
    finally:
        worker.executions.clear()
        for name in set(vars(worker)) - set(before):
            delattr(worker, name)
        for name, value in before.items():
            setattr(worker, name, value)


def a_fetched_job(conn: Redis, **options: Any) -> tuple[Job, Job]:
    """One job as the worker takes it, twice: two objects restored from the same hash."""
    job = Queue("default", connection=conn).enqueue("herder_rqcompat.add", 1, 2, **options)
    return Job.fetch(job.id, connection=conn), Job.fetch(job.id, connection=conn)


@pytest.mark.parametrize("timeout", [None, 77])
def test_rqs_start_objects_built_directly_are_rqs_own(worker: HerderFastWorker, conn: Redis, timeout) -> None:
    """The same real job at the same time and execution id: RQ's start replayed (its writes
    discarded) and the objects built directly leave the same objects, field by field."""
    one, two = a_fetched_job(conn, job_timeout=timeout, result_ttl=600, meta={"k": "v"})
    t, execution_id = now(), uuid.uuid4().hex
    worker.lease_quiet = False  # the replay's own, set ahead
    replayed = effects(worker, one, lambda job: worker.fast.start.record(job, t, execution_id, keep=False)[0])
    built = effects(worker, two, lambda job: worker.fast.start.build(job, t, execution_id))
    assert built[0] == replayed[0]  # the worker's fields (its state, its last heartbeat)
    assert built[1] == replayed[1]  # the job's, and what its code reads of itself
    assert built[2] == replayed[2]  # the execution
    assert built[3] == replayed[3]  # the worker's executions
    assert replayed[1]["seen"]["status"] == "started" and replayed[1]["seen"]["started_at"] == t
    assert replayed[2]["id"] == execution_id and replayed[2]["created_at"] == t


def learn(worker: HerderFastWorker, conn: Redis) -> None:
    """A first job's start (RQ's, recorded), then the template learnt from it: the check of the
    built objects against RQ's for two stand-ins leaves the worker as that start left it."""
    job, _ = a_fetched_job(conn)
    t, execution_id = now(), uuid.uuid4().hex
    _, commands, _ = worker.fast.start.record(job, t, execution_id)
    started = dict(vars(worker)), dict(worker.executions)
    worker.fast.start.learn_template(job, t, execution_id, commands)
    assert worker.fast.start.next is not None
    assert worker.executions == started[1] and list(worker.executions) == [execution_id]
    assert rq_seam.worker_state(worker) == started[0]["_state"]
    assert worker.last_heartbeat == started[0]["last_heartbeat"] == t


def test_the_worker_builds_them_once_it_found_them_rqs_own(worker: HerderFastWorker, conn: Redis) -> None:
    learn(worker, conn)
    assert worker.fast.start.direct.ready


def test_a_start_that_leaves_more_is_replayed(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An RQ whose start sets something the direct build does not: the worker finds it out for
    the stand-in and keeps replaying RQ's start for its objects."""
    original = Job.prepare_for_execution

    def prepare_for_execution(self: Job, worker_name: str, pipeline) -> None:  # noqa: ANN001
        original(self, worker_name, pipeline)
        self.meta["started_by"] = worker_name

    monkeypatch.setattr(Job, "prepare_for_execution", prepare_for_execution)
    with caplog.at_level(logging.INFO, logger="herder"):
        learn(worker, conn)
    assert worker.fast.start.direct.refused
    assert "RQ's start is replayed for its objects" in caplog.text


def test_a_job_started_by_the_template_gets_the_built_objects(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare_execution of a job the script started: the built objects, or RQ's replayed
    start while RQ's worker logs at DEBUG (its start's debug lines are RQ's to print)."""
    learn(worker, conn)
    calls: list[str] = []
    monkeypatch.setattr(worker.fast.start, "build", lambda *a: calls.append("built") or SimpleNamespace())
    monkeypatch.setattr(
        worker.fast.start, "record", lambda *a, **k: calls.append("replayed") or (SimpleNamespace(), [], None)
    )
    for level in (logging.INFO, logging.DEBUG):
        worker.log.setLevel(level)
        job, _ = a_fetched_job(conn)
        worker.fast.start.current = Written(job.id, now(), uuid.uuid4().hex, "")
        worker.prepare_execution(job)
    worker.log.setLevel(logging.NOTSET)
    assert calls == ["built", "replayed"]


def test_a_job_whose_data_cannot_be_read_fails_in_perform_job_as_under_rq(
    worker: HerderFastWorker, conn: Redis
) -> None:
    """RQ writes such a job's start and then raises (its func_name, in prepare_job_execution)
    inside perform_job, which fails the job; the fast path records that start in
    prepare_execution, before perform_job: the error is raised where RQ raises it (rq's own
    test_deserializing_failure_is_handled, side by side with RQ's SimpleWorker)."""
    import zlib

    from rq.registry import FailedJobRegistry, StartedJobRegistry
    from rq.worker import SimpleWorker

    ended = {}
    rqs = SimpleWorker([Queue("rq", connection=conn)], connection=conn)
    for name, w in (("rq", rqs), ("herder", worker)):
        q = Queue("rq" if name == "rq" else "default", connection=conn)
        job = q.enqueue("herder_rqcompat.add", 1, 2)
        conn.hset(job.key, "data", zlib.compress(job.data.replace(b"herder_rqcompat.add", b"")))
        job = Job.fetch(job.id, connection=conn)
        execution = w.prepare_execution(job)  # herder's raised here, out of the worker's loop
        assert w.perform_job(job, q, execution) is False
        ended[name] = (
            job.get_status(refresh=True),
            job.id in FailedJobRegistry(queue=q),
            job.id in StartedJobRegistry(queue=q),
        )
    assert ended["herder"] == ended["rq"] == (ended["rq"][0], True, False)
    assert ended["rq"][0].value == "failed"
