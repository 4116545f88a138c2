"""A taken job made from its hash (herder.worker.fast_path.restore) is the job RQ's own
`Job(id)` + `Job.restore` makes: every field, and what the job's code and RQ's later code read
of it, on real jobs of several kinds. A worker makes jobs so only once it found the two alike
for stand-in hashes and its first real job; otherwise, and for any hash it does not know, RQ's
restore makes each job.

Unit tests on a real connection: jobs are enqueued by RQ, their hashes read back."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from redis import Redis
from rq import Callback, Queue, Retry
from rq.job import Job
from rq.serializers import JSONSerializer

from herder.common import rq_seam
from herder.worker.fast_path import restore, shortcuts
from herder.worker.fast_path.worker import HerderFastWorker

pytestmark = pytest.mark.skipif(
    rq_seam.fast_path_missing() is not None, reason=f"no fast path on {rq_seam.describe()}"
)

FUNC = "herder_rqcompat.add"
SHAPES: dict[str, dict[str, Any]] = {
    "plain": {},
    "args and kwargs": {"args": (1,), "kwargs": {"b": 2}},
    "meta": {"meta": {"k": ["v", 1]}},
    "timeout and ttls": {"job_timeout": 77, "result_ttl": 600, "failure_ttl": 30, "ttl": 900},
    "no result kept": {"result_ttl": 0},
    "kept forever": {"result_ttl": -1},
    "description": {"description": "a job of its own name é"},
    "retries": {"retry": Retry(max=3, interval=[1, 5])},
    "callbacks": {
        "on_success": Callback("json.dumps", timeout=7),
        "on_failure": Callback("json.loads"),
        "on_stopped": Callback("os.getcwd"),
    },
    "custom id": {"job_id": "my_own-id_1"},
    "at front": {"at_front": True},
}


@pytest.fixture(autouse=True)
def _shortcuts() -> None:
    shortcuts.install()  # as in a worker: RQ's utcparse is herder's shortcut there


def enqueue(conn: Redis, **options: Any) -> Job:
    args, kwargs = options.pop("args", (1, 2)), options.pop("kwargs", {})
    return Queue("default", connection=conn).enqueue(FUNC, *args, **kwargs, **options)


def both(conn: Redis, job: Job, fast: restore.FastRestore) -> tuple[Job, Job]:
    """RQ's restore of the job's hash as it is in Redis now, and the fast one's."""
    data = conn.hgetall(job.key)
    ours = fast.restore(job.id, data)
    assert ours is not None, sorted(data)
    return restore.rqs_restore(Job, conn, None, job.id, data), ours


def seen(job: Job) -> dict[str, Any]:
    """What a job's code and RQ's later code read of a job."""
    return {
        "id": job.id,
        "func_name": job.func_name,
        "args": job.args,
        "kwargs": job.kwargs,
        "meta": job.meta,
        "status": job.get_status(refresh=False),
        "origin": job.origin,
        "description": job.description,
        "timeout": job.timeout,
        "result_ttl": job.get_result_ttl(500),
        "failure_ttl": job.failure_ttl,
        "ttl": job.get_ttl(),
        "dependency_ids": job._dependency_ids,
        "retries_left": job.retries_left,
        "retry_intervals": job.retry_intervals,
        "success_callback": job.success_callback,
        "success_callback_timeout": job.success_callback_timeout,
        "failure_callback": job.failure_callback,
        "stopped_callback": job.stopped_callback,
        "created_at": job.created_at,
        "enqueued_at": job.enqueued_at,
        "to_dict": job.to_dict(),
        "key": job.key,
    }


def checked(conn: Redis, job: Job | None = None) -> restore.FastRestore:
    job = job or enqueue(conn)
    fast, why = restore.checked(Job, conn, None, job.id, conn.hgetall(job.key))
    assert fast is not None, why
    return fast


@pytest.mark.parametrize("shape", SHAPES)
def test_a_job_is_rqs_own_restore(conn: Redis, shape: str) -> None:
    fast = checked(conn)
    theirs, ours = both(conn, enqueue(conn, **SHAPES[shape]), fast)
    assert restore.same_jobs([theirs], [ours]) is None
    assert vars(ours).keys() == vars(theirs).keys()
    assert seen(ours) == seen(theirs)
    assert ours.connection is conn


def test_dependents_and_a_started_job(conn: Redis) -> None:
    """A job with dependencies (deferred, then queued), and one with its start fields written."""
    fast = checked(conn)
    first = enqueue(conn)
    second = enqueue(conn, depends_on=first)
    third = Queue("default", connection=conn).enqueue(FUNC, 1, 2, depends_on=[first, second])
    for job in (second, third):
        theirs, ours = both(conn, job, fast)
        assert restore.same_jobs([theirs], [ours]) is None and seen(ours) == seen(theirs)
        assert ours._dependency_ids and ours.get_status(refresh=False) == "deferred"
    job = enqueue(conn)
    at = "2026-01-02T03:04:05.000006Z"
    conn.hset(
        job.key, mapping={"worker_name": "w", "started_at": at, "last_heartbeat": at, "status": "started"}
    )
    theirs, ours = both(conn, job, fast)
    assert restore.same_jobs([theirs], [ours]) is None and seen(ours) == seen(theirs)
    assert ours.worker_name == "w" and ours.started_at is not None


def test_two_jobs_share_no_list_or_dict(conn: Redis) -> None:
    fast = checked(conn)
    one, two = (fast.restore(j.id, conn.hgetall(j.key)) for j in (enqueue(conn), enqueue(conn)))
    assert one is not None and two is not None
    assert one.meta is not two.meta and one.webhooks is not two.webhooks
    assert one._dependency_ids is not two._dependency_ids
    one.meta["x"] = 1
    assert two.meta == {}


def test_hashes_it_does_not_know_are_rqs(conn: Redis) -> None:
    """A result, an exception, webhooks, a timeout RQ parses its own way, unreadable meta, no
    creation time, a bad id: None, so RQ's restore makes the job (or raises its error)."""
    fast = checked(conn)
    job = enqueue(conn)
    data = conn.hgetall(job.key)
    for extra in ({b"result": b"x"}, {b"exc_info": b"x"}, {b"webhooks": b"[]"}, {b"timeout": b"1h"},
                  {b"meta": b"not a pickle"}, {b"created_at": b""}, {b"status": b"no-such-status"},
                  {b"enqueue_at_front": b""}):  # fmt: skip
        assert fast.restore(job.id, {**data, **extra}) is None, extra
    assert fast.restore("not an id!", data) is None
    assert fast.restore(job.id, {k: v for k, v in data.items() if k != b"data"}) is None
    with pytest.raises(ValueError):  # RQ's own error for the unknown status, as before
        restore.rqs_restore(Job, conn, None, job.id, {**data, b"status": b"no-such-status"})
    # An old RQ's timestamps (no fraction) are read by RQ's utcparse, the same.
    old = {**data, b"enqueued_at": b"2020-01-02T03:04:05Z"}
    theirs, ours = restore.rqs_restore(Job, conn, None, job.id, old), fast.restore(job.id, old)
    assert ours is not None and restore.same_jobs([theirs], [ours]) is None


class OwnRestore(Job):
    def restore(self, raw_data: Any) -> Any:
        super().restore(raw_data)
        self.meta["mine"] = True


class OwnField(Job):
    @property
    def origin(self) -> str:  # type: ignore[override]
        return "always"

    @origin.setter
    def origin(self, value: str) -> None:
        pass


@pytest.mark.parametrize(
    ("job_class", "serializer", "why"),
    [
        (OwnRestore, None, "own __init__ or restore"),
        (OwnField, None, "defines a field restore sets"),
        (Job, JSONSerializer, "serializer other than RQ's default"),
    ],
)
def test_other_job_classes_and_serializers_are_rqs(
    conn: Redis, job_class: type[Job], serializer: Any, why: str
) -> None:
    job = enqueue(conn)
    fast, reason = restore.checked(job_class, conn, serializer, job.id, conn.hgetall(job.key))
    assert fast is None and why in reason


def test_a_restore_unlike_rqs_is_found_out(conn: Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    """An RQ whose restore sets something more (or otherwise): the check on the stand-ins sees it."""
    original = Job.restore

    def restore_more(self: Job, raw_data: Any) -> Any:
        original(self, raw_data)
        self.ttl = (self.ttl or 0) + 1

    monkeypatch.setattr(Job, "restore", restore_more)
    job = enqueue(conn)
    fast, why = restore.checked(Job, conn, None, job.id, conn.hgetall(job.key))
    assert fast is None and why.startswith("ttl:")


@pytest.fixture
def worker(unit_fast_worker: HerderFastWorker) -> HerderFastWorker:
    return unit_fast_worker


def test_the_worker_checks_once_then_makes_jobs_so(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = restore.checked
    monkeypatch.setattr(restore, "checked", lambda *a: calls.append("checked") or real(*a))
    for _ in range(3):
        job = enqueue(conn, meta={"n": 1})
        made = worker.fast.take.restore(job.id, conn.hgetall(job.key))
        assert made is not None and seen(made) == seen(Job.fetch(job.id, connection=conn))
    assert calls == ["checked"]
    result = enqueue(conn)
    conn.hset(result.key, "result", b"x")
    assert worker.fast.take.restore(result.id, conn.hgetall(result.key)) is None  # RQ's restore then


def test_a_worker_whose_check_failed_uses_rqs_restore(
    worker: HerderFastWorker, conn: Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(restore, "same_jobs", lambda *a: "a field differs")
    job = enqueue(conn)
    with caplog.at_level(logging.INFO, logger="herder"):
        assert worker.fast.take.restore(job.id, conn.hgetall(job.key)) is None
        assert worker.fast.take.restore(job.id, conn.hgetall(job.key)) is None
    assert worker.fast.take.restorer.refused
    assert caplog.text.count("RQ's restore makes each job (a field differs)") == 1
    queue_key = worker.queues[0].key
    taken, _ = worker.fast.take.took(queue_key, job.id, conn.hgetall(job.key))
    assert seen(taken) == seen(Job.fetch(job.id, connection=conn))


def test_created_at_and_enqueued_at_are_rqs_to_the_microsecond(conn: Redis) -> None:
    fast = checked(conn)
    theirs, ours = both(conn, enqueue(conn), fast)
    assert ours.created_at == theirs.created_at and ours.created_at.tzinfo == theirs.created_at.tzinfo
    assert ours.enqueued_at is not None and ours.enqueued_at - ours.created_at < timedelta(seconds=5)
